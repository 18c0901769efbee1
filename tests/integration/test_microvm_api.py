"""The microvm backend's call surface beyond exec (runtime/microvm/files.cc,
process.cc; src/guest/agent/files.cc, processes.cc): files byte-exact in
chunks, PTYs that see their size change, background processes killed with
their whole tree, and a guest that answers with garbage failing only its own
sandbox.

Runs on the daemon of the integration suite, which takes this tree's guest
(build/microvm-guest, see conftest.microvm_dir_args). VMs run under TCG
here: the module keeps at most 2 up.
"""

from __future__ import annotations

import hashlib
import os
import time

import pytest

import warren

CREATE_TIMEOUT = 180


def _until(pred, what: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def vm(client: warren.Client, base_layer: str):
    if "microvm" not in client.status().backends:
        pytest.skip("microvm: not offered by this warrend (qemu-system-x86_64 or the guest files are missing)")
    sb = client.create(backend="microvm", layers=[base_layer], memory_mb=256, timeout=CREATE_TIMEOUT)
    yield sb
    sb.destroy(timeout=60)


def test_multi_mib_binary_file_round_trips_byte_exact(vm: warren.Sandbox) -> None:
    data = os.urandom(6 << 20) + bytes(range(256))  # every byte value, many chunks
    t0 = time.monotonic()
    vm.files.write("/data/big.bin", data, make_parents=True)
    t_write = time.monotonic() - t0
    t0 = time.monotonic()
    back = vm.files.read("/data/big.bin")
    t_read = time.monotonic() - t0
    assert back == data
    print(f"microvm files: {len(data) / t_write / 2**20:.1f} MiB/s write, {len(data) / t_read / 2**20:.1f} MiB/s read")
    r = vm.exec("sha256sum /data/big.bin", timeout=60)
    assert r.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
    # A range across a chunk boundary, and one past the end.
    assert vm.files.read("/data/big.bin", offset=(64 << 10) - 3, length=10) == data[(64 << 10) - 3:(64 << 10) + 7]
    assert vm.files.read("/data/big.bin", offset=len(data) - 4, length=100) == data[-4:]
    assert vm.files.stat("/data/big.bin").size == len(data)
    # A file written by the guest comes back the same way.
    vm.exec("head -c 3000000 /dev/urandom > /data/guest.bin", timeout=60)
    g = vm.files.read("/data/guest.bin")
    assert hashlib.sha256(g).hexdigest() == vm.exec("sha256sum /data/guest.bin").stdout.split()[0].decode()
    vm.files.remove("/data", recursive=True)
    with pytest.raises(warren.NotFound):
        vm.files.stat("/data")


PTY_PROGRAM = r"""
import os, signal, sys, time
def show(*_):
    c, r = os.get_terminal_size(0)
    sys.stdout.write(f"size {r}x{c} tty={os.isatty(1)}\n"); sys.stdout.flush()
signal.signal(signal.SIGWINCH, show)
show()
time.sleep(120)
"""


def test_a_pty_program_sees_its_size_change(vm: warren.Sandbox) -> None:
    p = vm.spawn(["python3", "-c", PTY_PROGRAM], pty=True, rows=30, cols=90)
    try:
        _until(lambda: b"size 30x90 tty=True" in p.output().stdout, "the program's first size")
        p.resize(45, 150)
        _until(lambda: b"size 45x150 tty=True" in p.output().stdout, "SIGWINCH with the new size")
        # Input typed on the terminal reaches it (and is echoed by the line discipline).
        q = vm.spawn(["sh", "-c", "read l; echo got:$l"], pty=True)
        q.send_stdin(b"hello\n")
        r = q.wait(timeout=60)
        assert r.exit_code == 0
        assert b"got:hello" in q.output().stdout
    finally:
        p.kill()
    assert p.wait(timeout=60).signal == 9


def test_a_background_process_is_killed_with_its_children(vm: warren.Sandbox) -> None:
    count = ("n=0; for c in /proc/[0-9]*/comm; do [ \"$(cat $c 2>/dev/null)\" = sleep ] && n=$((n+1)); done; "
             "echo $n")
    assert vm.exec(count, timeout=60).stdout.strip() == b"0"
    # A child, a setsid'ed grandchild and a double-forked one.
    p = vm.spawn("sleep 1001 & setsid sleep 1002 & (sleep 1003 &) ; echo up; wait")
    _until(lambda: b"up" in p.output().stdout, "the tree to start")
    _until(lambda: vm.exec(count, timeout=60).stdout.strip() == b"3", "three sleeps")
    p.kill()
    r = p.wait(timeout=60)
    assert (r.exit_code, r.signal) == (128 + 9, 9)
    _until(lambda: vm.exec(count, timeout=60).stdout.strip() == b"0", "the whole tree to be gone", 30)
    # SIGTERM to the foreground's group only leaves a setsid'ed child alone.
    q = vm.spawn("setsid sleep 1004 & echo up; exec sleep 1005")
    _until(lambda: vm.exec(count, timeout=60).stdout.strip() == b"2", "the second tree")
    q.signal(15, group_only=True)
    assert q.wait(timeout=60).signal == 15
    assert vm.exec(count, timeout=60).stdout.strip() == b"1"
    vm.exec("pkill -x sleep || kill $(pidof sleep)", timeout=60)


# Root in the guest duplicates the agent's channel fd (pidfd_getfd: root holds
# CAP_SYS_PTRACE over PID 1) and writes a frame header announcing 64 MiB: an
# oversized reply from the host's point of view.
FORGE = r"""
import ctypes, os, struct
fd = None
for n in os.listdir("/proc/1/fd"):
    try:
        if os.readlink(f"/proc/1/fd/{n}").startswith("/dev/vport"):
            fd = int(n)
    except OSError:
        pass
libc = ctypes.CDLL(None, use_errno=True)
pidfd = os.pidfd_open(1)
mine = libc.syscall(438, pidfd, fd, 0)  # pidfd_getfd
assert mine >= 0, os.strerror(ctypes.get_errno())
os.write(mine, struct.pack("<IHHQ", 64 << 20, 21, 0, 1) + b"garbage" * 100)
"""


def test_a_guest_sending_an_oversized_reply_fails_only_its_sandbox(
        client: warren.Client, base_layer: str, vm: warren.Sandbox) -> None:
    bad = client.create(backend="microvm", layers=[base_layer], memory_mb=256, timeout=CREATE_TIMEOUT)
    try:
        bad.files.write("/f", b"before")
        with pytest.raises(warren.WarrenError):
            bad.exec(["python3", "-c", FORGE], timeout=60)
        with pytest.raises(warren.Unavailable, match="exceeds the maximum"):
            bad.files.read("/f")
        with pytest.raises(warren.Unavailable):
            bad.spawn("sleep 1")
        # The daemon and the other microVM are unaffected.
        assert "microvm" in client.status().backends
        vm.files.write("/still.txt", b"fine")
        assert vm.files.read("/still.txt") == b"fine"
        assert vm.exec("echo ok", timeout=60).stdout == b"ok\n"
    finally:
        bad.destroy(timeout=60)
