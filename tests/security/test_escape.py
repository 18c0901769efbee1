"""Classic container escapes, attempted from inside a sandbox by the probe
(tests/security/probe.c). Policy under test: README "Security model and
limits", src/jail/seccomp/default.json and the init ladder of
src/runtime/container/container_backend.cc (masks, read-only dirs)."""

from __future__ import annotations

import secrets
import socket
import subprocess
from pathlib import Path
from typing import Dict

import pytest

from .conftest import PROBE32_PATH, Line, Probe, assert_blocked

# ---------------------------------------------------------------- syscalls on every ABI

# The cases of `probe abi <abi>` (probe.c kAbiCases), in order. Each prints
# expect=<errno of the seccomp rule> or expect=kernel (no rule: the kernel
# refuses it, e.g. unshare(CLONE_NEWNS) needs CAP_SYS_ADMIN, which root
# inside does not have).
ABI_CASES = [
    "mount", "umount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount",
    "fspick", "mount_setattr", "unshare-newuser", "unshare-newuser-newns", "unshare-newns", "unshare-newnet",
    "unshare-newpid", "unshare-newuts", "unshare-newipc", "unshare-newcgroup", "unshare-newtime",
    "clone-newuser", "clone-newns", "clone-newnet", "clone-newpid", "clone3-newuser", "clone3-newns", "setns",
    "add_key", "request_key", "keyctl", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "init_module", "finit_module", "delete_module", "kexec_load",
    "kexec_file_load", "reboot", "syslog", "open_by_handle_at", "iopl", "ioperm", "swapon", "acct",
    "settimeofday", "ioctl-ext4-move-ext", "ioctl-xfs-swapext", "ioctl-xfs-exchange-range", "ioctl-tiocsti",
    "ioctl-tioclinux", "ioctl-ext4-move-ext-highbits", "ioctl-tiocsti-highbits", "socket-vsock",
    "socketcall-vsock",
]
ABIS = ["x86_64", "i386", "x32", "m32"]
SIGSYS = "31"

_abi_cache: Dict[tuple, Dict[str, Line]] = {}


def _abi_lines(probe: Probe, abi: str) -> Dict[str, Line]:
    key = (probe.sb.id, abi)
    if key not in _abi_cache:
        if abi == "m32":
            if probe.binaries.m32 is None:
                pytest.skip(f"i386 build of the probe: {probe.binaries.m32_reason}")
            lines = probe.run("abi", "m32", binary=PROBE32_PATH)
        else:
            lines = probe.run("abi", abi)
        _abi_cache[key] = lines
    return _abi_cache[key]


def _abi_usable(lines: Dict[str, Line], abi: str) -> bool:
    """Skips the ABI if the kernel cannot run it at all (int 0x80 faults:
    no IA32 emulation). Returns False if the kernel has no entry for it
    (every case without a seccomp rule answered ENOSYS, e.g. x32 without
    CONFIG_X86_X32_ABI): then ENOSYS is a block too, whoever answered it."""
    kernel = [l for l in lines.values() if l.kv.get("expect") == "kernel"]
    if kernel and all(l.kv.get("signal") == "11" for l in kernel):
        pytest.skip(f"{abi}: the kernel has no {abi} syscall entry (int 0x80 faults: no IA32 emulation)")
    return not (kernel and all(l.errno == "ENOSYS" for l in kernel))


@pytest.mark.parametrize("abi", ABIS)
@pytest.mark.parametrize("case", ABI_CASES)
def test_syscall_blocked_on_every_abi(probe: Probe, abi: str, case: str):
    lines = _abi_lines(probe, abi)
    kernel_has_abi = _abi_usable(lines, abi)
    name = f"abi-{abi}:{case}"
    if name not in lines:
        if case.endswith("-highbits") and abi != "x86_64":
            pytest.skip(f"{abi}: 32-bit registers have no high bits to set")
        pytest.fail(f"the probe printed no line for {name}")
    line = lines[name]
    if line.result == "skip":
        pytest.skip(f"{abi}: {case}: {line.kv.get('reason')}")
    expect = line.kv.get("expect")
    if line.kv.get("signal"):
        # Killed: only the filter's SIGSYS (an ABI the profile does not list) counts.
        assert line.kv["signal"] == SIGSYS, f"probe child died of signal {line.kv['signal']}: {line.raw}"
        return
    if expect == "kernel":
        assert_blocked(line, errnos=["EPERM", "EACCES", "EINVAL", "ENOSYS"])
    elif kernel_has_abi:
        # The profile's own answer proves the filter covers this ABI (the
        # kernel would answer differently: EBADF, ENOTTY, EINVAL, success...).
        assert_blocked(line, errnos=[expect])
    else:
        print(f"{abi}: this kernel has no {abi} entry; ENOSYS blocks as well as the filter would")
        assert_blocked(line, errnos=[expect, "ENOSYS"])


def test_abi_case_list_matches_probe(probe: Probe):
    lines = _abi_lines(probe, "x86_64")
    names = [n.split(":", 1)[1] for n in lines if n.startswith("abi-x86_64:")]
    assert names == ABI_CASES


# ---------------------------------------------------------------- /proc and /sys

WRITE_PATHS = [
    "/proc/sysrq-trigger", "/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe",
    "/proc/sys/kernel/panic", "/proc/sys/kernel/randomize_va_space", "/proc/sys/vm/drop_caches",
    "/proc/sys/vm/overcommit_memory", "/proc/sys/fs/binfmt_misc/register", "/proc/sys/fs/file-max",
    "/proc/sys/kernel/ns_last_pid", "/proc/sys/net/ipv4/ip_forward", "/proc/sys/user/max_user_namespaces",
    "/proc/sys/kernel/hostname",
    "/sys/kernel/uevent_helper", "/sys/kernel/mm/transparent_hugepage/enabled", "/sys/power/state",
    "/sys/kernel/profiling", "/sys/module/printk/parameters/time", "/sys/block/loop0/queue/scheduler",
    "/sys/kernel/rcu_expedited", "/sys/fs/cgroup/cgroup.procs",
]


@pytest.mark.parametrize("path", WRITE_PATHS)
def test_proc_sys_write_blocked(probe: Probe, path: str):
    lines = probe.run("write", path)
    assert_blocked(lines[f"write:{path}"])


READ_PATHS = [
    # masked (README): read as /dev/null or an empty dir
    "/proc/kcore", "/proc/keys", "/proc/kallsyms", "/proc/timer_list", "/proc/sched_debug", "/proc/kpagecount",
    "/proc/kpageflags", "/proc/vmallocinfo", "/proc/acpi", "/proc/scsi", "/proc/driver", "/sys/firmware",
    # kernel log and debug interfaces
    "/proc/kmsg", "/sys/kernel/debug", "/sys/kernel/tracing/trace", "/sys/kernel/security",
    # PID 1 (warren-init is non-dumpable: same uid, but no CAP_SYS_PTRACE inside)
    # (/proc/1/fd lists fd numbers only: test_pid1_fds_unreachable)
    "/proc/1/environ", "/proc/1/mem", "/proc/1/map_files", "/proc/1/maps",
    "/proc/1/stack", "/proc/1/syscall", "/proc/1/root", "/proc/1/cwd/", "/proc/1/auxv", "/proc/1/pagemap",
]


@pytest.mark.parametrize("path", READ_PATHS)
def test_proc_sys_read_blocked(probe: Probe, path: str):
    lines = probe.run("read", path)
    assert_blocked(lines[f"read:{path}"])


@pytest.mark.parametrize("path", ["/proc/1/exe", "/proc/1/root", "/proc/1/cwd", "/proc/1/fd/0"])
def test_pid1_links_blocked(probe: Probe, path: str):
    lines = probe.run("readlink", path)
    assert_blocked(lines[f"readlink:{path}"])


# ---------------------------------------------------------------- PID 1 and namespaces


def test_pid1_fds_unreachable(probe: Probe):
    """warren-init holds the sandbox's upper dir open (for a restarted
    daemon); it is non-dumpable so that no process inside can open, resolve
    or inspect its fds through /proc/1/fd."""
    line = probe.run("pid1-fds")["pid1-fds"]
    assert int(line.kv["listed"]) > 0, line.raw
    assert_blocked(line)


def test_ptrace_pid1_blocked(probe: Probe):
    lines = probe.run("ptrace-pid1")
    for name in ["ptrace-attach-pid1", "ptrace-seize-pid1", "process_vm_readv-pid1", "pidfd_getfd-pid1"]:
        assert_blocked(lines[name])


def test_signals_to_pid1_do_not_end_the_sandbox(fresh_probe: Probe):
    """Documented policy (src/init/warren_init.c): warren-init blocks and
    consumes every catchable signal; the kernel drops SIGKILL/SIGSTOP sent
    to a pid-namespace init from inside. Nothing sent from inside ends or
    stops the sandbox."""
    lines = fresh_probe.run("signal-pid1")
    assert_blocked(lines["signal-pid1"])
    r = fresh_probe.sb.exec("cat /proc/1/comm", timeout=30)
    assert r.exit_code == 0 and r.stdout == b"warren-init\n", r
    assert fresh_probe.sb.info().state == "running"


def test_only_sandbox_processes_visible(probe: Probe):
    """Inside, /proc shows the sandbox's own processes only: warren-init and
    the probe, all owned by mapped ids (a host-owned process would show the
    overflow uid 65534), none of the daemon's."""
    r = probe.exec("ps")
    procs = [dict(kv.split("=", 1) for kv in l.split(" ")) for l in r.stdout.decode().splitlines()]
    print(procs)
    assert procs, r
    for p in procs:
        assert p["uid"] != "65534", f"a process of an unmapped (host) user is visible: {p}"
        assert p["comm"] in ("warren-init", "probe"), f"unexpected process visible inside: {p}"


def test_setns_into_visible_namespaces_blocked(probe: Probe):
    line = probe.run("setns-proc")["setns-proc-ns"]
    assert int(line.kv["tried"]) > 0, line.raw
    assert_blocked(line, errnos=["EPERM"])


def test_host_root_unreachable_through_proc(probe: Probe, host_marker: Path):
    line = probe.run("proc-root", str(host_marker))["proc-root-marker"]
    assert_blocked(line)


def test_chroot_escape_reaches_only_the_sandbox_root(fresh_probe: Probe, host_marker: Path):
    line = fresh_probe.run("chroot", str(host_marker))["chroot-escape"]
    assert_blocked(line)


# ---------------------------------------------------------------- devices

DEVICE_CASES = ["mknod-blk-sda", "mknod-blk-vda", "mknod-blk-loop0", "mknod-chr-mem", "mknod-chr-kmem",
                "mknod-chr-port", "mknod-chr-kmsg", "mknod-chr-kvm", "mknod-chr-fuse", "mknod-chr-tun"] + [
    f"open:{d}" for d in ["/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg", "/dev/sda", "/dev/vda", "/dev/xvda",
                          "/dev/nvme0n1", "/dev/loop0", "/dev/loop-control", "/dev/kvm", "/dev/fuse",
                          "/dev/net/tun", "/dev/vsock", "/dev/vhost-vsock", "/dev/console", "/dev/tty0",
                          "/dev/mapper/control", "/dev/btrfs-control", "/dev/cpu/0/msr", "/dev/watchdog"]]

_dev_cache: Dict[str, Dict[str, Line]] = {}


@pytest.mark.parametrize("case", DEVICE_CASES)
def test_device_blocked(probe: Probe, case: str):
    if probe.sb.id not in _dev_cache:
        _dev_cache[probe.sb.id] = probe.run("devices")
    assert_blocked(_dev_cache[probe.sb.id][case])


# ---------------------------------------------------------------- sockets

SOCKET_CASES = ["socket-packet-raw", "socket-packet-dgram", "socket-inet-raw", "socket-inet-raw-tcp",
                "socket-inet6-raw", "socket-vsock-stream", "socket-vsock-dgram", "netlink-audit-get",
                "netlink-audit-user-msg"]
_sock_cache: Dict[str, Dict[str, Line]] = {}


@pytest.mark.parametrize("case", SOCKET_CASES)
def test_socket_blocked(probe: Probe, case: str):
    if probe.sb.id not in _sock_cache:
        _sock_cache[probe.sb.id] = probe.run("sockets")
    assert_blocked(_sock_cache[probe.sb.id][case])


def test_host_abstract_unix_socket_unreachable(probe: Probe):
    """A listener on an abstract unix socket in the host's network namespace
    (abstract names are per netns) is not reachable from inside."""
    name = f"warren-escape-{secrets.token_hex(6)}"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind("\0" + name)
    srv.listen(8)
    srv.setblocking(False)
    try:
        line = probe.run("unix-abstract", name)["unix-abstract"]
        assert_blocked(line)
        with pytest.raises(BlockingIOError):
            srv.accept()
    finally:
        srv.close()


def test_daemon_api_socket_unreachable(probe: Probe, daemon):
    line = probe.run("unix-path", str(daemon.socket))["unix-path"]
    assert_blocked(line)


def test_host_tcp_unreachable(probe: Probe):
    """Host loopback services, the host's own addresses and a cloud metadata
    endpoint: the sandbox has loopback only."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    targets = [("127.0.0.1", port), ("169.254.169.254", 80)]
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True,
                         text=True, check=False).stdout.split()
    if "inet" in out:
        targets.append((out[out.index("inet") + 1].split("/")[0], 22))
    try:
        for ip, p in targets:
            line = probe.run("tcp", ip, str(p))[f"tcp-connect:{ip}:{p}"]
            assert_blocked(line)
    finally:
        srv.close()


# ---------------------------------------------------------------- cgroups


def test_cgroup_files_not_writable(probe: Probe):
    """No cgroup file system is mounted inside (every cgroup mount found in
    mountinfo, and /sys/fs/cgroup, are walked for control files opened for
    writing); mounting one, v1 with a release_agent or v2, is refused."""
    lines = probe.run("cgroup")
    assert_blocked(lines["cgroup-files-write"])
    assert_blocked(lines["cgroup-v1-mount-release-agent"], errnos=["EPERM"])
    assert_blocked(lines["cgroup-v2-mount"], errnos=["EPERM"])


# ---------------------------------------------------------------- file-clone ioctls


def test_file_clone_of_unreadable_file_blocked(fresh_probe: Probe):
    """FICLONE/FICLONERANGE take the source as an fd: one opened O_PATH (all
    a user without read permission gets) must not do. EXT4_IOC_SWAP_BOOT
    (no seccomp rule) needs CAP_SYS_ADMIN of the initial namespace."""
    sb = fresh_probe.sb
    sb.files.write("/srv/clone-secret", b"ROOT-ONLY\n", mode=0o600)
    r = sb.exec("chown 0:0 /srv/clone-secret && chmod 600 /srv/clone-secret && chmod 755 /srv", timeout=30)
    assert r.exit_code == 0, r
    lines = fresh_probe.run("clone", "/srv/clone-secret", user="1000")
    for name in ["ficlone-unreadable", "ficlonerange-unreadable", "ioctl-ext4-swap-boot"]:
        assert_blocked(lines[name])


# ---------------------------------------------------------------- capabilities


def test_root_capabilities_are_the_documented_set(probe: Probe):
    """README: root inside keeps only CHOWN, DAC_OVERRIDE, FOWNER, FSETID,
    KILL, SETGID, SETUID, SETPCAP, NET_BIND_SERVICE, SYS_CHROOT, AUDIT_WRITE,
    SETFCAP; no_new_privs."""
    caps = probe.run("caps")["caps"].kv
    want = sum(1 << c for c in [0, 1, 3, 4, 5, 6, 7, 8, 10, 18, 29, 31])
    assert int(caps["CapEff"], 16) == want, caps
    assert int(caps["CapPrm"], 16) == want, caps
    assert int(caps["CapBnd"], 16) == want, caps
    assert int(caps["CapAmb"], 16) == 0 and int(caps["CapInh"], 16) == 0, caps
    assert caps["NoNewPrivs"] == "1", caps


def test_non_root_exec_gets_no_file_capabilities(fresh_probe: Probe):
    """A copy of the probe given cap_dac_override+ep (by root inside, which
    holds SETFCAP) and run as uid 1000 must run with an empty capability set
    (and so must not read a root-only file)."""
    sb = fresh_probe.sb
    r = sb.exec("cp /opt/warren-probe/probe /opt/warren-probe/capprobe && chmod 755 /opt/warren-probe/capprobe",
                timeout=30)
    assert r.exit_code == 0, r
    line = fresh_probe.run("setcap", "/opt/warren-probe/capprobe")["setcap"]
    assert line.result == "ALLOWED", f"could not set the file capability (test set-up): {line.raw}"
    # The kernel either refuses the execve (EPERM: the file's effective
    # capabilities cannot be granted) or runs it with nothing.
    r = sb.exec(["/opt/warren-probe/capprobe", "caps"], user="1000", timeout=30)
    if r.exit_code == 126:
        assert b"Operation not permitted" in r.stderr, r
        return
    caps = fresh_probe.run("caps", binary="/opt/warren-probe/capprobe", user="1000")["caps"].kv
    assert caps["Uid"].startswith("1000,"), caps
    assert int(caps["CapEff"], 16) == 0 and int(caps["CapPrm"], 16) == 0, \
        f"uid 1000 runs with capabilities from the file: {caps}"
    sb.files.write("/srv/root-only", b"ROOT-ONLY\n", mode=0o600)
    line = fresh_probe.run("read", "/srv/root-only", binary="/opt/warren-probe/capprobe", user="1000")
    assert_blocked(line["read:/srv/root-only"])
