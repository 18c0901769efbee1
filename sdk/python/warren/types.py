"""Plain result types returned by the SDK (no gRPC objects leak out)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ._proto import project_pb2 as prj
from ._proto import warren_pb2 as pb

__all__ = [
    "ClusterNode",
    "ExecResult",
    "ExposedPort",
    "FileInfo",
    "Layer",
    "NetworkTraffic",
    "ProjectInfo",
    "SandboxInfo",
    "NodeStatus",
    "Resources",
]

_STATES = {
    pb.SANDBOX_STATE_UNSPECIFIED: "unspecified",
    pb.SANDBOX_STATE_CREATING: "creating",
    pb.SANDBOX_STATE_RUNNING: "running",
    pb.SANDBOX_STATE_PAUSED: "paused",
    pb.SANDBOX_STATE_STOPPED: "stopped",
    pb.SANDBOX_STATE_DESTROYED: "destroyed",
    pb.SANDBOX_STATE_SUSPENDED: "suspended",
}

_FILE_TYPES = {
    pb.FILE_TYPE_UNSPECIFIED: "unspecified",
    pb.FILE_TYPE_REGULAR: "file",
    pb.FILE_TYPE_DIRECTORY: "dir",
    pb.FILE_TYPE_SYMLINK: "symlink",
    pb.FILE_TYPE_OTHER: "other",
}


def _decode(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one command. A non-zero exit, a signal, an OOM kill or a
    timeout is an outcome, never an exception.

    exit_code follows the shell convention: the exit status, or 128+signal.
    signal is the signal that ended the process (0 if it exited).
    oom_killed: the sandbox's memory cgroup OOM-killed a process during the exec.
    stdout/stderr are the raw bytes kept (at most output_cap bytes each);
    *_total_bytes count every byte produced, kept or not; *_truncated say
    whether bytes were dropped. duration_s is the wall time in seconds.
    """

    exit_code: int
    signal: int = 0
    oom_killed: bool = False
    timed_out: bool = False
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_total_bytes: int = 0
    stderr_total_bytes: int = 0
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the command exited 0 (no signal, no timeout)."""
        return self.exit_code == 0 and self.signal == 0 and not self.timed_out

    @property
    def stdout_text(self) -> str:
        """stdout decoded as UTF-8; invalid bytes become U+FFFD (never raises)."""
        return _decode(self.stdout)

    @property
    def stderr_text(self) -> str:
        """stderr decoded as UTF-8; invalid bytes become U+FFFD (never raises)."""
        return _decode(self.stderr)

    @property
    def text(self) -> str:
        """Same as stdout_text."""
        return self.stdout_text

    @classmethod
    def _from_pb(cls, r: pb.ExecResult) -> ExecResult:
        return cls(
            exit_code=r.exit_code,
            signal=r.signal,
            oom_killed=r.oom_killed,
            timed_out=r.timed_out,
            stdout=bytes(r.stdout),
            stderr=bytes(r.stderr),
            stdout_truncated=r.stdout_truncated,
            stderr_truncated=r.stderr_truncated,
            stdout_total_bytes=r.stdout_total_bytes,
            stderr_total_bytes=r.stderr_total_bytes,
            duration_s=r.duration_ns / 1e9,
        )


@dataclass(frozen=True)
class FileInfo:
    """One file inside a sandbox.

    name_bytes/path_bytes are byte-exact; name/path are the same decoded as
    UTF-8 with surrogateescape (``os.fsencode(info.name) == info.name_bytes``).
    type is one of "file", "dir", "symlink", "other". size in bytes, mode the
    permission bits (0o7777), uid/gid as seen inside the sandbox, mtime_ns in
    Unix nanoseconds.
    """

    name: str
    name_bytes: bytes
    path: str
    path_bytes: bytes
    type: str
    size: int
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    symlink_target: bytes = b""

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @property
    def is_file(self) -> bool:
        return self.type == "file"

    @property
    def is_symlink(self) -> bool:
        return self.type == "symlink"

    @classmethod
    def _from_pb(cls, f: pb.FileInfo) -> FileInfo:
        return cls(
            name=os.fsdecode(bytes(f.name)),
            name_bytes=bytes(f.name),
            path=os.fsdecode(bytes(f.path)),
            path_bytes=bytes(f.path),
            type=_FILE_TYPES.get(f.type, "other"),
            size=f.size,
            mode=f.mode,
            uid=f.uid,
            gid=f.gid,
            mtime_ns=f.mtime_ns,
            symlink_target=bytes(f.symlink_target),
        )


@dataclass(frozen=True)
class Layer:
    """A read-only layer in the node's store.

    digest "sha256:<hex>" of the EROFS image; name "kind/name@version" (empty
    when got by digest: the same bytes may carry several names);
    size_bytes of the image; created_at_ns Unix nanoseconds; in_use = number
    of sandboxes using it on this node; mounted = mounted on this node;
    projects = the projects owning it (a snapshot, fork or grade layer of a
    project's sandbox), empty for the operators' layers (every project's).
    """

    digest: str
    name: str
    size_bytes: int
    created_at_ns: int
    in_use: int
    mounted: bool
    projects: tuple[str, ...] = ()

    @classmethod
    def _from_pb(cls, m: pb.Layer) -> Layer:
        return cls(m.digest, m.name, m.size_bytes, m.created_at_ns, m.in_use, m.mounted, tuple(m.projects))


@dataclass(frozen=True)
class Resources:
    """Limits of a sandbox: cpu_millis (1000 = one core), memory_mb, disk_mb
    (writable upper cap), pids, open_files, tmpfs_mb (/tmp and /dev/shm each)."""

    cpu_millis: int
    memory_mb: int
    disk_mb: int
    pids: int
    open_files: int
    tmpfs_mb: int

    @property
    def cpu(self) -> float:
        """CPU in cores."""
        return self.cpu_millis / 1000.0


@dataclass(frozen=True)
class ExposedPort:
    """A sandbox port served on the node (sb.expose): connect to address
    ("host:port") and send token as the X-Warren-Token header (or the
    warren_token query parameter); without it the node answers 401."""

    port: int
    address: str
    token: str

    @property
    def url(self) -> str:
        """http://address/ (the token still goes in the header)."""
        return f"http://{self.address}/"

    @classmethod
    def _from_pb(cls, e: pb.ExposedPort) -> ExposedPort:
        return cls(port=e.port, address=e.address, token=e.token)


@dataclass(frozen=True)
class NetworkTraffic:
    """What a sandbox's network link carried and refused: bytes since the
    link was made; connections (new ones it started, allowed or not) and
    denied (its packets refused: policy, the node, other sandboxes) since
    the node's daemon started or re-adopted it."""

    egress_bytes: int
    ingress_bytes: int
    connections: int
    denied: int


@dataclass(frozen=True)
class SandboxInfo:
    """What the daemon knows about a sandbox. state is one of "creating",
    "running", "paused", "suspended" (paused, memory reclaimed into swap),
    "stopped", "destroyed". memory_bytes/swap_bytes: the sandbox's memory
    cgroup usage and the part of it in swap, read at the call (get(),
    suspend(); 0 in list()). layers are digests bottom
    first, layer_names the refs they were asked by. created_at_ns Unix ns.
    init_pid is the PID of the sandbox's init on the node (diagnostics)."""

    id: str
    backend: str
    state: str
    layers: List[str]
    layer_names: List[str]
    resources: Resources
    labels: Dict[str, str]
    job: str
    created_at_ns: int
    init_pid: int
    hostname: str
    # Lifecycle: TTL deadline (Unix ns, 0 = none), idle timeout,
    # last exec/file call (Unix ns), TTL in seconds.
    expires_at_ns: int = 0
    idle_timeout_s: int = 0
    last_activity_ns: int = 0
    ttl_s: int = 0
    memory_bytes: int = 0
    swap_bytes: int = 0
    # Network (get()/info() only): the egress policy {"allow", "deny"} (None:
    # no link), exposed ports, the link's traffic (None: no link).
    network: Optional[Dict[str, List[str]]] = None
    exposed: List[ExposedPort] = field(default_factory=list)
    traffic: Optional[NetworkTraffic] = None
    qos: str = "latency"  # "latency" or "best-effort"
    # create() only: the process create(start=...) started ("" = none).
    main_process: str = ""

    @classmethod
    def _from_pb(cls, s: pb.Sandbox) -> SandboxInfo:
        r = s.resources
        return cls(
            id=s.id,
            backend=s.backend,
            state=_STATES.get(s.state, "unspecified"),
            layers=list(s.layers),
            layer_names=list(s.layer_names),
            resources=Resources(r.cpu_millis, r.memory_mb, r.disk_mb, r.pids, r.open_files, r.tmpfs_mb),
            labels=dict(s.labels),
            job=s.job,
            created_at_ns=s.created_at_ns,
            init_pid=s.init_pid,
            hostname=s.hostname,
            expires_at_ns=s.expires_at_ns,
            idle_timeout_s=s.idle_timeout_s,
            last_activity_ns=s.last_activity_ns,
            ttl_s=s.ttl_s,
            memory_bytes=s.memory_bytes,
            swap_bytes=s.swap_bytes,
            network=({"allow": list(s.network.allow), "deny": list(s.network.deny)} if s.HasField("network") else None),
            exposed=[ExposedPort._from_pb(e) for e in s.exposed],
            traffic=(
                NetworkTraffic(s.traffic.egress_bytes, s.traffic.ingress_bytes, s.traffic.connections, s.traffic.denied)
                if s.HasField("traffic")
                else None
            ),
            qos=s.qos or "latency",
            main_process=s.main_process,
        )


@dataclass(frozen=True)
class QosClassCapacity:
    """One QoS class on a node (warrend --overcommit): the class's sandboxes
    may ask for up to cpus x 1000 millicpus (the node's memory) x overcommit;
    overcommit 0 = not counted (free_* then 0). cpu_millis/memory_mb: what
    its sandboxes asked for."""

    qos: str
    overcommit: float
    sandboxes: int
    cpu_millis: int
    memory_mb: int
    free_cpu_millis: int
    free_memory_mb: int

    @classmethod
    def _from_pb(cls, q: pb.QosClassCapacity) -> QosClassCapacity:
        return cls(
            qos=q.qos,
            overcommit=q.overcommit,
            sandboxes=q.sandboxes,
            cpu_millis=q.cpu_millis,
            memory_mb=q.memory_mb,
            free_cpu_millis=q.free_cpu_millis,
            free_memory_mb=q.free_memory_mb,
        )


@dataclass(frozen=True)
class NodeStatus:
    """Status of the node (warrend). memory_* in bytes, started_at_ns Unix ns,
    cgroup_version "v1" or "v2", cgroup_parent the cgroup sandboxes nest under."""

    node_id: str
    version: str
    backends: List[str]
    sandboxes: int
    layers: int
    layers_mounted: int
    cgroup_version: str
    cgroup_parent: str
    idmapped_mounts: bool
    file_backed_erofs: bool
    state_dir: str
    started_at_ns: int
    cpus: int
    memory_total_bytes: int
    memory_available_bytes: int
    # The microvm backend's accelerator ("kvm" or "tcg"; "" when microvm is
    # not offered) and why it was chosen.
    microvm_accel: str = ""
    microvm_accel_reason: str = ""
    # Per QoS class ("latency", "best-effort"); core scheduling: "available"
    # or "absent: why".
    qos: List[QosClassCapacity] = field(default_factory=list)
    core_scheduling: str = ""

    @classmethod
    def _from_pb(cls, n: pb.NodeStatus) -> NodeStatus:
        return cls(
            node_id=n.node_id,
            version=n.version,
            backends=list(n.backends),
            sandboxes=n.sandboxes,
            layers=n.layers,
            layers_mounted=n.layers_mounted,
            cgroup_version=n.cgroup_version,
            cgroup_parent=n.cgroup_parent,
            idmapped_mounts=n.idmapped_mounts,
            file_backed_erofs=n.file_backed_erofs,
            state_dir=n.state_dir,
            started_at_ns=n.started_at_ns,
            cpus=n.cpus,
            memory_total_bytes=n.memory_total_bytes,
            memory_available_bytes=n.memory_available_bytes,
            microvm_accel=n.microvm_accel,
            microvm_accel_reason=n.microvm_accel_reason,
            qos=[QosClassCapacity._from_pb(q) for q in n.qos],
            core_scheduling=n.core_scheduling,
        )


@dataclass(frozen=True)
class ClusterNode:
    """A node of the cluster as the answering node sees it (its last view of
    etcd). memory in MiB, free_cpu_millis/free_memory_mb below 0 when
    over-committed, updated_ns the node's last write (Unix ns), is_self the
    node that answered, drain: takes no new sandboxes (running ones stay)."""

    id: str
    address: str
    version: str
    backends: List[str]
    cpus: int
    memory_mb: int
    max_sandboxes: int
    sandboxes: int
    free_slots: int
    free_cpu_millis: int
    free_memory_mb: int
    available_memory_mb: int
    load1: float
    drain: bool
    updated_ns: int
    is_self: bool
    qos: List[QosClassCapacity] = field(default_factory=list)
    core_scheduling: str = ""

    @classmethod
    def _from_pb(cls, n: pb.ClusterNode) -> ClusterNode:
        return cls(
            id=n.id,
            address=n.address,
            version=n.version,
            backends=list(n.backends),
            cpus=n.cpus,
            memory_mb=n.memory_mb,
            max_sandboxes=n.max_sandboxes,
            sandboxes=n.sandboxes,
            free_slots=n.free_slots,
            free_cpu_millis=n.free_cpu_millis,
            free_memory_mb=n.free_memory_mb,
            available_memory_mb=n.available_memory_mb,
            load1=n.load1,
            drain=n.drain,
            updated_ns=n.updated_ns,
            is_self=n.self,
            qos=[QosClassCapacity._from_pb(q) for q in n.qos],
            core_scheduling=n.core_scheduling,
        )


@dataclass(frozen=True)
class ProjectInfo:
    """A project of the cluster (README "Projects and quotas"). Quotas of 0
    are no limit of the project's own (its parents' still hold); usage is
    what runs in the project and the projects below it, cluster-wide, as the
    nodes last published it. cpu in millicpus, memory in MiB; the create
    rate in creates per second (0 = no limit of its own), its burst in
    creates (0 = max(1, the rate))."""

    path: str
    quota_sandboxes: int
    quota_cpu_millis: int
    quota_memory_mb: int
    sandboxes: int
    cpu_millis: int
    memory_mb: int
    created_ns: int
    quota_creates_per_second: float = 0.0
    quota_create_burst: int = 0

    @classmethod
    def _from_pb(cls, p: prj.Project) -> ProjectInfo:
        return cls(
            path=p.path,
            quota_sandboxes=p.quota.sandboxes,
            quota_cpu_millis=p.quota.cpu_millis,
            quota_memory_mb=p.quota.memory_mb,
            sandboxes=p.usage.sandboxes,
            cpu_millis=p.usage.cpu_millis,
            memory_mb=p.usage.memory_mb,
            created_ns=p.created_ns,
            quota_creates_per_second=p.quota.creates_per_second,
            quota_create_burst=p.quota.create_burst,
        )
