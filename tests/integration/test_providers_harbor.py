"""Harbor on warren: the real harbor package (pinned, in the harness venv:
Harbor needs Python >= 3.12) runs small local tasks end to end with its
oracle agent through `harbor run --env warren.integrations.harbor:WarrenEnvironment`:
a task whose environment/Dockerfile is built in a warren sandbox (ARG, ENV,
WORKDIR, COPY --chmod, RUN in both forms, a USER the oracle and the verifier
then run as), a task on a prebuilt docker_image mapped to warren layers with
its environment/ uploaded to the workdir, and a task whose oracle is wrong
(reward 0: the verifier is not vacuous). A second run of the Dockerfile task
starts from the layer the first build left (no build sandbox). And the
environment's own surface (exec cwd/env/user/timeout, output callbacks,
files and directories both ways, network phases, refusals) through a driver
(harness_drivers/harbor_env.py)."""

import json
import time
from pathlib import Path

import pytest

import warren

from harness_venv import HARBOR_PIN, harness_python, run, tail, write_file

DRIVERS = Path(__file__).resolve().parent / "harness_drivers"
ENV_CLASS = "warren.integrations.harbor:WarrenEnvironment"
FROM = "debian:bookworm-slim"


@pytest.fixture(scope="module")
def harbor_py():
    return harness_python(HARBOR_PIN)


TASK_TOML = """schema_version = "1.4"
[verifier]
timeout_sec = 120.0
[agent]
timeout_sec = 120.0
[environment]
build_timeout_sec = 300.0
network_mode = "no-network"
{extra}
"""


def make_tasks(root: Path) -> None:
    # 1. Built from a Dockerfile.
    t = root / "built"
    write_file(t / "task.toml", TASK_TOML.format(extra=""))
    write_file(t / "instruction.md", "Write the tool's answer for data/input.txt to /app/answer.txt.\n")
    write_file(t / "environment" / "Dockerfile", f"""# a small single-stage build
ARG BASE={FROM}
FROM ${{BASE}}
ARG GREETING=hello
ENV APP_GREETING=${{GREETING}}-world \\
    LANG=C.UTF-8
WORKDIR /app
COPY data/ /app/data/
COPY --chmod=755 bin/tool.sh /usr/local/bin/tool
RUN useradd -m -u 1500 agent && chown -R agent /app \\
    && echo "built by $(id -un) with $APP_GREETING" > /app/built.txt
RUN ["/bin/sh", "-c", "echo exec-form >> /app/built.txt"]
USER agent
CMD ["sleep", "infinity"]
""")
    write_file(t / "environment" / "data" / "input.txt", "21\n")
    write_file(t / "environment" / "bin" / "tool.sh", "#!/bin/sh\necho $(( $1 * 2 ))\n", 0o644)
    write_file(t / "solution" / "solve.sh", """#!/bin/bash
set -e
tool "$(cat /app/data/input.txt)" > /app/answer.txt
echo "solved as $(id -un) in $(pwd) greeting=$APP_GREETING"
""", 0o755)
    write_file(t / "tests" / "test.sh", """#!/bin/bash
ok=1
[ "$(cat /app/answer.txt)" = 42 ] || ok=0
[ "$(stat -c %U /app/answer.txt)" = agent ] || ok=0
[ "$(cat /app/built.txt)" = "$(printf 'built by root with hello-world\\nexec-form')" ] || ok=0
[ "$APP_GREETING" = hello-world ] || ok=0
echo "verifier ok=$ok as $(id -un)"
echo $ok > /logs/verifier/reward.txt
""", 0o755)

    # 2. A prebuilt docker_image mapped to warren layers; environment/ lands in the workdir.
    t = root / "prebuilt"
    write_file(t / "task.toml", TASK_TOML.format(extra='docker_image = "warren-test/plain:1"\nworkdir = "/srv/task"'))
    write_file(t / "instruction.md", "Copy seed.txt to out.txt, upper-cased.\n")
    write_file(t / "environment" / "seed.txt", "seed\n")
    write_file(t / "solution" / "solve.sh", "#!/bin/bash\ntr a-z A-Z < seed.txt > out.txt\n", 0o755)
    write_file(t / "tests" / "test.sh", """#!/bin/bash
if [ "$(cat /srv/task/out.txt)" = SEED ] && [ "$(pwd)" = /srv/task ]; then echo 1; else echo 0; fi \\
  > /logs/verifier/reward.txt
""", 0o755)

    # 3. A wrong oracle: the verifier must give 0.
    t = root / "wrong"
    write_file(t / "task.toml", TASK_TOML.format(extra=""))
    write_file(t / "instruction.md", "Write 42 to /tmp/answer.\n")
    write_file(t / "environment" / "Dockerfile", f"FROM {FROM}\nWORKDIR /tmp\n")
    write_file(t / "solution" / "solve.sh", "#!/bin/bash\necho 41 > /tmp/answer\n", 0o755)
    write_file(t / "tests" / "test.sh", """#!/bin/bash
if [ "$(cat /tmp/answer)" = 42 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
""", 0o755)


def harbor_run(py: str, path: Path, jobs: Path, name: str, addr: str, base: str) -> dict:
    images = json.dumps({FROM: [base], "warren-test/plain:1": [base]})
    args = ["-m", "harbor.cli.main", "run", "-p", str(path), "-a", "oracle", "--env", ENV_CLASS,
            "--ek", f"addr={addr}", "--ek", f"images={images}", "-o", str(jobs), "--job-name", name,
            "-n", "2", "-y"]
    t0 = time.monotonic()
    r = run(py, args, timeout=900, env={"NO_COLOR": "1"}, cwd=jobs)
    elapsed = time.monotonic() - t0
    results = {}
    for f in sorted((jobs / name).glob("*/result.json")):
        res = json.loads(f.read_text())
        results[res["task_name"]] = res
    print(f"harbor run {name}: {elapsed:.1f} s, exit {r.returncode}, trials {sorted(results)}")
    assert results, f"harbor run wrote no trial results (exit {r.returncode}):\n{tail(r.stdout)}\n{tail(r.stderr)}"
    return {"results": results, "elapsed": elapsed, "proc": r}


def _reward(res: dict):
    vr = res.get("verifier_result") or {}
    return (vr.get("rewards") or {}).get("reward")


def _diag(res: dict) -> str:
    return json.dumps(res.get("exception_info"), indent=1)[:4000]


@pytest.mark.timeout(1800)
def test_oracle_tasks_end_to_end(harbor_py, daemon, client, base_layer, tmp_path):
    tasks = tmp_path / "tasks"
    make_tasks(tasks)
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    addr = "unix:" + str(daemon.socket)

    first = harbor_run(harbor_py, tasks, jobs, "first", addr, base_layer)
    res = first["results"]
    assert set(res) == {"built", "prebuilt", "wrong"}, res.keys()
    for name, want in (("built", 1), ("prebuilt", 1), ("wrong", 0)):
        assert _reward(res[name]) == want, f"{name}: reward {_reward(res[name])}, exception {_diag(res[name])}"
        assert res[name]["exception_info"] is None, f"{name}: {_diag(res[name])}"
    oracle_log = next((jobs / "first").glob("built__*/agent/oracle.txt")).read_text()
    assert "solved as agent in /app greeting=hello-world" in oracle_log, oracle_log

    # Every sandbox of the job (trials and builds) is gone; the build left its layer.
    assert [s.id for s in client.list() if "harbor.session" in s.cached_info().labels] == []
    built = [ly.name for ly in client.layers.list() if ly.name.startswith("workspace/harbor-")]
    assert len(built) == 2, built  # "built" and "wrong": two environments

    # Again: the Dockerfile task starts from its layer, without a build sandbox.
    again = harbor_run(harbor_py, tasks / "built", jobs, "again", addr, base_layer)
    (only,) = again["results"].values()
    assert _reward(only) == 1, _diag(only)
    setup = only["environment_setup"]
    print(f"environment_setup, cached build: {setup}")
    assert sorted(ly.name for ly in client.layers.list() if ly.name.startswith("workspace/harbor-")) == sorted(built)
    assert [s.id for s in client.list() if "harbor.session" in s.cached_info().labels] == []


@pytest.mark.timeout(600)
def test_environment_surface(harbor_py, daemon, client, base_layer, tmp_path):
    r = run(harbor_py, [str(DRIVERS / "harbor_env.py"), "unix:" + str(daemon.socket), base_layer, str(tmp_path)],
            timeout=540)
    assert r.returncode == 0, f"driver failed:\n{tail(r.stdout)}\n{tail(r.stderr)}"
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"ok": True}
    for sb in client.list():
        assert "harbor.session" not in sb.cached_info().labels, f"sandbox {sb.id} leaked"
    with pytest.raises(warren.NotFound):
        client.layers.get("workspace/harbor-none@1")
