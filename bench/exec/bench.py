#!/usr/bin/env python3
"""Exec round-trip latency of `true` in a running sandbox, through the SDK,
against same-run baselines (issue 3: "exec round-trip latency for true").

Rows, interleaved in rounds so that load changes hit every row alike:
  host_spawn     subprocess.run(["true"]) on the host from this Python
                 process: fork/exec/wait of a process, no sandbox, no RPC
  grpc_status    client.status(): one gRPC round trip to warrend, no process
  warren_exec    sb.exec(["true"]): RPC + spawn into the sandbox's namespaces,
                 cgroups, seccomp, caps + wait + result

Usage (a warrend must be running; the base layer must exist):
  bench/exec/bench.py --addr unix:/path/warrend.sock [--layer base/debian-12@1]
                      [--iterations 600] [--rounds 3] [--record]
With --record, a section is appended to bench/RESULTS.md (with this command).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import warren

ROOT = Path(__file__).resolve().parents[2]


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, max(0, int(q * (len(v) - 1) + 0.5)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True)
    ap.add_argument("--layer", default="base/debian-12@1")
    ap.add_argument("--iterations", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=120)
    ap.add_argument("--record", action="store_true")
    a = ap.parse_args()
    if a.iterations < a.rounds or a.rounds < 1:
        sys.exit("exec bench: --iterations must be >= --rounds >= 1")
    c = warren.Client(a.addr)
    sb = c.create(layers=[a.layer], labels={"bench": "exec"})
    rows = {"host_spawn": [], "grpc_status": [], "warren_exec": []}
    fns = {
        "host_spawn": lambda: subprocess.run(["true"], check=True),
        "grpc_status": lambda: c.status(timeout=10),
        "warren_exec": lambda: sb.exec(["true"], timeout=10),
    }
    load0 = os.getloadavg()
    t_end = time.monotonic() + a.max_seconds
    try:
        for _ in range(3):  # warm-up
            for f in fns.values():
                f()
        per = a.iterations // a.rounds
        for _ in range(a.rounds):
            for name, f in fns.items():
                for _ in range(per):
                    if time.monotonic() > t_end:
                        break
                    t = time.perf_counter()
                    r = f()
                    rows[name].append((time.perf_counter() - t) * 1e3)
                    if name == "warren_exec" and r.exit_code != 0:
                        sys.exit(f"exec true exited {r.exit_code}")
    finally:
        sb.destroy()
    load1 = os.getloadavg()
    base = statistics.median(rows["host_spawn"])
    lines = ["| row | n | p50 ms | p90 ms | p99 ms | p50 / host_spawn |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, v in rows.items():
        lines.append(f"| {name} | {len(v)} | {statistics.median(v):.2f} | {pct(v, .9):.2f} | {pct(v, .99):.2f} | "
                     f"{statistics.median(v) / base:.2f} |")
    table = "\n".join(lines)
    print(table)
    if a.record:
        cmd = "bench/exec/bench.py " + " ".join(sys.argv[1:])
        with open(ROOT / "bench/RESULTS.md", "a") as f:
            f.write(f"\n## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} — exec round trip (issue 3)\n\n"
                    f"- command: `{cmd}`\n"
                    f"- machine: kernel {os.uname().release}, nproc {os.cpu_count()}; load average before/after: "
                    f"{' '.join(f'{x:.2f}' for x in load0)} / {' '.join(f'{x:.2f}' for x in load1)}\n\n"
                    f"{table}\n")


if __name__ == "__main__":
    main()
