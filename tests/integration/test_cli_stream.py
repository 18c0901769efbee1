"""`warren exec -it` (PTY, raw mode, SIGWINCH -> resize) and `warren logs`
end to end: the CLI runs on a real pseudo-terminal of the test (issue 3)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import termios
import time

import pytest

import warren
from conftest import CLI


def _read_until(fd: int, needle: bytes, timeout: float = 20.0) -> bytes:
    buf = b""
    end = time.monotonic() + timeout
    while needle not in buf and time.monotonic() < end:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                d = os.read(fd, 65536)
            except OSError:
                break
            if not d:
                break
            buf += d
    return buf


def _set_winsize(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def test_exec_it_interactive_shell_with_resize(daemon, sandbox: warren.Sandbox) -> None:
    if not CLI.exists():
        pytest.fail(f"CLI binary not found at {CLI}")
    master, slave = pty.openpty()
    _set_winsize(slave, 30, 90)
    p = subprocess.Popen([str(CLI), "--addr", "unix:" + str(daemon.socket), "exec", "-it", sandbox.id, "--",
                          "bash", "--norc", "-i"], stdin=slave, stdout=slave, stderr=slave,
                         start_new_session=True, preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    os.close(slave)
    try:
        # The remote prompt: from here on our terminal is raw (no local echo).
        assert b"bash" in _read_until(master, b"# "), "no remote prompt"
        # Needles are spelled differently in the input (MA""RK1) than in the output.
        os.write(master, b"stty size; tty; echo MA\"\"RK1\r")
        out = _read_until(master, b"MARK1\r\n")
        assert b"30 90" in out and b"/dev/pts/" in out, out
        # Our window changes: the CLI gets SIGWINCH and resizes the remote PTY.
        _set_winsize(master, 44, 120)
        os.kill(p.pid, signal.SIGWINCH)
        time.sleep(0.5)
        os.write(master, b"stty size; echo MA\"\"RK2\r")
        out = _read_until(master, b"MARK2\r\n")
        assert b"44 120" in out, out
        # Raw mode: Ctrl-C reaches the remote terminal and interrupts sleep, not the CLI.
        os.write(master, b"sleep 100\r")
        time.sleep(1.0)
        os.write(master, b"\x03")
        os.write(master, b"echo after\"\"-int $?\r")
        out = _read_until(master, b"after-int 130")
        assert b"after-int 130" in out, out
        os.write(master, b"exit 7\r")
        assert p.wait(timeout=20) == 7
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)


def test_logs_and_follow(daemon, sandbox: warren.Sandbox) -> None:
    proc = sandbox.spawn("echo one; echo two >&2; sleep 1; echo three")
    args = [str(CLI), "--addr", "unix:" + str(daemon.socket), "logs", sandbox.id, proc.id]
    r = subprocess.run(args + ["-f"], capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stdout == b"one\nthree\n" and r.stderr == b"two\n", r
    small = sandbox.spawn("seq 1 10000", buffer_bytes=1000)
    small.wait(timeout=30)
    r = subprocess.run(args[:-1] + [small.id], capture_output=True, timeout=60)
    assert r.returncode == 0 and len(r.stdout) == 1000 and r.stdout.endswith(b"10000\n")
    assert b"47894 earlier bytes of stdout were dropped" in r.stderr, r.stderr
    r = subprocess.run(args[:-1] + ["p0"], capture_output=True, timeout=60)
    assert r.returncode == 1 and b"NOT_FOUND" in r.stderr
