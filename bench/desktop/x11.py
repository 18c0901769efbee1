"""The desktop API on containers (and optionally microVMs): an X server
inside the sandbox (src/runtime/desktop/x11_desktop.h, the toolset/desktop
layer), each figure beside its floor measured in the same run, through the
SDK against warrend of this tree:

* create → first screenshot (PNG in hand; the first desktop call starts
  Xvfb, matchbox and xterm inside); floor: create → first exec of the same
  layers (the container alone);
* screenshot round trip (1024x768, Xvfb's framebuffer file read through the
  file API, PNG encoded by the node); floor: a no-op RPC (sb.info());
* key press → visible change (one key into xterm, screenshots polled until
  the PNG differs); floor: the screenshot round trip (the poll's step);
* with --microvm: the same three on a microVM (TCG here), floor the same way.

  .venv/bin/python bench/desktop/x11.py [-n 10] [--microvm]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import warren

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vm"))
from warm import key_to_change  # noqa: E402  (bench/vm/warm.py: one key, screenshots polled)

ROOT = Path(__file__).resolve().parents[2]
ROOTFS = Path("/var/cache/warren/rootfs")
BASE, DESKTOP = "base/debian-12@1", "toolset/desktop@1"


def p50(xs: list[float]) -> float:
    return statistics.median(xs)


def start_daemon(root: Path) -> tuple[subprocess.Popen[bytes], warren.Client]:
    sock = root / "w.sock"
    args = [str(ROOT / "build/src/warrend/warrend"), "--state-dir", str(root / "state"), "--socket", str(sock),
            "--layer-store", str(root / "layers"), "--node-id", f"dxb{os.getpid()}"]
    guest = ROOT / "build" / "microvm-guest"
    if (guest / "initramfs.cpio").exists():
        args += ["--microvm-dir", str(guest)]
    proc = subprocess.Popen(args, stdout=open(root / "warrend.log", "wb"),  # noqa: SIM115
                            stderr=subprocess.STDOUT, start_new_session=True)
    client = warren.Client(f"unix:{sock}")
    for _ in range(300):
        try:
            client.status(timeout=1)
            return proc, client
        except warren.WarrenError:
            time.sleep(0.1)
    proc.kill()
    sys.exit("warrend did not come up: " + (root / "warrend.log").read_text()[-2000:])


def measure(client: warren.Client, backend: str, n: int, memory_mb: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"first_shot": [], "first_exec": [], "shot": [], "noop": [], "key": []}
    layers = [BASE, DESKTOP]
    timeout = 60 if backend == "container" else 300
    for _ in range(n):
        t0 = time.monotonic()
        with client.create(layers=layers, backend=backend, memory_mb=memory_mb, timeout=timeout) as sb:
            sb.exec("true", timeout=60)
            out["first_exec"].append(time.monotonic() - t0)
        t0 = time.monotonic()
        with client.create(layers=layers, backend=backend, memory_mb=memory_mb, timeout=timeout) as sb:
            sb.screenshot(timeout=120)
            out["first_shot"].append(time.monotonic() - t0)
    with client.create(layers=layers, backend=backend, memory_mb=memory_mb, timeout=timeout) as sb:
        sb.screenshot(timeout=120)
        for _ in range(2 * n):
            t0 = time.monotonic()
            sb.screenshot(timeout=30)
            out["shot"].append(time.monotonic() - t0)
            t0 = time.monotonic()
            sb.info()
            out["noop"].append(time.monotonic() - t0)
        out["key"] = [key_to_change(sb, k) for k in "abcdefghij"[:n]]
    return out


def report(backend: str, m: dict[str, list[float]]) -> None:
    def ms(xs: list[float]) -> str:
        return f"p50 {p50(xs) * 1000:8.1f} ms  max {max(xs) * 1000:8.1f} ms"

    print(f"{backend}: create → first screenshot   n={len(m['first_shot'])} {ms(m['first_shot'])}  "
          f"floor create → first exec {p50(m['first_exec']) * 1000:.1f} ms: "
          f"{p50(m['first_shot']) / p50(m['first_exec']):.1f}x")
    print(f"{backend}: screenshot round trip     n={len(m['shot'])} {ms(m['shot'])}  "
          f"floor no-op RPC {p50(m['noop']) * 1000:.2f} ms")
    print(f"{backend}: key press → visible change n={len(m['key'])} {ms(m['key'])}  "
          f"floor screenshot {p50(m['shot']) * 1000:.1f} ms: {p50(m['key']) / p50(m['shot']):.1f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=10)
    ap.add_argument("--memory", type=int, default=1024)
    ap.add_argument("--microvm", action="store_true", help="also on microVMs (TCG here: minutes)")
    a = ap.parse_args()
    if not (ROOTFS / "toolset-desktop/usr/bin/Xvfb").exists():
        sys.exit(f"no {ROOTFS}/toolset-desktop: run scripts/build-toolset-desktop-rootfs.sh")
    print(f"load average at start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="warren-bench-desktop-") as tmp:
        proc, client = start_daemon(Path(tmp))
        try:
            client.layers.build(BASE, dir=str(ROOTFS / "debian-12"), timeout=900)
            client.layers.build(DESKTOP, dir=str(ROOTFS / "toolset-desktop"), timeout=900)
            report("container", measure(client, "container", a.n, a.memory))
            if a.microvm:
                report("microvm", measure(client, "microvm", max(3, a.n // 3), 512))
        finally:
            for sb in client.list(timeout=30):
                client.get(sb.id).destroy(timeout=60)
            client.close()
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
