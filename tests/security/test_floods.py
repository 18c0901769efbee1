"""Floods against the daemon from one sandbox (output, many files, listing
huge directories through the file API, a fork bomb, many concurrent execs)
while ANOTHER sandbox's exec round trip is measured: it stays bounded
(p50 under 10x its idle p50, floor 50 ms; no call over 5 s).

The flood runs in a process of its own (tests/security/flood_driver.py) so
that the measuring process shares no GIL or channel with it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

import warren

from .conftest import Probe, create_sandbox, exec_latencies, percentile

FLOOD_SECONDS = 5.0
DRIVER = Path(__file__).resolve().parent / "flood_driver.py"

# kind -> driver threads
FLOODS = {"output": 2, "files": 2, "list": 2, "forkbomb": 1, "concurrent": 16, "forkbomb+concurrent": 8, "all": 8}


@pytest.mark.parametrize("kind", list(FLOODS))
def test_flood_does_not_starve_another_sandbox(client: warren.Client, daemon, base_layer: str, backend: str,
                                               probe_binaries, kind: str):
    with create_sandbox(client, backend, base_layer) as victim, \
            create_sandbox(client, backend, base_layer, cpu=1, pids=256, disk_mb=512, memory_mb=768) as attacker:
        Probe(backend, attacker, probe_binaries)
        exec_latencies(victim, 5, time.monotonic() + 30)  # warm-up
        idle = exec_latencies(victim, 40, time.monotonic() + 30)
        idle_p50 = percentile(idle, 0.5)
        drv = subprocess.Popen([sys.executable, str(DRIVER), f"unix:{daemon.socket}", attacker.id, kind,
                                str(FLOOD_SECONDS), str(FLOODS[kind])],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            ready = drv.stdout.readline()
            assert "ready" in ready, (ready, drv.stderr.read() if drv.poll() is not None else "")
            time.sleep(0.5)  # let the flood ramp up
            loaded: List[float] = []
            end = time.monotonic() + FLOOD_SECONDS - 1.0
            while time.monotonic() < end:
                t0 = time.monotonic()
                r = victim.exec(["true"], timeout=30)
                loaded.append(time.monotonic() - t0)
                assert r.exit_code == 0, r
            out, err = drv.communicate(timeout=90)
        finally:
            if drv.poll() is None:
                drv.kill()
                drv.wait()
        stats = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"driver_stderr": err[-2000:]}
        loaded_p50 = percentile(loaded, 0.5)
        bound = max(10 * idle_p50, 0.05)
        print(f"flood={kind}: victim exec round trip idle p50={idle_p50 * 1e3:.1f} ms "
              f"max={max(idle) * 1e3:.1f} ms (n={len(idle)}); under flood p50={loaded_p50 * 1e3:.1f} ms "
              f"p90={percentile(loaded, 0.9) * 1e3:.1f} ms max={max(loaded) * 1e3:.1f} ms (n={len(loaded)}); "
              f"bound p50 < {bound * 1e3:.1f} ms; attacker: {stats}")
        assert drv.returncode == 0, err[-2000:]
        assert stats.get("calls", 0) > 0, stats
        assert loaded_p50 < bound, f"victim p50 {loaded_p50 * 1e3:.1f} ms >= {bound * 1e3:.1f} ms under {kind}"
        assert max(loaded) < 5.0, f"a victim exec took {max(loaded):.2f} s under {kind}"
        # The daemon still serves the attacker too.
        assert attacker.exec("echo ok", timeout=30).stdout == b"ok\n"
        client.status(timeout=10)
