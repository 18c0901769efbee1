#!/usr/bin/env python3
"""Latency-class exec latency under a CPU flood on the same node, with QoS
classes (the flood is best-effort: SCHED_IDLE, cpu.shares 2) and without
(the same flood as latency class, today's behaviour), in the same run on one
warrend.

Two flood sets of --flood sandboxes each (cpu = all cores, so the quota does
not cap them), one best-effort and one latency, each running one spinning
shell loop per core. Exactly one set runs at a time (the other is paused:
frozen), alternating in ABBA blocks; during each block a latency sandbox
(cpu 1) runs --execs `true` execs back to back, and each exec's wall time
(SDK call to result) is recorded.

  .venv/bin/python bench/cluster/bench_qos.py [--flood 4] [--execs 40] [--rounds 3]

Needs a built warrend and the base rootfs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import warren

REPO = Path(__file__).resolve().parents[2]
WARREND = REPO / "build/src/warrend/warrend"
BASE_ROOTFS = Path("/var/cache/warren/rootfs/debian-12")
BASE = "base/debian-12@1"


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flood", type=int, default=4, help="sandboxes per flood set")
    ap.add_argument("--execs", type=int, default=40, help="probe execs per block")
    ap.add_argument("--rounds", type=int, default=3, help="ABBA rounds")
    args = ap.parse_args()
    cpus = os.cpu_count() or 1
    root = Path(tempfile.mkdtemp(prefix="warren-bench-qos-", dir="/var/tmp"))
    proc = None
    client = None
    try:
        sock = root / "qos.sock"
        with open(root / "warrend.log", "wb") as log:
            proc = subprocess.Popen(
                [
                    str(WARREND),
                    "--state-dir",
                    str(root / "state"),
                    "--socket",
                    str(sock),
                    "--layer-store",
                    str(root / "layers"),
                    "--node-id",
                    f"bq{os.getpid()}",
                    "--limit-views",
                    "off",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        client = warren.Client("unix:" + str(sock))
        for _ in range(600):
            if proc.poll() is not None:
                raise SystemExit(
                    "warrend exited:\n"
                    + (root / "warrend.log").read_text(errors="replace")[-2000:]
                )
            try:
                client.status(timeout=2)
                break
            except warren.WarrenError:
                time.sleep(0.1)
        client.layers.build(BASE, dir=str(BASE_ROOTFS), timeout=900)
        probe = client.create(layers=[BASE], cpu=1, memory_mb=256, timeout=120)
        sets: dict[str, list[warren.Sandbox]] = {}
        for qos in ("best-effort", "latency"):
            sets[qos] = []
            for _ in range(args.flood):
                sb = client.create(
                    layers=[BASE], qos=qos, cpu=cpus, memory_mb=128, timeout=120
                )
                for _ in range(cpus):
                    sb.spawn(["sh", "-c", "while :; do :; done"])
                sb.pause()
                sets[qos].append(sb)
        for _ in range(5):
            probe.exec("true", timeout=60)  # warm up
        times: dict[str, list[float]] = {"best-effort": [], "latency": []}
        order = ["best-effort", "latency", "latency", "best-effort"] * args.rounds
        running = None
        for qos in order:
            if running != qos:
                if running is not None:
                    for sb in sets[running]:
                        sb.pause()
                for sb in sets[qos]:
                    sb.resume()
                running = qos
                time.sleep(1.0)  # the flood at full speed before measuring
            for _ in range(args.execs):
                t0 = time.perf_counter()
                r = probe.exec("true", timeout=60)
                times[qos].append(time.perf_counter() - t0)
                assert r.exit_code == 0
        load = Path("/proc/loadavg").read_text().split()[:3]
        print(
            f"latency-class exec `true` under a CPU flood of {args.flood} sandboxes x {cpus} spinners "
            f"({cpus} cpus), ABBA x {args.rounds}, {args.execs} execs per block; loadavg at end {' '.join(load)}"
        )
        for qos, label in (
            ("best-effort", "with classes (flood best-effort)"),
            ("latency", "without (flood latency class)"),
        ):
            xs = times[qos]
            print(
                f"  {label:34s} n={len(xs)} p50 {statistics.median(xs) * 1000:7.1f} ms  "
                f"p90 {pct(xs, 90) * 1000:7.1f} ms  p99 {pct(xs, 99) * 1000:7.1f} ms  max {max(xs) * 1000:7.1f} ms"
            )
        b, l99 = pct(times["best-effort"], 99), pct(times["latency"], 99)
        print(f"  p99 without / with: {l99 / b:.1f}x")
    finally:
        if client is not None:
            try:
                for sb in client.list():
                    sb.destroy(timeout=60)
            except warren.WarrenError as e:
                print("cleanup:", e)
            client.close()
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)


if __name__ == "__main__":
    main()
