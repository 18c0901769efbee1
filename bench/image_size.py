#!/usr/bin/env python3
"""Image independence: create latency must not grow with the image size.

Starts its own warrend (private state dir), builds two stacks:
  small = [base/debian-12]                        (~156 MiB EROFS)
  large = [base/debian-12, workspace/big-<N>m]    (+ N MiB of random files)
then alternates, in the same run, create -> exec(["true"]) -> destroy on each
stack and reports create latency and whole-cycle latency (p50/p99, ms) and the
large/small ratio. Nothing copies layer data at create (the layers are shared
read-only EROFS mounts under an overlay), so the ratio should be ~1.

Usage (root, after scripts/setup.sh):
  .venv/bin/python bench/image_size.py [--big-mb 1024] [--iterations 100] [--record]
--record appends the table and the exact command to bench/RESULTS.md.
"""
import argparse
import datetime
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import warren

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOTFS = os.environ.get("WARREN_ROOTFS", "/var/cache/warren/rootfs/debian-12")


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(q * (len(xs) - 1) + 0.5)))]


def make_big_tree(path, mb):
    os.makedirs(path)
    chunk = 16 << 20
    left = mb << 20
    i = 0
    while left > 0:
        n = min(chunk, left)
        with open(os.path.join(path, f"blob{i:04d}.bin"), "wb") as f:
            f.write(os.urandom(n))
        left -= n
        i += 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--big-mb", type=int, default=1024)
    ap.add_argument("--iterations", type=int, default=100, help="per stack")
    ap.add_argument("--warrend", default=os.path.join(ROOT, "build/src/warrend/warrend"))
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="warren-bench-img-", dir="/var/tmp")
    sock = os.path.join(tmp, "w.sock")
    log = open(os.path.join(tmp, "warrend.log"), "wb")
    d = subprocess.Popen([args.warrend, "--state-dir", os.path.join(tmp, "state"), "--socket", sock,
                          "--node-id", "bimg"], stdout=log, stderr=subprocess.STDOUT)
    try:
        c = warren.Client("unix:" + sock)
        for _ in range(100):
            try:
                c.status(timeout=1)
                break
            except warren.WarrenError:
                time.sleep(0.1)
        base = c.layers.build("base/debian-12@1", dir=ROOTFS)
        src = os.path.join(tmp, "big")
        make_big_tree(src, args.big_mb)
        t0 = time.monotonic()
        big = c.layers.build(f"workspace/big-{args.big_mb}m@1", dir=src)
        build_s = time.monotonic() - t0
        shutil.rmtree(src)
        stacks = {"small": [base.name], "large": [base.name, big.name]}
        sizes = {"small": base.size_bytes, "large": base.size_bytes + big.size_bytes}
        create_ms = {k: [] for k in stacks}
        cycle_ms = {k: [] for k in stacks}
        for i in range(args.iterations * 2):
            k = "small" if i % 2 == 0 else "large"
            t0 = time.monotonic()
            sb = c.create(layers=stacks[k])
            t1 = time.monotonic()
            r = sb.exec(["cat", "/etc/debian_version"], timeout=30)
            sb.destroy()
            t2 = time.monotonic()
            assert r.exit_code == 0, r
            if i >= 4:  # warm-up: first mount of each layer
                create_ms[k].append((t1 - t0) * 1e3)
                cycle_ms[k].append((t2 - t0) * 1e3)
    finally:
        d.send_signal(signal.SIGTERM)
        d.wait(timeout=30)
        # warrend keeps layer mounts for a restart to adopt; this bench is done with them.
        with open("/proc/self/mountinfo") as f:
            mps = [ln.split()[4] for ln in f if tmp in ln.split()[4]]
        for mp in sorted(mps, reverse=True):
            subprocess.run(["umount", mp], check=False)
        shutil.rmtree(tmp, ignore_errors=True)

    rows = []
    for k in ("small", "large"):
        rows.append((k, sizes[k] / 2**20, pct(create_ms[k], .5), pct(create_ms[k], .99),
                     pct(cycle_ms[k], .5), pct(cycle_ms[k], .99)))
    ratio = rows[1][2] / rows[0][2]
    lines = ["| stack | image MiB | create p50 ms | create p99 ms | create+exec+destroy p50 ms | p99 ms |",
             "|---|---:|---:|---:|---:|---:|"]
    for k, mib, c50, c99, y50, y99 in rows:
        lines.append(f"| {k} | {mib:.0f} | {c50:.2f} | {c99:.2f} | {y50:.2f} | {y99:.2f} |")
    lines.append("")
    lines.append(f"create p50 ratio large/small = **{ratio:.2f}** "
                 f"({args.iterations} iterations per stack, interleaved; layer build of "
                 f"{args.big_mb} MiB incl. verify: {build_s:.1f} s)")
    table = "\n".join(lines)
    print(table)
    if args.record:
        now = datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC")
        cmd = "`.venv/bin/python bench/image_size.py --big-mb %d --iterations %d --record`" % (
            args.big_mb, args.iterations)
        with open(os.path.join(ROOT, "bench/RESULTS.md"), "a") as f:
            f.write(f"\n## {now} — image independence (issue 2)\n\n{platform.node()}, "
                    f"{os.cpu_count()} cpus, kernel {platform.release()}. Command: {cmd}\n\n{table}\n")
    return 0 if ratio < 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
