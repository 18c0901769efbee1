#!/usr/bin/env python3
"""Host bytes written by a snapshot of a sandbox holding a sparse file.

Starts its own warrend (private state dir under /var/tmp), builds the base
layer, creates a sandbox (default disk limit), makes a sparse file of
--size GiB in it (`truncate`, 4 bytes of data in the middle) and snapshots
it. Reports the sectors written to the block device of the state dir
(/proc/diskstats, the whole device: other writers on the host add noise),
the peak size of the staging dir, the layer size and the wall time.

Usage (root, after scripts/setup.sh and a build):
  .venv/bin/python bench/sparse_snapshot.py --size 10 [--warrend build/src/warrend/warrend]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sdk/python"))
import warren  # noqa: E402


def device_of(path: Path) -> str:
    dev = os.stat(path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    for line in Path("/proc/partitions").read_text().splitlines()[2:]:
        f = line.split()
        if len(f) == 4 and int(f[0]) == major and int(f[1]) == minor:
            name = f[3]
            # a partition's writes also show on its disk; use what is listed
            return name
    raise SystemExit(f"no block device for {path}")


def sectors_written(dev: str) -> int:
    for line in Path("/proc/diskstats").read_text().splitlines():
        f = line.split()
        if f[2] == dev:
            return int(f[9])
    raise SystemExit(f"{dev} not in /proc/diskstats")


def du(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for n in files:
            try:
                total += os.lstat(os.path.join(dirpath, n)).st_blocks * 512
            except OSError:
                pass
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=10, help="apparent size of the sparse file, GiB")
    ap.add_argument("--warrend", default=str(REPO / "build/src/warrend/warrend"))
    ap.add_argument("--rootfs", default="/var/cache/warren/rootfs/debian-12")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="warren-sparse-", dir="/var/tmp"))
    state, sock = root / "state", root / "w.sock"
    log = open(root / "warrend.log", "wb")
    d = subprocess.Popen([a.warrend, "--state-dir", str(state), "--socket", str(sock), "--node-id", "sparse"],
                         stdout=log, stderr=subprocess.STDOUT)
    try:
        c = warren.Client("unix:" + str(sock))
        for _ in range(600):
            try:
                c.status(timeout=2)
                break
            except warren.WarrenError:
                time.sleep(0.1)
        c.layers.build("base/debian-12@1", dir=a.rootfs, timeout=900)
        dev = device_of(state)
        with c.create(layers=["base/debian-12@1"]) as sb:
            r = sb.exec(f"truncate -s {a.size}G /big && printf data | "
                        f"dd of=/big bs=1 seek={a.size << 29} conv=notrunc status=none", timeout=60)
            assert r.exit_code == 0, r
            subprocess.run(["sync"], check=True)
            peak = [0]
            stop = threading.Event()

            def watch() -> None:
                while not stop.is_set():
                    peak[0] = max(peak[0], du(state / "tmp") + du(state / "layers" / "tmp"))
                    time.sleep(0.2)

            t = threading.Thread(target=watch)
            t.start()
            s0, t0 = sectors_written(dev), time.monotonic()
            try:
                snap = sb.snapshot(timeout=3600)
                err = ""
            except warren.WarrenError as e:
                snap, err = None, f"{type(e).__name__}: {e}"
            subprocess.run(["sync"], check=True)
            s1, t1 = sectors_written(dev), time.monotonic()
            stop.set()
            t.join()
        print(f"sparse file: {a.size} GiB apparent, 4 bytes of data")
        print(f"snapshot:    {'ok' if snap else err} in {t1 - t0:.1f} s")
        print(f"host writes: {(s1 - s0) * 512 / 2**20:.1f} MiB on /dev/{dev} (whole device)")
        print(f"staging:     peak {peak[0] / 2**20:.1f} MiB allocated")
        if snap:
            print(f"layer:       {snap.layer.size_bytes / 2**20:.1f} MiB ({snap.layer.digest[:19]})")
    finally:
        d.terminate()
        d.wait(timeout=60)
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            mp = line.split()[4]
            if mp.startswith(str(root) + "/"):
                subprocess.run(["umount", "-l", mp], stderr=subprocess.DEVNULL)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
