from warren.v1 import warren_pb2 as _warren_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FnCallRequest(_message.Message):
    __slots__ = ("language", "code", "stdin", "files", "fetch_files", "env", "run_timeout_ms", "compile_timeout_ms", "memory_mb", "layers", "output_cap_bytes")
    class FilesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    FETCH_FILES_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    RUN_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    COMPILE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_CAP_BYTES_FIELD_NUMBER: _ClassVar[int]
    language: str
    code: bytes
    stdin: bytes
    files: _containers.ScalarMap[str, bytes]
    fetch_files: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, bytes]
    run_timeout_ms: int
    compile_timeout_ms: int
    memory_mb: int
    layers: _containers.RepeatedScalarFieldContainer[str]
    output_cap_bytes: int
    def __init__(self, language: _Optional[str] = ..., code: _Optional[bytes] = ..., stdin: _Optional[bytes] = ..., files: _Optional[_Mapping[str, bytes]] = ..., fetch_files: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, bytes]] = ..., run_timeout_ms: _Optional[int] = ..., compile_timeout_ms: _Optional[int] = ..., memory_mb: _Optional[int] = ..., layers: _Optional[_Iterable[str]] = ..., output_cap_bytes: _Optional[int] = ...) -> None: ...

class FnCallResponse(_message.Message):
    __slots__ = ("compile", "run", "files", "missing_files", "sandbox_error", "duration_ns")
    class FilesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    COMPILE_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    MISSING_FILES_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ERROR_FIELD_NUMBER: _ClassVar[int]
    DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    compile: _warren_pb2.ExecResult
    run: _warren_pb2.ExecResult
    files: _containers.ScalarMap[str, bytes]
    missing_files: _containers.RepeatedScalarFieldContainer[str]
    sandbox_error: str
    duration_ns: int
    def __init__(self, compile: _Optional[_Union[_warren_pb2.ExecResult, _Mapping]] = ..., run: _Optional[_Union[_warren_pb2.ExecResult, _Mapping]] = ..., files: _Optional[_Mapping[str, bytes]] = ..., missing_files: _Optional[_Iterable[str]] = ..., sandbox_error: _Optional[str] = ..., duration_ns: _Optional[int] = ...) -> None: ...

class FnCallBatchRequest(_message.Message):
    __slots__ = ("requests", "concurrency")
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[FnCallRequest]
    concurrency: int
    def __init__(self, requests: _Optional[_Iterable[_Union[FnCallRequest, _Mapping]]] = ..., concurrency: _Optional[int] = ...) -> None: ...

class FnCallBatchResponse(_message.Message):
    __slots__ = ("responses",)
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[FnCallResponse]
    def __init__(self, responses: _Optional[_Iterable[_Union[FnCallResponse, _Mapping]]] = ...) -> None: ...
