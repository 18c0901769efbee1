"""vm (desktop VM) warm starts, screenshots, input latency and memory, each
beside its floor measured in the same run, through the SDK against warrend of
this tree (src/runtime/vm, vm_template.h).

One daemon (--vm-templates default): the first create boots the template
until its desktop takes input and saves it (timed, printed), then:

* warm start: create → first screenshot (PNG bytes in hand), n creates;
  floor: QEMU's own restore (launch + migrate-incoming) of the same creates,
  from warrend's "vm started" lines;
* screenshot round trip on an idle clone; floor: a no-op RPC (sb.info()) to
  the same sandbox (the transport);
* key press → visible change: one key typed into xterm, screenshots polled
  until the PNG differs; floor: the screenshot round trip (the poll's step);
* host memory per idle desktop VM: --keep clones idle at once, each one's
  cgroup memory.current and its QEMU's Pss, beside the guest's own used
  memory (what a cold-booted VM holds privately: `free` in the guest) and
  the template's RAM (shared by all, charged once to the daemon).

Ran as `nice` beside other work; the load average is printed.

  .venv/bin/python bench/vm/warm.py [-n 10] [--keep 3] [--memory 1024]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import warren

ROOT = Path(__file__).resolve().parents[2]
ROOTFS = Path("/var/cache/warren/rootfs/debian-12")
LAYER = "base/debian-12@1"


def p50(xs: list[float]) -> float:
    return statistics.median(xs)


class Daemon:
    def __init__(self, root: Path, guest: Path, layers: Path, extra: list[str]) -> None:
        self.dir = root
        self.sock = root / "w.sock"
        self.log = root / "warrend.log"
        self.node = f"vwb{os.getpid()}"
        self.proc = subprocess.Popen(
            [
                str(ROOT / "build/src/warrend/warrend"),
                "--state-dir",
                str(root / "state"),
                "--socket",
                str(self.sock),
                "--layer-store",
                str(layers),
                "--node-id",
                self.node,
                "--vm-dir",
                str(guest),
                "--warm-shells",
                "0",
            ]
            + extra,
            stdout=open(self.log, "wb"),  # noqa: SIM115 (the daemon's lifetime)
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.client = warren.Client(f"unix:{self.sock}")
        for _ in range(300):
            try:
                self.client.status(timeout=1)
                return
            except warren.WarrenError:
                time.sleep(0.1)
        self.stop()
        sys.exit("warrend did not come up: " + self.log.read_text()[-2000:])

    def stop(self) -> None:
        try:
            for sb in self.client.list(timeout=30):
                self.client.get(sb.id).destroy(timeout=60)
        finally:
            self.client.close()
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(60)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(30)


def memory_of(sid: str) -> float:
    """MiB charged to the VM's memory cgroup (v2 memory.current, v1
    memory.usage_in_bytes); NaN when not found."""
    for p in Path("/sys/fs/cgroup").rglob(f"warren-vm/{sid}"):
        for f in ("memory.current", "memory.usage_in_bytes"):
            if (p / f).exists():
                return int((p / f).read_text()) / 2**20
    return float("nan")


def qemu_pid(sid: str) -> int:
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if f"warren:{sid}".encode() in cmd and b"qemu-system" in cmd:
            return int(d.name)
    raise RuntimeError(f"no QEMU for {sid}")


def pss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def steps(log: str) -> list[dict[str, float]]:
    out = []
    for line in log.splitlines():
        if "vm started" not in line or "clone=true" not in line:
            continue
        row = {}
        for k in ("disk", "launched", "restored", "answered"):
            m = re.search(rf"\b{k}=(\d+)", line)
            if m:
                row[k] = float(m.group(1))
        out.append(row)
    return out


def warm_start(client: warren.Client, memory: int) -> tuple[warren.Sandbox, float, float]:
    t0 = time.monotonic()
    sb = client.create(backend="vm", layers=[LAYER], memory_mb=memory, timeout=1200)
    t1 = time.monotonic()
    shot = sb.screenshot(timeout=30)
    t2 = time.monotonic()
    assert shot.png.startswith(b"\x89PNG"), shot
    return sb, t2 - t0, t1 - t0


def key_to_change(sb: warren.Sandbox, key: str) -> float:
    before = sb.screenshot(timeout=30).png
    t0 = time.monotonic()
    sb.input.key(key)
    while True:
        if sb.screenshot(timeout=30).png != before:
            return time.monotonic() - t0
        if time.monotonic() - t0 > 10:
            return float("inf")


TYPED_CHARS = 36


def typed_line(sb: warren.Sandbox, i: int) -> float:
    """A shell line typed into xterm (TYPED_CHARS characters, 5 shifted)
    until the file it writes is seen by an exec in the guest."""
    path = f"/tmp/t{i}"
    line = f"echo Typed-Line-By-Warren > {path}\n"
    assert len(line) == TYPED_CHARS, len(line)
    t0 = time.monotonic()
    sb.input.type(line)
    while True:
        if sb.exec(f"cat {path}", timeout=30).stdout == b"Typed-Line-By-Warren\n":
            return time.monotonic() - t0
        if time.monotonic() - t0 > 60:
            return float("inf")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=10, help="warm creates timed")
    ap.add_argument("--keep", type=int, default=3, help="clones idle at once for the memory figure")
    ap.add_argument("--memory", type=int, default=1024, help="memory_mb of each VM")
    ap.add_argument("--guest", type=Path, default=Path("/var/cache/warren/vm"))
    ap.add_argument(
        "--layers",
        type=Path,
        default=Path("/var/tmp/warren-vm-bench-layers"),
        help="layer store (kept between runs: the base layer is built once)",
    )
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="vm-warm-", dir="/var/tmp"))
    d = Daemon(root, a.guest, a.layers, [])
    kept: list[warren.Sandbox] = []
    try:
        try:
            d.client.layers.get(LAYER)
        except warren.NotFound:
            d.client.layers.build(LAYER, dir=str(ROOTFS), timeout=900)
        load0 = os.getloadavg()[0]
        sb, first, _ = warm_start(d.client, a.memory)
        print(f"template build + first clone → first screenshot: {first:.1f} s", flush=True)
        kept.append(sb)
        starts, creates = [], []
        for _ in range(a.n):
            s, t, c = warm_start(d.client, a.memory)
            starts.append(t)
            creates.append(c)
            if len(kept) < a.keep:
                kept.append(s)
            else:
                s.destroy(timeout=60)
        rows = steps(d.log.read_text())[1:]  # the first clone's create waited for the build
        restore = [r["restored"] - r["launched"] for r in rows if "restored" in r and "launched" in r]
        qemu_to_agent = [r["answered"] for r in rows if "answered" in r]

        sb = kept[-1]
        shots, noop = [], []
        for _ in range(20):
            t0 = time.monotonic()
            sb.screenshot(timeout=30)
            shots.append(time.monotonic() - t0)
            t0 = time.monotonic()
            sb.info()
            noop.append(time.monotonic() - t0)
        keys = [key_to_change(sb, k) for k in "abcdefghij"]
        sb.input.key("ctrl+u")
        lines = [typed_line(sb, i) for i in range(5)]
        execs = []
        for _ in range(10):
            t0 = time.monotonic()
            sb.exec("true", timeout=30)
            execs.append(time.monotonic() - t0)

        time.sleep(5)  # idle
        mem, pss = [], []
        for s in kept:
            mem.append(memory_of(s.id))
            pss.append(pss_kb(qemu_pid(s.id)) / 1024)
        # The guest's own view (no procps in the guest): MiB in use (total -
        # available) and MiB of page cache.
        mi = kept[0].exec("cat /proc/meminfo", timeout=60).stdout.decode()
        kb = {ln.split(":")[0]: int(ln.split()[1]) for ln in mi.splitlines() if ln.split()[1:2]}
        guest_used = (kb["MemTotal"] - kb["MemAvailable"]) // 1024
        guest_cache = kb["Cached"] // 1024
        load1 = os.getloadavg()[0]
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)

    print(
        f"vm, TCG, memory_mb={a.memory}, 1024x768 ({os.cpu_count()} cpus, load {load0:.1f} → {load1:.1f})"
    )
    print(
        f"warm start → first screenshot  n={len(starts)} p50 {p50(starts) * 1000:6.0f} ms  max "
        f"{max(starts) * 1000:6.0f} ms  (create alone p50 {p50(creates) * 1000:.0f} ms)"
    )
    if restore:
        print(
            f"  floor: QEMU launch + restore p50 {p50(restore):6.0f} ms  (create → agent answered p50 "
            f"{p50(qemu_to_agent):.0f} ms); ratio {p50(starts) * 1000 / p50(restore):.1f}x"
        )
    print(
        f"screenshot round trip         n={len(shots)} p50 {p50(shots) * 1000:6.1f} ms  max {max(shots) * 1000:.1f} ms"
    )
    print(f"  floor: no-op RPC (info) p50 {p50(noop) * 1000:6.1f} ms; ratio {p50(shots) / p50(noop):.1f}x")
    print(
        f"key press → visible change    n={len(keys)} p50 {p50(keys) * 1000:6.0f} ms  max {max(keys) * 1000:.0f} ms"
    )
    print(f"  floor: one screenshot round trip p50 {p50(shots) * 1000:.1f} ms (the poll's step)")
    print(
        f"typed line ({TYPED_CHARS} chars) → its file n={len(lines)} p50 {p50(lines) * 1000:6.0f} ms  max {max(lines) * 1000:.0f} ms"
    )
    print(
        f"  floor: the pacing's 20 ms per character {TYPED_CHARS * 20} ms + one exec round trip p50 "
        f"{p50(execs) * 1000:.1f} ms; ratio {p50(lines) / (TYPED_CHARS * 0.02 + p50(execs)):.2f}x"
    )
    print(
        f"host memory per idle desktop VM (clones={len(kept)}): cgroup memory.current p50 {p50(mem):.0f} MiB, "
        f"QEMU Pss p50 {p50(pss):.0f} MiB"
    )
    print(
        f"  floor/reference: the guest's own used {guest_used} MiB + cache {guest_cache} MiB (private to a cold VM); "
        f"template RAM {a.memory} MiB shared, charged once to the daemon"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
