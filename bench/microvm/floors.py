#!/usr/bin/env python3
"""Floors of the microvm backend under TCG: QEMU `-M microvm` cold boot to a
trivial init, and a bare QEMU restore of a saved template (warm floor), in one
run, with the clones' page sharing and what a clone needs after restore.

Inputs (made once into --cache, default /var/cache/warren/microvm-bench):
  the Debian cloud kernel (apt-get download + dpkg-deb -x, never installed),
  booted as warrend boots it: the uncompressed vmlinux through its PVH entry
  (--guest DIR's vmlinux, scripts/microvm/build-guest.sh's output, when it is
  the same kernel release; else extracted here from the bzImage the same
  way; the bzImage only when lz4 is missing, said in the report),
  bench/microvm/init.c built static, an initramfs (newc cpio written here:
  /dev/console, /init, the four virtio modules the init loads).

Rows:
  cold   QEMU start -> init's marker on the serial console (cold_init) and
         -> the first answer over virtio-serial (cold_answer); anonymous RAM.
  save   a template booted once with its RAM in a memory-backend-file
         (share=on), stopped, migrated to a state file with x-ignore-shared
         (the RAM stays in the RAM file, not in the state file).
  warm   a clone: same devices, RAM = the template's RAM file mapped
         share=off (MAP_PRIVATE, copy-on-write), -incoming defer, QMP
         x-ignore-shared + migrate-incoming; QEMU start -> the clone's agent
         answers a ping over virtio-serial.
  memory Rss/Pss/private of 3 clones at once vs one cold VM.
  restore what a clone sees (clock skew, RNG and boot_id across clones) and
         that the fixes (time from the host, seed + forced CRNG reseed,
         hostname) work.

At most 3 QEMUs at once; every QEMU is killed by pid and waited for; the
work dir (sockets, state, RAM file) is removed at exit.
"""

import argparse
import glob
import hashlib
import json
import os
import select
import shutil
import socket
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import ClassVar

HERE = os.path.dirname(os.path.abspath(__file__))
KERNEL_PKG = "linux-image-cloud-amd64"
# Load order matters: virtio.ko uses virtio_ring's symbols (no modules.dep,
# the package's depmod output is made at install time).
MODULES = [
    "drivers/virtio/virtio_ring",
    "drivers/virtio/virtio",
    "drivers/virtio/virtio_mmio",
    "drivers/char/virtio_console",
]
# In the initramfs, loaded on request ("M virtio_blk"): a template must not
# bind its disks (see README.md, "Disks").
LATER_MODULES = ["drivers/block/virtio_blk"]
MACHINE = "microvm,x-option-roms=off,isa-serial=on,rtc=on"
# tsc_early_khz: under TCG the kernel cannot calibrate the TSC (no PIT
# reference that is fast enough, no HPET/PM timer on microvm) and stalls at
# "Marking TSC unstable" without it. tsc=reliable: TCG's guest TSC is the
# host's (invariant) TSC, but the clocksource watchdog, comparing it against
# jiffies that lag on a loaded host, may switch the guest to refined-jiffies,
# whose time then drifts (seen: 40 ms in 1 s right after a clock fix).
APPEND_BASE = (
    "console=ttyS0 quiet loglevel=1 panic=-1 reboot=t edd=off pci=off no_timer_check tsc=reliable "
    "i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd cryptomgr.notests"
)
# QEMU's seccomp filter with every group denied: spawn=deny is why the state
# file travels as an fd (QMP getfd) and not as an exec: URI (exec spawns sh).
SANDBOX = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"
MARK_INIT = b"WARREN-MVM-INIT-UP"
MARK_PORT = b"WARREN-MVM-PORT-UP"
MAX_QEMUS = 3


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def qemu_version():
    out = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True, check=True).stdout
    return out.splitlines()[0]


def host_tsc_khz():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("cpu MHz"):
                return int(float(line.split(":")[1]) * 1000)
    return 2000000


# ---------------------------------------------------------------- inputs


PVH_NOTE = "Unknown note type: (0x00000012)"  # XEN_ELFNOTE_PHYS32_ENTRY in readelf -n


def is_pvh_elf(path):
    with open(path, "rb") as f:
        if f.read(4) != b"\x7fELF":
            return False
    out = subprocess.run(["readelf", "-n", path], check=False, capture_output=True, text=True).stdout
    return PVH_NOTE in out


def extract_vmlinux(vmlinuz, dst):
    """The bzImage's LZ4 payload (magic 02 21 4c 18) as `dst`, as
    scripts/microvm/build-guest.sh extracts it; False without lz4 or when
    the payload is not a PVH-bootable ELF."""
    if shutil.which("lz4") is None:
        return False
    data = Path(vmlinuz).read_bytes()
    off = data.find(b"\x02\x21\x4c\x18")
    if off < 0:
        return False
    # lz4 exits 1 on the bzImage's trailer after the frame: the output is checked instead.
    with open(dst + ".tmp", "wb") as out:
        subprocess.run(["lz4", "-dc"], check=False, input=data[off:], stdout=out, stderr=subprocess.DEVNULL)
    if not is_pvh_elf(dst + ".tmp"):
        os.unlink(dst + ".tmp")
        return False
    os.rename(dst + ".tmp", dst)
    return True


def boot_kernel(vmlinuz, kver, cache, guest):
    """(path, what) of the kernel to boot: warrend's vmlinux (PVH entry)."""
    g = os.path.join(guest, "vmlinux") if guest else ""
    release = os.path.join(guest, "kernel.release") if guest else ""
    if g and os.path.exists(g) and os.path.exists(release) and Path(release).read_text().strip() == kver:
        return g, f"vmlinux (PVH entry) of {guest}, the file warrend boots"
    own = os.path.join(cache, f"vmlinux-{kver}")
    if os.path.exists(own) or extract_vmlinux(vmlinuz, own):
        return own, "vmlinux (PVH entry) extracted from the bzImage as build-guest.sh does"
    return vmlinuz, "bzImage (lz4 missing or no PVH payload: NOT what warrend boots)"


def prepare(cache):
    """Kernel, init and initramfs in `cache`; returns (vmlinuz, initrd, kver)."""
    os.makedirs(cache, exist_ok=True)
    debs = sorted(glob.glob(os.path.join(cache, "linux-image-*-cloud-amd64_*.deb")))
    if not debs:
        # The meta package depends on the versioned image: download that one.
        out = subprocess.run(["apt-cache", "depends", KERNEL_PKG], capture_output=True, text=True, check=True).stdout
        dep = [ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.strip().startswith("Depends:")]
        if not dep:
            sys.exit(f"floors: apt-cache depends {KERNEL_PKG} names no image package")
        subprocess.run(["apt-get", "download", dep[0]], cwd=cache, check=True, timeout=600)
        debs = sorted(glob.glob(os.path.join(cache, "linux-image-*-cloud-amd64_*.deb")))
    root = os.path.join(cache, "x")
    if not glob.glob(os.path.join(root, "boot", "vmlinuz-*")):
        subprocess.run(["dpkg-deb", "-x", debs[-1], root], check=True)
    vmlinuz = max(glob.glob(os.path.join(root, "boot", "vmlinuz-*")))
    kver = os.path.basename(vmlinuz)[len("vmlinuz-") :]
    init = os.path.join(cache, "init")
    src = os.path.join(HERE, "init.c")
    if not os.path.exists(init) or os.path.getmtime(init) < os.path.getmtime(src):
        subprocess.run(["gcc", "-O2", "-static", "-Wall", "-Wextra", "-Werror", "-o", init, src], check=True)
    initrd = os.path.join(cache, "initrd.cpio")
    if not os.path.exists(initrd) or os.path.getmtime(initrd) < os.path.getmtime(init):
        ko = lambda m: os.path.join(root, "lib/modules", kver, "kernel", m + ".ko")
        write_cpio(initrd, init, [ko(m) for m in MODULES], [ko(m) for m in LATER_MODULES])
    return vmlinuz, initrd, kver


def write_cpio(dst, init, modules, later):
    """A newc cpio with /dev/console (the kernel opens it before running
    /init; no mknod or root needed to write it here), /init, /modules with
    `modules` (listed in /modules/order, loaded at boot) and `later`."""
    parts = []
    ino = [100]

    def entry(name, mode, data=b"", rdev=(0, 0)):
        ino[0] += 1
        fields = (ino[0], mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(name) + 1, 0)
        hdr = b"070701" + "".join(f"{v:08x}" for v in fields).encode() + name.encode() + b"\0"
        parts.append(hdr + b"\0" * (-len(hdr) % 4) + data + b"\0" * (-len(data) % 4))

    entry("dev", stat.S_IFDIR | 0o755)
    entry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1))
    with open(init, "rb") as f:
        entry("init", stat.S_IFREG | 0o755, f.read())
    entry("modules", stat.S_IFDIR | 0o755)
    names = []
    for m in modules + later:
        name = os.path.basename(m)[:-3]
        if m in modules:
            names.append(name)
        with open(m, "rb") as f:
            entry(f"modules/{name}.ko", stat.S_IFREG | 0o644, f.read())
    entry("modules/order", stat.S_IFREG | 0o644, ("\n".join(names) + "\n").encode())
    entry("TRAILER!!!", 0)
    tmp = dst + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"".join(parts))
    os.rename(tmp, dst)


# ---------------------------------------------------------------- one VM


class Vm:
    """One QEMU with three host-listening unix sockets it connects to at start:
    serial console, the virtio-serial port "warren.0", QMP. Listening on the
    host side (QEMU as client) means nothing the guest writes is lost before
    the host connects, and no polling for sockets to appear."""

    live: ClassVar[list["Vm"]] = []  # every Vm not yet killed (at most MAX_QEMUS)

    def __init__(self, work, name, qemu_args, timeout, after=(), uid=None, pass_fds=()):
        """`uid`: run QEMU as that user (setpriv; it execs QEMU, the pid stays);
        `pass_fds`: fds QEMU inherits (e.g. a memfd named as /proc/self/fd/N)."""
        if len(Vm.live) >= MAX_QEMUS:
            raise RuntimeError(f"floors: more than {MAX_QEMUS} QEMUs at once")
        self.name = name
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir)
        self.deadline = None
        self.timeout = timeout
        self.listeners = {}
        for kind in ("serial", "port", "qmp"):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(os.path.join(self.dir, kind + ".sock"))
            if uid is not None:
                os.chmod(os.path.join(self.dir, kind + ".sock"), 0o777)
            s.listen(1)
            self.listeners[kind] = s
        self.conns = {}
        self.bufs = {"serial": b"", "port": b"", "qmp": b""}
        self.events = []  # (monotonic, name, data)
        self.qmp_msgs = []
        self.t_greeting = None
        self.argv = self.full_argv(qemu_args) + list(after)
        if uid is not None:
            self.argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *self.argv]
        self.log = open(os.path.join(self.dir, "qemu.log"), "wb")  # noqa: SIM115 (closed in kill)
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, pass_fds=pass_fds
        )
        Vm.live.append(self)
        self.deadline = self.t0 + timeout

    def full_argv(self, qemu_args):
        d = self.dir
        return [
            "qemu-system-x86_64",
            *qemu_args,
            "-chardev", f"socket,id=ser,path={d}/serial.sock",
            "-serial", "chardev:ser",
            "-device", "virtio-serial-device",
            "-chardev", f"socket,id=port,path={d}/port.sock",
            "-device", "virtserialport,chardev=port,name=warren.0",
            "-chardev", f"socket,id=qmp,path={d}/qmp.sock",
            "-mon", "chardev=qmp,mode=control",
        ]  # fmt: skip

    def _pump(self, wait):
        """Accepts pending connections and reads what arrived, waiting at most `wait` s."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name}: QEMU exited {self.proc.returncode}: {self.tail()}")
        rl = [s for k, s in self.listeners.items() if k not in self.conns] + list(self.conns.values())
        r, _, _ = select.select(rl, [], [], max(0.0, wait))
        for s in r:
            kind = next((k for k, v in self.listeners.items() if v is s), None)
            if kind is not None:
                c, _ = s.accept()
                self.conns[kind] = c
                continue
            kind = next(k for k, v in self.conns.items() if v is s)
            try:
                data = s.recv(65536)
            except OSError as e:
                raise RuntimeError(f"{self.name}: {kind}: {e.strerror}: {self.tail()}") from e
            if not data:
                raise RuntimeError(f"{self.name}: {kind} closed: {self.tail()}")
            self.bufs[kind] += data
            if kind == "qmp":
                self._parse_qmp()

    def _parse_qmp(self):
        """QMP lines as they arrive: events get their arrival time (monotonic),
        the greeting and command replies queue in self.qmp_msgs."""
        while b"\n" in self.bufs["qmp"]:
            line, self.bufs["qmp"] = self.bufs["qmp"].split(b"\n", 1)
            m = json.loads(line)
            if "event" in m:
                self.events.append((time.monotonic(), m["event"], m.get("data")))
            else:
                self.qmp_msgs.append(m)

    def event_time(self, name):
        """Seconds from QEMU start to the first event `name`, None if none yet."""
        return next((t - self.t0 for t, e, _ in self.events if e == name), None)

    def wait_for(self, kind, pred, what):
        while True:
            got = pred(self.bufs[kind])
            if got is not None:
                return got
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.name}: no {what} within {self.timeout} s: {self.tail()}")
            self._pump(min(left, 0.5))

    def wait_marker(self, marker):
        def pred(buf):
            return time.monotonic() if marker in buf else None

        return self.wait_for("serial", pred, marker.decode())

    def connected(self, kind):
        self.wait_for(kind, lambda _: True if kind in self.conns else None, kind + " connection")

    def request(self, line):
        """Sends one request line on the port, returns the reply line."""
        self.connected("port")
        self.conns["port"].sendall(line.encode() + b"\n")

        def pred(buf):
            if b"\n" not in buf:
                return None
            reply, rest = buf.split(b"\n", 1)
            self.bufs["port"] = rest
            return reply.decode()

        return self.wait_for("port", pred, f"reply to {line!r}")

    def _next_qmp(self, what):
        def pred(_):
            return self.qmp_msgs.pop(0) if self.qmp_msgs else None

        return self.wait_for("qmp", pred, what)

    def qmp(self, cmd, **args):
        self.connected("qmp")
        msg = {"execute": cmd}
        if args:
            msg["arguments"] = args
        self.conns["qmp"].sendall(json.dumps(msg).encode() + b"\n")
        m = self._next_qmp(f"QMP reply to {cmd}")
        if "error" in m:
            raise RuntimeError(f"{self.name}: QMP {cmd}: {m['error']}")
        return m["return"]

    def qmp_getfd(self, name, fd):
        """Hands `fd` to QEMU under `name` (QMP getfd, SCM_RIGHTS) for an fd:<name> URI."""
        self.connected("qmp")
        msg = json.dumps({"execute": "getfd", "arguments": {"fdname": name}}).encode() + b"\n"
        socket.send_fds(self.conns["qmp"], [msg], [fd])
        m = self._next_qmp("QMP reply to getfd")
        if "error" in m:
            raise RuntimeError(f"{self.name}: QMP getfd: {m['error']}")

    def qmp_greeting(self):
        self.connected("qmp")
        self._next_qmp("QMP greeting")
        self.t_greeting = time.monotonic() - self.t0
        self.qmp("qmp_capabilities")

    def smaps(self):
        out = {}
        with open(f"/proc/{self.proc.pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                    out[parts[0][:-1]] = int(parts[1])
        return out

    def tail(self):
        self.log.flush()
        try:
            with open(os.path.join(self.dir, "qemu.log"), "rb") as f:
                q = f.read()[-400:].decode(errors="replace")
        except OSError:
            q = ""
        return f"qemu log: {q!r} serial: {self.bufs['serial'][-300:]!r}"

    def kill(self):
        if self in Vm.live:
            Vm.live.remove(self)
        if self.proc.poll() is None:
            os.kill(self.proc.pid, 9)
        self.proc.wait(timeout=10)
        for s in list(self.conns.values()) + list(self.listeners.values()):
            s.close()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def common_args(vmlinuz, initrd, mem_mb, append):
    return [
        "-M", MACHINE, "-accel", "tcg", "-cpu", "qemu64", "-m", f"{mem_mb}M", "-smp", "1",
        "-nodefaults", "-no-user-config", "-display", "none", "-sandbox", SANDBOX,
        "-kernel", vmlinuz, "-initrd", initrd, "-append", append,
    ]  # fmt: skip


def ram_args(mem_mb, path, share):
    # memory-backend= on the machine (QEMU >= 5.0) replaces -mem-path; the
    # clone must name the same backend id so the RAM block ids match.
    return [
        "-object", f"memory-backend-file,id=ram0,size={mem_mb}M,mem-path={path},share={'on' if share else 'off'}",
        "-M", "memory-backend=ram0",
    ]  # fmt: skip


# ---------------------------------------------------------------- rows


def pct(xs, p):
    """Nearest-rank percentile (p in 0..100)."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(-(-p * len(s) // 100)) - 1))
    return s[k]


def run_cold(a, work, base, i):
    vm = Vm(work, f"cold{i}", base, a.timeout)
    try:
        t_init = vm.wait_marker(MARK_INIT) - vm.t0
        vm.wait_marker(MARK_PORT)
        assert vm.request("p") == "pong"
        t_answer = time.monotonic() - vm.t0
        return t_init, t_answer
    finally:
        vm.kill()


def save_template(a, work, base, ram, state, after=(), before_save=None, pass_fds=()):
    """Boots the template, waits for its agent, saves it; returns (seconds,
    wall ns at the save, template Rss KiB, query-migrate's last answer).
    `before_save(vm)` runs in the template right before the migrate."""
    vm = Vm(work, "template", base + ram_args(a.mem, ram, True), a.timeout, after, pass_fds=pass_fds)
    try:
        vm.wait_marker(MARK_PORT)
        assert vm.request("p") == "pong"  # the agent now waits in read()
        # The template draws random bytes right before the save (as any
        # running guest may): the CRNG is then freshly keyed and the clones'
        # first getrandom() does not reseed from their (diverging) input
        # pools, which shows what the clones share without the agent's fix.
        vm.request("r")
        if before_save is not None:
            before_save(vm)
        vm.qmp_greeting()
        t = time.monotonic()
        # No "stop" first: migrate stops the guest itself at its end, and the
        # run state it records ("running") is what makes the clone start
        # running by itself once its incoming migration completes (a stopped
        # template gives paused clones that each need a "cont").
        vm.qmp("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}])
        fd = os.open(state, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            vm.qmp_getfd("state", fd)
        finally:
            os.close(fd)
        vm.qmp("migrate", uri="fd:state")
        while True:
            st = vm.qmp("query-migrate")
            if st.get("status") == "completed":
                break
            if st.get("status") in ("failed", "cancelled"):
                raise RuntimeError(f"template migrate: {st}")
            if time.monotonic() > vm.deadline:
                raise TimeoutError("template migrate did not complete")
            time.sleep(0.01)
        save_s = time.monotonic() - t
        saved_wall_ns = time.time_ns()
        ram_kib = vm.smaps().get("Rss", 0)
        return save_s, saved_wall_ns, ram_kib, st
    finally:
        vm.kill()


def start_clone(a, work, base, ram, state, name, after=(), uid=None, pass_fds=()):
    """A clone of the saved template, restoring; returns at once (the caller's
    first request waits for the restore to finish)."""
    vm = Vm(work, name, base + ram_args(a.mem, ram, False) + ["-incoming", "defer"], a.timeout, after, uid, pass_fds)
    vm.qmp_greeting()
    vm.qmp("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}])
    fd = os.open(state, os.O_RDONLY | os.O_CLOEXEC)
    try:
        vm.qmp_getfd("state", fd)
    finally:
        os.close(fd)
    vm.qmp("migrate-incoming", uri="fd:state")
    return vm


def run_warm(a, work, base, ram, state, name):
    """Returns (QEMU start -> the clone's answer, QMP greeting, RESUME event,
    the restore steps done) in s."""
    vm = start_clone(a, work, base, ram, state, name)
    try:
        assert vm.request("p") == "pong"
        t = time.monotonic() - vm.t0
        # The agent's restore steps, one request each (a real agent takes them in one message).
        assert vm.request(f"T {time.time_ns()}") == "T ok"
        assert vm.request("S " + os.urandom(32).hex()) == "S ok"
        assert vm.request(f"I {name}") == f"I {name}"
        return t, vm.t_greeting, vm.event_time("RESUME"), time.monotonic() - vm.t0
    finally:
        vm.kill()


def skew_ms(vm):
    h0 = time.time_ns()
    reply = vm.request("t").split()
    h1 = time.time_ns()
    return (int(reply[1]) - (h0 + h1) // 2) / 1e6


def restore_checks(a, work, base, ram, state):
    """Clones 1-2 get no fixes (what a clone sees), clones 3-4 get the
    agent's restore steps: time from the host, a seed + forced reseed, a
    hostname. Two at a time."""
    out = {"unfixed": [], "fixed": []}
    for group in ("unfixed", "fixed"):
        vms = [start_clone(a, work, base, ram, state, f"{group}{k}") for k in range(2)]
        try:
            for k, vm in enumerate(vms):
                assert vm.request("p") == "pong"
                row = {"skew_ms": skew_ms(vm)}
                if group == "fixed":
                    row["set_time"] = vm.request(f"T {time.time_ns()}")
                    row["reseed"] = vm.request("S " + os.urandom(32).hex())
                    row["identity"] = vm.request(f"I clone-{k}")
                row["rng"] = vm.request("r").split()[1]
                row["boot_id"] = vm.request("b").split()[1]
                row["skew_after_ms"] = skew_ms(vm)
                row["clocksource"] = vm.request("f /sys/devices/system/clocksource/clocksource0/current_clocksource")[
                    2:
                ]
                row["hostname"] = vm.request("f /proc/sys/kernel/hostname")[2:]
                out[group].append(row)
            if group == "fixed":
                time.sleep(1.0)
                for vm, row in zip(vms, out[group]):
                    row["skew_1s_later_ms"] = skew_ms(vm)
        finally:
            for vm in vms:
                vm.kill()
    return out


def memory_rows(a, work, base, ram, state):
    vm = Vm(work, "memcold", base, a.timeout)
    try:
        vm.wait_marker(MARK_PORT)
        assert vm.request("p") == "pong"
        time.sleep(0.5)
        cold = vm.smaps()
    finally:
        vm.kill()
    clones = [start_clone(a, work, base, ram, state, f"mem{k}") for k in range(MAX_QEMUS)]
    try:
        for vm in clones:
            assert vm.request("p") == "pong"
        time.sleep(0.5)
        warm = [vm.smaps() for vm in clones]
    finally:
        for vm in clones:
            vm.kill()
    return cold, warm


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10, help="cold and warm runs each (1..20)")
    ap.add_argument("--mem", type=int, default=256, help="guest memory, MiB")
    ap.add_argument("--timeout", type=float, default=60.0, help="per-VM bound, s")
    ap.add_argument("--cache", default=os.environ.get("WARREN_MVM_BENCH_CACHE", "/var/cache/warren/microvm-bench"))
    ap.add_argument("--ram-dir", default="/dev/shm", help="where the template's RAM file lives")
    ap.add_argument("--json", help="also write the numbers here")
    local = os.path.join(HERE, "..", "..", "build", "microvm-guest")
    ap.add_argument(
        "--guest",
        default=local if os.path.exists(os.path.join(local, "vmlinux")) else "/var/cache/warren/microvm",
        help="build-guest.sh's output dir: its vmlinux is booted when it is the same kernel release",
    )
    a = ap.parse_args()
    if not 1 <= a.runs <= 20:
        sys.exit("floors: --runs must be in 1..20")
    if shutil.which("qemu-system-x86_64") is None:
        sys.exit("floors: qemu-system-x86_64 not found (apt-get install qemu-system-x86)")

    vmlinuz, initrd, kver = prepare(a.cache)
    kernel, kernel_what = boot_kernel(vmlinuz, kver, a.cache, a.guest)
    append = f"{APPEND_BASE} tsc_early_khz={host_tsc_khz()}"
    base = common_args(kernel, initrd, a.mem, append)
    work = tempfile.mkdtemp(prefix="warren-mvm-floors-")
    ram = os.path.join(tempfile.mkdtemp(prefix="warren-mvm-ram-", dir=a.ram_dir), "template.ram")
    state = os.path.join(work, "template.state")
    res = {
        "kernel": kver,
        "kernel_file": kernel_what,
        "qemu": qemu_version(),
        "mem_mb": a.mem,
        "runs": a.runs,
    }
    try:
        log(f"floors: kernel {kver}, {a.mem} MiB, {a.runs} runs; work {work}")
        save_s, saved_ns, tpl_rss, st = save_template(a, work, base, ram, state)
        res["save"] = {
            "seconds": save_s,
            "state_bytes": os.path.getsize(state),
            "ram_file_allocated_bytes": os.stat(ram).st_blocks * 512,
            "template_rss_kib": tpl_rss,
            "migrate_ram": st.get("ram", {}),
        }
        ram_sha = file_sha256(ram)
        cold, warm = [], []
        for i in range(a.runs):  # interleaved so that load changes hit both rows alike
            cold.append(run_cold(a, work, base, i))
            warm.append(run_warm(a, work, base, ram, state, f"warm{i}"))
            log(f"  run {i}: cold init {cold[-1][0]:.3f} s answer {cold[-1][1]:.3f} s, warm answer {warm[-1][0]:.3f} s")
        res["cold_init_s"] = [c[0] for c in cold]
        res["cold_answer_s"] = [c[1] for c in cold]
        res["warm_answer_s"] = [w[0] for w in warm]
        res["warm_qmp_greeting_s"] = [w[1] for w in warm]
        res["warm_resume_s"] = [w[2] for w in warm]
        res["warm_restored_s"] = [w[3] for w in warm]
        res["template_age_s"] = (time.time_ns() - saved_ns) / 1e9
        res["restore"] = restore_checks(a, work, base, ram, state)
        res["memory"] = dict(zip(("cold", "clones"), memory_rows(a, work, base, ram, state)))
        res["ram_file_unchanged"] = file_sha256(ram) == ram_sha
    finally:
        for vm in list(Vm.live):
            vm.kill()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(os.path.dirname(ram), ignore_errors=True)
    report(res)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


def report(r):
    def row(name, xs):
        return (
            f"| {name} | {statistics.median(xs) * 1000:.0f} | {pct(xs, 99) * 1000:.0f} | "
            f"{min(xs) * 1000:.0f} | {max(xs) * 1000:.0f} |"
        )

    ca, wa = r["cold_answer_s"], r["warm_answer_s"]
    print(f"kernel {r['kernel']}, {r['qemu']}, TCG, {r['mem_mb']} MiB, 1 vCPU, N={r['runs']} each (interleaved)")
    print(f"booted: {r.get('kernel_file', '?')}\n")
    print("| row (QEMU start ->) | p50 ms | p99 ms | min ms | max ms |")
    print("| --- | ---: | ---: | ---: | ---: |")
    print(row("cold: init's serial marker", r["cold_init_s"]))
    print(row("cold: first answer over virtio-serial", ca))
    print(row("warm: clone's QMP greeting", r["warm_qmp_greeting_s"]))
    print(row("warm: clone's RESUME event (restore done)", r["warm_resume_s"]))
    print(row("warm: clone answers over virtio-serial", wa))
    print(row("warm: + restore steps (time, seed, hostname)", r["warm_restored_s"]))
    print(
        f"\nwarm/cold (first answer): p50 {statistics.median(wa) / statistics.median(ca):.3f}, "
        f"p99 {pct(wa, 99) / pct(ca, 99):.3f}"
    )
    s = r["save"]
    print(
        f"template save: {s['seconds'] * 1000:.0f} ms (migrate with x-ignore-shared), state file {s['state_bytes'] / 1024:.0f} KiB, "
        f"RAM file {s['ram_file_allocated_bytes'] / 2**20:.1f} MiB allocated of {r['mem_mb']} MiB, "
        f"migrated RAM {s['migrate_ram'].get('transferred', 0) / 1024:.0f} KiB"
    )
    m = r["memory"]

    def mem(d):
        priv = d.get("Private_Clean", 0) + d.get("Private_Dirty", 0)
        return (
            f"Rss {d['Rss'] / 1024:.1f} | Pss {d['Pss'] / 1024:.1f} | private {priv / 1024:.1f} | "
            f"shared {(d.get('Shared_Clean', 0) + d.get('Shared_Dirty', 0)) / 1024:.1f}"
        )

    print("\n| process (MiB) | Rss | Pss | private | shared |")
    print("| --- | ---: | ---: | ---: | ---: |")
    print(f"| cold VM | {mem(m['cold'])} |")
    for k, d in enumerate(m["clones"]):
        print(f"| clone {k} of {len(m['clones'])} | {mem(d)} |")
    clones = m["clones"]
    priv = statistics.mean(d.get("Private_Clean", 0) + d.get("Private_Dirty", 0) for d in clones) / 1024
    file_mib = s["ram_file_allocated_bytes"] / 2**20
    print(
        f"host memory per clone: {priv:.1f} MiB private + the template's {file_mib:.1f} MiB RAM file shared by all "
        f"(at 100 clones: {priv + file_mib / 100:.1f} MiB each); a cold VM: "
        f"{(m['cold'].get('Private_Clean', 0) + m['cold'].get('Private_Dirty', 0)) / 1024:.1f} MiB private"
    )
    print(f"template RAM file unchanged after all clones ran (MAP_PRIVATE): {r['ram_file_unchanged']}")
    print(f"\nrestore (template age at the restore checks: {r['template_age_s']:.1f} s):")
    print(
        "| clone | fixes | skew before ms | skew after ms | skew 1 s later ms | rng (first 8 hex) | boot_id | hostname |"
    )
    print("| --- | --- | ---: | ---: | ---: | --- | --- | --- |")
    for group, rows in r["restore"].items():
        for k, x in enumerate(rows):
            print(
                f"| {group}{k} | {'yes' if group == 'fixed' else 'no'} | {x['skew_ms']:.0f} | "
                f"{x['skew_after_ms']:.0f} | {x.get('skew_1s_later_ms', float('nan')):.0f} | {x['rng'][:8]} | "
                f"{x['boot_id'][:8]} | {x['hostname']} |"
            )
    print(f"clocksource in the guest: {r['restore']['fixed'][0]['clocksource']}")


if __name__ == "__main__":
    main()
