"""The layer store filling up during a conversion: a warrend whose layer
store is a small tmpfs (so the store and the disk under it are one, and
full) imports and pulls images that do not fit. The store fills while a
layer's tar is extracted, while mkfs.erofs writes the EROFS image, and
while a layer blob is downloaded from a registry: each fails with
RESOURCE_EXHAUSTED naming ENOSPC and what was being written, and leaves
nothing behind (no layer, no image record, no scratch file, the space
freed again); the store keeps working afterwards."""

# ruff: noqa: F811  (the fixtures imported from test_images are parameters here)
from __future__ import annotations

import os
import subprocess
import tarfile
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
import warren
from conftest import NODE_PREFIX, Daemon
from test_images import (  # noqa: F401 - fixtures used by name
    _ti,
    make_layout,
    pytestmark,
    registry,
    run,
    tar_bytes,
    work,
)

STORE_MIB = 24


@pytest.fixture(scope="module")
def small(test_root: Path) -> Iterable[tuple[Daemon, Path]]:
    mnt = test_root / "small-store"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={STORE_MIB}m,mode=0700", "warren-small", str(mnt)],
                   check=True, timeout=30)
    d = None
    try:
        d = Daemon(test_root, "small", mnt / "layers", NODE_PREFIX + "sm").start()
        yield d, mnt / "layers"
    finally:
        if d is not None:
            d.stop()
        for _ in range(20):  # layer mounts of the store go with the daemon
            if subprocess.run(["umount", str(mnt)], check=False, capture_output=True, timeout=30).returncode == 0:
                break
            time.sleep(0.5)


def free_bytes(p: Path) -> int:
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize


def state(c: warren.Client, store: Path) -> tuple:
    return (sorted(x.name for x in c.layers.list()), sorted(i.name for i in c.images.list()),
            sorted(os.listdir(store / "tmp")))


def one_file_layout(where: Path, size: int) -> Path:
    """An image of two layers: a small one, then one file of `size`
    incompressible bytes."""
    return make_layout(where, [tar_bytes([_ti("small", data=b"s\n")]),
                               tar_bytes([_ti("data/", tarfile.DIRTYPE, 0o755),
                                          _ti("data/big", data=os.urandom(size))])])


@pytest.mark.parametrize("where,size_mib", [
    ("extract", 2 * STORE_MIB),  # the tar's file alone does not fit
    ("mkfs", STORE_MIB * 6 // 10),  # the extracted tree fits; the EROFS image beside it does not
])
def test_store_full_during_import(small, work, where, size_mib):
    d, store = small
    c = d.client
    before, free0 = state(c, store), free_bytes(store)
    lay = one_file_layout(work / f"full-{where}", size_mib << 20)
    with pytest.raises(warren.ResourceExhausted) as ei:
        c.images.import_(str(lay), name=f"full/{where}:1", timeout=300)
    msg = ei.value.details
    assert "No space left on device" in msg, msg
    assert ("data/big" in msg) if where == "extract" else ("mkfs.erofs" in msg), msg
    assert state(c, store) == before
    assert free_bytes(store) >= free0 - (1 << 20)
    # The store still works: a small image converts.
    ok = make_layout(work / f"fits-{where}", [tar_bytes([_ti("f", data=where.encode())])])
    img = c.images.import_(str(ok), name=f"fits/{where}:1", timeout=300)
    c.images.remove(img.name)
    assert state(c, store) == before


def test_store_full_during_a_pull(small, registry, work):
    d, store = small
    c = d.client
    host, _ = registry
    ref = f"{host}/test/full:v1"
    run("skopeo", "copy", "--dest-tls-verify=false", f"oci:{one_file_layout(work / 'full-pull', 2 * STORE_MIB << 20)}:bad",
        f"docker://{ref}")
    before, free0 = state(c, store), free_bytes(store)
    with pytest.raises(warren.ResourceExhausted) as ei:
        c.images.pull(ref, timeout=300)
    msg = ei.value.details
    assert "No space left on device" in msg and f"write({store}/tmp/" in msg, msg
    assert state(c, store) == before
    assert free_bytes(store) >= free0 - (1 << 20)
