"""warren eval (issue 3, the main job) against a real warrend: SWE-style
rollouts on the real more-itertools code base and test suite, through the
`warren eval` CLI and through the Python API (warren.eval). Each rollout's
pass/fail must equal its task's expected one; the report carries the
documented fields (docs/eval-format.md); nothing is left behind.

The layers are built here from the rootfs dirs scripts/setup.sh makes; the
tests skip (with the reason) only when those dirs are absent.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import warren
from warren import eval as we

from conftest import CLI, REPO, assert_back_to_baseline

ROOTFS = Path(os.environ.get("WARREN_ROOTFS_DIR", "/var/cache/warren/rootfs"))
TOOLSET = ("toolset/python@1", ROOTFS / "toolset-python")
WORKSPACE = ("workspace/more-itertools@10.1.0", ROOTFS / "workspace-more-itertools-10.1.0")
TASKS = REPO / "eval/tasks/more-itertools"


@pytest.fixture(scope="module")
def eval_layers(client: warren.Client, base_layer: str) -> None:
    for name, d in (TOOLSET, WORKSPACE):
        marker = d.parent / (d.name + ".complete")
        if not marker.exists():
            pytest.skip(f"{d} is not built (scripts/setup.sh builds it): cannot build {name}")
        try:
            client.layers.get(name)
        except warren.NotFound:
            client.layers.build(name, dir=str(d), timeout=900)


@pytest.fixture(scope="module")
def tasks() -> list:
    return we.load_tasks(TASKS)


def _pick(tasks, n_bugs: int) -> list:
    """The fix task and the failing task of the first n_bugs bugs."""
    stems = []
    for t in tasks:
        stem = t.id.rsplit("-", 1)[0]
        if stem not in stems:
            stems.append(stem)
    keep = set(stems[:n_bugs])
    return [t for t in tasks if t.id.rsplit("-", 1)[0] in keep]


def _check_report(rep: dict, n: int, concurrency: int) -> None:
    for k in ("run_id", "n", "concurrency", "grade", "tasks", "wall_s", "throughput_rollouts_per_s",
              "passed", "failed", "errors", "pass_rate", "correct", "incorrect", "correct_rate",
              "latency_ms", "memory", "per_task", "rollouts"):
        assert k in rep, k
    assert (rep["n"], rep["concurrency"]) == (n, concurrency)
    assert rep["errors"] == 0 and rep["incorrect"] == 0 and rep["correct"] == n
    assert rep["passed"] + rep["failed"] == n
    assert rep["throughput_rollouts_per_s"] > 0 and rep["wall_s"] > 0
    for k in ("create", "exec", "grade", "destroy", "rollout"):
        lat = rep["latency_ms"][k]
        assert lat["n"] > 0 and 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"], (k, lat)
    assert rep["latency_ms"]["create"]["n"] == n
    # Every exec of every rollout: setup (2) + the trajectory's + grading.
    assert rep["latency_ms"]["exec"]["n"] >= n * 6
    assert rep["memory"]["host_used_peak_bytes"] >= rep["memory"]["host_used_start_bytes"] > 0
    assert len(rep["rollouts"]) == n
    assert sorted(r["index"] for r in rep["rollouts"]) == list(range(n))
    for r in rep["rollouts"]:
        assert r["outcome"] == r["expected"] and r["correct"], r
        assert r["sandbox"] and r["grade_exit"] is not None
        assert (r["grade_exit"] == 0) == (r["expected"] == "pass"), r
        assert r["create_ms"] > 0 and r["rollout_ms"] >= r["create_ms"]
    runs = sum(pt["runs"] for pt in rep["per_task"].values())
    assert runs == n


@pytest.mark.timeout(900)
def test_eval_cli_runs_rollouts_with_expected_outcomes(daemon, client, eval_layers, tasks, baseline,
                                                      tmp_path):
    picked = _pick(tasks, 4)  # 8 tasks: 4 fixes (pass), 4 without a fix (fail)
    regex = "^(" + "|".join(t.id for t in picked) + ")$"
    n, c = 12, 4  # tasks cycled: some run twice
    report = tmp_path / "report.json"
    env = dict(os.environ, WARREN_PYTHON=sys.executable, WARREN_ADDR=f"unix:{daemon.socket}")
    p = subprocess.run([str(CLI), "eval", "--tasks", str(TASKS), "--task", regex, "-n", str(n),
                        "-c", str(c), "--report", str(report)],
                       env=env, capture_output=True, text=True, timeout=800)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"correct:     {n}/{n}" in p.stdout, p.stdout
    assert "rollouts/s" in p.stdout and "p99" in p.stdout
    assert f"{n}/{n}" in p.stderr  # the progress bar reached the end
    rep = json.loads(report.read_text())
    _check_report(rep, n, c)
    assert {r["task"] for r in rep["rollouts"]} == {t.id for t in picked}
    assert rep["passed"] == sum(1 for i in range(n) if picked[i % len(picked)].expected == "pass")
    assert client.list() == []
    assert_back_to_baseline([daemon], baseline, clients=[client])


@pytest.mark.timeout(900)
def test_eval_python_api_and_wrong_expectations(daemon, client, eval_layers, tasks, baseline):
    picked = _pick(tasks[8:], 3)  # other bugs than the CLI test's
    rep = we.run(client, picked, n=len(picked), concurrency=3)
    assert rep.all_correct, [r for r in rep.rollouts if not r.correct]
    _check_report(rep.to_json(), len(picked), 3)
    assert {r.outcome for r in rep.rollouts} == {"pass", "fail"}

    # A task whose expectation is wrong is reported as incorrect, and a
    # trajectory whose patch does not apply is an error, not a failure.
    fix = next(t for t in picked if t.expected == "pass")
    flipped = dataclasses.replace(fix, id="flipped", expected="fail")
    bad_patch = we.Trajectory("bad", fix.trajectory.turns[:1] + (
        we.Turn("patch", patch="--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n"),))
    broken = dataclasses.replace(fix, id="broken", trajectory=bad_patch)
    rep2 = we.run(client, [flipped, broken], n=2, concurrency=2)
    by = {r.task: r for r in rep2.rollouts}
    assert by["flipped"].outcome == "pass" and not by["flipped"].correct
    assert "passed" in by["flipped"].output_tail
    assert by["broken"].outcome == "error" and "exited" in by["broken"].error
    assert not rep2.all_correct
    assert rep2.summary["incorrect"] == 2 and rep2.summary["errors"] == 1
    assert client.list() == []
    assert_back_to_baseline([daemon], baseline, clients=[client])


@pytest.mark.timeout(600)
def test_eval_isolated_grading_takes_only_the_solution(daemon, client, eval_layers, tasks, baseline):
    """An agent that rewrites the tests to pass "passes" with exec grading but
    fails with isolated grading, where only its changes under the task's
    solution paths reach the grader (the tests come from the layers)."""
    nofix = next(t for t in tasks if t.id.endswith("-nofix"))
    test_file, cls = nofix.tests[0].split("::")
    cheat = we.Trajectory("cheat", nofix.trajectory.turns + (
        we.Turn("write", path=test_file, content=(
            f"from unittest import TestCase\n\n\nclass {cls}(TestCase):\n"
            f"    def test_ok(self):\n        pass\n").encode()),))
    task = dataclasses.replace(nofix, id="cheat", trajectory=cheat)
    exec_rep = we.run(client, [task], n=1, grade="exec")
    assert exec_rep.rollouts[0].outcome == "pass"
    iso_rep = we.run(client, [task], n=1, grade="isolated")
    assert iso_rep.rollouts[0].outcome == "fail", iso_rep.rollouts[0]
    assert iso_rep.rollouts[0].correct  # expected: fail
    assert client.list() == []
    assert_back_to_baseline([daemon], baseline, clients=[client])


@pytest.mark.timeout(300)
def test_eval_cli_exit_codes(daemon, client, eval_layers, tmp_path):
    env = dict(os.environ, WARREN_PYTHON=sys.executable, WARREN_ADDR=f"unix:{daemon.socket}")
    (tmp_path / "tasks.jsonl").write_text('{"id": "x"}\n')
    p = subprocess.run([str(CLI), "eval", "--tasks", str(tmp_path)], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "tasks.jsonl:1" in p.stderr, p.stderr
    p = subprocess.run([str(CLI), "eval", "--tasks", str(TASKS), "--task", "^nothing$"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no task id matches" in p.stderr
    # A missing layer is reported before any rollout starts.
    (tmp_path / "tasks.jsonl").write_text(json.dumps({
        "id": "x", "layers": ["base/none@9"], "repo": "/w", "tests": ["t"], "expected": "pass",
        "trajectory": {"turns": []}}) + "\n")
    p = subprocess.run([str(CLI), "eval", "--tasks", str(tmp_path), "--no-progress"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "NOT_FOUND" in p.stderr and "base/none@9" in p.stderr, p.stderr
    # A rollout whose outcome differs from the expected one: exit 1, flagged.
    line = next(l for l in (TASKS / "tasks.jsonl").read_text().splitlines() if "-nofix" in l)
    task = json.loads(line)
    task["expected"] = "pass"
    (tmp_path / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    p = subprocess.run([str(CLI), "eval", "--tasks", str(tmp_path), "--trajectories",
                        str(TASKS / "trajectories.jsonl"), "--no-progress"], env=env,
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "<-- WRONG" in p.stdout and "correct:     0/1" in p.stdout, p.stdout
    assert client.list() == []
