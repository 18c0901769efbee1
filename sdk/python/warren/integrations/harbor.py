"""Harbor ``BaseEnvironment`` on warren (harbor 0.26; Python >= 3.12, as Harbor).

Use it as a custom environment type::

    harbor run -p TASK -a oracle --env warren.integrations.harbor:WarrenEnvironment \\
        --ek addr=unix:/run/warren/warren.sock \\
        --ek 'images={"python:3.12-slim": ["base/debian-12@1"]}'

The trial's environment is one warren sandbox:

* **start**: the task's ``docker_image`` (a warren image of the node of that
  name, pulled with ``pull=true``, or the layers ``images`` maps it to), or its
  ``environment/Dockerfile``, built *inside a warren sandbox*: the single
  ``FROM`` is resolved the same way, then ``RUN`` (shell and exec form),
  ``COPY``/``ADD`` of local files (``--chown``, ``--chmod``; no URLs, no
  archives' auto-extraction, no ``--from``), ``WORKDIR``, ``ENV``, ``ARG``
  (defaults), ``USER`` and ``SHELL`` are run in order; ``CMD``,
  ``ENTRYPOINT``, ``EXPOSE``, ``LABEL``, ``VOLUME``, ``HEALTHCHECK``,
  ``STOPSIGNAL`` and ``ONBUILD`` do not apply to an exec-driven sandbox and
  are skipped. The result is snapshotted into the layer
  ``workspace/harbor-<hash>@1`` (hash of the environment directory and the
  base), so later trials of the task start from that layer without a build
  (``force_build`` rebuilds). Multi-stage Dockerfiles and docker-compose
  environments are refused before anything starts.
* **exec**: ``bash -c COMMAND`` with cwd (default: the task's workdir, else
  the Dockerfile's ``WORKDIR``), env (Harbor's persistent < per-call < scoped
  overlays, over the Dockerfile's ``ENV``), ``timeout_sec`` (the whole
  process tree is killed; then ``RuntimeError("Command timed out after N
  seconds")``, as Harbor's docker environment raises) and user (name or uid;
  default Harbor's ``default_user``, else the Dockerfile's ``USER``, else
  root). Output streams to Harbor's output callbacks when a phase sets one.
* **files**: ``upload_file``/``download_file`` through warren's file API
  (mode bits kept, parents made), ``upload_dir``/``download_dir`` as one tar
  stream each way (``Files.upload_dir``/``download_dir``; a downloaded tar is
  checked entry by entry, so a device node or a link leaving the directory is
  an error rather than skipped).
* **network**: Harbor's policies map onto warren's egress policy:
  ``no-network`` = loopback only (or an empty allow list once the sandbox has
  a link), ``allowlist`` = ``{"allow": allowed_hosts}`` (host names, ``*.``
  wildcards, IPv4 addresses and CIDRs), ``public`` = ``{"allow":
  ["0.0.0.0/0"]}`` (the node's protected ranges stay closed). A phase change
  is ``Sandbox.set_network``. Any policy other than ``no-network`` needs
  ``warrend --sandbox-net``; without it start() fails naming the policy.
* **resources**: ``cpus``, ``memory_mb``, ``storage_mb`` → ``cpu``,
  ``memory_mb``, ``disk_mb`` limits.
* **stop(delete=True)** destroys the sandbox; ``delete=False`` suspends it
  (kept until its ``ttl_s``; resume with ``warren resume ID``).
"""

from __future__ import annotations

import codecs
import fnmatch
import hashlib
import json
import posixpath
import re
import shlex
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from harbor.environments.base import BaseEnvironment, ExecResult, SandboxBuildFailedError
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.definition import (
    COMPOSE_FILE_NAME,
    DOCKERFILE_NAME,
    environment_content_hash,
    should_use_prebuilt_docker_image,
)
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import NetworkMode, NetworkPolicy
from harbor.models.trial.config import ResourceMode
from pydantic import Field

import warren
from warren.aio import AsyncClient, AsyncSandbox

__all__ = ["WarrenEnvironment", "WarrenEnvironmentOptions", "parse_dockerfile"]

ENVIRONMENT_TYPE = "warren"
CACHE_LAYER_KIND = "workspace"


class WarrenEnvironmentOptions(EnvironmentOptions):
    """``--ek`` options of the warren environment."""

    addr: Optional[str] = Field(
        default=None, description="warrend address (default: WARREN_ADDR or the SDK's local socket).")
    backend: str = Field(default="container", description="warren backend of the sandbox.")
    images: Dict[str, Union[str, List[str]]] = Field(
        default_factory=dict,
        description="Docker image references (docker_image, FROM) mapped to a warren image name (a string) "
                    "or to warren layers, bottom first (a list).")
    layers: List[str] = Field(default_factory=list, description="Extra layers on top (e.g. toolsets).")
    pull: bool = Field(default=False, description="Pull an unmapped image the node lacks from its registry.")
    ttl_s: int = Field(default=6 * 3600, gt=0, description="The sandbox's TTL: the node destroys it then.")
    build_network: Optional[Dict[str, List[str]]] = Field(
        default=None, description="Egress policy of the build sandbox (None: loopback only).")
    create: Dict[str, Any] = Field(
        default_factory=dict, description="More keyword arguments of Client.create (pids, labels, ...).")


# ---------------------------------------------------------------- Dockerfile


@dataclass
class Instruction:
    keyword: str  # upper case
    value: str  # the rest of the (joined) line
    line: int


def parse_dockerfile(text: str) -> List[Instruction]:
    """The Dockerfile's instructions: comments and blank lines dropped,
    backslash continuations joined (the default escape character)."""
    out: List[Instruction] = []
    pending = ""
    start = 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        stripped = line.lstrip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):  # comment lines inside a continuation
            continue
        if not pending:
            start = n
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pending += line
        keyword, _, value = pending.strip().partition(" ")
        out.append(Instruction(keyword.upper(), value.strip(), start))
        pending = ""
    if pending.strip():
        keyword, _, value = pending.strip().partition(" ")
        out.append(Instruction(keyword.upper(), value.strip(), start))
    return out


_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-+])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def _substitute(s: str, variables: Dict[str, str]) -> str:
    """$VAR, ${VAR}, ${VAR:-word} and ${VAR:+word} (also without the colon),
    as Docker substitutes them in FROM, ENV, WORKDIR, COPY, ADD and USER."""
    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(4)
        op, word = m.group(2), m.group(3) or ""
        value = variables.get(name)
        is_set = value is not None and (value != "" or not (op or "").startswith(":"))
        if op and op.endswith("-"):
            return value if is_set and value is not None else word
        if op and op.endswith("+"):
            return word if is_set else ""
        return value or ""
    return _VAR.sub(one, s)


def _json_form(value: str) -> Optional[List[str]]:
    if not value.startswith("["):
        return None
    try:
        v = json.loads(value)
    except json.JSONDecodeError:
        return None
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return v
    return None


def _env_pairs(value: str) -> List[Tuple[str, str]]:
    """ENV/ARG values: ``K=V K2="v 2"`` or the legacy ``K the rest``."""
    parts = shlex.split(value, posix=True)
    if parts and "=" not in parts[0]:
        key, _, rest = value.partition(" ")
        return [(key, rest.strip())]
    pairs = []
    for p in parts:
        key, sep, v = p.partition("=")
        pairs.append((key, v if sep else ""))
    return pairs


def _flags(value: str) -> Tuple[Dict[str, str], str]:
    """Leading --flag=value options of COPY/ADD/RUN/FROM."""
    flags: Dict[str, str] = {}
    rest = value
    while rest.startswith("--"):
        tok, _, rest = rest.partition(" ")
        k, _, v = tok[2:].partition("=")
        flags[k] = v
        rest = rest.lstrip()
    return flags, rest


@dataclass
class _ImageState:
    """What a built image gives its sandboxes (Docker's image config)."""

    env: Dict[str, str] = field(default_factory=dict)
    workdir: Optional[str] = None
    user: Optional[str] = None


# ---------------------------------------------------------------- environment


class WarrenEnvironment(BaseEnvironment):
    """A Harbor environment backed by one warren sandbox (see the module doc)."""

    options_model = WarrenEnvironmentOptions
    options: WarrenEnvironmentOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._client: Optional[AsyncClient] = None
        self._sandbox: Optional[AsyncSandbox] = None
        self._image = _ImageState()
        self._has_link = False
        super().__init__(*args, **kwargs)

    # ---- class-level contract

    @staticmethod
    def type() -> str:
        return ENVIRONMENT_TYPE

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(
            disable_internet=True,
            network_allowlist=True,
            network_allowlist_hostnames=True,
            network_allowlist_wildcard_hostnames=True,
            network_allowlist_ipv4_addresses=True,
            network_allowlist_ipv4_cidrs=True,
            dynamic_network_policy=True,
        )

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True, fractional_cpus=True)

    @classmethod
    def preflight(cls, kwargs: Optional[Dict[str, Any]] = None) -> None:
        """Validates the options and checks that warrend answers."""
        super().preflight(kwargs)
        opts = cls.parse_options(kwargs)
        assert isinstance(opts, WarrenEnvironmentOptions)
        c = warren.Client(opts.addr)
        try:
            c.status(timeout=10)
        except warren.WarrenError as e:
            raise SystemExit(f"warren environment: warrend at {opts.addr or 'the default address'} "
                             f"does not answer: {e}") from e
        finally:
            c.close()

    def _validate_definition(self) -> None:
        d = self.environment_dir
        if (d / COMPOSE_FILE_NAME).exists() or self.extra_docker_compose_paths:
            raise ValueError(f"{d / COMPOSE_FILE_NAME}: docker-compose environments are not supported by the "
                             f"warren environment (one sandbox per trial)")
        if self.task_env_config.docker_image:
            return
        dockerfile = d / DOCKERFILE_NAME
        if not dockerfile.exists():
            raise FileNotFoundError(f"Task environment directory {d} has neither docker_image in task.toml nor "
                                    f"{DOCKERFILE_NAME}")
        froms = [i for i in parse_dockerfile(dockerfile.read_text()) if i.keyword == "FROM"]
        if len(froms) != 1:
            raise ValueError(f"{dockerfile}: {len(froms)} FROM instructions; the warren environment builds "
                             f"single-stage Dockerfiles only")

    # ---- helpers

    def _require(self) -> AsyncSandbox:
        if self._sandbox is None:
            raise RuntimeError("Sandbox not found. Please start the environment first.")
        return self._sandbox

    @property
    def sandbox(self) -> Optional[AsyncSandbox]:
        """The warren sandbox of this environment (None before start/after stop)."""
        return self._sandbox

    @staticmethod
    def _policy_to_warren(policy: NetworkPolicy) -> Dict[str, List[str]]:
        if policy.network_mode == NetworkMode.PUBLIC:
            return {"allow": ["0.0.0.0/0"]}
        if policy.network_mode == NetworkMode.ALLOWLIST:
            return {"allow": list(policy.allowed_hosts)}
        return {"allow": []}

    def _needs_link(self) -> bool:
        return any(p.network_mode != NetworkMode.NO_NETWORK
                   for p in [self._network_policy, *self._phase_network_policies])

    async def _resolve_base(self, ref: str) -> Tuple[Optional[str], List[str]]:
        """(warren image, layers) of a Docker image reference."""
        assert self._client is not None
        mapped = self.options.images.get(ref)
        if mapped is not None:
            return (mapped, []) if isinstance(mapped, str) else (None, list(mapped))
        try:
            img = await self._client.images.get(ref)
            return img.name, []
        except (warren.NotFound, warren.InvalidArgument):
            pass
        if self.options.pull:
            try:
                img = await self._client.images.pull(ref)
            except warren.WarrenError as e:
                raise SandboxBuildFailedError(f"warren: pulling {ref!r} failed: {e}") from e
            return img.name, []
        raise SandboxBuildFailedError(
            f"warren: the node has no image {ref!r}; map it to warren layers (--ek 'images={{\"{ref}\": "
            f"[\"base/debian-12@1\"]}}'), import it (warren image pull/import), or set pull=true")

    def _resources(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        cpus = self._resource_limit_value("cpu", auto_mode=ResourceMode.LIMIT)
        mem = self._resource_limit_value("memory", auto_mode=ResourceMode.LIMIT)
        if cpus is not None:
            out["cpu"] = float(cpus)
        if mem is not None:
            out["memory_mb"] = int(mem)
        if self._effective_storage_mb is not None:
            out["disk_mb"] = int(self._effective_storage_mb)
        return out

    async def _create(self, image: Optional[str], layers: List[str], network: Optional[Dict[str, List[str]]],
                      env: Dict[str, str], user: Optional[str], labels: Dict[str, str]) -> AsyncSandbox:
        assert self._client is not None
        kwargs: Dict[str, Any] = {**self._resources(), **self.options.create}
        kwargs.setdefault("retries", 5)
        all_labels = {"harbor.session": _label(self.session_id), "harbor.environment": _label(self.environment_name),
                      **labels, **kwargs.pop("labels", {})}
        try:
            return await self._client.create(
                self.options.backend, [*layers, *self.options.layers], image=image, env=env or None, user=user,
                ttl_s=self.options.ttl_s, labels=all_labels, network=network, **kwargs)
        except warren.FailedPrecondition as e:
            if network is not None:
                raise RuntimeError(
                    f"warren: the task's network policy needs a sandbox network, which this node refused "
                    f"({e}); start warrend with --sandbox-net, or give the task network_mode='no-network'"
                ) from e
            raise

    # ---- lifecycle

    async def start(self, force_build: bool) -> None:
        if self._sandbox is not None:
            raise RuntimeError("warren environment already started")
        self._client = AsyncClient(self.options.addr)
        try:
            await self._start(force_build)
        except BaseException:
            await self.stop(delete=True)
            raise
        await self._upload_environment_dir_after_start()

    async def _start(self, force_build: bool) -> None:
        cfg = self.task_env_config
        image: Optional[str]
        if should_use_prebuilt_docker_image(self.environment_dir, docker_image=cfg.docker_image,
                                            force_build=force_build):
            assert cfg.docker_image is not None
            image, layers = await self._resolve_base(cfg.docker_image)
        else:
            image, layers = await self._build(force_build)
        network = self._policy_to_warren(self._network_policy) if self._needs_link() else None
        env = {**self._image.env, **self._startup_env()}
        self._sandbox = await self._create(image, layers, network, env, self._image.user, {})
        self._has_link = network is not None
        self.logger.debug(f"warren sandbox {self._sandbox.id} started for {self.session_id}")
        workdir = cfg.workdir or self._image.workdir
        if workdir:
            r = await self._sandbox.exec(["mkdir", "-p", workdir], user="root", timeout=60)
            if r.exit_code != 0:
                raise RuntimeError(f"warren: mkdir -p {workdir} failed: {r.stderr.decode(errors='replace')}")
        # Harbor's output dirs (/logs/agent, /logs/verifier, /logs/artifacts):
        # made here, as every provider that does not mount them from the host.
        await self.ensure_dirs(self._mount_targets(writable_only=True))

    async def stop(self, delete: bool) -> None:
        sb, self._sandbox = self._sandbox, None
        try:
            if sb is not None:
                try:
                    if delete:
                        await sb.destroy(timeout=120)
                    else:
                        await sb.suspend()
                        self.logger.info(f"warren sandbox {sb.id} kept suspended (delete=False) until its TTL")
                except warren.NotFound:
                    pass
        finally:
            c, self._client = self._client, None
            if c is not None:
                await c.close()

    # ---- Dockerfile build

    async def _build(self, force_build: bool) -> Tuple[Optional[str], List[str]]:
        """Builds environment/Dockerfile in a warren sandbox (or finds the
        cached layer of an earlier build); sets self._image. Returns the
        (image, layers) sandboxes of this environment start from."""
        assert self._client is not None
        dockerfile = self.environment_dir / DOCKERFILE_NAME
        instructions = parse_dockerfile(dockerfile.read_text())
        args: Dict[str, str] = {}
        i = 0
        while instructions[i].keyword != "FROM":  # ARGs before FROM feed FROM only
            if instructions[i].keyword == "ARG":
                args.update(_env_pairs(instructions[i].value))
            i += 1
        _, from_value = _flags(instructions[i].value)
        from_ref = _substitute(from_value.split()[0], args)
        image, layers = await self._resolve_base(from_ref)
        key = hashlib.sha256(json.dumps({
            "content": environment_content_hash(self.environment_dir),
            "base": [image, layers], "backend": self.options.backend,
        }, sort_keys=True).encode()).hexdigest()[:32]
        cache = f"{CACHE_LAYER_KIND}/harbor-{key}@1"
        steps = instructions[i + 1:]
        # The image config (ENV/WORKDIR/USER) is the Dockerfile's, cached or not.
        self._image = _ImageState()
        if not force_build:
            try:
                await self._client.layers.get(cache)
                self._replay_config(steps)
                self.logger.debug(f"warren: {dockerfile} built before: {cache}")
                return image, [*layers, cache]
            except warren.NotFound:
                pass
        if force_build:  # a new layer for this build; the cached name keeps the earlier one
            cache = f"{CACHE_LAYER_KIND}/harbor-{key}@{time.time_ns()}"
        started = time.monotonic()
        sb = await self._create(image, layers, self.options.build_network, {}, None, {"harbor.build": "1"})
        try:
            await self._run_steps(sb, steps, started)
            try:
                await sb.snapshot(name=cache, timeout=self.task_env_config.build_timeout_sec)
            except warren.AlreadyExists:  # a concurrent trial built it
                pass
        finally:
            try:
                await sb.destroy(timeout=120)
            except warren.NotFound:
                pass
        return image, [*layers, cache]

    def _replay_config(self, steps: List[Instruction]) -> None:
        """Sets self._image from ENV/ARG/WORKDIR/USER without running anything."""
        args: Dict[str, str] = {}
        for ins in steps:
            variables = {**args, **self._image.env}
            if ins.keyword == "ARG":
                for k, v in _env_pairs(ins.value):
                    args.setdefault(k, _substitute(v, variables))
            elif ins.keyword == "ENV":
                for k, v in _env_pairs(ins.value):
                    self._image.env[k] = _substitute(v, variables)
            elif ins.keyword == "WORKDIR":
                self._image.workdir = posixpath.join(self._image.workdir or "/", _substitute(ins.value, variables))
            elif ins.keyword == "USER":
                self._image.user = _substitute(ins.value, variables)

    async def _run_steps(self, sb: AsyncSandbox, steps: List[Instruction], started: float) -> None:
        args: Dict[str, str] = {}
        shell = ["/bin/sh", "-c"]
        budget = self.task_env_config.build_timeout_sec
        img = self._image
        for ins in steps:
            left = budget - (time.monotonic() - started)
            if left <= 0:
                raise SandboxBuildFailedError(f"Dockerfile build exceeded build_timeout_sec={budget:g}")
            variables = {**args, **img.env}
            where = f"Dockerfile line {ins.line} ({ins.keyword})"
            kw = ins.keyword
            if kw == "ARG":
                for k, v in _env_pairs(ins.value):
                    args.setdefault(k, _substitute(v, variables))
            elif kw == "ENV":
                for k, v in _env_pairs(ins.value):
                    img.env[k] = _substitute(v, variables)
            elif kw == "WORKDIR":
                workdir = posixpath.join(img.workdir or "/", _substitute(ins.value, variables))
                await self._check(sb, ["mkdir", "-p", workdir], where, left, user="root", cwd="/")
                img.workdir = workdir
            elif kw == "USER":
                img.user = _substitute(ins.value, variables)
            elif kw == "SHELL":
                form = _json_form(ins.value)
                if not form:
                    raise SandboxBuildFailedError(f"{where}: SHELL needs the JSON form")
                shell = form
            elif kw == "RUN":
                flags, rest = _flags(ins.value)
                if flags:
                    raise SandboxBuildFailedError(f"{where}: RUN options {sorted(flags)} are not supported")
                form = _json_form(rest)
                argv = form if form is not None else [*shell, rest]
                await self._check(sb, argv, where, left, env={**args, **img.env}, user=img.user)
            elif kw in ("COPY", "ADD"):
                await self._copy(sb, ins, variables, where, left)
            elif kw in ("CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "VOLUME", "HEALTHCHECK", "STOPSIGNAL",
                        "ONBUILD", "MAINTAINER"):
                self.logger.debug(f"warren build: {where} does not apply to an exec-driven sandbox; skipped")
            else:
                raise SandboxBuildFailedError(f"{where}: unknown or unsupported instruction")

    async def _check(self, sb: AsyncSandbox, argv: List[str], where: str, timeout: float,
                     env: Optional[Dict[str, str]] = None, user: Optional[str] = None,
                     cwd: Optional[str] = None) -> None:
        r = await sb.exec(argv, env=env or None, cwd=cwd or self._image.workdir, user=user, timeout=timeout,
                          merge_stderr=True)
        if r.timed_out:
            raise SandboxBuildFailedError(f"{where}: timed out (build_timeout_sec)")
        if r.exit_code != 0:
            tail = r.stdout.decode(errors="replace")[-4000:]
            raise SandboxBuildFailedError(f"{where}: {shlex.join(argv)} exited {r.exit_code}:\n{tail}")

    async def _copy(self, sb: AsyncSandbox, ins: Instruction, variables: Dict[str, str], where: str,
                    timeout: float) -> None:
        flags, rest = _flags(ins.value)
        unknown = set(flags) - {"chown", "chmod"}
        if unknown:
            raise SandboxBuildFailedError(f"{where}: options {sorted(unknown)} are not supported")
        form = _json_form(rest)
        parts = form if form is not None else shlex.split(rest)
        parts = [_substitute(p, variables) for p in parts]
        if len(parts) < 2:
            raise SandboxBuildFailedError(f"{where}: needs a source and a destination")
        *srcs, dest = parts
        context = self.environment_dir.resolve()
        sources: List[Path] = []
        for s in srcs:
            if re.match(r"^[a-z]+://", s):
                raise SandboxBuildFailedError(f"{where}: remote sources ({s}) are not supported")
            matches = sorted(context.glob(s.lstrip("/"))) if any(c in s for c in "*?[") else [context / s.lstrip("/")]
            for m in matches:
                m = m.resolve()
                if m != context and context not in m.parents:
                    raise SandboxBuildFailedError(f"{where}: {s} is outside the build context")
                if not m.exists():
                    raise SandboxBuildFailedError(f"{where}: {s} not found in {context}")
                if ins.keyword == "ADD" and m.is_file() and _is_archive(m):
                    raise SandboxBuildFailedError(f"{where}: ADD of an archive ({s}) is not supported; "
                                                  f"use COPY and RUN tar")
                sources.append(m)
        dest = posixpath.join(self._image.workdir or "/", dest)
        to_dir = dest.endswith("/") or len(sources) > 1 or any(p.is_dir() for p in sources)
        targets = []
        for src in sources:
            if src.is_dir():
                await sb.files.upload_dir(str(src), dest, user="root", timeout=timeout)
                targets.append(dest)
            else:
                target = posixpath.join(dest, src.name) if to_dir else dest
                with open(src, "rb") as f:
                    await sb.files.write(target, f, mode=stat.S_IMODE(src.stat().st_mode), make_parents=True,
                                         timeout=timeout)
                targets.append(target)
        if "chmod" in flags:
            await self._check(sb, ["chmod", "-R", flags["chmod"], *targets], where, timeout, user="root")
        if "chown" in flags:
            await self._check(sb, ["chown", "-R", flags["chown"], *targets], where, timeout, user="root")

    # ---- exec and files

    async def exec(self, command: str, cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None,
                   timeout_sec: Optional[int] = None, user: Union[str, int, None] = None) -> ExecResult:
        sb = self._require()
        u = self._resolve_user(user)
        cwd = cwd or self.task_env_config.workdir or self._image.workdir
        kwargs: Dict[str, Any] = {}
        callback = self._output_callback()
        if callback is not None:
            kwargs["on_stdout"] = _decoding(callback, "stdout")
            kwargs["on_stderr"] = _decoding(callback, "stderr")
        r = await sb.exec(["bash", "-c", command], env=self._merge_env(env), cwd=cwd,
                          user=None if u is None else str(u), timeout=timeout_sec, **kwargs)
        if r.timed_out:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        return ExecResult(stdout=r.stdout.decode(errors="replace"), stderr=r.stderr.decode(errors="replace"),
                          return_code=r.exit_code)

    async def upload_file(self, source_path: Union[Path, str], target_path: str) -> None:
        """Copies a local file into the sandbox as root, keeping its mode bits."""
        src = Path(source_path)
        with open(src, "rb") as f:
            await self._require().files.write(target_path, f, mode=stat.S_IMODE(src.stat().st_mode),
                                              make_parents=True)

    async def upload_dir(self, source_dir: Union[Path, str], target_dir: str) -> None:
        """Copies the contents of a local directory into target_dir (made
        with its parents) as one tar stream, owned by root."""
        src = Path(source_dir)
        if not src.is_dir():
            raise FileNotFoundError(f"Source directory {source_dir} does not exist")
        await self._require().files.upload_dir(str(src), target_dir, user="root")

    async def download_file(self, source_path: str, target_path: Union[Path, str]) -> None:
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(await self._require().files.read(source_path))

    async def download_dir(self, source_dir: str, target_dir: Union[Path, str]) -> None:
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        await self._require().files.download_dir(source_dir, str(target))

    # ---- network

    async def _apply_network_policy(self, network_policy: NetworkPolicy) -> None:
        sb = self._require()
        if not self._has_link:
            if network_policy.network_mode == NetworkMode.NO_NETWORK:
                return
            raise RuntimeError("warren: the sandbox was started without a network link; a later phase cannot add one")
        await sb.set_network(self._policy_to_warren(network_policy))


def _label(s: str) -> str:
    return s[:1024]  # warren's bound of a label value


def _is_archive(p: Path) -> bool:
    return any(fnmatch.fnmatch(p.name, pat) for pat in ("*.tar", "*.tar.*", "*.tgz", "*.tbz2", "*.txz"))


def _decoding(callback: Any, stream: str) -> Any:
    dec = codecs.getincrementaldecoder("utf-8")("replace")

    async def emit(chunk: bytes) -> None:
        text = dec.decode(chunk)
        if text:
            await callback(text, stream)
    return emit
