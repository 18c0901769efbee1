"""Lifecycle for RL (issue 4) through the SDK against a real warrend: TTL and
idle timeout enforced by the daemon, pause/resume, snapshots (pack_diff) with
exclude, fork, tamper-proof grading, the audit log and idempotent calls."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import List

import pytest

import warren

SDK = Path(__file__).resolve().parents[2] / "sdk/python"


def wait_until(pred, timeout: float, step: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def sh(sb: warren.Sandbox, cmd: str, timeout: float = 60) -> str:
    r = sb.exec(cmd, timeout=timeout)
    assert r.exit_code == 0, (cmd, r.exit_code, r.stdout, r.stderr)
    return r.stdout.decode()


# ---------------------------------------------------------------- TTL / idle

def test_ttl_survives_a_killed_client(daemon, client, base_layer):
    tag = uuid.uuid4().hex[:12]
    code = (
        "import os, sys, warren\n"
        f"c = warren.Client({'unix:' + str(daemon.socket)!r})\n"
        f"ids = [c.create(layers=[{base_layer!r}], ttl_s=4, labels={{'ttl': {tag!r}}}).id for _ in range(10)]\n"
        "print(' '.join(ids), flush=True)\n"
        "import time; time.sleep(600)\n")
    env = dict(os.environ, PYTHONPATH=str(SDK) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env)
    try:
        line = p.stdout.readline().decode().split()
        assert len(line) == 10
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    live = client.list(labels={"ttl": tag})
    assert len(live) == 10
    assert all(s.cached_info.expires_at_ns > 0 for s in live)
    assert wait_until(lambda: not client.list(labels={"ttl": tag}), timeout=20)
    for i in line:
        with pytest.raises(warren.NotFound) as ei:
            client.get(i)
        # not a mistyped id: the error says the node destroyed it, and why
        assert "destroyed at" in str(ei.value) and "(ttl expired)" in str(ei.value), str(ei.value)


def test_idle_timeout_counts_from_last_call_and_not_during_exec(client, base_layer):
    sb = client.create(layers=[base_layer], idle_timeout_s=2)
    try:
        t0 = time.monotonic()
        r = sb.exec("sleep 3; echo ok", timeout=30)  # running exec: never idle
        assert r.stdout == b"ok\n"
        assert time.monotonic() - t0 >= 3
        assert sb.info().state == "running"
        assert wait_until(lambda: _gone(client, sb.id), timeout=10)
        with pytest.raises(warren.NotFound, match=r"destroyed at .*\(idle timeout\)"):
            sb.exec("true", timeout=30)
    finally:
        try:
            sb.destroy()
        except warren.NotFound:
            pass


def _gone(client: warren.Client, sid: str) -> bool:
    try:
        client.get(sid)
        return False
    except warren.NotFound:
        return True


def test_extend_ttl(client, base_layer):
    sb = client.create(layers=[base_layer], ttl_s=2)
    try:
        info = sb.extend_ttl(60)
        assert info.expires_at_ns > time.time_ns() + 50e9
        time.sleep(3.5)
        assert sb.info().state == "running"
        sb.extend_ttl(1)
        assert wait_until(lambda: _gone(client, sb.id), timeout=8)
    finally:
        try:
            sb.destroy()
        except warren.NotFound:
            pass


# ---------------------------------------------------------------- pause / resume

SERVER_CHECK = ("python3 -c \"import urllib.request as u; "
                "print(u.urlopen('http://127.0.0.1:8765/marker.txt', timeout=5).read().decode())\"")


def _lines(sb: warren.Sandbox) -> int:
    return len(sb.files.read("/w/log").splitlines())


@pytest.mark.parametrize("mode", ["pause", "suspend"])
def test_pause_resume_three_times_keeps_processes_and_files(client, base_layer, mode):
    with client.create(layers=[base_layer], workdir="/w") as sb:
        sb.files.write("/w/marker.txt", b"served-marker\n")
        sh(sb, "nohup sh -c 'i=0; while true; do echo $i >> /w/log; i=$((i+1)); sleep 0.05; done' "
               ">/dev/null 2>&1 &")
        sh(sb, "cd /w && nohup python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 &")
        assert wait_until(lambda: sb.exec(SERVER_CHECK, timeout=10).exit_code == 0, timeout=20)
        for round_ in range(3):
            before = _lines(sb)
            state = {"pause": "paused", "suspend": "suspended"}[mode]
            info = getattr(sb, mode)()
            assert info.state == state
            assert sb.info().state == state
            assert [s.cached_info.state for s in client.list() if s.id == sb.id] == [state]
            time.sleep(1.5)  # ~30 lines if the writer were not frozen
            if round_ < 2:
                sb.resume()
            # round 3: the read below resumes implicitly
            after = _lines(sb)
            assert sb.info().state == "running"
            assert after - before < 10, (before, after)
            assert wait_until(lambda: _lines(sb) > after + 5, timeout=10), "writer did not continue"
            r = sb.exec(SERVER_CHECK, timeout=20)
            assert r.exit_code == 0 and r.stdout == b"served-marker\n\n", r
            assert b"served-marker" in sb.files.read("/w/marker.txt")


def test_exec_on_paused_sandbox_resumes_it_and_timeouts_do_not_burst(client, base_layer):
    with client.create(layers=[base_layer]) as sb:
        sb.pause()
        time.sleep(1.0)
        t0 = time.monotonic()
        r = sb.exec("echo start; sleep 0.5; echo end", timeout=5)
        assert r.exit_code == 0 and not r.timed_out and r.stdout == b"start\nend\n"
        assert time.monotonic() - t0 < 4
        assert sb.info().state == "running"


# ---------------------------------------------------------------- snapshots

def test_snapshot_restores_exactly_the_new_state(client, base_layer):
    with client.create(layers=[base_layer]) as sb:
        assert sh(sb, "ls /etc/apt | wc -l").strip() != "0"
        sh(sb, "rm -rf /etc/apt && mkdir /etc/apt && echo fresh > /etc/apt/only.txt")
        sh(sb, "rm /etc/issue")
        orig = sh(sb, "cat /etc/debian_version")
        sh(sb, "chmod 0600 /etc/debian_version")
        sh(sb, "mkdir -p /w/d && echo data > /w/d/f && ln /w/d/f /w/d/hard && ln -s ../d/f /w/d/sym "
               "&& setfattr -n user.k -v v1 /w/d/f 2>/dev/null || true")
        snap = sb.snapshot()
        assert snap.layers[:-1] == sb.info().layers
        assert snap.layers[-1] == snap.layer.digest
    with client.create(layers=snap.layers) as kid:
        assert sh(kid, "ls -A /etc/apt") == "only.txt\n"
        assert sh(kid, "cat /etc/apt/only.txt") == "fresh\n"
        assert kid.exec("test -e /etc/issue").exit_code == 1
        assert sh(kid, "stat -c %a /etc/debian_version") == "600\n"
        assert sh(kid, "cat /etc/debian_version") == orig
        assert sh(kid, "stat -c %u:%g /etc/apt/only.txt /w/d/f") == "0:0\n0:0\n"
        assert sh(kid, "stat -c %i /w/d/f") == sh(kid, "stat -c %i /w/d/hard")
        assert sh(kid, "readlink /w/d/sym") == "../d/f\n"
        assert sh(kid, "cat /w/d/sym") == "data\n"
        # the rest of the lower is untouched
        assert sh(kid, "test -x /bin/sh && echo ok") == "ok\n"


def test_snapshot_exclude_drops_paths_from_the_layer(client, base_layer):
    with client.create(layers=[base_layer]) as sb:
        sh(sb, "mkdir -p /w/cache /w/src/__pycache__ /root && echo 42 > /w/answer.txt && echo k > /w/keep.txt "
               "&& echo c > /w/cache/x && echo p > /w/src/__pycache__/m.pyc && echo h > /root/.bash_history")
        snap = sb.snapshot(exclude=["/w/answer.txt", "/w/cache", "*/__pycache__", "/root/.bash_history"])
    with client.create(layers=snap.layers) as kid:
        assert sh(kid, "cat /w/keep.txt") == "k\n"
        for p in ["/w/answer.txt", "/w/cache", "/w/src/__pycache__", "/root/.bash_history"]:
            assert kid.exec(f"test -e {p}").exit_code == 1, p
        assert sh(kid, "test -d /w/src && echo dir") == "dir\n"


def test_excluded_paths_are_absent_from_the_layer_image(client, base_layer, layer_store):
    """Not only hidden in a sandbox: the excluded bytes and names are not in
    the packed layer (EROFS, uncompressed, so present bytes are greppable)."""
    keep, secret = uuid.uuid4().hex * 2, uuid.uuid4().hex * 2
    secret_name = "answer-" + uuid.uuid4().hex[:12]
    with client.create(layers=[base_layer]) as sb:
        sb.files.write("/w/keep.txt", keep.encode(), make_parents=True)
        sb.files.write(f"/w/ref/{secret_name}", secret.encode(), make_parents=True)
        snap = sb.snapshot(exclude=["/w/ref"])
    blob = (layer_store / "blobs" / "sha256" / snap.layer.digest.split(":", 1)[1]).read_bytes()
    assert keep.encode() in blob  # the method can see file contents
    assert secret.encode() not in blob
    assert secret_name.encode() not in blob


def test_snapshot_is_incremental(client, base_layer):
    with client.create(layers=[base_layer]) as a:
        sh(a, "mkdir -p /w && head -c 3000000 /dev/urandom > /w/big && echo a > /w/a")
        snap_a = a.snapshot()
    with client.create(layers=snap_a.layers) as b:
        sh(b, "echo b > /w/b")
        snap_b = b.snapshot()
    assert snap_b.layers[:-1] == snap_a.layers
    assert snap_b.layer.size_bytes < snap_a.layer.size_bytes / 4
    # the B layer alone on the base holds only B's change
    with client.create(layers=[base_layer, snap_b.layer.digest]) as only_b:
        assert sh(only_b, "ls /w") == "b\n"
    with client.create(layers=snap_b.layers) as full:
        assert sh(full, "ls /w") == "a\nb\nbig\n"


def test_fork_of_less_than_one_is_refused_and_snapshots_nothing(client, base_layer):
    with client.create(layers=[base_layer]) as sb:
        before = {l.digest for l in client.layers.list()}
        for n in (0, -1):
            with pytest.raises(warren.InvalidArgument, match="fork"):
                sb.fork(n)
        assert {l.digest for l in client.layers.list()} == before


def test_fork_makes_independent_copies(client, base_layer):
    with client.create(layers=[base_layer]) as sb:
        sh(sb, "mkdir -p /w && echo parent > /w/state")
        kids = sb.fork(8)
    try:
        assert len(kids) == 8 and len({k.id for k in kids}) == 8
        for i, k in enumerate(kids):
            sh(k, f"echo kid{i} >> /w/state")
        for i, k in enumerate(kids):
            assert sh(k, "cat /w/state") == f"parent\nkid{i}\n"
    finally:
        for k in kids:
            k.destroy()


# ---------------------------------------------------------------- grading

@pytest.fixture(scope="module")
def task_layer(client, tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("task")
    (d / "task/tests").mkdir(parents=True)
    (d / "task/tests/check.sh").write_text('test "$(cat /task/solution.txt)" = 42\n')
    (d / "task/grade.sh").write_text("#!/bin/bash\nset -e\nbash /task/tests/check.sh\necho PASS\n")
    (d / "task/solution.txt").write_text("0\n")
    name = f"workspace/grade-task@{uuid.uuid4().hex[:8]}"
    client.layers.build(name, dir=str(d / "."), timeout=300)
    return name


GRADER = "bash /task/grade.sh"
SOLUTION = ["/task/solution.txt"]
PROTECTED = ["/task/tests", "/task/grade.sh", "/task/conftest.py", "/usr/bin/bash"]  # deprecated, still accepted


def test_grade_honest_agent(client, base_layer, task_layer):
    with client.create(layers=[base_layer, task_layer]) as sb:
        sb.files.write("/task/solution.txt", b"42\n")
        g = sb.grade(GRADER, solution=SOLUTION, timeout=60)
        assert g.passed and g.result.stdout == b"PASS\n", g
        assert g.touched == []
        assert _gone(client, g.grade_sandbox_id)
        # the agent sandbox is untouched and running
        assert sh(sb, "cat /task/solution.txt") == "42\n"


@pytest.mark.parametrize("hack", [
    "printf 'exit 0\\n' > /task/tests/check.sh",
    "rm -rf /task/tests && mkdir /task/tests && printf 'exit 0\\n' > /task/tests/check.sh",
    "rm -rf /task && mkdir -p /task/tests && printf 'exit 0\\n' > /task/tests/check.sh "
    "&& printf 'echo PASS\\n' > /task/grade.sh",
    "printf '#!/bin/sh\\necho PASS\\nexit 0\\n' > /usr/bin/bash",
    "printf 'import pytest\\n' > /task/conftest.py",
    "printf '#!/bin/bash\\necho PASS\\n' > /task/grade.sh",
])
def test_grade_is_not_fooled_by_tampering(client, base_layer, task_layer, hack):
    with client.create(layers=[base_layer, task_layer]) as sb:
        sb.files.write("/task/solution.txt", b"41\n")  # wrong answer
        r = sb.exec(hack, timeout=30)
        assert r.exit_code == 0, r
        g = sb.grade(GRADER, solution=SOLUTION, timeout=60)
        assert not g.passed and b"PASS" not in g.result.stdout, g
        assert g.touched, "tampering not reported"
        # the same tampered sandbox passes once the answer is right: the
        # agent's changes enter under the solution path only
        sb.files.write("/task/solution.txt", b"42\n")
        g2 = sb.grade(GRADER, solution=SOLUTION, protected=PROTECTED, timeout=60)
        assert g2.passed and g2.result.stdout == b"PASS\n", g2


# ---------------------------------------------------------------- audit / idempotency

def test_audit_log_records_execs_and_file_ops(client, base_layer):
    with client.create(layers=[base_layer]) as sb:
        sb.exec("echo hello; echo err >&2; exit 3")
        sb.files.write("/w/f", b"12345", make_parents=True)
        sb.files.read("/w/f")
        sb.files.remove("/w/f")
        log = sb.audit_log()
        ops = [e["op"] for e in log]
        assert ops == ["exec", "write", "read", "remove"], log
        e = log[0]
        assert e["shell"] == "echo hello; echo err >&2; exit 3"
        assert e["exit_code"] == 3 and e["stdout_bytes"] == 6 and e["stderr_bytes"] == 4
        assert e["end_ns"] >= e["start_ns"] > 0
        assert log[1]["bytes"] == 5 and log[2]["bytes"] == 5 and log[1]["path"] == "/w/f"
        # the agent cannot see the log: nothing under / inside mentions it
        r = sb.exec("grep -rl 'echo hello; echo err' / --exclude-dir=proc --exclude-dir=sys 2>/dev/null | head -1",
                    timeout=120)
        assert r.stdout == b""


def test_replayed_request_id_runs_once(client, base_layer):
    with client.create(layers=[base_layer]) as sb:
        r1 = sb.exec("echo x >> /count; wc -l < /count", request_id="step-1")
        r2 = sb.exec("echo x >> /count; wc -l < /count", request_id="step-1")
        assert r1.stdout == r2.stdout == b"1\n"
        assert sh(sb, "wc -l < /count") == "1\n"
        # concurrent duplicates: one runs, the other waits for its result
        results: List[warren.ExecResult] = []
        ts = [threading.Thread(target=lambda: results.append(
            sb.exec("sleep 1; echo y >> /c2; wc -l < /c2", request_id="step-2"))) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert len(results) == 4 and all(r.stdout == b"1\n" for r in results)
        assert sh(sb, "wc -l < /c2") == "1\n"
        # a new id runs again
        assert sb.exec("echo x >> /count; wc -l < /count", request_id="step-3").stdout == b"2\n"
        # writes: the replay does not overwrite
        sb.files.write("/w/out", b"first", make_parents=True, request_id="w-1")
        sb.files.write("/w/out", b"second", make_parents=True, request_id="w-1")
        assert sb.files.read("/w/out") == b"first"
        replayed = [e for e in sb.audit_log() if e.get("request_id") == "step-1"]
        assert [e["replayed"] for e in replayed] == [False, True]


# ---------------------------------------------------------------- jobs and leases

def test_job_lease_lapse_suspends_then_destroys_after_grace(client, base_layer):
    name = f"job-{uuid.uuid4().hex[:8]}"
    job = client.job(name)
    sbs = [client.create(layers=[base_layer], job=name) for _ in range(3)]
    try:
        for s in sbs:
            sh(s, "echo alive > /state")
        info = job.heartbeat(lease_s=2, grace_s=4)
        assert info.lease_s == 2 and info.sandboxes == 3 and not info.lapsed
        # renewed in time: nothing happens
        for _ in range(3):
            time.sleep(1)
            job.heartbeat()
        assert all(s.info().state == "running" for s in sbs)
        # lapse: suspended (paused, memory reclaimed), files kept
        assert wait_until(lambda: all(s.info().state == "suspended" for s in sbs), timeout=6)
        assert job.info().lapsed
        # then destroyed after the grace period
        assert wait_until(lambda: all(_gone(client, s.id) for s in sbs), timeout=10)
        assert job.list() == []
    finally:
        for s in sbs:
            try:
                s.destroy()
            except warren.NotFound:
                pass


def test_job_heartbeat_within_grace_resumes_and_job_ops(client, base_layer):
    name = f"job-{uuid.uuid4().hex[:8]}"
    job = client.job(name)
    sbs = [client.create(layers=[base_layer], job=name) for _ in range(2)]
    other = client.create(layers=[base_layer])
    try:
        sh(sbs[0], "nohup sh -c 'while true; do date +%s%N >> /tick; sleep 0.05; done' >/dev/null 2>&1 &")
        job.heartbeat(lease_s=1, grace_s=60)
        assert wait_until(lambda: all(s.info().state == "suspended" for s in sbs), timeout=6)
        assert other.info().state == "running"
        job.heartbeat()
        assert all(s.info().state == "running" for s in sbs)
        n = len(sbs[0].files.read("/tick").splitlines())
        assert wait_until(lambda: len(sbs[0].files.read("/tick").splitlines()) > n + 5, timeout=10)
        job.heartbeat(lease_s=3600)
        assert job.suspend() == 2
        assert {s.info().state for s in job.list()} == {"suspended"}
        assert job.resume() == 2
        assert {s.info().state for s in job.list()} == {"running"}
        assert job.destroy() == 2
        assert all(_gone(client, s.id) for s in sbs)
        assert other.info().state == "running"
    finally:
        other.destroy()
        for s in sbs:
            try:
                s.destroy()
            except warren.NotFound:
                pass


def test_exec_timeout_does_not_count_paused_time(client, base_layer):
    with client.create(layers=[base_layer]) as sb:
        res: List[warren.ExecResult] = []
        t = threading.Thread(target=lambda: res.append(sb.exec("sleep 2; echo done", timeout=3)))
        t0 = time.monotonic()
        t.start()
        time.sleep(0.5)
        sb.pause()
        time.sleep(4)  # longer than the timeout: must not fire
        sb.resume()
        t.join(30)
        assert res and not res[0].timed_out and res[0].stdout == b"done\n", res
        # wall time beyond the 3 s timeout, yet no timeout (sleep's own clock
        # runs on while frozen, so it ends right after the resume)
        assert time.monotonic() - t0 >= 4.5
        # and a real timeout still fires
        r = sb.exec("sleep 10", timeout=1)
        assert r.timed_out


def test_cli_audit_pause_resume(daemon, client, base_layer):
    import json
    from conftest import CLI
    if not CLI.exists():
        pytest.fail(f"warren CLI not found at {CLI} (set WARREN_CLI)")
    addr = "unix:" + str(daemon.socket)
    with client.create(layers=[base_layer]) as sb:
        sb.exec("echo cli-audit")
        r = subprocess.run([str(CLI), "--addr", addr, "pause", sb.id], capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert sb.info().state == "paused"
        r = subprocess.run([str(CLI), "--addr", addr, "resume", sb.id], capture_output=True, timeout=60)
        assert r.returncode == 0 and sb.info().state == "running", r.stderr
        r = subprocess.run([str(CLI), "--addr", addr, "--json", "audit", sb.id], capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        log = json.loads(r.stdout)
        assert log[0]["op"] == "exec" and log[0]["shell"] == "echo cli-audit" and log[0]["stdout_bytes"] == 10
    r = subprocess.run([str(CLI), "--addr", addr, "audit", sb.id], capture_output=True, timeout=60)
    assert r.returncode == 1 and b"NOT_FOUND" in r.stderr


@pytest.mark.single_node("kill -9s and restarts a warrend of its own: no cluster node is involved")
@pytest.mark.timeout(300)
def test_paused_state_and_ttl_survive_a_daemon_restart(test_root, layer_store, base_layer, daemon):
    from conftest import NODE_PREFIX, Daemon
    d = Daemon(test_root, "lc-restart", layer_store, NODE_PREFIX + "l")
    d.start()
    try:
        c = d.client
        p = c.create(layers=[base_layer])
        p.exec("nohup sh -c 'while true; do echo x >> /log; sleep 0.05; done' >/dev/null 2>&1 &")
        assert wait_until(lambda: p.files.exists("/log"), timeout=10)
        p.pause()
        t = c.create(layers=[base_layer], ttl_s=6)
        deadline = t.cached_info.expires_at_ns
        d.kill9()
        d.start()
        c = d.client
        assert c.get(p.id).cached_info.state == "paused"
        assert c.get(t.id).cached_info.expires_at_ns == deadline
        p2 = c.get(p.id)
        n = len(p2.files.read("/log").splitlines())  # resumes it
        assert p2.info().state == "running"
        assert wait_until(lambda: len(p2.files.read("/log").splitlines()) > n + 5, timeout=10)
        # the upper is reached again through warren-init's fd: snapshots work
        snap = p2.snapshot()
        with c.create(layers=snap.layers) as twin:
            assert twin.files.read("/log").startswith(b"x\n")
        assert wait_until(lambda: _gone(c, t.id), timeout=15), "TTL not enforced after restart"
    finally:
        d.stop()


def test_async_sdk_lifecycle(daemon, base_layer):
    import asyncio

    async def main():
        async with warren.AsyncClient("unix:" + str(daemon.socket)) as ac:
            async with await ac.create(layers=[base_layer]) as sb:
                await sb.exec("echo a > /f", request_id="x")
                await sb.exec("echo a >> /f", request_id="x")
                assert (await sb.pause()).state == "paused"
                assert (await sb.resume()).state == "running"
                kids = await sb.fork(2)
                try:
                    for k in kids:
                        assert (await k.exec("cat /f")).stdout == b"a\n"
                finally:
                    for k in kids:
                        await k.destroy()
                assert [e["op"] for e in await sb.audit_log()] == ["exec", "exec"]
    asyncio.run(main())
