"""Lifecycle for RL (issue 4; DESIGN.md section 5): TTL, pause/resume,
snapshots (pack_diff), fork, tamper-proof grading and the audit log, over the
Lifecycle gRPC service. Used through Sandbox methods (sb.pause(),
sb.snapshot(), sb.grade(), ...); this module holds the implementation.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Union

from . import errors
from ._proto import warren_pb2 as pb
from ._proto import warren_pb2_grpc as pb_grpc
from .types import ExecResult, Layer, SandboxInfo

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client, Sandbox

__all__ = ["Snapshot", "GradeResult", "Lifecycle", "Job", "JobInfo"]


@dataclass(frozen=True)
class Snapshot:
    """A sandbox's upper packed as a layer. `layers` are the digests of the
    sandbox's layers plus the new one, bottom first: create(layers=snap.layers)
    starts a sandbox with the snapshotted file system."""

    layer: Layer
    layers: List[str]


@dataclass(frozen=True)
class GradeResult:
    """The grader's outcome (run in a fresh sandbox from the pristine layers
    plus the agent's changes under the solution paths only) and every change
    of the agent outside the solution paths (`touched`: added, modified,
    deleted files, directories with a new mode or owner; at most 4096, then
    `touched_truncated`). `rejected` (non-empty): the solution could not be
    packed (over the sandbox's disk limit, a path longer than a layer
    holds); the grader did not run and the result is a failure."""

    result: ExecResult
    touched: List[str]
    grade_sandbox_id: str
    touched_truncated: bool = False
    rejected: str = ""

    @property
    def passed(self) -> bool:
        return self.result.exit_code == 0


def _grade_request(sandbox_id: str, grader: Union[str, bytes, Sequence[Union[str, bytes]]],
                   protected: Sequence[str], timeout: Optional[float],
                   env: Optional[Mapping[str, Union[str, bytes]]], cwd: Optional[str],
                   solution: Optional[Sequence[str]]) -> "pb.GradeRequest":
    """The request of sync and async grade (one source for both)."""
    if isinstance(solution, str):
        solution = [solution]
    if not solution:
        raise errors.InvalidArgument(
            "grade: solution= is required: the absolute paths where the task's solution lives "
            "(the agent's changes enter the grader only there)")
    return pb.GradeRequest(id=sandbox_id, grader=_exec_request(grader, timeout, env, cwd),
                           protected_paths=list(protected), solution=list(solution))


def _grade_result(r: "pb.GradeResponse") -> GradeResult:
    return GradeResult(result=ExecResult._from_pb(r.result), touched=list(r.touched),
                       grade_sandbox_id=r.grade_sandbox_id, touched_truncated=r.touched_truncated,
                       rejected=r.rejected)


def _exec_request(cmd: Union[str, bytes, Sequence[Union[str, bytes]]],
                  timeout: Optional[float], env: Optional[Mapping[str, Union[str, bytes]]],
                  cwd: Optional[str]) -> "pb.ExecRequest":
    req = pb.ExecRequest(cwd=cwd or "")
    for k, v in (env or {}).items():
        req.env[k] = v if isinstance(v, bytes) else v.encode("utf-8", "surrogateescape")
    if isinstance(cmd, (str, bytes)):
        req.shell = cmd if isinstance(cmd, bytes) else cmd.encode("utf-8", "surrogateescape")
    else:
        argv = [a if isinstance(a, bytes) else os.fsencode(a) for a in cmd]
        if not argv:
            raise errors.InvalidArgument("grade: empty argv")
        req.argv.extend(argv)
    if timeout is not None:
        if timeout <= 0:
            raise errors.InvalidArgument(f"grade: timeout must be > 0 seconds, got {timeout}")
        req.timeout_ms = max(1, int(round(timeout * 1000)))
    return req


class Lifecycle:
    """Lifecycle calls of one Client (thread-safe)."""

    def __init__(self, client: "Client"):
        self._client = client
        self._stub = pb_grpc.LifecycleStub(client._channel)

    def _md(self) -> Any:
        return self._client._metadata

    def _wrap(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from .client import _call
        return _call(fn)(*args, **kwargs)

    def extend_ttl(self, sandbox_id: str, ttl_s: int) -> SandboxInfo:
        return self._wrap(lambda: SandboxInfo._from_pb(self._stub.ExtendTtl(
            pb.ExtendTtlRequest(id=sandbox_id, ttl_s=int(ttl_s)), metadata=self._md())))

    def pause(self, sandbox_id: str) -> SandboxInfo:
        return self._wrap(lambda: SandboxInfo._from_pb(self._stub.Pause(
            pb.PauseRequest(id=sandbox_id), metadata=self._md())))

    def resume(self, sandbox_id: str, prefetch: bool = True) -> SandboxInfo:
        return self._wrap(lambda: SandboxInfo._from_pb(self._stub.Resume(
            pb.ResumeRequest(id=sandbox_id, no_prefetch=not prefetch), metadata=self._md())))

    def suspend(self, sandbox_id: str) -> SandboxInfo:
        return self._wrap(lambda: SandboxInfo._from_pb(self._stub.Suspend(
            pb.SuspendRequest(id=sandbox_id), metadata=self._md())))

    def list_jobs(self) -> List["JobInfo"]:
        return self._wrap(lambda: [JobInfo._from_pb(j) for j in self._stub.ListJobs(
            pb.ListJobsRequest(), metadata=self._md()).jobs])

    def snapshot(self, sandbox_id: str, name: Optional[str] = None,
                 exclude: Sequence[str] = (), pause: bool = True,
                 timeout: Optional[float] = None) -> Snapshot:
        def run() -> Snapshot:
            r = self._stub.Snapshot(pb.SnapshotRequest(
                id=sandbox_id, name=name or "", exclude=list(exclude), no_pause=not pause),
                metadata=self._md(), timeout=timeout)
            return Snapshot(layer=Layer._from_pb(r.layer), layers=list(r.layers))
        return self._wrap(run)

    def grade(self, sandbox_id: str, grader: Union[str, bytes, Sequence[Union[str, bytes]]],
              protected: Sequence[str] = (), timeout: Optional[float] = None,
              env: Optional[Mapping[str, Union[str, bytes]]] = None,
              cwd: Optional[str] = None, solution: Optional[Sequence[str]] = None) -> GradeResult:
        req = _grade_request(sandbox_id, grader, protected, timeout, env, cwd, solution)

        def run() -> GradeResult:
            return _grade_result(self._stub.Grade(req, metadata=self._md()))
        return self._wrap(run)

    def audit_log(self, sandbox_id: str) -> List[Dict[str, Any]]:
        def run() -> List[Dict[str, Any]]:
            r = self._stub.AuditLog(pb.AuditLogRequest(id=sandbox_id), metadata=self._md())
            return [json.loads(e) for e in r.entries]
        return self._wrap(run)


@dataclass(frozen=True)
class JobInfo:
    """A job's lease: lapsed=True means its sandboxes were suspended because no
    heartbeat came for lease_s seconds; they are destroyed grace_s after the
    lapse unless a heartbeat comes first (which resumes them)."""

    name: str
    lease_s: int
    grace_s: int
    lease_expires_at_ns: int
    lapsed: bool
    lapsed_at_ns: int
    sandboxes: int

    @classmethod
    def _from_pb(cls, j: "pb.Job") -> "JobInfo":
        return cls(j.name, j.lease_s, j.grace_s, j.lease_expires_at_ns, j.lapsed,
                   j.lapsed_at_ns, j.sandboxes)


class Job:
    """The sandboxes created with create(job=name), as one unit (client.job(name))."""

    def __init__(self, client: "Client", name: str):
        if not name:
            raise errors.InvalidArgument("job name is empty")
        self._client = client
        self._lc = client._lifecycle()
        self.name = name

    def __repr__(self) -> str:
        return f"Job(name={self.name!r})"

    def heartbeat(self, lease_s: Optional[int] = None, grace_s: Optional[int] = None) -> JobInfo:
        """Renews the lease (starts it on the first call). lease_s/grace_s:
        None keeps the previous values (defaults 60 s / 300 s)."""
        lc = self._lc
        return lc._wrap(lambda: JobInfo._from_pb(lc._stub.JobHeartbeat(
            pb.JobHeartbeatRequest(job=self.name, lease_s=int(lease_s or 0), grace_s=int(grace_s or 0)),
            metadata=lc._md())))

    def info(self) -> JobInfo:
        lc = self._lc
        return lc._wrap(lambda: JobInfo._from_pb(lc._stub.GetJob(
            pb.JobRequest(job=self.name), metadata=lc._md())))

    def list(self) -> List["Sandbox"]:
        return self._client.list(job=self.name)

    def _action(self, rpc: str) -> int:
        lc = self._lc
        return lc._wrap(lambda: getattr(lc._stub, rpc)(
            pb.JobRequest(job=self.name), metadata=lc._md()).affected)

    def suspend(self) -> int:
        """Suspends (pauses and reclaims the memory of) every running or paused
        sandbox of the job; returns how many."""
        return self._action("SuspendJob")

    def resume(self) -> int:
        """Resumes every paused or suspended sandbox of the job; returns how many."""
        return self._action("ResumeJob")

    def destroy(self) -> int:
        """Destroys every sandbox of the job and forgets its lease."""
        return self._action("DestroyJob")
