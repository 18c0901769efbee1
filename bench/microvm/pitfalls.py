#!/usr/bin/env python3
"""Reproduces the template/clone pitfalls written up in bench/microvm/README.md
(QEMU 7.2, -M microvm, TCG), each as one small experiment with a verdict:

  kernel     a clone started without -kernel/-initrd/-append
  order      a clone whose devices are created in another order than the template's
  disks      a template with placeholder disks, a clone whose disks are other
             files (other sizes, other contents): what the guest sees, and that
             block_resize + BLKFLSBUF make it see the clone's disks
  private    the template's RAM file is unchanged after clones wrote to their RAM
  rdonly     a clone whose QEMU cannot open the RAM file read-write (QEMU 7.2
             opens mem-path O_RDWR even with share=off)

Uses bench/microvm/floors.py's VM driver; at most 3 QEMUs, all killed by pid.
"""

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import floors as F


def disk(path, first_line, size):
    with open(path, "wb") as f:
        f.write(first_line.encode() + b"\n")
        f.truncate(size)


def disk_args(files):
    out = []
    for k, f in enumerate(files):
        out += [
            "-drive",
            f"if=none,id=d{k},file={f},format=raw,readonly=on",
            "-device",
            f"virtio-blk-device,drive=d{k}",
        ]
    return out


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def expect_fail(what, fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 (the failure is the result)
        msg = str(e)
        return f"{what}: fails: {msg[:400]}"
    return f"{what}: works"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mem", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=40.0)
    ap.add_argument("--cache", default=os.environ.get("WARREN_MVM_BENCH_CACHE", "/var/cache/warren/microvm-bench"))
    a = ap.parse_args()
    vmlinuz, initrd, _ = F.prepare(a.cache)
    base = F.common_args(vmlinuz, initrd, a.mem, f"{F.APPEND_BASE} tsc_early_khz={F.host_tsc_khz()}")
    work = tempfile.mkdtemp(prefix="warren-mvm-pitfalls-")
    os.chmod(work, 0o755)
    ram, state = os.path.join(work, "template.ram"), os.path.join(work, "template.state")
    ph = [os.path.join(work, f"placeholder{k}.img") for k in range(2)]
    layers = [os.path.join(work, f"layer{k}.img") for k in range(2)]
    disk(ph[0], "PLACEHOLDER-0", 1 << 20)
    disk(ph[1], "PLACEHOLDER-1", 1 << 20)
    disk(layers[0], "LAYER-A", 2 << 20)
    disk(layers[1], "LAYER-B", 3 << 20)
    results = []
    try:
        # Template U: its disks exist (placeholders) but no driver is bound.
        F.save_template(a, work, base, ram, state, after=disk_args(ph))
        ram_sha = sha(ram)

        def clone_args(args, after=()):
            return (args + F.ram_args(a.mem, ram, False) + ["-incoming", "defer"], after)

        def restore(name, args, after, uri="fd:state"):
            vm = F.Vm(work, name, args, a.timeout, after)
            try:
                vm.qmp_greeting()
                vm.qmp("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}])
                fd = os.open(state, os.O_RDONLY | os.O_CLOEXEC)
                vm.qmp_getfd("state", fd)
                os.close(fd)
                vm.qmp("migrate-incoming", uri=uri)
                assert vm.request("p") == "pong"
            finally:
                vm.kill()

        # kernel: no -kernel/-initrd/-append on the clone.
        i = base.index("-kernel")
        no_kernel = base[:i] + base[i + 6 :]
        results.append(
            expect_fail(
                "clone without -kernel/-initrd/-append",
                lambda: restore("nokernel", *clone_args(no_kernel, disk_args(layers))),
            )
        )
        # order: the disks created before the virtio-serial device.
        results.append(
            expect_fail(
                "clone with the disks created before the virtio-serial device",
                lambda: restore("swapped", *clone_args(base + disk_args(layers))),
            )
        )
        # spawn: an exec: URI under -sandbox spawn=deny.
        results.append(
            expect_fail(
                f"restore from uri exec:cat under -sandbox {F.SANDBOX}",
                lambda: restore("spawn", *clone_args(base, disk_args(layers)), uri=f"exec:cat {state}"),
            )
        )
        # disks, template U: the clone binds the driver after restore.
        vm = F.start_clone(a, work, base, ram, state, "disksU", disk_args(layers))
        try:
            assert vm.request("p") == "pong"
            before = vm.request("f /sys/block/vda/size")
            t = F.time.monotonic()
            loaded = vm.request("M virtio_blk")
            took = (F.time.monotonic() - t) * 1000
            results.append(
                f"template U (disks unbound), clone: before: vda size {before!r}; after {loaded!r} ({took:.0f} ms): "
                f"vda {vm.request('f /dev/vda')!r} size {vm.request('f /sys/block/vda/size')!r}, "
                f"vdb {vm.request('f /dev/vdb')!r} size {vm.request('f /sys/block/vdb/size')!r}"
            )
            vm.request("r")  # the clone writes to its RAM (private pages)
        finally:
            vm.kill()
        results.append(f"template U's RAM file unchanged after clones ran: {sha(ram) == ram_sha}")

        # Template C: the driver loaded, its disks unbound before the save;
        # the clone binds them (the probe reads the clone's capacity).
        drv = "/sys/bus/virtio/drivers/virtio_blk"

        def unbind(vm):
            vm.request("M virtio_blk")
            names = [n for n in vm.request(f"l {drv}").split()[1:] if n.startswith("virtio")]
            for n in names:
                vm.request(f"w {drv}/unbind {n}")
            results.append(f"template C: unbound {names}, vda size now {vm.request('f /sys/block/vda/size')!r}")
            unbind.names = names

        F.save_template(a, work, base, ram, state, after=disk_args(ph), before_save=unbind)
        vm = F.start_clone(a, work, base, ram, state, "disksC", disk_args(layers))
        try:
            assert vm.request("p") == "pong"
            t = F.time.monotonic()
            bound = [vm.request(f"w {drv}/bind {n}") for n in unbind.names]
            took = (F.time.monotonic() - t) * 1000
            results.append(
                f"template C, clone: bind {bound} ({took:.0f} ms): vda {vm.request('f /dev/vda')!r} "
                f"size {vm.request('f /sys/block/vda/size')!r}, vdb size {vm.request('f /sys/block/vdb/size')!r}"
            )
        finally:
            vm.kill()

        # Template B: its disks bound and read before the save (the blocks sit
        # in the guest's page cache, the capacity in its gendisk).
        def bind_and_read(vm):
            vm.request("M virtio_blk")
            results.append(
                f"template B sees vda {vm.request('f /dev/vda')!r} size {vm.request('f /sys/block/vda/size')!r}"
            )

        F.save_template(a, work, base, ram, state, after=disk_args(ph), before_save=bind_and_read)
        vm = F.start_clone(a, work, base, ram, state, "disksB", disk_args(layers))
        try:
            assert vm.request("p") == "pong"
            results.append(
                f"template B, clone before any fix: vda {vm.request('f /dev/vda')!r} size "
                f"{vm.request('f /sys/block/vda/size')!r}"
            )
            try:
                vm.qmp("block_resize", device="d0", size=os.path.getsize(layers[0]))
                results.append("block_resize on the read-only drive: accepted")
            except RuntimeError as e:
                results.append(f"block_resize on the read-only drive: {str(e).split(': ', 2)[-1]}")
            results.append(
                f"after {vm.request('B /dev/vda')!r} (BLKFLSBUF): vda {vm.request('f /dev/vda')!r} "
                f"size {vm.request('f /sys/block/vda/size')!r}"
            )
            t = F.time.monotonic()
            rebound = f"{vm.request('R virtio_blk')!r} + {vm.request('M virtio_blk')!r}"
            took = (F.time.monotonic() - t) * 1000
            results.append(
                f"after {rebound} (driver reloaded, {took:.0f} ms): "
                f"vda {vm.request('f /dev/vda')!r} size {vm.request('f /sys/block/vda/size')!r}"
            )
        finally:
            vm.kill()

        # rdonly: the clone's QEMU runs as nobody, the RAM file is root's 0644.
        os.chmod(ram, 0o644)
        os.chmod(state, 0o644)
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "qemu-system-x86_64", *base,
               *F.ram_args(a.mem, ram, False), "-incoming", "defer", "-serial", "none", "-monitor", "none"]  # fmt: skip
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL, check=False)
            results.append(f"clone as uid 65534, RAM file root 0644: exit {p.returncode}: {p.stderr.strip()[:300]}")
        except subprocess.TimeoutExpired:
            results.append("clone as uid 65534, RAM file root 0644: started (killed after 20 s)")

        # memfd: the template's RAM in a sealed memfd; a clone running as
        # nobody opens /proc/self/fd/N read-write (a memfd is mode 0777) and
        # maps it privately; F_SEAL_WRITE makes write(2) and shared writable
        # mappings fail, so no clone can change the template.
        mfd = os.memfd_create("warren-template-ram", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
        try:
            os.set_inheritable(mfd, True)
            mem = f"/proc/self/fd/{mfd}"
            os.chmod(state, 0o644)
            F.save_template(a, work, base, mem, state, pass_fds=(mfd,))
            seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
            fcntl.fcntl(mfd, fcntl.F_ADD_SEALS, seals)
            before = sha(f"/proc/self/fd/{mfd}")
            try:
                os.pwrite(mfd, b"x", 0)
                wrote = "write(2) on the sealed memfd: allowed"
            except OSError as e:
                wrote = f"write(2) on the sealed memfd: {e.strerror}"
            vms = [F.start_clone(a, work, base, mem, state, f"memfd{k}", uid=65534, pass_fds=(mfd,)) for k in range(2)]
            try:
                ok = [vm.request("p") for vm in vms]
                for vm in vms:
                    vm.request("r")
                rss = vms[0].smaps()
                results.append(
                    f"sealed memfd template, 2 clones as uid 65534: {ok!r}; {wrote}; memfd unchanged after the clones "
                    f"ran: {sha(f'/proc/self/fd/{mfd}') == before}; a clone's Rss {rss['Rss'] / 1024:.1f} MiB, "
                    f"shared {(rss.get('Shared_Clean', 0) + rss.get('Shared_Dirty', 0)) / 1024:.1f} MiB"
                )
            finally:
                for vm in vms:
                    vm.kill()
        finally:
            os.close(mfd)
    finally:
        for v in list(F.Vm.live):
            v.kill()
        shutil.rmtree(work, ignore_errors=True)
        for r in results:
            print("-", r)


if __name__ == "__main__":
    main()
