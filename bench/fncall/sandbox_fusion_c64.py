#!/usr/bin/env python3
"""SandboxFusion requests/s at concurrency 64 (issue 18), python and cpp:
the real ``sandbox-fusion`` client's ``run_code`` (one HTTP request per call,
as verl sends them) from 64 threads against warrend's ``/run_code``, beside
a baseline in the same run: the same calls through warren's SDK
(``client.fncall``, gRPC on the unix socket) from 64 threads.

Starts its own warrend on a private temp state dir, with --fncall-layers
the base rootfs dir plus the gcc toolset dir (scripts/setup.sh builds
both), warms each language's workers, runs the rows in the order
http, sdk, http, sdk (--rounds), stops the daemon and removes what it made.
Prints one line per row and the ratio http/sdk per language (median of
rounds).

  .venv/bin/python bench/fncall/sandbox_fusion_c64.py [--calls 256] [--cpp-calls 64] [--rounds 2]
Exits non-zero when a call's answer is wrong (status, stdout).
"""
from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "sdk/python"))
import sandbox_fusion  # noqa: E402

import warren  # noqa: E402

CODE = {
    "python": ("a, b = map(int, input().split())\nprint(a * b)", "6 7\n", "42\n"),
    "cpp": ("#include <iostream>\nint main(){long a, b; std::cin >> a >> b; std::cout << a * b << '\\n';}",
            "6 7\n", "42\n"),
}


def c64(n: int, conc: int, one: Callable[[], str], want: str) -> float:
    """Runs `one` n times from `conc` threads; returns calls/s; exits on a wrong answer."""
    left = [n]
    lock = threading.Lock()
    bad: List[str] = []

    def work() -> None:
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            try:
                out = one()
            except Exception as e:  # noqa: BLE001 - any failure is a wrong answer here
                out = f"{type(e).__name__}: {e}"
            if out != want:
                with lock:
                    bad.append(out)

    threads = [threading.Thread(target=work) for _ in range(conc)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=1800)
    dt = time.monotonic() - t0
    if bad:
        sys.exit(f"sandbox_fusion_c64: {len(bad)} wrong answers, e.g. {bad[:2]}")
    return n / dt


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--warrend", default=str(REPO / "build/src/warrend/warrend"))
    ap.add_argument("--rootfs", default="/var/cache/warren/rootfs/debian-12")
    ap.add_argument("--toolset", default="/var/cache/warren/rootfs/toolset-gcc")
    ap.add_argument("--calls", type=int, default=256, help="per python row")
    ap.add_argument("--cpp-calls", type=int, default=64,
                    help="per cpp row (each compiles: ~1 s of CPU; more queue past fncall's 60 s wait for a worker)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()
    for d in (args.rootfs, args.toolset):
        if not Path(d).is_dir():
            sys.exit(f"sandbox_fusion_c64: no {d} (scripts/setup.sh builds it)")
    root = Path(tempfile.mkdtemp(prefix="warren-sf-bench-", dir="/var/tmp"))
    sock = root / "warrend.sock"
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    layers = [args.rootfs, args.toolset]
    cmd = [args.warrend, "--state-dir", str(root / "state"), "--socket", str(sock), "--layer-store",
           str(root / "layers"), "--node-id", "nsfb", "--http-listen", f"127.0.0.1:{port}",
           "--fncall-layers", ",".join(layers), "--run-code-max-memory-mb", "1024"]
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
                    sys.exit(f"sandbox_fusion_c64: warrend exited: {(root / 'warrend.log').read_text()[-2000:]}")
                time.sleep(0.1)
        url = f"http://127.0.0.1:{port}"
        rates: Dict[str, List[float]] = {}
        for lang, (code, stdin, want) in CODE.items():
            def http_one() -> str:
                req = sandbox_fusion.RunCodeRequest(code=code, language=lang, stdin=stdin, compile_timeout=60,
                                                    run_timeout=10)
                r = sandbox_fusion.run_code(req, endpoint=url, max_attempts=1, client_timeout=600)
                return r.run_result.stdout if r.status == sandbox_fusion.RunStatus.Success else str(r)

            def sdk_one() -> str:
                # The same layers (one pool) and memory limit as /run_code's calls.
                r = client.fncall(code, language=lang, stdin=stdin, layers=layers, compile_timeout=60,
                                  timeout=10, memory_mb=1024)
                return r.stdout.decode() if r.ok else str(r)

            c64(args.concurrency, args.concurrency, http_one, want)  # warm-up: spawns the workers
            for _ in range(args.rounds):
                for name, one in (("http", http_one), ("sdk", sdk_one)):
                    n = args.calls if lang == "python" else args.cpp_calls
                    rate = c64(n, args.concurrency, one, want)
                    rates.setdefault(f"{lang} {name}", []).append(rate)
                    print(f"{lang:6} {name:4} c{args.concurrency}: {rate:7.1f} calls/s ({n} calls)", flush=True)
        for lang in CODE:
            h, b = statistics.median(rates[f"{lang} http"]), statistics.median(rates[f"{lang} sdk"])
            print(f"{lang}: /run_code via sandbox-fusion {h:.1f}/s, SDK fncall {b:.1f}/s, ratio {h / b:.2f}")
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
