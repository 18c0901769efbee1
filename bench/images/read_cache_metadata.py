"""Images: what keeping mounted layers' metadata local saves, beside the same
read cache without it, in one invocation (issue 14, item 4).

A one-node GlusterFS volume on loopback (the Gluster helper of
tests/integration/test_images_shared.py). Node A (warrend --chunked-layers:
every layer metadata first) imports an image onto it:
busybox, a "repo" layer of --files small files in 100 directories, and a
layer holding a --churn-mib file of random bytes. Two fresh nodes, each on
its own FUSE mount of the volume, with the read cache at --cap-mib:
  keep     the default: a mounted layer's metadata prefix (erofs_layout.h)
           is read whole at the mount and never evicted;
  no-keep  warrend --no-layer-cache-keep-metadata: the metadata chunks are
           evicted like any other.
Per node, in one sandbox: a first metadata walk of the repo (`find -size +0`:
lookups, stat and readdir of every entry, no file data), then
--runs times: read the churn file (more data than the cap: the cache's LRU
turns over), drop the node's page, dentry and inode caches
(`/proc/sys/vm/drop_caches`, so EROFS asks its backing file again), and walk
again. Reported: the walk's time (median) and the bytes the cache read from
the store for the repo layer during the walks after churn
(`warren_layer_store_read_bytes_total{layer}`), beside the repo layer's
image size and its metadata kept (`warren_layer_read_cache_metadata_bytes`).

  .venv/bin/python bench/images/read_cache_metadata.py [--files 20000] [--churn-mib 256] [--cap-mib 64] [--runs 3]
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
from test_metrics import Scrape, _free_port  # noqa: E402


def repo_layer(files: int) -> bytes:
    entries = [_ti("repo/", tarfile.DIRTYPE, 0o755)]
    entries += [_ti(f"repo/pkg{d}/", tarfile.DIRTYPE, 0o755) for d in range(100)]
    entries += [_ti(f"repo/pkg{i % 100}/module_{i}.py", data=os.urandom(200 + (i * 37) % 3000)) for i in range(files)]
    return tar_bytes(entries)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--churn-mib", type=int, default=256)
    ap.add_argument("--cap-mib", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="warren-bench-rcmeta-", dir="/var/tmp"))
    g = Gluster(root / "gluster")
    daemons: list[Daemon] = []
    try:
        g.start()

        def node(name: str, extra: list[str]) -> Daemon:
            return gluster_node(g, root, name, f"rm{name[:2]}{os.getpid()}", extra, daemons)

        lay = make_layout(root / "img", [
            _busybox_layer(),
            repo_layer(a.files),
            tar_bytes([_ti("data/", tarfile.DIRTYPE, 0o755), _ti("data/f", data=os.urandom(a.churn_mib << 20))]),
        ])
        img = node("a", ["--chunked-layers"]).client.images.import_(str(lay), name="rc/meta:1", timeout=1800)
        repo = img.layers[1].layer
        repo_bytes = os.stat(daemons[0].layer_store / "blobs" / "sha256" / repo.split(":")[1]).st_size
        walk = "find /repo -size +0 | wc -l"  # busybox find: -size stats every entry
        rows = {}
        for mode, extra in (("keep", []), ("no-keep", ["--no-layer-cache-keep-metadata"])):
            port = _free_port()
            d = node(mode, ["--layer-cache-bytes", str(a.cap_mib << 20), "--metrics-listen", f"127.0.0.1:{port}",
                            *extra])
            with d.client.create(image=img.name, timeout=300) as sb:
                first = sb.exec(walk, timeout=600)
                assert first.exit_code == 0 and int(first.stdout) >= a.files, first
                time.sleep(1)  # the metadata walk of the mount (keep) is done by now
                kept = Scrape(port).get("warren_layer_read_cache_metadata_bytes")
                times, store_reads = [], []
                for _ in range(a.runs):
                    r = sb.exec("cat /data/f | wc -c", timeout=600)
                    assert r.stdout == f"{a.churn_mib << 20}\n".encode(), r
                    Path("/proc/sys/vm/drop_caches").write_text("3\n")
                    before = Scrape(port).get("warren_layer_store_read_bytes_total", layer=repo)
                    t = time.monotonic()
                    r = sb.exec(walk, timeout=600)
                    times.append(time.monotonic() - t)
                    assert r.stdout == first.stdout, r
                    store_reads.append(Scrape(port).get("warren_layer_store_read_bytes_total", layer=repo) - before)
            rows[mode] = (kept, statistics.median(times), statistics.median(store_reads))
            d.stop()
        print(f"repo layer: {a.files} files, EROFS image {repo_bytes / (1 << 20):.1f} MiB; cache cap {a.cap_mib} MiB; "
              f"churn {a.churn_mib} MiB; {a.runs} runs (medians)")
        print(f"  metadata kept (all mounted layers): keep {rows['keep'][0] / (1 << 20):.2f} MiB, "
              f"no-keep {rows['no-keep'][0] / (1 << 20):.2f} MiB")
        for i, what in ((1, "walk after churn, s"), (2, "store bytes read for the repo per walk after churn")):
            k, n = rows["keep"][i], rows["no-keep"][i]
            ratio = f"{k / n:.2f}x" if n else "n/a"
            print(f"  {what}: keep {k:.3f}, no-keep {n:.3f}: keep / no-keep {ratio}")
    finally:
        for d in reversed(daemons):
            d.stop()
        g.stop()
        unmount_and_remove(root)


if __name__ == "__main__":
    sys.exit(main())
