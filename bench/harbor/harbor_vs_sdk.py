#!/usr/bin/env python3
"""A Harbor task through warren's Harbor provider vs the same task through
warren's SDK directly (issue 18's benchmark; Harbor's docker environment
cannot run here: no Docker engine).

The task (Harbor's task layout): a prebuilt ``docker_image`` mapped to the
base layer, ``environment/`` uploaded to the workdir, an oracle
``solution/solve.sh`` and a verifier ``tests/test.sh`` writing
``/logs/verifier/reward.txt``.

Rows, in the order harbor, sdk, harbor, sdk (--rounds):
  * harbor: ``harbor run -p TASK -a oracle --env
    warren.integrations.harbor:WarrenEnvironment -k TRIALS -n 1`` (the
    pinned harbor in .venv-harness); per trial the time Harbor recorded in
    its result.json (started_at -> finished_at: environment start, oracle,
    verifier, stop), and the whole command's wall time (Harbor's CLI start
    and job bookkeeping included).
  * sdk: the same steps as a trial with warren's SDK, one after the other:
    create from the layer, make /logs/{agent,verifier}, upload environment/
    to the workdir, upload solution/ and run solve.sh there, upload tests/
    and run test.sh, read the reward, destroy.
Every trial must earn reward 1. Prints per row the p50 per trial and the
wall time, then the ratios harbor/sdk (median of rounds).

Starts its own warrend on a private temp state dir (base layer built from
--rootfs), stops it and removes what it made.

  .venv/bin/python bench/harbor/harbor_vs_sdk.py [--trials 10] [--rounds 2]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "sdk/python"))
import warren  # noqa: E402

BASE = "base/debian-12@1"
IMAGE = "warren-bench/plain:1"
WORKDIR = "/srv/task"
TASK_TOML = f"""schema_version = "1.4"
[verifier]
timeout_sec = 120.0
[agent]
timeout_sec = 120.0
[environment]
build_timeout_sec = 300.0
network_mode = "no-network"
docker_image = "{IMAGE}"
workdir = "{WORKDIR}"
"""
SOLVE = "#!/bin/bash\nset -e\ntr a-z A-Z < seed.txt > out.txt\n"
TEST = ("#!/bin/bash\nif [ \"$(cat /srv/task/out.txt)\" = SEED ]; then echo 1; else echo 0; fi"
        " > /logs/verifier/reward.txt\n")


def write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def make_task(root: Path) -> Path:
    t = root / "task"
    write(t / "task.toml", TASK_TOML)
    write(t / "instruction.md", "Copy seed.txt to out.txt, upper-cased.\n")
    write(t / "environment" / "seed.txt", "seed\n")
    write(t / "solution" / "solve.sh", SOLVE, 0o755)
    write(t / "tests" / "test.sh", TEST, 0o755)
    return t


def ts(s: str) -> float:
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


PHASES = ("environment_setup", "agent_setup", "agent_execution", "verifier")


def harbor_row(py: str, task: Path, jobs: Path, name: str, addr: str,
               trials: int) -> Tuple[List[float], float, Dict[str, float]]:
    images = json.dumps({IMAGE: [BASE]})
    cmd = [py, "-m", "harbor.cli.main", "run", "-p", str(task), "-a", "oracle", "--env",
           "warren.integrations.harbor:WarrenEnvironment", "--ek", f"addr={addr}", "--ek", f"images={images}",
           "-o", str(jobs), "--job-name", name, "-k", str(trials), "-n", "1", "-y"]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=jobs,
                       env={**os.environ, "NO_COLOR": "1"})
    wall = time.monotonic() - t0
    per: List[float] = []
    phases: Dict[str, List[float]] = {p: [] for p in PHASES}
    for f in sorted((jobs / name).glob("*/result.json")):
        res = json.loads(f.read_text())
        reward = ((res.get("verifier_result") or {}).get("rewards") or {}).get("reward")
        if reward != 1 or res.get("exception_info"):
            sys.exit(f"harbor_vs_sdk: trial {f.parent.name} reward {reward}: {res.get('exception_info')}")
        per.append(ts(res["finished_at"]) - ts(res["started_at"]))
        for p in PHASES:
            if res.get(p):
                phases[p].append(ts(res[p]["finished_at"]) - ts(res[p]["started_at"]))
    if len(per) != trials:
        sys.exit(f"harbor_vs_sdk: {len(per)} of {trials} trials (exit {r.returncode}):\n{r.stdout[-2000:]}\n"
                 f"{r.stderr[-2000:]}")
    return per, wall, {p: statistics.median(v) for p, v in phases.items() if v}


def sdk_trial(client: warren.Client, task: Path) -> float:
    t0 = time.monotonic()
    with client.create(layers=[BASE], ttl_s=600, labels={"bench": "harbor-sdk"}) as sb:
        sb.exec(["mkdir", "-p", "/logs/agent", "/logs/verifier", WORKDIR], timeout=60)
        sb.files.upload_dir(str(task / "environment"), WORKDIR)
        sb.files.upload_dir(str(task / "solution"), "/solution")
        r = sb.exec(["bash", "/solution/solve.sh"], cwd=WORKDIR, timeout=120, merge_stderr=True)
        if r.exit_code != 0:
            sys.exit(f"harbor_vs_sdk: solve.sh: {r}")
        sb.files.upload_dir(str(task / "tests"), "/tests")
        r = sb.exec(["bash", "/tests/test.sh"], cwd=WORKDIR, timeout=120, merge_stderr=True)
        reward = sb.files.read("/logs/verifier/reward.txt").strip()
        if r.exit_code != 0 or reward != b"1":
            sys.exit(f"harbor_vs_sdk: test.sh: {r}, reward {reward!r}")
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--warrend", default=str(REPO / "build/src/warrend/warrend"))
    ap.add_argument("--rootfs", default="/var/cache/warren/rootfs/debian-12")
    ap.add_argument("--harness-python", default=str(REPO / ".venv-harness/bin/python"))
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if not Path(args.rootfs).is_dir():
        sys.exit(f"harbor_vs_sdk: no {args.rootfs} (scripts/setup.sh builds it)")
    if subprocess.run([args.harness_python, "-c", "import harbor"], capture_output=True).returncode != 0:
        sys.exit(f"harbor_vs_sdk: no harbor in {args.harness_python} (scripts/setup.sh: harness venv)")
    root = Path(tempfile.mkdtemp(prefix="warren-harbor-bench-", dir="/var/tmp"))
    sock = root / "warrend.sock"
    cmd = [args.warrend, "--state-dir", str(root / "state"), "--socket", str(sock), "--layer-store",
           str(root / "layers"), "--node-id", "nhbb"]
    log = open(root / "warrend.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        addr = "unix:" + str(sock)
        client = warren.Client(addr)
        for _ in range(600):
            try:
                client.status(timeout=2)
                break
            except warren.WarrenError:
                if proc.poll() is not None:
                    sys.exit(f"harbor_vs_sdk: warrend exited: {(root / 'warrend.log').read_text()[-2000:]}")
                time.sleep(0.1)
        client.layers.build(BASE, dir=args.rootfs, timeout=900)
        task = make_task(root)
        jobs = root / "jobs"
        jobs.mkdir()
        sdk_trial(client, task)  # warm-up: the layer's mount, the page cache
        rows: Dict[str, List[Tuple[float, float]]] = {"harbor": [], "sdk": []}
        for rnd in range(args.rounds):
            per, wall, phases = harbor_row(args.harness_python, task, jobs, f"r{rnd}", addr, args.trials)
            rows["harbor"].append((statistics.median(per), wall))
            print(f"harbor: p50 {statistics.median(per) * 1000:7.0f} ms/trial (min {min(per) * 1000:.0f},"
                  f" max {max(per) * 1000:.0f}), wall {wall:6.1f} s for {args.trials} trials; phases (p50 ms): "
                  + ", ".join(f"{p} {v * 1000:.0f}" for p, v in phases.items()), flush=True)
            t0 = time.monotonic()
            per = [sdk_trial(client, task) for _ in range(args.trials)]
            wall = time.monotonic() - t0
            rows["sdk"].append((statistics.median(per), wall))
            print(f"sdk:    p50 {statistics.median(per) * 1000:7.0f} ms/trial (min {min(per) * 1000:.0f},"
                  f" max {max(per) * 1000:.0f}), wall {wall:6.1f} s for {args.trials} trials", flush=True)
        h = [statistics.median(x[i] for x in rows["harbor"]) for i in (0, 1)]
        s = [statistics.median(x[i] for x in rows["sdk"]) for i in (0, 1)]
        print(f"harbor/sdk: per trial (p50) {h[0] / s[0]:.2f}, wall {h[1] / s[1]:.2f}; "
              f"load {os.getloadavg()[0]:.1f}")
        client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for line in reversed(open("/proc/self/mountinfo").read().splitlines()):
            mp = line.split()[4]
            if mp.startswith(str(root)):
                subprocess.run(["umount", "-l", mp], check=False)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
