"""Core of streaming exec, background processes and shell sessions, written
once for both sides (see warren._core); the public names are in
warren.process (sync) and warren.aio (async)."""

from __future__ import annotations

import asyncio
import re
import secrets
import signal as _signal
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Generic, List, Mapping, Optional, Tuple, TypeVar, Union

from . import errors
from ._core import END, Acquire, DoneWriting, Emit, Gen, Next, Open, OpenBidi, Rpc, Send, Stream, op
from ._proto import process_pb2 as ppb
from ._requests import _to_bytes, _u32
from .types import ExecResult

PS = TypeVar("PS")  # the side's ProcessStream
PR = TypeVar("PR")  # the side's Process

# Ring buffer per stream of a background process (daemon default), bytes.
DEFAULT_BUFFER_BYTES = 1 << 20
MAX_BUFFER_BYTES = 64 << 20
STDOUT, STDERR, CONTROL = "stdout", "stderr", "control"
_STREAM_NAMES = {ppb.OUTPUT_STREAM_STDOUT: STDOUT, ppb.OUTPUT_STREAM_STDERR: STDERR,
                 ppb.OUTPUT_STREAM_CONTROL: CONTROL}
# Seconds of one Wait RPC (waits longer than this are several calls).
_WAIT_SLICE_S = 30.0


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
    def _from_pb(cls, c: ppb.OutputChunk) -> OutputChunk:
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
    def _from_pb(cls, p: ppb.ProcessInfo) -> ProcessInfo:
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



_SESSION_ARGV = ["bash", "--norc", "--noprofile", "--noediting", "-i"]
# Seconds to wait for a command's sentinel after it was interrupted.
_INTERRUPT_GRACE_S = 2.0
_PTY_CHUNK = 800  # bytes of a command per line on a terminal (each quoted to at most 4 bytes)
# Set-up of a session on a terminal (session(pty=True)), before the usual
# one: no job control (commands stay in the shell's process group, so a
# time-out's SIGINT and ^C reach them), no echo of what is sent, and output
# bytes as written (no \n -> \r\n).
_PTY_SETUP = b"set +m; stty -echo -onlcr\n"
SESSION_BUFFER_BYTES = 4 << 20
# The first input of a session, read by bash as typed (not through eval):
# no history expansion, no prompt hooks, and the machinery that keeps the
# shell alive whatever a command does to it (see SessionCore):
# * fds 61-63 keep the shell's own stdout, stderr and control pipe; each
#   command runs with them (and fd 3) closed, and __warren_done puts 1, 2
#   and 3 back, so `exec 2>/dev/null` or `exec 1>&-` last one command.
# * __warren_opts is the shell's `set -o`/`shopt` state (without the line
#   editing and history options, which bash cannot switch while it reads a
#   line); __warren_done restores it, and resets the traps.
# * errexit must not exit the shell, and bash 5 exits an interactive shell
#   on an expansion error (`set -u`, `${x:?}`) while -e is on, before any
#   trap: so -e is never really on in the shell. `set` is an alias that runs
#   the builtin with the emulated state put back, and a one-shot DEBUG trap
#   after it moves -e into __warren_e. errtrace/functrace (-E -T) stay on;
#   the ERR trap, when __warren_e is set, exits a subshell, or in the shell
#   itself records the status and sends the shell SIGINT: an interactive
#   bash abandons the rest of the line (as for a timeout) and reads the
#   sentinel line next. `trap ... ERR` is wrapped so the user's action runs
#   first and `exit` in it ends the command, not the shell.
# * Only `exit` outside an ERR trap (the builtin) ends the shell.
_SESSION_SETUP = b"""set +H +o history; unset PROMPT_COMMAND
exec 61>&1 62>&2 63>&3
__warren_abort() { __warren_rc=$1; builtin set +e; exec 2>/dev/null; builtin trap - INT; builtin kill -INT $$; }
__warren_err() {
  [[ -n ${__warren_e-} ]] || return 0
  if [[ $BASHPID == "$$" ]]; then __warren_abort "$1"; else builtin exit "$1"; fi
}
__warren_arm() { [[ -n ${__warren_e-} ]] && builtin set -e; __warren_skip=1; builtin trap __warren_disarm DEBUG; }
__warren_disarm() {
  if [[ -n ${__warren_skip-} ]]; then __warren_skip=; return; fi
  if [[ $- == *e* ]]; then builtin set +e; __warren_e=1; else __warren_e=; fi
  builtin trap - DEBUG
}
alias set='__warren_arm; builtin set'

__warren_enter() { __warren_in_err=$1; return "$1"; }
__warren_leave() { local s=$__warren_in_err; __warren_in_err=; __warren_err "$s"; }
exit() {
  if [[ -n ${__warren_in_err-} && $BASHPID == "$$" ]]; then __warren_in_err=; __warren_abort "${1-$?}"
  else builtin exit "$@"; fi
}
trap() {
  case ${1-} in -l|-p|-lp|-pl) builtin trap "$@"; return;; esac
  [[ ${1-} == -- ]] && shift
  (($#)) || { builtin trap; return; }
  local act=- s rc=0
  if (($# > 1)); then act=$1; shift; fi
  for s in "$@"; do
    if [[ $s == ERR || $s == SIGERR ]]; then
      if [[ $act == - || -z $act ]]; then builtin trap -- '__warren_err $?' ERR
      else builtin trap -- "__warren_enter \\$?; $act
__warren_leave" ERR; fi
    else builtin trap -- "$act" "$s" || rc=$?; fi
  done
  return $rc
}
__warren_done() {
  local rc=$?
  builtin set +euo pipefail
  [[ -n ${__warren_rc-} ]] && rc=$__warren_rc
  __warren_rc= __warren_in_err= __warren_e=
  exec 1>&61 2>&62 3>&63
  builtin eval "$__warren_opts"
  builtin set -ET
  builtin trap - RETURN DEBUG EXIT INT
  builtin trap '__warren_err $?' ERR
  builtin printf '%s %d\\n' "$1" "$rc" >&3
}
builtin trap '__warren_err $?' ERR
set -ET
__warren_opts=
while read -r __warren_l; do
  case $__warren_l in *' emacs'|*' vi'|*' history'|*' monitor') ;; *) __warren_opts+="$__warren_l; ";; esac
done < <(set +o; shopt -p)
unset __warren_l
true
"""


class _ExpectMarker:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"warren.process.{self.name}"


# Session.expect() patterns that match the end of the started command's
# output (EOF) or the time-out (TIMEOUT) instead of raising, as pexpect's.
EOF = _ExpectMarker("EOF")
TIMEOUT = _ExpectMarker("TIMEOUT")


def _expect_patterns(pattern: Any) -> List[Any]:
    pats = list(pattern) if isinstance(pattern, (list, tuple)) else [pattern]
    if not pats:
        raise errors.InvalidArgument("expect: no pattern given")
    out: List[Any] = []
    for p in pats:
        if p is EOF or p is TIMEOUT:
            out.append(p)
        elif isinstance(p, str):
            out.append(re.compile(p.encode("utf-8")))
        elif isinstance(p, (bytes, bytearray)):
            out.append(re.compile(bytes(p)))
        elif isinstance(p, re.Pattern):
            out.append(p if isinstance(p.pattern, bytes) else re.compile(p.pattern.encode("utf-8")))
        else:
            raise errors.InvalidArgument(f"expect: a pattern is a str/bytes regex, EOF or TIMEOUT, got {p!r}")
    return out


def _session_env(env: Optional[Mapping[str, Union[str, bytes]]]) -> Dict[str, Union[str, bytes]]:
    e: Dict[str, Union[str, bytes]] = {"PS1": "", "PS2": "", "PS0": "", "HISTFILE": "/dev/null"}
    e.update(env or {})
    return e


def _bash_quote(data: bytes) -> str:
    """data as a bash $'...' word (every byte exact, NUL excluded)."""
    out = ["$'"]
    for b in data:
        c = chr(b)
        if c.isalnum() or c in " _-./,:=+@%^":
            out.append(c)
        else:
            out.append(f"\\x{b:02x}")
    out.append("'")
    return "".join(out)


class _SessionCommand:
    """One command of a session being read back; shared by Session and
    AsyncSession, which own the stream loop (sync or async). `off` is the
    session's consumed [stdout, stderr, control] offsets, advanced in place.
    The command is complete once the sentinel record (token, $?) arrived on
    the control stream and stdout/stderr were read up to the byte marks the
    daemon stamped on it."""

    def __init__(self, data: bytes, off: List[int], raw: bool = False, interactive: bool = False,
                 pty: bool = False):
        self.token = secrets.token_hex(16)
        self.off = off
        self.pieces: List[List[Tuple[int, bytes]]] = [[], []]  # (offset, data) per stream
        self.trunc = [False, False]
        self.rc: Optional[int] = None
        self.marks = [0, 0]
        self._ctl = b""
        # The command line, then a line printing the sentinel and $? to fd 3.
        # raw (the session's setup): the lines as they are, then the sentinel.
        # interactive (start()): stdin stays the session's (pipe or terminal)
        # and the sentinel goes on the same line: bash reads one line before
        # it runs it, so the command, not bash, reads what is typed next.
        # pty: a terminal's line discipline holds at most 4095 bytes of a
        # line, so a longer command is sent as several assignments first.
        if raw:
            line = data
        else:
            redir = b" 3>&- 61>&- 62>&- 63>&-" if interactive else b" </dev/null 3>&- 61>&- 62>&- 63>&-"
            if pty and len(data) > _PTY_CHUNK:
                parts = [data[i:i + _PTY_CHUNK] for i in range(0, len(data), _PTY_CHUNK)]
                lines = [(b"__warren_c=" if i == 0 else b"__warren_c+=") + _bash_quote(d).encode()
                         for i, d in enumerate(parts)]
                line = b"\n".join(lines) + b'\neval "$__warren_c"' + redir
            else:
                line = b"eval " + _bash_quote(data).encode() + redir
        if interactive:
            self.input = line + b"; " + self.resend()
        else:
            self.input = line.rstrip(b"\n") + b"\n" + self.resend()

    def resend(self) -> bytes:
        """The sentinel line: __warren_done restores the shell's fds, options
        and traps and prints the token and the command's status to fd 3.
        Sent again when an interrupt may have hit the first ($? is then 130)."""
        return f"__warren_done {self.token}\n".encode()

    def pending(self) -> bool:
        return self.rc is None or self.off[0] < self.marks[0] or self.off[1] < self.marks[1]

    def feed(self, c: OutputChunk) -> bool:
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




def next_emit(gen: Gen[None]) -> Gen[Any]:
    """Drives an iterating core method from inside another core method: its
    effects are passed up, and the next value it emits is returned (END once
    it finished)."""
    send: Any = None
    exc: Optional[BaseException] = None
    while True:
        try:
            eff = gen.throw(exc) if exc is not None else gen.send(send)
        except StopIteration:
            return END
        if type(eff) is Emit:
            return eff.value
        send, exc = None, None
        try:
            send = yield eff
        except BaseException as e:
            exc = e


class ExecStreamCore:
    """A running streaming exec (Sandbox.exec_stream): iterate it for
    OutputChunk objects as the command produces them (stdout and stderr each
    in order; every byte, the command is slowed down rather than output
    dropped). After the iteration ends, `result` is the ExecResult (exit code,
    signal, timed_out, byte totals; stdout/stderr empty unless collected by
    exec(on_stdout=...)).

    send_stdin()/close_stdin()/signal()/resize() act while it runs; close()
    (or leaving a ``with`` block, or the client going away) kills the
    command's whole process tree if it still runs.
    """

    _kicked: Callable[[], Gen[None]]

    def __init__(self, client: Any, first: ppb.ExecStreamRequest, collect_cap: int = 0):
        self._client = client
        self._first = first
        self._stream: Optional[Stream] = None
        self._cap = collect_cap
        self._parts: List[List[bytes]] = [[], []]
        self._sizes = [0, 0]
        self._trunc = [False, False]
        self.result: Optional[ExecResult] = None
        self.info: Optional[ProcessInfo] = None

    def _open(self) -> Gen[None]:
        self._stream = yield OpenBidi(self._client._processes.ExecStream, self._client._metadata)
        yield Send(self._stream, self._first)  # the request goes first

    def _ready(self) -> Gen[Stream]:
        yield from self._kicked()
        assert self._stream is not None
        return self._stream

    def _cancel(self) -> None:
        if self._stream is not None:
            self._stream.cancel()

    def _exit(self) -> Gen[None]:
        yield from ExecStreamCore.close.fn(self)

    def _events(self) -> Gen[None]:
        st = yield from self._ready()
        try:
            while True:
                ev = yield Next(st)
                if ev is END:
                    return
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
                    yield Emit(c)
                elif kind == "exit":
                    r = ExecResult._from_pb(ev.exit)
                    self.result = ExecResult(
                        exit_code=r.exit_code, signal=r.signal, oom_killed=r.oom_killed, timed_out=r.timed_out,
                        stdout=b"".join(self._parts[0]), stderr=b"".join(self._parts[1]),
                        stdout_truncated=self._trunc[0], stderr_truncated=self._trunc[1],
                        stdout_total_bytes=r.stdout_total_bytes, stderr_total_bytes=r.stderr_total_bytes,
                        duration_s=r.duration_s)
                    yield DoneWriting(st)
        finally:
            st.end_input()

    @op
    def wait(self) -> Gen[ExecResult]:
        """Consumes the rest of the output and returns the result."""
        events = self._events()
        while (yield from next_emit(events)) is not END:
            pass
        assert self.result is not None
        return self.result

    def _send(self, m: ppb.ExecStreamRequest) -> Gen[None]:
        st = yield from self._ready()
        yield Send(st, m)

    @op
    def send_stdin(self, data: Union[bytes, str]) -> Gen[None]:
        """Queues data for the command's stdin."""
        yield from self._send(ppb.ExecStreamRequest(stdin=_to_bytes(data)))

    @op
    def close_stdin(self) -> Gen[None]:
        yield from self._send(ppb.ExecStreamRequest(close_stdin=True))

    @op
    def signal(self, sig: int = _signal.SIGTERM) -> Gen[None]:
        """Sends sig to every process of the command's tree."""
        yield from self._send(ppb.ExecStreamRequest(signal=int(sig)))

    @op
    def resize(self, rows: int, cols: int) -> Gen[None]:
        """New PTY window size (pty=True only)."""
        yield from self._send(ppb.ExecStreamRequest(resize_rows=_u32("rows", rows), resize_cols=_u32("cols", cols)))

    @op
    def close(self) -> Gen[None]:
        """Ends the call; a command still running is killed (whole tree)."""
        try:
            st = yield from self._ready()
        except errors.WarrenError:
            return  # never started
        if self.result is None:
            st.cancel()
        else:
            yield DoneWriting(st)


class ProcessStreamCore:
    """Output of a background process as it is produced (Process.stream()):
    iterate for OutputChunk objects; after the end, `result` is the
    ExecResult (None if the stream was not followed to the exit)."""

    def __init__(self, client: Any, req: ppb.ProcessOutputRequest, timeout: Optional[float]):
        self._client = client
        self._req = req
        self._timeout = timeout
        self._stream: Optional[Stream] = None
        self._cancelled = False
        self.result: Optional[ExecResult] = None

    def _exit(self) -> Gen[None]:
        yield from ProcessStreamCore.close.fn(self)

    def _stopped(self) -> bool:
        return self._cancelled

    def _events(self) -> Gen[None]:
        if self._stopped():
            return
        self._stream = st = yield Open(self._client._processes.Output, self._req, self._client._metadata,
                                       self._timeout)
        try:
            while True:
                ev = yield Next(st)
                if ev is END:
                    return
                kind = ev.WhichOneof("event")
                if kind == "output":
                    yield Emit(OutputChunk._from_pb(ev.output))
                elif kind == "exit":
                    self.result = ExecResult._from_pb(ev.exit)
        except (errors.Cancelled, asyncio.CancelledError):
            if self._stopped():
                return
            raise

    @op
    def close(self) -> Gen[None]:
        """Stops following (the process keeps running)."""
        self._cancelled = True
        if self._stream is not None:
            self._stream.cancel()
        yield from ()  # a core method without effects


class ProcessCore(Generic[PS]):
    """Handle of a background process (Sandbox.spawn / Sandbox.process).
    The process lives in the daemon: the handle survives client disconnects
    and can be re-made from its id (sb.process(id)) by any client. It dies
    with its sandbox. Thread-safe."""

    _stream_cls: Callable[..., PS]

    def __init__(self, sandbox: Any, process_id: str, info: Optional[ProcessInfo] = None):
        self._sb = sandbox
        self._client = sandbox._client
        self.id = process_id
        self.sandbox_id: str = sandbox.id
        self._info = info

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sandbox_id={self.sandbox_id!r}, id={self.id!r})"

    def _ref(self) -> ppb.ProcessRef:
        return ppb.ProcessRef(sandbox_id=self.sandbox_id, process_id=self.id)

    def _rpc(self, method: str, req: Any, timeout: Optional[float] = None) -> Rpc:
        return Rpc(getattr(self._client._processes, method), req, self._client._metadata, timeout)

    @property
    def cached_info(self) -> Optional[ProcessInfo]:
        return self._info

    @op
    def info(self) -> Gen[ProcessInfo]:
        """Current state (NotFound if the process or its sandbox is gone)."""
        self._info = ProcessInfo._from_pb((yield self._rpc("Get", self._ref())))
        return self._info

    @op
    def wait(self, timeout: Optional[float] = None) -> Gen[ExecResult]:
        """Waits for the exit (timeout in seconds, None = forever) and returns
        its ExecResult (no output bytes: see output()). Raises
        DeadlineExceeded if it still runs after timeout."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = _WAIT_SLICE_S if end is None else max(0.0, min(_WAIT_SLICE_S, end - time.monotonic()))
            p = yield self._rpc("Wait", ppb.WaitProcessRequest(ref=self._ref(), timeout_ms=int(left * 1000)),
                                left + 30)
            self._info = info = ProcessInfo._from_pb(p)
            if not info.running:
                assert info.result is not None
                return info.result
            if end is not None and time.monotonic() >= end:
                raise errors.DeadlineExceeded(f"process {self.id} still running after {timeout} s")

    @op
    def signal(self, sig: int, group_only: bool = False) -> Gen[None]:
        """Sends sig to every process of its tree (default) or, group_only,
        to the foreground process's process group."""
        yield self._rpc("Signal", ppb.SignalProcessRequest(ref=self._ref(), signal=int(sig), group_only=group_only))

    @op
    def kill(self, sig: int = _signal.SIGKILL) -> Gen[None]:
        """Sends sig (default SIGKILL) to the whole process tree (setsid'ed and
        double-forked descendants included)."""
        yield from ProcessCore.signal.fn(self, sig)

    @op
    def send_stdin(self, data: Union[bytes, str]) -> Gen[None]:
        """Queues data for the process's stdin. FailedPrecondition once stdin
        was closed or the process exited."""
        yield self._rpc("Input", ppb.ProcessInputRequest(ref=self._ref(), data=_to_bytes(data)))

    @op
    def close_stdin(self) -> Gen[None]:
        yield self._rpc("Input", ppb.ProcessInputRequest(ref=self._ref(), close=True))

    @op
    def resize(self, rows: int, cols: int) -> Gen[None]:
        """New PTY window size. FailedPrecondition without a PTY."""
        yield self._rpc("Resize", ppb.ResizeRequest(ref=self._ref(), rows=_u32("rows", rows), cols=_u32("cols", cols)))

    @op
    def output(self, stdout_offset: int = 0, stderr_offset: int = 0) -> Gen[ProcessOutput]:
        """The output buffered now from these offsets on (see ProcessOutput)."""
        req = ppb.ProcessOutputRequest(ref=self._ref(), stdout_offset=stdout_offset,
                                       stderr_offset=stderr_offset, follow=False)
        parts: Dict[str, List[bytes]] = {STDOUT: [], STDERR: []}
        start = {STDOUT: stdout_offset, STDERR: stderr_offset}
        end = dict(start)
        dropped = {STDOUT: 0, STDERR: 0}
        first = {STDOUT: True, STDERR: True}
        result: Optional[ExecResult] = None
        st = yield Open(self._client._processes.Output, req, self._client._metadata, 60)
        while True:
            ev = yield Next(st)
            if ev is END:
                break
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
        return ProcessOutput(stdout=b"".join(parts[STDOUT]), stderr=b"".join(parts[STDERR]),
                             stdout_offset=start[STDOUT], stderr_offset=start[STDERR],
                             stdout_dropped=dropped[STDOUT], stderr_dropped=dropped[STDERR],
                             stdout_end=end[STDOUT], stderr_end=end[STDERR], result=result)

    def stream(self, stdout_offset: int = 0, stderr_offset: int = 0, control_offset: int = 0,
               follow: bool = True, timeout: Optional[float] = None) -> PS:
        """Output from these offsets on: what is buffered, then (follow) new
        output as it is produced until the process exits. timeout: RPC
        deadline in seconds (DeadlineExceeded while iterating). Returns the
        ProcessStream at once (not a coroutine on the async side)."""
        req = ppb.ProcessOutputRequest(ref=self._ref(), stdout_offset=stdout_offset, stderr_offset=stderr_offset,
                                       control_offset=control_offset, follow=follow)
        return self._stream_cls(self._client, req, timeout)


class SessionCore(Generic[PR]):
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

    Each command is like a script sourced into the session: what it does
    to the shell itself lasts for that command only. Shell options (``set
    -e``/``-u``/``-o pipefail``, ``shopt``), traps and redirections of the
    shell's own fds (``exec 2>/dev/null``) are put back after it; errexit,
    an unset variable under ``set -u`` and ``exit`` inside an ERR trap end
    the command with its status, never the shell. Variables, functions,
    aliases, exports, positional parameters and the cwd carry over. Only
    an explicit ``exit`` (outside an ERR trap) ends the session: that
    run() raises FailedPrecondition naming the shell's exit code, and so
    does every later call. To keep the shell alive, errexit is emulated
    (``$-`` does not show ``e``; ``set`` is an alias of the builtin) and
    errtrace and functrace (``-E -T``) are always on; an EXIT trap does
    not outlive its command.

    Output of background jobs produced after their command ended shows up in
    a later command's output; bash's job notices ("[1] 123") go to stderr.

    Interactive commands (prompts, REPLs; pexpect's way): start(cmd) runs a
    command whose stdin is the session's input, send()/sendline() type to
    it, expect(patterns, timeout) reads its output until a regex matches
    (returns the pattern's index; `before`, `after`, `match` as pexpect's),
    and wait() returns its ExecResult (exit code, the output expect() did not
    consume). With session(pty=True) the shell runs on a terminal (stdout
    and stderr are one stream, as on a terminal; echo and \n -> \r\n are
    off, `stty echo onlcr` turns them on), which programs that prompt only
    on a terminal (bash's read -p, sudo, apt's y/n) need; on pipes,
    expect() reads stdout only (or both with merge_stderr=True).
    """

    process: PR
    _new_lock: Callable[[], Any]

    def __init__(self, process: PR):
        self.process = process
        self.id: str = process.id  # type: ignore[attr-defined]
        self._lock = self._new_lock()
        self._off = [0, 0, 0]  # stdout, stderr, control offsets consumed
        self._closed = False
        self._pty = False
        self._started: Optional[_SessionCommand] = None  # start()'s command until wait()
        self._t0 = 0.0
        self._buf = b""  # stdout read since start() that expect() did not consume
        self._ebuf = b""  # stderr likewise (pipes only)
        self.before = b""  # expect(): what came before the match
        self.after: Any = b""  # the match's bytes, or EOF / TIMEOUT
        self.match: Optional[re.Match[bytes]] = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sandbox_id={self.process.sandbox_id!r}, id={self.id!r})"  # type: ignore[attr-defined]

    def _exit(self) -> Gen[None]:
        yield from SessionCore.close.fn(self)

    def _start(self) -> Gen[None]:
        setup = (_PTY_SETUP + _SESSION_SETUP) if self._pty else _SESSION_SETUP
        r = yield from self._run_locked(setup, 60.0, raw=True)
        if r.exit_code != 0:
            raise errors.Internal(f"session shell did not start: {r!r}")

    @op
    def close(self) -> Gen[None]:
        """Kills the shell and everything it started."""
        if self._closed:
            return
        self._closed = True
        p: Any = self.process
        try:
            yield from ProcessCore.kill.fn(p)
        except errors.NotFound:
            pass

    @op
    def run(self, cmd: Union[str, bytes], timeout: Optional[float] = None) -> Gen[ExecResult]:
        """Runs cmd (a shell string) in the session and returns its
        ExecResult: stdout/stderr are the bytes it wrote (exact), exit_code
        its $?. timeout (seconds): interrupt it with SIGINT then (timed_out,
        exit 130); the session stays usable. Raises FailedPrecondition if the
        shell is gone (the command ran `exit`: the message names its code)."""
        data = cmd.encode("utf-8", "surrogateescape") if isinstance(cmd, str) else bytes(cmd)
        if b"\0" in data:
            raise errors.InvalidArgument("session command contains NUL")
        if timeout is not None and timeout <= 0:
            raise errors.InvalidArgument(f"timeout must be > 0 seconds, got {timeout}")
        yield Acquire(self._lock)
        try:
            return (yield from self._run_locked(data, timeout))
        finally:
            self._lock.release()

    def _run_locked(self, data: bytes, timeout: Optional[float], raw: bool = False) -> Gen[ExecResult]:
        if self._closed:
            raise errors.FailedPrecondition(f"session {self.id} is closed")
        if self._started is not None:
            raise errors.FailedPrecondition(f"session {self.id}: a start()ed command is running; wait() for it first")
        p: Any = self.process
        t0 = time.monotonic()
        cmdr = _SessionCommand(data, self._off, raw, pty=self._pty)
        yield from ProcessCore.send_stdin.fn(p, cmdr.input)
        timed_out = resent = False
        end = None if timeout is None else t0 + timeout
        while cmdr.pending():
            left = None if end is None else max(0.01, end - time.monotonic())
            st = p.stream(self._off[0], self._off[1], self._off[2], follow=True, timeout=left)
            events = st._events()
            try:
                while True:
                    c = yield from next_emit(events)
                    if c is END:
                        if cmdr.rc is None:  # the stream ended: the shell exited
                            self._closed = True
                            code = st.result.exit_code if st.result else "?"
                            raise errors.FailedPrecondition(
                                f"session {self.id}: the shell exited (exit code {code})")
                        break
                    if cmdr.feed(c):
                        break
            except errors.DeadlineExceeded:
                if cmdr.rc is None and not timed_out:
                    timed_out = True
                    yield from ProcessCore.signal.fn(p, _signal.SIGINT, group_only=True)
                    end = time.monotonic() + _INTERRUPT_GRACE_S
                    continue
                if cmdr.rc is None and not resent:
                    # The interrupt may have hit the sentinel line itself: ask again.
                    resent = True
                    yield from ProcessCore.send_stdin.fn(p, cmdr.resend())
                    end = time.monotonic() + _INTERRUPT_GRACE_S
                    continue
                raise errors.DeadlineExceeded(f"session {self.id}: the shell does not answer") from None
            finally:
                events.close()
                st._cancelled = True
                if st._stream is not None:
                    st._stream.cancel()
        return cmdr.result(t0, timed_out)

    # ---- interactive commands (start / send / expect / wait)

    @staticmethod
    def _data(cmd: Union[str, bytes], what: str) -> bytes:
        data = cmd.encode("utf-8", "surrogateescape") if isinstance(cmd, str) else bytes(cmd)
        if b"\0" in data:
            raise errors.InvalidArgument(f"session {what} contains NUL")
        return data

    def _need_started(self, what: str) -> _SessionCommand:
        if self._closed:
            raise errors.FailedPrecondition(f"session {self.id} is closed")
        if self._started is None:
            raise errors.FailedPrecondition(f"session {self.id}: {what} needs a command started with start(cmd)")
        return self._started

    def _ended(self) -> bool:
        c = self._started
        return c is not None and c.rc is not None and self._off[0] >= c.marks[0] and self._off[1] >= c.marks[1]

    def _take(self, c: OutputChunk) -> None:
        if c.stream == CONTROL:
            if self._started is not None:
                self._started.feed(c)  # the sentinel record: rc and byte marks
            else:
                self._off[2] = c.offset + len(c.data)
            return
        i = 0 if c.stream == STDOUT else 1
        end = c.offset + len(c.data)
        if end <= self._off[i]:
            return
        data = c.data[max(0, self._off[i] - c.offset):]
        self._off[i] = end
        if i == 0:
            self._buf += data
        else:
            self._ebuf += data

    def _read_until(self, cond: Callable[[], bool], end: Optional[float]) -> Gen[str]:
        """Reads output until cond() holds ("ok"), the deadline passes
        ("timeout") or the shell exits ("exit")."""
        p: Any = self.process
        while not cond():
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return "timeout"
            st = p.stream(self._off[0], self._off[1], self._off[2], follow=True,
                          timeout=None if left is None else max(0.01, left))
            events = st._events()
            try:
                while True:
                    c = yield from next_emit(events)
                    if c is END:
                        self._closed = True
                        return "exit"
                    self._take(c)
                    if cond():
                        return "ok"
            except errors.DeadlineExceeded:
                return "timeout"
            finally:
                events.close()
                st._cancelled = True
                if st._stream is not None:
                    st._stream.cancel()
        return "ok"

    @op
    def start(self, cmd: Union[str, bytes]) -> Gen[None]:
        """Starts cmd (a shell string) in the session with the session's
        input as its stdin and returns at once; talk to it with send(),
        sendline() and expect(), then wait() for its result. One at a time:
        run() and start() raise FailedPrecondition until wait() returned."""
        data = self._data(cmd, "command")
        yield Acquire(self._lock)
        try:
            if self._closed:
                raise errors.FailedPrecondition(f"session {self.id} is closed")
            if self._started is not None:
                raise errors.FailedPrecondition(
                    f"session {self.id}: a start()ed command is running; wait() for it first")
            c = _SessionCommand(data, self._off, interactive=True, pty=self._pty)
            self._started, self._t0, self._buf, self._ebuf = c, time.monotonic(), b"", b""
            self.before, self.after, self.match = b"", b"", None
            p: Any = self.process
            yield from ProcessCore.send_stdin.fn(p, c.input)
        finally:
            self._lock.release()

    @op
    def send(self, data: Union[str, bytes]) -> Gen[None]:
        """Types data (str: UTF-8) to the started command's stdin."""
        b = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else bytes(data)
        self._need_started("send()")
        p: Any = self.process
        yield from ProcessCore.send_stdin.fn(p, b)

    @op
    def sendline(self, line: Union[str, bytes] = b"") -> Gen[None]:
        """send(line + newline)."""
        b = line.encode("utf-8", "surrogateescape") if isinstance(line, str) else bytes(line)
        yield from SessionCore.send.fn(self, b + b"\n")

    @op
    def expect(self, pattern: Any, timeout: Optional[float] = 30.0) -> Gen[int]:
        """Reads the started command's output until one of `pattern` (a
        regex as str or bytes, a compiled one, EOF, TIMEOUT, or a list of
        them) matches, and returns its index in the list (0 for a single
        pattern). The earliest match in the output wins (ties: the first
        pattern). Sets `before` (bytes before the match), `after` (the
        matched bytes) and `match`; output after the match stays for the
        next expect() or wait(). The command ending without a match matches
        EOF (else raises FailedPrecondition naming the exit code and the
        output); timeout (seconds, None = none) matches TIMEOUT (else raises
        DeadlineExceeded with the output read so far)."""
        pats = _expect_patterns(pattern)
        yield Acquire(self._lock)
        try:
            started = self._need_started("expect()")
            end = None if timeout is None else time.monotonic() + timeout
            found: List[Tuple[int, re.Match[bytes]]] = []

            def search() -> bool:
                best: Optional[Tuple[int, re.Match[bytes]]] = None
                for i, pat in enumerate(pats):
                    if isinstance(pat, re.Pattern):
                        m = pat.search(self._buf)
                        if m is not None and (best is None or m.start() < best[1].start()):
                            best = (i, m)
                if best is not None:
                    found.append(best)
                    return True
                return self._ended()

            why = yield from self._read_until(search, end)
            if found:
                i, m = found[-1]
                self.before, self.after, self.match = self._buf[:m.start()], m.group(0), m
                self._buf = self._buf[m.end():]
                return i
            self.match = None
            if why == "timeout":
                if TIMEOUT in pats:
                    self.before, self.after = self._buf, TIMEOUT
                    return pats.index(TIMEOUT)
                raise errors.DeadlineExceeded(
                    f"session {self.id}: no match for {pattern!r} within {timeout} s; output so far: "
                    f"{self._buf[-500:]!r}")
            if EOF in pats:
                self.before, self.after, self._buf = self._buf, EOF, b""
                return pats.index(EOF)
            code = started.rc if why == "ok" else "? (the shell exited)"
            raise errors.FailedPrecondition(
                f"session {self.id}: the command ended (exit code {code}) with no match for {pattern!r}; "
                f"its output: {self._buf[-500:]!r}")
        finally:
            self._lock.release()

    @op
    def wait(self, timeout: Optional[float] = None) -> Gen[ExecResult]:
        """Waits for the started command to end and returns its ExecResult:
        exit_code its $?, stdout/stderr what expect() did not consume.
        timeout (seconds): interrupt it with SIGINT then (timed_out, exit
        130), as run(); the session stays usable."""
        yield Acquire(self._lock)
        try:
            c = self._need_started("wait()")
            p: Any = self.process
            end = None if timeout is None else time.monotonic() + timeout
            why = yield from self._read_until(self._ended, end)
            timed_out = False
            if why == "timeout":
                timed_out = True
                yield from ProcessCore.signal.fn(p, _signal.SIGINT, group_only=True)
                why = yield from self._read_until(self._ended, time.monotonic() + _INTERRUPT_GRACE_S)
                if why == "timeout":  # the interrupt abandoned the line with the sentinel: ask again
                    yield from ProcessCore.send_stdin.fn(p, c.resend())
                    why = yield from self._read_until(self._ended, time.monotonic() + _INTERRUPT_GRACE_S)
                if why == "timeout":
                    raise errors.DeadlineExceeded(f"session {self.id}: the shell does not answer")
            if why == "exit":
                self._started = None
                raise errors.FailedPrecondition(f"session {self.id}: the shell exited")
            assert c.rc is not None
            so = self._buf[:len(self._buf) - max(0, self._off[0] - c.marks[0])]
            se = self._ebuf[:len(self._ebuf) - max(0, self._off[1] - c.marks[1])]
            self._off[0], self._off[1] = c.marks
            self._started, self._buf, self._ebuf = None, b"", b""
            return ExecResult(exit_code=c.rc, timed_out=timed_out, stdout=so, stderr=se,
                              stdout_total_bytes=len(so), stderr_total_bytes=len(se),
                              duration_s=time.monotonic() - self._t0)
        finally:
            self._lock.release()
