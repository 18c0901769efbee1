"""Request building and argument validation shared by every SDK call
(sync and async): no I/O here."""

from __future__ import annotations

import os
import secrets
from typing import Any, BinaryIO, Dict, Iterable, Iterator, Mapping, Optional, Sequence, Tuple, Union

from . import errors
from ._proto import process_pb2 as ppb
from ._proto import warren_pb2 as pb

DEFAULT_ADDR = "unix:/run/warren/warrend.sock"
# Size of the data chunks of streamed uploads (files, layer tars): 1 MiB.
CHUNK_SIZE = 1 << 20
# Largest value of a uint32 field.
_U32_MAX = (1 << 32) - 1
MAX_BUFFER_BYTES = 64 << 20
# Seconds added to an exec's timeout to form its RPC deadline: covers the
# SIGTERM→SIGKILL grace period, output transfer and queueing in the daemon.
EXEC_DEADLINE_MARGIN_S = 30.0
# Bytes kept per stream by the daemon at most (ExecRequest.output_cap_bytes).
MAX_OUTPUT_CAP = 256 << 20

PathLike = Union[str, bytes, "os.PathLike[str]"]
Cmd = Union[str, bytes, Sequence[Union[str, bytes]]]
Data = Union[bytes, bytearray, memoryview, str, BinaryIO, Iterable[Union[bytes, str]]]


def _target(addr: str) -> str:
    """gRPC target of an address: "unix:/path", "/path" (a unix socket) or
    "host:port" (TCP)."""
    if addr.startswith("unix:"):
        return addr
    if addr.startswith("/"):
        return "unix:" + addr
    return addr


def _path_bytes(path: PathLike) -> bytes:
    if isinstance(path, bytes):
        return path
    return os.fsencode(os.fspath(path))


def _u32(name: str, value: Optional[Union[int, float]]) -> int:
    """Validates an optional unsigned 32-bit limit (None = node default)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.InvalidArgument(f"{name} must be an integer, got {value!r}")
    if value < 0:
        raise errors.InvalidArgument(f"{name} must be >= 0, got {value}")
    if value > _U32_MAX:
        raise errors.InvalidArgument(f"{name} too large: {value} > {_U32_MAX}")
    return value


def _argv(name: str, argv: Optional[Sequence[Union[str, bytes]]]) -> list[bytes]:
    """A list of arguments (str or bytes), sent byte-exact; a single string
    is refused (it would be split into characters)."""
    if argv is None:
        return []
    if isinstance(argv, (str, bytes)) or not all(isinstance(a, (str, bytes)) for a in argv):
        raise errors.InvalidArgument(f"{name} must be a list of str/bytes arguments, got {argv!r}")
    return [a if isinstance(a, bytes) else os.fsencode(a) for a in argv]


def _port(port: int) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise errors.InvalidArgument(f"port must be an int in 1..65535, got {port!r}")
    return port


def _env_pb(env: Optional[Mapping[str, Union[str, bytes]]]) -> Dict[str, bytes]:
    """Env values are sent byte-exact; keys are validated by the daemon
    (non-empty, no '=' or NUL: InvalidArgument naming the key)."""
    out: Dict[str, bytes] = {}
    for k, v in (env or {}).items():
        if not isinstance(k, str):
            raise errors.InvalidArgument(f"env key must be str, got {k!r}")
        out[k] = v if isinstance(v, bytes) else os.fsencode(str(v))
    return out


def _check_data(data: Any) -> None:
    """Raises InvalidArgument unless data is something _chunks can send."""
    if isinstance(data, (str, bytes, bytearray, memoryview)) or hasattr(data, "read"):
        return
    if isinstance(data, Mapping) or not hasattr(data, "__iter__"):
        raise errors.InvalidArgument(
            f"data must be bytes, str, a binary file object or an iterable of bytes, got {type(data).__name__}"
        )


def _chunks(data: Data) -> Iterator[bytes]:
    """Yields data in chunks of at most CHUNK_SIZE bytes; a file-like object
    or an iterable of bytes/str pieces is consumed lazily (never loaded
    whole)."""
    _check_data(data)
    if isinstance(data, str):
        data = data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        mv = memoryview(data)
        for off in range(0, len(mv), CHUNK_SIZE):
            yield bytes(mv[off : off + CHUNK_SIZE])
        return
    if not hasattr(data, "read"):
        for piece in data:
            if isinstance(piece, str):
                piece = piece.encode("utf-8")
            if not isinstance(piece, (bytes, bytearray, memoryview)):
                raise errors.InvalidArgument(
                    f"data: an iterable must yield bytes or str pieces, got {type(piece).__name__}"
                )
            mv = memoryview(piece)
            for off in range(0, len(mv), CHUNK_SIZE):
                yield bytes(mv[off : off + CHUNK_SIZE])
        return
    while True:
        chunk = data.read(CHUNK_SIZE)
        if not chunk:
            return
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8")
        yield chunk


def _exec_request(
    sandbox_id: str,
    cmd: Union[str, bytes, Sequence[Union[str, bytes]]],
    *,
    env: Optional[Mapping[str, Union[str, bytes]]] = None,
    cwd: Optional[str] = None,
    user: Optional[str] = None,
    stdin: Optional[Union[bytes, str]] = None,
    timeout: Optional[float] = None,
    output_cap: Optional[int] = None,
    kill_grace: Optional[float] = None,
    request_id: Optional[str] = None,
    merge_stderr: bool = False,
) -> Tuple[pb.ExecRequest, Optional[float]]:
    """The ExecRequest of Sandbox.exec and its RPC deadline (shared with warren.aio)."""
    req = pb.ExecRequest(
        sandbox_id=sandbox_id,
        env=_env_pb(env),
        cwd=cwd or "",
        user=user or "",
        request_id=request_id or "",
        merge_stderr=merge_stderr,
    )
    if isinstance(cmd, (str, bytes)):
        req.shell = cmd if isinstance(cmd, bytes) else cmd.encode("utf-8", "surrogateescape")
    else:
        argv = [a if isinstance(a, bytes) else os.fsencode(a) for a in cmd]
        if not argv:
            raise errors.InvalidArgument("exec: empty argv")
        req.argv.extend(argv)
    if stdin is not None:
        req.stdin = stdin.encode("utf-8") if isinstance(stdin, str) else bytes(stdin)
    deadline: Optional[float] = None
    if timeout is not None:
        if timeout <= 0:
            raise errors.InvalidArgument(f"exec: timeout must be > 0 seconds, got {timeout}")
        ms = max(1, round(timeout * 1000))
        req.timeout_ms = _u32("timeout (ms)", ms)
        grace = kill_grace if kill_grace is not None else 0.5
        deadline = timeout + grace + EXEC_DEADLINE_MARGIN_S
    if kill_grace is not None:
        if kill_grace < 0:
            raise errors.InvalidArgument(f"exec: kill_grace must be >= 0, got {kill_grace}")
        req.kill_grace_ms = _u32("kill_grace (ms)", round(kill_grace * 1000))
    if output_cap is not None:
        if isinstance(output_cap, bool) or not isinstance(output_cap, int) or not 0 < output_cap <= MAX_OUTPUT_CAP:
            raise errors.InvalidArgument(f"exec: output_cap must be in [1, {MAX_OUTPUT_CAP}] bytes, got {output_cap!r}")
        req.output_cap_bytes = output_cap
    return req, deadline


def _network_pb(network: Mapping[str, Sequence[str]]) -> pb.NetworkPolicy:
    """A NetworkPolicy from {"allow": [...], "deny": [...]} (both optional);
    the entries are checked by the node (warren.proto NetworkPolicy)."""
    if not isinstance(network, Mapping):
        raise errors.InvalidArgument(f"network must be a mapping with 'allow'/'deny' lists, got {network!r}")
    extra = set(network) - {"allow", "deny"}
    if extra:
        raise errors.InvalidArgument(f"network: unknown keys {sorted(extra)} (only 'allow' and 'deny')")
    lists = {}
    for key in ("allow", "deny"):
        v = network.get(key, ())
        if isinstance(v, (str, bytes)) or not all(isinstance(e, str) for e in v):
            raise errors.InvalidArgument(f"network.{key} must be a list of strings, got {v!r}")
        lists[key] = list(v)
    return pb.NetworkPolicy(allow=lists["allow"], deny=lists["deny"])


def _qos(qos: Optional[str]) -> str:
    if qos is None:
        return ""
    if qos not in ("latency", "best-effort"):
        raise errors.InvalidArgument(f'qos must be "latency" or "best-effort", got {qos!r}')
    return qos


def _create_request(
    backend: str,
    layers: Sequence[str],
    *,
    cpu: Optional[float] = None,
    memory_mb: Optional[int] = None,
    disk_mb: Optional[int] = None,
    pids: Optional[int] = None,
    open_files: Optional[int] = None,
    tmpfs_mb: Optional[int] = None,
    env: Optional[Mapping[str, Union[str, bytes]]] = None,
    workdir: Optional[str] = None,
    user: Optional[str] = None,
    hostname: Optional[str] = None,
    labels: Optional[Mapping[str, str]] = None,
    ttl_s: Optional[int] = None,
    job: Optional[str] = None,
    idle_timeout_s: Optional[int] = None,
    request_id: Optional[str] = None,
    image: Optional[str] = None,
    network: Optional[Mapping[str, Sequence[str]]] = None,
    qos: Optional[str] = None,
    start: bool = False,
    command: Optional[Sequence[Union[str, bytes]]] = None,
    expose: Optional[Sequence[int]] = None,
    expose_image_ports: bool = False,
) -> pb.CreateSandboxRequest:
    """The CreateSandboxRequest of Client.create (shared with warren.aio)."""
    res = pb.Resources(
        memory_mb=_u32("memory_mb", memory_mb),
        disk_mb=_u32("disk_mb", disk_mb),
        pids=_u32("pids", pids),
        open_files=_u32("open_files", open_files),
        tmpfs_mb=_u32("tmpfs_mb", tmpfs_mb),
    )
    if cpu is not None:
        if isinstance(cpu, bool) or not isinstance(cpu, (int, float)) or not cpu > 0:
            raise errors.InvalidArgument(f"cpu must be a number of cores > 0, got {cpu!r}")
        millis = round(cpu * 1000)
        res.cpu_millis = _u32("cpu (millicores)", max(1, millis))
    req = pb.CreateSandboxRequest(
        backend=backend,
        layers=list(layers),
        resources=res,
        env=_env_pb(env),
        workdir=workdir or "",
        user=user or "",
        hostname=hostname or "",
        labels=dict(labels or {}),
        ttl_s=_u32("ttl_s", ttl_s),
        job=job or "",
        idle_timeout_s=_u32("idle_timeout_s", idle_timeout_s),
        request_id=request_id or "",
        image=image or "",
        qos=_qos(qos),
        start=bool(start),
        command=_argv("command", command),
        expose=[_port(p) for p in (expose or ())],
        expose_image_ports=bool(expose_image_ports),
    )
    if network is not None:
        req.network.CopyFrom(_network_pb(network))
    return req


# A create whose RPC ended without an answer from the daemon (the client's
# deadline passed, the call was cancelled or the connection broke) may still
# have made a sandbox the client will never learn about: the SDK abandons it
# by its request id (CreateSandboxRequest.request_id).
_CREATE_GIVEN_UP = (errors.DeadlineExceeded, errors.Cancelled, errors.Unavailable)
# How long an abandon is retried while the daemon is unreachable (restarting).
ABANDON_RETRY_S = 60.0


def _new_request_id() -> str:
    return "sdk-" + secrets.token_hex(12)


def _u32_or_u64(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value >= 1 << 64:
        raise errors.InvalidArgument(f"{name} must be an integer in [0, 2^64), got {value!r}")
    return value


# Process requests (streaming exec, spawn): the ExecRequest without output_cap/request_id.
def _proc_request(
    sandbox_id: str,
    cmd: Cmd,
    env: Optional[Mapping[str, Union[str, bytes]]],
    cwd: Optional[str],
    user: Optional[str],
    stdin: Optional[Union[bytes, str]],
    timeout: Optional[float],
    kill_grace: Optional[float],
    merge_stderr: bool = False,
) -> pb.ExecRequest:
    """The ExecRequest of a command (same rules as Sandbox.exec)."""
    req = pb.ExecRequest(
        sandbox_id=sandbox_id, env=_env_pb(env), cwd=cwd or "", user=user or "", merge_stderr=merge_stderr
    )
    if isinstance(cmd, (str, bytes)):
        req.shell = cmd if isinstance(cmd, bytes) else cmd.encode("utf-8", "surrogateescape")
    else:
        argv = [a if isinstance(a, bytes) else os.fsencode(a) for a in cmd]
        if not argv:
            raise errors.InvalidArgument("empty argv")
        req.argv.extend(argv)
    if stdin is not None:
        req.stdin = stdin.encode("utf-8") if isinstance(stdin, str) else bytes(stdin)
    if timeout is not None:
        if timeout <= 0:
            raise errors.InvalidArgument(f"timeout must be > 0 seconds, got {timeout}")
        req.timeout_ms = _u32("timeout (ms)", max(1, round(timeout * 1000)))
    if kill_grace is not None:
        if kill_grace < 0:
            raise errors.InvalidArgument(f"kill_grace must be >= 0, got {kill_grace}")
        req.kill_grace_ms = _u32("kill_grace (ms)", round(kill_grace * 1000))
    return req


def _start_options(
    pty: bool, rows: Optional[int], cols: Optional[int], control_fd: bool = False, buffer_bytes: Optional[int] = None
) -> ppb.StartOptions:
    if buffer_bytes is not None and (
        isinstance(buffer_bytes, bool) or not isinstance(buffer_bytes, int) or not 0 < buffer_bytes <= MAX_BUFFER_BYTES
    ):
        raise errors.InvalidArgument(f"buffer_bytes must be in [1, {MAX_BUFFER_BYTES}], got {buffer_bytes!r}")
    return ppb.StartOptions(
        pty=pty, rows=_u32("rows", rows), cols=_u32("cols", cols), control_fd=control_fd, buffer_bytes=buffer_bytes or 0
    )


def _to_bytes(data: Union[bytes, bytearray, memoryview, str]) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)
