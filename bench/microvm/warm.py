"""microvm create → first exec result: cold boots vs warm starts (clones of
a saved template, src/runtime/microvm/template.h), in one run, through the
SDK against warrend of this tree.

Two daemons on one layer store, one after the other (at most one VM up at a
time): --microvm-templates=false (every create boots the kernel) and the
default (the first create saves the template; the rest are clones). Prints
p50/p99 of create → first exec result for each, and the template build.

  .venv/bin/python bench/microvm/warm.py [-n 20] [--cold 5] [--guest DIR] [--warrend PATH]

--guest: the dir of scripts/microvm/build-guest.sh's output (default
build/microvm-guest of this tree if present, else /var/cache/warren/microvm).
"""

from __future__ import annotations

import argparse
import os
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


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


class Daemon:
    def __init__(
        self, root: Path, name: str, guest: Path, extra: list[str], warrend: Path = ROOT / "build/src/warrend/warrend"
    ) -> None:
        self.dir = root / name
        self.dir.mkdir()
        self.sock = self.dir / "w.sock"
        self.log = self.dir / "warrend.log"
        self.proc = subprocess.Popen(
            [
                str(warrend),
                "--state-dir",
                str(self.dir / "state"),
                "--socket",
                str(self.sock),
                "--layer-store",
                str(root / "layers"),
                "--node-id",
                f"mwb{os.getpid()}{name}",
                "--microvm-dir",
                str(guest),
                "--warm-shells",
                "0",
            ]
            + extra,
            stdout=open(self.log, "wb"),  # noqa: SIM115 (the daemon's lifetime)
            stderr=subprocess.STDOUT,
            # Its own session: a Ctrl-C of the bench must not stop it before
            # the bench destroyed its VMs (they outlive the daemon).
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
        for sb in self.client.list(timeout=30):
            self.client.get(sb.id).destroy(timeout=60)
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        for line in reversed(Path("/proc/self/mountinfo").read_text().splitlines()):
            mp = line.split()[4]
            if mp.startswith(str(self.dir) + "/"):
                subprocess.run(["umount", mp], check=False)


CREATE_S: list[float] = []  # create alone, per create_to_exec call
SECOND_EXEC_S: list[float] = []  # a second exec("true") after the first


def create_to_exec(client: warren.Client, layer: str) -> float:
    t0 = time.monotonic()
    sb = client.create(backend="microvm", layers=[layer], memory_mb=256, timeout=300)
    t1 = time.monotonic()
    r = sb.exec(["true"], timeout=60)
    dt = time.monotonic() - t0
    t2 = time.monotonic()
    sb.exec(["true"], timeout=60)
    SECOND_EXEC_S.append(time.monotonic() - t2)
    CREATE_S.append(t1 - t0)
    sb.destroy(timeout=60)
    if r.exit_code != 0:
        sys.exit(f"exec failed: {r}")
    return dt


def create_steps(log: str) -> dict[str, str]:
    """p50/max of each step of the clones' creates (ms since the create began),
    from warrend's "microvm started" lines (microvm_backend.cc)."""
    rows: dict[str, list[float]] = {}
    for line in log.splitlines():
        if "microvm started" not in line or not any(
            f"clone={k}" in line for k in ("root", "bare", "pool")
        ):
            continue
        for word in line.split():
            k, _, v = word.partition("=")
            if k in ("disk", "launched", "restored", "answered") and v.isdigit():
                rows.setdefault(k, []).append(float(v))
    return {k: f"{statistics.median(v):.0f}/{max(v):.0f}" for k, v in rows.items()}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("-n", type=int, default=20, help="warm creates")
    ap.add_argument("--cold", type=int, default=5, help="cold creates")
    ap.add_argument(
        "--pause-ms",
        type=int,
        default=0,
        help="idle time between warm creates (creates arriving at a rate: the pool refills between them)",
    )
    ap.add_argument(
        "--pool",
        type=int,
        default=None,
        help="warrend's --microvm-pool (default: its default)",
    )
    ap.add_argument(
        "--warrend",
        type=Path,
        default=ROOT / "build/src/warrend/warrend",
        help="the warrend binary (an A/B against another build)",
    )
    local = ROOT / "build/microvm-guest"
    ap.add_argument(
        "--guest",
        type=Path,
        default=local
        if (local / "initramfs.cpio").exists()
        else Path("/var/cache/warren/microvm"),
    )
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="microvm-warm-", dir="/var/tmp"))
    layer = "base/debian-12@1"
    try:
        d = Daemon(root, "cold", a.guest, ["--microvm-templates", "false"], a.warrend)
        try:
            d.client.layers.build(layer, dir=str(ROOTFS), timeout=900)
            st = d.client.status()
            print(
                f"accel: {st.microvm_accel} ({st.microvm_accel_reason})",
                file=sys.stderr,
            )
            cold = [create_to_exec(d.client, layer) for _ in range(a.cold)]
        finally:
            d.stop()
        d = Daemon(
            root,
            "warm",
            a.guest,
            [] if a.pool is None else ["--microvm-pool", str(a.pool)],
            a.warrend,
        )
        try:
            first = create_to_exec(d.client, layer)  # saves the template
            CREATE_S.clear()
            SECOND_EXEC_S.clear()
            warm = []
            for _ in range(a.n):
                time.sleep(a.pause_ms / 1000)
                warm.append(create_to_exec(d.client, layer))
            log = d.log.read_text()
            steps = create_steps(log)
            fallbacks = log.count("booting cold") + log.count("creates boot cold")
            kinds = {
                k: log.count(f"clone={k}") for k in ("pool", "root", "bare", "false")
            }
            # The warm creates' kinds in order (the first create's line comes first).
            order = [
                word.partition("=")[2]
                for line in log.splitlines()
                if "microvm started" in line
                for word in line.split()
                if word.startswith("clone=")
            ][1:]
            template_lines = [
                line
                for line in log.splitlines()
                if "template" in line
                and ("saved" in line or "fail" in line or "no microvm" in line)
            ]
        finally:
            d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"microvm create → first exec result, TCG, 256 MiB, 1 layer ({os.cpu_count()} cpus, "
        f"load {os.getloadavg()[0]:.1f})"
    )
    if cold:
        print(
            f"cold   n={len(cold):3d}  p50 {statistics.median(cold) * 1000:7.0f} ms  "
            f"p99 {pct(cold, 99) * 1000:7.0f} ms"
        )
    print(
        f"warm   n={len(warm):3d}  p50 {statistics.median(warm) * 1000:7.0f} ms  "
        f"p99 {pct(warm, 99) * 1000:7.0f} ms  (template build + first clone: {first * 1000:.0f} ms)"
    )
    ratio = f"{statistics.median(warm) / statistics.median(cold):.2f}" if cold else "-"
    print(f"warm/cold p50: {ratio}; cold fallbacks among warm: {fallbacks}")
    print(
        f"warm: create alone p50 {statistics.median(CREATE_S) * 1000:.0f} ms, max {max(CREATE_S) * 1000:.0f} ms; "
        f"a second exec p50 {statistics.median(SECOND_EXEC_S) * 1000:.0f} ms"
    )
    print(
        "warm create steps, p50/max ms since the create began (warrend's log): "
        + ", ".join(f"{k} {v}" for k, v in steps.items())
    )
    print(
        "warm creates by kind (pool clone / restored clone of a root template / of the bare template / cold): "
        + ", ".join(f"{k} {v}" for k, v in kinds.items())
    )
    by_kind: dict[str, list[float]] = {}
    for kind, dt in zip(order, warm):
        by_kind.setdefault(kind, []).append(dt)
    for kind, xs in by_kind.items():
        print(
            f"  {kind:5s} n={len(xs):3d}  create → first exec p50 {statistics.median(xs) * 1000:.0f} ms, "
            f"max {max(xs) * 1000:.0f} ms"
        )
    for line in template_lines:
        print("  " + line[:400])
    return 0 if fallbacks == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
