"""Exec semantics every backend must share (DESIGN.md §3). Each case runs on
every backend of conftest.py's `runner` fixture; a case that does not apply
to a backend is skipped with the reason."""

from __future__ import annotations

import os
import signal
import time

import pytest

from .conftest import MEMORY_MB


def test_exit_codes(runner) -> None:
    for code in (0, 1, 3, 255):
        r = runner.sh(f"exit {code}")
        assert (r.exit_code, r.signal, r.timed_out, r.oom_killed) == (code, 0, False, False), (code, r)
    r = runner.py("import sys; sys.exit(42)")
    assert r.exit_code == 42 and r.signal == 0


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV])
def test_signal_is_128_plus_signal(runner, sig) -> None:
    # The foreground process kills itself: exit_code = 128 + signal.
    r = runner.sh(f"kill -{int(sig)} $$; sleep 5; echo not reached")
    assert (r.exit_code, r.signal, r.timed_out) == (128 + sig, sig, False), r
    assert r.stdout == b""


def test_python_fault_is_a_signal(runner) -> None:
    r = runner.py("import ctypes; ctypes.string_at(0)")
    assert (r.exit_code, r.signal) == (128 + signal.SIGSEGV, signal.SIGSEGV), r


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGUSR1])
def test_python_self_signal(runner, sig) -> None:
    if sig == signal.SIGKILL:
        runner.skip_unless("python_self_sigkill")
    r = runner.py(f"import os, sys, time; print('before', flush=True); os.kill(os.getpid(), {int(sig)}); "
                  "time.sleep(5); print('not reached')")
    assert (r.exit_code, r.signal, r.stdout) == (128 + sig, sig, b"before\n"), r


def test_python_unhandled_alarm_ends_the_call(runner) -> None:
    # signal.alarm() as a watchdog: with no handler the process dies of SIGALRM.
    r = runner.py("import signal, time; signal.alarm(1); time.sleep(10); print('not reached')", timeout=30)
    assert (r.exit_code, r.signal, r.timed_out) == (128 + signal.SIGALRM, signal.SIGALRM, False), r
    # A handler the code installs itself still wins.
    r = runner.py("import signal, time\n"
                  "def h(s, f): print('handled', s); raise SystemExit(7)\n"
                  "signal.signal(signal.SIGTERM, h)\nimport os; os.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(5)")
    assert (r.exit_code, r.stdout) == (7, b"handled 15\n"), r


def _host_procs_with(arg: str):
    """Host pids whose argv contains `arg` (the host sees every sandbox process)."""
    found = []
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/cmdline", "rb") as f:
                if arg.encode() in f.read().split(b"\0"):
                    found.append(int(e))
        except OSError:
            pass
    return found


def test_timeout_kills_the_whole_tree(runner) -> None:
    # A background child, a double-forked setsid grandchild and a TERM-ignoring
    # foreground: all of them must be gone when the exec returns timed_out.
    tag = f"{os.getpid()}{time.monotonic_ns() % 100000}"
    t0 = time.monotonic()
    r = runner.sh(f"sleep 1{tag} & (setsid sleep 2{tag} &) ; trap '' TERM; sleep 3{tag}; echo never",
                  timeout=1)
    took = time.monotonic() - t0
    assert r.timed_out and r.signal in (signal.SIGTERM, signal.SIGKILL), r
    assert r.exit_code == 128 + r.signal
    assert b"never" not in r.stdout
    assert took < 15, took
    left = []
    for _ in range(50):  # bounded: up to 5 s for the kernel to finish the kills
        left = [p for a in (f"1{tag}", f"2{tag}", f"3{tag}") for p in _host_procs_with(a)]
        if not left:
            break
        time.sleep(0.1)
    assert not left, f"processes of the timed-out exec still alive: {left}"


def test_stdout_stderr_bytes_are_exact(runner) -> None:
    # NUL, invalid UTF-8 (0xff 0xfe, a lone continuation byte), no trailing newline.
    r = runner.sh(r"printf 'a\000b\377\376\200z'; printf 'e\377rr\000' >&2")
    assert r.stdout == b"a\0b\xff\xfe\x80z", r.stdout
    assert r.stderr == b"e\xffrr\0", r.stderr
    assert (r.stdout_total_bytes, r.stderr_total_bytes) == (7, 5)
    assert not r.stdout_truncated and not r.stderr_truncated
    r = runner.py("import sys; sys.stdout.buffer.write(bytes(range(256))); sys.stderr.buffer.write(b'\\xc3(')")
    assert r.stdout == bytes(range(256)) and r.stderr == b"\xc3(", r


def test_output_cap_keeps_the_head_and_counts_the_rest(runner) -> None:
    r = runner.sh("head -c 300000 /dev/zero; head -c 5000 /dev/zero | tr '\\0' e >&2", output_cap=1000)
    assert r.exit_code == 0, r
    assert r.stdout == b"\0" * 1000 and r.stderr == b"e" * 1000
    assert r.stdout_truncated and r.stderr_truncated
    assert (r.stdout_total_bytes, r.stderr_total_bytes) == (300000, 5000)


def test_stdin_is_fed_then_eof(runner) -> None:
    data = bytes(range(256)) * 1000 + b"end"
    r = runner.sh("cat; echo; echo done", stdin=data)
    assert r.stdout == data + b"\ndone\n", r.stdout[-40:]
    r = runner.sh("cat; echo eof")  # no stdin: immediate EOF, never a hang
    assert r.stdout == b"eof\n"


def test_env(runner) -> None:
    r = runner.sh('printf "%s|%s" "$FOO" "$EMPTY"', env={"FOO": "a b=c 'q' ü", "EMPTY": ""})
    assert r.stdout == "a b=c 'q' ü|".encode(), r.stdout
    r = runner.sh("printf %s \"$PATH\"")
    assert b"/usr/bin" in r.stdout


def test_memory_limit_is_oom_killed(runner) -> None:
    r = runner.py(f"x = b'a' * ({MEMORY_MB * 4} << 20)\nprint('survived')", timeout=60)
    assert b"survived" not in r.stdout
    assert r.oom_killed and r.signal == signal.SIGKILL and r.exit_code == 137, r
    assert runner.sh("echo alive").stdout == b"alive\n"


def test_no_network(runner) -> None:
    r = runner.sh("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
    assert r.stdout == b"lo\n", r.stdout
    r = runner.py("import socket\n"
                  "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=3); print('connected')\n"
                  "except OSError as e:\n    print('refused', e.errno)")
    assert r.stdout.startswith(b"refused"), r.stdout


def test_read_only_root_outside_scratch(runner) -> None:
    runner.skip_unless("read_only_root")
    r = runner.sh("touch /usr/x 2>&1; touch /x 2>&1; { echo hi > /etc/y; } 2>&1; "
                  f"echo ok > {runner.scratch}/f && cat {runner.scratch}/f")
    assert r.stdout.count(b"Read-only file system") == 3, r.stdout
    assert r.stdout.endswith(b"ok\n")


def test_files_persist_between_execs(runner) -> None:
    runner.skip_unless("state")
    runner.sh(f"echo kept > {runner.scratch}/state")
    assert runner.sh(f"cat {runner.scratch}/state").stdout == b"kept\n"


def test_fork_bomb_is_contained(runner) -> None:
    t0 = time.monotonic()
    # The foreground forks once, before any bomb exists (the bomb starts in
    # that subshell), then waits without forking (a busy loop): a fork of its
    # own after the bomb has taken every pid (a `sleep`, or the second
    # element of `f | f &` run by the foreground itself) fails with "Cannot
    # fork" and ends the exec before its time-out, a race with the bomb.
    r = runner.sh("(f(){ f | f & }; f) & while :; do :; done; echo not reached", timeout=2)
    assert r.timed_out and b"not reached" not in r.stdout, r
    assert time.monotonic() - t0 < 30
    # The backend still serves promptly afterwards.
    t0 = time.monotonic()
    assert runner.sh("echo alive", timeout=30).stdout == b"alive\n"
    assert time.monotonic() - t0 < 30


def test_node_status_lists_the_backend(runner, client) -> None:
    # A runner on a daemon of its own (vm) asks that one.
    assert runner.name in getattr(runner, "status_client", client).status().backends
