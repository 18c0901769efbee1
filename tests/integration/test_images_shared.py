"""A shared layer store on a real distributed file system, read on demand.

The tests start a one-node GlusterFS volume on this machine (glusterd with a
private working directory, one brick, FUSE clients: scripts/setup.sh installs
glusterfs-server and glusterfs-client from Debian's archive) and two warrend
"nodes", each with its own FUSE mount of the volume as its --layer-store (two
mounts: two page caches, as on two machines). Node A imports an image; node
B creates from it without converting anything: both read the same layer and
image records on the volume.

Reading on demand without warrend's read cache (the default): node B mounts
each layer file-backed, straight from the EROFS image file on its FUSE mount
(no loop device, no copy), so only the blocks a sandbox touches are read
from the store; what caches them is the node's page cache over its FUSE
mount plus GlusterFS's client io-cache translator (enabled here with a
64 MiB cap). warrend's own node-local read cache (--layer-cache-bytes: chunks
on local disk, LRU under a cap, per-layer store-read counter, hot-list
prefetch) is tested over the same volume in test_images_read_cache.py.

Bytes read from the store are the brick's own count (`gluster volume profile
... info`: "Data Read"), not a client estimate."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
import warren
from conftest import NODE_PREFIX, Daemon
from test_images import _ti, make_layout, tar_bytes

pytestmark = pytest.mark.skipif(
    shutil.which("glusterd") is None or shutil.which("glusterfs") is None,
    reason="needs glusterd and glusterfs (scripts/setup.sh installs glusterfs-server "
    "and glusterfs-client)",
)


class Gluster:
    def __init__(self, root: Path):
        self.root = root
        self.sock = root / "run/glusterd.sock"
        self.pidfile = root / "run/glusterd.pid"
        self.volume = "warren" + secrets.token_hex(3)
        self.mounts: list[Path] = []

    def cli(self, *args: str, timeout: float = 60) -> str:
        p = subprocess.run(
            ["gluster", f"--glusterd-sock={self.sock}", "--mode=script", *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if p.returncode != 0:
            raise RuntimeError(f"gluster {' '.join(args)}: {p.stdout} {p.stderr}")
        return p.stdout

    def start(self) -> None:
        for d in ("wd", "brick", "run", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "glusterd",
                "-p",
                str(self.pidfile),
                "-l",
                str(self.root / "log/glusterd.log"),
                "--xlator-option",
                f"management.working-directory={self.root / 'wd'}",
                "--xlator-option",
                f"management.glusterd-sockfile={self.sock}",
            ],
            check=True,
            timeout=30,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                self.cli("volume", "list")
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        # glusterd refuses "localhost"/127.0.0.1 as a brick host; this
        # machine's name (which resolves to loopback here) is accepted.
        host = socket.gethostname()
        self.cli(
            "volume", "create", self.volume, f"{host}:{self.root / 'brick'}", "force"
        )
        self.cli("volume", "set", self.volume, "performance.io-cache", "on")
        self.cli("volume", "set", self.volume, "performance.cache-size", "64MB")
        self.cli("volume", "start", self.volume)
        self.cli("volume", "profile", self.volume, "start")
        self.host = host

    def mount(self, where: Path) -> Path:
        where.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "glusterfs",
                f"--volfile-server={self.host}",
                f"--volfile-id={self.volume}",
                "-l",
                str(self.root / f"log/{where.name}.log"),
                str(where),
            ],
            check=True,
            timeout=60,
        )
        self.mounts.append(where)
        deadline = time.monotonic() + 30
        while not os.path.ismount(where):
            assert time.monotonic() < deadline, f"glusterfs did not mount {where}"
            time.sleep(0.1)
        return where

    def bytes_read(self) -> int:
        """Bytes the brick served since the last call (the profile's interval)."""
        out = self.cli("volume", "profile", self.volume, "info", "incremental")
        return sum(int(x) for x in re.findall(r"Data Read: (\d+) bytes", out))

    def stop(self) -> None:
        for m in reversed(self.mounts):
            subprocess.run(["umount", "-l", str(m)], check=False, timeout=30)
        try:
            self.cli("volume", "stop", self.volume, timeout=60)
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        # glusterd and the brick process (glusterfsd) it started: by pid file.
        for pidfile in [self.pidfile, *(self.root / "wd").rglob("*.pid")]:
            try:
                pid = int(pidfile.read_text().strip())
                os.kill(pid, 15)
            except (OSError, ValueError):
                pass


@pytest.fixture(scope="module")
def gluster(test_root: Path) -> Iterable[Gluster]:
    yield from started_gluster(test_root / "gluster")


def started_gluster(root: Path) -> Iterable[Gluster]:
    """A started volume under `root` (its own brick: a brick dir another
    module's volume used is refused), stopped after the yield."""
    g = Gluster(root)
    try:
        g.start()
    except (RuntimeError, subprocess.SubprocessError, OSError) as e:
        g.stop()
        # Installed (pytestmark) but not running is a failure, not a skip:
        # only a kernel without FUSE is a reason the store cannot be tested.
        if not os.path.exists("/dev/fuse"):
            pytest.skip(f"the glusterfs client needs FUSE and /dev/fuse is absent: {e}")
        pytest.fail(f"glusterd is installed but did not start: {e}")
    yield g
    g.stop()


@pytest.fixture(scope="module")
def nodes(test_root: Path, gluster: Gluster) -> Iterable[tuple[Daemon, Daemon]]:
    a_store = gluster.mount(test_root / "gmnt-a") / "layers"
    b_store = gluster.mount(test_root / "gmnt-b") / "layers"
    a_store.mkdir(exist_ok=True)
    a = Daemon(test_root, "shared-a", a_store, NODE_PREFIX + "ga").start()
    b = Daemon(test_root, "shared-b", b_store, NODE_PREFIX + "gb").start()
    yield a, b
    for d in (b, a):
        d.stop()


def _busybox_layer() -> bytes:
    members = [
        _ti(d + "/", tarfile.DIRTYPE, 0o755)
        for d in ("bin", "etc", "tmp", "proc", "dev", "sys")
    ]
    members.append(
        _ti("bin/busybox", mode=0o755, data=Path("/bin/busybox").read_bytes())
    )
    for applet in ("sh", "cat", "head", "wc"):
        ti = tarfile.TarInfo("bin/" + applet)
        ti.type, ti.linkname = tarfile.SYMTYPE, "busybox"
        members.append((ti, b""))
    members.append(_ti("etc/passwd", data=b"root:x:0:0:root:/root:/bin/sh\n"))
    return tar_bytes(members)


def test_layers_on_glusterfs_are_read_on_demand(nodes, gluster, test_root):
    a, b = nodes
    # Node A imports: busybox, a 64 MiB file the task never reads in full,
    # and the task's own files.
    big = os.urandom(64 << 20)
    lay = make_layout(
        test_root / "shared-img",
        [
            _busybox_layer(),
            tar_bytes(
                [_ti("data/", tarfile.DIRTYPE, 0o755), _ti("data/big.bin", data=big)]
            ),
            tar_bytes(
                [
                    _ti("task/", tarfile.DIRTYPE, 0o755),
                    _ti("task/README", data=b"read me\n"),
                ]
            ),
        ],
    )
    img = a.client.images.import_(str(lay), name="shared/task:1", timeout=600)
    size = sum(x.size_bytes for x in img.layers)
    assert size > 64 << 20

    # Node B sees the image and the layers on its own mount: nothing converted.
    got = b.client.images.get("shared/task:1")
    assert [x.layer for x in got.layers] == [x.layer for x in img.layers]
    gluster.bytes_read()  # start a new profile interval
    t0 = time.monotonic()
    with b.client.create(image=got.name) as sb:
        r = sb.exec("cat /task/README; head -c 4096 /data/big.bin | wc -c", timeout=60)
        assert r.stdout == b"read me\n4096\n", r
        cold_s = time.monotonic() - t0
        read = gluster.bytes_read()
        # File-backed mounts of the blobs on B's FUSE mount: no loop device.
        loops = subprocess.run(
            ["losetup", "-a"], check=False, capture_output=True, text=True
        ).stdout
        assert "gmnt-b" not in loops, loops
        mounts = Path("/proc/self/mountinfo").read_text()
        assert any(
            f" {os.fspath(test_root / 'gmnt-b')}/layers/blobs/sha256/" in line
            or "gmnt-b/layers/blobs/sha256/" in line
            for line in mounts.splitlines()
        ), "no EROFS mount backed by a blob on node B's gluster mount"
    print(
        f"\nshared store: image {size} bytes, read {read} bytes from the brick "
        f"({100 * read / size:.1f} %), cold create+exec {cold_s:.2f} s"
    )
    # Reading one small file and 4 KiB of the big one reads a small share.
    assert read < 0.15 * size, (read, size)


def test_two_nodes_converting_the_same_layers_get_one_result(nodes, test_root):
    """Both nodes import the same new image at once onto the shared store:
    both succeed with the same layers, each blob stored once."""
    a, b = nodes
    lay = make_layout(test_root / "shared-race", [
        _busybox_layer(),
        tar_bytes([_ti("race/", tarfile.DIRTYPE, 0o755)] + [_ti(f"race/f{i}", data=os.urandom(1 << 16))
                                                             for i in range(64)]),
    ])
    results: dict = {}

    def one(node: Daemon, key: str) -> None:
        try:
            results[key] = node.client.images.import_(str(lay), name=f"shared/race-{key}:1", timeout=600)
        except Exception as e:  # noqa: BLE001 - reported by the assert below
            results[key] = e

    threads = [threading.Thread(target=one, args=(n, k)) for n, k in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert all(isinstance(r, warren.Image) for r in results.values()), results
    assert [x.layer for x in results["a"].layers] == [x.layer for x in results["b"].layers]
    blobs = os.listdir(a.layer_store / "blobs/sha256")
    for x in results["a"].layers:
        assert blobs.count(x.layer.split(":")[1]) == 1
    assert not [n for n in os.listdir(a.layer_store / "tmp") if not n.startswith(".")]
    with b.client.create(image=results["a"].name) as sb:
        assert sb.exec("cat /race/f0 | wc -c", timeout=60).stdout == b"65536\n"
