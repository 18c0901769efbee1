from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SandboxState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SANDBOX_STATE_UNSPECIFIED: _ClassVar[SandboxState]
    SANDBOX_STATE_CREATING: _ClassVar[SandboxState]
    SANDBOX_STATE_RUNNING: _ClassVar[SandboxState]
    SANDBOX_STATE_PAUSED: _ClassVar[SandboxState]
    SANDBOX_STATE_STOPPED: _ClassVar[SandboxState]
    SANDBOX_STATE_DESTROYED: _ClassVar[SandboxState]
    SANDBOX_STATE_SUSPENDED: _ClassVar[SandboxState]

class FileType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILE_TYPE_UNSPECIFIED: _ClassVar[FileType]
    FILE_TYPE_REGULAR: _ClassVar[FileType]
    FILE_TYPE_DIRECTORY: _ClassVar[FileType]
    FILE_TYPE_SYMLINK: _ClassVar[FileType]
    FILE_TYPE_OTHER: _ClassVar[FileType]
SANDBOX_STATE_UNSPECIFIED: SandboxState
SANDBOX_STATE_CREATING: SandboxState
SANDBOX_STATE_RUNNING: SandboxState
SANDBOX_STATE_PAUSED: SandboxState
SANDBOX_STATE_STOPPED: SandboxState
SANDBOX_STATE_DESTROYED: SandboxState
SANDBOX_STATE_SUSPENDED: SandboxState
FILE_TYPE_UNSPECIFIED: FileType
FILE_TYPE_REGULAR: FileType
FILE_TYPE_DIRECTORY: FileType
FILE_TYPE_SYMLINK: FileType
FILE_TYPE_OTHER: FileType

class Resources(_message.Message):
    __slots__ = ("cpu_millis", "memory_mb", "disk_mb", "pids", "open_files", "tmpfs_mb")
    CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    DISK_MB_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    OPEN_FILES_FIELD_NUMBER: _ClassVar[int]
    TMPFS_MB_FIELD_NUMBER: _ClassVar[int]
    cpu_millis: int
    memory_mb: int
    disk_mb: int
    pids: int
    open_files: int
    tmpfs_mb: int
    def __init__(self, cpu_millis: _Optional[int] = ..., memory_mb: _Optional[int] = ..., disk_mb: _Optional[int] = ..., pids: _Optional[int] = ..., open_files: _Optional[int] = ..., tmpfs_mb: _Optional[int] = ...) -> None: ...

class NetworkPolicy(_message.Message):
    __slots__ = ("allow", "deny")
    ALLOW_FIELD_NUMBER: _ClassVar[int]
    DENY_FIELD_NUMBER: _ClassVar[int]
    allow: _containers.RepeatedScalarFieldContainer[str]
    deny: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, allow: _Optional[_Iterable[str]] = ..., deny: _Optional[_Iterable[str]] = ...) -> None: ...

class SetNetworkRequest(_message.Message):
    __slots__ = ("id", "network")
    ID_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    id: str
    network: NetworkPolicy
    def __init__(self, id: _Optional[str] = ..., network: _Optional[_Union[NetworkPolicy, _Mapping]] = ...) -> None: ...

class ExposeRequest(_message.Message):
    __slots__ = ("id", "port")
    ID_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    id: str
    port: int
    def __init__(self, id: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class UnexposeRequest(_message.Message):
    __slots__ = ("id", "port")
    ID_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    id: str
    port: int
    def __init__(self, id: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class ExposedPort(_message.Message):
    __slots__ = ("port", "address", "token")
    PORT_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    port: int
    address: str
    token: str
    def __init__(self, port: _Optional[int] = ..., address: _Optional[str] = ..., token: _Optional[str] = ...) -> None: ...

class NetworkTraffic(_message.Message):
    __slots__ = ("egress_bytes", "ingress_bytes", "connections", "denied")
    EGRESS_BYTES_FIELD_NUMBER: _ClassVar[int]
    INGRESS_BYTES_FIELD_NUMBER: _ClassVar[int]
    CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    DENIED_FIELD_NUMBER: _ClassVar[int]
    egress_bytes: int
    ingress_bytes: int
    connections: int
    denied: int
    def __init__(self, egress_bytes: _Optional[int] = ..., ingress_bytes: _Optional[int] = ..., connections: _Optional[int] = ..., denied: _Optional[int] = ...) -> None: ...

class CreateSandboxRequest(_message.Message):
    __slots__ = ("backend", "layers", "resources", "env", "workdir", "user", "hostname", "labels", "ttl_s", "job", "idle_timeout_s", "request_id", "image", "network", "qos", "start", "command", "expose", "expose_image_ports")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    EXPOSE_FIELD_NUMBER: _ClassVar[int]
    EXPOSE_IMAGE_PORTS_FIELD_NUMBER: _ClassVar[int]
    backend: str
    layers: _containers.RepeatedScalarFieldContainer[str]
    resources: Resources
    env: _containers.ScalarMap[str, bytes]
    workdir: str
    user: str
    hostname: str
    labels: _containers.ScalarMap[str, str]
    ttl_s: int
    job: str
    idle_timeout_s: int
    request_id: str
    image: str
    network: NetworkPolicy
    qos: str
    start: bool
    command: _containers.RepeatedScalarFieldContainer[bytes]
    expose: _containers.RepeatedScalarFieldContainer[int]
    expose_image_ports: bool
    def __init__(self, backend: _Optional[str] = ..., layers: _Optional[_Iterable[str]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., env: _Optional[_Mapping[str, bytes]] = ..., workdir: _Optional[str] = ..., user: _Optional[str] = ..., hostname: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., ttl_s: _Optional[int] = ..., job: _Optional[str] = ..., idle_timeout_s: _Optional[int] = ..., request_id: _Optional[str] = ..., image: _Optional[str] = ..., network: _Optional[_Union[NetworkPolicy, _Mapping]] = ..., qos: _Optional[str] = ..., start: _Optional[bool] = ..., command: _Optional[_Iterable[bytes]] = ..., expose: _Optional[_Iterable[int]] = ..., expose_image_ports: _Optional[bool] = ...) -> None: ...

class Sandbox(_message.Message):
    __slots__ = ("id", "backend", "state", "layers", "layer_names", "resources", "labels", "job", "created_at_ns", "init_pid", "hostname", "expires_at_ns", "idle_timeout_s", "last_activity_ns", "ttl_s", "memory_bytes", "swap_bytes", "network", "exposed", "traffic", "qos", "main_process")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    LAYER_NAMES_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_NS_FIELD_NUMBER: _ClassVar[int]
    INIT_PID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_NS_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVITY_NS_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SWAP_BYTES_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    EXPOSED_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    MAIN_PROCESS_FIELD_NUMBER: _ClassVar[int]
    id: str
    backend: str
    state: SandboxState
    layers: _containers.RepeatedScalarFieldContainer[str]
    layer_names: _containers.RepeatedScalarFieldContainer[str]
    resources: Resources
    labels: _containers.ScalarMap[str, str]
    job: str
    created_at_ns: int
    init_pid: int
    hostname: str
    expires_at_ns: int
    idle_timeout_s: int
    last_activity_ns: int
    ttl_s: int
    memory_bytes: int
    swap_bytes: int
    network: NetworkPolicy
    exposed: _containers.RepeatedCompositeFieldContainer[ExposedPort]
    traffic: NetworkTraffic
    qos: str
    main_process: str
    def __init__(self, id: _Optional[str] = ..., backend: _Optional[str] = ..., state: _Optional[_Union[SandboxState, str]] = ..., layers: _Optional[_Iterable[str]] = ..., layer_names: _Optional[_Iterable[str]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., job: _Optional[str] = ..., created_at_ns: _Optional[int] = ..., init_pid: _Optional[int] = ..., hostname: _Optional[str] = ..., expires_at_ns: _Optional[int] = ..., idle_timeout_s: _Optional[int] = ..., last_activity_ns: _Optional[int] = ..., ttl_s: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., swap_bytes: _Optional[int] = ..., network: _Optional[_Union[NetworkPolicy, _Mapping]] = ..., exposed: _Optional[_Iterable[_Union[ExposedPort, _Mapping]]] = ..., traffic: _Optional[_Union[NetworkTraffic, _Mapping]] = ..., qos: _Optional[str] = ..., main_process: _Optional[str] = ...) -> None: ...

class GetSandboxRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ListSandboxesRequest(_message.Message):
    __slots__ = ("labels", "job")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LABELS_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.ScalarMap[str, str]
    job: str
    def __init__(self, labels: _Optional[_Mapping[str, str]] = ..., job: _Optional[str] = ...) -> None: ...

class ListSandboxesResponse(_message.Message):
    __slots__ = ("sandboxes",)
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    sandboxes: _containers.RepeatedCompositeFieldContainer[Sandbox]
    def __init__(self, sandboxes: _Optional[_Iterable[_Union[Sandbox, _Mapping]]] = ...) -> None: ...

class DestroySandboxRequest(_message.Message):
    __slots__ = ("id", "create_request_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    create_request_id: str
    def __init__(self, id: _Optional[str] = ..., create_request_id: _Optional[str] = ...) -> None: ...

class DestroySandboxResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ExecRequest(_message.Message):
    __slots__ = ("sandbox_id", "argv", "shell", "env", "cwd", "user", "stdin", "timeout_ms", "output_cap_bytes", "kill_grace_ms", "request_id", "merge_stderr")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    SHELL_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_CAP_BYTES_FIELD_NUMBER: _ClassVar[int]
    KILL_GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MERGE_STDERR_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    argv: _containers.RepeatedScalarFieldContainer[bytes]
    shell: bytes
    env: _containers.ScalarMap[str, bytes]
    cwd: str
    user: str
    stdin: bytes
    timeout_ms: int
    output_cap_bytes: int
    kill_grace_ms: int
    request_id: str
    merge_stderr: bool
    def __init__(self, sandbox_id: _Optional[str] = ..., argv: _Optional[_Iterable[bytes]] = ..., shell: _Optional[bytes] = ..., env: _Optional[_Mapping[str, bytes]] = ..., cwd: _Optional[str] = ..., user: _Optional[str] = ..., stdin: _Optional[bytes] = ..., timeout_ms: _Optional[int] = ..., output_cap_bytes: _Optional[int] = ..., kill_grace_ms: _Optional[int] = ..., request_id: _Optional[str] = ..., merge_stderr: _Optional[bool] = ...) -> None: ...

class ExecResult(_message.Message):
    __slots__ = ("exit_code", "signal", "oom_killed", "timed_out", "stdout", "stderr", "stdout_truncated", "stderr_truncated", "stdout_total_bytes", "stderr_total_bytes", "duration_ns")
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    OOM_KILLED_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    STDOUT_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    STDERR_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    STDOUT_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    STDERR_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    exit_code: int
    signal: int
    oom_killed: bool
    timed_out: bool
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    stdout_total_bytes: int
    stderr_total_bytes: int
    duration_ns: int
    def __init__(self, exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., oom_killed: _Optional[bool] = ..., timed_out: _Optional[bool] = ..., stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., stdout_truncated: _Optional[bool] = ..., stderr_truncated: _Optional[bool] = ..., stdout_total_bytes: _Optional[int] = ..., stderr_total_bytes: _Optional[int] = ..., duration_ns: _Optional[int] = ...) -> None: ...

class FileInfo(_message.Message):
    __slots__ = ("name", "path", "type", "size", "mode", "uid", "gid", "mtime_ns", "symlink_target")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    SYMLINK_TARGET_FIELD_NUMBER: _ClassVar[int]
    name: bytes
    path: bytes
    type: FileType
    size: int
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    symlink_target: bytes
    def __init__(self, name: _Optional[bytes] = ..., path: _Optional[bytes] = ..., type: _Optional[_Union[FileType, str]] = ..., size: _Optional[int] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., symlink_target: _Optional[bytes] = ...) -> None: ...

class WriteFileRequest(_message.Message):
    __slots__ = ("sandbox_id", "path", "mode", "make_parents", "data", "request_id")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MAKE_PARENTS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: bytes
    mode: int
    make_parents: bool
    data: bytes
    request_id: str
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[bytes] = ..., mode: _Optional[int] = ..., make_parents: _Optional[bool] = ..., data: _Optional[bytes] = ..., request_id: _Optional[str] = ...) -> None: ...

class WriteFileResponse(_message.Message):
    __slots__ = ("bytes_written",)
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    bytes_written: int
    def __init__(self, bytes_written: _Optional[int] = ...) -> None: ...

class ReadFileRequest(_message.Message):
    __slots__ = ("sandbox_id", "path", "offset", "length")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: bytes
    offset: int
    length: int
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[bytes] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class ReadFileChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class StatRequest(_message.Message):
    __slots__ = ("sandbox_id", "path")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: bytes
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[bytes] = ...) -> None: ...

class ListDirRequest(_message.Message):
    __slots__ = ("sandbox_id", "path")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: bytes
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[bytes] = ...) -> None: ...

class ListDirResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[FileInfo]
    def __init__(self, entries: _Optional[_Iterable[_Union[FileInfo, _Mapping]]] = ...) -> None: ...

class MkdirRequest(_message.Message):
    __slots__ = ("sandbox_id", "path", "mode", "parents")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: bytes
    mode: int
    parents: bool
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[bytes] = ..., mode: _Optional[int] = ..., parents: _Optional[bool] = ...) -> None: ...

class RemoveRequest(_message.Message):
    __slots__ = ("sandbox_id", "path", "recursive")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: bytes
    recursive: bool
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[bytes] = ..., recursive: _Optional[bool] = ...) -> None: ...

class RenameRequest(_message.Message):
    __slots__ = ("sandbox_id", "to")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    to: bytes
    def __init__(self, sandbox_id: _Optional[str] = ..., to: _Optional[bytes] = ..., **kwargs) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Layer(_message.Message):
    __slots__ = ("digest", "name", "size_bytes", "created_at_ns", "in_use", "mounted", "projects")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_NS_FIELD_NUMBER: _ClassVar[int]
    IN_USE_FIELD_NUMBER: _ClassVar[int]
    MOUNTED_FIELD_NUMBER: _ClassVar[int]
    PROJECTS_FIELD_NUMBER: _ClassVar[int]
    digest: str
    name: str
    size_bytes: int
    created_at_ns: int
    in_use: int
    mounted: bool
    projects: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, digest: _Optional[str] = ..., name: _Optional[str] = ..., size_bytes: _Optional[int] = ..., created_at_ns: _Optional[int] = ..., in_use: _Optional[int] = ..., mounted: _Optional[bool] = ..., projects: _Optional[_Iterable[str]] = ...) -> None: ...

class BuildLayerRequest(_message.Message):
    __slots__ = ("name", "source_dir", "tar_chunk")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_DIR_FIELD_NUMBER: _ClassVar[int]
    TAR_CHUNK_FIELD_NUMBER: _ClassVar[int]
    name: str
    source_dir: str
    tar_chunk: bytes
    def __init__(self, name: _Optional[str] = ..., source_dir: _Optional[str] = ..., tar_chunk: _Optional[bytes] = ...) -> None: ...

class GetLayerRequest(_message.Message):
    __slots__ = ("ref",)
    REF_FIELD_NUMBER: _ClassVar[int]
    ref: str
    def __init__(self, ref: _Optional[str] = ...) -> None: ...

class ListLayersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListLayersResponse(_message.Message):
    __slots__ = ("layers",)
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    layers: _containers.RepeatedCompositeFieldContainer[Layer]
    def __init__(self, layers: _Optional[_Iterable[_Union[Layer, _Mapping]]] = ...) -> None: ...

class RemoveLayerRequest(_message.Message):
    __slots__ = ("ref",)
    REF_FIELD_NUMBER: _ClassVar[int]
    ref: str
    def __init__(self, ref: _Optional[str] = ...) -> None: ...

class NodeStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("node_id", "version", "backends", "sandboxes", "layers", "layers_mounted", "cgroup_version", "cgroup_parent", "idmapped_mounts", "file_backed_erofs", "state_dir", "started_at_ns", "cpus", "memory_total_bytes", "memory_available_bytes", "microvm_accel", "microvm_accel_reason", "qos", "core_scheduling")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    LAYERS_MOUNTED_FIELD_NUMBER: _ClassVar[int]
    CGROUP_VERSION_FIELD_NUMBER: _ClassVar[int]
    CGROUP_PARENT_FIELD_NUMBER: _ClassVar[int]
    IDMAPPED_MOUNTS_FIELD_NUMBER: _ClassVar[int]
    FILE_BACKED_EROFS_FIELD_NUMBER: _ClassVar[int]
    STATE_DIR_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_NS_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_AVAILABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MICROVM_ACCEL_FIELD_NUMBER: _ClassVar[int]
    MICROVM_ACCEL_REASON_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    CORE_SCHEDULING_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    version: str
    backends: _containers.RepeatedScalarFieldContainer[str]
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
    microvm_accel: str
    microvm_accel_reason: str
    qos: _containers.RepeatedCompositeFieldContainer[QosClassCapacity]
    core_scheduling: str
    def __init__(self, node_id: _Optional[str] = ..., version: _Optional[str] = ..., backends: _Optional[_Iterable[str]] = ..., sandboxes: _Optional[int] = ..., layers: _Optional[int] = ..., layers_mounted: _Optional[int] = ..., cgroup_version: _Optional[str] = ..., cgroup_parent: _Optional[str] = ..., idmapped_mounts: _Optional[bool] = ..., file_backed_erofs: _Optional[bool] = ..., state_dir: _Optional[str] = ..., started_at_ns: _Optional[int] = ..., cpus: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., memory_available_bytes: _Optional[int] = ..., microvm_accel: _Optional[str] = ..., microvm_accel_reason: _Optional[str] = ..., qos: _Optional[_Iterable[_Union[QosClassCapacity, _Mapping]]] = ..., core_scheduling: _Optional[str] = ...) -> None: ...

class QosClassCapacity(_message.Message):
    __slots__ = ("qos", "overcommit", "sandboxes", "cpu_millis", "memory_mb", "free_cpu_millis", "free_memory_mb")
    QOS_FIELD_NUMBER: _ClassVar[int]
    OVERCOMMIT_FIELD_NUMBER: _ClassVar[int]
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    FREE_CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    FREE_MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    qos: str
    overcommit: float
    sandboxes: int
    cpu_millis: int
    memory_mb: int
    free_cpu_millis: int
    free_memory_mb: int
    def __init__(self, qos: _Optional[str] = ..., overcommit: _Optional[float] = ..., sandboxes: _Optional[int] = ..., cpu_millis: _Optional[int] = ..., memory_mb: _Optional[int] = ..., free_cpu_millis: _Optional[int] = ..., free_memory_mb: _Optional[int] = ...) -> None: ...

class ClusterNode(_message.Message):
    __slots__ = ("id", "address", "version", "backends", "cpus", "memory_mb", "max_sandboxes", "sandboxes", "free_slots", "free_cpu_millis", "free_memory_mb", "available_memory_mb", "load1", "drain", "updated_ns", "self", "qos", "core_scheduling")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    MAX_SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    FREE_SLOTS_FIELD_NUMBER: _ClassVar[int]
    FREE_CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    FREE_MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    LOAD1_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    UPDATED_NS_FIELD_NUMBER: _ClassVar[int]
    SELF_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    CORE_SCHEDULING_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    version: str
    backends: _containers.RepeatedScalarFieldContainer[str]
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
    self: bool
    qos: _containers.RepeatedCompositeFieldContainer[QosClassCapacity]
    core_scheduling: str
    def __init__(self_, id: _Optional[str] = ..., address: _Optional[str] = ..., version: _Optional[str] = ..., backends: _Optional[_Iterable[str]] = ..., cpus: _Optional[int] = ..., memory_mb: _Optional[int] = ..., max_sandboxes: _Optional[int] = ..., sandboxes: _Optional[int] = ..., free_slots: _Optional[int] = ..., free_cpu_millis: _Optional[int] = ..., free_memory_mb: _Optional[int] = ..., available_memory_mb: _Optional[int] = ..., load1: _Optional[float] = ..., drain: _Optional[bool] = ..., updated_ns: _Optional[int] = ..., self: _Optional[bool] = ..., qos: _Optional[_Iterable[_Union[QosClassCapacity, _Mapping]]] = ..., core_scheduling: _Optional[str] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[ClusterNode]
    def __init__(self, nodes: _Optional[_Iterable[_Union[ClusterNode, _Mapping]]] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("node_id", "drain")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    drain: bool
    def __init__(self, node_id: _Optional[str] = ..., drain: _Optional[bool] = ...) -> None: ...

class ExtendTtlRequest(_message.Message):
    __slots__ = ("id", "ttl_s")
    ID_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    id: str
    ttl_s: int
    def __init__(self, id: _Optional[str] = ..., ttl_s: _Optional[int] = ...) -> None: ...

class PauseRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ("id", "no_prefetch")
    ID_FIELD_NUMBER: _ClassVar[int]
    NO_PREFETCH_FIELD_NUMBER: _ClassVar[int]
    id: str
    no_prefetch: bool
    def __init__(self, id: _Optional[str] = ..., no_prefetch: _Optional[bool] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("id", "name", "exclude", "no_pause")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    NO_PAUSE_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    exclude: _containers.RepeatedScalarFieldContainer[str]
    no_pause: bool
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., exclude: _Optional[_Iterable[str]] = ..., no_pause: _Optional[bool] = ...) -> None: ...

class SnapshotResponse(_message.Message):
    __slots__ = ("layer", "layers")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    layer: Layer
    layers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, layer: _Optional[_Union[Layer, _Mapping]] = ..., layers: _Optional[_Iterable[str]] = ...) -> None: ...

class ForkRequest(_message.Message):
    __slots__ = ("id", "count", "labels", "ttl_s", "exclude", "no_pause")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    NO_PAUSE_FIELD_NUMBER: _ClassVar[int]
    id: str
    count: int
    labels: _containers.ScalarMap[str, str]
    ttl_s: int
    exclude: _containers.RepeatedScalarFieldContainer[str]
    no_pause: bool
    def __init__(self, id: _Optional[str] = ..., count: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., ttl_s: _Optional[int] = ..., exclude: _Optional[_Iterable[str]] = ..., no_pause: _Optional[bool] = ...) -> None: ...

class ForkResponse(_message.Message):
    __slots__ = ("layer", "sandboxes")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    layer: Layer
    sandboxes: _containers.RepeatedCompositeFieldContainer[Sandbox]
    def __init__(self, layer: _Optional[_Union[Layer, _Mapping]] = ..., sandboxes: _Optional[_Iterable[_Union[Sandbox, _Mapping]]] = ...) -> None: ...

class GradeRequest(_message.Message):
    __slots__ = ("id", "grader", "protected_paths", "solution")
    ID_FIELD_NUMBER: _ClassVar[int]
    GRADER_FIELD_NUMBER: _ClassVar[int]
    PROTECTED_PATHS_FIELD_NUMBER: _ClassVar[int]
    SOLUTION_FIELD_NUMBER: _ClassVar[int]
    id: str
    grader: ExecRequest
    protected_paths: _containers.RepeatedScalarFieldContainer[str]
    solution: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., grader: _Optional[_Union[ExecRequest, _Mapping]] = ..., protected_paths: _Optional[_Iterable[str]] = ..., solution: _Optional[_Iterable[str]] = ...) -> None: ...

class GradeResponse(_message.Message):
    __slots__ = ("result", "touched", "grade_sandbox_id", "touched_truncated", "rejected")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    TOUCHED_FIELD_NUMBER: _ClassVar[int]
    GRADE_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    TOUCHED_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    result: ExecResult
    touched: _containers.RepeatedScalarFieldContainer[str]
    grade_sandbox_id: str
    touched_truncated: bool
    rejected: str
    def __init__(self, result: _Optional[_Union[ExecResult, _Mapping]] = ..., touched: _Optional[_Iterable[str]] = ..., grade_sandbox_id: _Optional[str] = ..., touched_truncated: _Optional[bool] = ..., rejected: _Optional[str] = ...) -> None: ...

class AuditLogRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class AuditLogResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, entries: _Optional[_Iterable[str]] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("name", "lease_s", "grace_s", "lease_expires_at_ns", "lapsed", "lapsed_at_ns", "sandboxes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_NS_FIELD_NUMBER: _ClassVar[int]
    LAPSED_FIELD_NUMBER: _ClassVar[int]
    LAPSED_AT_NS_FIELD_NUMBER: _ClassVar[int]
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    name: str
    lease_s: int
    grace_s: int
    lease_expires_at_ns: int
    lapsed: bool
    lapsed_at_ns: int
    sandboxes: int
    def __init__(self, name: _Optional[str] = ..., lease_s: _Optional[int] = ..., grace_s: _Optional[int] = ..., lease_expires_at_ns: _Optional[int] = ..., lapsed: _Optional[bool] = ..., lapsed_at_ns: _Optional[int] = ..., sandboxes: _Optional[int] = ...) -> None: ...

class JobHeartbeatRequest(_message.Message):
    __slots__ = ("job", "lease_s", "grace_s")
    JOB_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    job: str
    lease_s: int
    grace_s: int
    def __init__(self, job: _Optional[str] = ..., lease_s: _Optional[int] = ..., grace_s: _Optional[int] = ...) -> None: ...

class JobRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class SuspendRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...

class JobActionResponse(_message.Message):
    __slots__ = ("affected",)
    AFFECTED_FIELD_NUMBER: _ClassVar[int]
    affected: int
    def __init__(self, affected: _Optional[int] = ...) -> None: ...
