"""warren.AsyncClient: the Client surface as coroutines.

Each call runs the synchronous, thread-safe client in asyncio's default
thread pool (asyncio.to_thread), so many calls can be awaited concurrently;
the pool size (default min(32, cpus + 4)) bounds how many run at once —
raise it with loop.set_default_executor for thousands of concurrent execs.
Arguments, results, units and errors are those of warren.Client.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, List, Optional

from .client import Client, Files, Sandbox
from .types import ExecResult, FileInfo, Layer, NodeStatus, SandboxInfo

__all__ = ["AsyncClient", "AsyncSandbox", "AsyncFiles", "AsyncLayers"]


class AsyncFiles:
    """Async twin of warren.Files."""

    def __init__(self, files: Files):
        self._f = files

    async def write(self, path: Any, data: Any, mode: int = 0o644,
                    make_parents: bool = False, timeout: Optional[float] = None) -> int:
        return await asyncio.to_thread(self._f.write, path, data, mode, make_parents, timeout)

    async def read(self, path: Any, offset: int = 0, length: int = 0,
                   timeout: Optional[float] = None) -> bytes:
        return await asyncio.to_thread(self._f.read, path, offset, length, timeout)

    async def read_stream(self, path: Any, offset: int = 0, length: int = 0,
                          timeout: Optional[float] = None) -> AsyncIterator[bytes]:
        it = self._f.read_stream(path, offset, length, timeout)
        end = object()
        while True:
            chunk = await asyncio.to_thread(next, it, end)
            if chunk is end:
                return
            yield chunk  # type: ignore[misc]

    async def stat(self, path: Any) -> FileInfo:
        return await asyncio.to_thread(self._f.stat, path)

    async def list(self, path: Any) -> List[FileInfo]:
        return await asyncio.to_thread(self._f.list, path)

    async def mkdir(self, path: Any, parents: bool = False, mode: int = 0o755) -> None:
        await asyncio.to_thread(self._f.mkdir, path, parents, mode)

    async def remove(self, path: Any, recursive: bool = False) -> None:
        await asyncio.to_thread(self._f.remove, path, recursive)

    async def rename(self, src: Any, dst: Any) -> None:
        await asyncio.to_thread(self._f.rename, src, dst)

    async def exists(self, path: Any) -> bool:
        return await asyncio.to_thread(self._f.exists, path)


class AsyncSandbox:
    """Async twin of warren.Sandbox; ``async with`` destroys it on exit."""

    def __init__(self, sandbox: Sandbox):
        self._sb = sandbox
        self.id = sandbox.id
        self.files = AsyncFiles(sandbox.files)

    def __repr__(self) -> str:
        return f"AsyncSandbox(id={self.id!r})"

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await asyncio.to_thread(self._sb.__exit__, None, None, None)

    @property
    def cached_info(self) -> SandboxInfo:
        return self._sb.cached_info

    async def info(self) -> SandboxInfo:
        return await asyncio.to_thread(self._sb.info)

    async def destroy(self, timeout: Optional[float] = None) -> None:
        await asyncio.to_thread(self._sb.destroy, timeout)

    async def exec(self, cmd: Any, **kwargs: Any) -> ExecResult:
        return await asyncio.to_thread(lambda: self._sb.exec(cmd, **kwargs))

    # lifecycle (issue 4): see Sandbox.
    async def pause(self) -> SandboxInfo:
        return await asyncio.to_thread(self._sb.pause)

    async def resume(self) -> SandboxInfo:
        return await asyncio.to_thread(self._sb.resume)

    async def suspend(self) -> SandboxInfo:
        return await asyncio.to_thread(self._sb.suspend)

    async def extend_ttl(self, ttl_s: int) -> SandboxInfo:
        return await asyncio.to_thread(self._sb.extend_ttl, ttl_s)

    async def snapshot(self, **kwargs: Any) -> Any:
        return await asyncio.to_thread(lambda: self._sb.snapshot(**kwargs))

    async def fork(self, n: int, **kwargs: Any) -> List["AsyncSandbox"]:
        kids = await asyncio.to_thread(lambda: self._sb.fork(n, **kwargs))
        return [AsyncSandbox(k) for k in kids]

    async def grade(self, grader: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(lambda: self._sb.grade(grader, **kwargs))

    async def audit_log(self) -> List[Any]:
        return await asyncio.to_thread(self._sb.audit_log)


class AsyncLayers:
    """Async twin of warren.Layers."""

    def __init__(self, client: Client):
        self._l = client.layers

    async def build(self, name: str, **kwargs: Any) -> Layer:
        return await asyncio.to_thread(lambda: self._l.build(name, **kwargs))

    async def list(self) -> List[Layer]:
        return await asyncio.to_thread(self._l.list)

    async def get(self, ref: str) -> Layer:
        return await asyncio.to_thread(self._l.get, ref)

    async def remove(self, ref: str) -> None:
        await asyncio.to_thread(self._l.remove, ref)


class AsyncClient:
    """Async twin of warren.Client (same arguments)."""

    def __init__(self, addr: Optional[str] = None, token: Optional[str] = None):
        self._c = Client(addr, token)
        self.addr = self._c.addr
        self.layers = AsyncLayers(self._c)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._c.close()

    async def create(self, backend: str = "container", layers: Any = (), **kwargs: Any) -> AsyncSandbox:
        sb = await asyncio.to_thread(lambda: self._c.create(backend, layers, **kwargs))
        return AsyncSandbox(sb)

    async def get(self, sandbox_id: str) -> AsyncSandbox:
        return AsyncSandbox(await asyncio.to_thread(self._c.get, sandbox_id))

    async def list(self, labels: Any = None, job: Optional[str] = None,
                   timeout: Optional[float] = None) -> List[AsyncSandbox]:
        return [AsyncSandbox(s) for s in await asyncio.to_thread(self._c.list, labels, job, timeout)]

    async def destroy(self, sandbox_id: str, timeout: Optional[float] = None) -> None:
        await asyncio.to_thread(self._c.destroy, sandbox_id, timeout)

    async def status(self, timeout: Optional[float] = None) -> NodeStatus:
        return await asyncio.to_thread(self._c.status, timeout)
