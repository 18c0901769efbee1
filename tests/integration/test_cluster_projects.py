"""Projects and quotas of a cluster: a real etcd and 4 warrend nodes on this
machine (test_cluster.py's Etcd and Node). Projects nest (team/run-7/eval);
each has a token; a project token sees and touches only its own sandboxes
and jobs (and those of the projects below it); a quota holds cluster-wide
under concurrent creates through every node.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List

import grpc
import pytest

import warren
from conftest import CLI
from test_cluster import ETCD, REFRESH_MS, Etcd, Node, owner, wait_until
from warren._proto import process_pb2, process_pb2_grpc, warren_pb2, warren_pb2_grpc

pytestmark = pytest.mark.skipif(not os.path.exists(ETCD), reason="etcd-server is not installed (scripts/setup.sh)")


@pytest.fixture(scope="module")
def cluster(test_root: Path, layer_store, base_layer) -> Iterable[tuple]:
    token_file = test_root / "projects.token"
    token_file.write_text("projects-test-token\n")
    token_file.chmod(0o600)
    etcd = Etcd(test_root, "etcd-projects").start()
    ns = [Node(test_root, f"p{i}", layer_store, etcd, token_file) for i in range(4)]
    try:
        for n in ns:
            n.start()
        wait_until(lambda: {n.node_id for n in ns} <= set(etcd.nodes()), 15, "4 registered nodes")
        time.sleep(2 * REFRESH_MS / 1000)
        yield etcd, ns
    finally:
        for n in ns:
            n.stop()
        etcd.stop()


def as_project(node: Node, token: str) -> warren.Client:
    """A client of `node` over TCP with a project's token."""
    return warren.Client(f"127.0.0.1:{node.port}", token=token)


def raw_calls(node: Node, token: str) -> Dict[str, Callable]:
    """Calls on a sandbox id with `token` over TCP, each kind of service."""
    ch = grpc.insecure_channel(f"127.0.0.1:{node.port}")
    md = [("authorization", f"Bearer {token}")]
    sbx, files = warren_pb2_grpc.SandboxesStub(ch), warren_pb2_grpc.FilesStub(ch)
    life, procs = warren_pb2_grpc.LifecycleStub(ch), process_pb2_grpc.ProcessesStub(ch)
    return {
        "get": lambda i: sbx.Get(warren_pb2.GetSandboxRequest(id=i), metadata=md, timeout=30),
        "exec": lambda i: sbx.Exec(warren_pb2.ExecRequest(sandbox_id=i, argv=[b"true"]), metadata=md, timeout=30),
        "stat": lambda i: files.Stat(warren_pb2.StatRequest(sandbox_id=i, path=b"/etc"), metadata=md, timeout=30),
        "read": lambda i: list(files.Read(warren_pb2.ReadFileRequest(sandbox_id=i, path=b"/etc/hostname"),
                                          metadata=md, timeout=30)),
        "pause": lambda i: life.Pause(warren_pb2.PauseRequest(id=i), metadata=md, timeout=30),
        "processes": lambda i: procs.List(process_pb2.ListProcessesRequest(sandbox_id=i), metadata=md, timeout=30),
        "destroy": lambda i: sbx.Destroy(warren_pb2.DestroySandboxRequest(id=i), metadata=md, timeout=30),
    }


def test_projects_nest_scope_and_refuse_other_tokens(cluster, base_layer: str) -> None:
    etcd, nodes = cluster
    admin = nodes[0].client
    team, team_tok = admin.create_project("team", sandboxes=6)
    assert team.path == "team" and team.quota_sandboxes == 6 and team_tok.startswith("wp_")
    run7, run7_tok = admin.create_project("team/run-7", sandboxes=4)
    _, other_tok = admin.create_project("other")
    # Definitions live in etcd; the token only as its hash.
    stored = etcd.ctl("get", "--prefix", "/warren/projects/", "--print-value-only").stdout
    assert "team/run-7" in stored and run7_tok not in stored
    # A project token creates below itself only, delegating at most its quota.
    run7_client = as_project(nodes[1], run7_tok)
    eval_p, eval_tok = run7_client.create_project("team/run-7/eval", sandboxes=2)
    assert eval_p.path == "team/run-7/eval"
    with pytest.raises(warren.InvalidArgument) as ei:
        admin.create_project("team/run-8", sandboxes=7)
    assert "above project team's 6" in ei.value.details, ei.value.details
    with pytest.raises(warren.PermissionDenied):
        run7_client.create_project("other/x")
    with pytest.raises(warren.AlreadyExists):
        admin.create_project("team/run-7")
    with pytest.raises(warren.NotFound):
        admin.create_project("nosuch/child")
    with pytest.raises(warren.InvalidArgument):
        admin.create_project("Bad Name")
    assert [p.path for p in admin.projects()] == ["other", "team", "team/run-7", "team/run-7/eval"]
    assert [p.path for p in run7_client.projects()] == ["team/run-7", "team/run-7/eval"]

    other = as_project(nodes[2], other_tok)
    evalc = as_project(nodes[3], eval_tok)
    sbs = []
    try:
        sb = run7_client.create(layers=[base_layer], job="p-job", timeout=120)
        sbs.append(sb)
        assert sb.info().labels["warren.project"] == "team/run-7"
        # Reachable with its project's token through any node, and with the
        # parent's; not below it, not from another project.
        for n in nodes:
            assert as_project(n, run7_tok).get(sb.id).exec("echo hi", timeout=60).stdout == b"hi\n"
        assert as_project(nodes[3], team_tok).get(sb.id).exec("true", timeout=60).exit_code == 0
        assert [s.id for s in as_project(nodes[2], team_tok).list()] == [sb.id]
        assert evalc.list() == [] and other.list() == []
        # Another project's token (and one below): PermissionDenied on every
        # kind of call, saying no more than for an id that does not exist.
        ghost = owner(sb.id) + "-00000000deadbeef"
        for tok in (other_tok, eval_tok):
            for name, call in raw_calls(nodes[2], tok).items():
                with pytest.raises(grpc.RpcError) as real:
                    call(sb.id)
                with pytest.raises(grpc.RpcError) as fake:
                    call(ghost)
                assert real.value.code() == grpc.StatusCode.PERMISSION_DENIED, (name, real.value)
                assert fake.value.code() == grpc.StatusCode.PERMISSION_DENIED, (name, fake.value)
                assert real.value.details().replace(sb.id, "ID") == fake.value.details().replace(ghost, "ID"), name
                assert "run-7" not in real.value.details().replace("team/run-7/eval", ""), real.value.details()
        with pytest.raises(warren.PermissionDenied):
            other.job("p-job").destroy()
        with pytest.raises(warren.PermissionDenied):
            other.nodes()
        assert sb.exec("true", timeout=60).exit_code == 0  # untouched
        # The operator sees every project's sandboxes.
        assert sb.id in {s.id for s in admin.list()}
        # Its own job: the project acts on it.
        assert run7_client.job("p-job").destroy() == 1
        sbs.clear()
    finally:
        for s in sbs:
            s.destroy(timeout=60)

    # The CLI: project ls as JSON, create prints the token once.
    out = subprocess.run([str(CLI), "--addr", "unix:" + str(nodes[0].socket), "--json", "project", "ls"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert [p["path"] for p in json.loads(out.stdout)] == ["other", "team", "team/run-7", "team/run-7/eval"]
    out = subprocess.run([str(CLI), "--addr", "unix:" + str(nodes[0].socket), "--json", "project", "create",
                          "team/cli", "--sandboxes", "1", "--creates-per-second", "0.5", "--create-burst", "2"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    made = json.loads(out.stdout)
    assert made["project"]["path"] == "team/cli" and made["token"].startswith("wp_")
    assert (made["project"]["quota"]["creates_per_second"], made["project"]["quota"]["create_burst"]) == (0.5, 2)
    assert as_project(nodes[1], made["token"]).projects()[0].path == "team/cli"
    out = subprocess.run([str(CLI), "--addr", "unix:" + str(nodes[0].socket), "project", "rm", "team/cli"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    # Its token goes with it (on every node from its next refresh on).
    gone = as_project(nodes[1], made["token"])
    wait_until(lambda: _refused(gone), 5 + 4 * REFRESH_MS / 1000, "the deleted project's token to stop working")
    with pytest.raises(warren.FailedPrecondition):
        admin.delete_project("team/run-7")  # eval is below it


def test_quota_holds_cluster_wide_under_concurrent_creates(cluster, base_layer: str) -> None:
    etcd, nodes = cluster
    admin = nodes[0].client
    n_quota = 5
    _, tok = admin.create_project("q", sandboxes=n_quota)
    made: List[warren.Sandbox] = []
    refused: List[str] = []
    errors: List[BaseException] = []
    lock = threading.Lock()

    def worker(node: Node) -> None:
        c = as_project(node, tok)
        for _ in range(3):  # 8 threads x 3 = 24 tries for 5 slots
            try:
                sb = c.create(layers=[base_layer], timeout=120)
                with lock:
                    made.append(sb)
            except warren.ResourceExhausted as e:
                with lock:
                    refused.append(e.details)
            except BaseException as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(e)

    threads = [threading.Thread(target=worker, args=(nodes[i % 4],)) for i in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        assert not any(t.is_alive() for t in threads)
        assert errors == [], errors
        ids = {sb.id for sb in made}
        assert len(ids) <= n_quota, sorted(ids)
        assert all("project q: quota of 5 sandboxes reached" in d for d in refused), refused
        running = admin.list(labels={"warren.project": "q"})
        assert len(running) == len(ids) <= n_quota
        # Exact, not only conservative: once the nodes republished, the
        # quota fills up to N and no further, through any entry.
        time.sleep(3 * REFRESH_MS / 1000)
        for i in range(n_quota + 2):
            try:
                made.append(as_project(nodes[i % 4], tok).create(layers=[base_layer], timeout=120))
            except warren.ResourceExhausted:
                pass
        assert len({sb.id for sb in made}) == n_quota, [sb.id for sb in made]
        wait_until(lambda: admin.project("q").sandboxes == n_quota, 10, "usage to read N")
        # A destroy frees its share within a refresh.
        made.pop().destroy(timeout=60)
        c = as_project(nodes[3], tok)
        again = wait_until(lambda: _try_create(c, base_layer), 10 + 4 * REFRESH_MS / 1000, "the freed share")
        made.append(again)
    finally:
        _destroy_all(made)


def _destroy_all(sandboxes: Iterable[warren.Sandbox]) -> None:
    """A test's cleanup: destroys each (gone already is fine)."""
    for sb in sandboxes:
        try:
            sb.destroy(timeout=60)
        except warren.NotFound:
            pass


def _refused(c: warren.Client) -> bool:
    try:
        c.list(timeout=30)
        return False
    except warren.PermissionDenied:
        return True


def _try_create(c: warren.Client, layer: str):
    try:
        return c.create(layers=[layer], timeout=120)
    except warren.ResourceExhausted:
        return None


def test_cpu_quota_and_nested_quota(cluster, base_layer: str) -> None:
    _, nodes = cluster
    admin = nodes[0].client
    admin.create_project("c", cpu=1.5)
    _, tok = admin.create_project("c/inner")  # no quota of its own: c's holds
    c = as_project(nodes[1], tok)
    made = []
    try:
        made.append(c.create(layers=[base_layer], cpu=1.0, timeout=120))
        with pytest.raises(warren.ResourceExhausted) as ei:
            c.create(layers=[base_layer], cpu=1.0, timeout=120)
        assert "project c: quota of 1500 millicpus reached" in ei.value.details, ei.value.details
        made.append(c.create(layers=[base_layer], cpu=0.5, timeout=120))
    finally:
        _destroy_all(made)


def _held_shares(etcd, project: str) -> Dict[str, dict]:
    """The nodes' usage keys of exactly `project` in etcd now, by key."""
    out = etcd.ctl("get", "--prefix", f"/warren/usage/{project}/@").stdout.splitlines()
    return {k: json.loads(v) for k, v in zip(out[0::2], out[1::2])}


def test_a_failed_create_leaves_no_share_behind(cluster, base_layer: str) -> None:
    """A create admitted against the quota that then fails on its node (a
    layer it names is missing: resolved after the admission) hands its
    share back at once, not at the node's next refresh: the key reads 0
    right away, and a good create is admitted straight after."""
    etcd, nodes = cluster
    admin = nodes[0].client
    _, tok = admin.create_project("f", sandboxes=1)
    for i in range(4):
        c = as_project(nodes[i], tok)
        with pytest.raises(warren.NotFound) as ei:
            c.create(layers=["base/no-such-layer@1"], timeout=60)
        assert "no-such-layer" in ei.value.details, ei.value.details
        held = {k: v for k, v in _held_shares(etcd, "f").items() if v.get("sandboxes", 0) > 0}
        assert held == {}, f"a failed create's share is still counted: {held}"
        sb = c.create(layers=[base_layer], timeout=120)
        sb.destroy(timeout=60)
        # (a destroy frees its share within a refresh)
        wait_until(lambda: not any(v.get("sandboxes", 0) for v in _held_shares(etcd, "f").values()),
                   10, "the destroyed sandbox's share to go")


def test_snapshots_and_forks_are_the_projects_own(cluster, base_layer: str) -> None:
    """A project token snapshots and forks its sandboxes: the layer is the
    project's (listed, used and removed by it and the operators only;
    another project gets NotFound, as for a layer that does not exist), and
    the forks are creates of the project, held to its quota all or none."""
    etcd, nodes = cluster
    admin = nodes[0].client
    _, tok_a = admin.create_project("la", sandboxes=3)
    _, tok_b = admin.create_project("lb")
    a, a2, b = as_project(nodes[1], tok_a), as_project(nodes[3], tok_a), as_project(nodes[2], tok_b)
    made: List[warren.Sandbox] = []
    try:
        src = a.create(layers=[base_layer], timeout=120)
        made.append(src)
        src.files.write("/w/secret.txt", b"la's own\n", make_parents=True)
        with pytest.raises(warren.InvalidArgument) as ei:
            src.snapshot(name="workspace/squat@1")
        assert "named by the node" in ei.value.details, ei.value.details
        snap = src.snapshot()
        top = snap.layer
        assert top.name.startswith(f"workspace/snap-{src.id}@"), top.name
        # Seen by its project (through any node) and the operators; not by another project.
        assert top.digest in {l.digest for l in a2.layers.list()}
        assert top.digest in {l.digest for l in admin.layers.list()}
        assert top.digest not in {l.digest for l in b.layers.list()}
        assert base_layer in {l.name for l in b.layers.list()}  # the operators' layers are everyone's
        # The owners are part of the layer: the project's, none for the operators'.
        assert top.projects == ("la",), top
        owners = {l.name: l.projects for l in admin.layers.list()}
        assert owners[top.name] == ("la",) and owners[base_layer] == (), owners
        assert a2.layers.get(top.digest).projects == ("la",)
        out = subprocess.run([str(CLI), "--addr", "unix:" + str(nodes[0].socket), "--json", "layer", "get",
                              top.digest], check=True, capture_output=True, text=True).stdout
        assert json.loads(out)["projects"] == ["la"], out
        for ref in (top.name, top.digest):
            with pytest.raises(warren.NotFound):
                b.layers.get(ref)
            with pytest.raises(warren.NotFound) as ei:
                b.create(layers=[base_layer, ref], timeout=120)
            assert f"layer {ref} not found" in ei.value.details, ei.value.details
            with pytest.raises(warren.NotFound):
                b.layers.remove(ref)
        assert b.list() == []
        twin = a2.create(layers=snap.layers, timeout=120)
        made.append(twin)
        assert twin.files.read("/w/secret.txt") == b"la's own\n"
        # Forks: 2 running of a quota of 3, so 2 forks are refused (none made), 1 is not.
        with pytest.raises(warren.ResourceExhausted) as ei:
            src.fork(2)
        assert "project la: quota of 3 sandboxes reached" in ei.value.details, ei.value.details
        assert len(a.list()) == 2
        with pytest.raises(warren.PermissionDenied):
            src.fork(1, labels={"warren.project": "lb"})
        kids = src.fork(1)
        made.extend(kids)
        assert kids[0].cached_info.labels.get("warren.project") == "la"
        assert kids[0].files.read("/w/secret.txt") == b"la's own\n"
        with pytest.raises(warren.PermissionDenied):
            b.get(kids[0].id)
        forked = [l for l in a.layers.list() if l.name.startswith(f"workspace/fork-{src.id}@")]
        assert len(forked) == 1 and forked[0].digest not in {l.digest for l in b.layers.list()}
        # A project removes a layer of its own once nothing uses it; not the operators' layers.
        with pytest.raises(warren.PermissionDenied):
            a.layers.remove(base_layer)
        for sb in [twin, *kids]:
            sb.destroy(timeout=60)
            made.remove(sb)
        a.layers.remove(top.name)
        a.layers.remove(forked[0].name)
        assert top.digest not in {l.digest for l in admin.layers.list()}
    finally:
        _destroy_all(made)


def test_creates_per_second_hold_cluster_wide(cluster, base_layer: str) -> None:
    """A rate quota (GCRA over one etcd key, project.proto): 8 threads on 4
    entry nodes creating as fast as they can in a project below it get at
    most burst + rate x the time they took; the others are refused
    ResourceExhausted with a wait that is honest."""
    etcd, nodes = cluster
    admin = nodes[0].client
    rate, burst = 2.0, 3
    admin.create_project("r", creates_per_second=rate, create_burst=burst)
    _, tok = admin.create_project("r/kid")  # no rate of its own: r's holds
    info = admin.project("r")
    assert (info.quota_creates_per_second, info.quota_create_burst) == (rate, burst)
    # Bad rates name what is wrong; a child cannot ask for more than r.
    for kw, why in (
        ({"creates_per_second": 5.0}, "creates_per_second=5 is above project r's 2"),
        ({"creates_per_second": -1.0}, "creates_per_second must be a finite number >= 0"),
        ({"create_burst": 4}, "create_burst needs creates_per_second"),
    ):
        with pytest.raises(warren.InvalidArgument) as ei:
            admin.create_project("r/bad", **kw)
        assert why in ei.value.details, ei.value.details
    made: List[warren.Sandbox] = []
    refused: List[str] = []
    errors: List[BaseException] = []
    lock = threading.Lock()

    def worker(node: Node) -> None:
        c = as_project(node, tok)
        for _ in range(3):  # 8 threads x 3 = 24 tries
            try:
                sb = c.create(layers=[base_layer], timeout=120)
                with lock:
                    made.append(sb)
            except warren.ResourceExhausted as e:
                with lock:
                    refused.append(e.details)
            except BaseException as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(e)

    threads = [threading.Thread(target=worker, args=(nodes[i % 4],)) for i in range(8)]
    try:
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        took = time.monotonic() - t0
        assert not any(t.is_alive() for t in threads)
        assert errors == [], errors
        print(f"{len(made)} created, {len(refused)} refused in {took:.2f} s")
        # GCRA: in any window of W s at most burst + rate x W conform.
        assert burst <= len(made) <= burst + rate * took, (len(made), took)
        assert refused and all("project r: quota of 2 creates per second (burst 3) reached; retry in" in d
                               for d in refused), refused
        # The wait it names is enough: after it, a create is admitted.
        with pytest.raises(warren.ResourceExhausted) as ei:
            for _ in range(burst + 1):
                made.append(as_project(nodes[1], tok).create(layers=[base_layer], timeout=120))
        wait_ms = int(ei.value.details.rsplit("retry in ", 1)[1].split()[0])
        assert 0 < wait_ms <= burst * 1000 / rate, ei.value.details
        time.sleep(wait_ms / 1000 + 0.05)
        made.append(as_project(nodes[2], tok).create(layers=[base_layer], timeout=120))
        # Usage counts sandboxes only (the rate key is no node's usage).
        assert admin.project("r").sandboxes <= len(made)
    finally:
        _destroy_all(made)


def test_quota_changes_after_creation(cluster, base_layer: str) -> None:
    """update_project replaces a quota: a lowered one refuses creates until
    the usage is under it (running sandboxes stay), a raised one admits
    them at once through any node; bounds by ancestors and descendants; a
    project token updates only the projects below its own."""
    _, nodes = cluster
    admin = nodes[0].client
    _, top_tok = admin.create_project("u", sandboxes=4)
    _, tok = admin.create_project("u/a", sandboxes=2)
    admin.create_project("u/a/leaf", sandboxes=1)
    c = as_project(nodes[1], tok)
    made: list = []
    try:
        made += [c.create(layers=[base_layer], timeout=120) for _ in range(2)]
        with pytest.raises(warren.ResourceExhausted):
            c.create(layers=[base_layer], timeout=120)
        # Raised by its parent's token: admitted through any node within a refresh.
        info = as_project(nodes[2], top_tok).update_project("u/a", sandboxes=3, creates_per_second=5)
        assert (info.quota_sandboxes, info.quota_creates_per_second) == (3, 5)
        c3 = as_project(nodes[3], tok)
        made.append(wait_until(lambda: _try_create(c3, base_layer), 5 + 2 * REFRESH_MS / 1000, "the raised quota"))
        # Lowered below what runs: the running ones stay, creates are refused.
        assert admin.update_project("u/a", sandboxes=1, creates_per_second=5).quota_sandboxes == 1
        assert all(sb.exec("true", timeout=60).exit_code == 0 for sb in made)
        time.sleep(2 * REFRESH_MS / 1000)  # every node has read it (c's is nodes[1])
        with pytest.raises(warren.ResourceExhausted) as ei:
            c.create(layers=[base_layer], timeout=120)
        assert "project u/a: quota of 1 sandboxes reached" in ei.value.details, ei.value.details
        # Bounds: not above the parent's, not below a child's own, a rate as at create.
        for path, kw, why in (
            ("u/a", {"sandboxes": 5}, "quota sandboxes=5 is above project u's 4"),
            ("u", {"sandboxes": 0, "creates_per_second": 1}, "creates_per_second=1 is below project u/a's 5"),
            ("u/a/leaf", {"creates_per_second": -2}, "creates_per_second must be a finite number >= 0"),
        ):
            with pytest.raises(warren.InvalidArgument) as ei:
                admin.update_project(path, **kw)
            assert why in ei.value.details, ei.value.details
        with pytest.raises(warren.NotFound):
            admin.update_project("u/none", sandboxes=1)
        # The CLI: project update prints the project.
        out = subprocess.run([str(CLI), "--addr", "unix:" + str(nodes[0].socket), "--json", "project", "update",
                              "u/a", "--sandboxes", "3"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["quota"]["sandboxes"] == 3
        assert admin.project("u/a").quota_sandboxes == 3
        # A token never raises its own quota, nor touches one outside it.
        for path in ("u/a", "u"):
            with pytest.raises(warren.PermissionDenied):
                as_project(nodes[0], tok).update_project(path, sandboxes=9)
        assert as_project(nodes[0], tok).update_project("u/a/leaf", sandboxes=2).quota_sandboxes == 2
    finally:
        _destroy_all(made)
