"""The microvm backend's must-show numbers in one run, on this machine (TCG):

  floors   bench/microvm/floors.py: QEMU booting the same kernel to a trivial
           init (cold floor) and a bare QEMU restore of a template (warm floor)
  starts   warrend create -> first exec result: cold boots (a daemon with
           --microvm-templates=false) and warm starts (template clones)
  density  N idle microVMs of 256 MiB up at once (each answers an exec once
           all are up): host memory per VM (MemAvailable drop / N, and the
           QEMUs' summed Pss / N), then all destroyed
  rate     create -> exec("true") -> destroy at concurrency 8: microvm (warm)
           beside container, same daemon, same run

  .venv/bin/python bench/microvm/mustshow.py [--floor-runs 5] [-n 20] [--cold 5]
      [--density 100] [--rate-vm 16] [--rate-ct 48] [--json FILE]

Every VM is destroyed through warrend at the end; the daemons are stopped and
their dirs removed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import warm as W  # the daemon helper of warm.py

HERE = Path(__file__).resolve().parent


def ms(xs: list[float]) -> str:
    return f"p50 {statistics.median(xs) * 1000:6.0f} ms  p99 {W.pct(xs, 99) * 1000:6.0f} ms"


def mem_available_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    raise RuntimeError("no MemAvailable")


def named(pid: str, want: set[bytes]) -> bool:
    """Whether /proc/<pid> is a QEMU whose -name is one of `want` (its
    argument is "<name>,debug-threads=on": qemu.cc)."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return any(a.split(b",", 1)[0] in want for a in args)


def qemu_pss_kib(ids: list[str]) -> tuple[int, int]:
    """Summed Pss and Rss (KiB) of the QEMUs named warren:<id>."""
    want = {f"warren:{i}".encode() for i in ids}
    pss = rss = 0
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            if not named(e, want):
                continue
            for line in Path(f"/proc/{e}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1])
                elif line.startswith("Rss:"):
                    rss += int(line.split()[1])
        except OSError:
            continue
    return pss, rss


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def qemu_cpu_ticks(ids: list[str]) -> int:
    """Summed utime+stime (ticks) of the QEMUs named warren:<id>."""
    want = {f"warren:{i}".encode() for i in ids}
    total = 0
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            if not named(e, want):
                continue
            f = Path(f"/proc/{e}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12])
        except OSError:
            continue
    return total


def floors(runs: int, guest: Path) -> dict:
    out = tempfile.mktemp(suffix=".json", prefix="mvm-floors-")
    try:
        subprocess.run(
            [
                sys.executable,
                str(HERE / "floors.py"),
                "--runs",
                str(runs),
                "--json",
                out,
                "--guest",
                str(guest),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        return json.loads(Path(out).read_text())
    finally:
        if os.path.exists(out):
            os.unlink(out)


def cycle(client, backend: str, layer: str) -> float:
    t0 = time.monotonic()
    kw = {"memory_mb": 256} if backend == "microvm" else {}
    sb = client.create(backend=backend, layers=[layer], timeout=300, **kw)
    try:
        r = sb.exec(["true"], timeout=120)
        if r.exit_code != 0:
            raise RuntimeError(f"exec failed: {r}")
    finally:
        sb.destroy(timeout=120)
    return time.monotonic() - t0


def rate(client, backend: str, layer: str, n: int) -> tuple[float, list[float]]:
    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as ex:
        lat = list(ex.map(lambda _: cycle(client, backend, layer), range(n)))
    return n / (time.monotonic() - t0), lat


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--floor-runs", type=int, default=5)
    ap.add_argument("-n", type=int, default=20, help="warm creates")
    ap.add_argument("--cold", type=int, default=5, help="cold creates")
    ap.add_argument("--density", type=int, default=100, help="idle VMs up at once")
    ap.add_argument(
        "--density-budget",
        type=float,
        default=600,
        help="stop creating idle VMs after this many s",
    )
    ap.add_argument("--idle-secs", type=float, default=30, help="idle CPU window, s")
    ap.add_argument("--rate-vm", type=int, default=16, help="microvm cycles at c8")
    ap.add_argument("--rate-ct", type=int, default=48, help="container cycles at c8")
    local = W.ROOT / "build/microvm-guest"
    ap.add_argument(
        "--guest",
        type=Path,
        default=local
        if (local / "initramfs.cpio").exists()
        else Path("/var/cache/warren/microvm"),
    )
    ap.add_argument(
        "--pause-ms",
        type=int,
        default=0,
        help="idle time between the warm creates (the pool refills between them)",
    )
    ap.add_argument("--json")
    a = ap.parse_args()
    res: dict = {"load_start": os.getloadavg()[0], "cpus": os.cpu_count()}

    if a.floor_runs > 0:
        f = floors(a.floor_runs, a.guest)
        res["floor_kernel"] = f.get("kernel_file", "?")
        res["floor_cold_answer_s"] = f["cold_answer_s"]
        res["floor_warm_answer_s"] = f["warm_answer_s"]
        res["floor_warm_restored_s"] = f["warm_restored_s"]
        say(
            f"floors: cold {ms(res['floor_cold_answer_s'])}, warm {ms(res['floor_warm_answer_s'])}"
        )

    root = Path(tempfile.mkdtemp(prefix="microvm-mustshow-", dir="/var/tmp"))
    layer = "base/debian-12@1"
    try:
        d = W.Daemon(root, "cold", a.guest, ["--microvm-templates", "false"])
        try:
            d.client.layers.build(layer, dir=str(W.ROOTFS), timeout=900)
            res["cold_s"] = [W.create_to_exec(d.client, layer) for _ in range(a.cold)]
            say(f"cold: {ms(res['cold_s'])} {res['cold_s']}")
        finally:
            d.stop()
        d = W.Daemon(root, "warm", a.guest, [])
        try:
            res["template_first_s"] = W.create_to_exec(d.client, layer)
            res["warm_s"] = []
            for _ in range(a.n):
                time.sleep(a.pause_ms / 1000)
                res["warm_s"].append(W.create_to_exec(d.client, layer))
            log = d.log.read_text()
            res["warm_kinds"] = {
                k: log.count(f"clone={k}") for k in ("pool", "root", "bare", "false")
            }
            say(
                f"warm: {ms(res['warm_s'])} (template + first clone {res['template_first_s']:.2f} s)"
            )

            if a.density > 0:
                before = mem_available_kib()
                sbs = []
                t0 = time.monotonic()
                try:
                    for _ in range(a.density):
                        if time.monotonic() - t0 > a.density_budget:
                            break
                        sbs.append(
                            d.client.create(
                                backend="microvm",
                                layers=[layer],
                                memory_mb=256,
                                timeout=300,
                            )
                        )
                    res["density_create_s"] = time.monotonic() - t0
                    ok = sum(
                        1 for sb in sbs if sb.exec(["true"], timeout=120).exit_code == 0
                    )
                    ids = [sb.id for sb in sbs]
                    c0 = qemu_cpu_ticks(ids)
                    time.sleep(a.idle_secs)  # idle
                    idle_cpu = (
                        (qemu_cpu_ticks(ids) - c0)
                        / os.sysconf("SC_CLK_TCK")
                        / a.idle_secs
                        / len(sbs)
                    )
                    after = mem_available_kib()
                    pss, rss = qemu_pss_kib(ids)
                    res["density"] = {
                        "vms": len(sbs),
                        "answered": ok,
                        "mem_available_drop_mib": (before - after) / 1024,
                        "per_vm_host_mib": (before - after) / 1024 / len(sbs),
                        "qemu_pss_per_vm_mib": pss / 1024 / len(sbs),
                        "qemu_rss_per_vm_mib": rss / 1024 / len(sbs),
                        "idle_cpu_per_vm": idle_cpu,
                        "load": os.getloadavg()[0],
                    }
                    say(f"density: {res['density']}")
                finally:
                    with ThreadPoolExecutor(4) as ex:
                        list(ex.map(lambda sb: sb.destroy(timeout=120), sbs))

            r_vm, lat_vm = rate(d.client, "microvm", layer, a.rate_vm)
            say(f"c8 microvm: {r_vm:.2f}/s")
            r_ct, lat_ct = rate(d.client, "container", layer, a.rate_ct)
            say(f"c8 container: {r_ct:.2f}/s")
            res["rate_c8"] = {
                "microvm_per_s": r_vm,
                "container_per_s": r_ct,
                "microvm_lat_s": lat_vm,
                "container_lat_s": lat_ct,
            }
        finally:
            d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    res["load_end"] = os.getloadavg()[0]

    print(
        f"microvm must-show, TCG, 256 MiB, 1 layer ({res['cpus']} cpus, load {res['load_start']:.1f} -> {res['load_end']:.1f})"
    )
    if "floor_cold_answer_s" in res:
        print(
            f"floor cold (QEMU -> trivial init answers)   n={len(res['floor_cold_answer_s']):3d}  {ms(res['floor_cold_answer_s'])}"
        )
        print(
            f"floor warm (bare QEMU restore -> answer)    n={len(res['floor_warm_answer_s']):3d}  {ms(res['floor_warm_answer_s'])}"
        )
    print(
        f"cold create -> first exec (warrend)          n={len(res['cold_s']):3d}  {ms(res['cold_s'])}"
    )
    print(
        f"warm create -> first exec (warrend)          n={len(res['warm_s']):3d}  {ms(res['warm_s'])}"
        f"  (pause {a.pause_ms} ms; creates by kind incl. the first and the density phase: {res['warm_kinds']})"
    )
    if "floor_kernel" in res:
        print(f"floors booted: {res['floor_kernel']}")
    if "density" in res:
        dn = res["density"]
        print(
            f"density: {dn['vms']} idle VMs up ({dn['answered']} answered) in {res['density_create_s']:.0f} s; host memory "
            f"{dn['per_vm_host_mib']:.1f} MiB/VM (MemAvailable), QEMU Pss {dn['qemu_pss_per_vm_mib']:.1f} MiB/VM, "
            f"Rss {dn['qemu_rss_per_vm_mib']:.1f} MiB/VM; idle CPU {dn['idle_cpu_per_vm'] * 100:.1f} % of a core per VM"
        )
    rc = res["rate_c8"]
    print(
        f"c8 create->exec->destroy: microvm {rc['microvm_per_s']:.2f}/s (p50 {statistics.median(rc['microvm_lat_s']):.2f} s), "
        f"container {rc['container_per_s']:.2f}/s (p50 {statistics.median(rc['container_lat_s']):.2f} s)"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
