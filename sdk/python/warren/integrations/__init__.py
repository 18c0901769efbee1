"""Providers that plug warren into RL/agent harnesses, each implementing the
harness's own published interface (install the harness with the matching
extra, e.g. ``pip install 'warren[minisweagent]'``):

* ``warren.integrations.minisweagent.WarrenEnvironment``: mini-swe-agent's
  ``Environment`` (``environment_class:
  warren.integrations.minisweagent.WarrenEnvironment``).
* ``warren.integrations.swerex``: a SWE-ReX deployment and runtime backed by
  warren sandboxes and sessions (no server inside the sandbox).
* ``warren.integrations.harbor.WarrenEnvironment``: Harbor's
  ``BaseEnvironment`` (``harbor run --env
  warren.integrations.harbor:WarrenEnvironment``); Python >= 3.12.
* ``warren.integrations.nemogym.WarrenProvider``: NeMo-Gym's
  ``SandboxProvider`` with pause/resume, endpoints and connect (entry point
  ``warren`` of ``nemo_gym.sandbox_providers``); Python >= 3.12.

A module imports its harness lazily, so importing this package needs none.
"""
