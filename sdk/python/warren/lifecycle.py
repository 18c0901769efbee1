"""Lifecycle for RL (DESIGN.md section 5): TTL, pause/resume, snapshots
(pack_diff), fork, tamper-proof grading and the audit log, over the
Lifecycle gRPC service. Used through Sandbox methods (sb.pause(),
sb.snapshot(), sb.grade(), ...) and jobs (client.job(name)); this module
holds their result types, the grade request and the Job core.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, List, Mapping, Optional, Sequence, TypeVar, Union, cast

from . import errors
from ._core import Gen, Rpc, Sync, op
from ._proto import warren_pb2 as pb
from ._requests import _u32
from .types import ExecResult, Layer

if TYPE_CHECKING:  # pragma: no cover
    from ._client_core import ClientCore
    from .client import Sandbox  # noqa: F401 - Job's type argument

__all__ = ["Snapshot", "GradeResult", "Job", "JobInfo"]

SB = TypeVar("SB")


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
                   solution: Optional[Sequence[str]]) -> pb.GradeRequest:
    """The request of sync and async grade (one source for both)."""
    if isinstance(solution, str):
        solution = [solution]
    if not solution:
        raise errors.InvalidArgument(
            "grade: solution= is required: the absolute paths where the task's solution lives "
            "(the agent's changes enter the grader only there)")
    return pb.GradeRequest(id=sandbox_id, grader=_exec_request(grader, timeout, env, cwd),
                           protected_paths=list(protected), solution=list(solution))


def _grade_result(r: pb.GradeResponse) -> GradeResult:
    return GradeResult(result=ExecResult._from_pb(r.result), touched=list(r.touched),
                       grade_sandbox_id=r.grade_sandbox_id, touched_truncated=r.touched_truncated,
                       rejected=r.rejected)


def _exec_request(cmd: Union[str, bytes, Sequence[Union[str, bytes]]],
                  timeout: Optional[float], env: Optional[Mapping[str, Union[str, bytes]]],
                  cwd: Optional[str]) -> pb.ExecRequest:
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
        req.timeout_ms = max(1, round(timeout * 1000))
    return req


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
    def _from_pb(cls, j: pb.Job) -> JobInfo:
        return cls(j.name, j.lease_s, j.grace_s, j.lease_expires_at_ns, j.lapsed,
                   j.lapsed_at_ns, j.sandboxes)


class JobCore(Generic[SB]):
    """The sandboxes created with create(job=name), as one unit (client.job(name))."""

    def __init__(self, client: ClientCore[SB, Any], name: str):
        if not name:
            raise errors.InvalidArgument("job name is empty")
        self._client = client
        self.name = name

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    def _lc(self, method: str, req: Any) -> Rpc:
        return Rpc(getattr(self._client._lifecycle, method), req, self._client._metadata)

    @op
    def heartbeat(self, lease_s: Optional[int] = None, grace_s: Optional[int] = None) -> Gen[JobInfo]:
        """Renews the lease (starts it on the first call). lease_s/grace_s:
        None keeps the previous values (defaults 60 s / 300 s)."""
        r = yield self._lc("JobHeartbeat", pb.JobHeartbeatRequest(job=self.name, lease_s=_u32("lease_s", lease_s),
                                                                   grace_s=_u32("grace_s", grace_s)))
        return JobInfo._from_pb(r)

    @op
    def info(self) -> Gen[JobInfo]:
        return JobInfo._from_pb((yield self._lc("GetJob", pb.JobRequest(job=self.name))))

    @op
    def list(self) -> Gen[List[SB]]:
        """The job's sandboxes."""
        from ._client_core import ClientCore
        c: Any = self._client
        sbs = yield from ClientCore.list.fn(c, job=self.name)
        return cast(List[SB], sbs)

    def _action(self, rpc: str) -> Gen[int]:
        r = yield self._lc(rpc, pb.JobRequest(job=self.name))
        return int(r.affected)

    @op
    def suspend(self) -> Gen[int]:
        """Suspends (pauses and reclaims the memory of) every running or paused
        sandbox of the job; returns how many."""
        return (yield from self._action("SuspendJob"))

    @op
    def resume(self) -> Gen[int]:
        """Resumes every paused or suspended sandbox of the job; returns how many."""
        return (yield from self._action("ResumeJob"))

    @op
    def destroy(self) -> Gen[int]:
        """Destroys every sandbox of the job and forgets its lease."""
        return (yield from self._action("DestroyJob"))


class Job(JobCore["Sandbox"], Sync):
    __doc__ = JobCore.__doc__
