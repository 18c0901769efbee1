"""Synchronous client of warrend (api/warren/v1/warren.proto).

A Client is thread-safe: one Client (one gRPC channel) can serve many threads
creating, executing in and destroying sandboxes concurrently.

The classes here are the sync side of the one SDK implementation in
warren._sandbox / warren._client_core / warren._process (see warren._core); warren.aio is the
async side of the same code.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, List, Tuple, TypeVar

import grpc

from . import errors
from ._client_core import ClientCore, LayersCore
from ._core import Sync, SyncContext
from ._images import ImagesCore
from ._requests import (  # noqa: F401
    ABANDON_RETRY_S,
    CHUNK_SIZE,
    DEFAULT_ADDR,
    EXEC_DEADLINE_MARGIN_S,
    MAX_OUTPUT_CAP,
    Data,
    PathLike,
    _check_data,
    _chunks,
    _create_request,
    _env_pb,
    _exec_request,
    _new_request_id,
    _path_bytes,
    _target,
    _u32,
    _u32_or_u64,
)
from ._sandbox import FilesCore, SandboxCore
from .desktop import InputCore
from .lifecycle import Job
from .process import ExecStream, Process, Session

__all__ = ["Client", "Sandbox", "Files", "Layers", "Images", "DEFAULT_ADDR", "CHUNK_SIZE"]

T = TypeVar("T")


def _call(fn: Callable[..., T]) -> Callable[..., T]:
    """Turns grpc.RpcError raised by fn (a raw stub call) into the matching
    WarrenError."""

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


class Files(FilesCore, Sync):
    __doc__ = FilesCore.__doc__


class Input(InputCore, Sync):
    __doc__ = InputCore.__doc__


class Layers(LayersCore, Sync):
    __doc__ = LayersCore.__doc__


class Images(ImagesCore, Sync):
    __doc__ = ImagesCore.__doc__


class Sandbox(SandboxCore["Sandbox", Process, ExecStream, Session], SyncContext):
    __doc__ = SandboxCore.__doc__
    files: Files
    input: Input


class Client(ClientCore[Sandbox, Job], SyncContext):
    __doc__ = (ClientCore.__doc__ or "") + "\n    Thread-safe.\n"
    layers: Layers
    images: Images
    _sandbox_cls = Sandbox
    _job_cls = Job
    _files_cls = Files
    _input_cls = Input
    _layers_cls = Layers
    _images_cls = Images
    _process_cls = Process
    _exec_stream_cls = ExecStream
    _session_cls = Session

    def _make_channel(self, target: str, options: List[Tuple[str, int]]) -> Any:
        return grpc.insecure_channel(target, options=options)
