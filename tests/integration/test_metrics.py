"""warrend --metrics-listen: GET /metrics in the Prometheus text format
(parsed with prometheus_client's own parser) moves by exactly the workload
the node ran; the scrape-time gauges show the table; a bad address or a port
in use stops the start with an error naming the flag; the Grafana dashboard
(deploy/grafana/warren.json) queries only metrics the endpoint exports."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import pytest
import warren
from conftest import NODE_PREFIX, REPO, WARREND, Daemon
from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = REPO / "deploy/grafana/warren.json"
Key = tuple[str, tuple[tuple[str, str], ...]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Scrape:
    """One GET /metrics: every sample by (name, sorted labels), and the
    names of the families and samples."""

    def __init__(self, port: int):
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=30
        ) as r:
            assert r.status == 200
            text = r.read().decode()
        self.samples: dict[Key, float] = {}
        self.names: set[str] = set()
        for fam in text_string_to_metric_families(text):
            self.names.add(fam.name)
            # A family declared without samples yet still exports these names.
            suffixes = {
                "counter": ["_total"],
                "histogram": ["_bucket", "_count", "_sum"],
            }
            self.names.update(fam.name + x for x in suffixes.get(fam.type, []))
            for s in fam.samples:
                self.names.add(s.name)
                self.samples[(s.name, tuple(sorted(s.labels.items())))] = s.value

    def get(self, name: str, **labels: str) -> float:
        return self.samples.get((name, tuple(sorted(labels.items()))), 0.0)

    def total(self, name: str) -> float:
        """Sum over every label set of `name`."""
        return sum(v for (n, _), v in self.samples.items() if n == name)


@pytest.fixture(scope="module")
def node(test_root: Path, layer_store: Path, base_layer: str) -> Iterable[Daemon]:
    port = _free_port()
    d = Daemon(
        test_root,
        "metrics",
        layer_store,
        NODE_PREFIX + "m",
        extra_args=[
            "--metrics-listen",
            f"127.0.0.1:{port}",
            "--fncall-layers",
            base_layer,
            "--warm-shells",  # no pool refilling in the background: the layer lookups are the test's
            "0",
        ],
    )
    d.metrics_port = port  # type: ignore[attr-defined]
    d.start()
    yield d
    d.stop()


CREATES_OK = 3
CREATES_BAD = 2  # bad input: refused by the node's validation
EXECS = 5
FNCALLS = 2


def test_counters_and_histograms_move_by_exactly_the_workload(
    node: Daemon, base_layer: str
) -> None:
    c = node.client
    assert c is not None
    port = node.metrics_port  # type: ignore[attr-defined]
    before = Scrape(port)

    sbs = [c.create(layers=[base_layer], timeout=120) for _ in range(CREATES_OK)]
    with pytest.raises(warren.InvalidArgument):
        c.create(layers=[base_layer], memory_mb=1 << 30, timeout=60)
    with pytest.raises(warren.InvalidArgument):
        c.create(layers=[base_layer], workdir="relative/dir", timeout=60)
    for i in range(EXECS):
        r = sbs[i % len(sbs)].exec(["true"], timeout=60)
        assert r.exit_code == 0
    sbs[0].pause()

    mid = Scrape(port)
    # Gauges: read from the table at scrape time.
    assert (
        mid.get("warren_sandboxes", backend="container", state="running")
        == CREATES_OK - 1
    )
    assert mid.get("warren_sandboxes", backend="container", state="paused") == 1
    # A state with no sandbox is a series at 0, not a gap.
    assert (
        "warren_sandboxes",
        (("backend", "container"), ("state", "suspended")),
    ) in mid.samples
    assert mid.get("warren_creates_in_flight") == 0
    assert mid.get("warren_create_queue_depth") == 0
    sbs[0].resume()
    sbs[1].suspend()
    sbs[1].resume()
    for _ in range(FNCALLS):
        assert c.fncall("print(6 * 7)", timeout=120).run.stdout == b"42\n"
    for sb in sbs:
        sb.destroy(timeout=60)
    after = Scrape(port)

    def delta(name: str, **labels: str) -> float:
        return after.get(name, **labels) - before.get(name, **labels)

    def delta_total(name: str) -> float:
        return after.total(name) - before.total(name)

    b = {"backend": "container"}
    assert delta("warren_sandbox_creates_total", **b, outcome="ok") == CREATES_OK
    assert (
        delta("warren_sandbox_creates_total", **b, outcome="invalid_argument")
        == CREATES_BAD
    )
    assert delta_total("warren_sandbox_creates_total") == CREATES_OK + CREATES_BAD
    # Only successful creates have a latency.
    assert delta("warren_sandbox_create_seconds_count", **b) == CREATES_OK
    assert delta("warren_sandbox_create_seconds_bucket", **b, le="+Inf") == CREATES_OK
    assert delta("warren_sandbox_create_seconds_sum", **b) > 0
    assert delta("warren_execs_total", **b, outcome="ok") == EXECS
    assert delta_total("warren_execs_total") == EXECS
    assert delta("warren_exec_seconds_count", **b) == EXECS
    assert delta("warren_sandbox_destroys_total", **b, reason="client") == CREATES_OK
    assert delta_total("warren_sandbox_destroys_total") == CREATES_OK
    assert delta("warren_sandbox_pauses_total", **b) == 1
    assert delta("warren_sandbox_resumes_total", **b, **{"from": "paused"}) == 1
    assert delta("warren_sandbox_suspends_total", **b) == 1
    assert delta("warren_sandbox_resumes_total", **b, **{"from": "suspended"}) == 1
    assert delta_total("warren_sandbox_resumes_total") == 2
    assert delta("warren_sandbox_suspend_swap_bytes_total", **b) >= 0
    assert delta("warren_fncall_calls_total", outcome="ok") == FNCALLS
    assert delta("warren_fncall_call_seconds_count") == FNCALLS
    # The table is empty again; the fncall pool has warm workers.
    assert after.total("warren_sandboxes") == 0
    assert after.total("warren_fncall_workers") >= 1
    # Names follow the conventions: prefix, _total counters, no id labels.
    for name, labels in after.samples:
        assert name.startswith(("warren_", "exposer_")), name
        assert all(not v.startswith(NODE_PREFIX) for _, v in labels), (name, labels)


def test_layer_cache_counts_each_lookup(node: Daemon, base_layer: str, tmp_path: Path) -> None:
    c = node.client
    assert c is not None
    port = node.metrics_port  # type: ignore[attr-defined]
    d = tmp_path / "layer"
    d.mkdir()
    (d / "cache-probe").write_bytes(os.urandom(64 << 10))  # a layer no other test has
    fresh = c.layers.build(f"toolset/metrics-cache-{os.getpid()}@1", dir=str(d))
    c.create(layers=[base_layer], timeout=120).destroy(timeout=60)  # base mounted (kept for its grace)
    before = Scrape(port)
    for _ in range(2):
        c.create(layers=[base_layer, fresh.name], timeout=120).destroy(timeout=60)
    after = Scrape(port)

    def delta(result: str) -> float:
        return after.get("warren_layer_cache_lookups_total", result=result) - before.get(
            "warren_layer_cache_lookups_total", result=result
        )

    # 2 creates x 2 layers: the fresh layer mounted by the first (a miss),
    # found mounted by the second; the base layer mounted all along.
    assert delta("miss") == 1
    assert delta("hit") == 3
    assert delta("failed") == 0
    # Unused since, the fresh layer stays mounted for its grace period.
    grown = after.get("warren_layer_mounted_bytes") - before.get("warren_layer_mounted_bytes")
    assert grown == fresh.size_bytes, (grown, fresh)
    assert after.get("warren_layer_mounts") == before.get("warren_layer_mounts") + 1
    assert "warren_layer_cache_evictions_total" in after.names


def test_dashboard_queries_only_exported_metrics(node: Daemon) -> None:
    # The workload test above ran first (module order); every family has samples by now.
    scrape = Scrape(node.metrics_port)  # type: ignore[attr-defined]
    dash = json.loads(DASHBOARD.read_text())
    assert dash["schemaVersion"] >= 36
    assert any(
        v.get("type") == "datasource" and v.get("query") == "prometheus"
        for v in dash["templating"]["list"]
    )
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 6
    for expr in exprs:
        used = set(re.findall(r"\bwarren_[a-z0-9_]+", expr))
        assert used, expr
        missing = used - scrape.names
        assert not missing, f"{expr!r} uses {missing}, not exported by /metrics"


def _start_fails(test_root: Path, layer_store: Path, name: str, listen: str) -> str:
    """warrend with --metrics-listen `listen`: must exit 1 at start; its output."""
    state = test_root / f"{name}-state"
    state.mkdir(exist_ok=True)
    p = subprocess.run(
        [
            str(WARREND),
            "--state-dir",
            str(state),
            "--socket",
            str(test_root / f"{name}.sock"),
            "--layer-store",
            str(layer_store),
            "--node-id",
            NODE_PREFIX + "x",
            "--metrics-listen",
            listen,
        ],
        check=False,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        text=True,
    )
    assert p.returncode == 1, p.stderr
    return p.stdout + p.stderr


@pytest.mark.parametrize(
    "listen,why",
    [
        ("127.0.0.1", "expected HOST:PORT"),
        ("127.0.0.1:99999", "is not a number in 0..65535"),
        ("metrics.example:9100", "is not an IPv4 address"),
    ],
)
def test_bad_address_is_a_clear_error_at_start(
    test_root: Path, layer_store: Path, listen: str, why: str
) -> None:
    out = _start_fails(test_root, layer_store, "metrics-bad", listen)
    assert "--metrics-listen" in out and why in out, out


def test_port_in_use_is_a_clear_error_at_start(
    test_root: Path, layer_store: Path
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        listen = f"127.0.0.1:{s.getsockname()[1]}"
        out = _start_fails(test_root, layer_store, "metrics-busy", listen)
    assert (
        f"bind({listen}) for --metrics-listen" in out
        and "Address already in use" in out
    ), out
