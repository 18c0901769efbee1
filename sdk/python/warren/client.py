"""Synchronous client of warrend (api/warren/v1/warren.proto).

A Client is thread-safe: one Client (one gRPC channel) can serve many threads
creating, executing in and destroying sandboxes concurrently.
"""

from __future__ import annotations

import functools
import io
import os
import secrets
import threading
import time
from typing import (Any, BinaryIO, Callable, Dict, Iterable, Iterator, List,
                    Mapping, Optional, Sequence, Tuple, TypeVar, Union)

import grpc

from . import errors
from ._proto import warren_pb2 as pb
from ._proto import warren_pb2_grpc as pb_grpc
from .types import ExecResult, FileInfo, Layer, NodeStatus, SandboxInfo

if False:  # typing only (lifecycle imports this module)
    from .lifecycle import GradeResult, Job, JobInfo, Lifecycle, Snapshot  # noqa: F401
    from .process import ExecStream, Process, ProcessInfo, Session  # noqa: F401


def ppb_first(req: "pb.ExecRequest", options: Any) -> Any:
    """First message of a streaming exec (warren.process)."""
    from ._proto import process_pb2 as ppb
    return ppb.ExecStreamRequest(exec=req, options=options)

__all__ = ["Client", "Sandbox", "Files", "Layers", "DEFAULT_ADDR", "CHUNK_SIZE"]

DEFAULT_ADDR = "unix:/run/warren/warrend.sock"
# Size of the data chunks of streamed uploads (files, layer tars): 1 MiB.
CHUNK_SIZE = 1 << 20
# Largest value of a uint32 field.
_U32_MAX = (1 << 32) - 1
# Seconds added to an exec's timeout to form its RPC deadline: covers the
# SIGTERM→SIGKILL grace period, output transfer and queueing in the daemon.
EXEC_DEADLINE_MARGIN_S = 30.0
# Bytes kept per stream by the daemon at most (ExecRequest.output_cap_bytes).
MAX_OUTPUT_CAP = 256 << 20

PathLike = Union[str, bytes, "os.PathLike[str]"]
Data = Union[bytes, bytearray, memoryview, str, BinaryIO, Iterable[Union[bytes, str]]]
T = TypeVar("T")


def _call(fn: Callable[..., T]) -> Callable[..., T]:
    """Turns grpc.RpcError raised by fn into the matching WarrenError."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None
        except ValueError as e:
            w = errors.from_closed_channel(e)
            if w is None:
                raise
            raise w from None

    return wrapper


def _target(addr: str) -> str:
    """gRPC target of an address: "unix:/path", "/path" (a unix socket) or
    "host:port" (TCP)."""
    if addr.startswith("unix:"):
        return addr
    if addr.startswith("/"):
        return "unix:" + addr
    return addr


def _path_bytes(path: PathLike) -> bytes:
    if isinstance(path, bytes):
        return path
    return os.fsencode(os.fspath(path))


def _u32(name: str, value: Optional[Union[int, float]]) -> int:
    """Validates an optional unsigned 32-bit limit (None = node default)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.InvalidArgument(f"{name} must be an integer, got {value!r}")
    if value < 0:
        raise errors.InvalidArgument(f"{name} must be >= 0, got {value}")
    if value > _U32_MAX:
        raise errors.InvalidArgument(f"{name} too large: {value} > {_U32_MAX}")
    return value


def _env_pb(env: Optional[Mapping[str, Union[str, bytes]]]) -> Dict[str, bytes]:
    """Env values are sent byte-exact; keys are validated by the daemon
    (non-empty, no '=' or NUL: InvalidArgument naming the key)."""
    out: Dict[str, bytes] = {}
    for k, v in (env or {}).items():
        if not isinstance(k, str):
            raise errors.InvalidArgument(f"env key must be str, got {k!r}")
        out[k] = v if isinstance(v, bytes) else os.fsencode(str(v))
    return out


def _check_data(data: Any) -> None:
    """Raises InvalidArgument unless data is something _chunks can send."""
    if isinstance(data, (str, bytes, bytearray, memoryview)) or hasattr(data, "read"):
        return
    if isinstance(data, Mapping) or not hasattr(data, "__iter__"):
        raise errors.InvalidArgument(
            "data must be bytes, str, a binary file object or an iterable of bytes, "
            f"got {type(data).__name__}")


def _chunks(data: Data) -> Iterator[bytes]:
    """Yields data in chunks of at most CHUNK_SIZE bytes; a file-like object
    or an iterable of bytes/str pieces is consumed lazily (never loaded
    whole)."""
    _check_data(data)
    if isinstance(data, str):
        data = data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        mv = memoryview(data)
        for off in range(0, len(mv), CHUNK_SIZE):
            yield bytes(mv[off:off + CHUNK_SIZE])
        return
    if not hasattr(data, "read"):
        for piece in data:
            if isinstance(piece, str):
                piece = piece.encode("utf-8")
            if not isinstance(piece, (bytes, bytearray, memoryview)):
                raise errors.InvalidArgument(
                    f"data: an iterable must yield bytes or str pieces, got {type(piece).__name__}")
            mv = memoryview(piece)
            for off in range(0, len(mv), CHUNK_SIZE):
                yield bytes(mv[off:off + CHUNK_SIZE])
        return
    while True:
        chunk = data.read(CHUNK_SIZE)
        if not chunk:
            return
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8")
        yield chunk


class _RequestErrors:
    """Keeps an exception raised while gRPC iterated a request stream (gRPC
    reports it only as UNKNOWN "Exception iterating requests!"), so the
    caller raises the real one."""

    def __init__(self) -> None:
        self.error: Optional[BaseException] = None

    def wrap(self, gen: Iterator[Any]) -> Iterator[Any]:
        try:
            yield from gen
        except Exception as e:  # noqa: BLE001 - re-raised by the caller
            self.error = e
            raise

    def reraise(self, e: BaseException) -> None:
        if self.error is not None:
            raise self.error from None
        raise e


def _exec_request(sandbox_id: str, cmd: Union[str, bytes, Sequence[Union[str, bytes]]], *,
                  env: Optional[Mapping[str, Union[str, bytes]]] = None, cwd: Optional[str] = None,
                  user: Optional[str] = None, stdin: Optional[Union[bytes, str]] = None,
                  timeout: Optional[float] = None, output_cap: Optional[int] = None,
                  kill_grace: Optional[float] = None,
                  request_id: Optional[str] = None) -> Tuple["pb.ExecRequest", Optional[float]]:
    """The ExecRequest of Sandbox.exec and its RPC deadline (shared with warren.aio)."""
    req = pb.ExecRequest(sandbox_id=sandbox_id, env=_env_pb(env), cwd=cwd or "",
                         user=user or "", request_id=request_id or "")
    if isinstance(cmd, (str, bytes)):
        req.shell = cmd if isinstance(cmd, bytes) else cmd.encode("utf-8", "surrogateescape")
    else:
        argv = [a if isinstance(a, bytes) else os.fsencode(a) for a in cmd]
        if not argv:
            raise errors.InvalidArgument("exec: empty argv")
        req.argv.extend(argv)
    if stdin is not None:
        req.stdin = stdin.encode("utf-8") if isinstance(stdin, str) else bytes(stdin)
    deadline: Optional[float] = None
    if timeout is not None:
        if timeout <= 0:
            raise errors.InvalidArgument(f"exec: timeout must be > 0 seconds, got {timeout}")
        ms = max(1, int(round(timeout * 1000)))
        req.timeout_ms = _u32("timeout (ms)", ms)
        grace = kill_grace if kill_grace is not None else 0.5
        deadline = timeout + grace + EXEC_DEADLINE_MARGIN_S
    if kill_grace is not None:
        if kill_grace < 0:
            raise errors.InvalidArgument(f"exec: kill_grace must be >= 0, got {kill_grace}")
        req.kill_grace_ms = _u32("kill_grace (ms)", int(round(kill_grace * 1000)))
    if output_cap is not None:
        if isinstance(output_cap, bool) or not isinstance(output_cap, int) or \
                not 0 < output_cap <= MAX_OUTPUT_CAP:
            raise errors.InvalidArgument(
                f"exec: output_cap must be in [1, {MAX_OUTPUT_CAP}] bytes, got {output_cap!r}")
        req.output_cap_bytes = output_cap
    return req, deadline


def _create_request(backend: str, layers: Sequence[str], *, cpu: Optional[float] = None,
                    memory_mb: Optional[int] = None, disk_mb: Optional[int] = None,
                    pids: Optional[int] = None, open_files: Optional[int] = None,
                    tmpfs_mb: Optional[int] = None,
                    env: Optional[Mapping[str, Union[str, bytes]]] = None,
                    workdir: Optional[str] = None, user: Optional[str] = None,
                    hostname: Optional[str] = None, labels: Optional[Mapping[str, str]] = None,
                    ttl_s: Optional[int] = None, job: Optional[str] = None,
                    idle_timeout_s: Optional[int] = None,
                    request_id: Optional[str] = None) -> "pb.CreateSandboxRequest":
    """The CreateSandboxRequest of Client.create (shared with warren.aio)."""
    res = pb.Resources(
        memory_mb=_u32("memory_mb", memory_mb), disk_mb=_u32("disk_mb", disk_mb),
        pids=_u32("pids", pids), open_files=_u32("open_files", open_files),
        tmpfs_mb=_u32("tmpfs_mb", tmpfs_mb))
    if cpu is not None:
        if isinstance(cpu, bool) or not isinstance(cpu, (int, float)) or not cpu > 0:
            raise errors.InvalidArgument(f"cpu must be a number of cores > 0, got {cpu!r}")
        millis = int(round(cpu * 1000))
        res.cpu_millis = _u32("cpu (millicores)", max(1, millis))
    req = pb.CreateSandboxRequest(
        backend=backend, layers=list(layers), resources=res, env=_env_pb(env),
        workdir=workdir or "", user=user or "", hostname=hostname or "",
        labels=dict(labels or {}), ttl_s=_u32("ttl_s", ttl_s), job=job or "",
        idle_timeout_s=_u32("idle_timeout_s", idle_timeout_s), request_id=request_id or "")
    return req


# A create whose RPC ended without an answer from the daemon (the client's
# deadline passed, the call was cancelled or the connection broke) may still
# have made a sandbox the client will never learn about: the SDK abandons it
# by its request id (CreateSandboxRequest.request_id).
_CREATE_GIVEN_UP = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                    grpc.StatusCode.UNAVAILABLE)
# How long an abandon is retried while the daemon is unreachable (restarting).
ABANDON_RETRY_S = 60.0


def _new_request_id() -> str:
    return "sdk-" + secrets.token_hex(12)


class Files:
    """File API of one sandbox (``sb.files``). Paths are absolute inside the
    sandbox (relative ones are taken from "/"), str (encoded with
    surrogateescape) or bytes. They are resolved inside the sandbox root:
    ".." never climbs above its "/".

    Errors: NotFound (missing path), PermissionDenied, InvalidArgument,
    ResourceExhausted (no space left), FailedPrecondition (sandbox not
    running, directory not empty), each naming the path.
    """

    def __init__(self, sandbox: "Sandbox"):
        self._sb = sandbox
        self._stub = sandbox._client._files  # one stub per client: making one costs ~0.1 ms

    def _md(self) -> Optional[List[Tuple[str, str]]]:
        return self._sb._client._metadata

    @_call
    def write(self, path: PathLike, data: Data, mode: int = 0o644,
              make_parents: bool = False, timeout: Optional[float] = None,
              request_id: Optional[str] = None) -> int:
        """Creates or replaces the file at path with data (bytes, str as UTF-8,
        a binary file object read in 1 MiB chunks, or an iterable of bytes/str
        pieces; any size, streamed). Other types: InvalidArgument.
        mode: permission bits of a new file. make_parents: create missing
        parent directories (0755). Returns the number of bytes written.
        timeout: RPC deadline in seconds (None = none)."""
        p = _path_bytes(path)
        mode = _u32("mode", mode) & 0o7777

        def requests() -> Iterator[pb.WriteFileRequest]:
            first = True
            for chunk in _chunks(data):
                if first:
                    first = False
                    yield pb.WriteFileRequest(sandbox_id=self._sb.id, path=p, mode=mode,
                                              make_parents=make_parents, data=chunk,
                                              request_id=request_id or "")
                else:
                    yield pb.WriteFileRequest(data=chunk)
            if first:  # empty file: the header alone
                yield pb.WriteFileRequest(sandbox_id=self._sb.id, path=p, mode=mode,
                                          make_parents=make_parents, request_id=request_id or "")

        _check_data(data)
        req_errors = _RequestErrors()
        try:
            resp = self._stub.Write(req_errors.wrap(requests()), metadata=self._md(), timeout=timeout)
        except grpc.RpcError as e:
            req_errors.reraise(e)
        return resp.bytes_written

    def read_stream(self, path: PathLike, offset: int = 0, length: int = 0,
                    timeout: Optional[float] = None) -> Iterator[bytes]:
        """Yields the file's bytes in chunks of at most 1 MiB, from offset
        (bytes), length bytes (0 = to the end). Errors are raised while
        iterating."""
        req = pb.ReadFileRequest(sandbox_id=self._sb.id, path=_path_bytes(path),
                                 offset=_u32_or_u64("offset", offset),
                                 length=_u32_or_u64("length", length))
        try:
            for chunk in self._stub.Read(req, metadata=self._md(), timeout=timeout):
                yield bytes(chunk.data)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None
        except ValueError as e:
            w = errors.from_closed_channel(e)
            if w is None:
                raise
            raise w from None

    def read(self, path: PathLike, offset: int = 0, length: int = 0,
             timeout: Optional[float] = None) -> bytes:
        """Returns the file's bytes (byte-exact), see read_stream."""
        buf = io.BytesIO()
        for chunk in self.read_stream(path, offset, length, timeout):
            buf.write(chunk)
        return buf.getvalue()

    @_call
    def stat(self, path: PathLike) -> FileInfo:
        """Returns the FileInfo of path (symlinks are not followed at the last
        component). NotFound if it does not exist."""
        return FileInfo._from_pb(self._stub.Stat(
            pb.StatRequest(sandbox_id=self._sb.id, path=_path_bytes(path)),
            metadata=self._md()))

    @_call
    def list(self, path: PathLike) -> List[FileInfo]:
        """Returns the entries of the directory path (no "." or "..")."""
        resp = self._stub.ListDir(
            pb.ListDirRequest(sandbox_id=self._sb.id, path=_path_bytes(path)),
            metadata=self._md())
        return [FileInfo._from_pb(e) for e in resp.entries]

    @_call
    def mkdir(self, path: PathLike, parents: bool = False, mode: int = 0o755) -> None:
        """Creates a directory. parents: like mkdir -p (missing parents are
        created, no error if it exists); otherwise AlreadyExists if it exists."""
        self._stub.Mkdir(pb.MkdirRequest(sandbox_id=self._sb.id, path=_path_bytes(path),
                                         mode=_u32("mode", mode) & 0o7777, parents=parents),
                         metadata=self._md())

    @_call
    def remove(self, path: PathLike, recursive: bool = False) -> None:
        """Removes a file, symlink or empty directory; recursive removes a
        whole tree. FailedPrecondition for a non-empty directory otherwise."""
        self._stub.Remove(pb.RemoveRequest(sandbox_id=self._sb.id, path=_path_bytes(path),
                                           recursive=recursive), metadata=self._md())

    @_call
    def rename(self, src: PathLike, dst: PathLike) -> None:
        """Renames src to dst (replacing dst like rename(2))."""
        self._stub.Rename(pb.RenameRequest(sandbox_id=self._sb.id, to=_path_bytes(dst),
                                           **{"from": _path_bytes(src)}),
                          metadata=self._md())

    def exists(self, path: PathLike) -> bool:
        """True if path exists (a dangling symlink counts as existing)."""
        try:
            self.stat(path)
            return True
        except errors.NotFound:
            return False


def _u32_or_u64(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value >= 1 << 64:
        raise errors.InvalidArgument(f"{name} must be an integer in [0, 2^64), got {value!r}")
    return value


class Sandbox:
    """Handle of one sandbox. Usable as a context manager: leaving the block
    destroys the sandbox. Thread-safe: execs and file calls may run
    concurrently; destroy() makes running execs return promptly."""

    def __init__(self, client: "Client", info: SandboxInfo):
        self._client = client
        self._info = info
        self.id: str = info.id
        self.files = Files(self)

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r})"

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.destroy()
        except errors.NotFound:
            pass

    @property
    def cached_info(self) -> SandboxInfo:
        """The SandboxInfo of the last create/get/list/info call (no RPC)."""
        return self._info

    def info(self) -> SandboxInfo:
        """Fetches the sandbox's current SandboxInfo. NotFound once destroyed."""
        self._info = self._client._get_info(self.id)
        return self._info

    def destroy(self, timeout: Optional[float] = None) -> None:
        """Destroys the sandbox: its processes are killed, its files are gone.
        NotFound if it does not exist (any more). timeout: RPC deadline in
        seconds (None = none)."""
        self._client.destroy(self.id, timeout)

    @_call
    def exec(self, cmd: Union[str, bytes, Sequence[Union[str, bytes]]], *,
             env: Optional[Mapping[str, Union[str, bytes]]] = None,
             cwd: Optional[str] = None, user: Optional[str] = None,
             stdin: Optional[Union[bytes, str]] = None,
             timeout: Optional[float] = None,
             output_cap: Optional[int] = None,
             kill_grace: Optional[float] = None,
             request_id: Optional[str] = None,
             on_stdout: Optional[Callable[[bytes], Any]] = None,
             on_stderr: Optional[Callable[[bytes], Any]] = None) -> ExecResult:
        """Runs a command in the sandbox and waits for it.

        cmd: a str/bytes is run as a shell string (``/bin/sh -c cmd``); a list
            is an argv (argv[0] searched in PATH), items str or bytes.
        env: added to the sandbox env (values byte-exact).
        cwd: working directory (default: the sandbox workdir). user: "root",
            a name from the sandbox's /etc/passwd or "uid[:gid]".
        stdin: bytes (str as UTF-8) fed to stdin, then EOF; None = immediate EOF.
        timeout: seconds; on expiry the whole process tree of the exec gets
            SIGTERM, then SIGKILL after kill_grace seconds (default 0.5); the
            result then has timed_out=True. None = no timeout.
        output_cap: bytes kept per stream (default 16 MiB, max 256 MiB); the
            rest is counted but dropped (stdout_truncated/stderr_truncated).

        Returns an ExecResult: a non-zero exit, a signal, an OOM kill or a
        timeout is an outcome, not an exception. Raises NotFound (unknown
        sandbox), InvalidArgument (bad env key, cwd, user, limits),
        FailedPrecondition (sandbox not running), DeadlineExceeded (the
        daemon did not answer within timeout + EXEC_DEADLINE_MARGIN_S).

        on_stdout / on_stderr: called with each chunk of bytes as the command
        produces it (streaming exec; request_id is then not supported); the
        result is the same ExecResult, its stdout/stderr capped at output_cap.
        """
        if on_stdout is not None or on_stderr is not None:
            if request_id:
                raise errors.InvalidArgument("exec: request_id cannot be combined with on_stdout/on_stderr")
            cap = output_cap if output_cap is not None else 16 << 20
            with self.exec_stream(cmd, env=env, cwd=cwd, user=user, stdin=stdin, timeout=timeout,
                                  kill_grace=kill_grace, _collect=cap) as st:
                st.close_stdin()  # as exec: EOF after the stdin bytes
                for c in st:
                    cb = on_stdout if c.stream == "stdout" else on_stderr if c.stream == "stderr" else None
                    if cb is not None:
                        cb(c.data)
                assert st.result is not None
                return st.result
        req, deadline = _exec_request(self.id, cmd, env=env, cwd=cwd, user=user, stdin=stdin,
                                      timeout=timeout, output_cap=output_cap, kill_grace=kill_grace,
                                      request_id=request_id)
        r = self._client._sandboxes.Exec(req, metadata=self._client._metadata,
                                         timeout=deadline)
        return ExecResult._from_pb(r)

    # ------------------------------------------------------------ processes (issue 3): warren.process
    def exec_stream(self, cmd: Union[str, bytes, Sequence[Union[str, bytes]]], *,
                    env: Optional[Mapping[str, Union[str, bytes]]] = None,
                    cwd: Optional[str] = None, user: Optional[str] = None,
                    stdin: Optional[Union[bytes, str]] = None,
                    timeout: Optional[float] = None, kill_grace: Optional[float] = None,
                    pty: bool = False, rows: Optional[int] = None, cols: Optional[int] = None,
                    _collect: int = 0) -> "ExecStream":
        """Starts cmd (as exec) and returns a warren.process.ExecStream: iterate
        it for OutputChunk(stream, data, offset) as produced, then read
        .result (ExecResult). stdin: first bytes of stdin; unlike exec,
        stdin stays open: more with send_stdin(), EOF with close_stdin()
        (or when the stream is closed). pty: run on a terminal of rows x cols (default 24 x 80;
        stderr merged into stdout). Closing the stream or the client going
        away kills the command's whole tree. Errors as exec (raised when
        iterating)."""
        from .process import ExecStream, _exec_request, _start_options
        req = _exec_request(self.id, cmd, env, cwd, user, stdin, timeout, kill_grace)
        first = ppb_first(req, _start_options(pty, rows, cols))
        return ExecStream(self._client._processes(), first, self._client._metadata, None, _collect)

    @_call
    def spawn(self, cmd: Union[str, bytes, Sequence[Union[str, bytes]]], *,
              env: Optional[Mapping[str, Union[str, bytes]]] = None,
              cwd: Optional[str] = None, user: Optional[str] = None,
              stdin: Optional[Union[bytes, str]] = None,
              timeout: Optional[float] = None, kill_grace: Optional[float] = None,
              pty: bool = False, rows: Optional[int] = None, cols: Optional[int] = None,
              buffer_bytes: Optional[int] = None, control_fd: bool = False) -> "Process":
        """Starts cmd in the background and returns its warren.process.Process
        handle (wait, kill, output, stream, send_stdin, close_stdin, resize).
        The process lives in the daemon, survives this client, and dies with
        the sandbox. stdin: first bytes of stdin (stdin stays open).
        timeout: seconds, then the whole tree gets SIGTERM, SIGKILL after
        kill_grace. buffer_bytes: ring buffer per stream (default 1 MiB, max
        64 MiB). control_fd: a pipe on fd 3 (stream "control").
        Raises ResourceExhausted when the sandbox already runs 64 background
        processes, else as exec."""
        from .process import Process, ProcessInfo, _exec_request, _start_options
        from ._proto import process_pb2 as ppb
        req = _exec_request(self.id, cmd, env, cwd, user, stdin, timeout, kill_grace)
        opts = _start_options(pty, rows, cols, control_fd, buffer_bytes)
        info = ProcessInfo._from_pb(self._client._processes().Spawn(
            ppb.SpawnRequest(exec=req, options=opts), metadata=self._client._metadata))
        return Process(self, info.id, info)

    def process(self, process_id: str) -> "Process":
        """Re-attaches to a background process by id. NotFound if unknown."""
        from .process import Process
        p = Process(self, process_id)
        p.info()
        return p

    @_call
    def processes(self) -> List["ProcessInfo"]:
        """The sandbox's background processes (running and exited), oldest first."""
        from .process import ProcessInfo
        from ._proto import process_pb2 as ppb
        resp = self._client._processes().List(ppb.ListProcessesRequest(sandbox_id=self.id),
                                              metadata=self._client._metadata)
        return [ProcessInfo._from_pb(p) for p in resp.processes]

    def session(self, cwd: Optional[str] = None, env: Optional[Mapping[str, Union[str, bytes]]] = None,
                user: Optional[str] = None) -> "Session":
        """A persistent bash session (warren.process.Session): session.run(cmd,
        timeout) keeps cwd, env and shell variables between commands."""
        from .process import Session
        return Session(self, cwd=cwd, env=env, user=user)

    # ------------------------------------------------------------ lifecycle (issue 4)
    # request_id on exec()/files.write(): a retry with the same id returns the
    # first call's recorded result instead of running again (see warren.proto).

    def pause(self) -> SandboxInfo:
        """Freezes every process of the sandbox; any exec/file call resumes it."""
        self._info = self._client._lifecycle().pause(self.id)
        return self._info

    def resume(self, prefetch: bool = True) -> SandboxInfo:
        """Thaws a paused or suspended sandbox. A suspended one first gets
        its working set prefetched back from swap (every process's mappings
        and the tmpfs upper's files), unless prefetch=False (pages then come
        back on first touch)."""
        self._info = self._client._lifecycle().resume(self.id, prefetch)
        return self._info

    def suspend(self) -> SandboxInfo:
        """Pauses the sandbox and gives its memory back to the host: its
        memory cgroup is reclaimed into swap (zram set up by warrend when the
        host has none). state becomes "suspended"; the returned info carries
        memory_bytes/swap_bytes after the reclaim. Any exec/file call or
        resume() brings it back with processes, open files and files intact.
        Idempotent."""
        self._info = self._client._lifecycle().suspend(self.id)
        return self._info

    def extend_ttl(self, ttl_s: int) -> SandboxInfo:
        """Sets the TTL to ttl_s seconds from now (0 = no TTL)."""
        self._info = self._client._lifecycle().extend_ttl(self.id, ttl_s)
        return self._info

    def snapshot(self, name: Optional[str] = None, exclude: Sequence[str] = (),
                 pause: bool = True, timeout: Optional[float] = None) -> "Snapshot":
        """Packs the sandbox's changes into a layer (pack_diff); exclude:
        fnmatch patterns of absolute paths dropped from it. create(layers=
        snap.layers) starts from that state."""
        return self._client._lifecycle().snapshot(self.id, name, exclude, pause, timeout)

    def fork(self, n: int, **create_kwargs: Any) -> List["Sandbox"]:
        """Snapshot, then n new running sandboxes from it (same resources,
        env, workdir, user unless given in create_kwargs). Raises
        InvalidArgument if n < 1 (before anything is snapshotted)."""
        if not isinstance(n, int) or n < 1:
            raise errors.InvalidArgument(f"fork: n={n!r} must be an int >= 1")
        snap = self.snapshot()
        info = self._info
        kw: Dict[str, Any] = dict(backend=info.backend, memory_mb=info.resources.memory_mb,
                                  disk_mb=info.resources.disk_mb, pids=info.resources.pids,
                                  labels=info.labels, job=info.job or None)
        kw.update(create_kwargs)
        out: List[Sandbox] = []
        try:
            for _ in range(n):
                out.append(self._client.create(layers=snap.layers, **kw))
        except BaseException:
            for s in out:
                try:
                    s.destroy()
                except errors.WarrenError:
                    pass
            raise
        return out

    def grade(self, grader: Union[str, bytes, Sequence[Union[str, bytes]]],
              protected: Sequence[str] = (), timeout: Optional[float] = None,
              env: Optional[Mapping[str, Union[str, bytes]]] = None,
              cwd: Optional[str] = None, solution: Optional[Sequence[str]] = None) -> "GradeResult":
        """Runs grader in a FRESH sandbox built from this sandbox's pristine
        layers (those its creator gave; a fork or a sandbox created from a
        snapshot keeps the pristine layers of the sandbox snapshotted) plus
        its changes under the `solution` paths (required: absolute paths where
        the task's solution lives) and nowhere else. Returns the grader's
        result and every change of the agent outside the solution paths
        (`touched`). `protected` is deprecated: a path inside a solution path
        kept pristine. Raises InvalidArgument without `solution`."""
        return self._client._lifecycle().grade(self.id, grader, protected, timeout, env, cwd, solution)

    def audit_log(self) -> List[Dict[str, Any]]:
        """Every exec and file call on this sandbox (kept by the daemon)."""
        return self._client._lifecycle().audit_log(self.id)


class Layers:
    """Layer API (``client.layers``): read-only EROFS layers named
    "kind/name@version" (kind in base, workspace, toolset) and addressed by
    "sha256:<hex>"."""

    def __init__(self, client: "Client"):
        self._client = client
        self._stub = pb_grpc.LayersStub(client._channel)

    @_call
    def build(self, name: str, dir: Optional[str] = None,
              tar: Optional[Union[str, "os.PathLike[str]", BinaryIO]] = None,
              timeout: Optional[float] = None) -> Layer:
        """Builds (and verifies) a layer and names it.

        Exactly one of dir (a directory on the daemon's host; root only, unix
        socket only) or tar (a path or binary file object of a tar, plain/gz/
        xz/zstd, streamed in 1 MiB chunks; OCI whiteouts honoured).
        Raises InvalidArgument (bad name; a tar entry with an absolute or ".."
        path or a device node, named in the message), AlreadyExists (the
        name@version points at a different digest), PermissionDenied.
        timeout: RPC deadline in seconds (None = none).
        """
        if (dir is None) == (tar is None):
            raise errors.InvalidArgument("layers.build: give exactly one of dir= or tar=")
        md = self._client._metadata
        if dir is not None:
            req = pb.BuildLayerRequest(name=name, source_dir=os.path.abspath(dir))
            return Layer._from_pb(self._stub.Build(iter([req]), metadata=md, timeout=timeout))
        assert tar is not None
        if isinstance(tar, (str, os.PathLike)):
            with open(tar, "rb") as f:
                return self._build_tar(name, f, timeout)
        return self._build_tar(name, tar, timeout)

    def _build_tar(self, name: str, f: BinaryIO, timeout: Optional[float]) -> Layer:
        def requests() -> Iterator[pb.BuildLayerRequest]:
            yield pb.BuildLayerRequest(name=name)
            for chunk in _chunks(f):
                yield pb.BuildLayerRequest(tar_chunk=chunk)

        return Layer._from_pb(self._stub.Build(requests(), metadata=self._client._metadata,
                                               timeout=timeout))

    @_call
    def list(self) -> List[Layer]:
        """All layers in the store."""
        return [Layer._from_pb(l) for l in self._stub.List(
            pb.ListLayersRequest(), metadata=self._client._metadata).layers]

    @_call
    def get(self, ref: str) -> Layer:
        """ref: "kind/name", "kind/name@version" (no version = newest) or
        "sha256:<hex>". NotFound if absent."""
        return Layer._from_pb(self._stub.Get(pb.GetLayerRequest(ref=ref),
                                             metadata=self._client._metadata))

    @_call
    def remove(self, ref: str) -> None:
        """Removes the name (and the image when nothing else points at it).
        FailedPrecondition if a sandbox uses it."""
        self._stub.Remove(pb.RemoveLayerRequest(ref=ref), metadata=self._client._metadata)


class Client:
    """Connection to one warrend.

    addr: "unix:/path" or "/path" (unix socket) or "host:port" (TCP).
        Default: env WARREN_ADDR, else unix:/run/warren/warrend.sock.
    token: bearer token sent as "authorization: Bearer <token>" (needed over
        TCP). Default: env WARREN_TOKEN.

    Thread-safe. Use as a context manager or call close() to release the
    channel. Nothing is contacted until the first call; an unreachable daemon
    raises Unavailable then.
    """

    def __init__(self, addr: Optional[str] = None, token: Optional[str] = None):
        self.addr = addr or os.environ.get("WARREN_ADDR") or DEFAULT_ADDR
        token = token if token is not None else os.environ.get("WARREN_TOKEN")
        self._metadata: Optional[List[Tuple[str, str]]] = (
            [("authorization", f"Bearer {token}")] if token else None)
        self._channel = grpc.insecure_channel(
            _target(self.addr),
            options=[
                # Exec results carry up to 2 x 256 MiB of output.
                ("grpc.max_receive_message_length", -1),
                ("grpc.max_send_message_length", -1),
            ])
        self._sandboxes = pb_grpc.SandboxesStub(self._channel)
        self._node = pb_grpc.NodeStub(self._channel)
        self._files = pb_grpc.FilesStub(self._channel)
        self.layers = Layers(self)
        self._abandons: List[threading.Thread] = []  # background abandons of given-up creates
        self._abandons_lock = threading.Lock()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Closes the channel; calls in flight are cancelled (they raise
        Cancelled, as do later calls). Abandons of given-up creates still
        running get up to 5 s first."""
        end = time.monotonic() + 5.0
        with self._abandons_lock:
            pending = list(self._abandons)
        for t in pending:
            t.join(max(0.0, end - time.monotonic()))
        self._channel.close()

    def _abandon_create(self, request_id: str) -> None:
        """Abandons the create with request_id in a background thread (the
        caller's deadline has passed already): the daemon destroys what that
        create made, now or when it finishes. Retried while the daemon is
        unreachable, for up to ABANDON_RETRY_S."""

        def run() -> None:
            end = time.monotonic() + ABANDON_RETRY_S
            delay = 0.1
            try:
                while True:
                    try:
                        self._sandboxes.Destroy(pb.DestroySandboxRequest(create_request_id=request_id),
                                                metadata=self._metadata, timeout=10)
                        return
                    except grpc.RpcError as e:
                        if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) \
                                or time.monotonic() + delay > end:
                            return
                    except ValueError:  # the client was closed
                        return
                    time.sleep(delay)
                    delay = min(2.0, delay * 2)
            finally:
                with self._abandons_lock:
                    self._abandons.remove(threading.current_thread())

        t = threading.Thread(target=run, name="warren-abandon-create", daemon=True)
        with self._abandons_lock:
            self._abandons.append(t)
        t.start()

    @_call
    def create(self, backend: str = "container", layers: Sequence[str] = (), *,
               cpu: Optional[float] = None, memory_mb: Optional[int] = None,
               disk_mb: Optional[int] = None, pids: Optional[int] = None,
               open_files: Optional[int] = None, tmpfs_mb: Optional[int] = None,
               env: Optional[Mapping[str, Union[str, bytes]]] = None,
               workdir: Optional[str] = None, user: Optional[str] = None,
               hostname: Optional[str] = None,
               labels: Optional[Mapping[str, str]] = None,
               ttl_s: Optional[int] = None, job: Optional[str] = None,
               timeout: Optional[float] = None,
               idle_timeout_s: Optional[int] = None,
               request_id: Optional[str] = None) -> Sandbox:
        """Creates a sandbox and returns it running.

        layers: refs bottom first ("kind/name[@version]" or "sha256:<hex>").
        cpu: cores (float, e.g. 0.5); memory_mb, disk_mb (writable upper cap),
        tmpfs_mb: /dev/shm cap in MiB (/tmp is in the upper, capped by
        disk_mb); pids: max tasks;
        open_files: RLIMIT_NOFILE. None = node default (cpu 1, memory_mb
        2048, disk_mb 1024, pids 1024, open_files 1024, tmpfs_mb 256). ttl_s: seconds of
        life, None = none. timeout: RPC deadline in seconds (None = none).

        When the node already runs its maximum of creates, this one waits in
        the node's FIFO create queue (up to `timeout`, if given).

        Raises InvalidArgument (bad layer ref, limit, env key, workdir, ...),
        NotFound (unknown layer), ResourceExhausted (node full / create queue
        full / disk full: retryable), DeadlineExceeded (timeout passed, also
        while queued), Unavailable (daemon unreachable: retryable).

        request_id: idempotency key (<= 256 bytes): a retry with the same key
        returns the sandbox the first call made instead of a second one. Without
        it, a create that ends without the daemon's answer (DeadlineExceeded,
        Cancelled, Unavailable) leaves nothing behind: the SDK abandons it by
        an internal key (in the background; the daemon destroys what it made).
        With it, that is up to the caller (retry with the same key to get it).
        """
        req = _create_request(backend, layers, cpu=cpu, memory_mb=memory_mb, disk_mb=disk_mb, pids=pids,
                              open_files=open_files, tmpfs_mb=tmpfs_mb, env=env, workdir=workdir, user=user,
                              hostname=hostname, labels=labels, ttl_s=ttl_s, job=job,
                              idle_timeout_s=idle_timeout_s, request_id=request_id or _new_request_id())
        try:
            s = self._sandboxes.Create(req, metadata=self._metadata, timeout=timeout)
        except grpc.RpcError as e:
            if request_id is None and e.code() in _CREATE_GIVEN_UP:
                self._abandon_create(req.request_id)
            raise
        except BaseException:  # KeyboardInterrupt while waiting: the answer will never be read
            if request_id is None:
                self._abandon_create(req.request_id)
            raise
        return Sandbox(self, SandboxInfo._from_pb(s))

    @_call
    def _get_info(self, sandbox_id: str) -> SandboxInfo:
        return SandboxInfo._from_pb(self._sandboxes.Get(
            pb.GetSandboxRequest(id=sandbox_id), metadata=self._metadata))

    def get(self, sandbox_id: str) -> Sandbox:
        """Returns the sandbox with this id. NotFound if there is none."""
        return Sandbox(self, self._get_info(sandbox_id))

    @_call
    def list(self, labels: Optional[Mapping[str, str]] = None,
             job: Optional[str] = None, timeout: Optional[float] = None) -> List[Sandbox]:
        """Sandboxes carrying all of labels (and of job, if given). timeout:
        RPC deadline in seconds (None = none)."""
        resp = self._sandboxes.List(
            pb.ListSandboxesRequest(labels=dict(labels or {}), job=job or ""),
            metadata=self._metadata, timeout=timeout)
        return [Sandbox(self, SandboxInfo._from_pb(s)) for s in resp.sandboxes]

    @_call
    def destroy(self, sandbox_id: str, timeout: Optional[float] = None) -> None:
        """Destroys a sandbox. NotFound if it does not exist. timeout: RPC
        deadline in seconds (None = none)."""
        self._sandboxes.Destroy(pb.DestroySandboxRequest(id=sandbox_id),
                                metadata=self._metadata, timeout=timeout)

    @_call
    def abandon_create(self, request_id: str, timeout: Optional[float] = None) -> None:
        """Gives up the create made with request_id (create(request_id=...)):
        its sandbox is destroyed if it was made, or as soon as it is; a later
        create with that request_id is refused (Cancelled). OK when nothing
        was made."""
        self._sandboxes.Destroy(pb.DestroySandboxRequest(create_request_id=request_id),
                                metadata=self._metadata, timeout=timeout)

    # ------------------------------------------------------------ fncall (issue 5)
    def fncall(self, code: Union[str, bytes], language: str = "python", *,
               stdin: Union[str, bytes] = b"", files: Optional[Mapping[str, Union[str, bytes]]] = None,
               fetch_files: Sequence[str] = (), env: Optional[Mapping[str, Union[str, bytes]]] = None,
               timeout: Optional[float] = None, compile_timeout: Optional[float] = None,
               memory_mb: Optional[int] = None, layers: Sequence[str] = (),
               output_cap: int = 0) -> "FnCallResult":
        """Runs `code` once on the fncall backend's warm pool (see warren.fncall).
        output_cap: bytes kept per stream (0 = 16 MiB); the rest is counted."""
        from .fncall import FnCallRequest
        return self._fncall().call(FnCallRequest(
            code=code, language=language, stdin=stdin, files=dict(files or {}), fetch_files=fetch_files,
            env=dict(env or {}), timeout=timeout, compile_timeout=compile_timeout, memory_mb=memory_mb,
            layers=layers, output_cap=output_cap))

    def fncall_batch(self, requests: Sequence["FnCallRequest"], concurrency: int = 0) -> List["FnCallResult"]:
        """Runs many warren.FnCallRequest concurrently; results in request order."""
        return self._fncall().batch(requests, concurrency)

    def _fncall(self) -> "FnCall":
        from .fncall import FnCall
        if getattr(self, "_fncall_svc", None) is None:
            self._fncall_svc = FnCall(self._channel, self._metadata)
        return self._fncall_svc

    def _processes(self) -> Any:
        if getattr(self, "_processes_stub", None) is None:
            from ._proto import process_pb2_grpc as ppb_grpc
            self._processes_stub = ppb_grpc.ProcessesStub(self._channel)
        return self._processes_stub

    def job(self, name: str) -> "Job":
        """The job `name` (sandboxes created with job=name): heartbeat(),
        list(), suspend(), resume(), destroy()."""
        from .lifecycle import Job
        return Job(self, name)

    def jobs(self) -> List["JobInfo"]:
        """Every job the node knows (with a lease or with sandboxes), by name."""
        return self._lifecycle().list_jobs()

    def _lifecycle(self) -> "Lifecycle":
        from .lifecycle import Lifecycle
        if getattr(self, "_lifecycle_svc", None) is None:
            self._lifecycle_svc = Lifecycle(self)
        return self._lifecycle_svc

    @_call
    def status(self, timeout: Optional[float] = None) -> NodeStatus:
        """Status of the node. Unavailable if the daemon is not reachable."""
        return NodeStatus._from_pb(self._node.Status(
            pb.NodeStatusRequest(), metadata=self._metadata, timeout=timeout))
