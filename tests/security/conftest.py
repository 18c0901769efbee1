"""Escape suite (issue "Also: an escape suite in CI"): the classic container
escapes and the published reward hacks, attempted from inside sandboxes of
every backend. Each case asserts the attempt is BLOCKED; a case that cannot
apply here is skipped with the reason printed (pytest -rs).

The attacker is tests/security/probe.c, compiled on the host once per session
(`gcc -static -O1`, plus a `-m32` build when gcc-multilib is installed),
uploaded with sb.files.write and run with sb.exec, one subcommand per case.
Every attempt prints `case=<name> result=blocked|ALLOWED|skip errno=<E..>
key=value...`; `Probe.run` parses those lines.

A backend is a parameter (`backend` fixture), as in tests/conformance: today
`container`; microvm/vm join by adding their name to BACKENDS (and, if they
lack a feature, a reason to MISSING).

The daemon, layer store and base layer come from the integration suite's
fixtures (tests/integration/conftest.py, loaded under another module name so
that several suites can run in one pytest invocation).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional

import pytest

import warren

_IT_CONFTEST = Path(__file__).resolve().parents[1] / "integration" / "conftest.py"
if "warren_integration_conftest" in sys.modules:
    it = sys.modules["warren_integration_conftest"]
else:
    _spec = importlib.util.spec_from_file_location("warren_integration_conftest", _IT_CONFTEST)
    it = importlib.util.module_from_spec(_spec)
    sys.modules["warren_integration_conftest"] = it
    _spec.loader.exec_module(it)

# Re-exported fixtures (and the hook that attaches daemon logs to failures).
test_root = it.test_root
layer_store = it.layer_store
daemon = it.daemon
client = it.client
base_layer = it.base_layer
pytest_runtest_makereport = it.pytest_runtest_makereport

PROBE_SRC = Path(__file__).resolve().parent / "probe.c"
PROBE_PATH = "/opt/warren-probe/probe"      # where the probe lives inside a sandbox
PROBE32_PATH = "/opt/warren-probe/probe32"

BACKENDS = ["container"]
# Cases a backend cannot run, with the reason shown on skip.
MISSING: Mapping[str, Mapping[str, str]] = {"container": {}}


# ---------------------------------------------------------------- the probe binary


@dataclass
class ProbeBinaries:
    x86_64: Path
    m32: Optional[Path]            # None: no -m32 toolchain on the host
    m32_reason: str = ""


@pytest.fixture(scope="session")
def probe_binaries(tmp_path_factory) -> ProbeBinaries:
    if shutil.which("gcc") is None:
        pytest.fail("gcc not found: scripts/setup.sh installs build-essential")
    out = tmp_path_factory.mktemp("probe")
    p64 = out / "probe"
    r = subprocess.run(["gcc", "-static", "-O1", "-Wall", "-o", str(p64), str(PROBE_SRC)],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"gcc -static probe.c failed:\n{r.stderr}"
    p32 = out / "probe32"
    r = subprocess.run(["gcc", "-m32", "-static", "-O1", "-Wall", "-o", str(p32), str(PROBE_SRC)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return ProbeBinaries(p64, None, "no -m32 toolchain on the host (install gcc-multilib; "
                                        f"scripts/setup.sh does): {r.stderr.strip()[-200:]}")
    return ProbeBinaries(p64, p32)


# ---------------------------------------------------------------- parsing


@dataclass
class Line:
    case: str
    result: str                      # blocked | ALLOWED | skip | done | ...
    errno: str = "0"
    kv: Dict[str, str] = field(default_factory=dict)
    raw: str = ""

    @property
    def blocked(self) -> bool:
        return self.result == "blocked"


def parse(stdout: bytes) -> Dict[str, Line]:
    """case name -> Line, for every `case=` line of the probe's output."""
    out: Dict[str, Line] = {}
    for raw in stdout.decode(errors="replace").splitlines():
        if not raw.startswith("case="):
            continue
        kv: Dict[str, str] = {}
        for tok in raw.split(" "):
            k, _, v = tok.partition("=")
            kv[k] = v
        out[kv["case"]] = Line(kv["case"], kv.get("result", "?"), kv.get("errno", "0"), kv, raw)
    return out


class Probe:
    """The probe inside one sandbox of one backend."""

    def __init__(self, backend: str, sb: warren.Sandbox, binaries: ProbeBinaries):
        self.backend = backend
        self.sb = sb
        self.binaries = binaries
        sb.files.write(PROBE_PATH, binaries.x86_64.read_bytes(), mode=0o755, make_parents=True)
        if binaries.m32 is not None:
            sb.files.write(PROBE32_PATH, binaries.m32.read_bytes(), mode=0o755, make_parents=True)

    def skip_unless(self, feature: str) -> None:
        reason = MISSING.get(self.backend, {}).get(feature)
        if reason:
            pytest.skip(f"{self.backend}: {reason}")

    def exec(self, *args: str, binary: str = PROBE_PATH, user: Optional[str] = None,
             timeout: float = 60, check: bool = True) -> warren.ExecResult:
        r = self.sb.exec([binary, *args], user=user, timeout=timeout)
        if check:
            assert r.exit_code == 0 and not r.timed_out, \
                f"probe {' '.join(args)} failed: exit={r.exit_code} signal={r.signal} " \
                f"timed_out={r.timed_out}\nstdout:\n{r.stdout[-3000:]!r}\nstderr:\n{r.stderr[-3000:]!r}"
        return r

    def run(self, *args: str, **kw) -> Dict[str, Line]:
        r = self.exec(*args, **kw)
        lines = parse(r.stdout)
        print(r.stdout.decode(errors="replace"))  # shown with -rA / on failure
        return lines


def assert_blocked(line: Line, *, errnos: Iterable[str] = ()) -> None:
    errnos = list(errnos)
    assert line.result != "ALLOWED", f"NOT BLOCKED: {line.raw}"
    assert line.result == "blocked", f"unexpected probe result: {line.raw}"
    if errnos:
        assert line.errno in errnos, f"blocked, but not by the expected rule (errno {line.errno}, " \
                                     f"expected one of {errnos}): {line.raw}"


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request) -> str:
    return request.param


def create_sandbox(client: warren.Client, backend: str, base_layer: str, **kw) -> warren.Sandbox:
    kw.setdefault("memory_mb", 512)
    kw.setdefault("pids", 256)
    kw.setdefault("labels", {"test": "security"})
    return client.create(backend=backend, layers=[base_layer], **kw)


@pytest.fixture(scope="module")
def probe(client: warren.Client, base_layer: str, backend: str, probe_binaries: ProbeBinaries) -> Iterable[Probe]:
    """A probe in a sandbox shared by the cases of one module that leave it as they found it."""
    with create_sandbox(client, backend, base_layer) as sb:
        yield Probe(backend, sb, probe_binaries)


@pytest.fixture()
def fresh_probe(client: warren.Client, base_layer: str, backend: str,
                probe_binaries: ProbeBinaries) -> Iterable[Probe]:
    """A probe in a sandbox of its own (for cases that change or may break it)."""
    with create_sandbox(client, backend, base_layer) as sb:
        yield Probe(backend, sb, probe_binaries)


@pytest.fixture()
def host_marker(test_root: Path) -> Iterable[Path]:
    """A file on the host that no sandbox may ever see, read or write
    (content: a random secret)."""
    import secrets
    d = test_root / f"host-secret-{secrets.token_hex(4)}"
    d.mkdir()
    p = d / "secret"
    p.write_text("HOST-SECRET-" + secrets.token_hex(16) + "\n")
    yield p
    shutil.rmtree(d, ignore_errors=True)


def percentile(xs: List[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def exec_latencies(sb: warren.Sandbox, n: int, deadline: float) -> List[float]:
    """Round trips of n `true` execs (stops early at the monotonic deadline)."""
    out = []
    for _ in range(n):
        if time.monotonic() > deadline:
            break
        t0 = time.monotonic()
        r = sb.exec(["true"], timeout=30)
        out.append(time.monotonic() - t0)
        assert r.exit_code == 0, r
    return out
