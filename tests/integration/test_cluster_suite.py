"""The cluster configuration of the SDK suite itself (WARREN_TEST_CLUSTER=N,
conftest.py's CLUSTER_SUITE; skipped in the single-node configuration): the
nodes run in network namespaces of their own, registered and talking to each
other on those namespaces' addresses, each with its own state dir and cgroup
subtree, and the session client's creates through the entry node land on
every node, each sandbox's cgroup in its node's subtree.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List

import warren

from conftest import _CLUSTER, cgroup_dirs


def owner(sandbox_id: str) -> str:
    return sandbox_id.rsplit("-", 1)[0]


def has_endpoint(ss_out: str, addr: str, port: int) -> bool:
    """ss prints an IPv4 endpoint of a dual-stack socket as [::ffff:A]:P."""
    return any(e in ss_out.split() for e in (f"{addr}:{port}", f"[::ffff:{addr}]:{port}"))


def test_nodes_live_in_their_own_namespaces_and_cgroups(cluster, client: warren.Client) -> None:
    nodes = cluster.nodes
    assert len(nodes) == cluster.n and nodes[0].client is client
    netns = [os.readlink(f"/proc/{n.pid}/ns/net") for n in nodes]
    assert len(set(netns)) == len(nodes) and os.readlink("/proc/self/ns/net") not in netns, netns
    # Same mount namespace as the tests (nsenter --net only): the cgroup file
    # systems and the shared layer store are the host's.
    assert {os.readlink(f"/proc/{n.pid}/ns/mnt") for n in nodes} == {os.readlink("/proc/self/ns/mnt")}
    records = cluster.etcd.nodes()
    listed = {x.id: x for x in client.nodes()}
    for i, n in enumerate(nodes):
        addr = cluster.addrs[i]
        assert n.address == f"{addr}:{cluster.PORT}"
        assert records[n.node_id]["address"] == n.address, records[n.node_id]
        assert listed[n.node_id].address == n.address
        shown = cluster.in_netns(i, "ip", "-4", "-o", "addr", "show", "dev", "eth0").stdout
        assert f" {addr}/24 " in shown, shown
        # Its TCP port is open in its namespace only.
        ss = cluster.in_netns(i, "ss", "-Htln").stdout
        assert has_endpoint(ss, addr, cluster.PORT), ss
        # Its own state dir, and every hierarchy's cgroup its own child of ours.
        assert n.state_dir.is_dir() and len({m.state_dir for m in nodes}) == len(nodes)
        mine = {Path(p) for p in cluster.node_cgroups[i]}
        assert set(cgroup_dirs(n.pid).values()) == mine, (cgroup_dirs(n.pid), mine)
    assert set(_CLUSTER) == set(nodes)


def test_creates_through_the_entry_land_on_every_node(cluster, client: warren.Client, base_layer: str) -> None:
    nodes = cluster.nodes
    sbs: List[warren.Sandbox] = []
    try:
        for _ in range(3 * len(nodes)):
            sbs.append(client.create(layers=[base_layer], labels={"suite": "spread"}, timeout=120))
        owners = {owner(sb.id) for sb in sbs}
        assert owners == {n.node_id for n in nodes}, [sb.id for sb in sbs]
        for sb in sbs:
            r = sb.exec("cat /proc/self/cgroup", timeout=60)
            assert r.exit_code == 0, r
            # The sandbox's cgroup lives in the subtree of the node that owns it.
            i = next(k for k, n in enumerate(nodes) if n.node_id == owner(sb.id))
            assert any((d / "warren" / sb.id).is_dir() for d in cluster.node_cgroups[i]), sb.id
        # Forwarded calls went node to node over the namespaces' addresses:
        # the entry holds connections to the others' addresses, from its own.
        peers = cluster.in_netns(0, "ss", "-Htn", "state", "established").stdout
        for i in range(1, len(nodes)):
            assert has_endpoint(peers, cluster.addrs[i], cluster.PORT), peers
        assert {s.id for s in client.list(labels={"suite": "spread"})} == {sb.id for sb in sbs}
    finally:
        for sb in sbs:
            sb.destroy(timeout=60)
    assert client.list(labels={"suite": "spread"}) == []
