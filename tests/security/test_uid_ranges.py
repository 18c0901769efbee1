"""Hole class 9 (uid ranges): two warrend daemons on one host must never
hand out overlapping host uid ranges (root inside each sandbox is host uid
uid_base + slot*65536): sandboxes of two daemons sharing ids could signal
each other's processes and share their files. Claims are host-wide (lock
files under /run/warren/uid-slots, src/runtime/container/uid_slots.h) and
outlive the daemon with its sandboxes: a restarted daemon re-adopts its
sandboxes with their same ranges, and the other daemon never takes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Tuple

import pytest

import warren
from warren_integration_conftest import Daemon

RANGE = 65536


def uid_range(sb: warren.Sandbox) -> Tuple[int, int]:
    """(first host uid, count) of root inside sb, from its /proc/self/uid_map."""
    r = sb.exec("cat /proc/self/uid_map /proc/self/gid_map", timeout=30)
    assert r.exit_code == 0, r.stderr
    rows = [l.split() for l in r.stdout.decode().splitlines() if l.strip()]
    assert len(rows) == 2 and rows[0] == rows[1], rows  # uid and gid maps alike
    inside, host, count = map(int, rows[0])
    assert inside == 0
    return host, count


def assert_disjoint(ranges: Dict[str, Tuple[int, int]]) -> None:
    spans = sorted((h, h + n, sid) for sid, (h, n) in ranges.items())
    for (a0, a1, sa), (b0, b1, sb_) in zip(spans, spans[1:]):
        assert a1 <= b0, f"{sa} [{a0}, {a1}) overlaps {sb_} [{b0}, {b1})"


@pytest.mark.timeout(600)
def test_two_daemons_hand_out_disjoint_ranges_across_restarts(test_root: Path, layer_store: Path,
                                                              base_layer: str) -> None:
    flags = ["--warm-shells", "1", "--fncall-max-workers", "1"]
    a = Daemon(test_root, "uid-a", layer_store, "ua", extra_args=flags).start()
    b = Daemon(test_root, "uid-b", layer_store, "ub", extra_args=flags).start()
    mine: Dict[str, List[warren.Sandbox]] = {"a": [], "b": []}
    try:
        ranges: Dict[str, Tuple[int, int]] = {}
        for i in range(3):  # interleaved: both daemons start from their lowest free slot
            for name, d in (("a", a), ("b", b)):
                sb = d.client.create(layers=[base_layer], memory_mb=256, disk_mb=256)
                mine[name].append(sb)
                ranges[f"{name}/{sb.id}"] = uid_range(sb)
        assert all(n == RANGE for _, n in ranges.values()), ranges
        assert_disjoint(ranges)
        a_before = {sb.id: ranges[f"a/{sb.id}"] for sb in mine["a"]}

        # a dies; its sandboxes keep running with their ranges. b must not
        # hand those out while a is gone.
        a.kill9()
        for _ in range(3):
            sb = b.client.create(layers=[base_layer], memory_mb=256, disk_mb=256)
            mine["b"].append(sb)
            ranges[f"b/{sb.id}"] = uid_range(sb)
        assert_disjoint(ranges)

        # a restarts on its state dir: it re-adopts its sandboxes with the
        # same ranges and gives new ones ranges b does not use.
        a2 = Daemon(test_root, "uid-a", layer_store, "ua", state_dir=a.state_dir, extra_args=flags).start()
        a = a2
        adopted = {sb.id for sb in a.client.list(timeout=30)}
        assert adopted == set(a_before), (adopted, a_before)
        mine["a"] = [a.client.get(sid) for sid in a_before]
        for sb in mine["a"]:
            assert uid_range(sb) == a_before[sb.id], sb.id
        for _ in range(2):
            sb = a.client.create(layers=[base_layer], memory_mb=256, disk_mb=256)
            mine["a"].append(sb)
            ranges[f"a/{sb.id}"] = uid_range(sb)
        assert_disjoint(ranges)
    finally:
        for d in (a, b):
            if d.proc is not None and d.proc.poll() is None:
                d.stop()
