"""Streaming exec, background processes and shell sessions (issue 3;
api/warren/v1/process.proto).

    for chunk in sb.exec_stream("for i in 1 2 3; do echo $i; sleep 1; done"):
        print(chunk.stream, chunk.data)          # as produced
    p = sb.spawn("python3 -m http.server")       # background: survives a client disconnect
    p.output().stdout; p.kill(); p.wait(timeout=5).exit_code
    sb.process(p.id)                              # re-attach (e.g. from a new Client)
    with sb.session() as sh:                      # persistent bash: cwd, env, variables carry over
        sh.run("cd /tmp; x=1"); sh.run("echo $x $PWD").stdout   # b"1 /tmp\\n"

Offsets count the bytes of one stream (stdout or stderr) since the process
started. A background process keeps its output in a ring buffer per stream
(buffer_bytes, default DEFAULT_BUFFER_BYTES); bytes that no longer fit are
dropped oldest first, and every read says how many bytes it missed
(`dropped`), so a reader always knows when older output was lost.
"""

from __future__ import annotations

import os
import queue
import secrets
import signal as _signal
import threading
import time
from dataclasses import dataclass
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Mapping, Optional,
                    Sequence, Tuple, Union)

import grpc

from . import errors
from ._proto import process_pb2 as ppb
from ._proto import process_pb2_grpc as ppb_grpc
from ._proto import warren_pb2 as pb
from .types import ExecResult

if TYPE_CHECKING:
    from .client import Sandbox

__all__ = ["OutputChunk", "ProcessInfo", "ProcessOutput", "ExecStream", "Process", "Session",
           "DEFAULT_BUFFER_BYTES", "MAX_BUFFER_BYTES", "STDOUT", "STDERR", "CONTROL"]

# Ring buffer per stream of a background process (daemon default), bytes.
DEFAULT_BUFFER_BYTES = 1 << 20
MAX_BUFFER_BYTES = 64 << 20
STDOUT, STDERR, CONTROL = "stdout", "stderr", "control"
_STREAM_NAMES = {ppb.OUTPUT_STREAM_STDOUT: STDOUT, ppb.OUTPUT_STREAM_STDERR: STDERR,
                 ppb.OUTPUT_STREAM_CONTROL: CONTROL}
# Seconds of one Wait RPC (waits longer than this are several calls).
_WAIT_SLICE_S = 30.0
_U32_MAX = (1 << 32) - 1

Cmd = Union[str, bytes, Sequence[Union[str, bytes]]]


@dataclass(frozen=True)
class OutputChunk:
    """Bytes of one stream as produced.

    stream: "stdout", "stderr" (never with a PTY: the terminal is stdout) or
        "control" (fd 3, see spawn(control_fd=True)).
    offset: offset of data[0] in its stream.
    dropped: bytes of this stream before `offset` that were dropped from the
        ring buffer before this reader got them (0 = nothing missed).
    stdout_mark / stderr_mark (control chunks): bytes the process had written
        to stdout / stderr before it wrote this chunk to fd 3.
    """

    stream: str
    data: bytes
    offset: int = 0
    dropped: int = 0
    stdout_mark: int = 0
    stderr_mark: int = 0

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")

    @classmethod
    def _from_pb(cls, c: "ppb.OutputChunk") -> "OutputChunk":
        return cls(stream=_STREAM_NAMES.get(c.stream, STDOUT), data=bytes(c.data), offset=c.offset,
                   dropped=c.dropped_bytes, stdout_mark=c.stdout_mark, stderr_mark=c.stderr_mark)


@dataclass(frozen=True)
class ProcessInfo:
    """State of a process. result: the ExecResult once it exited (exit code,
    signal, timed_out, oom_killed, byte totals, duration; no output bytes),
    else None. pid: host pid (diagnostics)."""

    id: str
    sandbox_id: str
    argv: Tuple[bytes, ...]
    shell: bytes
    running: bool
    result: Optional[ExecResult]
    pty: bool
    started_at_ns: int
    pid: int
    stdout_total_bytes: int
    stderr_total_bytes: int
    stdout_first_offset: int
    stderr_first_offset: int
    buffer_bytes: int

    @property
    def state(self) -> str:
        """"running" or "exited"."""
        return "running" if self.running else "exited"

    @property
    def exit_code(self) -> Optional[int]:
        return None if self.result is None else self.result.exit_code

    @classmethod
    def _from_pb(cls, p: "ppb.ProcessInfo") -> "ProcessInfo":
        running = p.state != ppb.PROCESS_STATE_EXITED
        return cls(id=p.process_id, sandbox_id=p.sandbox_id, argv=tuple(bytes(a) for a in p.argv),
                   shell=bytes(p.shell), running=running,
                   result=None if running else ExecResult._from_pb(p.result), pty=p.pty,
                   started_at_ns=p.started_at_ns, pid=p.pid, stdout_total_bytes=p.stdout_total_bytes,
                   stderr_total_bytes=p.stderr_total_bytes, stdout_first_offset=p.stdout_first_offset,
                   stderr_first_offset=p.stderr_first_offset, buffer_bytes=p.buffer_bytes)


@dataclass(frozen=True)
class ProcessOutput:
    """Buffered output of a background process (Process.output()).

    stdout/stderr: the bytes from stdout_offset/stderr_offset on (each the
        offset of its first byte). stdout_dropped/stderr_dropped: bytes between
        the offsets asked for and those that were dropped from the ring buffer
        (0 = nothing missed). stdout_end/stderr_end: offsets to pass next time
        to get only newer output. result: the ExecResult if the process exited.
    """

    stdout: bytes
    stderr: bytes
    stdout_offset: int
    stderr_offset: int
    stdout_dropped: int
    stderr_dropped: int
    stdout_end: int
    stderr_end: int
    result: Optional[ExecResult]

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")


def _u32(name: str, value: Optional[Union[int, float]]) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _U32_MAX:
        raise errors.InvalidArgument(f"{name} must be an integer in [0, {_U32_MAX}], got {value!r}")
    return value


def _exec_request(sandbox_id: str, cmd: Cmd, env: Optional[Mapping[str, Union[str, bytes]]],
                  cwd: Optional[str], user: Optional[str], stdin: Optional[Union[bytes, str]],
                  timeout: Optional[float], kill_grace: Optional[float]) -> "pb.ExecRequest":
    """The ExecRequest of a command (same rules as Sandbox.exec)."""
    from .client import _env_pb
    req = pb.ExecRequest(sandbox_id=sandbox_id, env=_env_pb(env), cwd=cwd or "", user=user or "")
    if isinstance(cmd, (str, bytes)):
        req.shell = cmd if isinstance(cmd, bytes) else cmd.encode("utf-8", "surrogateescape")
    else:
        argv = [a if isinstance(a, bytes) else os.fsencode(a) for a in cmd]
        if not argv:
            raise errors.InvalidArgument("empty argv")
        req.argv.extend(argv)
    if stdin is not None:
        req.stdin = stdin.encode("utf-8") if isinstance(stdin, str) else bytes(stdin)
    if timeout is not None:
        if timeout <= 0:
            raise errors.InvalidArgument(f"timeout must be > 0 seconds, got {timeout}")
        req.timeout_ms = _u32("timeout (ms)", max(1, int(round(timeout * 1000))))
    if kill_grace is not None:
        if kill_grace < 0:
            raise errors.InvalidArgument(f"kill_grace must be >= 0, got {kill_grace}")
        req.kill_grace_ms = _u32("kill_grace (ms)", int(round(kill_grace * 1000)))
    return req


def _start_options(pty: bool, rows: Optional[int], cols: Optional[int], control_fd: bool = False,
                   buffer_bytes: Optional[int] = None) -> "ppb.StartOptions":
    if buffer_bytes is not None and (isinstance(buffer_bytes, bool) or not isinstance(buffer_bytes, int)
                                     or not 0 < buffer_bytes <= MAX_BUFFER_BYTES):
        raise errors.InvalidArgument(
            f"buffer_bytes must be in [1, {MAX_BUFFER_BYTES}], got {buffer_bytes!r}")
    return ppb.StartOptions(pty=pty, rows=_u32("rows", rows), cols=_u32("cols", cols),
                            control_fd=control_fd, buffer_bytes=buffer_bytes or 0)


def _to_bytes(data: Union[bytes, bytearray, memoryview, str]) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


class ExecStream:
    """A running streaming exec (Sandbox.exec_stream): iterate it for
    OutputChunk objects as the command produces them (stdout and stderr each
    in order; every byte, the command is slowed down rather than output
    dropped). After the iteration ends, `result` is the ExecResult (exit code,
    signal, timed_out, byte totals; stdout/stderr empty unless collect=True).

    send_stdin()/close_stdin()/signal()/resize() act while it runs; close()
    (or leaving a ``with`` block, or the client going away) kills the
    command's whole process tree if it still runs.
    """

    def __init__(self, stub: "ppb_grpc.ProcessesStub", first: "ppb.ExecStreamRequest",
                 metadata: Any, deadline: Optional[float], collect_cap: int = 0):
        self._q: "queue.Queue[Optional[ppb.ExecStreamRequest]]" = queue.Queue()
        self._q.put(first)
        self._closed_input = False
        try:
            self._call = stub.ExecStream(self._requests(), metadata=metadata, timeout=deadline)
        except ValueError as e:
            w = errors.from_closed_channel(e)
            if w is None:
                raise
            raise w from None
        # gRPC reads _requests() on a thread of its own: however the call
        # ends (its channel closed, cancelled, deadline, error), the request
        # stream must end too, or that thread blocks on the queue forever.
        self._call.add_done_callback(lambda _call: self._end_input())
        self._cap = collect_cap
        self._out: List[bytes] = []
        self._err: List[bytes] = []
        self._sizes = [0, 0]
        self._trunc = [False, False]
        self.result: Optional[ExecResult] = None
        self.info: Optional[ProcessInfo] = None

    def _requests(self) -> Iterator["ppb.ExecStreamRequest"]:
        while True:
            m = self._q.get()
            if m is None:
                return
            yield m

    def _end_input(self) -> None:
        if not self._closed_input:
            self._closed_input = True
            self._q.put(None)

    def __enter__(self) -> "ExecStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __iter__(self) -> Iterator[OutputChunk]:
        try:
            for ev in self._call:
                kind = ev.WhichOneof("event")
                if kind == "started":
                    self.info = ProcessInfo._from_pb(ev.started)
                elif kind == "output":
                    c = OutputChunk._from_pb(ev.output)
                    if self._cap and c.stream in (STDOUT, STDERR):
                        i = 0 if c.stream == STDOUT else 1
                        room = max(0, self._cap - self._sizes[i])
                        part = c.data[:room]
                        (self._out if i == 0 else self._err).append(part)
                        self._sizes[i] += len(part)
                        if len(part) < len(c.data):
                            self._trunc[i] = True
                    yield c
                elif kind == "exit":
                    r = ExecResult._from_pb(ev.exit)
                    self.result = ExecResult(
                        exit_code=r.exit_code, signal=r.signal, oom_killed=r.oom_killed,
                        timed_out=r.timed_out, stdout=b"".join(self._out), stderr=b"".join(self._err),
                        stdout_truncated=self._trunc[0], stderr_truncated=self._trunc[1],
                        stdout_total_bytes=r.stdout_total_bytes, stderr_total_bytes=r.stderr_total_bytes,
                        duration_s=r.duration_s)
                    self._end_input()
        except grpc.RpcError as e:
            self._end_input()
            raise errors.from_rpc_error(e) from None
        finally:
            self._end_input()

    def wait(self) -> ExecResult:
        """Consumes the rest of the output and returns the result."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result

    def send_stdin(self, data: Union[bytes, str]) -> None:
        self._q.put(ppb.ExecStreamRequest(stdin=_to_bytes(data)))

    def close_stdin(self) -> None:
        self._q.put(ppb.ExecStreamRequest(close_stdin=True))

    def signal(self, sig: int = _signal.SIGTERM) -> None:
        """Sends sig to every process of the command's tree."""
        self._q.put(ppb.ExecStreamRequest(signal=int(sig)))

    def resize(self, rows: int, cols: int) -> None:
        """New PTY window size (pty=True only)."""
        self._q.put(ppb.ExecStreamRequest(resize_rows=_u32("rows", rows), resize_cols=_u32("cols", cols)))

    def close(self) -> None:
        """Ends the call; a command still running is killed (whole tree)."""
        self._end_input()
        if self.result is None:
            self._call.cancel()


class ProcessStream:
    """Output of a background process as it is produced (Process.stream()):
    iterate for OutputChunk objects; after the end, `result` is the
    ExecResult (None if the stream was not followed to the exit)."""

    def __init__(self, call: Any):
        self._call = call
        self.result: Optional[ExecResult] = None

    def __enter__(self) -> "ProcessStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __iter__(self) -> Iterator[OutputChunk]:
        try:
            for ev in self._call:
                kind = ev.WhichOneof("event")
                if kind == "output":
                    yield OutputChunk._from_pb(ev.output)
                elif kind == "exit":
                    self.result = ExecResult._from_pb(ev.exit)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED and self._cancelled:
                return
            raise errors.from_rpc_error(e) from None

    _cancelled = False

    def close(self) -> None:
        """Stops following (the process keeps running)."""
        self._cancelled = True
        self._call.cancel()


class Process:
    """Handle of a background process (Sandbox.spawn / Sandbox.process).
    The process lives in the daemon: the handle survives client disconnects
    and can be re-made from its id (sb.process(id)) by any client. It dies
    with its sandbox. Thread-safe."""

    def __init__(self, sandbox: "Sandbox", process_id: str, info: Optional[ProcessInfo] = None):
        self._sb = sandbox
        self.id = process_id
        self.sandbox_id = sandbox.id
        self._stub = sandbox._client._processes()  # the client's one stub
        self._md = sandbox._client._metadata
        self._info = info

    def __repr__(self) -> str:
        return f"Process(sandbox_id={self.sandbox_id!r}, id={self.id!r})"

    def _ref(self) -> "ppb.ProcessRef":
        return ppb.ProcessRef(sandbox_id=self.sandbox_id, process_id=self.id)

    def _rpc(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, metadata=self._md, **kwargs)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None
        except ValueError as e:
            w = errors.from_closed_channel(e)
            if w is None:
                raise
            raise w from None

    @property
    def cached_info(self) -> Optional[ProcessInfo]:
        return self._info

    def info(self) -> ProcessInfo:
        """Current state (NotFound if the process or its sandbox is gone)."""
        self._info = ProcessInfo._from_pb(self._rpc(self._stub.Get, self._ref()))
        return self._info

    def wait(self, timeout: Optional[float] = None) -> ExecResult:
        """Waits for the exit (timeout in seconds, None = forever) and returns
        its ExecResult (no output bytes: see output()). Raises
        DeadlineExceeded if it still runs after timeout."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = _WAIT_SLICE_S if end is None else max(0.0, min(_WAIT_SLICE_S, end - time.monotonic()))
            p = self._rpc(self._stub.Wait, ppb.WaitProcessRequest(ref=self._ref(), timeout_ms=int(left * 1000)),
                          timeout=left + 30)
            self._info = ProcessInfo._from_pb(p)
            if not self._info.running:
                assert self._info.result is not None
                return self._info.result
            if end is not None and time.monotonic() >= end:
                raise errors.DeadlineExceeded(f"process {self.id} still running after {timeout} s")

    def signal(self, sig: int, group_only: bool = False) -> None:
        """Sends sig to every process of its tree (default) or, group_only,
        to the foreground process's process group."""
        self._rpc(self._stub.Signal, ppb.SignalProcessRequest(ref=self._ref(), signal=int(sig),
                                                             group_only=group_only))

    def kill(self, sig: int = _signal.SIGKILL) -> None:
        """Sends sig (default SIGKILL) to the whole process tree (setsid'ed and
        double-forked descendants included)."""
        self.signal(sig)

    def send_stdin(self, data: Union[bytes, str]) -> None:
        """Queues data for the process's stdin. FailedPrecondition once stdin
        was closed or the process exited."""
        self._rpc(self._stub.Input, ppb.ProcessInputRequest(ref=self._ref(), data=_to_bytes(data)))

    def close_stdin(self) -> None:
        self._rpc(self._stub.Input, ppb.ProcessInputRequest(ref=self._ref(), close=True))

    def resize(self, rows: int, cols: int) -> None:
        """New PTY window size. FailedPrecondition without a PTY."""
        self._rpc(self._stub.Resize, ppb.ResizeRequest(ref=self._ref(), rows=_u32("rows", rows),
                                                      cols=_u32("cols", cols)))

    def output(self, stdout_offset: int = 0, stderr_offset: int = 0) -> ProcessOutput:
        """The output buffered now from these offsets on (see ProcessOutput)."""
        req = ppb.ProcessOutputRequest(ref=self._ref(), stdout_offset=stdout_offset,
                                       stderr_offset=stderr_offset, follow=False)
        parts: Dict[str, List[bytes]] = {STDOUT: [], STDERR: []}
        start = {STDOUT: stdout_offset, STDERR: stderr_offset}
        end = dict(start)
        dropped = {STDOUT: 0, STDERR: 0}
        first = {STDOUT: True, STDERR: True}
        result: Optional[ExecResult] = None
        calls = self._rpc(lambda **kw: iter(self._stub.Output(req, **kw)), timeout=60)
        try:
            for ev in calls:
                kind = ev.WhichOneof("event")
                if kind == "output":
                    c = OutputChunk._from_pb(ev.output)
                    if c.stream not in parts:
                        continue
                    if first[c.stream]:
                        first[c.stream] = False
                        start[c.stream] = c.offset
                        dropped[c.stream] = c.dropped
                    parts[c.stream].append(c.data)
                    end[c.stream] = c.offset + len(c.data)
                elif kind == "exit":
                    result = ExecResult._from_pb(ev.exit)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None
        return ProcessOutput(stdout=b"".join(parts[STDOUT]), stderr=b"".join(parts[STDERR]),
                             stdout_offset=start[STDOUT], stderr_offset=start[STDERR],
                             stdout_dropped=dropped[STDOUT], stderr_dropped=dropped[STDERR],
                             stdout_end=end[STDOUT], stderr_end=end[STDERR], result=result)

    def stream(self, stdout_offset: int = 0, stderr_offset: int = 0, control_offset: int = 0,
               follow: bool = True, timeout: Optional[float] = None) -> ProcessStream:
        """Output from these offsets on: what is buffered, then (follow) new
        output as it is produced until the process exits. timeout: RPC
        deadline in seconds (DeadlineExceeded while iterating)."""
        req = ppb.ProcessOutputRequest(ref=self._ref(), stdout_offset=stdout_offset,
                                       stderr_offset=stderr_offset, control_offset=control_offset,
                                       follow=follow)
        return ProcessStream(self._rpc(self._stub.Output, req, timeout=timeout))


# ---------------------------------------------------------------- sessions

_SESSION_ARGV = ["bash", "--norc", "--noprofile", "--noediting", "-i"]
# Seconds to wait for a command's sentinel after it was interrupted.
_INTERRUPT_GRACE_S = 2.0
SESSION_BUFFER_BYTES = 4 << 20


def _bash_quote(data: bytes) -> str:
    """data as a bash $'...' word (every byte exact, NUL excluded)."""
    out = ["$'"]
    for b in data:
        c = chr(b)
        if c.isalnum() or c in " _-./,:=+@%^":
            out.append(c)
        else:
            out.append("\\x%02x" % b)
    out.append("'")
    return "".join(out)


class _SessionCommand:
    """One command of a session being read back; shared by Session and
    AsyncSession, which own the stream loop (sync or async). `off` is the
    session's consumed [stdout, stderr, control] offsets, advanced in place.
    The command is complete once the sentinel record (token, $?) arrived on
    the control stream and stdout/stderr were read up to the byte marks the
    daemon stamped on it."""

    def __init__(self, data: bytes, off: List[int]):
        self.token = secrets.token_hex(16)
        self.off = off
        self.pieces: List[List[Tuple[int, bytes]]] = [[], []]  # (offset, data) per stream
        self.trunc = [False, False]
        self.rc: Optional[int] = None
        self.marks = [0, 0]
        self._ctl = b""
        # The command line, then a line printing the sentinel and $? to fd 3.
        self.input = (b"eval " + _bash_quote(data).encode() + b" </dev/null 3>&-\n" +
                      f"printf '%s %d\\n' {self.token} \"$?\" >&3\n".encode())

    def resend(self) -> bytes:
        """A sentinel line to send again when an interrupt may have hit the first."""
        return f"printf '%s %d\\n' {self.token} 130 >&3\n".encode()

    def pending(self) -> bool:
        return self.rc is None or self.off[0] < self.marks[0] or self.off[1] < self.marks[1]

    def feed(self, c: "OutputChunk") -> bool:
        """Takes one chunk of the process's output; True once the command is complete."""
        i = {STDOUT: 0, STDERR: 1, CONTROL: 2}[c.stream]
        self.off[i] = c.offset + len(c.data)
        if i < 2:
            self.trunc[i] = self.trunc[i] or c.dropped > 0
            self.pieces[i].append((c.offset, c.data))
        else:
            self._ctl += c.data
            while b"\n" in self._ctl:
                rec, self._ctl = self._ctl.split(b"\n", 1)
                parts = rec.split()
                if len(parts) == 2 and parts[0] == self.token.encode():
                    self.rc = int(parts[1])
                    self.marks = [c.stdout_mark, c.stderr_mark]
        return not self.pending()

    def result(self, t0: float, timed_out: bool) -> ExecResult:
        """The command's ExecResult. Only bytes before the sentinel's marks are
        the command's; later ones (a background job's) are left for the next
        command."""
        assert self.rc is not None
        outs = []
        for i in (0, 1):
            outs.append(b"".join(d[:max(0, self.marks[i] - o)] for o, d in self.pieces[i]))
            self.off[i] = self.marks[i]
        so, se = outs
        return ExecResult(exit_code=self.rc, timed_out=timed_out, stdout=so, stderr=se,
                          stdout_truncated=self.trunc[0], stderr_truncated=self.trunc[1],
                          stdout_total_bytes=len(so), stderr_total_bytes=len(se),
                          duration_s=time.monotonic() - t0)


class Session:
    """A persistent shell in a sandbox (Sandbox.session()): cwd, exported
    environment, shell variables, functions and aliases carry over from one
    run() to the next. Several sessions of a sandbox run concurrently; one
    session runs one command at a time (run() calls are serialized).

    Built in the SDK on a background process: an interactive bash without
    job control (``bash --norc --noprofile --noediting -i``; stdin is a pipe,
    not a terminal). Each command is sent as one line ``eval $'<command>'``
    with stdin from /dev/null (so commands never eat the session's input),
    followed by a line printing a per-command random sentinel and ``$?`` to
    fd 3 — a separate pipe (the daemon's control stream), never mixed with
    the command's stdout/stderr. The daemon stamps that record with the
    stdout/stderr byte counts at the time, so output without a trailing
    newline and background jobs that keep running (their fd 3 is closed) do
    not disturb the end of a command. A timeout sends SIGINT to the shell's
    process group: the foreground command dies, bash (interactive) abandons
    the line and goes on; background jobs (which ignore SIGINT) survive; the
    result has timed_out=True and exit_code 130.

    Output of background jobs produced after their command ended shows up in
    a later command's output; bash's job notices ("[1] 123") go to stderr.
    """

    def __init__(self, sandbox: "Sandbox", cwd: Optional[str] = None,
                 env: Optional[Mapping[str, Union[str, bytes]]] = None, user: Optional[str] = None,
                 buffer_bytes: int = SESSION_BUFFER_BYTES):
        e: Dict[str, Union[str, bytes]] = {"PS1": "", "PS2": "", "PS0": "", "HISTFILE": "/dev/null"}
        e.update(env or {})
        self._sb = sandbox
        self._lock = threading.Lock()
        self.process = sandbox.spawn(_SESSION_ARGV, env=e, cwd=cwd, user=user, control_fd=True,
                                     buffer_bytes=buffer_bytes)
        self.id = self.process.id
        self._off = [0, 0, 0]  # stdout, stderr, control offsets consumed
        self._closed = False
        r = self._run_locked("set +H +o history; unset PROMPT_COMMAND; true", 60.0, discard=True)
        if r.exit_code != 0:
            raise errors.Internal(f"session shell did not start: {r!r}")

    def __repr__(self) -> str:
        return f"Session(sandbox_id={self._sb.id!r}, id={self.id!r})"

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Kills the shell and everything it started."""
        if self._closed:
            return
        self._closed = True
        try:
            self.process.kill()
        except errors.NotFound:
            pass

    def run(self, cmd: Union[str, bytes], timeout: Optional[float] = None) -> ExecResult:
        """Runs cmd (a shell string) in the session and returns its
        ExecResult: stdout/stderr are the bytes it wrote (exact), exit_code
        its $?. timeout (seconds): interrupt it with SIGINT then (timed_out,
        exit 130); the session stays usable. Raises FailedPrecondition if the
        shell is gone (e.g. the command ran `exit`)."""
        data = cmd.encode("utf-8", "surrogateescape") if isinstance(cmd, str) else bytes(cmd)
        if b"\0" in data:
            raise errors.InvalidArgument("session command contains NUL")
        if timeout is not None and timeout <= 0:
            raise errors.InvalidArgument(f"timeout must be > 0 seconds, got {timeout}")
        with self._lock:
            return self._run_locked(data, timeout)

    def _run_locked(self, cmd: Union[str, bytes], timeout: Optional[float], discard: bool = False) -> ExecResult:
        if self._closed:
            raise errors.FailedPrecondition(f"session {self.id} is closed")
        t0 = time.monotonic()
        cmdr = _SessionCommand(cmd.encode() if isinstance(cmd, str) else cmd, self._off)
        self.process.send_stdin(cmdr.input)
        timed_out = resent = False
        end = None if timeout is None else t0 + timeout
        while cmdr.pending():
            left = None if end is None else max(0.01, end - time.monotonic())
            st = self.process.stream(self._off[0], self._off[1], self._off[2], follow=True, timeout=left)
            try:
                for c in st:
                    if cmdr.feed(c):
                        break
                else:
                    if cmdr.rc is None:  # the stream ended: the shell exited
                        self._closed = True
                        code = st.result.exit_code if st.result else "?"
                        raise errors.FailedPrecondition(f"session {self.id}: the shell exited (exit code {code})")
            except errors.DeadlineExceeded:
                if cmdr.rc is None and not timed_out:
                    timed_out = True
                    self.process.signal(_signal.SIGINT, group_only=True)
                    end = time.monotonic() + _INTERRUPT_GRACE_S
                    continue
                if cmdr.rc is None and not resent:
                    # The interrupt may have hit the sentinel line itself: ask again.
                    resent = True
                    self.process.send_stdin(cmdr.resend())
                    end = time.monotonic() + _INTERRUPT_GRACE_S
                    continue
                raise errors.DeadlineExceeded(f"session {self.id}: the shell does not answer") from None
            finally:
                st.close()
        r = cmdr.result(t0, timed_out)
        return ExecResult(exit_code=r.exit_code) if discard else r
