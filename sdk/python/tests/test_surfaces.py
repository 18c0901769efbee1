"""The sync and the async SDK have the same public surface: every class of
one side has its twin on the other with the same public names, and every
method the same parameters and defaults (sync methods are plain, async ones
coroutines; `with`/`for` on one side are `async with`/`async for` on the
other). Fails on any difference, naming it."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Dict, List, Tuple

import pytest

import warren
from warren import _core, aio, client, lifecycle, process

PAIRS = [
    (client.Client, aio.AsyncClient),
    (client.Sandbox, aio.AsyncSandbox),
    (client.Files, aio.AsyncFiles),
    (client.Layers, aio.AsyncLayers),
    (client.Images, aio.AsyncImages),
    (lifecycle.Job, aio.AsyncJob),
    (process.Process, aio.AsyncProcess),
    (process.ProcessStream, aio.AsyncProcessStream),
    (process.ExecStream, aio.AsyncExecStream),
    (process.Session, aio.AsyncSession),
]
# Protocol methods of one side and their twins on the other.
TWINS = {"__enter__": "__aenter__", "__exit__": "__aexit__", "__iter__": "__aiter__"}


def _signature(fn: Any) -> str:
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def surface(cls: type, protocol: List[str]) -> Dict[str, Tuple[str, str]]:
    """name -> (kind, signature) of every public member of cls (and its
    protocol methods under their sync names), annotations included."""
    rename = {v: k for k, v in TWINS.items()}
    out: Dict[str, Tuple[str, str]] = {}
    for name in dir(cls):
        if name.startswith("_") and name not in protocol:
            continue
        attr = inspect.getattr_static(cls, name)
        key = rename.get(name, name)
        if isinstance(attr, _core.op):
            out[key] = ("op", str(attr._sig.replace(return_annotation=inspect.Signature.empty)))
        elif isinstance(attr, _core.stream_op):
            out[key] = ("stream", str(attr._sig.replace(return_annotation=inspect.Signature.empty)))
        elif isinstance(attr, property):
            out[key] = ("property", "")
        elif callable(attr):
            kind = "protocol" if name in protocol else "method"
            out[key] = (kind, "" if name in protocol else _signature(attr))
        else:
            out[key] = ("attribute", "")
    for klass in cls.__mro__:
        for name in getattr(klass, "__annotations__", {}):
            if not name.startswith("_"):
                out.setdefault(name, ("attribute", ""))
    return out


def differences(sync_cls: type, async_cls: type) -> List[str]:
    a = surface(sync_cls, list(TWINS))
    b = surface(async_cls, list(TWINS.values()))
    diffs = []
    for name in sorted(set(a) | set(b)):
        if name not in a:
            diffs.append(f"{async_cls.__name__}.{name} has no twin in {sync_cls.__name__}")
        elif name not in b:
            diffs.append(f"{sync_cls.__name__}.{name} has no twin in {async_cls.__name__}")
        elif a[name] != b[name]:
            diffs.append(f"{name}: {sync_cls.__name__} {a[name]} != {async_cls.__name__} {b[name]}")
    return diffs


@pytest.mark.parametrize("sync_cls,async_cls", PAIRS, ids=lambda c: c.__name__)
def test_public_surfaces_match(sync_cls: type, async_cls: type) -> None:
    assert differences(sync_cls, async_cls) == []


@pytest.mark.parametrize("sync_cls,async_cls", PAIRS, ids=lambda c: c.__name__)
def test_constructors_match(sync_cls: type, async_cls: type) -> None:
    assert _signature(sync_cls.__init__) == _signature(async_cls.__init__)


def test_every_class_is_paired() -> None:
    """A new public class on one side needs its twin in PAIRS."""
    paired = {c for pair in PAIRS for c in pair}
    for mod in (client, aio, process, lifecycle):
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            if isinstance(obj, type) and issubclass(obj, (_core.Sync, _core.Async)):
                assert obj in paired, f"{mod.__name__}.{name} has no twin in the surface test"


def test_the_comparison_sees_a_method_on_one_side_only() -> None:
    class Lopsided(aio.AsyncSandbox):
        async def only_here(self) -> None:
            pass

        @_core.op
        def exec(self, cmd: Any, *, env: Any = None) -> _core.Gen[None]:  # type: ignore[override]
            yield None

    diffs = differences(client.Sandbox, Lopsided)
    assert any("only_here" in d for d in diffs), diffs
    assert any(d.startswith("exec:") for d in diffs), diffs


def test_sides_are_plain_and_coroutine_methods(tmp_path: Any) -> None:
    sock = "unix:" + str(tmp_path / "none.sock")
    with warren.Client(sock) as c:
        sb = client.Sandbox(c, warren.SandboxInfo._from_pb(warren._proto.warren_pb2.Sandbox(id="n0-x")))
        assert not inspect.iscoroutinefunction(sb.suspend) and not inspect.iscoroutinefunction(c.create)
        assert list(inspect.signature(sb.resume).parameters) == ["prefetch"]

    async def main() -> None:
        async with warren.AsyncClient(sock) as ac:
            asb = aio.AsyncSandbox(ac, warren.SandboxInfo._from_pb(warren._proto.warren_pb2.Sandbox(id="n0-x")))
            for name in ("suspend", "resume", "fork", "exec", "session", "spawn"):
                assert inspect.iscoroutinefunction(getattr(asb, name)), name
            for name in ("create", "jobs", "fncall", "fncall_batch", "status"):
                assert inspect.iscoroutinefunction(getattr(ac, name)), name
            assert "retries" in inspect.signature(c.create).parameters
            assert "prefetch" in inspect.signature(asb.resume).parameters

    asyncio.run(main())
