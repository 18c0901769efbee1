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
                          "team/cli", "--sandboxes", "1"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    made = json.loads(out.stdout)
    assert made["project"]["path"] == "team/cli" and made["token"].startswith("wp_")
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
        for sb in made:
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
        for sb in made:
            sb.destroy(timeout=60)
