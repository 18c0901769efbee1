"""Reliability under faults (one test per finding of the fault soak,
tests/soak): the freezer state a killed daemon leaves is reconciled at
restart and destroy always succeeds; a create the client gave up on leaves
nothing; every child of warrend is reaped; the SDK reports a closed client as
a WarrenError and leaks no thread. Each test runs its own daemon where it
kills one (sharing the session's layer store)."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path
from typing import Dict, List

import pytest

import warren
from conftest import (NODE_PREFIX, Daemon, assert_back_to_baseline, cgroup_dirs, host_snapshot,
                      proc_table)


def wait_until(pred, timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def freezer_dir(init_pid: int) -> Path:
    """The sandbox's cgroup in the freezer hierarchy (v1) or the unified one
    (v2; the init sits in the leaf "init" there: its parent is the sandbox's)."""
    d = cgroup_dirs(init_pid)
    if "freezer" in d:
        return d["freezer"]
    u = d["unified"]
    return u.parent if u.name == "init" else u


def freeze(cg: Path, on: bool) -> None:
    if (cg / "freezer.state").exists():
        (cg / "freezer.state").write_text("FROZEN" if on else "THAWED")
    else:
        (cg / "cgroup.freeze").write_text("1" if on else "0")


def frozen_by_itself(cg: Path) -> bool:
    if (cg / "freezer.self_freezing").exists():
        return (cg / "freezer.self_freezing").read_text().strip() == "1"
    return (cg / "cgroup.freeze").read_text().strip() == "1"


def exec_cgroups_with_tasks(sb_cg: Path) -> List[Path]:
    return [p for p in sb_cg.iterdir() if p.is_dir() and p.name.startswith("exec-")
            and (p / "cgroup.procs").read_text().strip()]


@pytest.fixture()
def own_daemon(test_root, layer_store, base_layer, daemon, request):
    """A private daemon (node id per test) that the test may kill -9."""
    tag = "".join(c for c in request.node.name if c.isalnum())[-10:].lower()
    d = Daemon(test_root, f"faults-{tag}", layer_store, NODE_PREFIX + "f" + tag[-4:])
    base = host_snapshot([daemon, d])
    d.start()
    yield d
    try:
        if d.proc is None or d.proc.poll() is not None:
            d.start()
        d.destroy_all()
        assert_back_to_baseline([daemon, d], base, timeout=60, clients=[d.client])
    finally:
        d.stop()


# ---------------------------------------------------------------- freezer reconciled at restart


@pytest.mark.timeout(300)
def test_exec_cgroup_left_frozen_by_a_killed_daemon_is_thawed_and_destroyable(own_daemon, base_layer):
    """A daemon killed in the middle of an exec's kill (SignalAll freezes the
    exec cgroup on its own) left it frozen: after the restart its processes
    run again and the sandbox is destroyed (was: every destroy failed, "still
    has processes after SIGKILL", for ever)."""
    d = own_daemon
    sb = d.client.create(layers=[base_layer])
    assert sb.exec("sleep 1000 >/dev/null 2>&1 &", timeout=30).exit_code == 0
    cg = freezer_dir(sb.cached_info.init_pid)
    execs = exec_cgroups_with_tasks(cg)
    assert len(execs) == 1, list(cg.iterdir())
    freeze(execs[0], True)
    d.kill9()
    d.start()
    sb = d.client.get(sb.id)
    assert sb.cached_info.state == "running"
    assert not frozen_by_itself(execs[0]), "the exec cgroup is still frozen after the restart"
    r = sb.exec("pgrep -c sleep", timeout=30)
    assert r.stdout == b"1\n", r
    t0 = time.monotonic()
    sb.destroy(timeout=60)
    assert time.monotonic() - t0 < 10
    with pytest.raises(warren.NotFound):
        d.client.get(sb.id)


@pytest.mark.timeout(300)
def test_destroy_succeeds_with_an_exec_cgroup_frozen_on_its_own(own_daemon, base_layer):
    """Destroy always succeeds: it thaws every sub-cgroup before it kills."""
    d = own_daemon
    sb = d.client.create(layers=[base_layer])
    assert sb.exec("sleep 1000 >/dev/null 2>&1 &", timeout=30).exit_code == 0
    execs = exec_cgroups_with_tasks(freezer_dir(sb.cached_info.init_pid))
    assert len(execs) == 1
    freeze(execs[0], True)
    sb.pause()
    sb.destroy(timeout=60)
    with pytest.raises(warren.NotFound):
        d.client.get(sb.id)


@pytest.mark.timeout(300)
def test_sandbox_frozen_in_the_middle_of_a_suspend_comes_back_running(own_daemon, base_layer):
    """Killed between the freeze and the record write of a pause/suspend: the
    record says running, so the sandbox is thawed at restart and execs
    answer (they hung until their deadline)."""
    d = own_daemon
    sb = d.client.create(layers=[base_layer])
    cg = freezer_dir(sb.cached_info.init_pid)
    freeze(cg, True)
    d.kill9()
    d.start()
    sb = d.client.get(sb.id)
    assert sb.cached_info.state == "running"
    t0 = time.monotonic()
    assert sb.exec("echo ok", timeout=5).stdout == b"ok\n"
    assert time.monotonic() - t0 < 5


@pytest.mark.timeout(300)
def test_paused_sandbox_thawed_behind_the_record_comes_back_paused(own_daemon, base_layer):
    """Killed between the thaw and the record write of a resume: the record
    says paused (the client never got its resume answered): frozen again."""
    d = own_daemon
    sb = d.client.create(layers=[base_layer])
    sb.pause()
    cg = freezer_dir(sb.cached_info.init_pid)
    freeze(cg, False)
    d.kill9()
    d.start()
    sb = d.client.get(sb.id)
    assert sb.cached_info.state == "paused"
    assert frozen_by_itself(cg)
    assert sb.exec("echo ok", timeout=10).stdout == b"ok\n"  # resumes it
    assert sb.info().state == "running"
    assert not frozen_by_itself(cg)


# ---------------------------------------------------------------- creates given up


def test_create_request_id_replays_and_abandon_destroys(client, base_layer):
    rid = f"faults-{os.getpid()}-{time.monotonic_ns()}"
    a = client.create(layers=[base_layer], request_id=rid)
    b = client.create(layers=[base_layer], request_id=rid)
    assert a.id == b.id
    client.abandon_create(rid)
    with pytest.raises(warren.NotFound):
        client.get(a.id)
    with pytest.raises(warren.Cancelled):
        client.create(layers=[base_layer], request_id=rid)
    client.abandon_create(f"{rid}-never-made")  # nothing made: fine
    with pytest.raises(warren.Cancelled):
        client.create(layers=[base_layer], request_id=f"{rid}-never-made")


@pytest.mark.timeout(300)
def test_creates_whose_client_gave_up_leave_nothing(daemon, base_layer):
    """Creates with deadlines around the time a create takes: every sandbox
    left is one a create returned (was: some that timed out kept running)."""
    tag = f"gaveup-{os.getpid()}-{time.monotonic_ns()}"
    c = warren.Client("unix:" + str(daemon.socket))
    rng = random.Random(1234)
    made: List[str] = []
    gave_up = 0
    lock = threading.Lock()

    def one(t: float) -> None:
        nonlocal gave_up
        try:
            sb = c.create(layers=[base_layer], labels={"t": tag}, timeout=t)
            with lock:
                made.append(sb.id)
        except (warren.DeadlineExceeded, warren.Cancelled):
            with lock:
                gave_up += 1

    for batch in range(6):
        ts = [threading.Thread(target=one, args=(rng.uniform(0.005, 0.25),)) for _ in range(6)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
    c.close()  # waits for the background abandons
    try:
        assert gave_up > 0, "no create timed out: the deadlines are too long for this host"
        left = {s.id for s in daemon.client.list(labels={"t": tag})}
        assert left == set(made), f"orphans: {sorted(left - set(made))}"
    finally:
        for s in daemon.client.list(labels={"t": tag}):
            s.destroy()


# ---------------------------------------------------------------- zombies


def zombies_of(pid: int) -> List[str]:
    return [f"{p}:{comm}" for p, (ppid, comm, state) in proc_table().items() if ppid == pid and state == "Z"]


@pytest.mark.timeout(300)
def test_a_command_killed_while_its_sandbox_is_paused_is_reaped(daemon, client, base_layer):
    """The command of an exec stream abandoned while its sandbox is paused
    cannot die until the sandbox is thawed, long after the daemon's bounded
    wait for it: it is reaped then, not left a zombie of warrend."""
    before = set(zombies_of(daemon.pid))
    with client.create(layers=[base_layer]) as sb:
        st = sb.exec_stream("echo started; sleep 1000")
        it = iter(st)
        first = next(it)
        assert first.data == b"started\n"
        sb.pause()
        st.close()
        time.sleep(11)  # the daemon gives a frozen command 5 s + 2 s to die, after it noticed the close
        sb.resume()
        assert wait_until(lambda: not (set(zombies_of(daemon.pid)) - before), timeout=10), \
            zombies_of(daemon.pid)
    assert wait_until(lambda: not (set(zombies_of(daemon.pid)) - before), timeout=10), zombies_of(daemon.pid)


# ---------------------------------------------------------------- SDK


@pytest.mark.timeout(120)
def test_closing_the_client_during_a_session_command_raises_a_warren_error(daemon, base_layer):
    c = warren.Client("unix:" + str(daemon.socket))
    sb = c.create(layers=[base_layer])
    try:
        sess = sb.session()
        threading.Timer(1.0, c.close).start()
        with pytest.raises(warren.WarrenError):
            sess.run("sleep 20", timeout=60)
        with pytest.raises(warren.WarrenError):
            sess.run("true", timeout=5)
    finally:
        daemon.client.destroy(sb.id)


@pytest.mark.timeout(120)
def test_exec_stream_abandoned_by_closing_the_channel_leaks_no_thread(daemon, base_layer):
    c = warren.Client("unix:" + str(daemon.socket))
    sb = c.create(layers=[base_layer])
    try:
        before = threading.active_count()
        # Abandoned mid-iteration (the iterator kept, not finished) or never
        # iterated: nothing ends their request streams but the call's end.
        streams, iters = [], []
        for _ in range(3):
            streams.append(sb.exec_stream("echo started; sleep 30"))
            iters.append(iter(streams[-1]))
            assert next(iters[-1]).data == b"started\n"
        streams.append(sb.exec_stream("sleep 30"))
        assert wait_until(lambda: threading.active_count() >= before + 4, timeout=10)  # gRPC's request readers
        c.close()
        assert wait_until(lambda: threading.active_count() <= before, timeout=10), \
            [t.name for t in threading.enumerate()]
    finally:
        daemon.client.destroy(sb.id)


# ---------------------------------------------------------------- daemon memory


@pytest.mark.timeout(300)
def test_daemon_rss_stays_flat_under_big_outputs(daemon, client, base_layer):
    """Rounds of concurrent execs with 12 MiB outputs: the daemon's RSS stays
    within 64 MiB of where it was (was: +160 MiB after one round, +300 MiB
    after eight: freed output buffers kept by glibc's arenas, see BoundHeap
    in src/warrend/host_setup.h; bench/soak/heap.py)."""
    from conftest import rss_bytes
    sbs = [client.create(layers=[base_layer]) for _ in range(2)]
    try:
        def flood(i: int) -> None:
            assert sbs[i % 2].exec("head -c 12M /dev/zero", timeout=60).stdout_total_bytes == 12 << 20

        def round_() -> None:
            ts = [threading.Thread(target=flood, args=(i,)) for i in range(8)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()

        base = rss_bytes(daemon.pid)
        peak = base
        for _ in range(4):
            round_()
            time.sleep(1)
            peak = max(peak, rss_bytes(daemon.pid))
        assert wait_until(lambda: rss_bytes(daemon.pid) < base + (64 << 20), timeout=15), \
            f"RSS {base >> 20} MiB -> {rss_bytes(daemon.pid) >> 20} MiB (peak {peak >> 20} MiB)"
    finally:
        for sb in sbs:
            sb.destroy()
