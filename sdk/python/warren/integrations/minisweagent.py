"""mini-swe-agent ``Environment`` on warren (mini-swe-agent 2.x).

Mirrors minisweagent.environments.docker.DockerEnvironment: every action is
run on its own by ``interpreter`` (``bash -lc`` by default) in the sandbox
with stderr merged into stdout in order, and ``execute`` returns
``{"output", "returncode", "exception_info"}``. Output whose first line is
``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` (exit 0) raises ``Submitted``,
as the harness's own environments do.

Use from a config: ``environment: {environment_class:
warren.integrations.minisweagent.WarrenEnvironment, layers: [...]}``.
"""

from __future__ import annotations

import logging
import os
import platform
from typing import Any, Dict, List, Optional

from minisweagent.exceptions import Submitted
from minisweagent.utils.serialize import recursive_merge
from pydantic import BaseModel

import warren

SUBMIT_LINE = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class WarrenEnvironmentConfig(BaseModel):
    layers: List[str] = []
    """Layers of a new sandbox, bottom first (ignored when a sandbox is passed)."""
    backend: str = "container"
    addr: Optional[str] = None
    """warrend address (default: WARREN_ADDR or the SDK's default socket)."""
    create: Dict[str, Any] = {}
    """More keyword arguments of Client.create (cpu, memory_mb, network, ...)."""
    cwd: str = "/"
    """Working directory of actions."""
    env: Dict[str, str] = {}
    forward_env: List[str] = []
    """Host variables passed through when set (env wins on conflict)."""
    timeout: int = 30
    """Seconds per action; the action's whole process tree is killed on expiry."""
    interpreter: List[str] = ["bash", "-lc"]


class WarrenEnvironment:
    def __init__(self, *, config_class: type = WarrenEnvironmentConfig, logger: Optional[logging.Logger] = None,
                 sandbox: Optional[warren.Sandbox] = None, client: Optional[warren.Client] = None, **kwargs: Any):
        """See WarrenEnvironmentConfig. sandbox: run in this sandbox (not
        destroyed by cleanup) instead of creating one from layers."""
        self.logger = logger or logging.getLogger("minisweagent.environment")
        self.config = config_class(**kwargs)
        self._own_client = client is None and sandbox is None
        self.client = client or (None if sandbox is not None else warren.Client(self.config.addr))
        self._own_sandbox = sandbox is None
        if sandbox is None:
            assert self.client is not None
            sandbox = self.client.create(self.config.backend, self.config.layers, **self.config.create)
            self.logger.info(f"Started warren sandbox {sandbox.id}")
        self.sandbox: Optional[warren.Sandbox] = sandbox

    def execute(self, action: Dict[str, Any], cwd: str = "", *, timeout: Optional[int] = None) -> Dict[str, Any]:
        """Runs action["command"]; a timeout or a failed call is returncode -1
        with exception_info (the output so far kept), as the harness expects."""
        command = action.get("command", "")
        cwd = cwd or self.config.cwd
        assert self.sandbox is not None, "sandbox already cleaned up"
        env = {k: v for k in self.config.forward_env if (v := os.getenv(k)) is not None}
        env.update(self.config.env)
        limit = timeout or self.config.timeout
        try:
            r = self.sandbox.exec([*self.config.interpreter, command], cwd=cwd, env=env, timeout=limit,
                                  merge_stderr=True)
            text = r.stdout.decode("utf-8", errors="replace")
            if r.timed_out:
                output = {
                    "output": text,
                    "returncode": -1,
                    "exception_info": f"An error occurred while executing the command: "
                                      f"Command '{command}' timed out after {limit} seconds",
                    "extra": {"exception_type": "TimeoutExpired",
                              "exception": f"Command '{command}' timed out after {limit} seconds"},
                }
            else:
                output = {"output": text, "returncode": r.exit_code, "exception_info": ""}
        except warren.WarrenError as e:
            output = {
                "output": "",
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {e}",
                "extra": {"exception_type": type(e).__name__, "exception": str(e)},
            }
        self._check_finished(output)
        return output

    def _check_finished(self, output: Dict[str, Any]) -> None:
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_LINE and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted({
                "role": "exit",
                "content": submission,
                "extra": {"exit_status": "Submitted", "submission": submission},
            })

    def get_template_vars(self, **kwargs: Any) -> Dict[str, Any]:
        return recursive_merge(self.config.model_dump(), platform.uname()._asdict(), kwargs)

    def serialize(self) -> Dict[str, Any]:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
                }
            }
        }

    def cleanup(self) -> None:
        """Destroys the sandbox this environment created (idempotent)."""
        sb, self.sandbox = getattr(self, "sandbox", None), None
        if sb is not None and self._own_sandbox:
            try:
                sb.destroy()
            except warren.NotFound:
                pass
        if getattr(self, "_own_client", False) and self.client is not None:
            self.client.close()
            self.client = None

    def __del__(self) -> None:
        try:
            self.cleanup()
        except Exception:  # interpreter shutdown: the daemon reaps by TTL
            pass
