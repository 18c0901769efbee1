"""warren: Python SDK of the warren sandbox platform.

    import warren
    client = warren.Client()               # WARREN_ADDR or unix:/run/warren/warrend.sock
    with client.create(layers=["base/debian-12"], cpu=1, memory_mb=1024) as sb:
        r = sb.exec("echo hi", timeout=60)  # r.exit_code r.stdout (bytes) r.text
        sb.files.write("/w/a.txt", b"hi", make_parents=True)

Errors are the exception hierarchy of warren.errors, mapped one-to-one from
gRPC status codes.
"""

from ._images import Image, ImageConfig, ImageLayer, ImageProgress, PruneResult
from .aio import AsyncClient, AsyncSandbox
from .client import CHUNK_SIZE, DEFAULT_ADDR, Client, Files, Images, Layers, Sandbox
from .errors import (
                     Aborted,
                     AlreadyExists,
                     Cancelled,
                     DataLoss,
                     DeadlineExceeded,
                     FailedPrecondition,
                     Internal,
                     InvalidArgument,
                     NotFound,
                     OutOfRange,
                     PermissionDenied,
                     ResourceExhausted,
                     Unauthenticated,
                     Unavailable,
                     Unimplemented,
                     Unknown,
                     WarrenError,
)
from .fncall import FnCallRequest, FnCallResult
from .process import ExecStream, OutputChunk, Process, ProcessInfo, ProcessOutput, Session
from .types import (
                     ClusterNode,
                     ExecResult,
                     ExposedPort,
                     FileInfo,
                     Layer,
                     NetworkTraffic,
                     NodeStatus,
                     ProjectInfo,
                     QosClassCapacity,
                     Resources,
                     SandboxInfo,
)

__version__ = "0.1.0"

__all__ = [
    "Image", "ImageConfig", "ImageLayer", "ImageProgress", "Images", "PruneResult",
    "Client", "AsyncClient", "AsyncSandbox", "Sandbox", "Files", "Layers", "DEFAULT_ADDR", "CHUNK_SIZE",
    "ClusterNode", "ExecResult", "FnCallRequest", "FnCallResult", "FileInfo", "Layer", "NodeStatus", "ProjectInfo",
    "QosClassCapacity", "Resources", "SandboxInfo", "ExposedPort", "NetworkTraffic",
    "WarrenError", "Aborted", "AlreadyExists", "Cancelled", "DataLoss",
    "DeadlineExceeded", "FailedPrecondition", "Internal", "InvalidArgument",
    "NotFound", "OutOfRange", "PermissionDenied", "ResourceExhausted",
    "Unauthenticated", "Unavailable", "Unimplemented", "Unknown",
    "ExecStream", "OutputChunk", "Process", "ProcessInfo", "ProcessOutput", "Session",
]
