"""Streaming exec, background processes, shell sessions and PTYs (issue 3)
against a real warrend (api/warren/v1/process.proto, warren.process)."""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import signal
import threading
import time

import pytest

import warren


# ---------------------------------------------------------------- streaming exec

def test_chunks_arrive_while_the_command_runs(sandbox: warren.Sandbox) -> None:
    t0 = time.monotonic()
    seen = []
    with sandbox.exec_stream("echo first; sleep 2; echo second >&2; exit 4") as st:
        for c in st:
            seen.append((time.monotonic() - t0, c.stream, c.data))
    r = st.result
    # On a failure, whether the node's buffer got the bytes (its totals)
    # tells a lost read from a lost send (CI saw the stderr line missing once).
    assert [(s, d) for _, s, d in seen] == [("stdout", b"first\n"), ("stderr", b"second\n")], (seen, r)
    # The first chunk came ~2 s before the second (not held until the command
    # ended); judged by the gap, not from t0, which also counts the call's
    # setup (seconds on a loaded machine).
    assert seen[1][0] - seen[0][0] >= 1.0, seen
    assert seen[1][0] >= 1.9, seen
    assert r is not None and r.exit_code == 4 and r.stdout_total_bytes == 6 and r.stderr_total_bytes == 7


def test_output_written_just_before_the_exit_is_never_lost(sandbox: warren.Sandbox) -> None:
    # The CI failure above, found: a read of the node's buffer whose 200 ms
    # slice ran out just as the command wrote its last bytes and ended
    # answered "finished" without those bytes (~4 % of such streams under
    # load). Bounded: 256 short streams, 8 at once (~10 s).
    def one(i: int) -> tuple:
        seen = []
        with sandbox.exec_stream("echo first; sleep 0.%d; echo second >&2; exit 4" % (i % 3)) as st:
            for c in st:
                seen.append((c.stream, c.data))
        return seen, st.result

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(one, range(256)))
    bad = [(seen, r) for seen, r in results
           if seen != [("stdout", b"first\n"), ("stderr", b"second\n")] or r is None or r.exit_code != 4]
    assert not bad, (len(bad), bad[:3])


def test_streaming_is_byte_exact_and_lossless(sandbox: warren.Sandbox) -> None:
    # A01 in streaming mode, and A03: every byte of a big output arrives.
    with sandbox.exec_stream("printf 'ok \\377\\376\\215 end\\n'; printf 'err \\303\\050\\n' >&2; exit 3") as st:
        out = b"".join(c.data for c in st if c.stream == "stdout")
    assert out == bytes.fromhex("6f6b20fffe8d20656e640a")
    assert st.result.exit_code == 3
    h = hashlib.sha256()
    n = 0
    with sandbox.exec_stream("head -c 50000000 /dev/urandom | tee /tmp/big | sha256sum >&2", timeout=120) as st:
        err = b""
        for c in st:
            if c.stream == "stderr":
                err += c.data
    assert st.result.exit_code == 0
    with sandbox.exec_stream("cat /tmp/big", timeout=120) as st:
        for c in st:
            assert c.stream == "stdout" and c.offset == n and c.dropped == 0
            h.update(c.data)
            n += len(c.data)
    assert n == 50_000_000 == st.result.stdout_total_bytes
    assert err.split()[0].decode() == h.hexdigest()


def test_stdin_is_streamed(sandbox: warren.Sandbox) -> None:
    st = sandbox.exec_stream("while read -r l; do echo got:$l; done; echo eof", stdin=b"a\n")
    it = iter(st)
    assert next(it).data == b"got:a\n"
    st.send_stdin(b"b\n")
    assert next(it).data == b"got:b\n"
    st.close_stdin()
    assert b"".join(c.data for c in it) == b"eof\n"
    assert st.result.exit_code == 0


def test_exec_callbacks(sandbox: warren.Sandbox) -> None:
    got = []
    r = sandbox.exec("echo a; echo b >&2; echo c", on_stdout=lambda b: got.append(("o", b)),
                     on_stderr=lambda b: got.append(("e", b)), timeout=30)
    assert r.exit_code == 0 and r.stdout == b"a\nc\n" and r.stderr == b"b\n"
    assert b"".join(b for k, b in got if k == "o") == b"a\nc\n"
    assert [b for k, b in got if k == "e"] == [b"b\n"]
    # stdin gets EOF at once, as with exec (A06)
    r = sandbox.exec("cat; echo done", on_stdout=got.append, timeout=5)
    assert r.stdout == b"done\n" and not r.timed_out


def test_stream_timeout_and_signal(sandbox: warren.Sandbox) -> None:
    t0 = time.monotonic()
    r = sandbox.exec_stream("echo start; sleep 30", timeout=1).wait()
    assert r.timed_out and time.monotonic() - t0 < 10
    st = sandbox.exec_stream("echo up; sleep 30")
    it = iter(st)
    assert next(it).data == b"up\n"
    st.signal(signal.SIGKILL)
    list(it)
    assert st.result.signal == 9 and st.result.exit_code == 137


def test_client_disconnect_kills_the_stream_tree(daemon, client, base_layer) -> None:
    with client.create(layers=[base_layer]) as sb:
        c2 = warren.Client(client.addr)
        sb2 = c2.get(sb.id)
        st = sb2.exec_stream("sh -c 'sleep 300 & sleep 301 & wait' & echo started; wait")
        it = iter(st)
        assert next(it).data == b"started\n"
        assert sb.exec("pgrep -c sleep", timeout=10).stdout.strip() == b"2"
        c2.close()  # the channel goes away with the call in flight
        for _ in range(100):
            if sb.exec("pgrep sleep", timeout=10).exit_code == 1:
                break
            time.sleep(0.1)
        assert sb.exec("pgrep sleep", timeout=10).exit_code == 1, "sleeps survived the disconnect"


# ---------------------------------------------------------------- background processes

def test_spawn_output_wait_and_exit_code_kept(sandbox: warren.Sandbox) -> None:
    p = sandbox.spawn("echo hello; echo oops >&2; sleep 1; exit 7")
    assert p.id and p.cached_info.running
    r = p.wait(timeout=30)
    assert r.exit_code == 7
    out = p.output()
    assert (out.stdout, out.stderr, out.stdout_dropped, out.result.exit_code) == (b"hello\n", b"oops\n", 0, 7)
    # Kept after exit, listed with its state.
    time.sleep(0.2)
    infos = {i.id: i for i in sandbox.processes()}
    assert infos[p.id].state == "exited" and infos[p.id].exit_code == 7
    assert sandbox.process(p.id).wait(timeout=1).exit_code == 7
    with pytest.raises(warren.NotFound):
        sandbox.process("p999999")


def test_background_process_survives_client_disconnect(daemon, client, base_layer) -> None:
    with client.create(layers=[base_layer]) as sb:
        c1 = warren.Client(client.addr)
        p = c1.get(sb.id).spawn("for i in $(seq 1 30); do echo line $i; sleep 0.1; done; cat")
        pid = p.id
        c1.close()  # the client that spawned it is gone
        time.sleep(4)  # output produced while nobody listens
        c2 = warren.Client(client.addr)
        p2 = c2.get(sb.id).process(pid)
        want = len(b"".join(b"line %d\n" % i for i in range(1, 31)))
        deadline = time.monotonic() + 30  # a loaded machine runs the 30 sleeps slower
        while p2.info().stdout_total_bytes < want and time.monotonic() < deadline:
            time.sleep(0.2)
        assert p2.info().running  # still waiting in `cat`
        out = p2.output()
        assert out.stdout == b"".join(b"line %d\n" % i for i in range(1, 31))
        p2.send_stdin(b"more\n")
        p2.close_stdin()
        assert p2.wait(timeout=30).exit_code == 0
        assert p2.output(stdout_offset=out.stdout_end).stdout == b"more\n"
        c2.close()


def test_bounded_buffer_reports_dropped_output(sandbox: warren.Sandbox) -> None:
    p = sandbox.spawn("seq 1 100000; echo END", buffer_bytes=4096)  # ~589 kB through a 4 KiB ring
    assert p.wait(timeout=60).exit_code == 0
    info = p.info()
    assert info.stdout_total_bytes == 588_899
    out = p.output()
    assert len(out.stdout) == 4096 and out.stdout.endswith(b"99999\n100000\nEND\n")
    assert out.stdout_dropped == 588_899 - 4096 == out.stdout_offset
    assert info.stdout_first_offset == out.stdout_offset
    # A reader that asks for recent output only misses nothing.
    tail = p.output(stdout_offset=588_899 - 10)
    assert tail.stdout_dropped == 0 and tail.stdout == b"100000\nEND\n"[-10:]


def test_kill_takes_the_whole_tree(sandbox: warren.Sandbox) -> None:
    p = sandbox.spawn("setsid sleep 500 & (sleep 501 &) ; sh -c 'sleep 502 & wait' & echo ok; wait")
    st = p.stream()
    for c in st:
        if c.data == b"ok\n":
            break
    st.close()
    # "ok" may come before the backgrounded shells have exec'd their sleeps.
    for _ in range(50):
        if sandbox.exec("pgrep -c sleep", timeout=10).stdout.strip() == b"3":
            break
        time.sleep(0.1)
    assert sandbox.exec("pgrep -c sleep", timeout=10).stdout.strip() == b"3"
    p.kill()
    r = p.wait(timeout=30)
    assert r.signal == signal.SIGKILL
    for _ in range(50):
        if sandbox.exec("pgrep sleep", timeout=10).exit_code == 1:
            break
        time.sleep(0.1)
    assert sandbox.exec("pgrep sleep", timeout=10).exit_code == 1


def test_stream_follows_until_exit(sandbox: warren.Sandbox) -> None:
    p = sandbox.spawn("for i in 1 2 3; do echo $i; sleep 0.3; done; exit 2")
    t0 = time.monotonic()
    st = p.stream()
    chunks = [(time.monotonic() - t0, c.data) for c in st]
    t_end = time.monotonic() - t0
    assert b"".join(d for _, d in chunks) == b"1\n2\n3\n"
    # Followed, not collected at exit: the first line arrives while the
    # process still sleeps its 0.9 s (a gap relative to the end, so a slow
    # start on a loaded machine does not matter).
    assert t_end - chunks[0][0] > 0.45, chunks
    assert st.result is not None and st.result.exit_code == 2


def test_processes_die_with_the_sandbox_and_are_audited(client, base_layer) -> None:
    sb = client.create(layers=[base_layer])
    try:
        p = sb.spawn("sleep 1000")
        q = sb.spawn("exit 3")
        q.wait(timeout=30)
        log = sb.audit_log()  # a returned wait's exit is in the log already
        ops = [(e["op"], e.get("process_id")) for e in log]
        assert ("spawn", p.id) in ops and ("spawn", q.id) in ops and ("process_exit", q.id) in ops, ops
        assert [e for e in log if e["op"] == "process_exit"][0]["exit_code"] == 3
    finally:
        sb.destroy()
    with pytest.raises(warren.NotFound):
        p.info()


# ---------------------------------------------------------------- sessions

def test_session_keeps_cwd_env_and_variables(sandbox: warren.Sandbox) -> None:
    with sandbox.session() as sh:
        assert sh.run("cd /tmp && x=41 && export Y=yes && f() { echo fn; }", timeout=30).exit_code == 0
        r = sh.run("echo $PWD $((x+1)) $Y; f; declare z=9", timeout=30)
        assert r.stdout == b"/tmp 42 yes\nfn\n" and r.exit_code == 0
        assert sh.run("echo $z; sh -c 'echo $Y'", timeout=30).stdout == b"9\nyes\n"
        r = sh.run("printf 'no newline'; printf 'err' >&2; false", timeout=30)
        assert (r.stdout, r.stderr, r.exit_code) == (b"no newline", b"err", 1)
        r = sh.run("echo 'quote \" and '\\'' and $ \\\\ \x01'", timeout=30)
        assert r.stdout == b"quote \" and ' and $ \\\\ \x01\n"  # single quotes keep both backslashes
        assert sh.run("echo \"unbalanced", timeout=30).exit_code == 2  # a syntax error is the command's


def test_session_background_job_and_timeout(sandbox: warren.Sandbox) -> None:
    with sandbox.session() as sh:
        t0 = time.monotonic()
        r = sh.run("sleep 300 & echo started", timeout=30)
        assert r.stdout == b"started\n" and r.exit_code == 0 and time.monotonic() - t0 < 5
        t0 = time.monotonic()
        r = sh.run("echo before; sleep 100; echo after", timeout=1)
        assert r.timed_out and r.exit_code == 130 and r.stdout == b"before\n"
        assert time.monotonic() - t0 < 6
        r = sh.run("while :; do :; done", timeout=1)  # a builtin loop is interrupted too
        assert r.timed_out
        r = sh.run("echo alive; jobs | grep -c sleep", timeout=30)
        assert r.stdout == b"alive\n1\n"  # the background job survived the interrupts


def test_two_sessions_run_concurrently(sandbox: warren.Sandbox) -> None:
    with sandbox.session() as a, sandbox.session(cwd="/tmp") as b:
        a.run("v=A; cd /", timeout=30)
        b.run("v=B", timeout=30)
        res = {}

        def go(name, sh):
            res[name] = (time.monotonic(), sh.run("sleep 1.5; echo $v $PWD", timeout=30))

        t0 = time.monotonic()
        ts = [threading.Thread(target=go, args=(n, s)) for n, s in (("a", a), ("b", b))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert res["a"][1].stdout == b"A /\n" and res["b"][1].stdout == b"B /tmp\n"
        assert max(res["a"][0], res["b"][0]) - t0 < 2.9  # overlapped, not one after the other


# ---------------------------------------------------------------- PTY

def test_pty_isatty_and_resize(sandbox: warren.Sandbox) -> None:
    r = sandbox.exec_stream("test -t 0 && test -t 1 && echo tty; tty; stty size", pty=True, rows=33, cols=101)
    out = b"".join(c.data for c in r)
    assert r.result.exit_code == 0
    lines = out.replace(b"\r\n", b"\n").split(b"\n")
    assert lines[0] == b"tty" and lines[1].startswith(b"/dev/pts/") and lines[2] == b"33 101", out
    # resize of a running background PTY process: seen by stty and as SIGWINCH
    p = sandbox.spawn("trap 'stty size' WINCH; echo ready; while :; do sleep 0.1; done", pty=True)
    st = p.stream()
    buf = b""
    for c in st:
        buf += c.data
        if b"ready" in buf:
            break
    st.close()
    p.resize(50, 132)
    for _ in range(50):
        if b"50 132" in p.output().stdout:
            break
        time.sleep(0.1)
    assert b"50 132" in p.output().stdout
    p.kill()
    with pytest.raises(warren.FailedPrecondition):
        sandbox.spawn("sleep 1").resize(10, 10)


# ---------------------------------------------------------------- leaks

def test_processes_leave_nothing_behind(daemon, client, base_layer, baseline) -> None:
    from conftest import assert_back_to_baseline, wait_warm_pool
    wait_warm_pool(daemon)  # its shells' fds count as the daemon's
    threads0 = len(os.listdir(f"/proc/{daemon.pid}/task"))
    fds0 = len(os.listdir(f"/proc/{daemon.pid}/fd"))
    for _ in range(3):
        with client.create(layers=[base_layer]) as sb:
            sb.spawn("sleep 1000 & yes > /dev/null & sleep 999")  # killed by the destroy
            sb.spawn("exit 0").wait(timeout=30)
            sb.spawn("sleep 1000", pty=True)
            st = sb.exec_stream("sleep 1000 & echo x; wait")
            next(iter(st))
            st.close()  # disconnect: killed
            with sb.session() as sh:
                sh.run("sleep 500 &", timeout=30)
            sb.exec_stream("echo done", pty=True).wait()
    assert_back_to_baseline([daemon], baseline, clients=[client])
    # pump threads and pipes of the processes are gone too
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        wait_warm_pool(daemon, 1.0)
        threads = len(os.listdir(f"/proc/{daemon.pid}/task"))
        fds = len(os.listdir(f"/proc/{daemon.pid}/fd"))
        if threads <= threads0 + 2 and fds <= fds0 + 2:
            break
        time.sleep(0.2)
    assert threads <= threads0 + 2 and fds <= fds0 + 2, (threads0, threads, fds0, fds)


def test_bad_input_is_an_error_not_an_outcome(client, sandbox: warren.Sandbox) -> None:
    with pytest.raises(warren.NotFound):
        sandbox.spawn("true", cwd="/no/such/dir")
    with pytest.raises(warren.NotFound):
        list(sandbox.exec_stream("true", cwd="/no/such/dir"))
    with pytest.raises(warren.InvalidArgument):
        sandbox.spawn("true", buffer_bytes=1 << 40)
    with pytest.raises(warren.InvalidArgument):
        sandbox.spawn("true", env={"A=B": "x"})
    p = sandbox.spawn("sleep 100")
    with pytest.raises(warren.InvalidArgument):
        p.signal(0)
    with pytest.raises(warren.InvalidArgument):
        p.resize(0, 10)
    p.kill()
    assert p.wait(timeout=30).signal == signal.SIGKILL
    with pytest.raises(warren.FailedPrecondition):
        p.send_stdin(b"late")  # exited: stdin is closed
    with pytest.raises(warren.NotFound):
        list(client.get(sandbox.id).exec_stream("true", user="nobody-such-user"))
    gone = client.create(layers=sandbox.cached_info.layer_names)
    gone.destroy()
    with pytest.raises(warren.NotFound):
        list(gone.exec_stream("true"))
    with pytest.raises(warren.NotFound):
        gone.spawn("true")
    with pytest.raises(warren.NotFound):
        gone.processes()
