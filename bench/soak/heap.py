"""warrend's resident memory under big exec outputs and abandoned streams,
round after round (the daemon's heap must stay flat in steady state).

    .venv/bin/python bench/soak/heap.py [--rounds 12] [--threads 8]
    WARREN_WARREND=/path/to/other/warrend .venv/bin/python bench/soak/heap.py   # A/B

Each round: `threads` concurrent execs printing 12 MiB each (default output
cap 16 MiB: the daemon holds the whole output), `threads` exec streams
closed by their client mid-stream, then 2 s idle; prints the daemon's RSS
(and thread count) after every round as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests/soak"))
from soak import itc, proc_status  # noqa: E402

import warren  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--threads", type=int, default=8)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="warren-heap-", dir="/var/tmp"))
    (root / "layers").mkdir()
    d = itc.Daemon(root, "heap", root / "layers", f"heap{os.getpid()}")
    d.start()
    try:
        c = d.client
        c.layers.build(itc.BASE, dir=str(itc.BASE_ROOTFS), timeout=900)
        sbs = [c.create(layers=[itc.BASE]) for _ in range(4)]

        def flood(i: int) -> None:
            r = sbs[i % len(sbs)].exec("head -c 12M /dev/zero", timeout=60)
            assert r.stdout_total_bytes == 12 << 20

        def stream(i: int) -> None:
            tmp = warren.Client("unix:" + str(d.socket))
            try:
                st = tmp.get(sbs[i % len(sbs)].id).exec_stream("yes | head -c 8M; sleep 30")
                next(iter(st))
            finally:
                tmp.close()

        for rnd in range(a.rounds):
            for fn in (flood, stream):
                ts = [threading.Thread(target=fn, args=(i,)) for i in range(a.threads)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
            time.sleep(2)
            st = proc_status(d.pid)
            print(json.dumps({"round": rnd + 1, "rss_mb": round(int(st["VmRSS"].split()[0]) / 1024, 1),
                              "threads": int(st["Threads"])}), flush=True)
        for sb in sbs:
            sb.destroy()
    finally:
        d.stop()
        subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
