#!/usr/bin/env python3
"""E2B front end overhead: N x (create + run `true` + kill) through the
unmodified e2b SDK (pip install e2b==2.63.0) against warrend --e2b-listen,
and N x the same through warren's own SDK, on the same daemon in the same
run, alternating rows so both see the same machine state.

Starts its own warrend on a private temp state dir and layer store, builds
base/debian-12@1 from --rootfs, then stops the daemon and removes what it
made. Prints one markdown table (wall time per iteration, p50/p90).

  sudo .venv/bin/python bench/e2b/bench.py -n 20
"""
import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "sdk/python"))
import warren  # noqa: E402


def pct(xs, q):
    xs = sorted(xs)
    return xs[max(0, min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5)))]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warrend", default=str(REPO / "build/src/warrend/warrend"))
    ap.add_argument("--rootfs", default="/var/cache/warren/rootfs/debian-12")
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=1, help="alternating e2b/warren rounds of n each")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="warren-e2b-bench-", dir="/var/tmp"))
    key = secrets.token_hex(16)
    (root / "keys").write_text(key + "\n")
    port = free_port()
    sock = root / "warrend.sock"
    cmd = [args.warrend, "--state-dir", str(root / "state"), "--socket", str(sock),
           "--layer-store", str(root / "layers"), "--node-id", "eb",
           "--e2b-listen", f"127.0.0.1:{port}", "--e2b-api-keys", str(root / "keys"),
           "--fncall-layers", "base/debian-12@1"]
    log = open(root / "warrend.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        client = warren.Client("unix:" + str(sock))
        for _ in range(600):
            try:
                client.status(timeout=2)
                break
            except warren.WarrenError:
                time.sleep(0.1)
        layer = client.layers.build("base/debian-12@1", dir=args.rootfs).name
        os.environ.update(E2B_API_URL=f"http://127.0.0.1:{port}", E2B_SANDBOX_URL=f"http://127.0.0.1:{port}",
                          E2B_API_KEY=key)
        import e2b

        steps = {"create": [], "run": [], "kill": []}

        def via_e2b():
            t0 = time.monotonic()
            sb = e2b.Sandbox.create(timeout=60)
            t1 = time.monotonic()
            assert sb.commands.run("true").exit_code == 0
            t2 = time.monotonic()
            sb.kill()
            t3 = time.monotonic()
            for k, v in (("create", t1 - t0), ("run", t2 - t1), ("kill", t3 - t2)):
                steps[k].append(v * 1000)

        def via_warren():
            sb = client.create(layers=[layer], ttl_s=60)
            assert sb.exec(["/bin/bash", "-l", "-c", "true"]).exit_code == 0  # what commands.run("true") runs
            sb.destroy()

        via_e2b()  # warm-up: connection pools, layer mount
        via_warren()
        lat = {"e2b SDK": [], "warren SDK": []}
        for _ in range(args.rounds):
            for name, fn in (("e2b SDK", via_e2b), ("warren SDK", via_warren)):
                for _ in range(args.n):
                    t = time.monotonic()
                    fn()
                    lat[name].append((time.monotonic() - t) * 1000)
        print(f"| {args.n * args.rounds} x (create + run `true` + kill) | total s | ms/iter p50 | p90 |")
        print("|---|---|---|---|")
        for name, xs in lat.items():
            print(f"| {name} | {sum(xs) / 1000:.2f} | {pct(xs, 0.5):.1f} | {pct(xs, 0.9):.1f} |")
        print("e2b SDK steps, ms p50: " + ", ".join(f"{k} {pct(v, 0.5):.1f}" for k, v in steps.items()))
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


if __name__ == "__main__":
    main()
