#!/usr/bin/env python3
"""Sandbox network benchmarks (the network issue's must-show numbers), all in one run:

  * create -> exec `true` -> destroy with a network vs without, interleaved
    (target: the network costs <= 30 % of the cycle);
  * set_network latency (the RPC returns once the nftables transaction is in
    force), p50/p99;
  * a bulk download through the NAT (sandbox -> routed veth -> nftables
    chain -> masquerade) vs the host's own download of the same stream from
    the same server (target: >= 0.8x).

Self-contained: starts its own warrend (build/src/warrend/warrend, --sandbox-net
10.214.0.0/24) with a temp state dir and layer store, builds the base layer
from the debootstrapped rootfs, and builds a test "internet" (a netns behind a
veth, 203.0.113.77 routed into it) where a TCP server streams zeros. Prints a
markdown section; --append adds it to bench/RESULTS.md. Run as root:

  .venv/bin/python bench/net/bench.py [-n 30] [--changes 200] [--mib 512] [--append]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "sdk/python"))

import warren

_spec = importlib.util.spec_from_file_location("warren_it_conftest", ROOT / "tests/integration/conftest.py")
it = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(it)

SERVER = "203.0.113.77"
TRANSIT_HOST, TRANSIT_NS = "198.18.214.1", "198.18.214.2"
PORT = 9000

# Streams argv[1] MiB of zeros to each client, then closes.
STREAMER = """
import socket, sys
n = int(sys.argv[1]) << 20
buf = bytes(1 << 20)
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", %d)); srv.listen(8)
while True:
    c, _ = srv.accept()
    left = n
    while left > 0:
        k = c.send(buf[:min(left, len(buf))]); left -= k
    c.close()
""".replace("%d", str(PORT))

# Reads the stream to EOF; prints "<bytes> <seconds>".
READER = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
buf = bytearray(1 << 20); got = 0; t0 = time.perf_counter()
while True:
    k = s.recv_into(buf)
    if not k: break
    got += k
print(got, time.perf_counter() - t0)
"""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=10)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


class Internet:
    """A netns behind a veth, SERVER routed into it, a streamer on SERVER:PORT."""

    def __init__(self, mib: int):
        for prefix in (f"{TRANSIT_HOST}/30", f"{SERVER}/32"):
            used = [ln for ln in ip("-4", "route", "show", "match", prefix).stdout.splitlines()
                    if not ln.startswith("default")]
            if used:
                sys.exit(f"bench: {prefix} is routed on this host already ({used})")
        self.name = "wnb-" + uuid.uuid4().hex[:8]
        self.host_if = "wnbh" + self.name[4:10]
        self.proc = None
        ip("netns", "add", self.name)
        try:
            ip("link", "add", self.host_if, "type", "veth", "peer", "name", "eth0", "netns", self.name)
            ip("addr", "add", f"{TRANSIT_HOST}/30", "dev", self.host_if)
            ip("link", "set", self.host_if, "up")
            ip("-n", self.name, "addr", "add", f"{TRANSIT_NS}/30", "dev", "eth0")
            ip("-n", self.name, "link", "set", "eth0", "up")
            ip("-n", self.name, "link", "set", "lo", "up")
            ip("-n", self.name, "addr", "add", f"{SERVER}/32", "dev", "lo")
            ip("-n", self.name, "route", "add", "default", "via", TRANSIT_HOST)
            ip("route", "add", f"{SERVER}/32", "via", TRANSIT_NS)
            self.proc = subprocess.Popen(["ip", "netns", "exec", self.name, "python3", "-c", STREAMER, str(mib)])
            time.sleep(0.5)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        ip("route", "del", f"{SERVER}/32", check=False)
        ip("link", "del", self.host_if, check=False)
        ip("netns", "del", self.name, check=False)


def download_host() -> float:
    r = subprocess.run([sys.executable, "-c", READER, SERVER, str(PORT)], capture_output=True, text=True,
                       timeout=300, check=True)
    got, secs = r.stdout.split()
    return int(got) / float(secs)


def download_sandbox(sb: warren.Sandbox) -> float:
    r = sb.exec(["python3", "-c", READER, SERVER, str(PORT)], timeout=300)
    assert r.exit_code == 0, r.stderr
    got, secs = r.stdout.decode().split()
    return int(got) / float(secs)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=30, help="cycles of each kind")
    ap.add_argument("--changes", type=int, default=200, help="set_network calls")
    ap.add_argument("--mib", type=int, default=512, help="MiB per download")
    ap.add_argument("--downloads", type=int, default=3, help="downloads of each kind (the median is reported)")
    ap.add_argument("--append", action="store_true", help="append the section to bench/RESULTS.md")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="warren-netbench-", dir="/var/tmp"))
    (root / "layers").mkdir()
    d = it.Daemon(root, "netbench", root / "layers", it.NODE_PREFIX + "nb", extra_args=["--sandbox-net", "10.214.0.0/24"])
    net = None
    out = []
    try:
        d.start()
        c = d.client
        try:
            c.layers.get(it.BASE)
        except warren.NotFound:
            c.layers.build(it.BASE, dir=str(it.BASE_ROOTFS), timeout=900)
        net = Internet(args.mib)
        policy = {"allow": [f"tcp:{SERVER}:{PORT}"]}

        # ---- cycle with vs without, interleaved
        def cycle(network):
            t0 = time.perf_counter()
            sb = c.create(layers=[it.BASE], network=network)
            r = sb.exec(["true"], timeout=60)
            sb.destroy()
            assert r.exit_code == 0
            return (time.perf_counter() - t0) * 1000

        for _ in range(3):  # warm-up
            cycle(None)
            cycle(policy)
        plain, withnet = [], []
        for _ in range(args.n):
            plain.append(cycle(None))
            withnet.append(cycle(policy))
        p50p, p50n = statistics.median(plain), statistics.median(withnet)
        mp, mn = statistics.mean(plain), statistics.mean(withnet)

        # ---- policy change latency
        with c.create(layers=[it.BASE], network=policy) as sb:
            lat = []
            for i in range(args.changes):
                p = policy if i % 2 else {"allow": [], "deny": []}
                t0 = time.perf_counter()
                sb.set_network(p)
                lat.append((time.perf_counter() - t0) * 1000)
            sb.set_network(policy)
            # ---- bulk download: host vs sandbox, alternating
            host, nat = [], []
            for _ in range(args.downloads):
                host.append(download_host())
                nat.append(download_sandbox(sb))
            traffic = sb.info().traffic
        hm, nm = statistics.median(host), statistics.median(nat)

        cpus = os.cpu_count()
        load = Path("/proc/loadavg").read_text().split()[:3]
        out.append(f"## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} — sandbox network (issue 16)\n")
        out.append(f"- command: `.venv/bin/python bench/net/bench.py -n {args.n} --changes {args.changes} "
                   f"--mib {args.mib} --downloads {args.downloads}`")
        out.append(f"- host: {cpus} CPUs, load {' '.join(load)} at the end; own warrend (release build), "
                   f"--sandbox-net 10.214.0.0/24; server in a netns behind a veth (203.0.113.77)")
        out.append("")
        out.append("| measure | without network | with network | ratio |")
        out.append("|---|---|---|---|")
        out.append(f"| create→exec true→destroy p50 (ms), n={args.n} each, interleaved | {p50p:.1f} | {p50n:.1f} | "
                   f"**+{(p50n / p50p - 1) * 100:.0f} %** |")
        out.append(f"| same, mean (ms) | {mp:.1f} | {mn:.1f} | +{(mn / mp - 1) * 100:.0f} % |")
        out.append(f"| bulk download {args.mib} MiB, median of {args.downloads} (MiB/s): host's own vs sandbox via NAT |"
                   f" {hm / 2**20:.0f} | {nm / 2**20:.0f} | **{nm / hm:.2f}×** |")
        out.append("")
        out.append(f"- set_network (RPC round trip; the nftables transaction is in force when it returns), "
                   f"n={args.changes}: p50 {pct(lat, 50):.2f} ms, **p99 {pct(lat, 99):.2f} ms**, "
                   f"max {max(lat):.2f} ms")
        out.append(f"- downloads each way (MiB/s): host {[round(x / 2**20) for x in host]}, "
                   f"sandbox {[round(x / 2**20) for x in nat]}; the sandbox's traffic after them: {traffic}")
        text = "\n".join(out) + "\n"
        print(text)
        if args.append:
            res = ROOT / "bench/RESULTS.md"
            body = res.read_text()
            # Newest first, after the summary section (the first "## " after the title's).
            first = body.index("\n## ", body.index("\n## ") + 1)
            res.write_text(body[:first + 1] + text + "\n" + body[first + 1:])
        return 0
    finally:
        if net is not None:
            net.close()
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
        it._kill_leftover_sandboxes(root)
        it._unmount_under(root)
        m = re.search(r"nft_table[=\":\s]+\"?(warren_[0-9a-f]{1,4})", d.log_path.read_text(errors="replace"))
        if m:  # the daemon's base table stays while its state dir exists
            subprocess.run(["nft", "delete", "table", "inet", m.group(1)], check=False, capture_output=True)
        subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)


if __name__ == "__main__":
    sys.exit(main())
