#!/usr/bin/env python3
"""Lifecycle benchmarks (issue 4): pause/resume latency, pause/resume of N
sandboxes, snapshot time vs upper size, fork(n) time, host memory around a
mass pause. Talks to a running warrend (--addr) whose layer store holds
--base. Prints a markdown section; --append adds it to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "sdk/python"))

import warren  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def mem_available_mib() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True)
    ap.add_argument("--base", default="base/debian-12@1")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--many", type=int, default=50, help="sandboxes paused/resumed together")
    ap.add_argument("--many-mb", type=int, default=20, help="MB held by a shell in each of --many")
    ap.add_argument("--sizes-mb", default="1,10,100")
    ap.add_argument("--fork", type=int, default=8)
    ap.add_argument("--append", action="store_true")
    a = ap.parse_args()
    c = warren.Client(a.addr)
    rows = []
    load0 = open("/proc/loadavg").read().split()[:3]

    with c.create(layers=[a.base]) as sb:
        sb.exec("nohup sh -c 'while true; do sleep 0.01; done' >/dev/null 2>&1 &")
        p, r = [], []
        for _ in range(a.rounds):
            t = time.perf_counter(); sb.pause(); p.append(time.perf_counter() - t)
            t = time.perf_counter(); sb.resume(); r.append(time.perf_counter() - t)
        rows.append(("pause (1 sandbox, RPC)", a.rounds, pct(p, 50), pct(p, 90), pct(p, 99)))
        rows.append(("resume (1 sandbox, RPC)", a.rounds, pct(r, 50), pct(r, 90), pct(r, 99)))

    job = c.job(f"bench-{os.getpid()}")
    sbs = [c.create(layers=[a.base], job=job.name) for _ in range(a.many)]
    try:
        for s in sbs:
            s.exec(f"nohup sh -c 'x=$(head -c {a.many_mb * 1000000} /dev/zero | tr \\\\0 x); sleep 100000' "
                   ">/dev/null 2>&1 &")
        time.sleep(1)
        m0 = mem_available_mib()
        t = time.perf_counter()
        for s in sbs:
            s.pause()
        tp = time.perf_counter() - t
        m1 = mem_available_mib()
        t = time.perf_counter()
        for s in sbs:
            s.resume()
        tr = time.perf_counter() - t
        t = time.perf_counter()
        assert job.suspend() == a.many
        tjs = time.perf_counter() - t
        t = time.perf_counter()
        assert job.resume() == a.many
        tjr = time.perf_counter() - t
    finally:
        for s in sbs:
            s.destroy()
    many = (a.many, tp, tr, m0, m1, tjs, tjr)

    snaps = []
    for mb in [int(x) for x in a.sizes_mb.split(",")]:
        with c.create(layers=[a.base], disk_mb=max(1024, 2 * mb), memory_mb=max(2048, 3 * mb)) as sb:
            sb.exec(f"mkdir -p /w && head -c {mb << 20} /dev/urandom > /w/blob && "
                    "for i in $(seq 1 200); do echo $i > /w/f$i; done", timeout=600)
            t = time.perf_counter()
            snap = sb.snapshot()
            ts = time.perf_counter() - t
            t = time.perf_counter()
            kids = sb.fork(a.fork)
            tf = time.perf_counter() - t
            for k in kids:
                k.destroy()
            c.layers.remove(snap.layer.digest) if False else None
            snaps.append((mb, ts, snap.layer.size_bytes, tf))

    load1 = open("/proc/loadavg").read().split()[:3]
    out = [f"\n## {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC — lifecycle (issue 4)\n",
           f"- command: `bench/lifecycle/bench.py --addr {a.addr} --rounds {a.rounds} --many {a.many} "
           f"--many-mb {a.many_mb} --sizes-mb {a.sizes_mb} --fork {a.fork}`",
           f"- machine: kernel {os.uname().release}, nproc {os.cpu_count()}; load average before/after: "
           f"{' '.join(load0)} / {' '.join(load1)}",
           "- cgroup freezer (v1 freezer.state / v2 cgroup.freeze); times are end-to-end through the Python SDK\n",
           "| op | n | p50 ms | p90 ms | p99 ms |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, n, p50, p90, p99 in rows:
        out.append(f"| {name} | {n} | {p50 * 1e3:.2f} | {p90 * 1e3:.2f} | {p99 * 1e3:.2f} |")
    n, tp, tr, m0, m1, tjs, tjr = many
    out += ["", f"- pause of {n} sandboxes (sequential RPCs, each running a {a.many_mb} MB shell process): "
            f"{tp * 1e3:.0f} ms total ({tp / n * 1e3:.2f} ms each); resume: {tr * 1e3:.0f} ms "
            f"({tr / n * 1e3:.2f} ms each); host MemAvailable {m0} MiB before, {m1} MiB while paused "
            "(pause alone frees no memory: suspend with reclaim is not implemented, the host has no swap)",
            f"- job.suspend() of the same {n} sandboxes (one RPC): {tjs * 1e3:.0f} ms; job.resume(): {tjr * 1e3:.0f} ms", "",
            "| upper size | snapshot s | layer bytes | fork(%d) s |" % a.fork, "| ---: | ---: | ---: | ---: |"]
    for mb, ts, size, tf in snaps:
        out.append(f"| {mb} MiB + 200 small files | {ts:.2f} | {size} | {tf:.2f} |")
    text = "\n".join(out) + "\n"
    print(text)
    if a.append:
        with open(ROOT / "bench/RESULTS.md", "a") as f:
            f.write(text)


if __name__ == "__main__":
    main()
