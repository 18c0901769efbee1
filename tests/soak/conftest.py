"""The soak reuses the integration tests' fixtures (a real warrend on a
private state dir, the base layer built once, host snapshots)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from soak import itc  # noqa: E402  (tests/integration/conftest.py, loaded once)

test_root = itc.test_root
layer_store = itc.layer_store
daemon = itc.daemon
client = itc.client
base_layer = itc.base_layer
pytest_runtest_makereport = itc.pytest_runtest_makereport
