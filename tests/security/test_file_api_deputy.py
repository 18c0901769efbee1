"""Hole class 5: the file API as a confused deputy.

The file API runs in the daemon, as host root, resolving paths inside the
sandbox's root. It must never grant more than the sandbox's own root has,
and never reach /proc, /sys or special files (README, "Security model"):
not by name, and not through a symlink the sandbox planted (an agent that
links its "output" to /proc/kmsg gets the trainer's read to feed it the
host's kernel log, and consumes that log).
"""

from __future__ import annotations

import ctypes
import os
import time

import pytest

import warren

SYSLOG_ACTION_SIZE_UNREAD = 9


@pytest.fixture()
def sandbox(client: warren.Client, base_layer: str):
    with client.create(layers=[base_layer]) as sb:
        yield sb


# Kernel files the sandbox's root is refused (or shown zeros) that host root reads.
KERNEL_FILES = [
    "/proc/kmsg",        # the host kernel log, consumed by a read
    "/proc/slabinfo",    # kernel heap layout
    "/proc/iomem",       # physical memory map (real addresses for host root only)
    "/proc/1/stack",     # PID 1's kernel stack
    "/proc/1/maps",      # PID 1's (warren-init, non-dumpable) address space
    "/proc/1/environ",
    "/proc/self/status",
    "/sys/kernel/uevent_seqnum",
    "/sys/firmware/memmap/0/start",  # physical memory map (masked in the sandbox: NotFound)
]


def _unread_kernel_log() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    n = libc.klogctl(SYSLOG_ACTION_SIZE_UNREAD, None, 0)
    if n < 0:
        pytest.skip(f"klogctl(SYSLOG_ACTION_SIZE_UNREAD): errno {ctypes.get_errno()}")
    return n


def _refused(fn, *args, allow_not_found: bool = False, **kwargs) -> warren.WarrenError:
    with pytest.raises(warren.WarrenError) as ei:
        fn(*args, **kwargs)
    e = ei.value
    ok = (warren.PermissionDenied, warren.InvalidArgument) + ((warren.NotFound,) if allow_not_found else ())
    assert isinstance(e, ok), f"{fn.__name__}{args}: {type(e).__name__}: {e}"
    return e


def test_kernel_log_is_not_read_or_consumed(sandbox):
    with open("/dev/kmsg", "w") as f:  # something unread in the host's log
        f.write(f"warren test: file API must not consume this {time.time()}\n")
    before = _unread_kernel_log()
    assert before > 0
    r = sandbox.exec("ln -s /proc/kmsg /tmp/kmsg", timeout=30)
    assert r.exit_code == 0, r.stderr
    for p in ("/proc/kmsg", "/tmp/kmsg", "/tmp/../proc/./kmsg"):
        e = _refused(sandbox.files.read, p)
        assert isinstance(e, warren.PermissionDenied), e
        assert p in str(e) and "/proc" in str(e), e
    assert _unread_kernel_log() >= before, "the file API consumed the host's kernel log"
    # /dev/kmsg is not in the sandbox's /dev; a link to it resolves inside.
    _refused(sandbox.files.read, "/dev/kmsg", allow_not_found=True)


def test_kernel_files_are_refused(sandbox):
    for path in KERNEL_FILES:
        # /proc/self is the daemon's pid, which the sandbox's pid namespace lacks.
        e = _refused(sandbox.files.read, path, allow_not_found=path.startswith(("/sys/", "/proc/self/")))
        assert path in str(e), e
        if not isinstance(e, warren.NotFound):
            assert isinstance(e, warren.PermissionDenied), e


def test_proc_and_sys_are_not_reached_by_any_call(sandbox):
    r = sandbox.exec("mkdir -p /w && ln -s /proc /w/p && ln -s /proc/1 /w/init && ln -s ../sys /w/s "
                     "&& ln -s /proc/self/root /w/selfroot", timeout=30)
    assert r.exit_code == 0, r.stderr
    for p in ("/proc", "/sys", "/w/p", "/w/init", "/w/s/kernel", "/proc/1/fd", "/w/p/1/task",
              "/proc/acpi", "/sys/firmware", "/w/s/firmware"):  # the last three: masks (a tmpfs) below
        e = _refused(sandbox.files.list, p)
        assert p in str(e), e
    for p in ("/proc", "/sys", "/proc/1", "/w/p/1", "/w/init/stack", "/sys/kernel", "/w/s/kernel/mm"):
        _refused(sandbox.files.stat, p)
    _refused(sandbox.files.read, "/w/init/maps")
    _refused(sandbox.files.read, "/w/selfroot/etc/hostname", allow_not_found=True)
    _refused(sandbox.files.write, "/proc/sys/kernel/warren-test", b"x")
    _refused(sandbox.files.write, "/w/p/1/comm", b"pwned")
    _refused(sandbox.files.mkdir, "/sys/warren-test")
    _refused(sandbox.files.mkdir, "/w/s/a/b", parents=True)
    _refused(sandbox.files.remove, "/proc/1/fd", recursive=True)
    _refused(sandbox.files.rename, "/proc/1/comm", "/w/comm")
    # PID 1 is untouched and the rest of the tree works as before.
    assert sandbox.exec("cat /proc/1/comm", timeout=30).stdout == b"warren-init\n"
    names = {e.name for e in sandbox.files.list("/")}
    assert {"proc", "sys", "etc", "w"} <= names
    assert sandbox.files.stat("/w/p").is_symlink
    sandbox.files.write("/w/ok", b"fine")
    assert sandbox.files.read("/w/ok") == b"fine"


def test_special_files_are_never_opened(sandbox):
    r = sandbox.exec("mkfifo /tmp/fifo && ln -s /tmp/fifo /tmp/fifo-link && ln -s /dev/null /tmp/null-link && "
                     "python3 -c 'import socket; s=socket.socket(socket.AF_UNIX); s.bind(\"/tmp/sock\")'",
                     timeout=30)
    assert r.exit_code == 0, r.stderr
    cases = {"/tmp/fifo": "FIFO", "/tmp/fifo-link": "FIFO", "/dev/null": "character device",
             "/tmp/null-link": "character device", "/dev/zero": "character device",
             "/dev/urandom": "character device", "/dev/tty": "character device",
             "/dev/pts/ptmx": "character device", "/tmp/sock": "socket"}
    for p, kind in cases.items():
        t0 = time.monotonic()
        e = _refused(sandbox.files.read, p)
        assert time.monotonic() - t0 < 5, f"read({p}) took {time.monotonic() - t0:.1f} s"
        assert isinstance(e, warren.InvalidArgument), e
        assert p in str(e) and kind in str(e), e
    for p in ("/dev/null", "/tmp/fifo", "/tmp/sock"):
        e = _refused(sandbox.files.write, p, b"x")
        assert isinstance(e, warren.InvalidArgument), e
    r = sandbox.exec("stat -c %F /dev/null /tmp/fifo /tmp/sock", timeout=30)
    assert r.stdout.decode().split("\n")[:3] == ["character special file", "fifo", "socket"], r.stdout
    # A FIFO with a writer blocked on it: the API neither reads it nor hangs.
    p = sandbox.spawn("echo secret > /tmp/fifo")
    _refused(sandbox.files.read, "/tmp/fifo")
    p.kill()


def test_the_api_keeps_working_for_the_sandboxes_own_files(sandbox):
    """No regression: files the sandbox's root owns or may read stay readable."""
    r = sandbox.exec("mkdir -p /home/u1 && echo mine > /home/u1/private && chown -R 1000:1000 /home/u1 && "
                     "chmod 700 /home/u1 && chmod 600 /home/u1/private", timeout=30)
    assert r.exit_code == 0, r.stderr
    assert sandbox.files.read("/home/u1/private") == b"mine\n"  # root inside may (DAC_OVERRIDE)
    assert [e.name for e in sandbox.files.list("/home/u1")] == ["private"]
    if sandbox.exec("stat -c %u /etc/shadow", timeout=30).stdout == b"0\n":  # layers idmapped
        assert sandbox.files.read("/etc/shadow").startswith(b"root:")
    assert sandbox.files.read("/etc/hostname") == sandbox.exec("cat /etc/hostname", timeout=30).stdout
