from warren.v1 import warren_pb2 as _warren_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProcessState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROCESS_STATE_UNSPECIFIED: _ClassVar[ProcessState]
    PROCESS_STATE_RUNNING: _ClassVar[ProcessState]
    PROCESS_STATE_EXITED: _ClassVar[ProcessState]

class OutputStream(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTPUT_STREAM_UNSPECIFIED: _ClassVar[OutputStream]
    OUTPUT_STREAM_STDOUT: _ClassVar[OutputStream]
    OUTPUT_STREAM_STDERR: _ClassVar[OutputStream]
    OUTPUT_STREAM_CONTROL: _ClassVar[OutputStream]
PROCESS_STATE_UNSPECIFIED: ProcessState
PROCESS_STATE_RUNNING: ProcessState
PROCESS_STATE_EXITED: ProcessState
OUTPUT_STREAM_UNSPECIFIED: OutputStream
OUTPUT_STREAM_STDOUT: OutputStream
OUTPUT_STREAM_STDERR: OutputStream
OUTPUT_STREAM_CONTROL: OutputStream

class StartOptions(_message.Message):
    __slots__ = ("pty", "rows", "cols", "control_fd", "buffer_bytes")
    PTY_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    CONTROL_FD_FIELD_NUMBER: _ClassVar[int]
    BUFFER_BYTES_FIELD_NUMBER: _ClassVar[int]
    pty: bool
    rows: int
    cols: int
    control_fd: bool
    buffer_bytes: int
    def __init__(self, pty: _Optional[bool] = ..., rows: _Optional[int] = ..., cols: _Optional[int] = ..., control_fd: _Optional[bool] = ..., buffer_bytes: _Optional[int] = ...) -> None: ...

class OutputChunk(_message.Message):
    __slots__ = ("stream", "data", "offset", "dropped_bytes", "stdout_mark", "stderr_mark")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BYTES_FIELD_NUMBER: _ClassVar[int]
    STDOUT_MARK_FIELD_NUMBER: _ClassVar[int]
    STDERR_MARK_FIELD_NUMBER: _ClassVar[int]
    stream: OutputStream
    data: bytes
    offset: int
    dropped_bytes: int
    stdout_mark: int
    stderr_mark: int
    def __init__(self, stream: _Optional[_Union[OutputStream, str]] = ..., data: _Optional[bytes] = ..., offset: _Optional[int] = ..., dropped_bytes: _Optional[int] = ..., stdout_mark: _Optional[int] = ..., stderr_mark: _Optional[int] = ...) -> None: ...

class ProcessInfo(_message.Message):
    __slots__ = ("sandbox_id", "process_id", "argv", "shell", "state", "result", "pty", "started_at_ns", "pid", "stdout_total_bytes", "stderr_total_bytes", "stdout_first_offset", "stderr_first_offset", "buffer_bytes")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    SHELL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    PTY_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_NS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STDOUT_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    STDERR_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BUFFER_BYTES_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    process_id: str
    argv: _containers.RepeatedScalarFieldContainer[bytes]
    shell: bytes
    state: ProcessState
    result: _warren_pb2.ExecResult
    pty: bool
    started_at_ns: int
    pid: int
    stdout_total_bytes: int
    stderr_total_bytes: int
    stdout_first_offset: int
    stderr_first_offset: int
    buffer_bytes: int
    def __init__(self, sandbox_id: _Optional[str] = ..., process_id: _Optional[str] = ..., argv: _Optional[_Iterable[bytes]] = ..., shell: _Optional[bytes] = ..., state: _Optional[_Union[ProcessState, str]] = ..., result: _Optional[_Union[_warren_pb2.ExecResult, _Mapping]] = ..., pty: _Optional[bool] = ..., started_at_ns: _Optional[int] = ..., pid: _Optional[int] = ..., stdout_total_bytes: _Optional[int] = ..., stderr_total_bytes: _Optional[int] = ..., stdout_first_offset: _Optional[int] = ..., stderr_first_offset: _Optional[int] = ..., buffer_bytes: _Optional[int] = ...) -> None: ...

class ProcessEvent(_message.Message):
    __slots__ = ("started", "output", "exit")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    EXIT_FIELD_NUMBER: _ClassVar[int]
    started: ProcessInfo
    output: OutputChunk
    exit: _warren_pb2.ExecResult
    def __init__(self, started: _Optional[_Union[ProcessInfo, _Mapping]] = ..., output: _Optional[_Union[OutputChunk, _Mapping]] = ..., exit: _Optional[_Union[_warren_pb2.ExecResult, _Mapping]] = ...) -> None: ...

class ExecStreamRequest(_message.Message):
    __slots__ = ("exec", "options", "stdin", "close_stdin", "signal", "resize_rows", "resize_cols")
    EXEC_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    CLOSE_STDIN_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    RESIZE_ROWS_FIELD_NUMBER: _ClassVar[int]
    RESIZE_COLS_FIELD_NUMBER: _ClassVar[int]
    exec: _warren_pb2.ExecRequest
    options: StartOptions
    stdin: bytes
    close_stdin: bool
    signal: int
    resize_rows: int
    resize_cols: int
    def __init__(self, exec: _Optional[_Union[_warren_pb2.ExecRequest, _Mapping]] = ..., options: _Optional[_Union[StartOptions, _Mapping]] = ..., stdin: _Optional[bytes] = ..., close_stdin: _Optional[bool] = ..., signal: _Optional[int] = ..., resize_rows: _Optional[int] = ..., resize_cols: _Optional[int] = ...) -> None: ...

class SpawnRequest(_message.Message):
    __slots__ = ("exec", "options")
    EXEC_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    exec: _warren_pb2.ExecRequest
    options: StartOptions
    def __init__(self, exec: _Optional[_Union[_warren_pb2.ExecRequest, _Mapping]] = ..., options: _Optional[_Union[StartOptions, _Mapping]] = ...) -> None: ...

class ProcessRef(_message.Message):
    __slots__ = ("sandbox_id", "process_id")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    process_id: str
    def __init__(self, sandbox_id: _Optional[str] = ..., process_id: _Optional[str] = ...) -> None: ...

class ListProcessesRequest(_message.Message):
    __slots__ = ("sandbox_id",)
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    def __init__(self, sandbox_id: _Optional[str] = ...) -> None: ...

class ListProcessesResponse(_message.Message):
    __slots__ = ("processes",)
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    processes: _containers.RepeatedCompositeFieldContainer[ProcessInfo]
    def __init__(self, processes: _Optional[_Iterable[_Union[ProcessInfo, _Mapping]]] = ...) -> None: ...

class WaitProcessRequest(_message.Message):
    __slots__ = ("ref", "timeout_ms")
    REF_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ref: ProcessRef
    timeout_ms: int
    def __init__(self, ref: _Optional[_Union[ProcessRef, _Mapping]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class SignalProcessRequest(_message.Message):
    __slots__ = ("ref", "signal", "group_only")
    REF_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    GROUP_ONLY_FIELD_NUMBER: _ClassVar[int]
    ref: ProcessRef
    signal: int
    group_only: bool
    def __init__(self, ref: _Optional[_Union[ProcessRef, _Mapping]] = ..., signal: _Optional[int] = ..., group_only: _Optional[bool] = ...) -> None: ...

class ProcessInputRequest(_message.Message):
    __slots__ = ("ref", "data", "close")
    REF_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    ref: ProcessRef
    data: bytes
    close: bool
    def __init__(self, ref: _Optional[_Union[ProcessRef, _Mapping]] = ..., data: _Optional[bytes] = ..., close: _Optional[bool] = ...) -> None: ...

class ResizeRequest(_message.Message):
    __slots__ = ("ref", "rows", "cols")
    REF_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    ref: ProcessRef
    rows: int
    cols: int
    def __init__(self, ref: _Optional[_Union[ProcessRef, _Mapping]] = ..., rows: _Optional[int] = ..., cols: _Optional[int] = ...) -> None: ...

class ProcessOutputRequest(_message.Message):
    __slots__ = ("ref", "stdout_offset", "stderr_offset", "control_offset", "follow")
    REF_FIELD_NUMBER: _ClassVar[int]
    STDOUT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    STDERR_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONTROL_OFFSET_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    ref: ProcessRef
    stdout_offset: int
    stderr_offset: int
    control_offset: int
    follow: bool
    def __init__(self, ref: _Optional[_Union[ProcessRef, _Mapping]] = ..., stdout_offset: _Optional[int] = ..., stderr_offset: _Optional[int] = ..., control_offset: _Optional[int] = ..., follow: _Optional[bool] = ...) -> None: ...
