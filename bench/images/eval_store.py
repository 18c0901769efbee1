"""Images: bytes read from a shared layer store for the eval tasks, and
create -> first exec from it cold (a node that never read the image) and
warm.

A one-node GlusterFS volume on loopback (the Gluster helper of
tests/integration/test_images_shared.py: glusterd with a private working
dir, FUSE clients, `gluster volume profile` counting the brick's reads).
Node A imports a task image onto the volume: an OCI layout built here from
the three rootfs dirs scripts/setup.sh prepared (Debian 12 base without
/dev's device nodes, the python toolset, the more-itertools workspace), one
uncompressed tar layer each. Node B, on its own FUSE mount, runs eval
rollouts of the shipped more-itertools tasks from that image's layers; the
brick's "Data Read" over B's first create and the rollouts is compared with
the image's size (its EROFS layers). Cold creates: fresh nodes, each on a
fresh FUSE mount (its own page cache), one create -> `true` each; warm: n
more creates on node B.

  .venv/bin/python bench/images/eval_store.py [--bugs 2] [-n 4] [-c 2] [--warm 10] [--cold 3] [--no-read-ahead]
      [--read-cache BYTES [--chunk-kb 64]] [--chunked-layers]

--read-cache runs the same workload twice in one invocation, each on its own
fresh node(s) over the same imported image: first the baseline (layers
mounted straight from the store), then with warrend's node-local read cache
(--layer-cache-bytes BYTES): its nodes also report what they read from the
store per layer (warren_layer_store_read_bytes_total), beside the brick's
count.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests/integration"))

import warren
from _cleanup import unmount_and_remove
from conftest import Daemon
from test_images_shared import Gluster
from test_metrics import Scrape, _free_port
from warren import eval as we

ROOTFS = Path(os.environ.get("WARREN_ROOTFS_DIR", "/var/cache/warren/rootfs"))
TAR = "application/vnd.oci.image.layer.v1.tar"
LAYERS = [("debian-12", ["--exclude=./dev/*"]), ("toolset-python", []), ("workspace-more-itertools-10.1.0", [])]


def sha_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def blob_bytes(lay: Path, data: bytes) -> dict:
    h = hashlib.sha256(data).hexdigest()
    (lay / "blobs/sha256" / h).write_bytes(data)
    return {"digest": "sha256:" + h, "size": len(data)}


def task_layout(lay: Path) -> None:
    (lay / "blobs/sha256").mkdir(parents=True)
    (lay / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    descs = []
    for name, extra in LAYERS:
        tmp = lay / f"{name}.tar"
        subprocess.run(["tar", "--numeric-owner", "--xattrs", "--xattrs-include=*", *extra, "-C",
                        str(ROOTFS / name), "-cf", str(tmp), "."], check=True, timeout=1800)
        h = sha_file(tmp)
        tmp.rename(lay / "blobs/sha256" / h)
        descs.append({"digest": "sha256:" + h, "size": (lay / "blobs/sha256" / h).stat().st_size, "mediaType": TAR})
    cfg = blob_bytes(lay, json.dumps({"os": "linux", "architecture": "amd64",
                                      "config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"]},
                                      "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in descs]}}).encode())
    man = blob_bytes(lay, json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                                      "config": dict(cfg, mediaType="application/vnd.oci.image.config.v1+json"),
                                      "layers": descs}).encode())
    (lay / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        dict(man, mediaType="application/vnd.oci.image.manifest.v1+json",
             annotations={"org.opencontainers.image.ref.name": "task"})]}))


def first_exec_s(client: warren.Client, image: str) -> float:
    t = time.monotonic()
    with client.create(image=image, timeout=300) as sb:
        assert sb.exec("true", timeout=120).exit_code == 0
        return time.monotonic() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bugs", type=int, default=2, help="bugs of the shipped tasks (2 tasks each)")
    ap.add_argument("-n", type=int, default=4, help="eval rollouts")
    ap.add_argument("-c", type=int, default=2, help="eval concurrency")
    ap.add_argument("--warm", type=int, default=10)
    ap.add_argument("--cold", type=int, default=3)
    ap.add_argument("--read-cache", type=int, default=0, metavar="BYTES",
                    help="also run with warrend --layer-cache-bytes BYTES (after the baseline, same image)")
    ap.add_argument("--chunk-kb", type=int, default=64, help="--layer-cache-chunk-kb of the cached run")
    ap.add_argument("--chunked-layers", action="store_true",
                    help="warrend --chunked-layers on every node (the import builds every layer metadata first)")
    ap.add_argument("--no-read-ahead", action="store_true",
                    help="the nodes' mounts read what is asked: GlusterFS read-ahead and io-cache off, the FUSE "
                         "mounts' kernel read-ahead 0")
    a = ap.parse_args()
    for name, _ in LAYERS:
        if not (ROOTFS / (name + ".complete")).exists():
            sys.exit(f"{ROOTFS / name} is not built (scripts/setup.sh)")
    root = Path(tempfile.mkdtemp(prefix="warren-bench-evalstore-", dir="/var/tmp"))
    g = Gluster(root / "gluster")
    daemons: list[Daemon] = []
    try:
        g.start()
        if a.no_read_ahead:
            for opt in ("performance.read-ahead", "performance.io-cache"):
                g.cli("volume", "set", g.volume, opt, "off")

        def node(name: str, cache: int = 0, prefetch: bool = True) -> Daemon:
            mnt = g.mount(root / f"mnt-{name}")
            if a.no_read_ahead:
                dev = os.stat(mnt).st_dev
                ra = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
                if ra.exists():
                    ra.write_text("0")
                else:
                    print(f"note: no {ra}: the kernel's read-ahead of {mnt} stays")
            store = mnt / "layers"
            store.mkdir(exist_ok=True)
            extra: list[str] = ["--chunked-layers"] if a.chunked_layers else []
            port = 0
            if cache:
                port = _free_port()
                extra += ["--layer-cache-bytes", str(cache), "--layer-cache-chunk-kb", str(a.chunk_kb),
                         "--metrics-listen", f"127.0.0.1:{port}"]
                if not prefetch:
                    extra.append("--no-layer-cache-prefetch")
            d = Daemon(root, name, store, f"es{name}{os.getpid()}", extra_args=extra).start()
            d.metrics_port = port  # type: ignore[attr-defined]
            daemons.append(d)
            return d

        t0 = time.monotonic()
        task_layout(root / "oci")
        t1 = time.monotonic()
        a_node = node("a")
        img = a_node.client.images.import_(str(root / "oci"), name="eval/task:1", timeout=3600)
        t2 = time.monotonic()
        shutil.rmtree(root / "oci")
        size = sum(x.size_bytes for x in img.layers)
        print(f"image: {len(img.layers)} layers, EROFS {size / 2**20:.1f} MiB; layout built in {t1 - t0:.1f} s, "
              f"imported onto the volume by node A in {t2 - t1:.1f} s")
        stack = tuple(x.layer_name for x in img.stack)
        tasks = we.load_tasks(ROOT / "eval/tasks/more-itertools")
        stems: list[str] = []
        for t in tasks:
            stem = t.id.rsplit("-", 1)[0]
            if stem not in stems:
                stems.append(stem)
        keep = set(stems[:a.bugs])
        picked = [dataclasses.replace(t, layers=stack) for t in tasks if t.id.rsplit("-", 1)[0] in keep]

        def counted(d: Daemon) -> str:
            if not d.metrics_port:  # type: ignore[attr-defined]
                return ""
            n = Scrape(d.metrics_port).total("warren_layer_store_read_bytes_total")  # type: ignore[attr-defined]
            return f"; the node's read cache counted {n / 2**20:.1f} MiB = {100 * n / size:.1f} % from the store"

        for mode, cache in [("direct", 0)] + ([("read cache", a.read_cache)] if a.read_cache else []):
            b = node("b" if not cache else "bc", cache)
            g.bytes_read()  # a new profile interval
            cold_b = first_exec_s(b.client, img.name)
            read_first = g.bytes_read()
            rep = we.run(b.client, picked, n=a.n, concurrency=a.c)
            read_eval = g.bytes_read()
            assert rep.all_correct, rep.summary
            read = read_first + read_eval
            print(f"[{mode}] node B: first create->exec {cold_b:.2f} s read {read_first / 2**20:.1f} MiB; "
                  f"{a.n} eval rollouts ({len(picked)} tasks, c={a.c}, all correct) read {read_eval / 2**20:.1f} MiB "
                  f"more: brick read {read / 2**20:.1f} MiB = {100 * read / size:.1f} % of the image{counted(b)}")
            warm = [first_exec_s(b.client, img.name) for _ in range(a.warm)]
            print(f"[{mode}] create->first exec warm (node B) p50 {1000 * statistics.median(warm):.0f} ms "
                  f"(n={len(warm)})")
            b.stop()
            # Cold: fresh nodes (own FUSE mount, empty cache). With the cache,
            # without and then with the hot list node B recorded in the store.
            for pf in [False, True] if cache else [False]:
                colds, reads = [], []
                for i in range(a.cold):
                    d = node(f"c{i}" if not cache else f"c{i}{'p' if pf else 'n'}", cache, prefetch=pf)
                    g.bytes_read()
                    colds.append(first_exec_s(d.client, img.name))
                    reads.append(g.bytes_read())
                    d.stop()
                what = "" if not cache else (" + prefetch of the hot list" if pf else ", no prefetch")
                print(f"[{mode}{what}] create->first exec cold p50 {1000 * statistics.median(colds):.0f} ms "
                      f"(n={len(colds)}: {', '.join(f'{1000 * x:.0f}' for x in colds)}); brick read per cold create "
                      f"p50 {statistics.median(reads) / 2**20:.1f} MiB")
    finally:
        for d in reversed(daemons):
            d.stop()
        g.stop()
        unmount_and_remove(root)


if __name__ == "__main__":
    sys.exit(main())
