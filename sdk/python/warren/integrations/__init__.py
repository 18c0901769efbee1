"""Providers that plug warren into RL/agent harnesses, each implementing the
harness's own published interface (install the harness with the matching
extra, e.g. ``pip install 'warren[minisweagent]'``):

* ``warren.integrations.minisweagent.WarrenEnvironment``: mini-swe-agent's
  ``Environment`` (``environment_class:
  warren.integrations.minisweagent.WarrenEnvironment``).
* ``warren.integrations.swerex``: a SWE-ReX deployment and runtime backed by
  warren sandboxes and sessions (no server inside the sandbox).

A module imports its harness lazily, so importing this package needs none.
"""
