#!/usr/bin/env python3
"""Round-trip latency of the issue-3 calls against plain exec, in one sandbox
of a running warrend, all rows interleaved in the same invocation:

  exec         sb.exec(["true"])                     (baseline, unary Exec)
  exec_stream  sb.exec_stream(["true"]).wait()       (bidi ExecStream)
  spawn_wait   sb.spawn(["true"]).wait()             (Spawn + Wait)
  session_run  session.run("true")                   (persistent bash, fd-3 sentinel)
  first_chunk  time to the first output chunk of exec_stream("echo x; sleep 1")

Usage: bench/stream_latency.py --addr unix:/path --layer base/debian-12@1 [--iterations 200]
Prints a markdown table (p50/p90/p99 in ms and p50 / exec p50).
"""
import argparse
import time

import warren


def pct(v, q):
    v = sorted(v)
    return v[max(0, min(len(v) - 1, int(q * (len(v) - 1) + 0.5)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True)
    ap.add_argument("--layer", required=True)
    ap.add_argument("--iterations", type=int, default=200)
    a = ap.parse_args()
    c = warren.Client(a.addr)
    rows = {k: [] for k in ("exec", "exec_stream", "spawn_wait", "session_run", "first_chunk")}
    with c.create(layers=[a.layer]) as sb, sb.session() as sh:
        for i in range(a.iterations):
            t = time.monotonic()
            assert sb.exec(["true"], timeout=30).exit_code == 0
            rows["exec"].append(time.monotonic() - t)
            t = time.monotonic()
            assert sb.exec_stream(["true"], timeout=30).wait().exit_code == 0
            rows["exec_stream"].append(time.monotonic() - t)
            t = time.monotonic()
            assert sb.spawn(["true"]).wait(timeout=30).exit_code == 0
            rows["spawn_wait"].append(time.monotonic() - t)
            t = time.monotonic()
            assert sh.run("true", timeout=30).exit_code == 0
            rows["session_run"].append(time.monotonic() - t)
            if i % 10 == 0:
                t = time.monotonic()
                with sb.exec_stream("echo x; sleep 1") as st:
                    for _ in st:
                        rows["first_chunk"].append(time.monotonic() - t)
                        break
    base = pct(rows["exec"], 0.5)
    print(f"iterations: {a.iterations} (first_chunk: every 10th)\n")
    print("| row | n | p50 ms | p90 ms | p99 ms | p50 / exec p50 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for k, v in rows.items():
        print(f"| {k} | {len(v)} | {pct(v, .5) * 1e3:.2f} | {pct(v, .9) * 1e3:.2f} | {pct(v, .99) * 1e3:.2f} | "
              f"{pct(v, .5) / base:.2f} |")


if __name__ == "__main__":
    main()
