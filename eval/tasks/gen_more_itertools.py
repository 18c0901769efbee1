#!/usr/bin/env python3
"""Generates the SWE-style eval tasks on more-itertools 10.1.0 (the
workspace/more-itertools@10.1.0 layer): each task injects one bug into one
function of the real code base (a setup patch, committed in the sandbox so
the agent sees a clean tree), and names the real test class of that function
as its grading tests. Each bug gives a task whose trajectory applies the
reference fix (expected: pass) and, for every other bug, a task whose
trajectory gives up or applies a wrong fix (expected: fail). Formats:
docs/eval-format.md.

Every bug is verified on the host before it is written out: the grading
tests pass on the pristine tree, fail with the bug, and pass again after the
fix patch (the wrong-fix patch must leave them failing).

Usage (the repo path is the workspace rootfs dir that setup.sh builds):
  gen_more_itertools.py [--src /var/cache/warren/rootfs/workspace-more-itertools-10.1.0/w/more-itertools]
                        [--out eval/tasks/more-itertools] [--python /usr/bin/python3] [--no-verify]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, NamedTuple, Tuple

REPO = "/w/more-itertools"
LAYERS = ["base/debian-12@1", "toolset/python@1", "workspace/more-itertools@10.1.0"]
TEST_CMD = "python3 -m pytest -q -p no:cacheprovider {tests}"


class Bug(NamedTuple):
    name: str   # task id stem
    path: str   # file, relative to the repo
    func: str   # the function the bug is in
    old: str    # exact text, must occur once in path
    new: str    # its buggy replacement
    tests: str  # pytest node id, relative to the repo


R, M = "more_itertools/recipes.py", "more_itertools/more.py"
TR, TM = "tests/test_recipes.py", "tests/test_more.py"

BUGS: List[Bug] = [
    Bug("take-off-by-one", R, "take", "return list(islice(iterable, n))",
        "return list(islice(iterable, n + 1))", TR + "::TakeTests"),
    Bug("tail-off-by-one", R, "tail", "max(0, len(iterable) - n)",
        "max(0, len(iterable) - n + 1)", TR + "::TailTests"),
    Bug("nth-skips-one", R, "nth", "return next(islice(iterable, n, None), default)",
        "return next(islice(iterable, n + 1, None), default)", TR + "::NthTests"),
    Bug("all-equal-inverted", R, "all_equal", "return next(g, True) and not next(g, False)",
        "return bool(next(g, True)) and bool(next(g, False))", TR + "::AllEqualTests"),
    Bug("quantify-max", R, "quantify", "return sum(map(pred, iterable))",
        "return max(map(pred, iterable), default=0)", TR + "::QuantifyTests"),
    Bug("ncycles-one-short", R, "ncycles", "repeat(tuple(iterable), n)",
        "repeat(tuple(iterable), n - 1)", TR + "::NcyclesTests"),
    Bug("dotproduct-adds", R, "dotproduct", "return sum(map(operator.mul, vec1, vec2))",
        "return sum(map(operator.add, vec1, vec2))", TR + "::DotproductTests"),
    Bug("repeatfunc-one-short", R, "repeatfunc", "return starmap(func, repeat(args, times))",
        "return starmap(func, repeat(args, times - 1))", TR + "::RepeatfuncTests"),
    Bug("grouper-ignore-fills", R, "grouper",
        "    if incomplete == 'ignore':\n        return zip(*args)",
        "    if incomplete == 'ignore':\n        return zip_longest(*args, fillvalue=fillvalue)",
        TR + "::GrouperTests"),
    Bug("partition-swapped", R, "partition",
        "return (compress(t1, map(operator.not_, p1)), compress(t2, p2))",
        "return (compress(t1, p1), compress(t2, map(operator.not_, p2)))", TR + "::PartitionTests"),
    Bug("powerset-no-full-set", R, "powerset", "for r in range(len(s) + 1))",
        "for r in range(len(s)))", TR + "::PowersetTests"),
    Bug("unique-everseen-ignores-key", R, "unique_everseen",
        "            if k not in seenset:\n                seenset_add(k)",
        "            if element not in seenset:\n                seenset_add(element)",
        TR + "::UniqueEverseenTests"),
    Bug("unique-justseen-ignores-key", R, "unique_justseen", "groupby(iterable, key)))",
        "groupby(iterable)))", TR + "::UniqueJustseenTests"),
    Bug("iter-except-drops-first", R, "iter_except",
        "        if first is not None:\n            yield first()",
        "        if first is not None:\n            first()", TR + "::IterExceptTests"),
    Bug("first-true-ignores-default", R, "first_true",
        "return next(filter(pred, iterable), default)",
        "return next(filter(pred, iterable), None)", TR + "::FirstTrueTests"),
    Bug("prepend-appends", R, "prepend", "return chain([value], iterator)",
        "return chain(iterator, [value])", TR + "::PrependTests"),
    Bug("convolve-unreversed", R, "convolve", "kernel = tuple(kernel)[::-1]",
        "kernel = tuple(kernel)", TR + "::Convolvetests"),
    Bug("triplewise-order", R, "triplewise", "        yield a, b, c",
        "        yield a, c, b", TR + "::TriplewiseTests"),
    Bug("sliding-window-skips", R, "sliding_window", "deque(islice(it, n - 1), maxlen=n)",
        "deque(islice(it, n), maxlen=n)", TR + "::SlidingWindowTests"),
    Bug("subslices-short", R, "subslices", "combinations(range(len(seq) + 1), 2)",
        "combinations(range(len(seq)), 2)", TR + "::SubslicesTests"),
    Bug("iter-index-skips", R, "iter_index", "i = seq_index(value, i + 1)",
        "i = seq_index(value, i + 2)", TR + "::IterIndexTests"),
    Bug("sieve-drops-two", R, "sieve", "    data[2] = 1\n", "    data[2] = 0\n",
        TR + "::SieveTests"),
    Bug("factor-drops-last-prime", R, "factor", "    if n > 1:\n        yield n",
        "    if n > 2:\n        yield n", TR + "::FactorTests"),
    Bug("polynomial-eval-powers", R, "polynomial_eval",
        "powers = map(pow, repeat(x), reversed(range(n)))",
        "powers = map(pow, repeat(x), range(n))", TR + "::PolynomialEvalTests"),
    Bug("polynomial-derivative-powers", R, "polynomial_derivative",
        "powers = reversed(range(1, n))", "powers = range(1, n)",
        TR + "::PolynomialDerivativeTests"),
    Bug("ilen-off-by-one", M, "ilen", "    return next(counter)\n",
        "    return next(counter) + 1\n", TM + "::IlenTests"),
    Bug("spy-loses-head", M, "spy", "return head.copy(), chain(head, it)",
        "return head.copy(), it", TM + "::SpyTests"),
    Bug("interleave-longest-marker", M, "interleave_longest",
        "return (x for x in i if x is not _marker)",
        "return (x for x in i if x is not None)", TM + "::InterleaveLongestTests"),
]


def git(repo: Path, *args: str, check: bool = True) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="gen", GIT_AUTHOR_EMAIL="gen@warren.invalid",
               GIT_COMMITTER_NAME="gen", GIT_COMMITTER_EMAIL="gen@warren.invalid")
    return subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=repo, env=env,
                          check=check, capture_output=True, text=True).stdout


def func_lines(source: str, func: str) -> Tuple[int, int]:
    """1-based first and last line of the top-level def `func`."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == func:
            return node.lineno, node.end_lineno or node.lineno
    raise SystemExit(f"no top-level def {func}")


def run_tests(python: str, repo: Path, tests: str) -> bool:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    r = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", tests], cwd=repo,
                       env=env, capture_output=True, text=True, timeout=300)
    return r.returncode == 0


def make_bug(src: Path, work: Path, bug: Bug, python: str, verify: bool) -> Dict[str, str]:
    """Returns the bug patch, the fix patch, a wrong fix patch, the buggy and
    fixed file contents, and the function's line range in the buggy file."""
    repo = work / bug.name
    shutil.copytree(src, repo, symlinks=True)
    f = repo / bug.path
    orig = f.read_text()
    if orig.count(bug.old) != 1:
        raise SystemExit(f"{bug.name}: {bug.old!r} occurs {orig.count(bug.old)} times in {bug.path}")
    buggy = orig.replace(bug.old, bug.new)
    if verify and not run_tests(python, repo, bug.tests):
        raise SystemExit(f"{bug.name}: {bug.tests} fails on the pristine tree")
    f.write_text(buggy)
    bug_patch = git(repo, "diff", "--", bug.path)
    if verify and run_tests(python, repo, bug.tests):
        raise SystemExit(f"{bug.name}: {bug.tests} still passes with the bug")
    git(repo, "commit", "-qam", "bug")
    first, last = func_lines(buggy, bug.func)
    # A wrong fix: a plausible-looking edit of the function that leaves the bug.
    # (A comment above the buggy line, which it leaves as it is.)
    lines = buggy.splitlines(keepends=True)
    at = buggy[:buggy.index(bug.new)].count("\n")
    line = lines[at]
    indent = line[:len(line) - len(line.lstrip())] if line.strip() else "    "
    lines.insert(at, f"{indent}# Checked the edge cases of {bug.func}(): this is intended.\n")
    f.write_text("".join(lines))
    wrong_patch = git(repo, "diff", "--", bug.path)
    if verify and run_tests(python, repo, bug.tests):
        raise SystemExit(f"{bug.name}: the wrong fix passes")
    git(repo, "checkout", "-q", "--", bug.path)
    f.write_text(orig)
    fix_patch = git(repo, "diff", "--", bug.path)
    if verify and not run_tests(python, repo, bug.tests):
        raise SystemExit(f"{bug.name}: the fix does not pass")
    shutil.rmtree(repo)
    return {"bug": bug_patch, "fix": fix_patch, "wrong": wrong_patch, "buggy": buggy,
            "fixed": orig, "first": str(first), "last": str(last)}


def test_cmd(tests: str, tail: int = 25) -> str:
    return f"python3 -m pytest -q -x -p no:cacheprovider {tests} 2>&1 | tail -n {tail}"


def trajectory(bug: Bug, p: Dict[str, str], kind: str, variant: int) -> List[dict]:
    """The scripted agent's turns. kind: fix | nofix | wrongfix. variant picks
    how the fix is made (git apply, patch -p1, or writing the file)."""
    turns: List[dict] = [
        {"type": "exec", "cmd": "git status --short && git log --oneline -1"},
        {"type": "exec", "cmd": f"grep -rn 'def {bug.func}(' more_itertools/"},
        {"type": "exec", "cmd": f"sed -n '{p['first']},{p['last']}p' {bug.path}"},
        {"type": "exec", "cmd": test_cmd(bug.tests)},
        {"type": "read", "path": bug.tests.split("::")[0]},
    ]
    if kind == "fix":
        if variant == 0:
            turns += [
                {"type": "write", "path": "/tmp/fix.patch", "content": p["fix"]},
                {"type": "exec", "cmd": "git apply --check /tmp/fix.patch && git apply /tmp/fix.patch",
                 "expect_exit": 0},
            ]
        elif variant == 1:
            turns += [{"type": "patch", "tool": "patch", "patch": p["fix"]}]
        else:
            turns += [{"type": "write", "path": bug.path, "content": p["fixed"]}]
    elif kind == "wrongfix":
        turns += [{"type": "patch", "tool": "git", "patch": p["wrong"]}]
    turns += [
        {"type": "exec", "cmd": "git diff --stat"},
        {"type": "exec", "cmd": test_cmd(bug.tests, 5)},
    ]
    return turns


def main() -> None:
    here = Path(__file__).resolve().parent
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default="/var/cache/warren/rootfs/workspace-more-itertools-10.1.0/w/more-itertools")
    ap.add_argument("--out", default=str(here / "more-itertools"))
    ap.add_argument("--python", default="/usr/bin/python3", help="interpreter with pytest, to verify")
    ap.add_argument("--no-verify", action="store_true")
    a = ap.parse_args()
    src, out = Path(a.src), Path(a.out)
    if not (src / ".git").is_dir():
        raise SystemExit(f"{src}: not the workspace repo (run scripts/setup.sh)")
    out.mkdir(parents=True, exist_ok=True)
    tasks: List[dict] = []
    trajs: List[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, bug in enumerate(BUGS):
            p = make_bug(src, Path(tmp), bug, a.python, not a.no_verify)
            kinds = ["fix", "wrongfix" if i % 2 else "nofix"]
            for kind in kinds:
                tid = f"mi-{bug.name}-{kind}"
                tasks.append({
                    "id": tid,
                    "layers": LAYERS,
                    "repo": REPO,
                    "setup": [
                        {"type": "patch", "tool": "git", "patch": p["bug"]},
                        {"type": "exec", "cmd": "git commit -qam 'task state' && git log --oneline -1",
                         "expect_exit": 0},
                    ],
                    "tests": [bug.tests],
                    "test_command": TEST_CMD,
                    "protected": [REPO + "/tests"],
                    "solution": [REPO + "/more_itertools"],
                    "expected": "pass" if kind == "fix" else "fail",
                    "trajectory": tid,
                    "timeout_s": 120,
                })
                trajs.append({"id": tid, "task": tid, "turns": trajectory(bug, p, kind, i % 3)})
            print(f"{bug.name}: ok", file=sys.stderr)
    with open(out / "tasks.jsonl", "w") as f:
        for t in tasks:
            f.write(json.dumps(t, sort_keys=True) + "\n")
    with open(out / "trajectories.jsonl", "w") as f:
        for t in trajs:
            f.write(json.dumps(t, sort_keys=True) + "\n")
    print(f"{len(tasks)} tasks, {len(trajs)} trajectories in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
