"""warren.AsyncClient: the Client surface as coroutines, on grpc.aio.

One AsyncClient is one gRPC channel (HTTP/2 multiplexes every call over it);
no call uses a thread, so one event loop can drive thousands of sandboxes
concurrently:

    async with warren.AsyncClient() as c:
        async def one(i):
            async with await c.create(layers=["base/debian-12"]) as sb:
                return (await sb.exec("echo hi", timeout=30)).stdout
        outs = await asyncio.gather(*(one(i) for i in range(1000)))

Arguments, results, units and errors are those of warren.Client /
warren.Sandbox / warren.process (see their docstrings); streaming calls are
async iterators. Create the AsyncClient inside the event loop that uses it.
Admission: a node refuses creates beyond --max-creates-in-flight with
ResourceExhausted (retryable); create(retries=N) retries those with backoff.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import random
import signal as _signal
import time
from typing import Any, AsyncIterator, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import grpc
import grpc.aio

from . import errors
from ._proto import process_pb2 as ppb
from ._proto import process_pb2_grpc as ppb_grpc
from ._proto import warren_pb2 as pb
from ._proto import warren_pb2_grpc as pb_grpc
from .client import (ABANDON_RETRY_S, _check_data, _chunks, _create_request, _exec_request, _new_request_id,
                     _path_bytes, _target, _u32, _u32_or_u64)
from .lifecycle import GradeResult, JobInfo, Snapshot, _grade_request, _grade_result
from .process import (STDERR, STDOUT, SESSION_BUFFER_BYTES, OutputChunk, ProcessInfo,
                      ProcessOutput, _INTERRUPT_GRACE_S, _SESSION_ARGV, _WAIT_SLICE_S, _SessionCommand,
                      _start_options, _to_bytes)
from .process import _exec_request as _proc_request
from .types import ExecResult, FileInfo, Layer, NodeStatus, SandboxInfo

__all__ = ["AsyncClient", "AsyncSandbox", "AsyncFiles", "AsyncLayers", "AsyncProcess",
           "AsyncExecStream", "AsyncSession", "AsyncJob"]

Cmd = Union[str, bytes, Sequence[Union[str, bytes]]]


async def _rpc(coro: Any) -> Any:
    """Awaits a grpc.aio call, mapping its error to the WarrenError subclass."""
    try:
        return await coro
    except grpc.RpcError as e:
        raise errors.from_rpc_error(e) from None


class AsyncFiles:
    """Async twin of warren.Files."""

    def __init__(self, sb: "AsyncSandbox"):
        self._sb = sb
        self._stub = sb._client._files

    def _md(self) -> Any:
        return self._sb._client._metadata

    async def write(self, path: Any, data: Any, mode: int = 0o644, make_parents: bool = False,
                    timeout: Optional[float] = None, request_id: Optional[str] = None) -> int:
        p = _path_bytes(path)
        mode = _u32("mode", mode) & 0o7777
        sid = self._sb.id

        async def requests() -> AsyncIterator[pb.WriteFileRequest]:
            first = True
            for chunk in _chunks(data):
                if first:
                    first = False
                    yield pb.WriteFileRequest(sandbox_id=sid, path=p, mode=mode, make_parents=make_parents,
                                              data=chunk, request_id=request_id or "")
                else:
                    yield pb.WriteFileRequest(data=chunk)
            if first:
                yield pb.WriteFileRequest(sandbox_id=sid, path=p, mode=mode, make_parents=make_parents,
                                          request_id=request_id or "")

        _check_data(data)
        failure: List[BaseException] = []

        async def checked() -> AsyncIterator[pb.WriteFileRequest]:
            try:
                async for r in requests():
                    yield r
            except Exception as e:  # noqa: BLE001 - raised below instead of gRPC's UNKNOWN
                failure.append(e)
                raise

        try:
            r = await _rpc(self._stub.Write(checked(), metadata=self._md(), timeout=timeout))
        except errors.WarrenError:
            if failure:
                raise failure[0] from None
            raise
        return r.bytes_written

    async def read_stream(self, path: Any, offset: int = 0, length: int = 0,
                          timeout: Optional[float] = None) -> AsyncIterator[bytes]:
        req = pb.ReadFileRequest(sandbox_id=self._sb.id, path=_path_bytes(path),
                                 offset=_u32_or_u64("offset", offset), length=_u32_or_u64("length", length))
        try:
            async for chunk in self._stub.Read(req, metadata=self._md(), timeout=timeout):
                yield bytes(chunk.data)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None

    async def read(self, path: Any, offset: int = 0, length: int = 0, timeout: Optional[float] = None) -> bytes:
        buf = io.BytesIO()
        async for chunk in self.read_stream(path, offset, length, timeout):
            buf.write(chunk)
        return buf.getvalue()

    async def stat(self, path: Any) -> FileInfo:
        return FileInfo._from_pb(await _rpc(self._stub.Stat(
            pb.StatRequest(sandbox_id=self._sb.id, path=_path_bytes(path)), metadata=self._md())))

    async def list(self, path: Any) -> List[FileInfo]:
        r = await _rpc(self._stub.ListDir(pb.ListDirRequest(sandbox_id=self._sb.id, path=_path_bytes(path)),
                                          metadata=self._md()))
        return [FileInfo._from_pb(e) for e in r.entries]

    async def mkdir(self, path: Any, parents: bool = False, mode: int = 0o755) -> None:
        await _rpc(self._stub.Mkdir(pb.MkdirRequest(sandbox_id=self._sb.id, path=_path_bytes(path),
                                                    mode=_u32("mode", mode) & 0o7777, parents=parents),
                                    metadata=self._md()))

    async def remove(self, path: Any, recursive: bool = False) -> None:
        await _rpc(self._stub.Remove(pb.RemoveRequest(sandbox_id=self._sb.id, path=_path_bytes(path),
                                                      recursive=recursive), metadata=self._md()))

    async def rename(self, src: Any, dst: Any) -> None:
        await _rpc(self._stub.Rename(pb.RenameRequest(sandbox_id=self._sb.id, to=_path_bytes(dst),
                                                      **{"from": _path_bytes(src)}), metadata=self._md()))

    async def exists(self, path: Any) -> bool:
        try:
            await self.stat(path)
            return True
        except errors.NotFound:
            return False


class AsyncExecStream:
    """Async twin of warren.process.ExecStream: ``async for chunk in st``,
    then st.result; send_stdin/close_stdin/signal/resize are coroutines;
    close() (or leaving ``async with``) kills a command still running."""

    def __init__(self, call: Any, collect_cap: int = 0):
        self._call = call
        self._cap = collect_cap
        self._parts: List[List[bytes]] = [[], []]
        self._sizes = [0, 0]
        self._trunc = [False, False]
        self._input_done = False
        self.result: Optional[ExecResult] = None
        self.info: Optional[ProcessInfo] = None
        self._first: "asyncio.Future[None]"  # set by AsyncSandbox.exec_stream

    async def __aenter__(self) -> "AsyncExecStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _done_writing(self) -> None:
        if not self._input_done:
            self._input_done = True
            await self._first
            try:
                await self._call.done_writing()
            except (grpc.RpcError, asyncio.InvalidStateError):
                pass

    async def __aiter__(self) -> AsyncIterator[OutputChunk]:
        try:
            async for ev in self._call:
                kind = ev.WhichOneof("event")
                if kind == "started":
                    self.info = ProcessInfo._from_pb(ev.started)
                elif kind == "output":
                    c = OutputChunk._from_pb(ev.output)
                    if self._cap and c.stream in (STDOUT, STDERR):
                        i = 0 if c.stream == STDOUT else 1
                        part = c.data[:max(0, self._cap - self._sizes[i])]
                        self._parts[i].append(part)
                        self._sizes[i] += len(part)
                        self._trunc[i] = self._trunc[i] or len(part) < len(c.data)
                    yield c
                elif kind == "exit":
                    r = ExecResult._from_pb(ev.exit)
                    self.result = ExecResult(
                        exit_code=r.exit_code, signal=r.signal, oom_killed=r.oom_killed, timed_out=r.timed_out,
                        stdout=b"".join(self._parts[0]), stderr=b"".join(self._parts[1]),
                        stdout_truncated=self._trunc[0], stderr_truncated=self._trunc[1],
                        stdout_total_bytes=r.stdout_total_bytes, stderr_total_bytes=r.stderr_total_bytes,
                        duration_s=r.duration_s)
                    await self._done_writing()
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None

    async def wait(self) -> ExecResult:
        async for _ in self:
            pass
        assert self.result is not None
        return self.result

    async def _send(self, m: "ppb.ExecStreamRequest") -> None:
        await self._first  # the request goes first
        await _rpc(self._call.write(m))

    async def send_stdin(self, data: Union[bytes, str]) -> None:
        await self._send(ppb.ExecStreamRequest(stdin=_to_bytes(data)))

    async def close_stdin(self) -> None:
        await self._send(ppb.ExecStreamRequest(close_stdin=True))

    async def signal(self, sig: int = _signal.SIGTERM) -> None:
        await self._send(ppb.ExecStreamRequest(signal=int(sig)))

    async def resize(self, rows: int, cols: int) -> None:
        await self._send(ppb.ExecStreamRequest(resize_rows=_u32("rows", rows), resize_cols=_u32("cols", cols)))

    async def close(self) -> None:
        if self.result is None:
            self._call.cancel()
        else:
            await self._done_writing()


class AsyncProcessStream:
    """Async twin of warren.process.ProcessStream."""

    def __init__(self, call: Any):
        self._call = call
        self._cancelled = False
        self.result: Optional[ExecResult] = None

    async def __aiter__(self) -> AsyncIterator[OutputChunk]:
        try:
            async for ev in self._call:
                kind = ev.WhichOneof("event")
                if kind == "output":
                    yield OutputChunk._from_pb(ev.output)
                elif kind == "exit":
                    self.result = ExecResult._from_pb(ev.exit)
        except grpc.RpcError as e:
            if self._cancelled and e.code() == grpc.StatusCode.CANCELLED:
                return
            raise errors.from_rpc_error(e) from None
        except asyncio.CancelledError:
            if self._cancelled:
                return
            raise

    def close(self) -> None:
        self._cancelled = True
        self._call.cancel()


class AsyncProcess:
    """Async twin of warren.process.Process."""

    def __init__(self, sb: "AsyncSandbox", process_id: str, info: Optional[ProcessInfo] = None):
        self._sb = sb
        self.id = process_id
        self.sandbox_id = sb.id
        self._stub = sb._client._processes
        self._md = sb._client._metadata
        self._info = info

    def __repr__(self) -> str:
        return f"AsyncProcess(sandbox_id={self.sandbox_id!r}, id={self.id!r})"

    def _ref(self) -> "ppb.ProcessRef":
        return ppb.ProcessRef(sandbox_id=self.sandbox_id, process_id=self.id)

    @property
    def cached_info(self) -> Optional[ProcessInfo]:
        return self._info

    async def info(self) -> ProcessInfo:
        self._info = ProcessInfo._from_pb(await _rpc(self._stub.Get(self._ref(), metadata=self._md)))
        return self._info

    async def wait(self, timeout: Optional[float] = None) -> ExecResult:
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = _WAIT_SLICE_S if end is None else max(0.0, min(_WAIT_SLICE_S, end - time.monotonic()))
            p = await _rpc(self._stub.Wait(ppb.WaitProcessRequest(ref=self._ref(), timeout_ms=int(left * 1000)),
                                           metadata=self._md, timeout=left + 30))
            self._info = ProcessInfo._from_pb(p)
            if not self._info.running:
                assert self._info.result is not None
                return self._info.result
            if end is not None and time.monotonic() >= end:
                raise errors.DeadlineExceeded(f"process {self.id} still running after {timeout} s")

    async def signal(self, sig: int, group_only: bool = False) -> None:
        await _rpc(self._stub.Signal(ppb.SignalProcessRequest(ref=self._ref(), signal=int(sig),
                                                              group_only=group_only), metadata=self._md))

    async def kill(self, sig: int = _signal.SIGKILL) -> None:
        await self.signal(sig)

    async def send_stdin(self, data: Union[bytes, str]) -> None:
        await _rpc(self._stub.Input(ppb.ProcessInputRequest(ref=self._ref(), data=_to_bytes(data)),
                                    metadata=self._md))

    async def close_stdin(self) -> None:
        await _rpc(self._stub.Input(ppb.ProcessInputRequest(ref=self._ref(), close=True), metadata=self._md))

    async def resize(self, rows: int, cols: int) -> None:
        await _rpc(self._stub.Resize(ppb.ResizeRequest(ref=self._ref(), rows=_u32("rows", rows),
                                                       cols=_u32("cols", cols)), metadata=self._md))

    async def output(self, stdout_offset: int = 0, stderr_offset: int = 0) -> ProcessOutput:
        parts: Dict[str, List[bytes]] = {STDOUT: [], STDERR: []}
        start = {STDOUT: stdout_offset, STDERR: stderr_offset}
        end = dict(start)
        dropped = {STDOUT: 0, STDERR: 0}
        first = {STDOUT: True, STDERR: True}
        result: Optional[ExecResult] = None
        st = self.stream(stdout_offset, stderr_offset, follow=False, timeout=60)
        async for c in st:
            if c.stream not in parts:
                continue
            if first[c.stream]:
                first[c.stream] = False
                start[c.stream] = c.offset
                dropped[c.stream] = c.dropped
            parts[c.stream].append(c.data)
            end[c.stream] = c.offset + len(c.data)
        result = st.result
        return ProcessOutput(stdout=b"".join(parts[STDOUT]), stderr=b"".join(parts[STDERR]),
                             stdout_offset=start[STDOUT], stderr_offset=start[STDERR],
                             stdout_dropped=dropped[STDOUT], stderr_dropped=dropped[STDERR],
                             stdout_end=end[STDOUT], stderr_end=end[STDERR], result=result)

    def stream(self, stdout_offset: int = 0, stderr_offset: int = 0, control_offset: int = 0,
               follow: bool = True, timeout: Optional[float] = None) -> AsyncProcessStream:
        req = ppb.ProcessOutputRequest(ref=self._ref(), stdout_offset=stdout_offset, stderr_offset=stderr_offset,
                                       control_offset=control_offset, follow=follow)
        return AsyncProcessStream(self._stub.Output(req, metadata=self._md, timeout=timeout))


class AsyncSession:
    """Async twin of warren.process.Session (same protocol: see there).
    Make one with ``await sb.session()``."""

    def __init__(self, process: AsyncProcess):
        self.process = process
        self.id = process.id
        self._lock = asyncio.Lock()
        self._off = [0, 0, 0]
        self._closed = False

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.process.kill()
        except errors.NotFound:
            pass

    async def run(self, cmd: Union[str, bytes], timeout: Optional[float] = None) -> ExecResult:
        data = cmd.encode("utf-8", "surrogateescape") if isinstance(cmd, str) else bytes(cmd)
        if b"\0" in data:
            raise errors.InvalidArgument("session command contains NUL")
        if timeout is not None and timeout <= 0:
            raise errors.InvalidArgument(f"timeout must be > 0 seconds, got {timeout}")
        async with self._lock:
            return await self._run_locked(data, timeout)

    async def _run_locked(self, data: bytes, timeout: Optional[float]) -> ExecResult:
        if self._closed:
            raise errors.FailedPrecondition(f"session {self.id} is closed")
        t0 = time.monotonic()
        cmdr = _SessionCommand(data, self._off)
        await self.process.send_stdin(cmdr.input)
        timed_out = resent = False
        end = None if timeout is None else t0 + timeout
        while cmdr.pending():
            left = None if end is None else max(0.01, end - time.monotonic())
            st = self.process.stream(self._off[0], self._off[1], self._off[2], follow=True, timeout=left)
            try:
                ended = True
                async for c in st:
                    if cmdr.feed(c):
                        ended = False
                        break
                if ended and cmdr.rc is None:
                    self._closed = True
                    raise errors.FailedPrecondition(f"session {self.id}: the shell exited")
            except errors.DeadlineExceeded:
                if cmdr.rc is None and not timed_out:
                    timed_out = True
                    await self.process.signal(_signal.SIGINT, group_only=True)
                    end = time.monotonic() + _INTERRUPT_GRACE_S
                    continue
                if cmdr.rc is None and not resent:
                    resent = True
                    await self.process.send_stdin(cmdr.resend())
                    end = time.monotonic() + _INTERRUPT_GRACE_S
                    continue
                raise errors.DeadlineExceeded(f"session {self.id}: the shell does not answer") from None
            finally:
                st.close()
        return cmdr.result(t0, timed_out)


class AsyncSandbox:
    """Async twin of warren.Sandbox; ``async with`` destroys it on exit."""

    def __init__(self, client: "AsyncClient", info: SandboxInfo):
        self._client = client
        self._info = info
        self.id: str = info.id
        self.files = AsyncFiles(self)

    def __repr__(self) -> str:
        return f"AsyncSandbox(id={self.id!r})"

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.destroy()
        except errors.NotFound:
            pass

    @property
    def cached_info(self) -> SandboxInfo:
        return self._info

    async def info(self) -> SandboxInfo:
        self._info = await self._client._get_info(self.id)
        return self._info

    async def destroy(self, timeout: Optional[float] = None) -> None:
        await self._client.destroy(self.id, timeout)

    async def exec(self, cmd: Cmd, *, env: Optional[Mapping[str, Union[str, bytes]]] = None,
                   cwd: Optional[str] = None, user: Optional[str] = None,
                   stdin: Optional[Union[bytes, str]] = None, timeout: Optional[float] = None,
                   output_cap: Optional[int] = None, kill_grace: Optional[float] = None,
                   request_id: Optional[str] = None, on_stdout: Any = None, on_stderr: Any = None) -> ExecResult:
        """See warren.Sandbox.exec; on_stdout/on_stderr may be plain functions or coroutine functions."""
        if on_stdout is not None or on_stderr is not None:
            if request_id:
                raise errors.InvalidArgument("exec: request_id cannot be combined with on_stdout/on_stderr")
            st = self.exec_stream(cmd, env=env, cwd=cwd, user=user, stdin=stdin, timeout=timeout,
                                  kill_grace=kill_grace, _collect=output_cap or 16 << 20)
            async with st:
                await st.close_stdin()  # as exec: EOF after the stdin bytes
                async for c in st:
                    cb = on_stdout if c.stream == STDOUT else on_stderr if c.stream == STDERR else None
                    if cb is not None:
                        r = cb(c.data)
                        if asyncio.iscoroutine(r):
                            await r
                assert st.result is not None
                return st.result
        req, deadline = _exec_request(self.id, cmd, env=env, cwd=cwd, user=user, stdin=stdin, timeout=timeout,
                                      output_cap=output_cap, kill_grace=kill_grace, request_id=request_id)
        return ExecResult._from_pb(await _rpc(self._client._sandboxes.Exec(
            req, metadata=self._client._metadata, timeout=deadline)))

    # ---- processes (issue 3)
    def exec_stream(self, cmd: Cmd, *, env: Optional[Mapping[str, Union[str, bytes]]] = None,
                    cwd: Optional[str] = None, user: Optional[str] = None,
                    stdin: Optional[Union[bytes, str]] = None, timeout: Optional[float] = None,
                    kill_grace: Optional[float] = None, pty: bool = False, rows: Optional[int] = None,
                    cols: Optional[int] = None, _collect: int = 0) -> AsyncExecStream:
        """See warren.Sandbox.exec_stream (not a coroutine: returns the stream at once)."""
        req = _proc_request(self.id, cmd, env, cwd, user, stdin, timeout, kill_grace)
        first = ppb.ExecStreamRequest(exec=req, options=_start_options(pty, rows, cols))
        call = self._client._processes.ExecStream(metadata=self._client._metadata)
        st = AsyncExecStream(call, _collect)

        async def send_first() -> None:
            try:
                await call.write(first)
            except (grpc.RpcError, asyncio.InvalidStateError):
                pass  # surfaces when iterating

        st._first = asyncio.ensure_future(send_first())
        return st

    async def spawn(self, cmd: Cmd, *, env: Optional[Mapping[str, Union[str, bytes]]] = None,
                    cwd: Optional[str] = None, user: Optional[str] = None,
                    stdin: Optional[Union[bytes, str]] = None, timeout: Optional[float] = None,
                    kill_grace: Optional[float] = None, pty: bool = False, rows: Optional[int] = None,
                    cols: Optional[int] = None, buffer_bytes: Optional[int] = None,
                    control_fd: bool = False) -> AsyncProcess:
        req = _proc_request(self.id, cmd, env, cwd, user, stdin, timeout, kill_grace)
        opts = _start_options(pty, rows, cols, control_fd, buffer_bytes)
        info = ProcessInfo._from_pb(await _rpc(self._client._processes.Spawn(
            ppb.SpawnRequest(exec=req, options=opts), metadata=self._client._metadata)))
        return AsyncProcess(self, info.id, info)

    async def process(self, process_id: str) -> AsyncProcess:
        p = AsyncProcess(self, process_id)
        await p.info()
        return p

    async def processes(self) -> List[ProcessInfo]:
        r = await _rpc(self._client._processes.List(ppb.ListProcessesRequest(sandbox_id=self.id),
                                                     metadata=self._client._metadata))
        return [ProcessInfo._from_pb(p) for p in r.processes]

    async def session(self, cwd: Optional[str] = None, env: Optional[Mapping[str, Union[str, bytes]]] = None,
                      user: Optional[str] = None) -> AsyncSession:
        e: Dict[str, Union[str, bytes]] = {"PS1": "", "PS2": "", "PS0": "", "HISTFILE": "/dev/null"}
        e.update(env or {})
        p = await self.spawn(_SESSION_ARGV, env=e, cwd=cwd, user=user, control_fd=True,
                             buffer_bytes=SESSION_BUFFER_BYTES)
        s = AsyncSession(p)
        r = await s._run_locked(b"set +H +o history; unset PROMPT_COMMAND; true", 60.0)
        if r.exit_code != 0:
            raise errors.Internal(f"session shell did not start: {r!r}")
        return s

    # ---- lifecycle (issue 4): see warren.Sandbox
    async def pause(self) -> SandboxInfo:
        self._info = SandboxInfo._from_pb(await _rpc(self._client._lifecycle.Pause(
            pb.PauseRequest(id=self.id), metadata=self._client._metadata)))
        return self._info

    async def resume(self) -> SandboxInfo:
        self._info = SandboxInfo._from_pb(await _rpc(self._client._lifecycle.Resume(
            pb.ResumeRequest(id=self.id), metadata=self._client._metadata)))
        return self._info

    async def suspend(self) -> SandboxInfo:
        return await asyncio.to_thread(self._sb.suspend)

    async def extend_ttl(self, ttl_s: int) -> SandboxInfo:
        self._info = SandboxInfo._from_pb(await _rpc(self._client._lifecycle.ExtendTtl(
            pb.ExtendTtlRequest(id=self.id, ttl_s=int(ttl_s)), metadata=self._client._metadata)))
        return self._info

    async def snapshot(self, name: Optional[str] = None, exclude: Sequence[str] = (), pause: bool = True,
                       timeout: Optional[float] = None) -> Snapshot:
        r = await _rpc(self._client._lifecycle.Snapshot(
            pb.SnapshotRequest(id=self.id, name=name or "", exclude=list(exclude), no_pause=not pause),
            metadata=self._client._metadata, timeout=timeout))
        return Snapshot(layer=Layer._from_pb(r.layer), layers=list(r.layers))

    async def fork(self, n: int, **create_kwargs: Any) -> List["AsyncSandbox"]:
        if not isinstance(n, int) or n < 1:
            raise errors.InvalidArgument(f"fork: n={n!r} must be an int >= 1")
        snap = await self.snapshot()
        info = self._info
        kw: Dict[str, Any] = dict(backend=info.backend, memory_mb=info.resources.memory_mb,
                                  disk_mb=info.resources.disk_mb, pids=info.resources.pids,
                                  labels=info.labels, job=info.job or None)
        kw.update(create_kwargs)
        out: List[AsyncSandbox] = []
        try:
            for _ in range(n):
                out.append(await self._client.create(layers=snap.layers, **kw))
        except BaseException:
            for s in out:
                try:
                    await s.destroy()
                except errors.WarrenError:
                    pass
            raise
        return out

    async def grade(self, grader: Cmd, protected: Sequence[str] = (), timeout: Optional[float] = None,
                    env: Optional[Mapping[str, Union[str, bytes]]] = None, cwd: Optional[str] = None,
                    solution: Optional[Sequence[str]] = None) -> GradeResult:
        req = _grade_request(self.id, grader, protected, timeout, env, cwd, solution)
        return _grade_result(await _rpc(self._client._lifecycle.Grade(req, metadata=self._client._metadata)))

    async def audit_log(self) -> List[Dict[str, Any]]:
        r = await _rpc(self._client._lifecycle.AuditLog(pb.AuditLogRequest(id=self.id),
                                                        metadata=self._client._metadata))
        return [json.loads(e) for e in r.entries]


class AsyncLayers:
    """Async twin of warren.Layers."""

    def __init__(self, client: "AsyncClient"):
        self._client = client
        self._stub = pb_grpc.LayersStub(client._channel)

    async def build(self, name: str, dir: Optional[str] = None, tar: Any = None,
                    timeout: Optional[float] = None) -> Layer:
        if (dir is None) == (tar is None):
            raise errors.InvalidArgument("layers.build: give exactly one of dir= or tar=")
        md = self._client._metadata
        if dir is not None:
            req = pb.BuildLayerRequest(name=name, source_dir=os.path.abspath(dir))

            async def one() -> AsyncIterator[pb.BuildLayerRequest]:
                yield req

            return Layer._from_pb(await _rpc(self._stub.Build(one(), metadata=md, timeout=timeout)))
        f = open(tar, "rb") if isinstance(tar, (str, os.PathLike)) else tar

        async def requests() -> AsyncIterator[pb.BuildLayerRequest]:
            yield pb.BuildLayerRequest(name=name)
            for chunk in _chunks(f):
                yield pb.BuildLayerRequest(tar_chunk=chunk)

        try:
            return Layer._from_pb(await _rpc(self._stub.Build(requests(), metadata=md, timeout=timeout)))
        finally:
            if f is not tar:
                f.close()

    async def list(self) -> List[Layer]:
        r = await _rpc(self._stub.List(pb.ListLayersRequest(), metadata=self._client._metadata))
        return [Layer._from_pb(l) for l in r.layers]

    async def get(self, ref: str) -> Layer:
        return Layer._from_pb(await _rpc(self._stub.Get(pb.GetLayerRequest(ref=ref),
                                                        metadata=self._client._metadata)))

    async def remove(self, ref: str) -> None:
        await _rpc(self._stub.Remove(pb.RemoveLayerRequest(ref=ref), metadata=self._client._metadata))


class AsyncJob:
    """Async twin of warren.lifecycle.Job."""

    def __init__(self, client: "AsyncClient", name: str):
        if not name:
            raise errors.InvalidArgument("job name is empty")
        self._client = client
        self.name = name

    def __repr__(self) -> str:
        return f"AsyncJob(name={self.name!r})"

    async def heartbeat(self, lease_s: Optional[int] = None, grace_s: Optional[int] = None) -> JobInfo:
        return JobInfo._from_pb(await _rpc(self._client._lifecycle.JobHeartbeat(
            pb.JobHeartbeatRequest(job=self.name, lease_s=int(lease_s or 0), grace_s=int(grace_s or 0)),
            metadata=self._client._metadata)))

    async def info(self) -> JobInfo:
        return JobInfo._from_pb(await _rpc(self._client._lifecycle.GetJob(
            pb.JobRequest(job=self.name), metadata=self._client._metadata)))

    async def list(self) -> List[AsyncSandbox]:
        return await self._client.list(job=self.name)

    async def _action(self, rpc: str) -> int:
        r = await _rpc(getattr(self._client._lifecycle, rpc)(pb.JobRequest(job=self.name),
                                                             metadata=self._client._metadata))
        return r.affected

    async def suspend(self) -> int:
        return await self._action("SuspendJob")

    async def resume(self) -> int:
        return await self._action("ResumeJob")

    async def destroy(self) -> int:
        return await self._action("DestroyJob")


class AsyncClient:
    """Async twin of warren.Client (same arguments), on one grpc.aio channel."""

    def __init__(self, addr: Optional[str] = None, token: Optional[str] = None):
        self.addr = addr or os.environ.get("WARREN_ADDR") or "unix:/run/warren/warrend.sock"
        token = token if token is not None else os.environ.get("WARREN_TOKEN")
        self._metadata: Optional[List[Tuple[str, str]]] = (
            [("authorization", f"Bearer {token}")] if token else None)
        self._channel = grpc.aio.insecure_channel(
            _target(self.addr),
            options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)])
        self._sandboxes = pb_grpc.SandboxesStub(self._channel)
        self._node = pb_grpc.NodeStub(self._channel)
        self._files = pb_grpc.FilesStub(self._channel)
        self._lifecycle = pb_grpc.LifecycleStub(self._channel)
        self._processes = ppb_grpc.ProcessesStub(self._channel)
        self.layers = AsyncLayers(self)
        self._abandons: "set[asyncio.Task[None]]" = set()  # see _abandon_create

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the channel; calls in flight are cancelled. Abandons of
        given-up creates still running get up to 5 s first."""
        if self._abandons:
            await asyncio.wait(list(self._abandons), timeout=5.0)
        await self._channel.close()

    async def create(self, backend: str = "container", layers: Sequence[str] = (), *,
                     timeout: Optional[float] = None, retries: int = 0, **kwargs: Any) -> AsyncSandbox:
        """See warren.Client.create. retries: how many times a retryable
        refusal (ResourceExhausted: node busy/full; Unavailable) is retried,
        with jittered exponential backoff from 10 ms up to 1 s."""
        own_key = kwargs.get("request_id") is None
        kwargs["request_id"] = kwargs.get("request_id") or _new_request_id()
        req = _create_request(backend, layers, **kwargs)
        delay = 0.01
        for attempt in range(retries + 1):
            try:
                # A retry after Unavailable carries the same key: it returns
                # the sandbox if the first attempt made it.
                s = await _rpc(self._sandboxes.Create(req, metadata=self._metadata, timeout=timeout))
                return AsyncSandbox(self, SandboxInfo._from_pb(s))
            except (errors.ResourceExhausted, errors.Unavailable):
                if attempt < retries:
                    await asyncio.sleep(delay * (0.5 + random.random()))
                    delay = min(1.0, delay * 2)
                    continue
                if own_key:
                    self._abandon_create(req.request_id)
                raise
            except (errors.DeadlineExceeded, errors.Cancelled, asyncio.CancelledError):
                if own_key:  # see warren.Client.create
                    self._abandon_create(req.request_id)
                raise
        raise AssertionError("unreachable")

    def _abandon_create(self, request_id: str) -> None:
        """See warren.Client._abandon_create: a task on this loop."""

        async def run() -> None:
            end = time.monotonic() + ABANDON_RETRY_S
            delay = 0.1
            while True:
                try:
                    await self._sandboxes.Destroy(pb.DestroySandboxRequest(create_request_id=request_id),
                                                  metadata=self._metadata, timeout=10)
                    return
                except grpc.RpcError as e:
                    if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) \
                            or time.monotonic() + delay > end:
                        return
                except Exception:  # noqa: BLE001 - the client was closed: nothing left to do
                    return
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)

        task = asyncio.get_running_loop().create_task(run())
        self._abandons.add(task)
        task.add_done_callback(self._abandons.discard)

    async def _get_info(self, sandbox_id: str) -> SandboxInfo:
        return SandboxInfo._from_pb(await _rpc(self._sandboxes.Get(pb.GetSandboxRequest(id=sandbox_id),
                                                                   metadata=self._metadata)))

    async def get(self, sandbox_id: str) -> AsyncSandbox:
        return AsyncSandbox(self, await self._get_info(sandbox_id))

    async def list(self, labels: Optional[Mapping[str, str]] = None, job: Optional[str] = None,
                   timeout: Optional[float] = None) -> List[AsyncSandbox]:
        r = await _rpc(self._sandboxes.List(pb.ListSandboxesRequest(labels=dict(labels or {}), job=job or ""),
                                            metadata=self._metadata, timeout=timeout))
        return [AsyncSandbox(self, SandboxInfo._from_pb(s)) for s in r.sandboxes]

    async def destroy(self, sandbox_id: str, timeout: Optional[float] = None) -> None:
        await _rpc(self._sandboxes.Destroy(pb.DestroySandboxRequest(id=sandbox_id), metadata=self._metadata,
                                           timeout=timeout))

    async def abandon_create(self, request_id: str, timeout: Optional[float] = None) -> None:
        await _rpc(self._sandboxes.Destroy(pb.DestroySandboxRequest(create_request_id=request_id),
                                           metadata=self._metadata, timeout=timeout))

    async def status(self, timeout: Optional[float] = None) -> NodeStatus:
        return NodeStatus._from_pb(await _rpc(self._node.Status(pb.NodeStatusRequest(), metadata=self._metadata,
                                                                timeout=timeout)))

    def job(self, name: str) -> AsyncJob:
        return AsyncJob(self, name)

    async def fncall(self, code: Union[str, bytes], language: str = "python", **kwargs: Any) -> Any:
        """See warren.Client.fncall."""
        from .fncall import FnCallRequest, FnCallResult
        from ._proto import fncall_pb2_grpc as fpb_grpc
        layers = kwargs.pop("layers", ())
        req = FnCallRequest(code=code, language=language, layers=layers, **kwargs)
        stub = fpb_grpc.FnCallStub(self._channel)
        return FnCallResult._from_pb(await _rpc(stub.Call(req._pb(), metadata=self._metadata,
                                                          timeout=req._deadline())))
