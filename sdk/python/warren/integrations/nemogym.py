"""NeMo-Gym ``SandboxProvider`` on warren (nemo-gym 0.7; Python >= 3.12).

``WarrenProvider`` implements ``nemo_gym.sandbox.providers.SandboxProvider``
and its optional capabilities ``SupportsSandboxPauseResume``,
``SupportsSandboxEndpoint`` and ``ConnectableProvider`` exactly as
nemo-gym 0.7.0 declares them. Register it by its entry point
(``nemo_gym.sandbox_providers``: ``warren``, declared by the SDK's package)
or explicitly, then use NeMo-Gym's own sandbox API::

    from nemo_gym.sandbox import AsyncSandbox, SandboxSpec
    async with AsyncSandbox({"warren": {"layers": ["base/debian-12@1"]}},
                            SandboxSpec(workdir="/work")) as sb:
        await sb.start()
        r = await sb.exec("echo hi")
        await sb.pause(); await sb.resume()     # processes and files kept

Mapping (``SandboxSpec`` → warren create):

* ``image``: a warren image of the node of that name, or the layers the
  provider's ``images`` option maps it to; ``None``: the provider's
  ``layers``. ``provider_options``: ``layers`` (extra, on top), ``backend``,
  ``network`` (warren's egress policy), ``snapshot_id`` (start from a
  snapshot taken by ``snapshot()``, as OpenSandbox's provider option of that
  name), ``create`` (more ``Client.create`` keywords).
* ``ttl_s`` → the sandbox's TTL (the node destroys it then, client alive or
  not); ``ready_timeout_s`` → the create deadline; ``env``, ``workdir``
  (made if missing, and the default cwd of exec); ``metadata`` → labels;
  ``resources``: ``cpu``, ``memory_mib``, ``disk_gib`` → cpu, memory_mb,
  disk_mb (GPUs: SandboxCreateError); ``entrypoint`` is started as a
  background process that outlives the create; ``ports`` are served by
  ``endpoint()`` (``Sandbox.expose``: needs ``warrend --sandbox-net``).

* ``exec`` runs ``bash -c`` (``sh -c`` where the image has no bash) and
  never raises for the command: a timeout (the command's whole process tree
  is killed) is ``return_code=125, error_type="timeout"`` and a failed call
  (sandbox gone, bad cwd/user) ``return_code=125, error_type="sandbox"``,
  the sentinels of NeMo-Gym's docker provider.
* ``pause``/``resume``: warren's pause (cgroup freeze; ``pause_mode="suspend"``:
  suspend, which also gives the memory back to the host) and resume.
  Processes, open files and files survive both; ``status`` is ``PAUSED``
  meanwhile. Any exec or file call on a paused sandbox resumes it.
* ``snapshot(handle)`` (warren's own; NeMo-Gym has no generic snapshot
  capability): the sandbox's changes as a layer; returns a ``snapshot_id``
  that ``provider_options={"snapshot_id": ...}`` starts new sandboxes from.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from nemo_gym.sandbox.providers.base import (
    SandboxCreateError,
    SandboxEndpoint,
    SandboxExecResult,
    SandboxHandle,
    SandboxSpec,
    SandboxStatus,
)

import warren
from warren.aio import AsyncClient, AsyncSandbox

__all__ = ["WarrenCreateError", "WarrenProvider"]

PROVIDER_NAME = "warren"
# NeMo-Gym's non-process exec sentinel (its docker provider's SANDBOX_RUNTIME_RETURN_CODE).
SANDBOX_RUNTIME_RETURN_CODE = 125
SNAPSHOT_SEP = "+"

_STATUS = {
    "creating": SandboxStatus.STARTING,
    "running": SandboxStatus.RUNNING,
    "paused": SandboxStatus.PAUSED,
    "suspended": SandboxStatus.PAUSED,
    "stopped": SandboxStatus.STOPPED,
    "destroyed": SandboxStatus.STOPPED,
}


class WarrenCreateError(SandboxCreateError):
    """warren could not create the sandbox (the message names warren's error)."""


@dataclass
class _Box:
    sandbox: AsyncSandbox
    shell: str
    workdir: Optional[str]
    ports: tuple[int, ...] = ()


class WarrenProvider:
    """NeMo-Gym sandbox provider backed by a warren node (see the module doc)."""

    name = PROVIDER_NAME

    def __init__(self, *, addr: Optional[str] = None, backend: str = "container", layers: Sequence[str] = (),
                 images: Optional[Mapping[str, Union[str, Sequence[str]]]] = None,
                 create: Optional[Mapping[str, Any]] = None, pause_mode: str = "pause",
                 default_timeout_s: Optional[float] = None) -> None:
        """addr: warrend address (default WARREN_ADDR or the local socket).
        layers: layers of every sandbox (bottom first; below a spec's
        provider_options layers). images: Docker references (spec.image)
        mapped to a warren image name (str) or layers (list). create: more
        Client.create keywords. pause_mode: "pause" (freeze) or "suspend"
        (freeze and reclaim memory). default_timeout_s: exec timeout when a
        call gives none (None: no limit)."""
        if pause_mode not in ("pause", "suspend"):
            raise ValueError(f"warren provider: pause_mode must be 'pause' or 'suspend', not {pause_mode!r}")
        self._addr = addr
        self._backend = backend
        self._layers = list(layers)
        self._images = dict(images or {})
        self._create_kwargs = dict(create or {})
        self._pause_mode = pause_mode
        self._default_timeout_s = default_timeout_s
        self._client: Optional[AsyncClient] = None

    def _c(self) -> AsyncClient:
        # Made on first use: an AsyncClient belongs to the event loop it is made in.
        if self._client is None:
            self._client = AsyncClient(self._addr)
        return self._client

    @staticmethod
    def _box(handle: SandboxHandle) -> _Box:
        if not isinstance(handle.raw, _Box):
            raise TypeError(f"warren provider: handle {handle.sandbox_id!r} was not made by this provider")
        return handle.raw

    # ---- SandboxProvider

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        c = self._c()
        opts = dict(spec.provider_options)
        unknown = set(opts) - {"layers", "backend", "network", "snapshot_id", "create"}
        if unknown:
            raise WarrenCreateError(f"warren provider: unknown provider_options {sorted(unknown)}")
        res = spec.resources
        if getattr(res, "gpu", None):
            raise WarrenCreateError("warren provider: GPUs are not available on warren sandboxes")
        image: Optional[str] = None
        layers: List[str] = list(self._layers)
        if opts.get("snapshot_id"):
            layers = str(opts["snapshot_id"]).split(SNAPSHOT_SEP)
        elif spec.image:
            mapped = self._images.get(spec.image)
            if mapped is None:
                image = spec.image
            elif isinstance(mapped, str):
                image = mapped
            else:
                layers = list(mapped)
        layers += list(opts.get("layers") or ())
        kwargs: Dict[str, Any] = {**self._create_kwargs, **dict(opts.get("create") or {})}
        if getattr(res, "cpu", None) is not None:
            kwargs["cpu"] = float(res.cpu)
        if getattr(res, "memory_mib", None) is not None:
            kwargs["memory_mb"] = int(res.memory_mib)
        if getattr(res, "disk_gib", None) is not None:
            kwargs["disk_mb"] = int(res.disk_gib) * 1024
        labels = {_label_key(k): str(v)[:1024] for k, v in spec.metadata.items()}
        labels.update(kwargs.pop("labels", {}))
        try:
            sb = await c.create(opts.get("backend") or self._backend, layers, image=image,
                                env=dict(spec.env) or None, labels=labels or None,
                                ttl_s=math.ceil(spec.ttl_s) if spec.ttl_s else None,
                                network=opts.get("network"), timeout=spec.ready_timeout_s, **kwargs)
        except warren.WarrenError as e:
            raise WarrenCreateError(f"warren provider: create failed: {e}") from e
        try:
            shell = "bash" if (await sb.exec(["sh", "-c", "command -v bash"], timeout=30)).exit_code == 0 else "sh"
            if spec.workdir:
                r = await sb.exec(["mkdir", "-p", spec.workdir], user="root", timeout=30)
                if r.exit_code != 0:
                    raise WarrenCreateError(f"warren provider: mkdir -p {spec.workdir}: "
                                            f"{r.stderr.decode(errors='replace').strip()}")
            if spec.entrypoint:
                await sb.spawn(list(spec.entrypoint), cwd=spec.workdir)
        except BaseException:
            try:
                await sb.destroy(timeout=60)
            except warren.WarrenError:
                pass
            raise
        return SandboxHandle(sandbox_id=sb.id, provider_name=self.name,
                             raw=_Box(sb, shell, spec.workdir, tuple(getattr(spec, "ports", ()) or ())))

    async def exec(self, handle: SandboxHandle, command: str, *, cwd: Optional[str] = None,
                   env: Optional[Dict[str, str]] = None, timeout_s: Union[int, float, None] = None,
                   user: Union[str, int, None] = None) -> SandboxExecResult:
        box = self._box(handle)
        timeout = timeout_s if timeout_s is not None else self._default_timeout_s
        try:
            r = await box.sandbox.exec([box.shell, "-c", command], cwd=cwd or box.workdir, env=env or None,
                                       user=None if user is None else str(user), timeout=timeout)
        except warren.WarrenError as e:
            return SandboxExecResult(stdout=None, stderr=f"warren: {e}", return_code=SANDBOX_RUNTIME_RETURN_CODE,
                                     error_type="sandbox")
        out, err = r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
        if r.timed_out:
            return SandboxExecResult(stdout=out, stderr=err + f"\nwarren: command timed out after {timeout}s",
                                     return_code=SANDBOX_RUNTIME_RETURN_CODE, error_type="timeout")
        return SandboxExecResult(stdout=out, stderr=err, return_code=r.exit_code)

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        """One local file into the sandbox (parents made, mode bits kept)."""
        src = Path(source_path)
        with open(src, "rb") as f:
            await self._box(handle).sandbox.files.write(target_path, f, mode=src.stat().st_mode & 0o7777,
                                                         make_parents=True)

    async def download_file(self, handle: SandboxHandle, source_path: str, target_path: Path) -> None:
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(await self._box(handle).sandbox.files.read(source_path))

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        try:
            info = await self._box(handle).sandbox.info()
        except warren.NotFound:
            return SandboxStatus.STOPPED
        except warren.WarrenError:
            return SandboxStatus.UNKNOWN
        return _STATUS.get(info.state, SandboxStatus.UNKNOWN)

    async def close(self, handle: SandboxHandle) -> None:
        """Destroys the sandbox (already gone counts as closed)."""
        try:
            await self._box(handle).sandbox.destroy(timeout=120)
        except warren.NotFound:
            pass

    async def aclose(self) -> None:
        c, self._client = self._client, None
        if c is not None:
            await c.close()

    # ---- SupportsSandboxPauseResume

    async def pause(self, handle: SandboxHandle) -> None:
        sb = self._box(handle).sandbox
        if self._pause_mode == "suspend":
            await sb.suspend()
        else:
            await sb.pause()

    async def resume(self, handle: SandboxHandle) -> None:
        await self._box(handle).sandbox.resume()

    # ---- SupportsSandboxEndpoint

    async def endpoint(self, handle: SandboxHandle, port: int) -> SandboxEndpoint:
        """The node's token-guarded address of the sandbox's port (Sandbox.expose)."""
        box = self._box(handle)
        if box.ports and port not in box.ports:
            raise ValueError(f"Sandbox port {port} was not declared in SandboxSpec.ports; "
                             f"declared ports: {list(box.ports)!r}")
        e = await box.sandbox.expose(port)
        return SandboxEndpoint(endpoint=f"http://{e.address}", headers={"X-Warren-Token": e.token})

    # ---- ConnectableProvider

    async def serialize_handle(self, handle: SandboxHandle, *, scope: Optional[str] = None) -> Dict[str, Any]:
        box = self._box(handle)
        return {"sandbox_id": handle.sandbox_id, "workdir": box.workdir, "shell": box.shell}

    async def connect(self, descriptor: Mapping[str, Any]) -> SandboxHandle:
        sid = descriptor.get("sandbox_id")
        if not sid:
            raise WarrenCreateError("warren provider: connect needs a sandbox_id")
        try:
            sb = await self._c().get(str(sid))
        except warren.WarrenError as e:
            raise WarrenCreateError(f"warren provider: cannot connect to {sid!r}: {e}") from e
        return SandboxHandle(sandbox_id=sb.id, provider_name=self.name,
                             raw=_Box(sb, str(descriptor.get("shell") or "sh"), descriptor.get("workdir"),
                                      tuple(descriptor.get("ports") or ())))

    # ---- warren's own

    async def snapshot(self, handle: SandboxHandle, *, name: Optional[str] = None,
                       exclude: Sequence[str] = ()) -> str:
        """Packs the sandbox's changes into a layer (warren snapshot; the
        sandbox is frozen meanwhile and goes on after). Returns the
        snapshot_id for ``SandboxSpec(provider_options={"snapshot_id": ...})``."""
        snap = await self._box(handle).sandbox.snapshot(name=name, exclude=exclude)
        return SNAPSHOT_SEP.join(snap.layers)


_LABEL_BAD = re.compile(r"[^A-Za-z0-9_.\-/]")


def _label_key(k: str) -> str:
    return _LABEL_BAD.sub("_", str(k))[:253] or "_"  # warren's label key alphabet and bound
