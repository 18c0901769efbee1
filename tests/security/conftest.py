"""Escape and reward-hacking suite (tests/security): attacks run from inside
sandboxes against a REAL warrend. Each case asserts the attack is blocked; a
case that cannot apply here is skipped with the reason.

The daemon, layer store and base layer come from the integration suite's
fixtures (tests/integration/conftest.py, loaded under another module name so
that several suites can run in one pytest invocation).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

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
