#!/usr/bin/env python3
"""Throughput of `warren eval` (the main job) against a same-run baseline.

Baseline ("host"): the same rollouts (tasks cycled to N) with no sandbox at
all: per rollout a copy of the workspace repo on the host (`cp -a` of the
rootfs dir setup.sh built, the host's Debian python3/pytest/git, i.e. the
toolset's own files), the task's setup and trajectory turns run with
`sh -c` in it (/tmp/ paths in turns are mapped to a private dir per
rollout), graded with the same test command, the copy removed. Same
concurrency (threads), same grading outcome check.

warren: warren.eval.run() on a warrend started here (private state dir,
layers built from the setup rootfs dirs), for each -c given.

Prints a table (and with --record appends it to bench/RESULTS.md) with
rollouts/s, the ratio to the baseline, rollout latency p50/p99, and where a
warren rollout's time goes (mean ms: create, execs, file calls, destroy).

Usage (root, after scripts/setup.sh and a build):
  .venv/bin/python bench/eval_throughput.py -n 200 -c 4 [-c 8 ...] [--baseline-c 4] [--record]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "sdk/python"))

import warren  # noqa: E402
from warren import eval as we  # noqa: E402

RFS = Path("/var/cache/warren/rootfs")
LAYERS = {
    "base/debian-12@1": RFS / "debian-12",
    "toolset/python@1": RFS / "toolset-python",
    "workspace/more-itertools@10.1.0": RFS / "workspace-more-itertools-10.1.0",
}
WS = RFS / "workspace-more-itertools-10.1.0"


def host_rollout(task: we.Task, i: int, scratch: Path) -> str:
    """One rollout on the host; returns its outcome."""
    root = scratch / f"r{i}"
    repo = root / task.repo.lstrip("/")
    tmp = root / "tmp"
    tmp.mkdir(parents=True)
    repo.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", str(WS / task.repo.lstrip("/")), str(repo)], check=True)
    env = dict(os.environ, HOME=str(root))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PATH"] = "/usr/bin:/bin"  # Debian's python3, as in the toolset
    env["GIT_CONFIG_GLOBAL"] = str(RFS / "toolset-python/etc/gitconfig")  # the toolset's git config

    def sh(cmd: str, map_tmp: bool = True) -> int:
        if map_tmp:  # a path starting with /tmp/ (not e.g. /var/tmp/)
            cmd = re.sub(r"(?<![\w/.-])/tmp/", f"{tmp}/", cmd)
        return subprocess.run(["sh", "-c", cmd], cwd=repo, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=task.timeout_s).returncode

    def path(p: str) -> Path:
        return Path(re.sub(r"^/tmp/", f"{tmp}/", p)) if p.startswith("/") else repo / p

    try:
        for k, t in enumerate(task.setup + task.trajectory.turns):
            if t.type == "exec":
                rc = sh(t.cmd)
            elif t.type == "write":
                path(t.path).parent.mkdir(parents=True, exist_ok=True)
                path(t.path).write_bytes(t.content or b"")
                continue
            elif t.type == "read":
                path(t.path).read_bytes()
                continue
            else:
                pf = tmp / f"{k}.patch"
                pf.write_text(t.patch)
                rc = sh(f"git apply --whitespace=nowarn {pf}" if t.tool == "git"
                        else f"patch -p1 --forward --batch -i {pf}", map_tmp=False)
            exp = t.expect_exit if t.expect_exit is not None else (0 if t.type == "patch" else None)
            if exp is not None and rc != exp:
                return we.ERROR
        return we.PASS if sh(task.grade_command()) == 0 else we.FAIL
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_host(tasks, n: int, c: int) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix="eval-host-", dir="/var/tmp"))
    outcomes = [None] * n
    lat = [0.0] * n

    def one(i: int) -> None:
        t0 = time.monotonic()
        outcomes[i] = host_rollout(tasks[i % len(tasks)], i, scratch)
        lat[i] = (time.monotonic() - t0) * 1000

    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(c) as pool:
            list(pool.map(one, range(n)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    wall = time.monotonic() - t0
    correct = sum(o == tasks[i % len(tasks)].expected for i, o in enumerate(outcomes))
    return {"wall_s": wall, "rate": n / wall, "correct": correct, "lat": we.percentiles(lat)}


class Daemon:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="eval-bench-", dir="/var/tmp"))
        self.sock = self.dir / "w.sock"
        log = open(self.dir / "warrend.log", "wb")
        self.proc = subprocess.Popen(
            [str(ROOT / "build/src/warrend/warrend"), "--state-dir", str(self.dir / "state"),
             "--socket", str(self.sock), "--layer-store", str(self.dir / "layers"),
             "--node-id", f"evb{os.getpid()}"], stdout=log, stderr=subprocess.STDOUT)
        self.client = warren.Client(f"unix:{self.sock}")
        for _ in range(300):
            try:
                self.client.status(timeout=1)
                break
            except warren.WarrenError:
                time.sleep(0.1)
        else:
            self.stop()
            sys.exit("warrend did not come up")

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        for line in reversed(Path("/proc/self/mountinfo").read_text().splitlines()):
            mp = line.split()[4]
            if mp.startswith(str(self.dir) + "/"):
                subprocess.run(["umount", mp], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("-c", type=int, action="append", help="warren concurrency (repeatable; default 4)")
    ap.add_argument("--baseline-c", type=int, default=None, help="host baseline concurrency "
                    "(default: the largest -c)")
    ap.add_argument("--grade", default="exec", choices=("exec", "isolated"))
    ap.add_argument("--record", action="store_true", help="append the table to bench/RESULTS.md")
    a = ap.parse_args()
    cs = a.c or [4]
    bc = a.baseline_c or max(cs)
    tasks = we.load_tasks(ROOT / "eval/tasks/more-itertools")
    for d in list(LAYERS.values()):
        if not (d.parent / (d.name + ".complete")).exists():
            sys.exit(f"{d} missing: run scripts/setup.sh")
    rows = []
    print(f"host baseline: n={a.n} c={bc} ...", file=sys.stderr)
    h = run_host(tasks, a.n, bc)
    rows.append(("host (no sandbox)", bc, h["rate"], h["correct"], h["lat"], None))
    d = Daemon()
    try:
        for name, path in LAYERS.items():
            d.client.layers.build(name, dir=str(path), timeout=900)
        for c in cs:
            print(f"warren eval: n={a.n} c={c} ...", file=sys.stderr)
            rep = we.run(d.client, tasks, n=a.n, concurrency=c, grade=a.grade,
                         progress=we.Progress(a.n))
            rs = rep.rollouts
            split = {
                "create": sum(r.create_ms for r in rs) / len(rs),
                "exec": sum(sum(r.exec_ms) for r in rs) / len(rs),
                "destroy": sum(r.destroy_ms for r in rs) / len(rs),
            }
            split["files+client"] = (sum(r.rollout_ms for r in rs) / len(rs) - split["create"]
                                     - split["exec"] - split["destroy"])
            rows.append((f"warren eval ({a.grade})", c, rep.summary["throughput_rollouts_per_s"],
                         rep.summary["correct"], rep.summary["latency_ms"]["rollout"], split))
    finally:
        d.stop()
    load = os.getloadavg()
    out = [f"## {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC — eval throughput (issue 3)",
           "",
           f"`.venv/bin/python bench/eval_throughput.py -n {a.n} " + " ".join(f"-c {c}" for c in cs) +
           f" --baseline-c {bc}{' --grade ' + a.grade if a.grade != 'exec' else ''}`: {a.n} rollouts "
           f"of the 56 more-itertools tasks (3 pytest runs each: 2 in the trajectory, 1 grading), "
           f"load average at the end {load[0]:.1f} (2 cores, shared).",
           "",
           "| row | concurrency | rollouts/s | vs host | correct | rollout p50 ms | rollout p99 ms | "
           "mean ms per rollout: create / execs / files+client / destroy |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    base = rows[0][2]
    for name, c, rate, correct, lat, split in rows:
        sp = (" / ".join(f"{split[k]:.0f}" for k in ("create", "exec", "files+client", "destroy"))
              if split else "—")
        out.append(f"| {name} | {c} | {rate:.2f} | {rate / base:.2f} | {correct}/{a.n} | "
                   f"{lat['p50']:.0f} | {lat['p99']:.0f} | {sp} |")
    text = "\n".join(out) + "\n"
    print(text)
    if a.record:
        with open(ROOT / "bench/RESULTS.md", "a") as f:
            f.write("\n" + text)
    ok = all(r[3] == a.n for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
