"""SWE-ReX on warren (swe-rex 1.x): a deployment whose runtime talks to the
warren daemon directly, so no SWE-ReX server runs inside the sandbox.

* ``WarrenDeployment`` (``AbstractDeployment``): start() creates a sandbox
  (or adopts a given one), stop() destroys it.
* ``WarrenRuntime`` (``AbstractRuntime``): bash sessions are warren sessions
  (``Sandbox.session``, stderr merged into stdout as on SWE-ReX's terminal),
  ``execute`` is ``Sandbox.exec``, files go through ``Sandbox.files``.

Behaviour follows swerex.runtime.local.LocalRuntime: the same request and
response models and the same exceptions (SessionExistsError,
SessionDoesNotExistError, BashIncorrectSyntaxError from ``bash -n`` run in
the sandbox, CommandTimeoutError, NonZeroExitCodeError per ``check``,
FileNotFoundError from read_file). Differences: a timed-out session command
is already interrupted (SIGINT) when CommandTimeoutError is raised, so a
following BashInterruptAction finds nothing to stop; ``Command.env`` is
added to the sandbox's environment rather than replacing it.

Sessions run on a terminal (``Sandbox.session(pty=True)``), as SWE-ReX's
pexpect shell does. Interactive actions map to the session's interactive
mode: ``is_interactive_command`` starts the program (``Session.start``) or,
while one runs, types the command to it (``sendline``); then, as SWE-ReX,
the output up to the first of ``action.expect`` (regexes, pexpect's way) or
the program's end (SWE-ReX's PS1) is returned with exit code 0 and
``expect_string`` the string that matched (``"SHELLPS1PREFIX"``, SWE-ReX's
PS1, for the end). ``is_interactive_quit`` types the quit command the same
way. The terminal does not echo what is typed, so no echo is stripped.
"""

from __future__ import annotations

import logging
import shlex
from pathlib import Path
from typing import Any, Dict, List, Optional, Set

from pydantic import BaseModel, ConfigDict
from swerex.deployment.abstract import AbstractDeployment
from swerex.deployment.hooks.abstract import CombinedDeploymentHook, DeploymentHook
from swerex.exceptions import (
    BashIncorrectSyntaxError,
    CommandTimeoutError,
    DeploymentNotStartedError,
    NonZeroExitCodeError,
    SessionDoesNotExistError,
    SessionExistsError,
)
from swerex.runtime.abstract import (
    AbstractRuntime,
    BashAction,
    BashInterruptAction,
    BashObservation,
    CloseBashSessionResponse,
    CloseResponse,
    Command,
    CommandResponse,
    CreateBashSessionRequest,
    CreateBashSessionResponse,
    IsAliveResponse,
    ReadFileRequest,
    ReadFileResponse,
    UploadRequest,
    UploadResponse,
    WriteFileRequest,
    WriteFileResponse,
)

import warren
from warren.aio import AsyncClient, AsyncSandbox, AsyncSession

__all__ = ["WarrenDeployment", "WarrenDeploymentConfig", "WarrenRuntime"]

_SWEREX_PS1 = "SHELLPS1PREFIX"  # swerex.runtime.local.BashSession's PS1: its expect_string when a program ended


def _text(b: bytes, errors: str = "backslashreplace") -> str:
    return b.decode("utf-8", errors=errors)


class WarrenRuntime(AbstractRuntime):
    def __init__(self, sandbox: AsyncSandbox, *, logger: Optional[logging.Logger] = None):
        """A runtime driving `sandbox` (owned by the caller: close() ends the
        sessions, not the sandbox)."""
        self.sandbox = sandbox
        self._sessions: Dict[str, AsyncSession] = {}
        self._interactive: Set[str] = set()  # sessions whose interactive program runs
        self.logger = logger or logging.getLogger("rex-runtime")

    @property
    def sessions(self) -> Dict[str, AsyncSession]:
        return self._sessions

    async def is_alive(self, *, timeout: Optional[float] = None) -> IsAliveResponse:
        try:
            info = await self.sandbox.info()
        except warren.WarrenError as e:
            return IsAliveResponse(is_alive=False, message=str(e))
        if info.state != "running":
            return IsAliveResponse(is_alive=False, message=f"sandbox {self.sandbox.id} is {info.state}")
        return IsAliveResponse(is_alive=True)

    async def create_session(self, request: CreateBashSessionRequest) -> CreateBashSessionResponse:
        if request.session in self._sessions:
            raise SessionExistsError(f"session {request.session} already exists")
        if not isinstance(request, CreateBashSessionRequest):
            raise ValueError(f"unknown session type: {request!r}")
        s = await self.sandbox.session(pty=True)
        self._sessions[request.session] = s
        self._interactive.discard(request.session)
        output = []
        for src in request.startup_source:
            r = await s.run(f"source {shlex.quote(src)}", timeout=request.startup_timeout)
            output.append(_text(r.stdout))
        return CreateBashSessionResponse(output="".join(output))

    async def _check_syntax(self, command: str) -> None:
        r = await self.sandbox.exec(["bash", "-n"], stdin=command + "\n")
        if r.exit_code == 0:
            return
        stdout, stderr = _text(r.stdout), _text(r.stderr)
        msg = (f"Error (exit code {r.exit_code}) while checking bash command \n{command!r}\n"
               f"---- Stderr ----\n{stderr}\n---- Stdout ----\n{stdout}")
        raise BashIncorrectSyntaxError(msg, extra_info={"bash_stdout": stdout, "bash_stderr": stderr})

    async def run_in_session(self, action: BashAction | BashInterruptAction) -> BashObservation:
        s = self._sessions.get(action.session)
        if s is None:
            raise SessionDoesNotExistError(f"session {action.session!r} does not exist")
        if isinstance(action, BashInterruptAction):
            # A session command that timed out was interrupted already.
            return BashObservation(output="", exit_code=0)
        if action.is_interactive_command or action.is_interactive_quit:
            return await self._run_interactive(s, action)
        await self._check_syntax(action.command)
        r = await s.run(action.command, timeout=action.timeout)
        if r.timed_out:
            raise CommandTimeoutError(
                f"timeout after {action.timeout} seconds while running command {action.command!r}")
        output = _text(r.stdout).replace("\r\n", "\n")
        exit_code: Optional[int] = None if action.check == "ignore" else r.exit_code
        if action.check == "raise" and exit_code != 0:
            msg = f"Command {action.command!r} failed with exit code {exit_code}. Here is the output:\n{output!r}"
            if action.error_msg:
                msg = f"{action.error_msg}: {msg}"
            raise NonZeroExitCodeError(msg)
        return BashObservation(output=output, exit_code=exit_code)

    async def _run_interactive(self, s: Any, action: BashAction) -> BashObservation:
        """SWE-ReX's BashSession._run_interactive over the session's
        interactive mode (see the module's doc)."""
        from warren.process import EOF

        if action.session in self._interactive:
            await s.sendline(action.command)
        else:
            await s.start(action.command)
            self._interactive.add(action.session)
        try:
            i = await s.expect([*action.expect, EOF], timeout=action.timeout)
        except warren.DeadlineExceeded as e:
            raise CommandTimeoutError(
                f"timeout after {action.timeout} seconds while running command {action.command!r}") from e
        output = _text(s.before).replace("\r\n", "\n")
        if i == len(action.expect):  # the program ended: SWE-ReX saw its PS1
            self._interactive.discard(action.session)
            await s.wait(timeout=10)
            matched = _SWEREX_PS1
        else:
            matched = action.expect[i]
        if action.is_interactive_command:
            output = output.strip()
        return BashObservation(output=output, exit_code=0, expect_string=matched)

    async def close_session(self, request: Any) -> CloseBashSessionResponse:
        self._interactive.discard(request.session)
        s = self._sessions.pop(request.session, None)
        if s is None:
            raise SessionDoesNotExistError(f"session {request.session!r} does not exist")
        await s.close()
        return CloseBashSessionResponse()

    async def execute(self, command: Command) -> CommandResponse:
        cmd: Any = command.command
        if command.shell:
            cmd = cmd if isinstance(cmd, str) else shlex.join(cmd)
        else:
            cmd = [cmd] if isinstance(cmd, str) else list(cmd)
        r = await self.sandbox.exec(cmd, env=command.env, cwd=command.cwd, timeout=command.timeout,
                                    merge_stderr=command.merge_output_streams)
        if r.timed_out:
            raise CommandTimeoutError(f"Timeout ({command.timeout}s) exceeded while running command")
        resp = CommandResponse(stdout=_text(r.stdout), stderr=_text(r.stderr), exit_code=r.exit_code)
        if command.check and r.exit_code != 0:
            msg = (f"Command {command.command!r} failed with exit code {r.exit_code}. "
                   f"Stdout:\n{resp.stdout!r}\nStderr:\n{resp.stderr!r}")
            if command.error_msg:
                msg = f"{command.error_msg}: {msg}"
            raise NonZeroExitCodeError(msg)
        return resp

    async def read_file(self, request: ReadFileRequest) -> ReadFileResponse:
        try:
            data = await self.sandbox.files.read(request.path)
        except warren.NotFound as e:
            raise FileNotFoundError(2, "No such file or directory", request.path) from e
        return ReadFileResponse(content=data.decode(request.encoding or "utf-8", request.errors or "strict"))

    async def write_file(self, request: WriteFileRequest) -> WriteFileResponse:
        await self.sandbox.files.write(request.path, request.content, make_parents=True)
        return WriteFileResponse()

    async def upload(self, request: UploadRequest) -> UploadResponse:
        src = Path(request.source_path)
        if src.is_dir():
            await self.sandbox.files.upload_dir(str(src), request.target_path)
        else:
            with open(src, "rb") as f:
                await self.sandbox.files.write(request.target_path, f, mode=src.stat().st_mode & 0o7777,
                                               make_parents=True)
        return UploadResponse()

    async def close(self) -> CloseResponse:
        for s in list(self._sessions.values()):
            try:
                await s.close()
            except warren.WarrenError:
                pass
        self._sessions.clear()
        return CloseResponse()


class WarrenDeploymentConfig(BaseModel):
    """Configuration of a warren sandbox as a SWE-ReX deployment."""

    type: str = "warren"
    layers: List[str] = []
    """Layers of the sandbox, bottom first."""
    image: Optional[str] = None
    """An image of the node (Client.create(image=...)), below layers."""
    backend: str = "container"
    addr: Optional[str] = None
    """warrend address (default: WARREN_ADDR or the SDK's default socket)."""
    create: Dict[str, Any] = {}
    """More keyword arguments of Client.create (cpu, memory_mb, ttl_s, ...)."""

    model_config = ConfigDict(extra="forbid")

    def get_deployment(self) -> WarrenDeployment:
        return WarrenDeployment.from_config(self)


class WarrenDeployment(AbstractDeployment):
    def __init__(self, *, logger: Optional[logging.Logger] = None, sandbox_id: Optional[str] = None,
                 **kwargs: Any):
        """See WarrenDeploymentConfig. sandbox_id: use this existing sandbox
        (stop() then leaves it alive) instead of creating one."""
        self.logger = logger or logging.getLogger("rex-deploy")
        self._config = WarrenDeploymentConfig(**kwargs)
        self._hooks = CombinedDeploymentHook()
        self._sandbox_id = sandbox_id
        self._client: Optional[AsyncClient] = None
        self._sandbox: Optional[AsyncSandbox] = None
        self._runtime: Optional[WarrenRuntime] = None

    @classmethod
    def from_config(cls, config: WarrenDeploymentConfig) -> WarrenDeployment:
        return cls(**config.model_dump())

    def add_hook(self, hook: DeploymentHook) -> None:
        self._hooks.add_hook(hook)

    @property
    def sandbox(self) -> Optional[AsyncSandbox]:
        return self._sandbox

    async def is_alive(self, *, timeout: Optional[float] = None) -> IsAliveResponse:
        if self._runtime is None:
            raise DeploymentNotStartedError()
        return await self._runtime.is_alive(timeout=timeout)

    async def start(self) -> None:
        self._client = AsyncClient(self._config.addr)
        if self._sandbox_id:
            self._sandbox = await self._client.get(self._sandbox_id)
        else:
            self._hooks.on_custom_step("Starting warren sandbox")
            c = self._config
            self._sandbox = await self._client.create(c.backend, c.layers, image=c.image, **c.create)
            self.logger.info(f"Started warren sandbox {self._sandbox.id}")
        self._runtime = WarrenRuntime(self._sandbox, logger=self.logger)

    async def stop(self) -> None:
        if self._runtime is not None:
            await self._runtime.close()
            self._runtime = None
        if self._sandbox is not None and not self._sandbox_id:
            try:
                await self._sandbox.destroy()
            except warren.NotFound:
                pass
        self._sandbox = None
        if self._client is not None:
            await self._client.close()
            self._client = None

    @property
    def runtime(self) -> WarrenRuntime:
        if self._runtime is None:
            raise DeploymentNotStartedError()
        return self._runtime
