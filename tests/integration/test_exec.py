"""A01–A08 of /work/shared/acceptance/CASES.md (exec), through the SDK
against a real warrend. Streaming exec is not in the v1 API yet, so the
"same in streaming mode" parts are not covered here."""

import hashlib
import os
import resource
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import WARREND_RSS_GROWTH_CAP, rss_bytes


def test_a01_non_utf8_output(sandbox):
    r = sandbox.exec("printf 'ok \\377\\376\\215 end\\n'; printf 'err \\303\\050\\n' >&2; exit 3",
                     timeout=30)
    assert r.exit_code == 3 and r.signal == 0 and not r.timed_out
    assert r.stdout == bytes.fromhex("6f6b20fffe8d20656e640a")
    assert r.stderr == b"err \xc3\x28\n"
    assert r.text == "ok \ufffd\ufffd\ufffd end\n"
    assert r.stderr_text == "err \ufffd(\n"
    assert not r.ok
    assert r.stdout_total_bytes == 11 and r.stderr_total_bytes == 7
    assert not r.stdout_truncated and not r.stderr_truncated


def test_a02_nul_and_all_byte_values(sandbox):
    r = sandbox.exec("printf 'a\\0b\\0c'", timeout=30)
    assert r.exit_code == 0
    assert r.stdout == b"a\0b\0c" and len(r.stdout) == 5
    data = os.urandom(1 << 20)
    sandbox.files.write("/w/rand.bin", data, make_parents=True)
    r = sandbox.exec(["cat", "/w/rand.bin"], timeout=30)
    assert r.exit_code == 0 and not r.stdout_truncated
    assert hashlib.sha256(r.stdout).hexdigest() == hashlib.sha256(data).hexdigest()
    # argv and env bytes are passed through byte-exact too.
    r = sandbox.exec([b"printf", b"%s|%s", b"\xff\x01", b"$X"], env={"X": b"\xfe"}, timeout=30)
    assert r.stdout == b"\xff\x01|$X"
    r = sandbox.exec("printf %s \"$X\"", env={"X": b"\xfe\x80"}, timeout=30)
    assert r.stdout == b"\xfe\x80"


def _seq_bytes(n: int) -> int:
    total, d, lo = 0, 1, 1
    while lo <= n:
        hi = min(n, 10 ** d - 1)
        total += (hi - lo + 1) * (d + 1)
        d, lo = d + 1, 10 ** d
    return total


@pytest.mark.timeout(600)
def test_a03_huge_and_fast_output(daemon, sandbox):
    pid = daemon.pid
    rss0 = rss_bytes(pid)
    client_rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peak = [rss0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], rss_bytes(pid))
            except (OSError, AssertionError):
                return
            time.sleep(0.02)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        t0 = time.monotonic()
        r = sandbox.exec("yes x | head -c 300000000", timeout=180)
        assert r.exit_code == 0 and not r.timed_out
        assert r.stdout_total_bytes == 300_000_000
        assert r.stdout_truncated
        assert 0 < len(r.stdout) < 300_000_000
        assert r.stdout == b"x\n" * (len(r.stdout) // 2) + (b"x" if len(r.stdout) % 2 else b"")
        assert time.monotonic() - t0 < 120

        r = sandbox.exec("seq 1 100000000", timeout=300)
        assert r.exit_code == 0 and not r.timed_out
        assert r.stdout_total_bytes == _seq_bytes(100_000_000)
        assert r.stdout_truncated and r.stdout.startswith(b"1\n2\n3\n")

        r = sandbox.exec("head -c 200000 /dev/zero >&2; echo done", timeout=60)
        assert r.exit_code == 0
        assert r.stdout == b"done\n"
        assert r.stderr == b"\0" * 200_000 and r.stderr_total_bytes == 200_000
        assert not r.stderr_truncated and not r.stdout_truncated

        # An explicit cap is honoured exactly.
        r = sandbox.exec("head -c 5000 /dev/zero", output_cap=1000, timeout=60)
        assert len(r.stdout) == 1000 and r.stdout_truncated and r.stdout_total_bytes == 5000
    finally:
        stop.set()
        t.join(timeout=5)
    growth = peak[0] - rss0
    assert growth < WARREND_RSS_GROWTH_CAP, f"warrend RSS grew by {growth >> 20} MiB"
    client_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - client_rss0
    assert client_growth < WARREND_RSS_GROWTH_CAP, f"client max RSS grew by {client_growth >> 20} MiB"
    assert sandbox.exec("echo ok", timeout=30).stdout == b"ok\n"


def _count(sandbox, comm: str) -> int:
    r = sandbox.exec(f"ps -eo comm= | grep -cx '{comm}' || true", timeout=30)
    assert r.exit_code == 0, r.stderr
    return int(r.stdout.strip())


@pytest.mark.parametrize("cmd", [
    "echo start; sleep 10",
    # the whole tree dies, including setsid'ed, double-forked and TERM-ignoring processes
    "echo start; setsid sleep 10 & (sleep 10 &) ; sh -c 'trap \"\" TERM; sleep 10' & sleep 10",
])
def test_a04_timeout_is_real(sandbox, cmd):
    t0 = time.monotonic()
    r = sandbox.exec(cmd, timeout=1)
    elapsed = time.monotonic() - t0
    assert r.timed_out
    assert 0.9 <= elapsed < 4, f"timeout=1 returned after {elapsed:.2f} s"
    assert r.stdout.startswith(b"start\n")
    assert r.exit_code != 0
    assert _count(sandbox, "sleep") == 0


def test_a05_background_child_holding_stdout(sandbox):
    for _ in range(2):
        t0 = time.monotonic()
        r = sandbox.exec("sh -c 'sleep 1000 &'; echo back", timeout=30)
        assert time.monotonic() - t0 < 3
        assert not r.timed_out and r.exit_code == 0 and r.stdout == b"back\n"
    t0 = time.monotonic()
    r = sandbox.exec("nohup tail -f /dev/null &", timeout=30)
    assert time.monotonic() - t0 < 3
    assert not r.timed_out and r.exit_code == 0
    # Documented policy: background processes keep running until the sandbox
    # is destroyed; their output pipes are closed when the exec returns (so
    # `tail -f`, which exits when its output pipe is closed, ends by itself).
    # Polled: a backgrounded child may not have exec'd yet.
    deadline = time.monotonic() + 5
    while _count(sandbox, "sleep") != 2:
        assert time.monotonic() < deadline, (
            sandbox.exec("ps -eo pid,ppid,stat,comm", timeout=30).text)
        time.sleep(0.2)


def test_a06_stdin(sandbox):
    t0 = time.monotonic()
    r = sandbox.exec("cat; echo done", timeout=5)
    assert not r.timed_out and r.stdout == b"done\n"
    assert time.monotonic() - t0 < 3
    r = sandbox.exec("read -r x; echo rc=$?", timeout=5)
    assert r.stdout == b"rc=1\n"
    r = sandbox.exec("python3 -c 'import sys;print(repr(sys.stdin.read()))'", stdin=b"abc", timeout=30)
    assert r.exit_code == 0 and r.stdout == b"'abc'\n"
    data = os.urandom(3 << 20)
    r = sandbox.exec("sha256sum", stdin=data, timeout=30)
    assert r.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("cmd,code,sig", [
    ("kill -9 $$", 137, 9),
    ("kill -TERM $$", 143, 15),
    ("exit 255", 255, 0),
    ("exit 300", 44, 0),
    ("true", 0, 0),
    ("false", 1, 0),
])
def test_a07_exit_status(sandbox, cmd, code, sig):
    r = sandbox.exec(cmd, timeout=30)
    assert (r.exit_code, r.signal) == (code, sig)
    assert not r.oom_killed and not r.timed_out
    assert r.ok == (code == 0)


def test_a07_unknown_command(sandbox):
    r = sandbox.exec("no-such-command-xyz", timeout=30)
    assert r.exit_code == 127 and r.signal == 0 and not r.oom_killed
    assert b"not found" in r.stderr
    # argv form: a missing program is an outcome too, not an RPC error.
    r = sandbox.exec(["no-such-command-xyz"], timeout=30)
    assert r.exit_code == 127


ORPHANS = "for i in 1 2 3 4 5; do sh -c 'sh -c \"sleep 1\" &' & wait; done"


def _zombies(sandbox) -> int:
    r = sandbox.exec("ps -eo stat= | grep -c '^Z' || true", timeout=30)
    return int(r.stdout.strip())


@pytest.mark.timeout(900)
def test_a08_zombies(client, base_layer):
    # pids: up to ~10 orphaned `sleep 1` per exec are alive at once per exec in flight.
    with client.create(layers=[base_layer], pids=4096) as sb:
        _a08(sb)


def _a08(sandbox):
    r = sandbox.exec(ORPHANS, timeout=30)
    assert r.exit_code == 0
    time.sleep(3)
    assert _zombies(sandbox) == 0

    def one(_):
        return sandbox.exec(ORPHANS, timeout=60).exit_code

    with ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(one, range(2000)))
    assert codes == [0] * 2000
    time.sleep(3)
    assert _zombies(sandbox) == 0
    r = sandbox.exec("echo ok", timeout=30)
    assert r.exit_code == 0 and r.stdout == b"ok\n"
