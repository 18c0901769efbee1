"""warren.AsyncClient: the Client surface as coroutines, on grpc.aio.

One AsyncClient is one gRPC channel (HTTP/2 multiplexes every call over it);
no call uses a thread, so one event loop can drive thousands of sandboxes
concurrently:

    async with warren.AsyncClient() as c:
        async def one(i):
            async with await c.create(layers=["base/debian-12"]) as sb:
                return (await sb.exec("echo hi", timeout=30)).stdout
        outs = await asyncio.gather(*(one(i) for i in range(1000)))

The classes here are the async side of the one SDK implementation
(warren._sandbox, warren._client_core, warren._process; see warren._core): every method of
warren.Client / Sandbox / Files / Layers / Job / Process / ExecStream /
ProcessStream / Session is here with the same parameters, as a coroutine
method (exec_stream() and Process.stream() return their stream at once;
streams are async iterators, ``async with`` replaces ``with``).
Create the AsyncClient inside the event loop that uses it.
Admission: a node refuses creates beyond --max-creates-in-flight with
ResourceExhausted (retryable); create(retries=N) retries those with backoff.
"""

from __future__ import annotations

from typing import Any, List, Tuple

import grpc.aio

from ._client_core import ClientCore, LayersCore
from ._core import Async, AsyncContext, AsyncIterable
from ._images import ImagesCore
from ._process import ExecStreamCore, ProcessCore, ProcessStreamCore, SessionCore
from ._sandbox import FilesCore, SandboxCore
from .desktop import InputCore
from .lifecycle import JobCore

__all__ = ["AsyncClient", "AsyncSandbox", "AsyncFiles", "AsyncLayers", "AsyncImages", "AsyncProcess",
           "AsyncProcessStream",
           "AsyncExecStream", "AsyncSession", "AsyncJob"]


class AsyncExecStream(ExecStreamCore, AsyncContext, AsyncIterable):
    __doc__ = ExecStreamCore.__doc__


class AsyncProcessStream(ProcessStreamCore, AsyncContext, AsyncIterable):
    __doc__ = ProcessStreamCore.__doc__


class AsyncProcess(ProcessCore[AsyncProcessStream], Async):
    __doc__ = ProcessCore.__doc__
    _stream_cls = AsyncProcessStream


class AsyncSession(SessionCore[AsyncProcess], AsyncContext):
    __doc__ = SessionCore.__doc__


class AsyncFiles(FilesCore, Async):
    __doc__ = FilesCore.__doc__


class AsyncInput(InputCore, Async):
    __doc__ = InputCore.__doc__


class AsyncLayers(LayersCore, Async):
    __doc__ = LayersCore.__doc__


class AsyncImages(ImagesCore, Async):
    __doc__ = ImagesCore.__doc__


class AsyncSandbox(SandboxCore["AsyncSandbox", AsyncProcess, AsyncExecStream, AsyncSession], AsyncContext):
    __doc__ = SandboxCore.__doc__
    files: AsyncFiles
    input: AsyncInput


class AsyncJob(JobCore[AsyncSandbox], Async):
    __doc__ = JobCore.__doc__


class AsyncClient(ClientCore[AsyncSandbox, AsyncJob], AsyncContext):
    __doc__ = ClientCore.__doc__
    layers: AsyncLayers
    images: AsyncImages
    _sandbox_cls = AsyncSandbox
    _job_cls = AsyncJob
    _files_cls = AsyncFiles
    _input_cls = AsyncInput
    _layers_cls = AsyncLayers
    _images_cls = AsyncImages
    _process_cls = AsyncProcess
    _exec_stream_cls = AsyncExecStream
    _session_cls = AsyncSession

    def _make_channel(self, target: str, options: List[Tuple[str, int]]) -> Any:
        return grpc.aio.insecure_channel(target, options=options)
