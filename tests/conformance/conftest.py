"""Conformance suite (DESIGN.md §3): one set of exec-semantics cases run on
every backend through the SDK. A backend is a `Runner` here:

  container  sb.exec(...) in a fresh container sandbox per test
  fncall     client.fncall(..., language="bash" | "python") (every call is
             already a fresh, pristine worker call)

Cases that do not apply to a backend call `runner.skip_unless(feature)`,
which skips with the reason printed (pytest -rs).

The daemon, layer store and base layer come from the integration suite's
fixtures (tests/integration/conftest.py, loaded under another module name so
that both suites can run in one pytest invocation).
"""

from __future__ import annotations

import os
import importlib.util
import shlex
import sys
from pathlib import Path
from typing import Iterable, Mapping, Optional, Union

import pytest

import warren

_IT_CONFTEST = Path(__file__).resolve().parents[1] / "integration" / "conftest.py"
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

# Limits every runner applies, so that the limit cases mean the same thing.
MEMORY_MB = 256

Bytes = Union[str, bytes]


class Runner:
    """One backend under test. sh() runs a POSIX shell script (dash on
    container, bash on fncall: scripts here stay POSIX), py() python3 code;
    both return a warren.ExecResult. scratch is a writable dir."""

    name = "?"
    scratch = "/tmp"
    # Features a backend does not have, with the reason shown on skip.
    missing: Mapping[str, str] = {}

    def skip_unless(self, feature: str) -> None:
        if feature in self.missing:
            pytest.skip(f"{self.name}: {self.missing[feature]}")

    def sh(self, script: str, *, stdin: Bytes = b"", env: Optional[Mapping[str, str]] = None,
           timeout: Optional[float] = None, output_cap: Optional[int] = None) -> warren.ExecResult:
        raise NotImplementedError

    def py(self, code: str, **kw) -> warren.ExecResult:
        raise NotImplementedError


class ContainerRunner(Runner):
    name = "container"
    missing = {
        "read_only_root": "the container root is writable by design (a private overlay upper, capped by "
                          "disk_mb); only the layers underneath are read-only",
    }

    def __init__(self, sb: warren.Sandbox):
        self.sb = sb

    def sh(self, script, *, stdin=b"", env=None, timeout=None, output_cap=None):
        return self.sb.exec(script, stdin=stdin or None, env=env, timeout=timeout if timeout else 120,
                            output_cap=output_cap)

    def py(self, code, **kw):
        return self.sh("exec python3 -c " + shlex.quote(code), **kw)


class FnCallRunner(Runner):
    name = "fncall"
    missing = {
        "state": "fncall is stateless: nothing of one call survives into the next (by design)",
        "python_self_sigkill": "python code runs as PID 1 of the call's pid namespace (no second fork "
                               "per call), and the kernel drops SIGKILL that PID 1 sends itself; "
                               "catchable signals are emulated (reported as the signal), faults are real",
    }

    def __init__(self, client: warren.Client, layers):
        self.client = client
        self.layers = layers

    def _call(self, lang, code, *, stdin=b"", env=None, timeout=None, output_cap=None):
        r = self.client.fncall(code, language=lang, stdin=stdin, env=dict(env or {}),
                               timeout=timeout if timeout else 120, memory_mb=MEMORY_MB,
                               layers=self.layers, output_cap=output_cap or 0)
        assert not r.sandbox_error, r.sandbox_error
        assert r.run is not None, r
        return r.run

    def sh(self, script, **kw):
        return self._call("bash", script, **kw)

    def py(self, code, **kw):
        return self._call("python", code, **kw)


class MicrovmRunner(ContainerRunner):
    """A QEMU microVM (runtime/microvm): the same exec calls as a container,
    served by the guest agent over its channel."""
    name = "microvm"
    missing = {
        "read_only_root": "the microVM root is writable by design (overlayfs over a private ext4 disk of "
                          "disk_mb); only the layers underneath are read-only",
    }


class VmRunner(ContainerRunner):
    """A full QEMU desktop VM (runtime/vm): exec through the guest agent, a
    systemd service of the guest; each test gets a clone of the desktop
    template (vm_template.h) of a daemon of its own (--vm-dir)."""
    name = "vm"
    missing = {
        "read_only_root": "the vm root is writable by design (overlayfs over the VM's own writable disk, as a "
                          "microVM's); only the layers underneath are read-only",
    }

    def __init__(self, sb: warren.Sandbox, status_client: warren.Client):
        super().__init__(sb)
        self.status_client = status_client


VM_DIR = Path("/var/cache/warren/vm")
VM_MEMORY_MB = 512  # the vm backend's floor is 384 (systemd and X)


@pytest.fixture(scope="session")
def vm_daemon(test_root: Path, layer_store: Path):
    """A daemon offering the vm backend (the suite's own daemon does not)."""
    d = it.Daemon(test_root, "conformance-vm", layer_store, f"{it.NODE_PREFIX}cv",
                  extra_args=["--vm-dir", str(VM_DIR), "--warm-shells", "0"]).start()
    yield d
    d.stop()


@pytest.fixture(params=["container", "fncall", "microvm", "vm"])
def runner(request, client: warren.Client, base_layer: str) -> Iterable[Runner]:
    if request.param == "container":
        with client.create(layers=[base_layer], memory_mb=MEMORY_MB, pids=256,
                           labels={"test": "conformance"}) as sb:
            yield ContainerRunner(sb)
    elif request.param == "microvm":
        if "microvm" not in client.status().backends:
            pytest.skip("microvm: not offered by this warrend (needs qemu-system-x86_64 and the guest files of "
                        "scripts/microvm/build-guest.sh; the daemon log says which is missing)")
        with client.create(layers=[base_layer], backend="microvm", memory_mb=MEMORY_MB, pids=256,
                           labels={"test": "conformance"}, timeout=180) as sb:
            yield MicrovmRunner(sb)
    elif request.param == "vm":
        if os.environ.get("WARREN_VM_CONFORMANCE", "1") == "0":
            # CI's bounded form (.ci/run): the vm backend's own tests
            # (tests/integration/test_vm.py) run there; this suite on vm
            # costs a second desktop template boot under TCG (~2.5 min).
            pytest.skip("vm: WARREN_VM_CONFORMANCE=0 (CI's bounded form; run it with WARREN_VM_CONFORMANCE=1)")
        if not all((VM_DIR / f).exists() for f in ("system.erofs", "upper.img", "vmlinuz", "initrd.img")):
            pytest.skip(f"vm: no guest in {VM_DIR} (scripts/vm/build-guest.sh)")
        d = request.getfixturevalue("vm_daemon")
        # The first create boots the desktop template (minutes under TCG);
        # the others are clones of it (seconds).
        with d.client.create(layers=[base_layer], backend="vm", memory_mb=VM_MEMORY_MB,
                             labels={"test": "conformance"}, timeout=900) as sb:
            yield VmRunner(sb, d.client)
    else:
        yield FnCallRunner(client, [base_layer])
