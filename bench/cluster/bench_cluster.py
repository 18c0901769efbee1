#!/usr/bin/env python3
"""Routing overhead of a cluster: create -> exec -> destroy through one entry
node of a 3-node cluster (one etcd, all on this machine) against the same
cycle on a single node, interleaved in the same run (every node shares the
machine's cores, so the ratio shows what placement and forwarding cost).

  .venv/bin/python bench/cluster/bench_cluster.py [--cycles 40]

Needs etcd (scripts/setup.sh), a built warrend and the base rootfs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(client: warren.Client, proc: subprocess.Popen, what: str, log: Path) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}:\n" + log.read_text(errors="replace")[-2000:])
        try:
            client.status(timeout=2)
            return
        except warren.WarrenError:
            time.sleep(0.1)
    raise SystemExit(f"{what} did not start")


def cycle(c: warren.Client) -> float:
    t0 = time.perf_counter()
    sb = c.create(layers=[BASE], timeout=120)
    sb.exec("true", timeout=60)
    sb.destroy(timeout=60)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=40)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="warren-bench-cluster-", dir="/var/tmp"))
    procs: list[subprocess.Popen] = []
    clients: list[warren.Client] = []
    try:
        cport, pport = free_port(), free_port()
        url = f"http://127.0.0.1:{cport}"
        peer = f"http://127.0.0.1:{pport}"
        etcd_log = open(root / "etcd.log", "wb")
        procs.append(subprocess.Popen(
            ["etcd", "--name", "b", "--data-dir", str(root / "etcd"), "--listen-client-urls", url,
             "--advertise-client-urls", url, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"b={peer}", "--listen-metrics-urls", ""],
            stdout=etcd_log, stderr=subprocess.STDOUT))
        token = root / "token"
        token.write_text("bench-cluster-token\n")
        token.chmod(0o600)
        layers = root / "layers"
        layers.mkdir()

        def start(name: str, extra: list[str]) -> warren.Client:
            sock = root / f"{name}.sock"
            log = open(root / f"{name}.log", "wb")
            p = subprocess.Popen([str(WARREND), "--state-dir", str(root / name), "--socket", str(sock),
                                  "--layer-store", str(layers), "--node-id", f"bc{os.getpid()}{name}",
                                  "--limit-views", "off", *extra], stdout=log, stderr=subprocess.STDOUT)
            procs.append(p)
            c = warren.Client("unix:" + str(sock))
            clients.append(c)
            wait_ready(c, p, name, root / f"{name}.log")
            return c

        single = start("single", [])
        single.layers.build(BASE, dir=str(BASE_ROOTFS), timeout=900)
        for _ in range(100):  # etcd up
            if subprocess.run(["etcdctl", "--endpoints", url, "endpoint", "health"], capture_output=True,
                              check=False).returncode == 0:
                break
            time.sleep(0.2)
        entry = None
        for i in range(3):
            c = start(f"n{i}", ["--listen", f"127.0.0.1:{free_port()}", "--token-file", str(token),
                                "--cluster", f"etcd={url}"])
            entry = entry or c
        assert entry is not None
        time.sleep(5)  # every node's view holds all three
        cycle(single), cycle(entry)  # warm up
        one, clu = [], []
        owners: dict[str, int] = {}
        for _ in range(args.cycles):
            one.append(cycle(single))
            t0 = time.perf_counter()
            sb = entry.create(layers=[BASE], timeout=120)
            sb.exec("true", timeout=60)
            sb.destroy(timeout=60)
            clu.append(time.perf_counter() - t0)
            owners[sb.id.rsplit("-", 1)[0]] = owners.get(sb.id.rsplit("-", 1)[0], 0) + 1
        m1, mc = statistics.median(one), statistics.median(clu)
        print(f"create->exec->destroy, {args.cycles} cycles each, interleaved:")
        print(f"  single node:            p50 {m1 * 1000:.1f} ms  ({1 / m1:.1f} cycles/s)")
        print(f"  3-node cluster (entry): p50 {mc * 1000:.1f} ms  ({1 / mc:.1f} cycles/s)")
        print(f"  ratio cluster/single (throughput): {m1 / mc:.2f}x; placed on: {sorted(owners.values())}")
    finally:
        for c in clients:
            c.close()
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)


if __name__ == "__main__":
    if not shutil.which("etcd"):
        raise SystemExit("etcd not installed (scripts/setup.sh)")
    main()
