"""Create path under load (issue 3 "fast"): the admission queue (creates
beyond --max-creates-in-flight wait instead of being refused) and the warm
pool of sandbox shells (--warm-shells): shells are pre-spawned children of
the daemon, handed out by creates, killed at exit, dead with a killed daemon,
and leave no cgroup behind across a restart."""
import os
import threading
import time
from typing import List, Set

import pytest

import warren
from conftest import NODE_PREFIX, Daemon, assert_back_to_baseline, cgroup_dirs, host_snapshot, proc_table


def warm_shells(pid: int) -> Set[int]:
    """Children of pid still named warren-shell (not zombies)."""
    return {p for p, (ppid, comm, state) in proc_table().items()
            if comm == "warren-shell" and ppid == pid and state != "Z"}


def shell_cgroups(pid: int) -> List[str]:
    out = []
    for key, d in cgroup_dirs().items():
        for dirpath, dirnames, _ in os.walk(d):
            out += [f"{key}:{dirpath}/{n}" for n in dirnames if n.startswith(f"shell-{pid}-")]
    return out


def wait_for(pred, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


@pytest.mark.timeout(600)
def test_creates_beyond_the_in_flight_limit_queue_instead_of_failing(test_root, layer_store, base_layer, daemon):
    d = Daemon(test_root, "queue", layer_store, NODE_PREFIX + "q",
               extra_args=["--max-creates-in-flight", "2", "--max-create-queue", "64"])
    base = host_snapshot([daemon, d])
    d.start()
    try:
        c = d.client
        n = 24
        start = threading.Barrier(n)
        results: List[object] = [None] * n

        def one(i: int) -> None:
            start.wait(timeout=60)
            try:
                sb = c.create(layers=[base_layer], timeout=300)
                results[i] = sb.exec("echo $((6*7))", timeout=60).stdout
                sb.destroy(timeout=60)
            except warren.WarrenError as e:
                results[i] = e

        ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=300)
        assert results == [b"42\n"] * n, [r for r in results if r != b"42\n"][:5]
        assert_back_to_baseline([daemon, d], base, timeout=60, clients=[c])
    finally:
        d.stop()


@pytest.mark.timeout(600)
def test_a_full_create_queue_refuses_with_the_documented_message(test_root, layer_store, base_layer, daemon):
    d = Daemon(test_root, "qfull", layer_store, NODE_PREFIX + "f",
               extra_args=["--max-creates-in-flight", "1", "--max-create-queue", "1"])
    base = host_snapshot([daemon, d])
    d.start()
    try:
        c = d.client
        n = 32
        start = threading.Barrier(n)
        ok: List[str] = []
        refused: List[warren.WarrenError] = []
        lock = threading.Lock()

        def one() -> None:
            start.wait(timeout=60)
            try:
                sb = c.create(layers=[base_layer], timeout=300)
                with lock:
                    ok.append(sb.id)
            except warren.WarrenError as e:
                with lock:
                    refused.append(e)

        ts = [threading.Thread(target=one) for _ in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=300)
        assert len(ok) + len(refused) == n
        assert ok, "no create got through"
        # 32 creates at once against 1 in flight + 1 queued: most are refused,
        # each with RESOURCE_EXHAUSTED naming the limits.
        assert refused, "a queue of 1 absorbed 31 simultaneous creates"
        for e in refused:
            assert isinstance(e, warren.ResourceExhausted), repr(e)
            assert "create queue is full" in e.details and "--max-create-queue=1" in e.details, e.details
        for sid in ok:
            c.destroy(sid)
        assert_back_to_baseline([daemon, d], base, timeout=60, clients=[c])
    finally:
        d.stop()


@pytest.mark.timeout(600)
def test_warm_shells_are_bounded_die_with_the_daemon_and_leave_nothing(test_root, layer_store, base_layer, daemon):
    d = Daemon(test_root, "warm", layer_store, NODE_PREFIX + "w", extra_args=["--warm-shells", "3"])
    base = host_snapshot([daemon, d])
    d.start()
    try:
        c = d.client
        # The pool starts with the first create, then holds exactly 3 shells.
        assert not warm_shells(d.pid)
        with c.create(layers=[base_layer]) as sb:
            assert sb.exec("hostname", timeout=30).stdout == sb.id.encode() + b"\n"
        assert wait_for(lambda: len(warm_shells(d.pid)) == 3), warm_shells(d.pid)
        assert len(shell_cgroups(d.pid)) >= 3
        shells = warm_shells(d.pid)
        # A create takes one of them: the sandbox's init is a former shell.
        sb = c.create(layers=[base_layer], hostname="h1")
        assert sb.cached_info.init_pid in shells
        assert sb.exec("hostname; cat /proc/1/comm", timeout=30).stdout == b"h1\nwarren-init\n"
        sb.destroy()
        assert wait_for(lambda: len(warm_shells(d.pid)) == 3)
        # kill -9 of the daemon: its shells die with it (their cgroups stay
        # until the next start sweeps them).
        old_pid, old_shells = d.pid, warm_shells(d.pid)
        d.kill9()
        assert wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in old_shells)), old_shells
        d.start()
        assert shell_cgroups(old_pid) == []
        with d.client.create(layers=[base_layer]) as sb2:
            assert sb2.exec("true", timeout=30).exit_code == 0
        assert wait_for(lambda: len(warm_shells(d.pid)) == 3)
        # SIGTERM: shells killed and their cgroups removed before exit.
        pid = d.pid
        assert d.stop() == 0
        assert wait_for(lambda: not warm_shells(pid), 10)
        assert shell_cgroups(pid) == []
        assert_back_to_baseline([daemon, d], base, timeout=60)
    finally:
        if d.proc and d.proc.poll() is None:
            d.stop()
