"""Nodes of the image benchmarks: warrend daemons whose layer store is one
GlusterFS volume (tests/integration/test_images_shared.py's Gluster), each
through its own FUSE mount, as separate hosts would see it."""
from pathlib import Path


def gluster_node(g, root: Path, name: str, node_id: str, extra: list[str], daemons: list):
    """Starts a daemon named `name` under `root` on a fresh mount of `g`'s
    volume (store `<mount>/layers`), appends it to `daemons` (for the
    caller's teardown) and returns it."""
    from conftest import Daemon  # tests/integration, on the caller's sys.path

    store = g.mount(root / f"mnt-{name}") / "layers"
    store.mkdir(exist_ok=True)
    d = Daemon(root, name, store, node_id, extra_args=extra).start()
    daemons.append(d)
    return d
