"""Drives one flood against a sandbox from a process of its own (so that the
test process measuring another sandbox's latency shares no GIL or gRPC
channel with it). Usage:

  python flood_driver.py ADDR SANDBOX_ID KIND SECONDS [THREADS]

KIND: output | files | list | forkbomb | concurrent, several joined by "+"
(or "all": every kind) to run them at once; a single kind runs on THREADS
threads, in a combination "concurrent" does and the others run on one.
Prints one JSON line:
{"kind", "calls", "errors", "first_errors"}. The probe must already be in the
sandbox at /opt/warren-probe/probe.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Callable, Dict, List

import warren

PROBE = "/opt/warren-probe/probe"


def main() -> int:
    addr, sandbox_id, kind, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    threads = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    client = warren.Client(addr)
    sb = client.get(sandbox_id)
    stats: Dict[str, object] = {"kind": kind, "calls": 0, "errors": 0}
    errors: List[str] = []
    lock = threading.Lock()
    counter = [0]

    def output() -> None:
        r = sb.exec([PROBE, "flood-output", str(256 << 20)], timeout=30)
        assert len(r.stdout) <= 16 << 20

    def files() -> None:
        with lock:
            counter[0] += 1
            n = counter[0]
        r = sb.exec([PROBE, "flood-files", f"/tmp/ff{n}", "20000"], timeout=30)
        stats["files_last"] = r.stdout.decode(errors="replace").strip()

    def listing() -> None:
        for e in sb.files.list("/tmp"):
            if e.name.startswith("ff"):
                sb.files.list("/tmp/" + e.name)

    def forkbomb() -> None:
        sb.exec([PROBE, "fork-bomb", "3"], timeout=30)

    def concurrent() -> None:
        sb.exec("true", timeout=20)

    fns: Dict[str, Callable[[], None]] = {"output": output, "files": files, "list": listing,
                                          "forkbomb": forkbomb, "concurrent": concurrent}
    kinds = list(fns) if kind == "all" else kind.split("+")
    if "list" in kinds:  # something to list: 3 x 20000 files
        for i in range(3):
            sb.exec([PROBE, "flood-files", f"/tmp/ff-list{i}", "20000"], timeout=60)
    deadline = time.monotonic() + seconds

    def loop(fn: Callable[[], None]) -> None:
        while time.monotonic() < deadline:
            try:
                fn()
                with lock:
                    stats["calls"] = int(stats["calls"]) + 1  # type: ignore[arg-type]
            except warren.WarrenError as e:  # the attacker's own calls may fail; the daemon must not
                with lock:
                    stats["errors"] = int(stats["errors"]) + 1  # type: ignore[arg-type]
                    if len(errors) < 3:
                        errors.append(f"{type(e).__name__}: {e}")
                time.sleep(0.1)

    if len(kinds) > 1:
        ts = [threading.Thread(target=loop, args=(fns[k],)) for k in kinds if k != "concurrent"]
        if "concurrent" in kinds:
            ts += [threading.Thread(target=loop, args=(concurrent,)) for _ in range(threads)]
    else:
        ts = [threading.Thread(target=loop, args=(fns[kind],)) for _ in range(threads)]
    print(json.dumps({"ready": True}), flush=True)
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    stats["first_errors"] = errors
    print(json.dumps(stats), flush=True)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
