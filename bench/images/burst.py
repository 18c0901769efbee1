"""Images: a burst of creates over many distinct images, beside the same
burst over one image in the same run (the peer floor: what the burst costs
without the images' variety).

warrend of this tree runs with its own layer store. --images distinct images
are imported from OCI layouts built here: every image is a busybox layer
(shared: converted once) plus its own small top layer (/id naming it), as
task images share a base and differ in their top. Then two bursts of
--creates creates with --concurrency in flight: over one image, then over
all images (create i uses image i % --images). Each create is followed by a
first exec (`cat /id`, checked); a sandbox stays up until the whole burst is
up, then all are destroyed. Recorded: all up (or the errors), the rate
(creates / wall time until all are up) and create -> first exec p50/p99.

  .venv/bin/python bench/images/burst.py [--images 100] [--creates 500] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import warren
from _cleanup import unmount_and_remove
from pull import ROOT, blob, layer_tar, pct

TAR = "application/vnd.oci.image.layer.v1.tar"


def make_layouts(root: Path, count: int) -> list[Path]:
    """`count` OCI layouts sharing the busybox layer, each with its own top."""
    base = layer_tar({"bin/busybox": Path("/bin/busybox").read_bytes()},
                     dirs=["bin/", "etc/", "tmp/", "proc/", "dev/", "sys/"],
                     links={"bin/sh": "busybox", "bin/cat": "busybox", "bin/true": "busybox"})
    out = []
    for i in range(count):
        lay = root / f"img{i}"
        (lay / "blobs/sha256").mkdir(parents=True)
        (lay / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        descs = [dict(blob(lay, t), mediaType=TAR) for t in (base, layer_tar({"id": f"img{i}\n".encode()}))]
        cfg = blob(lay, json.dumps({"os": "linux", "architecture": "amd64", "config": {"Env": ["PATH=/bin"]},
                                    "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in descs]}}).encode())
        man = blob(lay, json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                                    "config": dict(cfg, mediaType="application/vnd.oci.image.config.v1+json"),
                                    "layers": descs}).encode())
        (lay / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
            dict(man, mediaType="application/vnd.oci.image.manifest.v1+json",
                 annotations={"org.opencontainers.image.ref.name": "v1"})]}))
        out.append(lay)
    return out


def burst(client: warren.Client, images: list[str], creates: int, concurrency: int) -> dict:
    """creates creates (create i from images[i % len]) with `concurrency` in
    flight, each checked by a first exec; all kept up until the last is up."""
    lat: list[float] = []
    sandboxes: list[warren.Sandbox] = []
    errors: list[str] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        name = images[i % len(images)]
        t = time.monotonic()
        try:
            sb = client.create(image=name, timeout=300)
            with lock:
                sandboxes.append(sb)
            r = sb.exec("cat /id", timeout=120)
            if r.stdout.decode().strip() != name.split("/")[-1].split(":")[0]:
                raise RuntimeError(f"sandbox from {name} shows {r.stdout!r} {r.stderr!r}")
            with lock:
                lat.append(time.monotonic() - t)
        except Exception as e:  # noqa: BLE001 - counted and reported
            with lock:
                errors.append(f"{i}: {e}")

    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(creates)))
    wall = time.monotonic() - t0
    up = sum(1 for sb in sandboxes if sb.info().state == "running")
    t1 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda sb: sb.destroy(timeout=120), sandboxes))
    xs = [x * 1000 for x in lat]
    return {"images": len(images), "creates": creates, "up": up, "errors": errors, "wall_s": wall,
            "rate": len(lat) / wall, "p50_ms": pct(xs, 50) if xs else 0, "p99_ms": pct(xs, 99) if xs else 0,
            "destroy_s": time.monotonic() - t1}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=100)
    ap.add_argument("--creates", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=32)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="warren-bench-burst-", dir="/var/tmp"))
    proc = None
    client = None
    try:
        sock = root / "w.sock"
        proc = subprocess.Popen([str(ROOT / "build/src/warrend/warrend"), "--state-dir", str(root / "state"),
                                 "--socket", str(sock), "--layer-store", str(root / "layers"),
                                 "--node-id", f"bb{os.getpid()}"],
                                stdout=open(root / "warrend.log", "wb"),  # noqa: SIM115
                                stderr=subprocess.STDOUT)
        client = warren.Client(f"unix:{sock}")
        for _ in range(300):
            try:
                client.status(timeout=1)
                break
            except warren.WarrenError:
                time.sleep(0.1)
        t0 = time.monotonic()
        layouts = make_layouts(root / "layouts", a.images)
        names: list[str] = []
        with ThreadPoolExecutor(2) as pool:
            names = list(pool.map(lambda x: client.images.import_(str(x[1]), name=f"burst/img{x[0]}:v1",
                                                                  timeout=600).name, enumerate(layouts)))
        print(f"imported {len(names)} images (busybox + own top layer) in {time.monotonic() - t0:.1f} s")
        for label, imgs in (("one image (floor)", names[:1]), (f"{len(names)} images", names)):
            r = burst(client, imgs, a.creates, a.concurrency)
            print(f"{label}: {r['up']}/{r['creates']} up, {len(r['errors'])} errors, wall {r['wall_s']:.1f} s, "
                  f"{r['rate']:.1f} creates/s, create->first exec p50 {r['p50_ms']:.0f} ms p99 {r['p99_ms']:.0f} ms, "
                  f"destroy all {r['destroy_s']:.1f} s")
            for e in r["errors"][:5]:
                print("  error", e)
    finally:
        if client is not None:
            try:
                for sb in client.list(timeout=30):
                    client.get(sb.id).destroy(timeout=60)
            except warren.WarrenError:
                pass
            client.close()
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        unmount_and_remove(root)


if __name__ == "__main__":
    sys.exit(main())
