"""A sparse file in an image layer (1 GiB apparent, a few KiB of data),
imported from an OCI layout: the sandbox shows the same tree as `umoci
unpack` of the image (the reference), and the conversion writes no hole out
as data, neither into its scratch tree nor into the EROFS layer.

Two layers, the two forms a sparse file takes in a layer tar: as umoci (and
Docker's, BuildKit's: Go's archive/tar) writes it, densely, the holes as
runs of zeros; and as GNU tar --sparse writes it, a pax sparse (1.0) entry (umoci does not
read the old GNU "S" type)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Dict

import pytest

import warren
from conftest import Daemon
from test_images import assert_same_tree, sandbox_tree, tree

pytestmark = pytest.mark.skipif(shutil.which("umoci") is None or shutil.which("tar") is None,
                                reason="needs umoci and GNU tar (scripts/setup.sh installs umoci)")

GiB = 1 << 30
# The most a conversion of these layers may write (the layer blobs, gzip'ed
# zeros, are ~1 MiB each; the EROFS chunk index of a 1 GiB file is 1 MiB).
WRITE_CAP = 64 << 20


def run(*argv: str, timeout: float = 300) -> str:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{argv}: {r.stderr}"
    return r.stdout


def make_sparse(path: Path, marks: Dict[int, bytes]) -> None:
    """A 1 GiB file that is one hole but for `marks` (offset -> bytes)."""
    with open(path, "wb") as f:
        f.truncate(GiB)
        for off, data in marks.items():
            f.seek(off)
            f.write(data)
    assert os.stat(path).st_blocks * 512 < (1 << 20), "the test's own file is not sparse here"


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Path:
    """OCI layout, tag "sparse": layer 1 (umoci repack: holes as zeros) holds
    /data/dense.img, layer 2 (GNU tar --sparse, pax 1.0, added raw) /data/gnu.img."""
    work = tmp_path_factory.mktemp("sparse")
    lay = work / "oci"
    run("umoci", "init", "--layout", str(lay))
    run("umoci", "new", "--image", f"{lay}:sparse")
    b = work / "bundle"
    run("umoci", "unpack", "--image", f"{lay}:sparse", str(b))
    r = b / "rootfs"
    for d in ("bin", "etc", "tmp", "proc", "dev", "sys", "data"):
        (r / d).mkdir(parents=True, exist_ok=True)
    os.chmod(r / "tmp", 0o1777)
    shutil.copy2("/bin/busybox", r / "bin/busybox")
    os.symlink("busybox", r / "bin/sh")
    (r / "data/small").write_text("not sparse\n")
    make_sparse(r / "data/dense.img", {0: os.urandom(4096), 512 << 20: b"hello", GiB - 4: b"tail"})
    run("umoci", "repack", "--image", f"{lay}:sparse", str(b))
    shutil.rmtree(b)
    src = work / "gnu"
    (src / "data").mkdir(parents=True)
    make_sparse(src / "data/gnu.img", {100 << 20: os.urandom(3000), 900 << 20: b"middle"})
    tar = work / "gnu.tar"
    run("tar", "--sparse", "--format=pax", "--sparse-version=1.0", "--numeric-owner", "--owner=0", "--group=0", "-cf", str(tar), "-C", str(src), "data")
    assert os.path.getsize(tar) < (1 << 20), "GNU tar wrote no sparse entry"
    run("umoci", "raw", "add-layer", "--image", f"{lay}:sparse", str(tar))
    return lay


@pytest.fixture(scope="module")
def reference(layout: Path, tmp_path_factory) -> Path:
    ref = tmp_path_factory.mktemp("sparse-ref") / "bundle"
    run("umoci", "unpack", "--image", f"{layout}:sparse", str(ref))
    return ref / "rootfs"


def wchar(pid: int) -> int:
    """Bytes the process (and the children it reaped: mkfs.erofs) passed to
    write calls."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/PID/io")


def test_sparse_layers_convert_without_their_holes(client: warren.Client, daemon: Daemon, layout, reference,
                                                   layer_store):
    assert daemon.proc is not None
    before = wchar(daemon.proc.pid)
    img = client.images.import_(str(layout), ref_name="sparse", name="sparse/img:1", timeout=600)
    written = wchar(daemon.proc.pid) - before
    try:
        assert len(img.layers) == 2
        # Neither the scratch tree nor mkfs.erofs wrote the holes out.
        assert written < WRITE_CAP, f"the conversion wrote {written} bytes"
        for x in img.layers:
            assert x.size_bytes < 8 << 20, f"layer {x.layer_name} is {x.size_bytes} bytes"
            blob = layer_store / "blobs/sha256" / x.layer.split(":")[1]
            assert os.stat(blob).st_blocks * 512 < 8 << 20
        with client.create(image=img.name) as sb:
            want = tree(reference)
            assert want["data/dense.img"][4] == GiB and want["data/gnu.img"][4] == GiB
            assert_same_tree(sandbox_tree(sb), want)
            r = sb.exec(["/bin/busybox", "dd", "if=/data/gnu.img", "bs=1", f"skip={900 << 20}", "count=6"],
                        timeout=60)
            assert r.stdout == b"middle", r.stderr
    finally:
        client.images.remove(img.name)
