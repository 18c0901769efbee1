#!/usr/bin/env python3
"""warren row of the baseline table: create -> exec true -> destroy through
the Python SDK, `concurrency` sandboxes in flight at a time.

Latency of one iteration = create + exec(["true"]) + destroy, as a client
sees it. Retryable refusals (ResourceExhausted: admission is full) are
retried after a short back-off and counted; the back-off is part of that
iteration's latency, as it would be for a trainer.

--async drives the same cycle from one asyncio event loop through
warren.AsyncClient (`concurrency` coroutines in flight), the way a trainer
with many rollouts in flight in one process would; the default is the sync
Client with one thread per in-flight sandbox.

Prints one JSON object on the last stdout line, the same fields as
raw_floor/peer_loop, plus "concurrency", "retries" and the create RPC's own
latency ("create_p50_us", "create_p99_us"); with $BENCH_SAMPLES
set, every latency (µs, one a line) is appended to that file. Exit status 0
only if every iteration's `true` exited 0.
"""
import argparse
import asyncio
import json
import os
import sys
import threading
import time

import warren


def percentile(sorted_us, q):
    i = int(q * (len(sorted_us) - 1) + 0.5)
    return sorted_us[max(0, min(len(sorted_us) - 1, i))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True, help="warrend address (unix:/path)")
    ap.add_argument("--layer", required=True, help="base layer ref, e.g. base/debian-12@1")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--max-seconds", type=float, default=60)
    ap.add_argument("--async", dest="use_async", action="store_true",
                    help="one event loop with warren.AsyncClient instead of one thread per sandbox")
    args = ap.parse_args()
    if args.concurrency < 1 or args.iterations < 1:
        sys.exit("warren_loop: --concurrency and --iterations must be >= 1")
    if args.use_async:
        return asyncio.run(main_async(args))

    client = warren.Client(args.addr)
    name = f"warren_c{args.concurrency}"
    lock = threading.Lock()
    lat_us, create_us, errors = [], [], []
    state = {"issued": 0, "retries": 0}

    def one():
        t0 = time.monotonic()
        for attempt in range(200):  # bounded: ~10 s of back-off at most
            try:
                sb = client.create(layers=[args.layer], timeout=60)
                c_us = (time.monotonic() - t0) * 1e6
                break
            except warren.ResourceExhausted:
                with lock:
                    state["retries"] += 1
                time.sleep(min(0.05, 0.002 * (attempt + 1)))
        else:
            raise RuntimeError("create: ResourceExhausted 200 times in a row")
        try:
            r = sb.exec(["true"], timeout=30)
            if r.exit_code != 0:
                raise RuntimeError(f"exec true in {sb.id}: exit {r.exit_code} signal {r.signal}")
        finally:
            sb.destroy()
        return (time.monotonic() - t0) * 1e6, c_us

    def worker(deadline):
        while True:
            with lock:
                if errors or state["issued"] >= args.iterations or time.monotonic() > deadline:
                    return
                state["issued"] += 1
            try:
                us, c_us = one()
            except Exception as e:  # noqa: BLE001 - reported, stops the run
                with lock:
                    errors.append(f"{type(e).__name__}: {e}")
                return
            with lock:
                lat_us.append(us)
                create_us.append(c_us)

    # Untimed warm-up (layer mount, first-use costs).
    try:
        one()
    except Exception as e:  # noqa: BLE001
        print(f"warren_loop: warm-up failed: {type(e).__name__}: {e}", file=sys.stderr)
        print(json.dumps({"name": name, "ok": False, "iterations": 0}, separators=(",", ":")))
        return 1
    start = time.monotonic()
    threads = [threading.Thread(target=worker, args=(start + args.max_seconds,))
               for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    client.close()
    return report(name, args, lat_us, create_us, elapsed, state["retries"], errors)


def report(name, args, lat_us, create_us, elapsed, retries, errors):
    """Prints the run's JSON line (ok false on any error); the exit status."""
    if errors or not lat_us:
        for e in errors[:5]:
            print(f"warren_loop: {e}", file=sys.stderr)
        print(json.dumps({"name": name, "ok": False, "iterations": len(lat_us)}, separators=(",", ":")))
        return 1
    samples = os.environ.get("BENCH_SAMPLES")
    if samples:  # every latency (µs, one a line), merged over rounds by the driver
        with open(samples, "a") as f:
            f.write("".join(f"{us:.0f}\n" for us in lat_us))
    lat_us.sort()
    print(json.dumps({
        "name": name, "ok": True, "iterations": len(lat_us), "seconds": round(elapsed, 3),
        "rate": round(len(lat_us) / elapsed, 2), "p50_us": round(percentile(lat_us, 0.5)),
        "p90_us": round(percentile(lat_us, 0.9)), "p99_us": round(percentile(lat_us, 0.99)),
        "max_us": round(lat_us[-1]), "concurrency": args.concurrency,
        "retries": retries,
        # the create RPC alone, as the client sees it (issue 3's create latency target)
        "create_p50_us": round(percentile(sorted(create_us), 0.5)),
        "create_p99_us": round(percentile(sorted(create_us), 0.99))}, separators=(",", ":")))
    return 0


async def main_async(args):
    """The same cycle and report as main(), from one event loop."""
    client = warren.AsyncClient(args.addr)
    name = f"warren_c{args.concurrency}_async"
    lat_us, create_us, errors = [], [], []
    state = {"issued": 0, "retries": 0}

    async def one():
        t0 = time.monotonic()
        for attempt in range(200):  # bounded, as in main()
            try:
                sb = await client.create(layers=[args.layer], timeout=60)
                c_us = (time.monotonic() - t0) * 1e6
                break
            except warren.ResourceExhausted:
                state["retries"] += 1
                await asyncio.sleep(min(0.05, 0.002 * (attempt + 1)))
        else:
            raise RuntimeError("create: ResourceExhausted 200 times in a row")
        try:
            r = await sb.exec(["true"], timeout=30)
            if r.exit_code != 0:
                raise RuntimeError(f"exec true in {sb.id}: exit {r.exit_code} signal {r.signal}")
        finally:
            await sb.destroy()
        return (time.monotonic() - t0) * 1e6, c_us

    async def worker(deadline):
        while not errors and state["issued"] < args.iterations and time.monotonic() <= deadline:
            state["issued"] += 1
            try:
                us, c_us = await one()
            except Exception as e:  # noqa: BLE001 - reported, stops the run
                errors.append(f"{type(e).__name__}: {e}")
                return
            lat_us.append(us)
            create_us.append(c_us)

    try:
        await one()  # untimed warm-up
    except Exception as e:  # noqa: BLE001
        print(f"warren_loop: warm-up failed: {type(e).__name__}: {e}", file=sys.stderr)
        print(json.dumps({"name": name, "ok": False, "iterations": 0}, separators=(",", ":")))
        await client.close()
        return 1
    start = time.monotonic()
    await asyncio.gather(*(worker(start + args.max_seconds) for _ in range(args.concurrency)))
    elapsed = time.monotonic() - start
    await client.close()
    return report(name, args, lat_us, create_us, elapsed, state["retries"], errors)


if __name__ == "__main__":
    sys.exit(main())
