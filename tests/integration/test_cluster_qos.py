"""QoS classes and per-class over-commit on one node (README "QoS and
over-commit"): a best-effort sandbox's processes (its init and every exec)
run SCHED_IDLE with oom_score_adj 500, its cgroup has the lowest cpu weight
(and, v1, a soft memory limit of 0); a latency sandbox keeps SCHED_OTHER and
a weight by its cpu. warrend --overcommit bounds each class's requests by
capacity x ratio (ResourceExhausted naming the class); a bad class or ratio
is refused naming the field. Core scheduling is probed and reported.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Iterable

import pytest

import warren

from conftest import CLI, NODE_PREFIX, WARREND, Daemon, cgroup_dirs

SCHED_OTHER, SCHED_IDLE = 0, 5


def policy_of(stat: str) -> int:
    """The scheduling policy (field 41) of a /proc/PID/stat line."""
    fields = stat[stat.rindex(")") + 2 :].split()  # from field 3 (state) on
    return int(fields[41 - 3])


@pytest.fixture(scope="module")
def qos_daemon(test_root: Path, layer_store: Path, base_layer: str) -> Iterable[Daemon]:
    # latency: 0.5 x capacity, best-effort: 1 x capacity (cpus x 1000 millicpus,
    # the node's memory); small ratios so that a few sandboxes reach them.
    d = Daemon(
        test_root,
        "qos",
        layer_store,
        NODE_PREFIX + "q",
        extra_args=["--overcommit", "latency=0.5,best-effort=1"],
    ).start()
    yield d
    assert d.stop() == 0, d.log_tail()


def test_best_effort_runs_sched_idle_with_the_lowest_weight(
    qos_daemon: Daemon, base_layer: str
) -> None:
    c = qos_daemon.client
    assert c is not None
    with (
        c.create(layers=[base_layer], qos="best-effort", cpu=0.5, memory_mb=256) as be,
        c.create(layers=[base_layer], cpu=0.5, memory_mb=256) as lat,
    ):
        assert be.info().qos == "best-effort"
        assert lat.info().qos == "latency"
        for sb, policy, adj in ((be, SCHED_IDLE, "500"), (lat, SCHED_OTHER, "0")):
            # An exec (warren-spawn's path) and a child of it, then the init
            # (the shell's path), seen from the host.
            r = sb.exec(
                ["sh", "-c", "cat /proc/self/stat; cat /proc/self/oom_score_adj"],
                timeout=60,
            )
            assert r.exit_code == 0, r.stderr
            stat, score = r.stdout.decode().splitlines()
            assert policy_of(stat) == policy, stat
            assert score == adj
            init = sb.info().init_pid
            assert policy_of(Path(f"/proc/{init}/stat").read_text()) == policy
            assert Path(f"/proc/{init}/oom_score_adj").read_text().strip() == adj
        # A best-effort process cannot leave SCHED_IDLE (no CAP_SYS_NICE in
        # the host's user namespace, RLIMIT_NICE 0).
        r = be.exec(["chrt", "-o", "-p", "0", "1"], timeout=60)
        assert r.exit_code != 0, r.stdout
        assert (
            policy_of(Path(f"/proc/{be.info().init_pid}/stat").read_text())
            == SCHED_IDLE
        )

        dirs_be, dirs_lat = (
            cgroup_dirs(be.info().init_pid),
            cgroup_dirs(lat.info().init_pid),
        )
        if "unified" in dirs_be and (dirs_be["unified"] / "cpu.weight").exists():
            assert (dirs_be["unified"] / "cpu.weight").read_text().strip() == "1"
            assert (
                dirs_lat["unified"] / "cpu.weight"
            ).read_text().strip() == "50"  # 500 millicpus / 10
        else:
            cpu = next(k for k in dirs_be if "cpu" in k.split(",") and "cpuset" != k)
            mem = next(k for k in dirs_be if "memory" in k.split(","))
            assert (dirs_be[cpu] / "cpu.shares").read_text().strip() == "2"
            assert (
                dirs_lat[cpu] / "cpu.shares"
            ).read_text().strip() == "512"  # 500 x 1024 / 1000
            assert (
                dirs_be[mem] / "memory.soft_limit_in_bytes"
            ).read_text().strip() == "0"
            assert (
                int((dirs_lat[mem] / "memory.soft_limit_in_bytes").read_text())
                > 1 << 60
            )  # unlimited


def test_overcommit_is_counted_per_class(qos_daemon: Daemon, base_layer: str) -> None:
    c = qos_daemon.client
    assert c is not None
    st = c.status()
    classes = {q.qos: q for q in st.qos}
    assert (
        classes["latency"].overcommit == 0.5 and classes["best-effort"].overcommit == 1
    )
    lat_bound = st.cpus * 1000 // 2  # latency=0.5
    be_bound = st.cpus * 1000
    assert (
        classes["latency"].free_cpu_millis == lat_bound
        and classes["latency"].sandboxes == 0
    )
    made = []
    try:
        # latency: its whole bound in one sandbox, then nothing more of it...
        made.append(c.create(layers=[base_layer], cpu=lat_bound / 1000, memory_mb=128))
        with pytest.raises(warren.ResourceExhausted) as e:
            c.create(layers=[base_layer], cpu=0.1, memory_mb=128)
        assert "qos class latency is full" in str(e.value) and "cpu" in str(e.value)
        # ... while best-effort, counted apart, takes its own bound...
        made.append(
            c.create(
                layers=[base_layer],
                qos="best-effort",
                cpu=be_bound / 2000,
                memory_mb=128,
            )
        )
        # (memory is counted too: past the class's memory bound with cpu to spare)
        with pytest.raises(warren.ResourceExhausted) as e:
            c.create(
                layers=[base_layer],
                qos="best-effort",
                cpu=0.001,
                memory_mb=(st.memory_total_bytes >> 20) - 100,
            )
        assert "qos class best-effort is full" in str(e.value) and "memory" in str(
            e.value
        )
        made.append(
            c.create(
                layers=[base_layer],
                qos="best-effort",
                cpu=be_bound / 2000,
                memory_mb=128,
            )
        )
        with pytest.raises(warren.ResourceExhausted) as e:
            c.create(layers=[base_layer], qos="best-effort", cpu=0.1, memory_mb=128)
        assert "qos class best-effort is full" in str(e.value)
        classes = {q.qos: q for q in c.status().qos}
        assert (
            classes["latency"].sandboxes == 1
            and classes["latency"].free_cpu_millis == 0
        )
        assert (
            classes["best-effort"].sandboxes == 2
            and classes["best-effort"].cpu_millis == be_bound
        )
        assert classes["best-effort"].memory_mb == 256
        # A destroy gives its class's share back.
        made.pop(0).destroy()
        made.append(c.create(layers=[base_layer], cpu=0.1, memory_mb=128))
    finally:
        for sb in made:
            sb.destroy()


def test_bad_qos_and_bad_overcommit_name_the_field(
    qos_daemon: Daemon, base_layer: str, test_root: Path
) -> None:
    # The CLI passes the class through: the node refuses it (InvalidArgument).
    p = subprocess.run(
        [
            str(CLI),
            "--addr",
            "unix:" + str(qos_daemon.socket),
            "create",
            "--layer",
            base_layer,
            "--qos",
            "gold",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode != 0
    assert "qos" in p.stderr and "gold" in p.stderr and "best-effort" in p.stderr, (
        p.stderr
    )
    assert not qos_daemon.client.list()
    with pytest.raises(warren.InvalidArgument, match="qos"):
        qos_daemon.client.create(layers=[base_layer], qos="gold")
    for bad, why in (
        ("latency=x", "ratio"),
        ("gold=2", "unknown class"),
        ("latency", "no '='"),
        ("latency=1,latency=2", "twice"),
        ("best-effort=-1", "ratio"),
    ):
        p = subprocess.run(
            [
                str(WARREND),
                "--state-dir",
                str(test_root / "qos-bad"),
                "--socket",
                str(test_root / "qos-bad.sock"),
                "--overcommit",
                bad,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode != 0, bad
        assert "--overcommit" in p.stderr + p.stdout and why in p.stderr + p.stdout, (
            p.stderr + p.stdout
        )


def test_core_scheduling_is_probed_and_reported(qos_daemon: Daemon) -> None:
    st = qos_daemon.client.status()
    assert st.core_scheduling == "available" or st.core_scheduling.startswith(
        "absent: prctl(PR_SCHED_CORE)"
    ), st.core_scheduling
    p = subprocess.run(
        [str(CLI), "--addr", "unix:" + str(qos_daemon.socket), "--json", "status"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out = json.loads(p.stdout)
    assert out["core_scheduling"] == st.core_scheduling
    assert out["qos"]["best-effort"]["overcommit"] == 1
