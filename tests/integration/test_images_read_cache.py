"""The node-local read cache of layer images over a shared store on GlusterFS.

Node A (no cache) imports an image onto a one-node GlusterFS volume (the
Gluster helper of test_images_shared.py: glusterd on loopback, FUSE
clients); node B, on its own FUSE mount of the volume, runs with
`--layer-cache-bytes` (8 MiB, 64 KiB chunks): its EROFS layers are mounted
file-backed from the cache's FUSE files (<state>/layer-files/<hex>), which
read the store one chunk at a time on a miss and keep chunks on B's local
disk, least recently used evicted first. What is checked, through warrend's
/metrics (`warren_layer_store_read_bytes_total{layer=...}`,
`warren_layer_read_cache_*`) and the cache dir on disk: the counter moves by
what a sandbox reads, the cap holds while a sandbox reads 8x the cap, a
mounted layer keeps reading right after its chunks were evicted, and a bad
cache dir stops the daemon at start with the dir named and nothing mounted.
When the first sandbox is gone, what it read is the layer's hot list in the
store (read ahead by the next node that mounts it: the unit test and
bench/images/eval_store.py --read-cache measure that).
(The LRU order, a full cache disk, prefetch: tests/unit/image/read_cache_test.cc.)
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from conftest import NODE_PREFIX, WARREND, Daemon
from test_images import _ti, make_layout, tar_bytes
from test_images_shared import Gluster, _busybox_layer, pytestmark, started_gluster  # noqa: F401 - skip mark
from test_metrics import Scrape, _free_port

MIB = 1 << 20
CAP = 8 * MIB
CHUNK = 64 << 10


@pytest.fixture(scope="module")
def gluster(test_root: Path) -> Iterable[Gluster]:
    yield from started_gluster(test_root / "gluster-rc")


@pytest.fixture(scope="module")
def nodes(test_root: Path, gluster: Gluster) -> Iterable[tuple[Daemon, Daemon]]:
    a_store = gluster.mount(test_root / "rc-gmnt-a") / "layers"
    b_store = gluster.mount(test_root / "rc-gmnt-b") / "layers"
    a_store.mkdir(exist_ok=True)
    # Node A converts the image: every layer chunk-based, metadata first.
    a = Daemon(test_root, "rc-a", a_store, NODE_PREFIX + "ra", extra_args=["--chunked-layers"]).start()
    port = _free_port()
    b = Daemon(
        test_root, "rc-b", b_store, NODE_PREFIX + "rb",
        extra_args=["--layer-cache-bytes", str(CAP), "--layer-cache-chunk-kb", str(CHUNK >> 10),
                    "--metrics-listen", f"127.0.0.1:{port}"],
    )
    b.metrics_port = port  # type: ignore[attr-defined]
    b.start()
    yield a, b
    for d in (b, a):
        d.stop()
    assert not os.path.ismount(b.state_dir / "layer-files"), "the cache's FUSE mount outlived its daemon"


@pytest.fixture(scope="module")
def image(nodes: tuple[Daemon, Daemon], test_root: Path) -> tuple[str, str, bytes]:
    """(image name, digest of the layer holding /data/big.bin, its bytes)."""
    a, _ = nodes
    big = os.urandom(64 * MIB)
    lay = make_layout(test_root / "rc-img", [
        _busybox_layer(),
        tar_bytes([_ti("data/", tarfile.DIRTYPE, 0o755), _ti("data/big.bin", data=big)]),
        tar_bytes([_ti("task/", tarfile.DIRTYPE, 0o755), _ti("task/README", data=b"read me\n")]),
    ])
    img = a.client.images.import_(str(lay), name="rc/task:1", timeout=600)
    return img.name, img.layers[1].layer, big


def _layer_read(b: Daemon, digest: str) -> float:
    return Scrape(b.metrics_port).get("warren_layer_store_read_bytes_total", layer=digest)  # type: ignore[attr-defined]


def _cache_disk_bytes(b: Daemon) -> int:
    return sum(p.stat().st_blocks * 512 for p in (b.state_dir / "layer-cache").iterdir())


def test_counter_moves_by_what_a_sandbox_reads(nodes, image, gluster):
    _, b = nodes
    name, big_layer, _ = image
    gluster.bytes_read()  # a new profile interval
    with b.client.create(image=name, timeout=300) as sb:
        assert sb.exec("cat /task/README", timeout=60).stdout == b"read me\n"
        # The layers are mounted from the cache's files, not from the store.
        mounts = Path("/proc/self/mountinfo").read_text()
        assert f"{b.state_dir}/layer-files/" in mounts, "no EROFS layer mounted through the read cache"
        before = _layer_read(b, big_layer)
        assert before <= 4 * CHUNK, before  # the superblock and the root dir: a chunk or two
        r = sb.exec("head -c 4194304 /data/big.bin | wc -c", timeout=120)
        assert r.stdout == b"4194304\n", r
        moved = _layer_read(b, big_layer) - before
        # What was read, in whole chunks, plus at most the mount's read-ahead.
        assert 4 * MIB <= moved <= 5 * MIB, moved
        s = Scrape(b.metrics_port)  # type: ignore[attr-defined]
        store_total = s.total("warren_layer_store_read_bytes_total")
        assert s.get("warren_layer_read_cache_chunks_total", result="miss") * CHUNK >= moved
    # The brick served what the cache asked for (GlusterFS may read ahead of it).
    assert gluster.bytes_read() >= moved
    assert store_total > 0
    # The sandbox is gone: what its layers' first sandbox read is their hot
    # list in the shared store (offset length per line, whole chunks).
    # Bounded by what the store served for the layer by now, not by `moved`:
    # the kernel's asynchronous read-ahead may still have been reading a chunk
    # past the `head` when `moved` was taken (CI saw one chunk more).
    hot = (b.layer_store / "meta" / (big_layer.split(":")[1] + ".hot")).read_text().split()
    assert len(hot) >= 2 and all(int(x) % CHUNK == 0 for x in hot[0::2]), hot
    assert 4 * MIB <= sum(int(x) for x in hot[1::2]) <= _layer_read(b, big_layer), (hot, before, moved)


def test_cap_holds_and_a_mounted_layer_reads_right_after_eviction(nodes, image):
    _, b = nodes
    name, big_layer, big = image
    port = b.metrics_port  # type: ignore[attr-defined]
    evicted0 = Scrape(port).get("warren_layer_read_cache_evictions_total")
    want = hashlib.sha256(big).hexdigest().encode()
    with b.client.create(image=name, timeout=300) as sb:
        for i in range(2):  # 64 MiB through an 8 MiB cache, twice
            r = sb.exec("sha256sum /data/big.bin", timeout=300)
            assert r.stdout.split()[0] == want, (i, r)
            s = Scrape(port)
            assert s.get("warren_layer_read_cache_bytes") <= CAP
            assert s.get("warren_layer_read_cache_cap_bytes") == CAP
            # The mounted layers' metadata is kept local (never evicted: the
            # unit test read_cache_test.cc shows it read back without a store
            # read after such a pass), and it is a small part of the cache.
            assert 0 < s.get("warren_layer_read_cache_metadata_bytes") <= CAP // 2
            assert _cache_disk_bytes(b) <= CAP
            # Drop the layer's page cache on the node, so the next pass reads
            # through the cache again (its chunks were evicted meanwhile).
            mnt = b.state_dir / "mnt" / big_layer.split(":")[1] / "data/big.bin"
            fd = os.open(mnt, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        assert Scrape(port).get("warren_layer_read_cache_evictions_total") - evicted0 >= (2 * 64 * MIB - CAP) // CHUNK
        assert sb.exec("cat /task/README", timeout=60).stdout == b"read me\n"
    assert _layer_read(b, big_layer) >= 2 * 64 * MIB


@pytest.mark.parametrize("why", ["a file", "a read-only file system"])
def test_bad_cache_dir_stops_the_daemon_with_the_dir_named(test_root: Path, gluster: Gluster, why: str):
    state = test_root / f"rc-bad-{why[2:6]}-state"
    state.mkdir()
    if why == "a file":
        bad = test_root / "rc-cache-file"
        bad.write_text("not a dir")
    else:
        ro = test_root / "rc-ro"
        ro.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)], check=True)
        bad = ro / "cache"
    try:
        p = subprocess.run(
            [str(WARREND), "--state-dir", str(state), "--socket", str(test_root / "rc-bad.sock"),
             "--layer-store", str(test_root / "rc-bad-layers"), "--node-id", NODE_PREFIX + "rx",
             "--layer-cache-bytes", str(CAP), "--layer-cache-dir", str(bad)],
            check=False, stdin=subprocess.DEVNULL, capture_output=True, timeout=60, text=True,
        )
    finally:
        if why != "a file":
            subprocess.run(["umount", str(ro)], check=True)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert str(bad) in out and "--layer-cache" in out, out
    assert not os.path.ismount(state / "layer-files"), "a failed start left the cache's FUSE mount"
    assert str(state) not in Path("/proc/self/mountinfo").read_text()


def _holders(b: Daemon) -> list[int]:
    """Pids of warren-fuse-fd processes holding b's layer files (by argv)."""
    want = b"warren-fuse-fd\0" + str((b.state_dir / "layer-files").resolve()).encode() + b"\0"
    out = []
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                stat = Path(f"/proc/{e}/stat").read_text()
                if Path(f"/proc/{e}/cmdline").read_bytes() == want and stat.rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(int(e))
            except OSError:
                pass
    return out


def _drop_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def test_a_restart_without_the_cache_ends_the_previous_files(nodes, image, test_root: Path):
    """A node restarted without --layer-cache-bytes after a kill -9 ends the
    previous daemon's FUSE files and their holder: a layer still mounted
    from them fails its uncached reads (EIO) instead of waiting for a server
    that will not come, and its sandbox can be destroyed."""
    _, b = nodes
    name, big_layer, _ = image
    c = Daemon(test_root, "rc-c", b.layer_store, NODE_PREFIX + "rc",
               extra_args=["--layer-cache-bytes", str(CAP)]).start()
    try:
        sb = c.client.create(image=name, timeout=300)
        assert sb.exec("cat /task/README", timeout=60).stdout == b"read me\n"
        assert len(_holders(c)) == 1
        c.kill9()
        c.extra_args = []
        c.start()
        for _ in range(50):
            if not _holders(c):
                break
            time.sleep(0.1)
        assert _holders(c) == [], "the holder of the previous daemon's files is still running"
        assert not os.path.ismount(c.state_dir / "layer-files")
        sb = c.client.get(sb.id)
        try:  # (its inode may not be cached either: then the open fails already)
            _drop_page_cache(c.state_dir / "mnt" / big_layer.split(":")[1] / "data/big.bin")
        except OSError:
            pass
        r = sb.exec("cat /data/big.bin > /dev/null", timeout=60)
        assert r.exit_code != 0, r
        sb.destroy(timeout=60)
    finally:
        c.stop()
    assert str(c.state_dir) not in Path("/proc/self/mountinfo").read_text()


# Last in the module: it stops and restarts node B.
def test_running_sandboxes_keep_reading_their_layers_across_restarts(nodes, image):
    """kill -9 and SIGTERM restarts of a node with the read cache: the
    sandbox's layers are mounted from B's FUSE files, whose connection a
    holder process (warren-fuse-fd) keeps while no daemon serves it; the
    restarted daemon takes it over, and chunks no cache holds are read from
    the store again. A read made while the daemon is down waits and is
    served after the restart. Destroy + stop leaves no mount and no holder."""
    _, b = nodes
    name, big_layer, big = image
    mnt_big = b.state_dir / "mnt" / big_layer.split(":")[1] / "data/big.bin"
    want = hashlib.sha256(big).hexdigest().encode()
    sb = b.client.create(image=name, timeout=300)
    try:
        assert sb.exec("cat /task/README; head -c 1048576 /data/big.bin | wc -c", timeout=60).stdout == \
            b"read me\n1048576\n"
        holders = _holders(b)
        assert len(holders) == 1, holders
        holder = holders[0]

        b.kill9()
        assert _holders(b) == [holder], "the holder died with the daemon"
        # A read while no daemon serves: it waits in the kernel for the next one.
        _drop_page_cache(mnt_big)
        got: list[bytes] = []

        def read_while_down() -> None:
            with open(mnt_big, "rb") as f:
                f.seek(40 * MIB)
                got.append(f.read(MIB))

        t = threading.Thread(target=read_while_down)
        t.start()
        t.join(1.0)
        assert t.is_alive(), "a read of an uncached chunk was answered with no daemon running"
        b.start()
        t.join(60)
        assert got == [big[40 * MIB:41 * MIB]]

        listed = {s.id: s for s in b.client.list()}
        assert sb.id in listed
        sb = listed[sb.id]
        assert _holders(b) == [holder], "the restarted daemon started a holder of its own"
        _drop_page_cache(mnt_big)
        r = sb.exec("cat /task/README; sha256sum /data/big.bin", timeout=300)
        assert r.exit_code == 0 and r.stdout.startswith(b"read me\n") and r.stdout.split()[2] == want, r
        assert _layer_read(b, big_layer) >= 64 * MIB - MIB, "the new daemon's cache read the layer from the store"

        # A clean stop with the sandbox running leaves the files held too.
        assert b.stop(destroy=False) == 0
        assert os.path.ismount(b.state_dir / "layer-files") and _holders(b) == [holder]
        b.start()
        _drop_page_cache(mnt_big)
        sb = b.client.get(sb.id)
        r = sb.exec("tail -c 65536 /data/big.bin | sha256sum", timeout=120)
        assert r.stdout.split()[0] == hashlib.sha256(big[-65536:]).hexdigest().encode(), r
    finally:
        sb.destroy(timeout=60)
    # Destroyed and stopped: the layers are unmounted, then the files, and the holder is gone.
    assert b.stop() == 0
    assert not os.path.ismount(b.state_dir / "layer-files")
    assert str(b.state_dir) not in Path("/proc/self/mountinfo").read_text()
    for _ in range(50):
        if not _holders(b):
            break
        time.sleep(0.1)
    assert _holders(b) == [], "the holder outlived the file system"
    b.start()  # for the module's teardown
