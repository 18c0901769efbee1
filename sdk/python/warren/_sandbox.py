"""Core of Sandbox and Files, written once for both sides (see warren._core):
warren.client and warren.aio only pick the side. Client and Layers:
warren._client_core."""

from __future__ import annotations

import io
import json
import os
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Generic,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

from . import errors
from ._core import (
    END,
    Emit,
    Gen,
    Next,
    Open,
    Rpc,
    RpcStreamIn,
    op,
    streaming,
)
from ._proto import process_pb2 as ppb
from ._proto import warren_pb2 as pb
from ._requests import (
    Cmd,
    Data,
    PathLike,
    _check_data,
    _chunks,
    _exec_request,
    _network_pb,
    _new_request_id,
    _path_bytes,
    _proc_request,
    _start_options,
    _u32,
    _u32_or_u64,
)
from .desktop import ScreenImage, _screenshot
from .lifecycle import GradeResult, Snapshot, _grade_request, _grade_result
from .types import ExecResult, ExposedPort, FileInfo, Layer, SandboxInfo

if TYPE_CHECKING:
    from ._client_core import ClientCore
    from .process import ProcessInfo

SB = TypeVar("SB")  # the side's Sandbox
JB = TypeVar("JB")  # the side's Job (warren._client_core)
PR = TypeVar("PR")  # the side's Process
XS = TypeVar("XS")  # the side's ExecStream
SE = TypeVar("SE")  # the side's Session
Env = Optional[Mapping[str, Union[str, bytes]]]


def _port(port: int) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise errors.InvalidArgument(f"port must be an integer in 1..65535, got {port!r}")
    return port


class FilesCore:
    """File API of one sandbox (``sb.files``). Paths are absolute inside the
    sandbox (relative ones are taken from "/"), str (encoded with
    surrogateescape) or bytes. They are resolved inside the sandbox root:
    ".." never climbs above its "/".

    Errors: NotFound (missing path), PermissionDenied, InvalidArgument,
    ResourceExhausted (no space left), FailedPrecondition (sandbox not
    running, directory not empty), each naming the path.
    """

    def __init__(self, sandbox: SandboxCore[Any, Any, Any, Any]):
        self._sb = sandbox
        self._stub = sandbox._client._files  # one stub per client: making one costs ~0.1 ms

    def _md(self) -> Optional[List[Tuple[str, str]]]:
        return self._sb._client._metadata

    @op
    def write(
        self,
        path: PathLike,
        data: Data,
        mode: int = 0o644,
        make_parents: bool = False,
        timeout: Optional[float] = None,
        request_id: Optional[str] = None,
    ) -> Gen[int]:
        """Creates or replaces the file at path with data (bytes, str as UTF-8,
        a binary file object read in 1 MiB chunks, or an iterable of bytes/str
        pieces; any size, streamed). Other types: InvalidArgument.
        mode: permission bits of a new file. make_parents: create missing
        parent directories (0755). Returns the number of bytes written.
        timeout: RPC deadline in seconds (None = none)."""
        p = _path_bytes(path)
        mode = _u32("mode", mode) & 0o7777
        sid = self._sb.id

        def requests() -> Iterator[pb.WriteFileRequest]:
            first = True
            for chunk in _chunks(data):
                if first:
                    first = False
                    yield pb.WriteFileRequest(
                        sandbox_id=sid,
                        path=p,
                        mode=mode,
                        make_parents=make_parents,
                        data=chunk,
                        request_id=request_id or "",
                    )
                else:
                    yield pb.WriteFileRequest(data=chunk)
            if first:  # empty file: the header alone
                yield pb.WriteFileRequest(
                    sandbox_id=sid, path=p, mode=mode, make_parents=make_parents, request_id=request_id or ""
                )

        _check_data(data)
        resp = yield RpcStreamIn(self._stub.Write, requests(), self._md(), timeout)
        return int(resp.bytes_written)

    @streaming(bytes)
    def read_stream(
        self, path: PathLike, offset: int = 0, length: int = 0, timeout: Optional[float] = None
    ) -> Gen[None]:
        """Yields the file's bytes in chunks of at most 1 MiB, from offset
        (bytes), length bytes (0 = to the end). Errors are raised while
        iterating."""
        req = pb.ReadFileRequest(
            sandbox_id=self._sb.id,
            path=_path_bytes(path),
            offset=_u32_or_u64("offset", offset),
            length=_u32_or_u64("length", length),
        )
        st = yield Open(self._stub.Read, req, self._md(), timeout)
        while True:
            chunk = yield Next(st)
            if chunk is END:
                return
            yield Emit(bytes(chunk.data))

    @op
    def read(self, path: PathLike, offset: int = 0, length: int = 0, timeout: Optional[float] = None) -> Gen[bytes]:
        """Returns the file's bytes (byte-exact), see read_stream."""
        buf = io.BytesIO()
        req = pb.ReadFileRequest(
            sandbox_id=self._sb.id,
            path=_path_bytes(path),
            offset=_u32_or_u64("offset", offset),
            length=_u32_or_u64("length", length),
        )
        st = yield Open(self._stub.Read, req, self._md(), timeout)
        while True:
            chunk = yield Next(st)
            if chunk is END:
                return buf.getvalue()
            buf.write(chunk.data)

    @op
    def stat(self, path: PathLike) -> Gen[FileInfo]:
        """Returns the FileInfo of path (symlinks are not followed at the last
        component). NotFound if it does not exist."""
        r = yield Rpc(self._stub.Stat, pb.StatRequest(sandbox_id=self._sb.id, path=_path_bytes(path)), self._md())
        return FileInfo._from_pb(r)

    @op
    def list(self, path: PathLike) -> Gen[List[FileInfo]]:
        """Returns the entries of the directory path (no "." or "..")."""
        r = yield Rpc(self._stub.ListDir, pb.ListDirRequest(sandbox_id=self._sb.id, path=_path_bytes(path)), self._md())
        return [FileInfo._from_pb(e) for e in r.entries]

    @op
    def mkdir(self, path: PathLike, parents: bool = False, mode: int = 0o755) -> Gen[None]:
        """Creates a directory. parents: like mkdir -p (missing parents are
        created, no error if it exists); otherwise AlreadyExists if it exists."""
        yield Rpc(
            self._stub.Mkdir,
            pb.MkdirRequest(
                sandbox_id=self._sb.id, path=_path_bytes(path), mode=_u32("mode", mode) & 0o7777, parents=parents
            ),
            self._md(),
        )

    @op
    def remove(self, path: PathLike, recursive: bool = False) -> Gen[None]:
        """Removes a file, symlink or empty directory; recursive removes a
        whole tree. FailedPrecondition for a non-empty directory otherwise."""
        yield Rpc(
            self._stub.Remove,
            pb.RemoveRequest(sandbox_id=self._sb.id, path=_path_bytes(path), recursive=recursive),
            self._md(),
        )

    @op
    def rename(self, src: PathLike, dst: PathLike) -> Gen[None]:
        """Renames src to dst (replacing dst like rename(2))."""
        req = pb.RenameRequest(sandbox_id=self._sb.id, to=_path_bytes(dst), **{"from": _path_bytes(src)})
        yield Rpc(self._stub.Rename, req, self._md())

    @op
    def upload_dir(
        self, local_dir: str, path: PathLike, user: Optional[str] = None, timeout: Optional[float] = None
    ) -> Gen[int]:
        """Copies the contents of the local directory local_dir into the
        sandbox directory path (created with its parents) as one tar stream:
        packed here with tarfile, unpacked by ``tar`` inside the sandbox
        (owned by user, default the sandbox user; symlinks kept as links).
        Returns the tar's size in bytes. Raises InvalidArgument (local_dir not
        a directory), FailedPrecondition (tar failed in the sandbox: its
        message names the entry; the sandbox needs GNU tar)."""
        from ._tardir import UNPACK_SH, pack

        f = pack(local_dir)
        try:
            size = f.seek(0, os.SEEK_END)
            f.seek(0)
            tmp = "/tmp/.warren-upload-" + _new_request_id() + ".tar"
            # Readable by the unpacking user; removed below whatever happens.
            yield from FilesCore.write.fn(self, tmp, f, mode=0o644, make_parents=True, timeout=timeout)
        finally:
            f.close()
        try:
            r = yield from SandboxCore.exec.fn(
                self._sb, ["/bin/sh", "-c", UNPACK_SH, "sh", _path_bytes(path), tmp], user=user, timeout=timeout
            )
        except errors.WarrenError:
            yield from self._remove_quietly(tmp)
            raise
        yield from self._remove_quietly(tmp)
        if r.exit_code != 0:
            raise errors.FailedPrecondition(
                f"upload_dir to {os.fsdecode(_path_bytes(path))!r}: tar in the sandbox exited {r.exit_code}: "
                + r.stderr.decode("utf-8", "replace").strip()
            )
        return size

    def _remove_quietly(self, path: str) -> Gen[None]:
        try:
            yield from FilesCore.remove.fn(self, path)
        except errors.NotFound:
            pass

    @op
    def download_dir(self, path: PathLike, local_dir: str, timeout: Optional[float] = None) -> Gen[int]:
        """Copies the contents of the sandbox directory path into the local
        directory local_dir (created) as one tar stream: packed by ``tar``
        inside the sandbox, checked entry by entry and unpacked here (an
        entry with an absolute name, "..", a link leaving local_dir, or a
        device/FIFO is refused with InvalidArgument naming it, before
        anything is written). Returns the number of entries. Raises
        NotFound/FailedPrecondition when tar cannot read path in the sandbox."""
        import tempfile

        from ._tardir import PACK_SH, unpack

        tmp = "/tmp/.warren-download-" + _new_request_id() + ".tar"
        p = _path_bytes(path)
        yield from FilesCore.mkdir.fn(self, "/tmp", parents=True, mode=0o1777)
        r = yield from SandboxCore.exec.fn(self._sb, ["/bin/sh", "-c", PACK_SH, "sh", p, tmp], timeout=timeout)
        if r.exit_code != 0:
            yield from self._remove_quietly(tmp)
            msg = r.stderr.decode("utf-8", "replace").strip()
            cls = errors.NotFound if "No such file" in msg or "can't cd" in msg else errors.FailedPrecondition
            raise cls(f"download_dir of {os.fsdecode(p)!r}: tar in the sandbox exited {r.exit_code}: {msg}")
        with tempfile.SpooledTemporaryFile(max_size=64 << 20) as f:
            try:
                req = pb.ReadFileRequest(sandbox_id=self._sb.id, path=tmp.encode())
                st = yield Open(self._stub.Read, req, self._md(), timeout)
                while True:
                    chunk = yield Next(st)
                    if chunk is END:
                        break
                    f.write(chunk.data)
            except errors.WarrenError:
                yield from self._remove_quietly(tmp)
                raise
            yield from self._remove_quietly(tmp)
            return unpack(f, local_dir)  # type: ignore[arg-type]

    @op
    def exists(self, path: PathLike) -> Gen[bool]:
        """True if path exists (a dangling symlink counts as existing)."""
        try:
            yield Rpc(self._stub.Stat, pb.StatRequest(sandbox_id=self._sb.id, path=_path_bytes(path)), self._md())
            return True
        except errors.NotFound:
            return False


# Fields of create() that fork() carries over on the server (ForkRequest).
_FORK_FIELDS = ("labels", "ttl_s", "exclude", "pause")


class SandboxCore(Generic[SB, PR, XS, SE]):
    """Handle of one sandbox. Usable as a context manager: leaving the block
    destroys the sandbox. Thread-safe: execs and file calls may run
    concurrently; destroy() makes running execs return promptly."""

    files: Any

    def __init__(self, client: ClientCore[Any, Any], info: SandboxInfo):
        self._client = client
        self._info = info
        self.id: str = info.id
        # The process create(start=...) started ("" = none, or not known to
        # this handle: only create's reply carries it).
        self.main_process: str = info.main_process
        self.files = client._files_cls(self)
        self.input = client._input_cls(self)  # the display's keyboard and pointer (warren.desktop)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r})"

    def _exit(self) -> Gen[None]:
        try:
            c: Any = self._client
            from ._client_core import ClientCore  # a cycle: ClientCore makes SandboxCores
            yield from ClientCore.destroy.fn(c, self.id)
        except errors.NotFound:
            pass

    @property
    def cached_info(self) -> SandboxInfo:
        """The SandboxInfo of the last create/get/list/info call (no RPC)."""
        return self._info

    def _lc(self, method: str, req: Any, timeout: Optional[float] = None) -> Rpc:
        c = self._client
        return Rpc(getattr(c._lifecycle, method), req, c._metadata, timeout)

    @op
    def info(self) -> Gen[SandboxInfo]:
        """Fetches the sandbox's current SandboxInfo. NotFound once destroyed."""
        self._info = yield from self._client._get_info(self.id)
        return self._info

    @op
    def destroy(self, timeout: Optional[float] = None) -> Gen[None]:
        """Destroys the sandbox: its processes are killed, its files are gone.
        NotFound if it does not exist (any more). timeout: RPC deadline in
        seconds (None = none)."""
        c: Any = self._client
        from ._client_core import ClientCore  # a cycle: ClientCore makes SandboxCores
        yield from ClientCore.destroy.fn(c, self.id, timeout)

    @op
    def exec(
        self,
        cmd: Cmd,
        *,
        env: Env = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: Optional[Union[bytes, str]] = None,
        timeout: Optional[float] = None,
        output_cap: Optional[int] = None,
        kill_grace: Optional[float] = None,
        request_id: Optional[str] = None,
        on_stdout: Optional[Callable[[bytes], Any]] = None,
        on_stderr: Optional[Callable[[bytes], Any]] = None,
        merge_stderr: bool = False,
    ) -> Gen[ExecResult]:
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
        On the async side they may also be coroutine functions.

        merge_stderr: the command's stderr goes to its stdout pipe, so
        result.stdout holds both in the order written (stderr empty), as
        ``2>&1`` would (container backend; InvalidArgument elsewhere).
        """
        if on_stdout is not None or on_stderr is not None:
            if request_id:
                raise errors.InvalidArgument("exec: request_id cannot be combined with on_stdout/on_stderr")
            from ._process import ExecStreamCore, next_emit

            cap = output_cap if output_cap is not None else 16 << 20
            st = self._client._exec_stream_cls(
                self._client,
                self._exec_stream_first(
                    cmd, env, cwd, user, stdin, timeout, kill_grace, False, None, None, merge_stderr
                ),
                cap,
            )
            yield from st._open()
            try:
                yield from ExecStreamCore.close_stdin.fn(st)  # as exec: EOF after the stdin bytes
                events = st._events()
                while True:
                    c = yield from next_emit(events)
                    if c is END:
                        break
                    cb = on_stdout if c.stream == "stdout" else on_stderr if c.stream == "stderr" else None
                    if cb is not None:
                        from ._core import Callback

                        yield Callback(cb, c.data)
            finally:
                if st.result is None:
                    st._cancel()
            result: Optional[ExecResult] = st.result
            assert result is not None
            return result
        req, deadline = _exec_request(
            self.id,
            cmd,
            env=env,
            cwd=cwd,
            user=user,
            stdin=stdin,
            timeout=timeout,
            output_cap=output_cap,
            kill_grace=kill_grace,
            request_id=request_id,
            merge_stderr=merge_stderr,
        )
        r = yield Rpc(self._client._sandboxes.Exec, req, self._client._metadata, deadline)
        return ExecResult._from_pb(r)

    def _exec_stream_first(
        self,
        cmd: Cmd,
        env: Env,
        cwd: Optional[str],
        user: Optional[str],
        stdin: Optional[Union[bytes, str]],
        timeout: Optional[float],
        kill_grace: Optional[float],
        pty: bool,
        rows: Optional[int],
        cols: Optional[int],
        merge_stderr: bool = False,
    ) -> ppb.ExecStreamRequest:
        req = _proc_request(self.id, cmd, env, cwd, user, stdin, timeout, kill_grace, merge_stderr)
        return ppb.ExecStreamRequest(exec=req, options=_start_options(pty, rows, cols))

    def exec_stream(
        self,
        cmd: Cmd,
        *,
        env: Env = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: Optional[Union[bytes, str]] = None,
        timeout: Optional[float] = None,
        kill_grace: Optional[float] = None,
        pty: bool = False,
        rows: Optional[int] = None,
        cols: Optional[int] = None,
        merge_stderr: bool = False,
    ) -> XS:
        """Starts cmd (as exec) and returns its ExecStream at once (not a
        coroutine on the async side): iterate it for OutputChunk(stream,
        data, offset) as produced, then read .result (ExecResult). stdin:
        first bytes of stdin; unlike exec, stdin stays open: more with
        send_stdin(), EOF with close_stdin() (or when the stream is closed).
        pty: run on a terminal of rows x cols (default 24 x 80; stderr merged
        into stdout). Closing the stream or the client going away kills the
        command's whole tree. merge_stderr: as exec (only stdout chunks).
        Errors as exec (raised when iterating)."""
        first = self._exec_stream_first(cmd, env, cwd, user, stdin, timeout, kill_grace, pty, rows, cols, merge_stderr)
        st = self._client._exec_stream_cls(self._client, first, 0)
        st._kick(st._open())
        return st  # type: ignore[no-any-return]

    @op
    def spawn(
        self,
        cmd: Cmd,
        *,
        env: Env = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: Optional[Union[bytes, str]] = None,
        timeout: Optional[float] = None,
        kill_grace: Optional[float] = None,
        pty: bool = False,
        rows: Optional[int] = None,
        cols: Optional[int] = None,
        buffer_bytes: Optional[int] = None,
        control_fd: bool = False,
        merge_stderr: bool = False,
    ) -> Gen[PR]:
        """Starts cmd in the background and returns its Process handle (wait,
        kill, output, stream, send_stdin, close_stdin, resize). The process
        lives in the daemon, survives this client, and dies with the
        sandbox. stdin: first bytes of stdin (stdin stays open).
        timeout: seconds, then the whole tree gets SIGTERM, SIGKILL after
        kill_grace. buffer_bytes: ring buffer per stream (default 1 MiB, max
        64 MiB). control_fd: a pipe on fd 3 (stream "control").
        merge_stderr: as exec. Raises ResourceExhausted when the sandbox
        already runs 64 background processes, else as exec."""
        from .process import ProcessInfo

        req = _proc_request(self.id, cmd, env, cwd, user, stdin, timeout, kill_grace, merge_stderr)
        opts = _start_options(pty, rows, cols, control_fd, buffer_bytes)
        r = yield Rpc(self._client._processes.Spawn, ppb.SpawnRequest(exec=req, options=opts), self._client._metadata)
        info = ProcessInfo._from_pb(r)
        return self._client._process_cls(self, info.id, info)  # type: ignore[no-any-return]

    @op
    def process(self, process_id: str) -> Gen[PR]:
        """Re-attaches to a background process by id. NotFound if unknown."""
        from ._process import ProcessCore

        p = self._client._process_cls(self, process_id)
        yield from ProcessCore.info.fn(p)
        return p  # type: ignore[no-any-return]

    @op
    def processes(self) -> Gen[List[ProcessInfo]]:
        """The sandbox's background processes (running and exited), oldest first."""
        from .process import ProcessInfo

        r = yield Rpc(
            self._client._processes.List, ppb.ListProcessesRequest(sandbox_id=self.id), self._client._metadata
        )
        return [ProcessInfo._from_pb(p) for p in r.processes]

    @op
    def session(
        self,
        cwd: Optional[str] = None,
        env: Env = None,
        user: Optional[str] = None,
        merge_stderr: bool = False,
        pty: bool = False,
        rows: Optional[int] = None,
        cols: Optional[int] = None,
    ) -> Gen[SE]:
        """A persistent bash session (warren.process.Session): session.run(cmd,
        timeout) keeps cwd, env and shell variables between commands;
        start()/send()/expect()/wait() drive interactive commands.
        merge_stderr: the shell's stderr is its stdout pipe, so each result's
        stdout holds both in the order written (as on a terminal).
        pty: the shell runs on a terminal (rows x cols, default 24 x 80;
        stdout and stderr are one stream), for programs that prompt only on
        a terminal."""
        from ._process import _SESSION_ARGV, SESSION_BUFFER_BYTES, SessionCore, _session_env

        p = yield from SandboxCore.spawn.fn(
            self,
            _SESSION_ARGV,
            env=_session_env(env),
            cwd=cwd,
            user=user,
            control_fd=True,
            buffer_bytes=SESSION_BUFFER_BYTES,
            merge_stderr=merge_stderr and not pty,
            pty=pty,
            rows=rows,
            cols=cols,
        )
        s = self._client._session_cls(p)
        s._pty = pty
        yield from SessionCore._start(s)
        return s  # type: ignore[no-any-return]

    # request_id on exec()/files.write(): a retry with the same id returns the
    # first call's recorded result instead of running again (see warren.proto).

    @op
    def screenshot(self, timeout: Optional[float] = None) -> Gen[ScreenImage]:
        """The whole screen of a sandbox with a display (backend="vm") as a
        ScreenImage (png, width, height); see warren.desktop."""
        return (yield from _screenshot(self, timeout))

    @op
    def screen_size(self, timeout: Optional[float] = None) -> Gen[Tuple[int, int]]:
        """(width, height) of the screen in pixels."""
        shot = yield from _screenshot(self, timeout)
        return (shot.width, shot.height)

    @op
    def pause(self) -> Gen[SandboxInfo]:
        """Freezes every process of the sandbox; any exec/file call resumes it."""
        self._info = SandboxInfo._from_pb((yield self._lc("Pause", pb.PauseRequest(id=self.id))))
        return self._info

    @op
    def resume(self, prefetch: bool = True) -> Gen[SandboxInfo]:
        """Thaws a paused or suspended sandbox. A suspended one first gets
        its working set prefetched back from swap (every process's mappings
        and the tmpfs upper's files), unless prefetch=False (pages then come
        back on first touch)."""
        r = yield self._lc("Resume", pb.ResumeRequest(id=self.id, no_prefetch=not prefetch))
        self._info = SandboxInfo._from_pb(r)
        return self._info

    @op
    def suspend(self) -> Gen[SandboxInfo]:
        """Pauses the sandbox and gives its memory back to the host: its
        memory cgroup is reclaimed into swap (zram set up by warrend when the
        host has none). state becomes "suspended"; the returned info carries
        memory_bytes/swap_bytes after the reclaim. Any exec/file call or
        resume() brings it back with processes, open files and files intact.
        Idempotent."""
        self._info = SandboxInfo._from_pb((yield self._lc("Suspend", pb.SuspendRequest(id=self.id))))
        return self._info

    @op
    def extend_ttl(self, ttl_s: int) -> Gen[SandboxInfo]:
        """Sets the TTL to ttl_s seconds from now (0 = no TTL)."""
        r = yield self._lc("ExtendTtl", pb.ExtendTtlRequest(id=self.id, ttl_s=_u32("ttl_s", ttl_s)))
        self._info = SandboxInfo._from_pb(r)
        return self._info

    @op
    def set_network(self, network: Mapping[str, Sequence[str]]) -> Gen[Dict[str, List[str]]]:
        """Replaces the sandbox's egress policy: {"allow": [...], "deny": [...]}
        (entries as in create(network=...)). Applies to the next packet:
        new connections follow it, and existing ones it no longer allows
        are reset (TCP) or refused on their next packet. Returns the policy
        in force, entries canonical. FailedPrecondition when the sandbox was
        created without a network; InvalidArgument for a bad entry (the
        policy in force stays)."""
        req = pb.SetNetworkRequest(id=self.id, network=_network_pb(network))
        r = yield Rpc(self._client._sandboxes.SetNetwork, req, self._client._metadata)
        return {"allow": list(r.allow), "deny": list(r.deny)}

    @op
    def expose(self, port: int) -> Gen[ExposedPort]:
        """Serves `port` of the sandbox (its loopback: a server bound to
        127.0.0.1 or 0.0.0.0 inside) on the node behind a token. Connect to
        .address with the header X-Warren-Token: .token (or the query
        parameter warren_token=); without it the node answers 401. Exposing
        the same port again returns the same exposure; it ends with the
        sandbox or unexpose(). Listed in info().exposed. Needs a node with
        warrend --sandbox-net (FailedPrecondition)."""
        req = pb.ExposeRequest(id=self.id, port=_port(port))
        r = yield Rpc(self._client._sandboxes.Expose, req, self._client._metadata)
        return ExposedPort._from_pb(r)

    @op
    def unexpose(self, port: int) -> Gen[None]:
        """Stops serving `port` (its open connections end). NotFound when it
        is not exposed."""
        req = pb.UnexposeRequest(id=self.id, port=_port(port))
        yield Rpc(self._client._sandboxes.Unexpose, req, self._client._metadata)

    @op
    def snapshot(
        self,
        name: Optional[str] = None,
        exclude: Sequence[str] = (),
        pause: bool = True,
        timeout: Optional[float] = None,
    ) -> Gen[Snapshot]:
        """Packs the sandbox's changes into a layer (pack_diff); exclude:
        fnmatch patterns of absolute paths dropped from it. create(layers=
        snap.layers) starts from that state. name: "kind/name@version"
        (None: "workspace/snap-<id>@<unix ns>"); a client acting for a
        project leaves it None, and the layer is that project's (other
        projects get NotFound for it)."""
        r = yield self._lc(
            "Snapshot",
            pb.SnapshotRequest(id=self.id, name=name or "", exclude=list(exclude), no_pause=not pause),
            timeout,
        )
        return Snapshot(layer=Layer._from_pb(r.layer), layers=list(r.layers))

    @op
    def fork(self, /, n: int, **overrides: Any) -> Gen[List[SB]]:
        """n new running sandboxes from a snapshot of this one, made by the
        daemon in one call (Lifecycle.Fork, all or nothing): they keep its
        layers, resources, env, workdir, user, labels and job.

        n: 1..256. overrides: labels (merged over the sandbox's labels),
        ttl_s (None/0 = the sandbox's TTL), exclude (fnmatch patterns of
        absolute paths left out of the snapshot), pause (False: snapshot
        without freezing the sandbox), timeout (RPC deadline in seconds).
        Any other keyword (a create() field a fork keeps from its
        sandbox, e.g. memory_mb or env) raises InvalidArgument naming it,
        before anything is sent; so does n < 1."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise errors.InvalidArgument(f"fork: n={n!r} must be an int >= 1")
        timeout = overrides.pop("timeout", None)
        unknown = sorted(k for k in overrides if k not in _FORK_FIELDS)
        if unknown:
            raise errors.InvalidArgument(
                f"fork: cannot override {', '.join(unknown)} (a fork keeps the sandbox's own; "
                f"overridable: {', '.join(_FORK_FIELDS)}, timeout)"
            )
        labels = overrides.get("labels")
        req = pb.ForkRequest(
            id=self.id,
            count=_u32("fork n", n),
            ttl_s=_u32("ttl_s", overrides.get("ttl_s")),
            exclude=list(overrides.get("exclude", ())),
            no_pause=not overrides.get("pause", True),
        )
        if labels is not None:
            req.labels.update(dict(labels))
        r = yield self._lc("Fork", req, timeout)
        return [self._client._sandbox_cls(self._client, SandboxInfo._from_pb(s)) for s in r.sandboxes]

    @op
    def grade(
        self,
        grader: Cmd,
        protected: Sequence[str] = (),
        timeout: Optional[float] = None,
        env: Env = None,
        cwd: Optional[str] = None,
        solution: Optional[Sequence[str]] = None,
    ) -> Gen[GradeResult]:
        """Runs grader in a FRESH sandbox built from this sandbox's pristine
        layers (those its creator gave; a fork or a sandbox created from a
        snapshot keeps the pristine layers of the sandbox snapshotted) plus
        its changes under the `solution` paths (required: absolute paths where
        the task's solution lives) and nowhere else. Returns the grader's
        result and every change of the agent outside the solution paths
        (`touched`). `protected` is deprecated: a path inside a solution path
        kept pristine. Raises InvalidArgument without `solution`."""
        req = _grade_request(self.id, grader, protected, timeout, env, cwd, solution)
        return _grade_result((yield self._lc("Grade", req)))

    @op
    def audit_log(self) -> Gen[List[Dict[str, Any]]]:
        """Every exec and file call on this sandbox (kept by the daemon)."""
        r = yield self._lc("AuditLog", pb.AuditLogRequest(id=self.id))
        return [json.loads(e) for e in r.entries]
