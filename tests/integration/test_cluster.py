"""A cluster on this machine: a real etcd (Debian's etcd-server) on loopback
ports of its own, and several warrend nodes (each with its own state dir,
socket, TCP port, run dir and node id; sandbox cgroups are named by the
node-prefixed sandbox ids) that register in it and route to each other.

What is shown: membership (records with capacity under a lease; withdrawn on
SIGTERM, expired after kill -9), creates through one entry spread over the
nodes, exec/files/streams/list through a node that does not own the sandbox,
a node refusing a create (full) moving placement on, and the bad inputs
(etcd down at start, a sandbox id naming an unknown node).
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import subprocess
import time
import uuid
from pathlib import Path
from typing import Iterable, List

import grpc
import pytest

import warren
from warren._proto import warren_pb2, warren_pb2_grpc

from cluster_env import ETCD, ETCDCTL, Etcd, free_port, wait_until  # noqa: F401 (test_cluster_* import them from here)
from conftest import CLI, NODE_PREFIX, Daemon

LEASE_S = 3
REFRESH_MS = 500

pytestmark = pytest.mark.skipif(not os.path.exists(ETCD), reason="etcd-server is not installed (scripts/setup.sh)")


class Node(Daemon):
    """A warrend in the cluster: TCP on its own port (the nodes call each
    other there, with the shared token), registered in etcd."""

    def __init__(self, root: Path, name: str, layer_store: Path, etcd: Etcd, token_file: Path,
                 extra: Iterable[str] = (), lease_s: int = LEASE_S, refresh_ms: int = REFRESH_MS) -> None:
        self.port = free_port()
        super().__init__(root, name, layer_store, NODE_PREFIX + name, extra_args=[
            "--listen", f"127.0.0.1:{self.port}", "--token-file", str(token_file),
            "--cluster", f"etcd={etcd.url}", "--cluster-lease-s", str(lease_s),
            "--cluster-refresh-ms", str(refresh_ms), "--warm-shells", "0", "--limit-views", "off", *extra])


def owner(sandbox_id: str) -> str:
    return sandbox_id.rsplit("-", 1)[0]


@pytest.fixture(scope="module")
def etcd(test_root: Path) -> Iterable[Etcd]:
    e = Etcd(test_root).start()
    yield e
    e.stop()


@pytest.fixture(scope="module")
def token_file(test_root: Path) -> Path:
    p = test_root / "cluster.token"
    p.write_text("cluster-test-token\n")
    p.chmod(0o600)
    return p


@pytest.fixture(scope="module")
def nodes(test_root, layer_store, base_layer, etcd, token_file) -> Iterable[List[Node]]:
    ns = [Node(test_root, f"c{i}", layer_store, etcd, token_file) for i in range(3)]
    try:
        for n in ns:
            n.start()
        wait_until(lambda: len(set(etcd.nodes()) & {n.node_id for n in ns}) == 3, 10, "3 registered nodes")
        # Every node sees all three before the tests place anything.
        time.sleep(2 * REFRESH_MS / 1000)
        yield ns
    finally:
        for n in ns:
            n.stop()


def test_nodes_register_with_their_capacity(nodes: List[Node], etcd: Etcd) -> None:
    recs = etcd.nodes()
    for n in nodes:
        r = recs[n.node_id]
        assert r["address"] == f"127.0.0.1:{n.port}"
        assert "container" in r["backends"] and "fncall" in r["backends"]
        assert r["cpus"] >= 1 and r["memory_mb"] > 0 and r["max_sandboxes"] == 16384
        assert r["free_slots"] == r["max_sandboxes"] - r["sandboxes"]
        assert "base/debian-12@1" in r["layers"]
        assert r["drain"] is False
    # The lease is what keeps a record: etcd has one per node.
    leases = etcd.ctl("lease", "list").stdout
    assert leases.count("\n") >= 1 + len(nodes), leases


def test_creates_through_one_entry_spread_and_route(nodes: List[Node], base_layer: str) -> None:
    entry = nodes[0].client
    sbs = [entry.create(layers=[base_layer], labels={"cluster": "spread"}, timeout=120) for _ in range(6)]
    try:
        owners = [owner(sb.id) for sb in sbs]
        per_node = {n.node_id: owners.count(n.node_id) for n in nodes}
        assert sum(per_node.values()) == 6, owners
        assert sum(1 for v in per_node.values() if v > 0) >= 2, per_node
        assert max(per_node.values()) <= 4, per_node

        # Every later call through the entry reaches the owner.
        for i, sb in enumerate(sbs):
            r = sb.exec(f"echo {i} $(hostname)", timeout=60)
            assert r.exit_code == 0 and r.stdout.split()[0] == str(i).encode(), r
            sb.files.write("/tmp/hello", f"from {sb.id}".encode())
            assert sb.files.read("/tmp/hello") == f"from {sb.id}".encode()
        remote = next(sb for sb in sbs if owner(sb.id) != nodes[0].node_id)
        # The owner has the file; a non-owner's own table does not have the sandbox.
        own = next(n for n in nodes if n.node_id == owner(remote.id))
        assert own.client.get(remote.id).files.read("/tmp/hello") == f"from {remote.id}".encode()

        # Streams through a non-owner: output chunks, stdin, exit code.
        st = entry.get(remote.id).exec_stream("while read -r l; do echo got:$l; done; echo eof; exit 3",
                                              stdin=b"a\n")
        st.send_stdin(b"b\n")
        st.close_stdin()
        out = b"".join(c.data for c in st if c.stream == "stdout")
        assert out == b"got:a\ngot:b\neof\n"
        assert st.result.exit_code == 3
        # A process spawned through one non-owner, waited on through another.
        third = next(n for n in nodes if n.node_id != own.node_id)
        p = third.client.get(remote.id).spawn("echo spawned; exit 5")
        other = next(n for n in nodes if n.node_id not in (own.node_id, third.node_id))
        info = other.client.get(remote.id).process(p.id).wait(timeout=30)
        assert info.exit_code == 5, info

        # list fans out: every node answers with all six, whichever is asked.
        for n in nodes:
            listed = {s.id for s in n.client.list(labels={"cluster": "spread"})}
            assert listed == {sb.id for sb in sbs}, (n.node_id, listed)
    finally:
        for sb in sbs:
            sb.destroy(timeout=60)
    for n in nodes:
        assert n.client.list(labels={"cluster": "spread"}) == []


def test_a_job_spanning_nodes_acts_on_all_of_them(nodes: List[Node], base_layer: str) -> None:
    entry = nodes[0].client
    sbs = [entry.create(layers=[base_layer], job="span", timeout=120) for _ in range(4)]
    try:
        assert len({owner(sb.id) for sb in sbs}) >= 2, [sb.id for sb in sbs]
        job = entry.job("span")
        assert job.heartbeat(lease_s=60).sandboxes == 4
        assert job.info().sandboxes == 4
        assert sorted(sb.id for sb in job.list()) == sorted(sb.id for sb in sbs)
        assert job.suspend() == 4
        for sb in sbs:  # each owner suspended its own
            own = next(n for n in nodes if n.node_id == owner(sb.id))
            assert own.client.get(sb.id).info().state == "suspended"
        assert job.resume() == 4
        assert sbs[-1].exec("echo back", timeout=60).stdout == b"back\n"
        assert job.destroy() == 4
        for n in nodes:
            assert n.client.list(job="span") == []
    finally:
        for sb in sbs:
            try:
                sb.destroy(timeout=60)
            except warren.NotFound:
                pass


def test_create_request_ids_hold_across_the_cluster(nodes: List[Node], base_layer: str) -> None:
    entry = nodes[0].client
    # A retry with the same request id returns the same sandbox, wherever
    # the first try was placed.
    made = []
    try:
        for i in range(4):
            first = entry.create(layers=[base_layer], request_id=f"rid-{i}", timeout=120)
            made.append(first)
            again = entry.create(layers=[base_layer], request_id=f"rid-{i}", timeout=120)
            assert again.id == first.id, (first.id, again.id)
        assert len({owner(sb.id) for sb in made}) >= 2, [sb.id for sb in made]
        # Abandoning through the entry destroys it on whichever node made it.
        for i in range(4):
            entry.abandon_create(f"rid-{i}")
        for n in nodes:
            assert [s.id for s in n.client.list()] == [], n.node_id
    finally:
        for sb in made:
            try:
                sb.destroy(timeout=60)
            except warren.NotFound:
                pass


def test_unknown_node_in_id_is_not_found(nodes: List[Node]) -> None:
    with pytest.raises(warren.NotFound) as ei:
        nodes[0].client.get("nosuchnode-0123456789abcdef").exec("true", timeout=10)
    assert "nosuchnode" in ei.value.details and "not in the cluster" in ei.value.details, ei.value.details


def _ofd_lock(fd: int, kind: int) -> None:
    """fcntl(F_OFD_SETLK) over the whole file (struct flock: type, whence, start, len, pid)."""
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi", kind, os.SEEK_SET, 0, 0, 0))


def test_layer_blob_locks_guard_rm_against_a_create_on_another_node(nodes: List[Node], base_layer: str,
                                                                     tmp_path: Path) -> None:
    """The nodes share the layer store: a node mounting a layer for a create
    read-locks its blob (OFD lock) before the mount and holds it while the
    sandbox uses it; `layers rm` write-locks it without waiting before it
    removes anything. Here this process holds the locks as another node's
    create or remove would, in the window the in-use counts do not cover."""
    src = tmp_path / "guard"
    src.mkdir()
    (src / "hello").write_text("guarded\n")
    name = f"workspace/guard-{uuid.uuid4().hex[:8]}@1"
    layer = nodes[0].client.layers.build(name, dir=str(src), timeout=120)
    blob = nodes[0].layer_store / "blobs" / "sha256" / layer.digest.split(":", 1)[1]
    fd = os.open(blob, os.O_RDWR)
    try:
        # A create about to mount it elsewhere: the remove refuses, nothing removed.
        _ofd_lock(fd, fcntl.F_RDLCK)
        with pytest.raises(warren.FailedPrecondition) as ei:
            nodes[1].client.layers.remove(name)
        assert "is held" in ei.value.details and layer.digest in ei.value.details, ei.value.details
        assert nodes[2].client.layers.get(name).digest == layer.digest and blob.exists()
        # A remove in progress (its write lock): a create with the layer is
        # refused on every node, retryable, and leaves no sandbox.
        _ofd_lock(fd, fcntl.F_UNLCK)
        _ofd_lock(fd, fcntl.F_WRLCK)
        with pytest.raises(warren.WarrenError) as ce:
            nodes[0].client.create(layers=[base_layer, name], labels={"guard": "1"}, timeout=120)
        assert ce.value.retryable and "being removed" in ce.value.details, ce.value.details
        assert nodes[0].client.list(labels={"guard": "1"}) == []
    finally:
        os.close(fd)
    # Unlocked: a sandbox uses it (and holds it) until destroyed, then it goes.
    # (The entry counts a node that refused as full until its next record.)
    time.sleep(2 * REFRESH_MS / 1000)
    with nodes[0].client.create(layers=[base_layer, name], labels={"guard": "1"}, timeout=120) as sb:
        assert sb.files.read("/hello") == b"guarded\n"
        holder = next(n for n in nodes if n.node_id == owner(sb.id))
        other = next(n for n in nodes if n is not holder)
        with pytest.raises(warren.FailedPrecondition):
            other.client.layers.remove(name)
    nodes[1].client.layers.remove(name)
    assert not blob.exists()
    with pytest.raises(warren.NotFound):
        nodes[2].client.layers.get(name)


def test_node_ls_and_drain_steer_placement(nodes: List[Node], etcd: Etcd, base_layer: str) -> None:
    entry, drained = nodes[0], nodes[1]
    listed = entry.client.nodes()
    assert [n.id for n in listed] == sorted(n.node_id for n in nodes)
    assert [n.id for n in listed if n.is_self] == [entry.node_id]
    assert all(n.address == f"127.0.0.1:{m.port}" and not n.drain for n, m in
               zip(listed, sorted(nodes, key=lambda m: m.node_id)))

    # Drained through another node (forwarded to it): published at once.
    got = entry.client.drain(drained.node_id)
    assert got.id == drained.node_id and got.drain and got.is_self is False
    assert etcd.nodes()[drained.node_id]["drain"] is True
    wait_until(lambda: all(next(x for x in n.client.nodes() if x.id == drained.node_id).drain for n in nodes),
               4 * REFRESH_MS / 1000 + 5, "every node to see the drain")
    out = subprocess.run([str(CLI), "--addr", "unix:" + str(entry.socket), "node", "ls"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith(drained.node_id))
    assert "draining" in row.split(), out.stdout

    sbs = []
    try:
        # Placement skips it: nothing lands there (it would get ~1/3 otherwise).
        sbs = [entry.client.create(layers=[base_layer], labels={"cluster": "drain"}, timeout=120) for _ in range(6)]
        assert drained.node_id not in {owner(sb.id) for sb in sbs}, [sb.id for sb in sbs]
        # A draining node's running sandboxes stay served.
        assert all(sb.exec("true", timeout=60).exit_code == 0 for sb in sbs)

        # Undrained by the CLI on the node itself: it takes creates again, and
        # being the emptiest it wins every draw it is in (2 of 3 nodes drawn).
        out = subprocess.run([str(CLI), "--addr", "unix:" + str(drained.socket), "--json", "node", "undrain",
                              drained.node_id], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["drain"] is False and json.loads(out.stdout)["self"] is True
        wait_until(lambda: not next(x for x in entry.client.nodes() if x.id == drained.node_id).drain,
                   4 * REFRESH_MS / 1000 + 5, "the entry to see the undrain")
        more = [entry.client.create(layers=[base_layer], labels={"cluster": "drain"}, timeout=120) for _ in range(8)]
        sbs += more
        assert drained.node_id in {owner(sb.id) for sb in more}, [sb.id for sb in more]
    finally:
        for sb in sbs:
            sb.destroy(timeout=60)

    with pytest.raises(warren.NotFound) as ei:
        entry.client.drain("nosuchnode")
    assert "nosuchnode" in ei.value.details and "not in the cluster" in ei.value.details, ei.value.details


def test_node_calls_outside_a_cluster_say_so(daemon) -> None:
    for call in (lambda: daemon.client.nodes(), lambda: daemon.client.drain("")):
        with pytest.raises(warren.FailedPrecondition) as ei:
            call()
        assert "not in a cluster" in ei.value.details and "--cluster" in ei.value.details, ei.value.details


def test_a_full_node_refuses_and_placement_moves_on(test_root, layer_store, base_layer, token_file) -> None:
    # A cluster of its own: three nodes of 2 sandboxes each. "full" writes
    # its record once (refresh 30 s) and is then filled behind the cluster's
    # back (a create marked as forwarded is served locally): its record still
    # says 2 free slots.
    etcd = Etcd(test_root, "etcd-refuse").start()
    full = Node(test_root, "rf", layer_store, etcd, token_file, extra=["--max-sandboxes", "2"], lease_s=60,
                refresh_ms=30000)
    a = Node(test_root, "ra", layer_store, etcd, token_file, extra=["--max-sandboxes", "2"])
    b = Node(test_root, "rb", layer_store, etcd, token_file, extra=["--max-sandboxes", "2"])
    ours = []
    try:
        for n in (full, a, b):
            n.start()
        wait_until(lambda: {full.node_id, a.node_id, b.node_id} <= set(etcd.nodes()), 10, "registration")
        with grpc.insecure_channel("unix:" + str(full.socket)) as ch:
            stub = warren_pb2_grpc.SandboxesStub(ch)
            for _ in range(2):
                req = warren_pb2.CreateSandboxRequest(backend="container", layers=[base_layer])
                stub.Create(req, metadata=[("x-warren-forwarded", "test")], timeout=120)
        assert len(full.client.list()) == 2
        assert etcd.nodes()[full.node_id]["free_slots"] == 2  # stale, as intended
        time.sleep(2 * REFRESH_MS / 1000)
        # 4 creates for the 4 real free slots (a's and b's): every one
        # succeeds, none on the full node, though its record kept offering 2.
        for _ in range(4):
            ours.append(a.client.create(layers=[base_layer], labels={"cluster": "refuse"}, timeout=120))
        landed = sorted(owner(sb.id) for sb in ours)
        assert landed == sorted([a.node_id] * 2 + [b.node_id] * 2), landed
        # Placement chose the full node (once a and b filled up, it was the
        # only one left with free slots on record), was refused, moved on.
        log = a.log_path.read_text(errors="replace")
        refusals = [ln for ln in log.splitlines() if "node refused the create" in ln]
        assert any(full.node_id in ln for ln in refusals), log[-3000:]
        # The cluster is full now: a typed, retryable refusal saying why
        # (from the records, or from the nodes refusing when a record lags).
        with pytest.raises(warren.ResourceExhausted) as ei:
            a.client.create(layers=[base_layer], timeout=60)
        d = ei.value.details
        assert "no free sandbox slot" in d or "node full" in d, d
    finally:
        for sb in ours:
            sb.destroy(timeout=60)
        for n in (full, a, b):
            n.stop()
        etcd.stop()


def test_clean_shutdown_withdraws_and_kill9_expires(test_root, layer_store, base_layer, etcd, token_file) -> None:
    leaving = Node(test_root, "lv", layer_store, etcd, token_file).start()
    dying = Node(test_root, "dy", layer_store, etcd, token_file).start()
    try:
        wait_until(lambda: {leaving.node_id, dying.node_id} <= set(etcd.nodes()), 10, "registration")
        assert leaving.stop(destroy=False) == 0
        # Withdrawn by the daemon itself (its lease revoked), not by expiry.
        assert leaving.node_id not in etcd.nodes()
        dying.kill9()
        t0 = time.monotonic()
        assert dying.node_id in etcd.nodes()  # nobody withdrew it
        wait_until(lambda: dying.node_id not in etcd.nodes(), LEASE_S + 5, "the dead node's lease to expire")
        assert time.monotonic() - t0 <= LEASE_S + 5
        # Back on its state dir it registers again (and stops cleanly, taking
        # what the killed daemon left in /run with it).
        dying.start()
        wait_until(lambda: dying.node_id in etcd.nodes(), 10, "re-registration")
    finally:
        leaving.stop(destroy=False)
        dying.stop(destroy=False)


def test_etcd_down_at_start_is_a_clear_error(test_root, layer_store, token_file) -> None:
    port = free_port()  # nothing listens there
    d = Daemon(test_root, "noetcd", layer_store, NODE_PREFIX + "ne", extra_args=[
        "--listen", f"127.0.0.1:{free_port()}", "--token-file", str(token_file),
        "--cluster", f"etcd=http://127.0.0.1:{port}", "--warm-shells", "0"])
    from conftest import WARREND
    t0 = time.monotonic()
    r = subprocess.run([str(WARREND), "--state-dir", str(d.state_dir), "--socket", str(d.socket), "--layer-store",
                        str(layer_store), "--node-id", d.node_id, *d.extra_args],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode != 0
    assert time.monotonic() - t0 < 30
    err = r.stdout + r.stderr
    assert "etcd unreachable at" in err and f"127.0.0.1:{port}" in err, err[-2000:]
    bad = subprocess.run([str(WARREND), "--state-dir", str(d.state_dir), "--socket", str(d.socket), "--layer-store",
                          str(layer_store), "--node-id", d.node_id, "--listen", f"127.0.0.1:{free_port()}",
                          "--token-file", str(token_file), "--cluster", "zookeeper=x"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode != 0 and "etcd=URL" in bad.stdout + bad.stderr, bad.stdout + bad.stderr
