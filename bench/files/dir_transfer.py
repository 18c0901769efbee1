#!/usr/bin/env python3
"""A directory of many small files into and out of a sandbox (issue 18's
"no directory upload/download" gap): ``files.upload_dir`` / ``download_dir``
(one tar stream each way) vs the baseline an adapter had to write, a
``files.write`` / ``files.read`` per file (and ``files.list`` to walk the
tree back), in the same run on the same sandbox.

Starts its own warrend on a private temp state dir (base layer built from
--rootfs), one sandbox, rows in the order per-file, tar, per-file, tar
(--rounds), each into a fresh directory; checks every byte came back.

  .venv/bin/python bench/files/dir_transfer.py [--files 2000] [--rounds 2]
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "sdk/python"))
import warren  # noqa: E402

BASE = "base/debian-12@1"


def make_tree(root: Path, n: int) -> Dict[str, bytes]:
    files = {}
    for i in range(n):
        rel = f"d{i % 20:02d}/f{i:05d}.txt"
        data = f"file {i}\n".encode() * (1 + i % 7)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        files[rel] = data
    return files


def walk(sb: warren.Sandbox, path: str) -> List[str]:
    out = []
    for e in sb.files.list(path):
        p = f"{path}/{e.name}"
        if e.type == "dir":
            out += walk(sb, p)
        else:
            out.append(p)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--warrend", default=str(REPO / "build/src/warrend/warrend"))
    ap.add_argument("--rootfs", default="/var/cache/warren/rootfs/debian-12")
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="warren-dirx-bench-", dir="/var/tmp"))
    sock = root / "warrend.sock"
    cmd = [args.warrend, "--state-dir", str(root / "state"), "--socket", str(sock), "--layer-store",
           str(root / "layers"), "--node-id", "ndxb"]
    log = open(root / "warrend.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        client = warren.Client("unix:" + str(sock))
        for _ in range(600):
            try:
                client.status(timeout=2)
                break
            except warren.WarrenError:
                if proc.poll() is not None:
                    sys.exit(f"dir_transfer: warrend exited: {(root / 'warrend.log').read_text()[-2000:]}")
                time.sleep(0.1)
        client.layers.build(BASE, dir=args.rootfs, timeout=900)
        src = root / "src"
        files = make_tree(src, args.files)
        rows: Dict[str, List[float]] = {}
        with client.create(layers=[BASE], ttl_s=1800, disk_mb=1024) as sb:
            for rnd in range(args.rounds):
                # per file, as adapters did before upload_dir/download_dir
                dest = f"/w/pf{rnd}"
                back = root / f"pf{rnd}"
                t0 = time.monotonic()
                for rel, data in files.items():
                    sb.files.write(f"{dest}/{rel}", data, make_parents=True)
                t1 = time.monotonic()
                for p in walk(sb, dest):
                    out = back / p[len(dest) + 1:]
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(sb.files.read(p))
                t2 = time.monotonic()
                rows.setdefault("per-file up", []).append(t1 - t0)
                rows.setdefault("per-file down", []).append(t2 - t1)
                # one tar stream each way
                dest = f"/w/tar{rnd}"
                back2 = root / f"tar{rnd}"
                t0 = time.monotonic()
                sb.files.upload_dir(str(src), dest)
                t1 = time.monotonic()
                sb.files.download_dir(dest, str(back2))
                t2 = time.monotonic()
                rows.setdefault("tar up", []).append(t1 - t0)
                rows.setdefault("tar down", []).append(t2 - t1)
                for b in (back, back2):
                    got = {str(p.relative_to(b)): p.read_bytes() for p in b.rglob("*") if p.is_file()}
                    if got != files:
                        sys.exit(f"dir_transfer: {b} differs from the source ({len(got)} of {len(files)} files)")
                print(f"round {rnd + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in rows.items()), flush=True)
        m = {k: statistics.median(v) for k, v in rows.items()}
        print(f"{args.files} files: upload per-file {m['per-file up']:.2f} s vs tar {m['tar up']:.2f} s "
              f"(ratio {m['tar up'] / m['per-file up']:.2f}); download per-file {m['per-file down']:.2f} s vs "
              f"tar {m['tar down']:.2f} s (ratio {m['tar down'] / m['per-file down']:.2f}); "
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
