"""Fork on the server (Lifecycle.Fork), node side: snapshot + count sandboxes made by the
node, each keeping the source's env (byte-exact), workdir, user, limits,
labels (merged with the request's), job, TTL and idle timeout; all or
nothing. Called through the generated stub (the SDK switches to it)."""

import grpc
import pytest

import warren
from warren._proto import warren_pb2 as pb
from warren._proto import warren_pb2_grpc as pb_grpc
from conftest import NODE_PREFIX, Daemon, assert_back_to_baseline, host_snapshot


def _fork(client, **kw):
    stub = pb_grpc.LifecycleStub(client._channel)
    return stub.Fork(pb.ForkRequest(**kw), metadata=client._metadata, timeout=300)


def test_fork_keeps_env_workdir_user_limits_labels_job(client, base_layer):
    raw = b"\xff\xfe caf\xc3\xa9"
    with client.create(layers=[base_layer], env={"RAW": raw, "K": "v"}, workdir="/w/app", user="1000:1000",
                       memory_mb=300, pids=77, open_files=333, cpu=0.5, labels={"task": "t1", "keep": "me"},
                       job="fork-job", ttl_s=900, idle_timeout_s=600) as src:
        src.files.write("/w/app/note.txt", b"hi\n")
        resp = _fork(client, id=src.id, count=2, labels={"task": "t2", "fork": "yes"})
        assert len(resp.sandboxes) == 2
        assert resp.layer.digest
        try:
            for f in resp.sandboxes:
                assert f.id != src.id
                assert dict(f.labels) == {"task": "t2", "keep": "me", "fork": "yes"}
                assert f.job == "fork-job"
                assert f.ttl_s == 900 and f.idle_timeout_s == 600
                assert f.resources.memory_mb == 300 and f.resources.pids == 77
                assert f.resources.open_files == 333 and f.resources.cpu_millis == 500
                assert list(f.layers)[-1] == resp.layer.digest
                sb = client.get(f.id)
                r = sb.exec("pwd; id -u; cat note.txt; ulimit -n; printf '%s' \"$RAW\" | od -An -tx1 | tr -d ' \\n'",
                            timeout=30)
                assert r.exit_code == 0, r.stderr
                assert r.stdout == b"/w/app\n1000\nhi\n333\n" + raw.hex().encode()
        finally:
            for f in resp.sandboxes:
                client.destroy(f.id)


@pytest.mark.parametrize("count", [0, 257])
def test_fork_count_out_of_range_is_invalid(client, sandbox, count):
    with pytest.raises(grpc.RpcError) as ei:
        _fork(client, id=sandbox.id, count=count)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"count={count}" in ei.value.details()


@pytest.mark.single_node("fails a fork midway on a warrend of its own: no cluster node is involved")
@pytest.mark.timeout(300)
def test_fork_failing_midway_leaves_no_fork_and_no_layer(test_root, layer_store, base_layer, daemon):
    """A node that holds 3 sandboxes: a fork of 4 makes 2, fails on the 3rd;
    the 2 are destroyed and the snapshot layer is removed."""
    d = Daemon(test_root, "fork-fail", layer_store, NODE_PREFIX + "f", extra_args=["--max-sandboxes", "3"])
    base = host_snapshot([daemon, d])
    d.start()
    try:
        c = d.client
        layers_before = {l.digest: l.name for l in c.layers.list()}
        src = c.create(layers=[base_layer])
        src.exec("echo x > /w_file", timeout=30)
        with pytest.raises(grpc.RpcError) as ei:
            _fork(c, id=src.id, count=4)
        assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, ei.value.details()
        assert "fork 3 of 4" in ei.value.details()
        assert [s.id for s in c.list()] == [src.id]
        layers_after = {l.digest: l.name for l in c.layers.list()}
        assert layers_after.keys() == layers_before.keys(), (
            f"layers made: {sorted(v for k, v in layers_after.items() if k not in layers_before)}; "
            f"gone: {sorted(v for k, v in layers_before.items() if k not in layers_after)}\n{d.log_tail()}")
        src.destroy()
        assert_back_to_baseline([daemon, d], base, timeout=60, clients=[c])
    finally:
        if d.proc and d.proc.poll() is None:
            d.stop()
