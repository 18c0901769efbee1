"""Images: pull of a new multi-layer image to its first exec result, beside
the time a user would otherwise spend (skopeo copy + umoci unpack of the
same image from the same registry) in the same run; and create -> first
exec from an already converted large vs small image.

A docker-registry on loopback (Debian's docker-registry) serves images built
here: a busybox layer plus data layers of incompressible files (1 MiB each),
as uncompressed OCI tar layers (no gzip cost on either side), pushed with
skopeo. warrend of this tree runs with its own layer store.

  .venv/bin/python bench/images/pull.py [--mib 1024] [--layers 4] [--small-mib 100] [-n 10]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

import warren
from _cleanup import unmount_and_remove

ROOT = Path(__file__).resolve().parents[2]
TAR = "application/vnd.oci.image.layer.v1.tar"


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=1800)


def blob(lay: Path, data: bytes) -> dict:
    h = hashlib.sha256(data).hexdigest()
    (lay / "blobs/sha256" / h).write_bytes(data)
    return {"digest": "sha256:" + h, "size": len(data)}


def layer_tar(files: dict[str, bytes], dirs: list[str] = (), links: dict[str, str] = {}) -> bytes:  # noqa: B006
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for d in dirs:
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode = tarfile.DIRTYPE, 0o755
            t.addfile(ti)
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(data), 0o755
            t.addfile(ti, io.BytesIO(data))
        for name, target in links.items():
            ti = tarfile.TarInfo(name)
            ti.type, ti.linkname = tarfile.SYMTYPE, target
            t.addfile(ti)
    return buf.getvalue()


def make_image(lay: Path, tag: str, mib: int, layers: int) -> None:
    """An OCI layout `lay` (one image, ref name `tag`): busybox + `layers`
    data layers holding `mib` MiB of random 1 MiB files in all."""
    (lay / "blobs/sha256").mkdir(parents=True)
    (lay / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    tars = [layer_tar({"bin/busybox": Path("/bin/busybox").read_bytes()},
                      dirs=["bin/", "etc/", "tmp/", "proc/", "dev/", "sys/", "data/"],
                      links={"bin/sh": "busybox", "bin/cat": "busybox", "bin/true": "busybox"})]
    per = mib // layers
    for i in range(layers):
        tars.append(layer_tar({f"data/l{i}/f{j}": os.urandom(1 << 20) for j in range(per)}, dirs=[f"data/l{i}/"]))
    descs = [dict(blob(lay, t), mediaType=TAR) for t in tars]
    diff_ids = [d["digest"] for d in descs]
    cfg = blob(lay, json.dumps({"os": "linux", "architecture": "amd64", "config": {"Env": ["PATH=/bin"]},
                                "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode())
    man = blob(lay, json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                                "config": dict(cfg, mediaType="application/vnd.oci.image.config.v1+json"),
                                "layers": descs}).encode())
    (lay / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        dict(man, mediaType="application/vnd.oci.image.manifest.v1+json",
             annotations={"org.opencontainers.image.ref.name": tag})]}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--small-mib", type=int, default=100)
    ap.add_argument("-n", type=int, default=10)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="warren-bench-images-", dir="/var/tmp"))
    procs: list[subprocess.Popen] = []
    client = None
    try:
        port = free_port()
        (root / "registry.yml").write_text(f"version: 0.1\nlog: {{level: warn}}\nstorage:\n"
                                           f"  filesystem: {{rootdirectory: {root / 'registry'}}}\n"
                                           f"http: {{addr: \"127.0.0.1:{port}\"}}\n")
        procs.append(subprocess.Popen(["docker-registry", "serve", str(root / "registry.yml")],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        host = f"127.0.0.1:{port}"
        for name, mib, layers in (("big", a.mib, a.layers), ("big2", a.mib, a.layers), ("small", a.small_mib, 1)):
            make_image(root / name, name, mib, layers)
            run("skopeo", "copy", "--dest-tls-verify=false", f"oci:{root / name}:{name}", f"docker://{host}/b/{name}:1")
            shutil.rmtree(root / name)
        sock = root / "w.sock"
        procs.append(subprocess.Popen([str(ROOT / "build/src/warrend/warrend"), "--state-dir", str(root / "state"),
                                       "--socket", str(sock), "--layer-store", str(root / "layers"),
                                       "--node-id", f"ib{os.getpid()}"],
                                      stdout=open(root / "warrend.log", "wb"),  # noqa: SIM115
                                      stderr=subprocess.STDOUT))
        client = warren.Client(f"unix:{sock}")
        for _ in range(300):
            try:
                client.status(timeout=1)
                break
            except warren.WarrenError:
                time.sleep(0.1)

        # 1. The peer floor: skopeo copy to a local OCI layout + umoci unpack.
        t0 = time.monotonic()
        run("skopeo", "copy", "--src-tls-verify=false", f"docker://{host}/b/big:1", f"oci:{root / 'peer'}:big")
        t1 = time.monotonic()
        run("umoci", "unpack", "--image", f"{root / 'peer'}:big", str(root / "peer-bundle"))
        t2 = time.monotonic()
        shutil.rmtree(root / "peer")
        subprocess.run(["rm", "-rf", "--one-file-system", str(root / "peer-bundle")], check=False)
        # 2. warren: pull (fetch + convert each layer) -> create -> first exec result.
        t3 = time.monotonic()
        img = client.images.pull(f"{host}/b/big2:1", timeout=1800)
        t4 = time.monotonic()
        with client.create(image=img.name) as sb:
            assert sb.exec("true", timeout=60).exit_code == 0
            t5 = time.monotonic()
        size = sum(x.size_bytes for x in img.layers)
        print(f"image: {a.mib} MiB in {a.layers} data layers + busybox; EROFS {size / 2**20:.0f} MiB")
        print(f"peer  skopeo copy {t1 - t0:.2f} s + umoci unpack {t2 - t1:.2f} s = {t2 - t0:.2f} s")
        print(f"warren pull {t4 - t3:.2f} s + create->first exec {t5 - t4:.2f} s = {t5 - t3:.2f} s "
              f"({(t5 - t3) / (t2 - t0):.2f}x the peer)")

        # 3. create -> first exec from an already converted big vs small image.
        small = client.images.pull(f"{host}/b/small:1", timeout=600)
        times: dict[str, list[float]] = {"big": [], "small": []}
        for _ in range(a.n):
            for key, name in (("big", img.name), ("small", small.name)):
                t = time.monotonic()
                with client.create(image=name) as sb:
                    assert sb.exec("true", timeout=60).exit_code == 0
                    times[key].append(time.monotonic() - t)
        for key in ("big", "small"):
            xs = [x * 1000 for x in times[key]]
            print(f"create->first exec from converted {key}: p50 {statistics.median(xs):.1f} ms "
                  f"p99 {pct(xs, 99):.1f} ms (n={len(xs)})")
        print(f"big/small p50 ratio {statistics.median(times['big']) / statistics.median(times['small']):.2f}")
    finally:
        if client is not None:
            for sb in client.list(timeout=30):
                client.get(sb.id).destroy(timeout=60)
            client.close()
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(30)
        unmount_and_remove(root)


if __name__ == "__main__":
    sys.exit(main())
