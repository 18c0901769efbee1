"""Exceptions raised by the warren SDK.

Every error the daemon returns is a gRPC status; it is mapped to exactly one
exception class here, in :func:`from_rpc_error` (the only place that mapping
lives). The outcome of a command (exit code, signal, OOM, timeout) is never an
exception: it is an :class:`warren.ExecResult`.
"""

from __future__ import annotations

from typing import Dict, Optional, Type

import grpc

__all__ = [
    "WarrenError",
    "Cancelled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
    "from_rpc_error",
    "from_closed_channel",
]


class WarrenError(Exception):
    """Base of every SDK error.

    Attributes:
        code: the ``grpc.StatusCode`` the daemon answered with (or that the SDK
            chose for an error it detected itself before sending).
        details: the daemon's message (it names the offending field, path,
            layer or syscall).
        retryable: True when retrying the same call later can succeed
            (``ResourceExhausted``, ``Unavailable``).
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN
    retryable: bool = False

    def __init__(self, details: str = "", code: Optional[grpc.StatusCode] = None):
        super().__init__(details)
        self.details = details
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code.name}: {self.details}"


class Cancelled(WarrenError):
    """The call was cancelled (usually by the client)."""

    code = grpc.StatusCode.CANCELLED


class Unknown(WarrenError):
    """The daemon answered with an unknown error."""

    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(WarrenError):
    """Malformed input: layer names, limits, paths, env keys, ..."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(WarrenError):
    """The RPC deadline passed before the daemon answered."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(WarrenError):
    """Unknown sandbox, layer or path."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(WarrenError):
    """A layer name@version pointing elsewhere, mkdir of an existing path."""

    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(WarrenError):
    """Bad bearer token, or EACCES inside the sandbox."""

    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(WarrenError):
    """Admission refused (node full, create queue full, disk full).

    Retryable: the message carries a retry hint.
    """

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    retryable = True


class FailedPrecondition(WarrenError):
    """Sandbox not running, directory not empty, layer in use, ..."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(WarrenError):
    """The operation was aborted (e.g. a concurrent conflicting call)."""

    code = grpc.StatusCode.ABORTED


class OutOfRange(WarrenError):
    """A value past a valid range (e.g. a read offset)."""

    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(WarrenError):
    """The daemon does not implement this call or backend."""

    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(WarrenError):
    """A daemon bug or unexpected kernel error (the message names the syscall)."""

    code = grpc.StatusCode.INTERNAL


class Unavailable(WarrenError):
    """The daemon is not reachable or is shutting down. Retryable."""

    code = grpc.StatusCode.UNAVAILABLE
    retryable = True


class DataLoss(WarrenError):
    """Unrecoverable data loss or corruption (e.g. a corrupt layer)."""

    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(WarrenError):
    """Missing or malformed credentials."""

    code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE: Dict[grpc.StatusCode, Type[WarrenError]] = {
    cls.code: cls
    for cls in (
        Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound,
        AlreadyExists, PermissionDenied, ResourceExhausted, FailedPrecondition,
        Aborted, OutOfRange, Unimplemented, Internal, Unavailable, DataLoss,
        Unauthenticated,
    )
}


def from_rpc_error(err: grpc.RpcError) -> WarrenError:
    """Returns the WarrenError subclass instance for a failed gRPC call."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    cls = _BY_CODE.get(code, Unknown)
    return cls(details or "", code)


def from_closed_channel(err: ValueError) -> Optional[WarrenError]:
    """The WarrenError for grpc's ValueError on a call made through a closed
    channel (the Client was closed, maybe by another thread, while a command
    or a session was still using it): Cancelled, as gRPC reports the calls
    that were in flight when it closed. None for any other ValueError."""
    if "closed channel" not in str(err):
        return None
    return Cancelled("the client was closed: " + str(err), grpc.StatusCode.CANCELLED)
