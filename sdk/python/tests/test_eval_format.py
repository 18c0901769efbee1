"""Unit tests of warren.eval's file formats and statistics (no daemon):
docs/eval-format.md is the contract."""

import json

import pytest

from warren import eval as we


def _write(path, objs):
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))


TASK = {"id": "t1", "layers": ["base/x@1"], "repo": "/w/r", "tests": ["tests/a.py::A"],
        "expected": "pass", "trajectory": "tr1"}
TRAJ = {"id": "tr1", "turns": [
    {"type": "exec", "cmd": "ls", "expect_exit": 0},
    {"type": "write", "path": "a.txt", "content": "hé"},
    {"type": "write", "path": "/tmp/b", "content_b64": "AAE="},
    {"type": "read", "path": "a.txt"},
    {"type": "patch", "patch": "diff --git a/x b/x\n", "tool": "patch"},
]}


def test_loads_tasks_and_trajectories_from_a_dir(tmp_path):
    _write(tmp_path / "tasks.jsonl", ["# comment", "", TASK])
    _write(tmp_path / "trajectories.jsonl", [TRAJ])
    (t,) = we.load_tasks(tmp_path)
    assert (t.id, t.layers, t.repo, t.tests, t.expected) == (
        "t1", ("base/x@1",), "/w/r", ("tests/a.py::A",), "pass")
    assert t.timeout_s == 120 and t.setup == () and t.protected == () and t.solution == ()
    turns = t.trajectory.turns
    assert [x.type for x in turns] == ["exec", "write", "write", "read", "patch"]
    assert turns[0].expect_exit == 0 and turns[0].cmd == "ls"
    assert turns[1].content == "hé".encode() and turns[2].content == b"\x00\x01"
    assert turns[4].tool == "patch" and turns[4].expect_exit == 0  # patches must apply
    assert t.grade_command() == "python3 -m pytest -q -p no:cacheprovider tests/a.py::A"


def test_grade_command_quotes_tests(tmp_path):
    task = dict(TASK, tests=["a b", "c;rm"], test_command="run {tests} --x",
                trajectory={"turns": []})
    _write(tmp_path / "t.jsonl", [task])
    (t,) = we.load_tasks(tmp_path / "t.jsonl")
    assert t.grade_command() == "run 'a b' 'c;rm' --x"


@pytest.mark.parametrize("task,msg", [
    (dict(TASK, extra=1), "unknown task field"),
    (dict(TASK, expected="maybe"), "expected must be"),
    (dict(TASK, repo="w/r"), "repo must be an absolute path"),
    (dict(TASK, solution="/w/r/pkg"), "solution must be a list"),
    (dict(TASK, solution=["pkg"]), "solution paths must be absolute"),
    (dict(TASK, layers=[]), "layers must be a non-empty list"),
    (dict(TASK, trajectory="nope"), "trajectory 'nope' not in"),
    (dict(TASK, test_command="pytest"), "{tests}"),
    (dict(TASK, timeout_s=0), "timeout_s"),
    (dict(TASK, trajectory={"turns": [{"type": "rm"}]}), "turn type must be one of"),
    (dict(TASK, trajectory={"turns": [{"type": "write", "path": "a"}]}), "exactly one of content"),
    (dict(TASK, trajectory={"turns": [{"type": "patch", "patch": "x", "tool": "svn"}]}), "patch tool"),
    (dict(TASK, trajectory={"turns": [{"type": "exec", "cmd": ""}]}), "non-empty string 'cmd'"),
])
def test_format_errors_name_the_line(tmp_path, task, msg):
    _write(tmp_path / "tasks.jsonl", [TASK, task if task["id"] != "t1" else dict(task, id="t2")])
    _write(tmp_path / "trajectories.jsonl", [TRAJ])
    with pytest.raises(we.EvalFormatError) as e:
        we.load_tasks(tmp_path)
    assert msg in str(e.value) and "tasks.jsonl:2" in str(e.value)


def test_duplicate_ids_and_bad_json_are_errors(tmp_path):
    _write(tmp_path / "tasks.jsonl", [TASK, TASK])
    _write(tmp_path / "trajectories.jsonl", [TRAJ])
    with pytest.raises(we.EvalFormatError, match="duplicate task id t1"):
        we.load_tasks(tmp_path)
    _write(tmp_path / "tasks.jsonl", ["{not json"])
    with pytest.raises(we.EvalFormatError, match=r"tasks\.jsonl:1: invalid JSON"):
        we.load_tasks(tmp_path)
    _write(tmp_path / "tasks.jsonl", [])
    with pytest.raises(we.EvalFormatError, match="no tasks"):
        we.load_tasks(tmp_path)


def test_percentiles_nearest_rank():
    assert we.percentiles([]) == {"n": 0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0, "max": 0.0}
    p = we.percentiles(list(range(1, 101)))
    assert (p["n"], p["p50"], p["p90"], p["p99"], p["max"], p["mean"]) == (100, 50, 90, 99, 100, 50.5)
    assert we.percentiles([7.0])["p99"] == 7.0


def test_shipped_tasks_load_and_pair_fixes_with_failures():
    from pathlib import Path
    d = Path(__file__).resolve().parents[3] / "eval/tasks/more-itertools"
    tasks = we.load_tasks(d)
    assert len(tasks) >= 20
    assert {t.expected for t in tasks} == {"pass", "fail"}
    assert len({t.id for t in tasks}) == len(tasks)
    for t in tasks:
        kinds = [x.type for x in t.trajectory.turns]
        assert "exec" in kinds and "read" in kinds
        if t.expected == "pass":
            assert "patch" in kinds or "write" in kinds


def test_solution_paths_and_isolated_grading_needs_them(tmp_path):
    _write(tmp_path / "tasks.jsonl", [dict(TASK, solution=["/w/r/pkg"]), dict(TASK, id="t2")])
    _write(tmp_path / "trajectories.jsonl", [TRAJ])
    t1, t2 = we.load_tasks(tmp_path)
    assert t1.solution == ("/w/r/pkg",) and t2.solution == ()
    with pytest.raises(we.errors.InvalidArgument, match="t2"):
        we.run(None, [t1, t2], n=1, grade="isolated")  # refused before any call


def test_shipped_tasks_name_their_solution():
    from pathlib import Path
    tasks = we.load_tasks(Path(__file__).resolve().parents[3] / "eval/tasks/more-itertools")
    assert {t.solution for t in tasks} == {("/w/more-itertools/more_itertools",)}
