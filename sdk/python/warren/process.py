"""Streaming exec, background processes and shell sessions
(api/warren/v1/process.proto).

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

from ._core import Sync, SyncContext, SyncIterable
from ._process import (
    CONTROL,
    DEFAULT_BUFFER_BYTES,
    EOF,
    MAX_BUFFER_BYTES,
    SESSION_BUFFER_BYTES,
    STDERR,
    STDOUT,
    TIMEOUT,
    ExecStreamCore,
    OutputChunk,
    ProcessCore,
    ProcessInfo,
    ProcessOutput,
    ProcessStreamCore,
    SessionCore,
)

__all__ = ["OutputChunk", "ProcessInfo", "ProcessOutput", "ExecStream", "ProcessStream", "Process", "Session",
           "DEFAULT_BUFFER_BYTES", "MAX_BUFFER_BYTES", "SESSION_BUFFER_BYTES", "STDOUT", "STDERR", "CONTROL",
           "EOF", "TIMEOUT"]



class ExecStream(ExecStreamCore, SyncContext, SyncIterable):
    __doc__ = ExecStreamCore.__doc__


class ProcessStream(ProcessStreamCore, SyncContext, SyncIterable):
    __doc__ = ProcessStreamCore.__doc__


class Process(ProcessCore[ProcessStream], Sync):
    __doc__ = ProcessCore.__doc__
    _stream_cls = ProcessStream


class Session(SessionCore[Process], SyncContext):
    __doc__ = SessionCore.__doc__
