"""Floods against the daemon from one sandbox (output, many files/inodes
listed through the file API, a fork bomb, many concurrent execs) while
ANOTHER sandbox's exec round trip is measured: it stays bounded."""

from __future__ import annotations

import threading
import time
from typing import Callable, List

import warren

from .conftest import PROBE_PATH, Probe, create_sandbox, exec_latencies, percentile

FLOOD_SECONDS = 8.0


def test_floods_do_not_starve_another_sandbox(client: warren.Client, base_layer: str, backend: str,
                                              probe_binaries):
    with create_sandbox(client, backend, base_layer) as victim, \
            create_sandbox(client, backend, base_layer, cpu=1, pids=256, disk_mb=512, memory_mb=768) as attacker:
        Probe(backend, attacker, probe_binaries)
        exec_latencies(victim, 5, time.monotonic() + 30)  # warm-up
        idle = exec_latencies(victim, 40, time.monotonic() + 30)
        idle_p50 = percentile(idle, 0.5)

        stop = threading.Event()
        errors: List[str] = []
        counts = {"output": 0, "files": 0, "list": 0, "forkbomb": 0, "concurrent": 0}

        def loop(name: str, fn: Callable[[], None]) -> Callable[[], None]:
            def run() -> None:
                while not stop.is_set():
                    try:
                        fn()
                        counts[name] += 1
                    except warren.WarrenError as e:  # the attacker's calls may fail; the daemon must not
                        errors.append(f"{name}: {type(e).__name__}: {e}")
                        time.sleep(0.2)
            return run

        def output() -> None:
            r = attacker.exec([PROBE_PATH, "flood-output", str(256 << 20)], timeout=20)
            assert len(r.stdout) <= 16 << 20

        def files() -> None:
            attacker.exec([PROBE_PATH, "flood-files", f"/tmp/ff{counts['files']}", "30000"], timeout=30)

        def listing() -> None:
            for e in attacker.files.list("/tmp"):
                if e.name.startswith("ff"):
                    attacker.files.list("/tmp/" + e.name)

        def forkbomb() -> None:
            attacker.exec([PROBE_PATH, "fork-bomb", "4"], timeout=30)

        def concurrent() -> None:
            attacker.exec("true", timeout=20)

        threads = [threading.Thread(target=loop("output", output)),
                   threading.Thread(target=loop("files", files)),
                   threading.Thread(target=loop("list", listing)),
                   threading.Thread(target=loop("forkbomb", forkbomb))]
        threads += [threading.Thread(target=loop("concurrent", concurrent)) for _ in range(16)]
        for t in threads:
            t.start()
        try:
            time.sleep(1.0)  # let the floods ramp up
            loaded: List[float] = []
            end = time.monotonic() + FLOOD_SECONDS
            while time.monotonic() < end:
                t0 = time.monotonic()
                r = victim.exec(["true"], timeout=30)
                loaded.append(time.monotonic() - t0)
                assert r.exit_code == 0, r
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=60)
        loaded_p50 = percentile(loaded, 0.5)
        bound = max(10 * idle_p50, 0.05)
        print(f"victim exec round trip: idle p50={idle_p50 * 1e3:.1f} ms max={max(idle) * 1e3:.1f} ms (n={len(idle)}); "
              f"under floods p50={loaded_p50 * 1e3:.1f} ms p90={percentile(loaded, 0.9) * 1e3:.1f} ms "
              f"max={max(loaded) * 1e3:.1f} ms (n={len(loaded)}); bound p50 < {bound * 1e3:.1f} ms; "
              f"attacker calls completed: {counts}; attacker errors: {len(errors)} {errors[:5]}")
        assert not any(t.is_alive() for t in threads), "a flood thread is stuck in a daemon call"
        assert loaded_p50 < bound, f"victim p50 {loaded_p50:.3f} s >= {bound:.3f} s under floods"
        assert max(loaded) < 5.0, f"a victim exec took {max(loaded):.2f} s under floods"
        assert all(counts[k] > 0 for k in ("output", "files", "forkbomb", "concurrent")), counts
        # The daemon still serves the attacker too.
        assert attacker.exec("echo ok", timeout=30).stdout == b"ok\n"
        client.status(timeout=10)
