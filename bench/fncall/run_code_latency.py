#!/usr/bin/env python3
"""Sequential /run_code latency over one keep-alive HTTP connection (as a
SandboxFusion client with a session sends it): `print(1)` in python, 60 calls,
the first 10 dropped as warm-up; prints p50/p90 in ms.

  bench/fncall/run_code_latency.py --port PORT   # a warrend started with --http-listen 127.0.0.1:PORT
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--calls", type=int, default=60)
    args = ap.parse_args()
    if args.calls <= 10:
        sys.exit("run_code_latency: --calls must be > 10")
    conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=60)
    body = json.dumps({"code": "print(1)", "language": "python"})
    lat = []
    for _ in range(args.calls):
        t0 = time.perf_counter()
        conn.request("POST", "/run_code", body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        lat.append((time.perf_counter() - t0) * 1000)
        if r.status != 200 or json.loads(data)["status"] != "Success":
            sys.exit(f"run_code_latency: unexpected answer {r.status}: {data[:200]!r}")
    lat = sorted(lat[10:])
    print(f"run_code_keepalive p50={lat[len(lat) // 2]:.1f} ms p90={lat[int(len(lat) * 0.9)]:.1f} ms n={len(lat)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
