"""fncall: stateless function calls on warrend's warm worker pool.

    import warren
    client = warren.Client()
    r = client.fncall("print(1+1)", language="python")   # -> FnCallResult
    r.stdout == b"2\\n"; r.exit_code == 0; r.run (an ExecResult)
    rs = client.fncall_batch([warren.FnCallRequest("print(i)") ...])

Every call starts from a pristine worker: no file, environment variable,
process or imported-module change of one call is visible to the next. The
code's outcome (non-zero exit, signal, OOM, time-out, compile error) is a
result, never an exception; a failure of the platform for that call (no
compiler in the image, a path outside /tmp, worker lost) is in
``sandbox_error``. Languages: "python", "bash", "cpp", "c" (C/C++ need
gcc/g++ in the layers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from . import errors
from ._proto import fncall_pb2 as fpb
from ._proto import fncall_pb2_grpc as fpb_grpc
from .types import ExecResult

__all__ = ["FnCallRequest", "FnCallResult", "FnCall"]

Bytes = Union[str, bytes]
# Seconds added to a call's time-outs to form its RPC deadline.
DEADLINE_MARGIN_S = 60.0


def _b(v: Bytes) -> bytes:
    return v.encode() if isinstance(v, str) else bytes(v)


def _ms(name: str, seconds: Optional[float]) -> int:
    if seconds is None:
        return 0
    if seconds < 0:
        raise errors.InvalidArgument(f"{name} must be >= 0, got {seconds}")
    return max(1, int(seconds * 1000)) if seconds > 0 else 0


@dataclass
class FnCallRequest:
    """One call. timeout / compile_timeout in seconds (None = 10 s)."""

    code: Bytes
    language: str = "python"
    stdin: Bytes = b""
    files: Mapping[str, Bytes] = field(default_factory=dict)
    fetch_files: Sequence[str] = ()
    env: Mapping[str, Bytes] = field(default_factory=dict)
    timeout: Optional[float] = None
    compile_timeout: Optional[float] = None
    memory_mb: Optional[int] = None
    layers: Sequence[str] = ()
    output_cap: int = 0

    def _pb(self) -> fpb.FnCallRequest:
        return fpb.FnCallRequest(
            language=self.language, code=_b(self.code), stdin=_b(self.stdin),
            files={k: _b(v) for k, v in self.files.items()}, fetch_files=list(self.fetch_files),
            env={k: _b(v) for k, v in self.env.items()},
            run_timeout_ms=_ms("timeout", self.timeout),
            compile_timeout_ms=_ms("compile_timeout", self.compile_timeout),
            memory_mb=self.memory_mb or 0, layers=list(self.layers), output_cap_bytes=self.output_cap)

    def _deadline(self) -> float:
        return (self.timeout or 10.0) + (self.compile_timeout or 10.0) + DEADLINE_MARGIN_S


@dataclass
class FnCallResult:
    """run: the run stage's ExecResult (None when compilation or the platform
    failed); compile: the compile stage's (compiled languages only)."""

    run: Optional[ExecResult]
    compile: Optional[ExecResult] = None
    files: Dict[str, bytes] = field(default_factory=dict)
    missing_files: List[str] = field(default_factory=list)
    sandbox_error: str = ""
    duration_s: float = 0.0

    @property
    def exit_code(self) -> Optional[int]:
        return self.run.exit_code if self.run else None

    @property
    def stdout(self) -> bytes:
        return self.run.stdout if self.run else b""

    @property
    def stderr(self) -> bytes:
        return self.run.stderr if self.run else b""

    @property
    def text(self) -> str:
        return self.run.stdout_text if self.run else ""

    @property
    def timed_out(self) -> bool:
        return bool(self.run and self.run.timed_out)

    @property
    def ok(self) -> bool:
        """The run exited 0 and the platform did not fail."""
        return not self.sandbox_error and self.run is not None and self.run.ok

    @staticmethod
    def _from_pb(r: fpb.FnCallResponse) -> FnCallResult:
        return FnCallResult(
            run=ExecResult._from_pb(r.run) if r.HasField("run") else None,
            compile=ExecResult._from_pb(r.compile) if r.HasField("compile") else None,
            files=dict(r.files), missing_files=list(r.missing_files),
            sandbox_error=r.sandbox_error, duration_s=r.duration_ns / 1e9)


class FnCall:
    """The FnCall service of one Client (shares its channel and token)."""

    def __init__(self, channel: Any, metadata: Any):
        self._stub = fpb_grpc.FnCallStub(channel)
        self._md = metadata

    def call(self, req: FnCallRequest) -> FnCallResult:
        try:
            return FnCallResult._from_pb(self._stub.Call(req._pb(), metadata=self._md,
                                                         timeout=req._deadline()))
        except Exception as e:  # grpc.RpcError -> warren error
            raise _map(e) from None

    def batch(self, reqs: Sequence[FnCallRequest], concurrency: int = 0) -> List[FnCallResult]:
        if not reqs:
            return []
        deadline = max(r._deadline() for r in reqs) * (1 + len(reqs) // 16)
        try:
            resp = self._stub.CallBatch(
                fpb.FnCallBatchRequest(requests=[r._pb() for r in reqs], concurrency=concurrency),
                metadata=self._md, timeout=deadline)
        except Exception as e:
            raise _map(e) from None
        return [FnCallResult._from_pb(r) for r in resp.responses]


def _map(e: Exception) -> Exception:
    import grpc
    if isinstance(e, grpc.RpcError):
        return errors.from_rpc_error(e)
    return e
