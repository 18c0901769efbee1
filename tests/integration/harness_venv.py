"""The harness venv of the provider tests whose harness needs a newer Python
than the test venv's (Harbor and NeMo-Gym need >= 3.12): REPO/.venv-harness,
made by scripts/setup.sh ("Harness venv") with the SDK and the pinned
harness packages, or here at test time when it is missing or lacks a pin.

A skip names its reason and happens only when the tests cannot get a
harness at all (no Python >= 3.12 on the machine, or PyPI unreachable);
a pip error for a pinned version with PyPI reachable is a test failure.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import List, Optional, Sequence

import pytest

REPO = Path(__file__).resolve().parents[2]
HARNESS_VENV = Path(os.environ.get("WARREN_HARNESS_VENV", REPO / ".venv-harness"))

# Pins, kept equal to scripts/setup.sh's "Harness venv" section.
HARBOR_PIN = "harbor==0.26.0"
# Harbor's own E2B environment (harbor[e2b]: the e2b SDK and dockerfile-parse),
# on the same e2b SDK as test_e2b.py's.
E2B_PIN = "e2b==2.63.0"
HARBOR_E2B_PINS = (HARBOR_PIN, E2B_PIN, "dockerfile-parse==2.0.1")
# nemo-gym 0.5+ declares Requires-Python >=3.13.14, newer than the Pythons
# this kind of machine has (3.12.1, 3.13.0); its sandbox API runs on them.
# It is installed without its dependencies (ray, mlflow, vllm, ... are for
# its servers, not for nemo_gym.sandbox), plus what nemo_gym.sandbox imports.
NEMOGYM_PIN = "nemo-gym==0.7.0"
NEMOGYM_SANDBOX_DEPS = ["omegaconf==2.4.0", "pydantic>=2.14,<3"]


def find_python() -> Optional[str]:
    """The newest CPython >= 3.12 on the machine: python3.13/python3.12 on
    PATH, else a pyenv version (pyenv's shims exist for versions that are
    not active, so each candidate must run)."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    pyenv = sorted(glob.glob(os.path.join(root, "versions", "3.1[2-9].*", "bin", "python")),
                   key=lambda p: [int(x) for x in Path(p).parts[-3].split(".") if x.isdigit()], reverse=True)
    candidates = [p for p in (shutil.which("python3.13"), shutil.which("python3.12")) if p] + pyenv
    for p in candidates:
        r = subprocess.run([p, "-c", "import sys; assert sys.version_info >= (3, 12)"], capture_output=True)
        if r.returncode == 0:
            return p
    return None


def _pypi_reachable() -> bool:
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple/").rstrip("/") + "/pip/"
    try:
        with urllib.request.urlopen(index, timeout=15) as r:
            return r.status == 200
    except OSError:
        return False


def _pip(python: str, args: Sequence[str], what: str) -> None:
    r = subprocess.run([python, "-m", "pip", "install", "-q", *args], capture_output=True, text=True,
                       timeout=1800)
    if r.returncode == 0:
        return
    if not _pypi_reachable():
        print(f"PyPI unreachable, cannot install {what}: {r.stderr[-500:]}")
        pytest.skip(f"PyPI unreachable: cannot install {what}")
    pytest.fail(f"pip install {what} failed (PyPI is reachable: a bad pin or a broken package):\n{r.stderr[-3000:]}")


def install_pin(spec: str, module: str) -> None:
    """Installs the pinned `spec` into the test venv itself unless `module`
    imports already at that version (the packages whose tests run on the
    test venv's Python: mini-swe-agent, SWE-ReX, e2b)."""
    dist, _, version = spec.partition("==")
    try:
        __import__(module)
        if not version or _has(sys.executable, dist, version):
            return
    except ImportError:
        pass
    _pip(sys.executable, [spec], spec)


def _has(python: str, dist: str, version: str) -> bool:
    r = subprocess.run([python, "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
                       capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.strip() == version


def harness_python(*pins: str) -> str:
    """The harness venv's python with the SDK (editable) and `pins`
    (HARBOR_PIN, NEMOGYM_PIN) installed; made or completed when needed."""
    py = str(HARNESS_VENV / "bin" / "python")
    if not os.path.exists(py):
        base = find_python()
        if base is None:
            msg = ("no Python >= 3.12 on this machine (Harbor and NeMo-Gym need it): install python3.12 or "
                   "a pyenv 3.12+, then scripts/setup.sh")
            print(msg)
            pytest.skip(msg)
        r = subprocess.run([base, "-m", "venv", str(HARNESS_VENV)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.fail(f"{base} -m venv {HARNESS_VENV} failed: {r.stderr}")
    if not _has(py, "warren", "0.1.0"):
        _pip(py, ["-e", str(REPO / "sdk" / "python")], "the warren SDK")
    for pin in pins:
        dist, _, version = pin.partition("==")
        if _has(py, dist, version):
            continue
        if pin == NEMOGYM_PIN:
            _pip(py, [*NEMOGYM_SANDBOX_DEPS], "nemo-gym's sandbox dependencies")
            _pip(py, ["--no-deps", "--ignore-requires-python", pin], pin)
        else:
            _pip(py, [pin], pin)
    return py


def run(python: str, args: List[str], timeout: float, env: Optional[dict] = None,
        cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.pop("PYTHONPATH", None)
    e.update(env or {})
    return subprocess.run([python, *args], capture_output=True, text=True, timeout=timeout, env=e,
                          cwd=str(cwd) if cwd else None)


def tail(s: str, n: int = 6000) -> str:
    return s[-n:] if len(s) > n else s


__all__ = ["E2B_PIN", "HARBOR_E2B_PINS", "HARBOR_PIN", "NEMOGYM_PIN", "find_python", "harness_python", "run", "tail"]


def write_file(p: Path, text: str, mode: int = 0o644) -> None:
    """Writes `text` to `p` (parents made) with `mode`."""
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    p.chmod(mode)
