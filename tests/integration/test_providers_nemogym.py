"""NeMo-Gym on warren: the real nemo-gym package (pinned, in the harness
venv) drives warren.integrations.nemogym.WarrenProvider through its own
sandbox API (nemo_gym.sandbox.AsyncSandbox, provider found through its
registry by the SDK's entry point): the SandboxProvider protocol's methods
with its signatures, create from a SandboxSpec (env, workdir, files,
metadata, resources, ttl), exec (cwd/env/user, the timeout and sandbox-error
sentinels), pause/resume in both modes keeping a file and a running
process, uploads and downloads, snapshot -> a new sandbox from the
snapshot_id, serialize/connect, refusals, and nothing left behind
(harness_drivers/nemogym_provider.py)."""

import json
from pathlib import Path

import pytest

from harness_venv import NEMOGYM_PIN, harness_python, run, tail

DRIVER = Path(__file__).resolve().parent / "harness_drivers" / "nemogym_provider.py"


@pytest.mark.timeout(900)
def test_provider_lifecycle_pause_snapshot(daemon, client, base_layer, tmp_path):
    py = harness_python(NEMOGYM_PIN)
    r = run(py, [str(DRIVER), "unix:" + str(daemon.socket), base_layer, str(tmp_path)], timeout=600)
    assert r.returncode == 0, f"driver failed:\n{tail(r.stdout)}\n{tail(r.stderr)}"
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"ok": True}
    for sb in client.list():
        assert "rollout" not in sb.cached_info().labels, f"sandbox {sb.id} leaked"
