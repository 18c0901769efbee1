"""Core of Client and Layers, written once for both sides (see warren._core):
warren.client and warren.aio only pick the side. The sandbox's own core is
warren._sandbox."""

from __future__ import annotations

import os
import random
import threading
import time
from typing import (
    TYPE_CHECKING,
    Any,
    BinaryIO,
    Callable,
    Generic,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from . import errors
from ._core import (
    Background,
    CloseChannel,
    Gen,
    Rpc,
    RpcStreamIn,
    Sleep,
    WaitBackground,
    op,
)
from ._proto import desktop_pb2_grpc as dpb_grpc
from ._proto import fncall_pb2 as fpb
from ._proto import fncall_pb2_grpc as fpb_grpc
from ._proto import process_pb2_grpc as ppb_grpc
from ._proto import project_pb2 as prj
from ._proto import project_pb2_grpc as prj_grpc
from ._proto import warren_pb2 as pb
from ._proto import warren_pb2_grpc as pb_grpc
from ._requests import (
    _CREATE_GIVEN_UP,
    ABANDON_RETRY_S,
    DEFAULT_ADDR,
    _chunks,
    _create_request,
    _new_request_id,
    _target,
)
from ._sandbox import JB, SB, Env
from .fncall import FnCallRequest, FnCallResult
from .lifecycle import JobInfo
from .types import ClusterNode, Layer, NodeStatus, ProjectInfo, SandboxInfo

if TYPE_CHECKING:
    pass

# Backoff of create(retries=N): jittered, doubling from 10 ms up to 1 s.
_RETRY_FIRST_S = 0.01
_RETRY_MAX_S = 1.0


def _channel_options() -> List[Tuple[str, int]]:
    # Exec results carry up to 2 x 256 MiB of output.
    return [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


def _project_quota(
    sandboxes: int, cpu: Optional[float], memory_mb: int, creates_per_second: float, create_burst: int
) -> prj.ProjectQuota:
    """A project's quota as create_project/update_project take it (cpu in cores)."""
    return prj.ProjectQuota(
        sandboxes=sandboxes,
        cpu_millis=round((cpu or 0) * 1000),
        memory_mb=memory_mb,
        creates_per_second=creates_per_second,
        create_burst=create_burst,
    )


class LayersCore:
    """Layer API (``client.layers``): read-only EROFS layers named
    "kind/name@version" (kind in base, workspace, toolset) and addressed by
    "sha256:<hex>"."""

    def __init__(self, client: ClientCore[Any, Any]):
        self._client = client
        self._stub = pb_grpc.LayersStub(client._channel)

    @op
    def build(
        self,
        name: str,
        dir: Optional[str] = None,
        tar: Optional[Union[str, os.PathLike[str], BinaryIO]] = None,
        timeout: Optional[float] = None,
    ) -> Gen[Layer]:
        """Builds (and verifies) a layer and names it.

        Exactly one of dir (a directory on the daemon's host; root only, unix
        socket only) or tar (a path or binary file object of a tar, plain/gz/
        xz/zstd, streamed in 1 MiB chunks; OCI whiteouts honoured).
        Raises InvalidArgument (bad name; a tar entry with an absolute or ".."
        path or a device node, named in the message), AlreadyExists (the
        name@version points at a different digest), PermissionDenied.
        timeout: RPC deadline in seconds (None = none).
        """
        if (dir is None) == (tar is None):
            raise errors.InvalidArgument("layers.build: give exactly one of dir= or tar=")
        md = self._client._metadata
        if dir is not None:
            req = pb.BuildLayerRequest(name=name, source_dir=os.path.abspath(dir))
            return Layer._from_pb((yield RpcStreamIn(self._stub.Build, iter([req]), md, timeout)))
        assert tar is not None
        f: BinaryIO = open(tar, "rb") if isinstance(tar, (str, os.PathLike)) else tar  # noqa: SIM115 - closed below

        def requests() -> Iterator[pb.BuildLayerRequest]:
            yield pb.BuildLayerRequest(name=name)
            for chunk in _chunks(f):
                yield pb.BuildLayerRequest(tar_chunk=chunk)

        try:
            return Layer._from_pb((yield RpcStreamIn(self._stub.Build, requests(), md, timeout)))
        finally:
            if f is not tar:
                f.close()

    @op
    def list(self) -> Gen[List[Layer]]:
        """All layers in the store."""
        r = yield Rpc(self._stub.List, pb.ListLayersRequest(), self._client._metadata)
        return [Layer._from_pb(x) for x in r.layers]

    @op
    def get(self, ref: str) -> Gen[Layer]:
        """ref: "kind/name", "kind/name@version" (no version = newest) or
        "sha256:<hex>". NotFound if absent."""
        return Layer._from_pb((yield Rpc(self._stub.Get, pb.GetLayerRequest(ref=ref), self._client._metadata)))

    @op
    def remove(self, ref: str) -> Gen[None]:
        """Removes the name (and the image when nothing else points at it).
        FailedPrecondition if a sandbox uses it."""
        yield Rpc(self._stub.Remove, pb.RemoveLayerRequest(ref=ref), self._client._metadata)


class ClientCore(Generic[SB, JB]):
    """Connection to one warrend.

    addr: "unix:/path" or "/path" (unix socket) or "host:port" (TCP).
        Default: env WARREN_ADDR, else unix:/run/warren/warrend.sock.
    token: bearer token sent as "authorization: Bearer <token>" (needed over
        TCP). Default: env WARREN_TOKEN.

    Use as a context manager or call close() to release the channel.
    Nothing is contacted until the first call; an unreachable daemon raises
    Unavailable then.
    """

    # The side's classes (set by warren.client / warren.aio).
    _sandbox_cls: Callable[..., SB]
    _job_cls: Callable[..., JB]
    _files_cls: Callable[..., Any]
    _input_cls: Callable[..., Any]
    _layers_cls: Callable[..., Any]
    _images_cls: Callable[..., Any]
    _process_cls: Callable[..., Any]
    _exec_stream_cls: Callable[..., Any]
    _session_cls: Callable[..., Any]
    _background: Any
    layers: Any

    def __init__(self, addr: Optional[str] = None, token: Optional[str] = None):
        self.addr = addr or os.environ.get("WARREN_ADDR") or DEFAULT_ADDR
        token = token if token is not None else os.environ.get("WARREN_TOKEN")
        self._metadata: Optional[List[Tuple[str, str]]] = [("authorization", f"Bearer {token}")] if token else None
        self._channel = self._make_channel(_target(self.addr), _channel_options())
        self._sandboxes = pb_grpc.SandboxesStub(self._channel)
        self._node = pb_grpc.NodeStub(self._channel)
        self._files = pb_grpc.FilesStub(self._channel)
        self._lifecycle = pb_grpc.LifecycleStub(self._channel)
        self._processes = ppb_grpc.ProcessesStub(self._channel)
        self._fncall = fpb_grpc.FnCallStub(self._channel)
        self._desktop = dpb_grpc.DesktopStub(self._channel)
        self._projects = prj_grpc.ProjectsStub(self._channel)
        self._init_background()
        self.layers = self._layers_cls(self)
        self.images = self._images_cls(self)

    def _make_channel(self, target: str, options: List[Tuple[str, int]]) -> Any:
        raise NotImplementedError

    def _init_background(self) -> None:
        self._background = set()  # threads (sync) or tasks (async) of Background effects
        self._background_lock = threading.Lock()

    def _exit(self) -> Gen[None]:
        yield from ClientCore.close.fn(self)

    @op
    def close(self) -> Gen[None]:
        """Closes the channel; calls in flight are cancelled (they raise
        Cancelled, as do later calls). Abandons of given-up creates still
        running get up to 5 s first."""
        yield WaitBackground(self, 5.0)
        yield CloseChannel(self._channel)

    def _abandon(self, request_id: str) -> Gen[None]:
        """Abandons the create with request_id (the daemon destroys what that
        create made, now or when it finishes), retried while the daemon is
        unreachable, for up to ABANDON_RETRY_S."""
        end = time.monotonic() + ABANDON_RETRY_S
        delay = 0.1
        while True:
            try:
                yield Rpc(
                    self._sandboxes.Destroy, pb.DestroySandboxRequest(create_request_id=request_id), self._metadata, 10
                )
                return
            except (errors.Unavailable, errors.DeadlineExceeded):
                if time.monotonic() + delay > end:
                    return
            except errors.WarrenError:  # e.g. the client was closed: nothing left to do
                return
            yield Sleep(delay)
            delay = min(2.0, delay * 2)

    @op
    def create(
        self,
        backend: str = "container",
        layers: Sequence[str] = (),
        *,
        cpu: Optional[float] = None,
        memory_mb: Optional[int] = None,
        disk_mb: Optional[int] = None,
        pids: Optional[int] = None,
        open_files: Optional[int] = None,
        tmpfs_mb: Optional[int] = None,
        env: Env = None,
        workdir: Optional[str] = None,
        user: Optional[str] = None,
        hostname: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        ttl_s: Optional[int] = None,
        job: Optional[str] = None,
        timeout: Optional[float] = None,
        idle_timeout_s: Optional[int] = None,
        request_id: Optional[str] = None,
        retries: int = 0,
        image: Optional[str] = None,
        network: Optional[Mapping[str, Sequence[str]]] = None,
        qos: Optional[str] = None,
        start: bool = False,
        command: Optional[Sequence[Union[str, bytes]]] = None,
        expose: Optional[Sequence[int]] = None,
        expose_image_ports: bool = False,
    ) -> Gen[SB]:
        """Creates a sandbox and returns it running.

        layers: refs bottom first ("kind/name[@version]" or "sha256:<hex>").
        image: an image of the node ("name:tag", see client.images): its
        layers go below `layers` (e.g. toolset layers on top of it), and its
        config's Env, WorkingDir and User are defaults that env (per key),
        workdir and user override.
        start: start a main process once the sandbox is up, like `docker run
        -d IMAGE [ARGS]`: the image's Entrypoint followed by its Cmd, or by
        `command` (a list of arguments; it replaces Cmd, the Entrypoint
        stays; without an image it is the whole argv; a command implies
        start). A background process (see spawn) with the sandbox's env,
        workdir and user; its id is `sb.main_process` of the returned handle
        (`sb.process(sb.main_process)`). Nothing to run: InvalidArgument; a
        spawn the node cannot make fails the create (nothing kept); a
        command not found exits 127 as its spawn would.
        expose: ports exposed at create (see Sandbox.expose;
        info().exposed), plus with expose_image_ports the image's TCP
        ExposedPorts (like `docker run -P`). Needs warrend --sandbox-net.
        network: None = loopback only. {"allow": [...], "deny": [...]} = a
        routed, NAT'ed link filtered by that policy; entries
        "[tcp:|udp:|icmp:]CIDR[:PORT[-PORT]]" ("203.0.113.0/24",
        "tcp:198.51.100.7:443"), host names, or a node preset's name. Deny
        wins; private, link-local (169.254.169.254), loopback, multicast
        ranges and other sandboxes only through a node preset (warrend
        --net-preset): an entry of yours inside one is InvalidArgument;
        the node never. Needs
        warrend --sandbox-net (else FailedPrecondition). See set_network.
        cpu: cores (float, e.g. 0.5); memory_mb, disk_mb (writable upper cap),
        tmpfs_mb: /dev/shm cap in MiB (/tmp is in the upper, capped by
        disk_mb); pids: max tasks;
        qos: "latency" (None: the default, a cpu weight by its cpu) or
        "best-effort" (container backend): its processes run SCHED_IDLE with
        the lowest cgroup cpu weight and oom_score_adj 500, its memory is
        reclaimed first; admitted against the node's best-effort over-commit
        (warrend --overcommit). Shown as info().qos.
        open_files: RLIMIT_NOFILE. None = node default (cpu 1, memory_mb
        2048, disk_mb 1024, pids 1024, open_files 1024, tmpfs_mb 256). ttl_s: seconds of
        life, None = none. timeout: RPC deadline in seconds (None = none).

        When the node already runs its maximum of creates, this one waits in
        the node's FIFO create queue (up to `timeout`, if given).

        Raises InvalidArgument (bad layer ref, limit, env key, workdir, ...),
        NotFound (unknown layer), ResourceExhausted (node full / create queue
        full / disk full: retryable), DeadlineExceeded (timeout passed, also
        while queued), Unavailable (daemon unreachable: retryable).

        retries: how many times a retryable refusal (ResourceExhausted,
        Unavailable) is retried, with jittered exponential backoff from 10 ms
        up to 1 s (the retries carry the same request id: a retry after
        Unavailable returns the sandbox if the first attempt made it).

        request_id: idempotency key (<= 256 bytes): a retry with the same key
        returns the sandbox the first call made instead of a second one. Without
        it, a create that ends without the daemon's answer (DeadlineExceeded,
        Cancelled, Unavailable) leaves nothing behind: the SDK abandons it by
        an internal key (in the background; the daemon destroys what it made).
        With it, that is up to the caller (retry with the same key to get it).
        """
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise errors.InvalidArgument(f"retries must be an int >= 0, got {retries!r}")
        req = _create_request(
            backend,
            layers,
            cpu=cpu,
            memory_mb=memory_mb,
            disk_mb=disk_mb,
            pids=pids,
            open_files=open_files,
            tmpfs_mb=tmpfs_mb,
            env=env,
            workdir=workdir,
            user=user,
            hostname=hostname,
            labels=labels,
            ttl_s=ttl_s,
            job=job,
            idle_timeout_s=idle_timeout_s,
            request_id=request_id or _new_request_id(),
            image=image,
            network=network,
            qos=qos,
            start=start,
            command=command,
            expose=expose,
            expose_image_ports=expose_image_ports,
        )
        own_key = request_id is None
        delay = _RETRY_FIRST_S
        attempt = 0
        while True:
            try:
                s = yield Rpc(self._sandboxes.Create, req, self._metadata, timeout)
                return self._sandbox_cls(self, SandboxInfo._from_pb(s))
            except (errors.ResourceExhausted, errors.Unavailable) as e:
                if attempt < retries:
                    attempt += 1
                    yield Sleep(delay * (0.5 + random.random()))
                    delay = min(_RETRY_MAX_S, delay * 2)
                    continue
                if own_key and isinstance(e, _CREATE_GIVEN_UP):
                    yield Background(self, self._abandon(req.request_id))
                raise
            except _CREATE_GIVEN_UP:
                if own_key:
                    yield Background(self, self._abandon(req.request_id))
                raise
            except errors.WarrenError:
                raise
            except BaseException:  # KeyboardInterrupt / task cancelled: the answer will never be read
                if own_key:
                    yield Background(self, self._abandon(req.request_id))
                raise

    def _get_info(self, sandbox_id: str) -> Gen[SandboxInfo]:
        r = yield Rpc(self._sandboxes.Get, pb.GetSandboxRequest(id=sandbox_id), self._metadata)
        return SandboxInfo._from_pb(r)

    @op
    def get(self, sandbox_id: str) -> Gen[SB]:
        """Returns the sandbox with this id. NotFound if there is none."""
        return self._sandbox_cls(self, (yield from self._get_info(sandbox_id)))

    @op
    def list(
        self, labels: Optional[Mapping[str, str]] = None, job: Optional[str] = None, timeout: Optional[float] = None
    ) -> Gen[List[SB]]:
        """Sandboxes carrying all of labels (and of job, if given). timeout:
        RPC deadline in seconds (None = none)."""
        r = yield Rpc(
            self._sandboxes.List,
            pb.ListSandboxesRequest(labels=dict(labels or {}), job=job or ""),
            self._metadata,
            timeout,
        )
        return [self._sandbox_cls(self, SandboxInfo._from_pb(s)) for s in r.sandboxes]

    @op
    def destroy(self, sandbox_id: str, timeout: Optional[float] = None) -> Gen[None]:
        """Destroys a sandbox. NotFound if it does not exist. timeout: RPC
        deadline in seconds (None = none)."""
        yield Rpc(self._sandboxes.Destroy, pb.DestroySandboxRequest(id=sandbox_id), self._metadata, timeout)

    @op
    def abandon_create(self, request_id: str, timeout: Optional[float] = None) -> Gen[None]:
        """Gives up the create made with request_id (create(request_id=...)):
        its sandbox is destroyed if it was made, or as soon as it is; a later
        create with that request_id is refused (Cancelled). OK when nothing
        was made."""
        yield Rpc(
            self._sandboxes.Destroy, pb.DestroySandboxRequest(create_request_id=request_id), self._metadata, timeout
        )

    @op
    def fncall(
        self,
        code: Union[str, bytes],
        language: str = "python",
        *,
        stdin: Union[str, bytes] = b"",
        files: Optional[Mapping[str, Union[str, bytes]]] = None,
        fetch_files: Sequence[str] = (),
        env: Env = None,
        timeout: Optional[float] = None,
        compile_timeout: Optional[float] = None,
        memory_mb: Optional[int] = None,
        layers: Sequence[str] = (),
        output_cap: int = 0,
    ) -> Gen[FnCallResult]:
        """Runs `code` once on the fncall backend's warm pool (see warren.fncall).
        output_cap: bytes kept per stream (0 = 16 MiB); the rest is counted."""
        req = FnCallRequest(
            code=code,
            language=language,
            stdin=stdin,
            files=dict(files or {}),
            fetch_files=fetch_files,
            env=dict(env or {}),
            timeout=timeout,
            compile_timeout=compile_timeout,
            memory_mb=memory_mb,
            layers=layers,
            output_cap=output_cap,
        )
        r = yield Rpc(self._fncall.Call, req._pb(), self._metadata, req._deadline())
        return FnCallResult._from_pb(r)

    @op
    def fncall_batch(self, requests: Sequence[FnCallRequest], concurrency: int = 0) -> Gen[List[FnCallResult]]:
        """Runs many warren.FnCallRequest concurrently; results in request order."""
        if not requests:
            return []
        deadline = max(r._deadline() for r in requests) * (1 + len(requests) // 16)
        r = yield Rpc(
            self._fncall.CallBatch,
            fpb.FnCallBatchRequest(requests=[q._pb() for q in requests], concurrency=concurrency),
            self._metadata,
            deadline,
        )
        return [FnCallResult._from_pb(x) for x in r.responses]

    def job(self, name: str) -> JB:
        """The job `name` (sandboxes created with job=name): heartbeat(),
        info(), list(), suspend(), resume(), destroy()."""
        return self._job_cls(self, name)

    @op
    def jobs(self) -> Gen[List[JobInfo]]:
        """Every job the node knows (with a lease or with sandboxes), by name."""
        r = yield Rpc(self._lifecycle.ListJobs, pb.ListJobsRequest(), self._metadata)
        return [JobInfo._from_pb(j) for j in r.jobs]

    @op
    def status(self, timeout: Optional[float] = None) -> Gen[NodeStatus]:
        """Status of the node. Unavailable if the daemon is not reachable."""
        r = yield Rpc(self._node.Status, pb.NodeStatusRequest(), self._metadata, timeout)
        return NodeStatus._from_pb(r)

    @op
    def nodes(self, timeout: Optional[float] = None) -> Gen[List[ClusterNode]]:
        """The cluster's nodes by id, as the node this client talks to sees
        them. FailedPrecondition on a node that is not in a cluster."""
        r = yield Rpc(self._node.ListNodes, pb.ListNodesRequest(), self._metadata, timeout)
        return [ClusterNode._from_pb(n) for n in r.nodes]

    @op
    def drain(self, node_id: str = "", drain: bool = True, timeout: Optional[float] = None) -> Gen[ClusterNode]:
        """Stops (drain=True) or resumes (False) placing new sandboxes on node
        `node_id` ("" = the node this client talks to); its running sandboxes
        stay. Returns that node as it now publishes itself. NotFound for a
        node not in the cluster; FailedPrecondition outside a cluster."""
        r = yield Rpc(self._node.Drain, pb.DrainRequest(node_id=node_id, drain=drain), self._metadata, timeout)
        return ClusterNode._from_pb(r)

    @op
    def create_project(
        self,
        path: str,
        *,
        sandboxes: int = 0,
        cpu: Optional[float] = None,
        memory_mb: int = 0,
        creates_per_second: float = 0.0,
        create_burst: int = 0,
        timeout: Optional[float] = None,
    ) -> Gen[Tuple[ProjectInfo, str]]:
        """Creates project `path` ("team/run-7/eval"; its parent must exist)
        with quotas on it and everything below it, cluster-wide (0 / None =
        no limit of its own; at most the parent's). Returns the project and
        its bearer token (shown only now): a Client with that token acts for
        the project. A project token may create projects below its own.
        `creates_per_second` limits the rate of creates, cluster-wide (a
        generic cell rate algorithm: up to `create_burst` at once, default
        max(1, the rate), then the rate); a create over it raises
        ResourceExhausted naming the wait.
        AlreadyExists, NotFound (no parent), InvalidArgument (bad path, a
        quota above the parent's), FailedPrecondition outside a cluster."""
        q = _project_quota(sandboxes, cpu, memory_mb, creates_per_second, create_burst)
        r = yield Rpc(self._projects.Create, prj.CreateProjectRequest(path=path, quota=q), self._metadata, timeout)
        return ProjectInfo._from_pb(r.project), r.token

    @op
    def projects(self, timeout: Optional[float] = None) -> Gen[List[ProjectInfo]]:
        """The projects this client may see (all with the node token or the
        unix socket; its own and those below it with a project token), by path."""
        r = yield Rpc(self._projects.List, prj.ListProjectsRequest(), self._metadata, timeout)
        return [ProjectInfo._from_pb(p) for p in r.projects]

    @op
    def project(self, path: str, timeout: Optional[float] = None) -> Gen[ProjectInfo]:
        """Project `path` with its usage. NotFound when it does not exist."""
        r = yield Rpc(self._projects.Get, prj.GetProjectRequest(path=path), self._metadata, timeout)
        return ProjectInfo._from_pb(r)

    @op
    def update_project(
        self,
        path: str,
        *,
        sandboxes: int = 0,
        cpu: Optional[float] = None,
        memory_mb: int = 0,
        creates_per_second: float = 0.0,
        create_burst: int = 0,
        timeout: Optional[float] = None,
    ) -> Gen[ProjectInfo]:
        """Replaces project `path`'s quota as a whole (what is left 0 / None is
        no limit of its own): at most each ancestor's, at least the own limits
        of each project below it (InvalidArgument naming the one in the way).
        Sandboxes running over a lowered quota keep running; creates are
        refused until usage is back under it. A project token may update
        the projects below its own, not its own (PermissionDenied). Aborted
        when the project changed meanwhile (retry)."""
        q = _project_quota(sandboxes, cpu, memory_mb, creates_per_second, create_burst)
        r = yield Rpc(self._projects.Update, prj.UpdateProjectRequest(path=path, quota=q), self._metadata, timeout)
        return ProjectInfo._from_pb(r)

    @op
    def delete_project(self, path: str, timeout: Optional[float] = None) -> Gen[None]:
        """Deletes project `path` (none may be below it): its token stops
        working; its running sandboxes stay."""
        yield Rpc(self._projects.Delete, prj.DeleteProjectRequest(path=path), self._metadata, timeout)
