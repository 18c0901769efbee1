"""Sandbox.fork (sync and async) is one Lifecycle.Fork call: what it sends,
what it refuses before sending, and what it returns (against a fake
Lifecycle service)."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
from concurrent import futures
from typing import Any, Iterator, List

import grpc
import pytest

import warren
from warren._proto import warren_pb2 as pb
from warren._proto import warren_pb2_grpc as pb_grpc


class FakeLifecycle(pb_grpc.LifecycleServicer):
    def __init__(self) -> None:
        self.requests: List[Any] = []
        self.lock = threading.Lock()

    def Fork(self, req: pb.ForkRequest, ctx: Any) -> pb.ForkResponse:
        with self.lock:
            self.requests.append(req)
        return pb.ForkResponse(layer=pb.Layer(digest="sha256:" + "1" * 64),
                               sandboxes=[pb.Sandbox(id=f"n0-k{i}", labels=req.labels) for i in range(req.count)])

    def Snapshot(self, req: Any, ctx: Any) -> Any:  # a client-side fork would call this
        ctx.abort(grpc.StatusCode.INTERNAL, "fork must not snapshot client-side")


@pytest.fixture()
def fake() -> Iterator[Any]:
    d = tempfile.mkdtemp()
    sock = os.path.join(d, "fake.sock")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    f = FakeLifecycle()
    pb_grpc.add_LifecycleServicer_to_server(f, server)
    server.add_insecure_port("unix:" + sock)
    server.start()
    f.sock = sock  # type: ignore[attr-defined]
    yield f
    server.stop(None).wait()
    shutil.rmtree(d, ignore_errors=True)


def _info(sid: str = "n0-src") -> warren.SandboxInfo:
    return warren.SandboxInfo._from_pb(pb.Sandbox(id=sid))


def test_fork_is_one_rpc_with_the_overrides(fake: Any) -> None:
    with warren.Client(fake.sock) as c:
        sb = warren.Sandbox(c, _info())
        kids = sb.fork(3, labels={"k": "v"}, ttl_s=60, exclude=["/tmp/*"], pause=False)
    assert [k.id for k in kids] == ["n0-k0", "n0-k1", "n0-k2"]
    assert all(isinstance(k, warren.Sandbox) for k in kids)
    (req,) = fake.requests
    assert (req.id, req.count, dict(req.labels), req.ttl_s, list(req.exclude), req.no_pause) == \
        ("n0-src", 3, {"k": "v"}, 60, ["/tmp/*"], True)


def test_fork_defaults(fake: Any) -> None:
    with warren.Client(fake.sock) as c:
        warren.Sandbox(c, _info()).fork(1)
    (req,) = fake.requests
    assert (req.count, dict(req.labels), req.ttl_s, list(req.exclude), req.no_pause) == (1, {}, 0, [], False)


@pytest.mark.parametrize("kwargs,named", [
    (dict(memory_mb=64), "memory_mb"), (dict(env={"A": "1"}), "env"),
    (dict(cpu=1, job="j"), "cpu, job"), (dict(layers=["x"]), "layers")])
def test_fork_refuses_what_it_cannot_override_before_sending(fake: Any, kwargs: Any, named: str) -> None:
    with warren.Client(fake.sock) as c:
        with pytest.raises(warren.InvalidArgument, match=named):
            warren.Sandbox(c, _info()).fork(2, **kwargs)
    assert fake.requests == []


@pytest.mark.parametrize("n", [0, -1, True, 1.5])
def test_fork_refuses_a_bad_count(fake: Any, n: Any) -> None:
    with warren.Client(fake.sock) as c:
        with pytest.raises(warren.InvalidArgument, match="fork"):
            warren.Sandbox(c, _info()).fork(n)
    assert fake.requests == []


def test_async_fork_is_the_same_rpc(fake: Any) -> None:
    async def main() -> List[str]:
        async with warren.AsyncClient(fake.sock) as ac:
            kids = await warren.AsyncSandbox(ac, _info()).fork(2, labels={"a": "b"})
            assert all(isinstance(k, warren.AsyncSandbox) for k in kids)
            with pytest.raises(warren.InvalidArgument, match="memory_mb"):
                await warren.AsyncSandbox(ac, _info()).fork(2, memory_mb=1)
            return [k.id for k in kids]

    assert asyncio.run(main()) == ["n0-k0", "n0-k1"]
    (req,) = fake.requests
    assert req.count == 2 and dict(req.labels) == {"a": "b"}
