"""Failures of a cluster: a three-member etcd with one member killed (no
visible effect), and a node killed with SIGKILL in the middle of a burst of
creates (every create succeeds elsewhere or fails with a typed retryable
error; the dead node's sandboxes answer "lost" once its lease expires).

The cluster is cluster_env.NetnsCluster's: 4 warrend nodes and 3 etcd
members, each in a network namespace of its own on the tests' bridge (the
nodes reach etcd and each other over those addresses), each node with its
own state dir and cgroup subtree.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Iterable, List, Tuple

import pytest

import warren
from cluster_env import ETCD, NetnsCluster
from conftest import NODE_PREFIX, Daemon, wait_until
from test_cluster import owner

pytestmark = pytest.mark.skipif(not os.path.exists(ETCD), reason="etcd-server is not installed (scripts/setup.sh)")


@pytest.fixture(scope="module")
def failing(test_root: Path, layer_store: Path, base_layer: str) -> Iterable[NetnsCluster]:
    c = NetnsCluster(test_root, layer_store, 4, NODE_PREFIX + "f", Daemon,
                     extra_args=["--warm-shells", "0", "--limit-views", "off"], etcd_members=3, name="fail").start()
    try:
        # Every node sees the others before anything is placed.
        time.sleep(2 * c.REFRESH_MS / 1000)
        yield c
    finally:
        rcs = c.stop()
    # The victim of the kill -9 test was restarted and stopped by it: every
    # node ends on SIGTERM with 0.
    assert rcs == [0] * len(rcs), rcs


def netns_of(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def test_one_etcd_member_killed_has_no_visible_effect(failing: NetnsCluster, base_layer: str) -> None:
    etcd, nodes = failing.etcd, failing.nodes
    assert etcd is not None and len(etcd.procs) == 3
    # Every member and every node in a network namespace of its own.
    spaces = [netns_of(p.pid) for p in etcd.procs] + [netns_of(n.pid) for n in nodes]
    assert len(set(spaces)) == 7 and netns_of(os.getpid()) not in spaces, spaces
    assert all(r["address"].split(":")[0] in failing.addrs for r in etcd.nodes().values())
    etcd.kill(0)  # the member every node talks to first
    # Longer than a lease: every node kept its record (refreshed through the
    # other members), and creates, routing and lists go on.
    time.sleep(failing.LEASE_S + 2)
    assert {n.node_id for n in nodes} <= set(etcd.nodes())
    entry = nodes[0].client
    sbs = [entry.create(layers=[base_layer], labels={"f": "member"}, timeout=120) for _ in range(4)]
    try:
        assert len({owner(sb.id) for sb in sbs}) >= 2
        assert all(sb.exec("true", timeout=60).exit_code == 0 for sb in sbs)
        assert {s.id for s in nodes[1].client.list(labels={"f": "member"})} == {sb.id for sb in sbs}
        assert all(not n.drain for n in entry.nodes()) and len(entry.nodes()) == 4
    finally:
        for sb in sbs:
            sb.destroy(timeout=60)


def test_kill9_mid_burst(failing: NetnsCluster, base_layer: str) -> None:
    nodes = failing.nodes
    entry, victim = nodes[0], nodes[3]
    results: List[Tuple[str, object]] = []
    lock = threading.Lock()
    started = threading.Event()

    def worker() -> None:
        c = warren.Client("unix:" + str(entry.socket))
        try:
            for _ in range(5):
                try:
                    sb = c.create(layers=[base_layer], labels={"f": "burst"}, timeout=120)
                    with lock:
                        results.append(("ok", sb.id))
                    if owner(sb.id) == victim.node_id:
                        started.set()  # the victim holds a sandbox: kill it now
                except warren.WarrenError as e:
                    with lock:
                        results.append(("err", e))
        finally:
            c.close()

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    assert started.wait(300), "no create landed on the victim"
    victim.kill9()  # mid-burst: the other threads are creating
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads)
    errs = [e for k, e in results if k == "err"]
    assert all(isinstance(e, warren.WarrenError) and e.retryable for e in errs), errs
    made = [i for k, i in results if k == "ok"]
    assert len(made) + len(errs) == 30 and len(made) >= 20, (len(made), errs)
    lost = [i for i in made if owner(i) == victim.node_id]
    alive = [i for i in made if owner(i) != victim.node_id]
    assert lost and alive, made
    assert any(k == "ok" for k, _ in results[results.index(("ok", lost[-1])) + 1:]), "the burst went on after the kill"
    # The victim leaves placement and its sandboxes answer "lost" (typed:
    # NotFound) once its lease expired; every other one works.
    wait_until(lambda: victim.node_id not in {n.id for n in entry.client.nodes()}, failing.LEASE_S + 5,
               "the victim to leave the view")
    for i in lost:
        with pytest.raises(warren.NotFound) as ei:
            entry.client.get(i)
        assert "lost" in ei.value.details, ei.value.details
    for i in alive:
        assert entry.client.get(i).exec("true", timeout=60).exit_code == 0
    for i in alive:
        entry.client.get(i).destroy(timeout=60)
    # Back on its state dir, the victim cleans up what it left (stopping it
    # destroys its sandboxes).
    victim.start()
    victim.stop()
