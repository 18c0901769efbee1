"""CI form of the fault soak (tests/soak/soak.py): a few thousand seeded
cycles with every fault kind and several kill -9 restarts of warrend, on its
own daemon, bounded by a time budget (the cycles stop after
WARREN_SOAK_SECONDS, default 180; every kill still runs). WARREN_SOAK_CYCLES /
WARREN_SOAK_KILLS / WARREN_SOAK_SEED change the size; the long form is
bench/soak (python tests/soak/soak.py)."""

import json
import os

import pytest

from soak import Soak, itc


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_fault_soak(test_root, layer_store, base_layer, daemon):
    d = itc.Daemon(test_root, "soak", layer_store, itc.NODE_PREFIX + "k")
    d.start()
    try:
        soak = Soak(d, base_layer, cycles=int(os.environ.get("WARREN_SOAK_CYCLES", "1500")),
                    kills=int(os.environ.get("WARREN_SOAK_KILLS", "4")),
                    seed=int(os.environ.get("WARREN_SOAK_SEED", "19")), workers=4,
                    max_seconds=float(os.environ.get("WARREN_SOAK_SECONDS", "180")))
        rep = soak.run_reporting()
        print(json.dumps({k: v for k, v in rep.items() if k != "checkpoints"}, indent=1))
        for cp in rep["checkpoints"]:
            print(json.dumps(cp))
        assert not rep["failures"], "\n".join(rep["failures"][:50])
        assert rep["kills"] >= min(4, int(os.environ.get("WARREN_SOAK_KILLS", "4")))
        assert all(rep["faults"].get(k, 0) > 0 for k in ("create_cancel", "tiny_deadline", "stream_close",
                                                          "destroy_race", "pause_race", "fork_bomb",
                                                          "output_flood", "oom", "disk_fill", "ttl_race")), \
            rep["faults"]
    finally:
        d.stop()
