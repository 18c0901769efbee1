"""Images: what warrend's node-local read cache costs a sandbox's reads, beside
the direct mount, in one invocation.

A one-node GlusterFS volume on loopback (the Gluster helper of
tests/integration/test_images_shared.py). Node A imports an image (busybox +
one layer holding a file of random bytes) onto it; two fresh nodes, each on
its own FUSE mount of the volume, read that file in a sandbox with
`cat FILE | wc -c`:
  direct  layers mounted straight from the store (the default);
  cache   warrend --layer-cache-bytes CAP: layers mounted from the cache's
          FUSE files, chunks kept on local disk.
Per node, three reads of the whole file: cold (the node's first: the
store is read), re-read after dropping the layer mount's page cache with
POSIX_FADV_DONTNEED on the node's mount of the layer (direct: the store
again, through the node's GlusterFS mount and its client caches; cache: the
chunks on local disk), and hot (page cache). Re-read and hot: the median of
--runs reads each.

  .venv/bin/python bench/images/read_cache_cost.py [--mib 256] [--cap-mib 1024] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests/integration"))

from _cleanup import unmount_and_remove  # noqa: E402
from _nodes import gluster_node  # noqa: E402
from conftest import Daemon  # noqa: E402
from test_images import _ti, make_layout, tar_bytes  # noqa: E402
from test_images_shared import Gluster, _busybox_layer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256, help="size of the file read (MiB)")
    ap.add_argument("--cap-mib", type=int, default=1024, help="--layer-cache-bytes of the cache node (MiB)")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="warren-bench-rccost-", dir="/var/tmp"))
    g = Gluster(root / "gluster")
    daemons: list[Daemon] = []
    try:
        g.start()

        def node(name: str, extra: list[str]) -> Daemon:
            return gluster_node(g, root, name, f"rc{name}{os.getpid()}", extra, daemons)

        lay = make_layout(root / "img", [
            _busybox_layer(),
            tar_bytes([_ti("data/", tarfile.DIRTYPE, 0o755), _ti("data/f", data=os.urandom(a.mib << 20))]),
        ])
        img = node("a", []).client.images.import_(str(lay), name="rc/cost:1", timeout=1800)
        data_hex = img.layers[1].layer.split(":")[1]
        rows = {}
        for mode, extra in (("direct", []), ("cache", ["--layer-cache-bytes", str(a.cap_mib << 20)])):
            d = node(mode, extra)
            with d.client.create(image=img.name, timeout=300) as sb:
                f = d.state_dir / "mnt" / data_hex / "data/f"

                def read() -> float:
                    t = time.monotonic()
                    r = sb.exec("cat /data/f | wc -c", timeout=600)
                    assert r.stdout == f"{a.mib << 20}\n".encode(), r
                    return time.monotonic() - t

                def drop() -> None:
                    fd = os.open(f, os.O_RDONLY)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    os.close(fd)

                cold = read()
                reread = []
                for _ in range(a.runs):
                    drop()
                    reread.append(read())
                hot = [read() for _ in range(a.runs)]
            rows[mode] = (cold, statistics.median(reread), statistics.median(hot))
            d.stop()
        mib = a.mib
        print(f"read of a {mib} MiB file in a sandbox (cat | wc -c), s and MiB/s; ratio cache / direct time")
        for i, what in enumerate(("cold (from the store)", "re-read, layer page cache dropped", "hot (page cache)")):
            dt, ct = rows["direct"][i], rows["cache"][i]
            print(f"  {what}: direct {dt:.2f} s ({mib / dt:.0f} MiB/s), cache {ct:.2f} s ({mib / ct:.0f} MiB/s): "
                  f"{ct / dt:.2f}x")
    finally:
        for d in reversed(daemons):
            d.stop()
        g.stop()
        unmount_and_remove(root)


if __name__ == "__main__":
    sys.exit(main())
