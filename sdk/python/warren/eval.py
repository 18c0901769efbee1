"""warren eval: batches of SWE-style agent rollouts, each in a fresh sandbox.

A rollout = create a `container` sandbox from the task's layers, run the
task's setup steps, replay the scripted agent's trajectory (exec commands,
file writes and reads, patches), grade by running the task's tests, destroy.
Its outcome is "pass" (the grading command exited 0), "fail" (it did not) or
"error" (the rollout could not be carried out: a create/exec/file call
failed, or a turn with expect_exit got another exit code). A rollout is
*correct* when its outcome equals the task's expected outcome.

File formats (tasks and trajectories, JSON Lines): docs/eval-format.md.

Python API::

    import warren, warren.eval as we
    tasks = we.load_tasks("eval/tasks/more-itertools")   # dir or tasks.jsonl
    with warren.Client() as client:
        report = we.run(client, tasks, n=200, concurrency=8)
    print(report.summary["pass_rate"], report.all_correct)
    report.write_json("report.json")

Command line: ``python -m warren.eval --tasks DIR -n 200 -c 8 --report r.json``
(also ``warren eval ...``, which runs this). Exit status: 0 when every
rollout's outcome equals its task's expected outcome, 1 otherwise (a wrong
outcome or an error), 2 on a usage or task-file error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import errors
from ._eval_images import layers_from_images
from .client import Client, Sandbox

__all__ = [
    "EvalFormatError", "Turn", "Task", "Trajectory", "RolloutResult", "EvalReport",
    "load_tasks", "run", "run_rollout", "percentiles", "main", "layers_from_images",
]

TURN_TYPES = ("exec", "write", "read", "patch", "screenshot", "key", "type", "mouse", "scroll")
# The computer-use turns (the sandbox's desktop: runtime/desktop.h).
DESKTOP_TURNS = ("screenshot", "key", "type", "mouse", "scroll")
MOUSE_BUTTONS = ("left", "middle", "right")
MOUSE_ACTIONS = ("click", "down", "up", "move")
BACKENDS = ("container", "microvm", "vm")
DEFAULT_TEST_COMMAND = "python3 -m pytest -q -p no:cacheprovider {tests}"
# Environment of every rollout sandbox. No .pyc files are written: Python
# validates a cached .pyc by its source's mtime (whole seconds) and size, so a
# bug injected and then fixed within the same second by a same-size edit
# (e.g. "+" -> "*") would keep running the buggy byte code.
ROLLOUT_ENV = {"PYTHONDONTWRITEBYTECODE": "1"}
# Outcomes.
PASS, FAIL, ERROR = "pass", "fail", "error"
# Bytes of grader output kept in the report for wrong or failed rollouts.
OUTPUT_TAIL = 2000


class EvalFormatError(ValueError):
    """A task or trajectory file does not follow docs/eval-format.md; the
    message names the file and line."""


# ------------------------------------------------------------------ formats


@dataclass(frozen=True)
class Turn:
    """One step of a trajectory (or of a task's setup).

    type "exec": run `cmd` (a shell string) with cwd = the task's repo.
    type "write": write `content` (UTF-8 text) or `content_b64` to `path`
        (relative paths are under the repo; parents are created).
    type "read": read the file at `path`.
    type "patch": apply the unified diff `patch` at the repo root with
        `tool` "git" (git apply, the default) or "patch" (patch -p1);
        must apply (expect_exit defaults to 0).
    type "screenshot": take a screenshot (the agent looks; the PNG is
        dropped). The first desktop call of a container or microvm sandbox
        starts its X server (toolset/desktop layer).
    type "key": press the combination `keys` ("ctrl+l", "Return").
    type "type": type `text` (printable ASCII, \\n and \\t).
    type "mouse": move the pointer to (`x`, `y`), then `action` ("move"
        default, "click", "down", "up") with `button` ("left", "middle",
        "right"; needed by all but "move").
    type "scroll": `dx`, `dy` wheel clicks (dy > 0 down).
    expect_exit: if set, any other exit code makes the rollout an error
        (patch turns: None means 0).
    timeout_s: for exec and patch (default: the task's timeout_s).
    """

    type: str
    cmd: str = ""
    path: str = ""
    content: Optional[bytes] = None
    patch: str = ""
    tool: str = "git"
    expect_exit: Optional[int] = None
    timeout_s: Optional[float] = None
    keys: str = ""
    text: str = ""
    x: int = 0
    y: int = 0
    button: Optional[str] = None
    action: str = "move"
    dx: int = 0
    dy: int = 0

    @classmethod
    def parse(cls, d: Any, where: str) -> Turn:
        if not isinstance(d, dict):
            raise EvalFormatError(f"{where}: a turn must be an object, got {type(d).__name__}")
        t = d.get("type")
        if t not in TURN_TYPES:
            raise EvalFormatError(f"{where}: turn type must be one of {TURN_TYPES}, got {t!r}")
        known = {"type", "cmd", "path", "content", "content_b64", "patch", "tool",
                 "expect_exit", "timeout_s", "note", "keys", "text", "x", "y", "button", "action", "dx", "dy"}
        extra = set(d) - known
        if extra:
            raise EvalFormatError(f"{where}: unknown turn field(s) {sorted(extra)}")
        exp = d.get("expect_exit")
        if exp is not None and (isinstance(exp, bool) or not isinstance(exp, int)):
            raise EvalFormatError(f"{where}: expect_exit must be an integer")
        timeout = d.get("timeout_s")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or timeout <= 0):
            raise EvalFormatError(f"{where}: timeout_s must be a number > 0")

        def need_str(k: str) -> str:
            v = d.get(k)
            if not isinstance(v, str) or not v:
                raise EvalFormatError(f"{where}: {t} turn needs a non-empty string {k!r}")
            return v

        def need_int(k: str, default: Optional[int] = None) -> int:
            v = d.get(k, default)
            if isinstance(v, bool) or not isinstance(v, int):
                raise EvalFormatError(f"{where}: {t} turn needs an integer {k!r}")
            return v

        if t == "exec":
            return cls(t, cmd=need_str("cmd"), expect_exit=exp, timeout_s=timeout)
        if t == "screenshot":
            return cls(t)
        if t == "key":
            return cls(t, keys=need_str("keys"))
        if t == "type":
            return cls(t, text=need_str("text"))
        if t == "mouse":
            button, action = d.get("button"), d.get("action", "move")
            if button is not None and button not in MOUSE_BUTTONS:
                raise EvalFormatError(f"{where}: mouse button must be one of {MOUSE_BUTTONS}, got {button!r}")
            if action not in MOUSE_ACTIONS:
                raise EvalFormatError(f"{where}: mouse action must be one of {MOUSE_ACTIONS}, got {action!r}")
            if action != "move" and button is None:
                raise EvalFormatError(f"{where}: mouse action {action!r} needs a button")
            return cls(t, x=need_int("x"), y=need_int("y"), button=button, action=action)
        if t == "scroll":
            return cls(t, dx=need_int("dx", 0), dy=need_int("dy", 0))
        if t == "read":
            return cls(t, path=need_str("path"))
        if t == "write":
            path = need_str("path")
            if ("content" in d) == ("content_b64" in d):
                raise EvalFormatError(f"{where}: write turn needs exactly one of content, content_b64")
            if "content" in d:
                if not isinstance(d["content"], str):
                    raise EvalFormatError(f"{where}: content must be a string")
                data = d["content"].encode("utf-8")
            else:
                import base64
                try:
                    data = base64.b64decode(d["content_b64"], validate=True)
                except (ValueError, TypeError) as e:
                    raise EvalFormatError(f"{where}: content_b64: {e}") from None
            return cls(t, path=path, content=data)
        tool = d.get("tool", "git")
        if tool not in ("git", "patch"):
            raise EvalFormatError(f"{where}: patch tool must be 'git' or 'patch', got {tool!r}")
        return cls(t, patch=need_str("patch"), tool=tool,
                   expect_exit=0 if exp is None else exp, timeout_s=timeout)


@dataclass(frozen=True)
class Trajectory:
    """A scripted agent: its turns, replayed in order."""

    id: str
    turns: Tuple[Turn, ...]


@dataclass(frozen=True)
class Task:
    """One eval task (see docs/eval-format.md). expected: "pass" or "fail"
    (the grading outcome the trajectory should produce)."""

    id: str
    layers: Tuple[str, ...]
    repo: str
    tests: Tuple[str, ...]
    expected: str
    trajectory: Trajectory
    setup: Tuple[Turn, ...] = ()
    test_command: str = DEFAULT_TEST_COMMAND
    protected: Tuple[str, ...] = ()
    solution: Tuple[str, ...] = ()
    timeout_s: float = 120.0
    cpu: Optional[float] = None
    memory_mb: Optional[int] = None
    disk_mb: Optional[int] = None
    backend: str = "container"

    def grade_command(self) -> str:
        return self.test_command.replace("{tests}", " ".join(shlex.quote(t) for t in self.tests))


def _read_jsonl(path: Path) -> List[Tuple[str, Dict[str, Any]]]:
    out = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise EvalFormatError(f"{path}: {e.strerror}") from None
    for i, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{i}"
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise EvalFormatError(f"{where}: invalid JSON: {e.msg}") from None
        if not isinstance(d, dict):
            raise EvalFormatError(f"{where}: each line must be a JSON object")
        out.append((where, d))
    return out


def load_trajectories(path: os.PathLike[str] | str) -> Dict[str, Trajectory]:
    """Reads a trajectories JSONL file: {"id": str, "turns": [turn, ...]}
    per line. Raises EvalFormatError."""
    out: Dict[str, Trajectory] = {}
    for where, d in _read_jsonl(Path(path)):
        tid = d.get("id")
        if not isinstance(tid, str) or not tid:
            raise EvalFormatError(f"{where}: trajectory needs a non-empty string id")
        turns = d.get("turns")
        if not isinstance(turns, list):
            raise EvalFormatError(f"{where}: trajectory {tid}: turns must be a list")
        if tid in out:
            raise EvalFormatError(f"{where}: duplicate trajectory id {tid}")
        out[tid] = Trajectory(tid, tuple(Turn.parse(t, f"{where}: turn {k}")
                                         for k, t in enumerate(turns)))
    return out


def load_tasks(path: os.PathLike[str] | str,
               trajectories: os.PathLike[str] | str | None = None) -> List[Task]:
    """Reads tasks (a tasks.jsonl file, or a dir holding tasks.jsonl) and
    resolves each task's trajectory: an inline object, or an id looked up in
    `trajectories` (default: trajectories.jsonl beside the tasks file).
    Raises EvalFormatError on any format error, unknown trajectory id or
    duplicate task id."""
    p = Path(path)
    if p.is_dir():
        p = p / "tasks.jsonl"
    traj_path = Path(trajectories) if trajectories else p.parent / "trajectories.jsonl"
    trajs: Optional[Dict[str, Trajectory]] = None
    tasks: List[Task] = []
    seen = set()
    known = {"id", "layers", "repo", "tests", "expected", "trajectory", "setup", "test_command",
             "protected", "solution", "timeout_s", "resources", "note", "backend"}
    for where, d in _read_jsonl(p):
        extra = set(d) - known
        if extra:
            raise EvalFormatError(f"{where}: unknown task field(s) {sorted(extra)}")
        tid = d.get("id")
        if not isinstance(tid, str) or not tid:
            raise EvalFormatError(f"{where}: task needs a non-empty string id")
        if tid in seen:
            raise EvalFormatError(f"{where}: duplicate task id {tid}")
        seen.add(tid)
        where = f"{where} (task {tid})"

        def strs(k: str, required: bool = True) -> Tuple[str, ...]:  # called in this iteration only
            v = d.get(k, None if required else [])  # noqa: B023
            if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v) or \
                    (required and not v):
                raise EvalFormatError(f"{where}: {k} must be a {'non-empty ' if required else ''}"  # noqa: B023
                                      f"list of non-empty strings")
            return tuple(v)

        layers, tests = strs("layers"), strs("tests")
        protected = strs("protected", required=False)
        solution = strs("solution", required=False)
        if any(not x.startswith("/") for x in solution):
            raise EvalFormatError(f"{where}: solution paths must be absolute paths in the sandbox")
        repo = d.get("repo")
        if not isinstance(repo, str) or not repo.startswith("/"):
            raise EvalFormatError(f"{where}: repo must be an absolute path in the sandbox")
        expected = d.get("expected")
        if expected not in (PASS, FAIL):
            raise EvalFormatError(f"{where}: expected must be 'pass' or 'fail', got {expected!r}")
        cmd = d.get("test_command", DEFAULT_TEST_COMMAND)
        if not isinstance(cmd, str) or "{tests}" not in cmd:
            raise EvalFormatError(f"{where}: test_command must be a string containing {{tests}}")
        timeout = d.get("timeout_s", 120)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise EvalFormatError(f"{where}: timeout_s must be a number > 0")
        backend = d.get("backend", "container")
        if backend not in BACKENDS:
            raise EvalFormatError(f"{where}: backend must be one of {BACKENDS}, got {backend!r}")
        setup = d.get("setup", [])
        if not isinstance(setup, list):
            raise EvalFormatError(f"{where}: setup must be a list of turns")
        res = d.get("resources", {})
        if not isinstance(res, dict) or set(res) - {"cpu", "memory_mb", "disk_mb"}:
            raise EvalFormatError(f"{where}: resources may only hold cpu, memory_mb, disk_mb")
        tr = d.get("trajectory")
        if isinstance(tr, dict):
            turns = tr.get("turns")
            if not isinstance(turns, list):
                raise EvalFormatError(f"{where}: inline trajectory needs a turns list")
            traj = Trajectory(str(tr.get("id", tid)),
                              tuple(Turn.parse(t, f"{where}: trajectory turn {k}")
                                    for k, t in enumerate(turns)))
        elif isinstance(tr, str) and tr:
            if trajs is None:
                trajs = load_trajectories(traj_path)
            if tr not in trajs:
                raise EvalFormatError(f"{where}: trajectory {tr!r} not in {traj_path}")
            traj = trajs[tr]
        else:
            raise EvalFormatError(f"{where}: trajectory must be an id or an inline object")
        tasks.append(Task(
            id=tid, layers=layers, repo=repo, tests=tests, expected=expected, trajectory=traj,
            setup=tuple(Turn.parse(t, f"{where}: setup turn {k}") for k, t in enumerate(setup)),
            test_command=cmd, protected=protected, solution=solution, timeout_s=float(timeout),
            cpu=res.get("cpu"), memory_mb=res.get("memory_mb"), disk_mb=res.get("disk_mb"), backend=backend))
    if not tasks:
        raise EvalFormatError(f"{p}: no tasks")
    return tasks


# ------------------------------------------------------------------ rollouts


class _TurnFailed(Exception):
    pass


@dataclass
class RolloutResult:
    """One rollout. Latencies in milliseconds; exec_ms holds every exec of
    the rollout (setup, turns, patches, and the grading exec in "exec" grade
    mode). outcome: pass | fail | error."""

    index: int
    task: str
    expected: str
    outcome: str = ERROR
    sandbox: str = ""
    error: str = ""
    create_ms: float = 0.0
    exec_ms: List[float] = field(default_factory=list)
    grade_ms: float = 0.0
    destroy_ms: float = 0.0
    rollout_ms: float = 0.0
    grade_exit: Optional[int] = None
    turns: int = 0
    output_tail: str = ""

    @property
    def correct(self) -> bool:
        return self.outcome == self.expected


def _retry_create(client: Client, task: Task, labels: Dict[str, str], deadline_s: float = 120.0) -> Sandbox:
    """create(), retrying the retryable refusals (node busy) with backoff
    for at most deadline_s seconds."""
    end = time.monotonic() + deadline_s
    delay = 0.02
    while True:
        try:
            return client.create(layers=list(task.layers), backend=task.backend, cpu=task.cpu,
                                 memory_mb=task.memory_mb, disk_mb=task.disk_mb, labels=labels, env=ROLLOUT_ENV,
                                 timeout=60 if task.backend == "container" else 600)
        except (errors.ResourceExhausted, errors.Unavailable):
            if time.monotonic() + delay > end:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def _abs(repo: str, path: str) -> str:
    return path if path.startswith("/") else repo.rstrip("/") + "/" + path


def _do_turn(sb: Sandbox, task: Task, turn: Turn, k: int, r: RolloutResult) -> None:
    timeout = turn.timeout_s or task.timeout_s
    if turn.type in DESKTOP_TURNS:
        # The first desktop call may start the sandbox's X server.
        if turn.type == "screenshot":
            sb.screenshot(timeout=timeout)
        elif turn.type == "key":
            sb.input.key(turn.keys, timeout=timeout)
        elif turn.type == "type":
            sb.input.type(turn.text, timeout=timeout)
        elif turn.type == "mouse":
            sb.input.mouse(turn.x, turn.y, button=turn.button, action=turn.action, timeout=timeout)
        else:
            sb.input.scroll(turn.dx, turn.dy, timeout=timeout)
        return
    if turn.type == "read":
        sb.files.read(_abs(task.repo, turn.path))
        return
    if turn.type == "write":
        assert turn.content is not None
        sb.files.write(_abs(task.repo, turn.path), turn.content, make_parents=True)
        return
    if turn.type == "patch":
        pf = f"/tmp/.warren-eval-{r.index}-{k}.patch"
        sb.files.write(pf, turn.patch.encode("utf-8"), make_parents=True)
        cmd = (f"git apply --whitespace=nowarn {pf}" if turn.tool == "git"
               else f"patch -p1 --forward --batch -i {pf}")
    else:
        cmd = turn.cmd
    t0 = time.monotonic()
    res = sb.exec(cmd, cwd=task.repo, timeout=timeout)
    r.exec_ms.append((time.monotonic() - t0) * 1000)
    expect = turn.expect_exit
    if expect is None and turn.type == "patch":
        expect = 0  # a patch must apply
    if expect is not None and res.exit_code != expect:
        tail = (res.stdout + res.stderr)[-OUTPUT_TAIL:].decode("utf-8", "replace")
        raise _TurnFailed(f"turn {k} ({turn.type}: {(cmd or '')[:80]!r}) exited {res.exit_code}, "
                          f"expected {expect}: {tail}")


def run_rollout(client: Client, task: Task, index: int = 0, grade: str = "exec",
                labels: Optional[Dict[str, str]] = None) -> RolloutResult:
    """Runs one rollout of `task` in a fresh sandbox and destroys it (also on
    error). grade: "exec" (the tests run in the rollout's sandbox) or
    "isolated" (sb.grade(): a fresh sandbox from the pristine layers plus the
    rollout's changes under the task's `solution` paths only). Never
    raises for a rollout failure: errors are the result's outcome "error"."""
    r = RolloutResult(index=index, task=task.id, expected=task.expected)
    t_start = time.monotonic()
    sb: Optional[Sandbox] = None
    try:
        sb = _retry_create(client, task, dict(labels or {}))
        r.sandbox = sb.id
        r.create_ms = (time.monotonic() - t_start) * 1000
        k = 0
        for turn in task.setup + task.trajectory.turns:
            _do_turn(sb, task, turn, k, r)
            k += 1
        r.turns = k
        cmd = task.grade_command()
        t0 = time.monotonic()
        if grade == "isolated":
            g = sb.grade(cmd, solution=list(task.solution), protected=list(task.protected),
                         timeout=task.timeout_s, cwd=task.repo)
            res = g.result
        else:
            res = sb.exec(cmd, cwd=task.repo, timeout=task.timeout_s)
            r.exec_ms.append((time.monotonic() - t0) * 1000)
        r.grade_ms = (time.monotonic() - t0) * 1000
        r.grade_exit = res.exit_code
        r.outcome = PASS if res.exit_code == 0 and not res.timed_out else FAIL
        if r.outcome != r.expected:
            r.output_tail = (res.stdout + res.stderr)[-OUTPUT_TAIL:].decode("utf-8", "replace")
    except (errors.WarrenError, _TurnFailed) as e:
        r.outcome = ERROR
        r.error = f"{type(e).__name__}: {e}"[:OUTPUT_TAIL]
    finally:
        if sb is not None:
            t0 = time.monotonic()
            try:
                sb.destroy(timeout=60)
            except errors.NotFound:
                pass
            except errors.WarrenError as e:
                if r.outcome != ERROR:
                    r.outcome = ERROR
                    r.error = f"destroy: {type(e).__name__}: {e}"
            r.destroy_ms = (time.monotonic() - t0) * 1000
        r.rollout_ms = (time.monotonic() - t_start) * 1000
    return r


# ------------------------------------------------------------------ batch


def percentiles(values: Sequence[float]) -> Dict[str, float]:
    """p50/p90/p99 (nearest rank), mean, max and count of `values`."""
    if not values:
        return {"n": 0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0, "max": 0.0}
    v = sorted(values)

    def rank(p: float) -> float:
        return v[max(0, math.ceil(p / 100 * len(v)) - 1)]

    return {"n": len(v), "p50": round(rank(50), 2), "p90": round(rank(90), 2),
            "p99": round(rank(99), 2), "mean": round(sum(v) / len(v), 2), "max": round(v[-1], 2)}


class _MemorySampler:
    """Samples the node's used memory (total - available, NodeStatus) every
    `period` seconds in a thread; keeps the first and the peak value."""

    def __init__(self, client: Client, period: float = 0.25):
        self._client, self._period = client, period
        self.start_bytes = self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="warren-eval-mem", daemon=True)

    def _sample(self) -> None:
        try:
            s = self._client.status(timeout=5)
        except errors.WarrenError:
            return
        used = s.memory_total_bytes - s.memory_available_bytes
        if not self.start_bytes:
            self.start_bytes = used
        self.peak_bytes = max(self.peak_bytes, used)

    def _loop(self) -> None:
        while not self._stop.wait(self._period):
            self._sample()

    def __enter__(self) -> _MemorySampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sample()


class Progress:
    """A progress bar on a stream (stderr by default): redrawn in place on a
    terminal (at most 10 times a second), else one line per 10% or 10 s."""

    def __init__(self, total: int, stream: Optional[IO[str]] = None, enabled: bool = True):
        self.total, self.stream, self.enabled = total, stream or sys.stderr, enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.monotonic()
        self._last = 0.0
        self._last_pct = -1
        self._lock = threading.Lock()
        self.counts = {PASS: 0, FAIL: 0, ERROR: 0, "wrong": 0}
        self.done = 0

    def update(self, r: RolloutResult) -> None:
        with self._lock:
            self.done += 1
            self.counts[r.outcome] += 1
            if not r.correct:
                self.counts["wrong"] += 1
            self._draw(force=self.done == self.total)

    def _draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        el = now - self.t0
        rate = self.done / el if el > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        width = 30
        fill = int(width * self.done / self.total) if self.total else width
        c = self.counts
        line = (f"eval [{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} "
                f"pass {c[PASS]} fail {c[FAIL]} error {c[ERROR]} wrong {c['wrong']} "
                f"{rate:.2f}/s eta {eta:.0f}s")
        if self.tty:
            if force or now - self._last >= 0.1:
                self.stream.write("\r" + line + ("\n" if force else ""))
                self.stream.flush()
                self._last = now
        else:
            pct = self.done * 10 // max(1, self.total)
            if force or pct != self._last_pct or now - self._last >= 10:
                self.stream.write(line + "\n")
                self.stream.flush()
                self._last, self._last_pct = now, pct


@dataclass
class EvalReport:
    """The batch's results: `rollouts` in index order, `summary` (the JSON
    report's top-level fields) and `per_task`."""

    summary: Dict[str, Any]
    per_task: Dict[str, Dict[str, Any]]
    rollouts: List[RolloutResult]

    @property
    def all_correct(self) -> bool:
        return all(r.correct for r in self.rollouts)

    def to_json(self) -> Dict[str, Any]:
        d = dict(self.summary)
        d["per_task"] = self.per_task
        d["rollouts"] = []
        for r in self.rollouts:
            x = asdict(r)
            x["correct"] = r.correct
            x["exec_ms"] = [round(v, 2) for v in r.exec_ms]
            for k in ("create_ms", "grade_ms", "destroy_ms", "rollout_ms"):
                x[k] = round(x[k], 2)
            d["rollouts"].append(x)
        return d

    def write_json(self, path: os.PathLike[str] | str) -> None:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")
        os.replace(tmp, path)


def run(client: Client, tasks: Sequence[Task], n: Optional[int] = None, concurrency: int = 4,
        grade: str = "exec", progress: Optional[Progress] = None,
        on_result: Optional[Callable[[RolloutResult], None]] = None) -> EvalReport:
    """Runs n rollouts (rollout i runs tasks[i % len(tasks)]; n defaults to
    len(tasks)) with `concurrency` rollouts in flight, each in a fresh
    sandbox labelled warren-eval=<run id>. Sandboxes of the run still
    listed at the end (e.g. after an interruption) are destroyed.
    grade: "exec" | "isolated" (see run_rollout). Raises InvalidArgument on
    bad arguments, NotFound when a task's layer is missing (checked before
    any rollout starts)."""
    if not tasks:
        raise errors.InvalidArgument("eval: no tasks")
    n = len(tasks) if n is None else n
    if n < 1 or concurrency < 1:
        raise errors.InvalidArgument(f"eval: n and concurrency must be >= 1, got {n}, {concurrency}")
    if grade not in ("exec", "isolated"):
        raise errors.InvalidArgument(f"eval: grade must be 'exec' or 'isolated', got {grade!r}")
    if grade == "isolated":
        lacking = sorted({t.id for t in tasks if not t.solution})
        if lacking:
            raise errors.InvalidArgument(f"eval: --grade isolated needs each task's solution paths; "
                                         f"missing in {', '.join(lacking[:5])}")
    for ref in sorted({layer for t in tasks for layer in t.layers}):
        client.layers.get(ref)  # NotFound names the missing layer
    run_id = uuid.uuid4().hex[:12]
    labels = {"warren-eval": run_id}
    results: List[Optional[RolloutResult]] = [None] * n

    def one(i: int) -> None:
        r = run_rollout(client, tasks[i % len(tasks)], index=i, grade=grade, labels=labels)
        results[i] = r
        if progress:
            progress.update(r)
        if on_result:
            on_result(r)

    t0 = time.monotonic()
    with _MemorySampler(client) as mem:
        try:
            with ThreadPoolExecutor(max_workers=min(concurrency, n),
                                    thread_name_prefix="warren-eval") as pool:
                for f in [pool.submit(one, i) for i in range(n)]:
                    f.result()
        finally:
            for sb in client.list(labels=labels):
                try:
                    sb.destroy(timeout=60)
                except errors.WarrenError:
                    pass
    wall = time.monotonic() - t0
    done = [r for r in results if r is not None]
    per_task: Dict[str, Dict[str, Any]] = {}
    for t in tasks:
        per_task.setdefault(t.id, {"expected": t.expected, "runs": 0, PASS: 0, FAIL: 0, ERROR: 0,
                                   "correct": 0})
    for r in done:
        pt = per_task[r.task]
        pt["runs"] += 1
        pt[r.outcome] += 1
        pt["correct"] += int(r.correct)
    graded = [r for r in done if r.outcome != ERROR]
    summary = {
        "run_id": run_id,
        "n": n,
        "concurrency": concurrency,
        "grade": grade,
        "tasks": len(tasks),
        "wall_s": round(wall, 3),
        "throughput_rollouts_per_s": round(len(done) / wall, 3) if wall > 0 else 0.0,
        "passed": sum(r.outcome == PASS for r in done),
        "failed": sum(r.outcome == FAIL for r in done),
        "errors": sum(r.outcome == ERROR for r in done),
        "pass_rate": round(sum(r.outcome == PASS for r in graded) / len(graded), 4) if graded else 0.0,
        "correct": sum(r.correct for r in done),
        "incorrect": sum(not r.correct for r in done),
        "correct_rate": round(sum(r.correct for r in done) / len(done), 4) if done else 0.0,
        "latency_ms": {
            "create": percentiles([r.create_ms for r in done if r.sandbox]),
            "exec": percentiles([v for r in done for v in r.exec_ms]),
            "grade": percentiles([r.grade_ms for r in graded]),
            "destroy": percentiles([r.destroy_ms for r in done if r.sandbox]),
            "rollout": percentiles([r.rollout_ms for r in done]),
        },
        "memory": {
            "host_used_start_bytes": mem.start_bytes,
            "host_used_peak_bytes": mem.peak_bytes,
            "host_used_peak_delta_bytes": max(0, mem.peak_bytes - mem.start_bytes),
        },
    }
    return EvalReport(summary=summary, per_task=per_task, rollouts=done)


# ------------------------------------------------------------------ CLI


def _mib(b: int) -> str:
    return f"{b / (1 << 20):.0f} MiB"


def print_summary(rep: EvalReport, out: IO[str] = sys.stdout, per_task: bool = True) -> None:
    s = rep.summary
    if per_task:
        w = max([len(t) for t in rep.per_task] + [4])
        out.write(f"{'task':<{w}}  expected  runs  pass  fail  error  correct\n")
        for tid, pt in rep.per_task.items():
            if not pt["runs"]:
                continue
            mark = "" if pt["correct"] == pt["runs"] else "  <-- WRONG"
            out.write(f"{tid:<{w}}  {pt['expected']:<8}  {pt['runs']:>4}  {pt[PASS]:>4}  "
                      f"{pt[FAIL]:>4}  {pt[ERROR]:>5}  {pt['correct']:>7}{mark}\n")
    lat = s["latency_ms"]

    def p(k: str) -> str:
        v = lat[k]
        return f"p50 {v['p50']:.1f}  p90 {v['p90']:.1f}  p99 {v['p99']:.1f} ms (n={v['n']})"

    m = s["memory"]
    out.write(
        f"rollouts:    {s['n']} ({s['tasks']} tasks, concurrency {s['concurrency']}, grade {s['grade']})\n"
        f"outcomes:    pass {s['passed']}  fail {s['failed']}  error {s['errors']}  "
        f"pass rate {s['pass_rate'] * 100:.1f}%\n"
        f"correct:     {s['correct']}/{s['n']} ({s['correct_rate'] * 100:.1f}%) as expected\n"
        f"throughput:  {s['throughput_rollouts_per_s']:.2f} rollouts/s ({s['wall_s']:.1f} s wall)\n"
        f"create:      {p('create')}\n"
        f"exec:        {p('exec')}\n"
        f"grade:       {p('grade')}\n"
        f"rollout:     {p('rollout')}\n"
        f"host memory: peak {_mib(m['host_used_peak_bytes'])} used "
        f"(+{_mib(m['host_used_peak_delta_bytes'])} over the start)\n")
    errs = [r for r in rep.rollouts if r.outcome == ERROR][:5]
    for r in errs:
        out.write(f"error: rollout {r.index} ({r.task}): {r.error[:300]}\n")
    wrong = [r for r in rep.rollouts if r.outcome != ERROR and not r.correct][:5]
    for r in wrong:
        out.write(f"wrong: rollout {r.index} ({r.task}) {r.outcome}, expected {r.expected}: "
                  f"{r.output_tail[-300:]}\n")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="warren eval",
        description="Run N SWE-style rollouts (tasks cycled) in fresh sandboxes and grade them. "
                    "Exit 0 when every rollout's outcome is the task's expected one, 1 otherwise, "
                    "2 on usage or task-file errors. Formats: docs/eval-format.md.")
    ap.add_argument("--tasks", required=True, help="tasks.jsonl, or a dir holding tasks.jsonl")
    ap.add_argument("--trajectories", help="trajectories.jsonl (default: beside the tasks file)")
    ap.add_argument("-n", "--rollouts", type=int, default=None,
                    help="number of rollouts (default: one per task)")
    ap.add_argument("-c", "--concurrency", type=int, default=4, help="rollouts in flight (default 4)")
    ap.add_argument("--grade", choices=("exec", "isolated"), default="exec",
                    help="exec: run the tests in the rollout's sandbox (default); isolated: "
                         "sb.grade() in a fresh sandbox from the pristine layers plus the rollout's "
                         "changes under the task's solution paths only")
    ap.add_argument("--task", metavar="REGEX", help="only tasks whose id matches REGEX")
    ap.add_argument("--report", help="write the JSON report here")
    ap.add_argument("--layer-dir", action="append", default=[], metavar="NAME=DIR",
                    help="build layer NAME from rootfs DIR (on the daemon's host) if it is missing; "
                         "repeatable")
    ap.add_argument("--layer-image", action="append", default=[], metavar="NAME=IMAGE",
                    help="take layer NAME of every task from IMAGE instead (its layers in NAME's place); "
                         "IMAGE is an image of the node or a registry ref pulled if the node lacks it; "
                         "repeatable")
    ap.add_argument("--addr", help="daemon address (default: WARREN_ADDR)")
    ap.add_argument("--token", help="bearer token (default: WARREN_TOKEN)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    ap.add_argument("--no-per-task", action="store_true", help="summary only, no per-task table")
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = _parser()
    a = ap.parse_args(argv)
    try:
        tasks = load_tasks(a.tasks, a.trajectories)
    except EvalFormatError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.task:
        rx = re.compile(a.task)
        tasks = [t for t in tasks if rx.search(t.id)]
        if not tasks:
            print(f"error: no task id matches {a.task!r}", file=sys.stderr)
            return 2
    n = a.rollouts if a.rollouts is not None else len(tasks)
    if n < 1 or a.concurrency < 1:
        print("error: -n and -c must be >= 1", file=sys.stderr)
        return 2
    builds = []
    for spec in a.layer_dir:
        name, sep, d = spec.partition("=")
        if not sep or not name or not d:
            print(f"error: --layer-dir wants NAME=DIR, got {spec!r}", file=sys.stderr)
            return 2
        builds.append((name, d))
    images: Dict[str, str] = {}
    for spec in a.layer_image:
        name, sep, ref = spec.partition("=")
        if not sep or not name or not ref:
            print(f"error: --layer-image wants NAME=IMAGE, got {spec!r}", file=sys.stderr)
            return 2
        images[name] = ref
    try:
        with Client(a.addr, a.token) as client:
            for name, d in builds:
                try:
                    client.layers.get(name)
                except errors.NotFound:
                    t0 = time.monotonic()
                    client.layers.build(name, dir=d, timeout=1800)
                    print(f"built layer {name} from {d} in {time.monotonic() - t0:.1f} s",
                          file=sys.stderr)
            if images:
                tasks = layers_from_images(client, tasks, images, log=sys.stderr)
            prog = Progress(n, enabled=not a.no_progress)
            rep = run(client, tasks, n=n, concurrency=a.concurrency, grade=a.grade, progress=prog)
    except errors.WarrenError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print_summary(rep, per_task=not a.no_per_task)
    if a.report:
        rep.write_json(a.report)
        print(f"report:      {a.report}")
    return 0 if rep.all_correct else 1


if __name__ == "__main__":
    sys.exit(main())
