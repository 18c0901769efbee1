"""A harness built for E2B, unchanged, on warren's E2B front end: Harbor's own
`e2b` environment (harbor.environments.e2b, on the real `e2b` SDK; pinned,
in the harness venv: Harbor needs Python >= 3.12) pointed at warrend's
--e2b-listen with only the SDK's documented variables (E2B_API_URL,
E2B_SANDBOX_URL, E2B_API_KEY) and Harbor's documented option for an
existing template (prebuilt_template_id, a `namespace/name:tag` reference
that the --e2b-templates mapping resolves).

  * `harbor run --env e2b` runs local tasks end to end with its oracle
    agent: the task's environment/ uploaded to its workdir, the solution
    run, the verifier's reward read back (1 for a right oracle, 0 for a
    wrong one: the verifier is not vacuous), every sandbox gone after.
  * A driver (harness_drivers/harbor_e2b.py) takes the environment through
    scripted steps: exit codes, stdout/stderr, cwd, env, user, a timeout
    that kills the command, output byte for byte, files and directories
    both ways, lease renewal (set_timeout), stop (kill).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from conftest import NODE_PREFIX, Daemon, assert_back_to_baseline, host_snapshot
from harness_venv import HARBOR_E2B_PINS, harness_python, run, tail, write_file

DRIVERS = Path(__file__).resolve().parent / "harness_drivers"
API_KEY = "e2b_harbor_test_key_0123456789"
# Harbor launches this reference; the mapping has it under "debian:bookworm"
# (a key without a namespace answers every namespace).
TEMPLATE_REF = "warren-test/debian:bookworm"
TEMPLATE_KEY = "debian:bookworm"


@pytest.fixture(scope="module")
def harbor_py() -> str:
    return harness_python(*HARBOR_E2B_PINS)


@pytest.fixture(scope="module")
def e2b_daemon(test_root: Path, layer_store: Path, base_layer: str) -> Iterable[Daemon]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    keys = test_root / "e2b-harbor-keys"
    keys.write_text(API_KEY + "\n")
    templates = test_root / "e2b-harbor-templates.json"
    templates.write_text(json.dumps({TEMPLATE_KEY: [base_layer]}))
    d = Daemon(test_root, "e2b-harbor", layer_store, NODE_PREFIX + "h",
               extra_args=["--e2b-listen", f"127.0.0.1:{port}", "--e2b-api-keys", str(keys),
                           "--e2b-templates", str(templates)]).start()
    d.e2b_url = f"http://127.0.0.1:{port}"
    baseline = host_snapshot([d])
    yield d
    try:
        assert_back_to_baseline([d], baseline, clients=[d.client])  # nothing of Harbor's sandboxes left
    finally:
        assert d.stop() == 0, d.log_tail()


def _e2b_env(d: Daemon) -> dict:
    # E2B_DEBUG unset: debug mode would skip the API for a local envd.
    return {"E2B_API_URL": d.e2b_url, "E2B_SANDBOX_URL": d.e2b_url, "E2B_API_KEY": API_KEY, "E2B_DEBUG": "",
            "NO_COLOR": "1"}


def _e2b_sandboxes(d: Daemon) -> list:
    return [s.id for s in d.client.list() if "e2b.template" in s.cached_info().labels]


TASK_TOML = """schema_version = "1.4"
[verifier]
timeout_sec = 120.0
[agent]
timeout_sec = 120.0
[environment]
network_mode = "no-network"
workdir = "/opt"
"""


def make_tasks(root: Path) -> None:
    # The environment/ of a task on a prebuilt template lands in its workdir
    # (one the template has: E2B's envd refuses a cwd that does not exist).
    t = root / "seeded"
    write_file(t / "task.toml", TASK_TOML)
    write_file(t / "instruction.md", "Copy seed.txt to out.txt, upper-cased.\n")
    write_file(t / "environment" / "seed.txt", "seed\n")
    write_file(t / "solution" / "solve.sh", """#!/bin/bash
set -e
tr a-z A-Z < seed.txt > out.txt
echo "solved in $(pwd) as $(id -un)"
""", 0o755)
    write_file(t / "tests" / "test.sh", """#!/bin/bash
if [ "$(cat /opt/out.txt)" = SEED ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
echo "verified in $(pwd)"
""", 0o755)
    # A wrong oracle: the verifier gives 0.
    t = root / "wrong"
    write_file(t / "task.toml", TASK_TOML)
    write_file(t / "instruction.md", "Write 42 to answer.txt.\n")
    write_file(t / "environment" / "README", "nothing here\n")
    write_file(t / "solution" / "solve.sh", "#!/bin/bash\necho 41 > answer.txt\nexit 0\n", 0o755)
    write_file(t / "tests" / "test.sh", """#!/bin/bash
if [ "$(cat /opt/answer.txt)" = 42 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
""", 0o755)


def _reward(res: dict):
    return ((res.get("verifier_result") or {}).get("rewards") or {}).get("reward")


@pytest.mark.timeout(900)
def test_harbor_run_on_the_e2b_front_end(harbor_py: str, e2b_daemon: Daemon, tmp_path: Path) -> None:
    tasks, jobs = tmp_path / "tasks", tmp_path / "jobs"
    make_tasks(tasks)
    jobs.mkdir()
    args = ["-m", "harbor.cli.main", "run", "-p", str(tasks), "-a", "oracle", "--env", "e2b",
            "--ek", f"prebuilt_template_id={TEMPLATE_REF}", "-o", str(jobs), "--job-name", "e2b", "-n", "2", "-y"]
    t0 = time.monotonic()
    r = run(harbor_py, args, timeout=840, env=_e2b_env(e2b_daemon), cwd=jobs)
    results = {}
    for f in sorted((jobs / "e2b").glob("*/result.json")):
        res = json.loads(f.read_text())
        results[res["task_name"]] = res
    print(f"harbor run --env e2b: {time.monotonic() - t0:.1f} s, exit {r.returncode}, trials {sorted(results)}")
    assert set(results) == {"seeded", "wrong"}, \
        f"trials {sorted(results)} (exit {r.returncode}):\n{tail(r.stdout)}\n{tail(r.stderr)}"
    for name, want in (("seeded", 1), ("wrong", 0)):
        res = results[name]
        diag = json.dumps(res.get("exception_info"), indent=1)[:4000]
        assert res["exception_info"] is None, f"{name}: {diag}"
        assert _reward(res) == want, f"{name}: reward {_reward(res)}, exception {diag}"
    oracle_log = next((jobs / "e2b").glob("seeded__*/agent/oracle.txt")).read_text()
    assert "solved in /opt as root" in oracle_log, oracle_log
    # Every sandbox of the job was killed by Harbor's stop().
    assert _e2b_sandboxes(e2b_daemon) == []


@pytest.mark.timeout(600)
def test_harbor_e2b_environment_steps(harbor_py: str, e2b_daemon: Daemon, tmp_path: Path) -> None:
    r = run(harbor_py, [str(DRIVERS / "harbor_e2b.py"), TEMPLATE_REF, TEMPLATE_KEY, str(tmp_path)], timeout=540,
            env=_e2b_env(e2b_daemon))
    assert r.returncode == 0, f"driver failed:\n{tail(r.stdout)}\n{tail(r.stderr)}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["ok"] is True and out["sandbox"]
    # Its sandbox is gone (Harbor's stop killed it); nothing else is left.
    assert _e2b_sandboxes(e2b_daemon) == []
