#!/usr/bin/env python3
"""Lifecycle benchmarks (issue 4): pause/resume latency, pause/resume and
suspend/resume of N sandboxes with host memory (MemAvailable, per-sandbox
cgroup usage, zram) around them, resume latency of a suspended sandbox with
and without working-set prefetch, snapshot time vs upper size, fork(n) time. Talks to a running warrend (--addr) whose layer store holds
--base. Prints a markdown section; --append adds it to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "sdk/python"))

import warren  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def mem_available_mib() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


def zram_mib() -> str:
    """Compressed bytes / memory used by zram devices (from mm_stat)."""
    out = []
    for d in sorted(Path("/sys/block").glob("zram*")):
        try:
            f = (d / "mm_stat").read_text().split()
        except OSError:
            continue
        if f and int(f[0]) > 0:
            out.append(f"{d.name}: {int(f[0]) >> 20} MiB stored in {int(f[2]) >> 20} MiB")
    return "; ".join(out) or "no zram in use"


HOLDER = r"""
import os, time
pat = b"".join(b"%08d agent heap " % i for i in range(4096))
buf = bytearray(pat * ((MB << 20) // len(pat)))
open("/w/ready", "w").close()
while True:
    if os.path.exists("/w/go"):
        t = time.perf_counter()
        s = sum(buf[::4096])
        with open("/tmp/data", "rb") as f:
            while f.read(1 << 20):
                pass
        os.unlink("/w/go")
        with open("/w/done.tmp", "w") as f:
            f.write("%.6f" % (time.perf_counter() - t))
        os.rename("/w/done.tmp", "/w/done")
    time.sleep(0.002)
"""


def touch_working_set(sb) -> tuple:
    """Asks the holder to touch its anon memory and read /tmp/data; returns
    (end-to-end s from the exec's start, the holder's own touch s)."""
    t = time.perf_counter()
    r = sb.exec("touch /w/go; i=0; while [ ! -e /w/done ] && [ $i -lt 30000 ]; do sleep 0.001; i=$((i+1)); done; "
                "cat /w/done; rm -f /w/done", timeout=120)
    e2e = time.perf_counter() - t
    return e2e, float(r.stdout or b"nan")


def resume_latency(c, base: str, mb: int, rounds: int):
    """One sandbox holding `mb` MiB anon + `mb`/2 MiB in /tmp: pause vs
    suspend + resume with prefetch vs without; per mode the resume RPC time
    and the time until the working set was touched again."""
    res = {}
    with c.create(layers=[base], memory_mb=max(1024, 3 * mb), disk_mb=max(1024, 2 * mb)) as sb:
        sb.exec("mkdir -p /w && nohup python3 -c '" + HOLDER.replace("MB", str(mb)).replace("'", "'\\''") +
                "' >/w/holder.log 2>&1 &", timeout=60)
        sb.exec(f"seq 1 {mb * 55000} > /tmp/data", timeout=300)
        for _ in range(600):
            if sb.files.exists("/w/ready"):
                break
            time.sleep(0.1)
        touch_working_set(sb)  # warm
        for mode in ("pause", "suspend+prefetch", "suspend, no prefetch"):
            rs, e2es, ins, mems = [], [], [], []
            for _ in range(rounds):
                if mode == "pause":
                    sb.pause()
                else:
                    mems.append(sb.suspend().memory_bytes)
                t = time.perf_counter()
                sb.resume(prefetch=(mode != "suspend, no prefetch"))
                rs.append(time.perf_counter() - t)
                e2e, inside = touch_working_set(sb)
                e2es.append(e2e)
                ins.append(inside)
            res[mode] = (statistics.median(rs), statistics.median(ins), statistics.median(e2es),
                         statistics.median(mems) if mems else None)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True)
    ap.add_argument("--base", default="base/debian-12@1")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--many", type=int, default=50, help="sandboxes paused/resumed together")
    ap.add_argument("--many-mb", type=int, default=20, help="MB held by a shell in each of --many")
    ap.add_argument("--sizes-mb", default="1,10,100")
    ap.add_argument("--fork", type=int, default=8)
    ap.add_argument("--resume-mb", type=int, default=200, help="anon MiB of the resume-latency sandbox")
    ap.add_argument("--resume-rounds", type=int, default=5)
    ap.add_argument("--append", action="store_true")
    a = ap.parse_args()
    c = warren.Client(a.addr)
    rows = []
    load0 = open("/proc/loadavg").read().split()[:3]

    with c.create(layers=[a.base]) as sb:
        sb.exec("nohup sh -c 'while true; do sleep 0.01; done' >/dev/null 2>&1 &")
        p, r = [], []
        for _ in range(a.rounds):
            t = time.perf_counter(); sb.pause(); p.append(time.perf_counter() - t)
            t = time.perf_counter(); sb.resume(); r.append(time.perf_counter() - t)
        rows.append(("pause (1 sandbox, RPC)", a.rounds, pct(p, 50), pct(p, 90), pct(p, 99)))
        rows.append(("resume (1 sandbox, RPC)", a.rounds, pct(r, 50), pct(r, 90), pct(r, 99)))

    lat = resume_latency(c, a.base, a.resume_mb, a.resume_rounds)

    job = c.job(f"bench-{os.getpid()}")
    sbs = [c.create(layers=[a.base], job=job.name) for _ in range(a.many)]
    try:
        # each: a shell holding ~many_mb MB of text in a variable + the same in /tmp
        n_lines = a.many_mb * 150000
        for s in sbs:
            s.exec(f"seq 1 {n_lines} > /tmp/data; nohup sh -c 'x=$(seq 1 {n_lines}); sleep 100000' "
                   ">/dev/null 2>&1 &")
        time.sleep(2)

        def usage():
            infos = [s.info() for s in sbs]
            return sum(i.memory_bytes for i in infos) >> 20, sum(i.swap_bytes for i in infos) >> 20

        u0, _ = usage()
        m0 = mem_available_mib()
        t = time.perf_counter()
        for s in sbs:
            s.pause()
        tp = time.perf_counter() - t
        m1 = mem_available_mib()
        u1, _ = usage()
        t = time.perf_counter()
        for s in sbs:
            s.resume()
        tr = time.perf_counter() - t
        t = time.perf_counter()
        for s in sbs:
            s.suspend()
        ts = time.perf_counter() - t
        m2 = mem_available_mib()
        u2, sw2 = usage()
        z2 = zram_mib()
        t = time.perf_counter()
        for s in sbs:
            s.resume()
        tsr = time.perf_counter() - t
        m3 = mem_available_mib()
        u3, _ = usage()
        t = time.perf_counter()
        assert job.suspend() == a.many
        tjs = time.perf_counter() - t
        t = time.perf_counter()
        assert job.resume() == a.many
        tjr = time.perf_counter() - t
    finally:
        for s in sbs:
            s.destroy()
    many = dict(n=a.many, tp=tp, tr=tr, ts=ts, tsr=tsr, tjs=tjs, tjr=tjr, m0=m0, m1=m1, m2=m2, m3=m3,
                u0=u0, u1=u1, u2=u2, sw2=sw2, u3=u3, z2=z2)

    snaps = []
    for mb in [int(x) for x in a.sizes_mb.split(",")]:
        with c.create(layers=[a.base], disk_mb=max(1024, 2 * mb), memory_mb=max(2048, 3 * mb)) as sb:
            sb.exec(f"mkdir -p /w && head -c {mb << 20} /dev/urandom > /w/blob && "
                    "for i in $(seq 1 200); do echo $i > /w/f$i; done", timeout=600)
            t = time.perf_counter()
            snap = sb.snapshot()
            ts = time.perf_counter() - t
            t = time.perf_counter()
            kids = sb.fork(a.fork)
            tf = time.perf_counter() - t
            for k in kids:
                k.destroy()
            c.layers.remove(snap.layer.digest) if False else None
            snaps.append((mb, ts, snap.layer.size_bytes, tf))

    load1 = open("/proc/loadavg").read().split()[:3]
    out = [f"\n## {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC — lifecycle (issue 4)\n",
           f"- command: `bench/lifecycle/bench.py --addr {a.addr} --rounds {a.rounds} --many {a.many} "
           f"--many-mb {a.many_mb} --sizes-mb {a.sizes_mb} --fork {a.fork} --resume-mb {a.resume_mb} "
           f"--resume-rounds {a.resume_rounds}`",
           f"- machine: kernel {os.uname().release}, nproc {os.cpu_count()}; load average before/after: "
           f"{' '.join(load0)} / {' '.join(load1)}",
           "- pause = cgroup freezer (v1 freezer.state / v2 cgroup.freeze); suspend = pause + memory.force_empty "
           "(v1) / memory.reclaim (v2) into the zram swap warrend set up; times are end-to-end through the Python SDK\n",
           "| op | n | p50 ms | p90 ms | p99 ms |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, n, p50, p90, p99 in rows:
        out.append(f"| {name} | {n} | {p50 * 1e3:.2f} | {p90 * 1e3:.2f} | {p99 * 1e3:.2f} |")
    m = many
    n = m["n"]
    out += ["", f"Mass pause vs suspend: {n} sandboxes, each a shell holding ~{a.many_mb} MB of text in memory "
            f"+ the same in /tmp (tmpfs upper); sequential RPCs through the SDK; memory = sum of the sandboxes' "
            "memory cgroup usage (Get), MemAvailable from /proc/meminfo.", "",
            "| step | total ms | ms per sandbox | sandboxes' memory MiB | in swap MiB | host MemAvailable MiB |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
            f"| running (before) | | | {m['u0']} | | {m['m0']} |",
            f"| pause all | {m['tp'] * 1e3:.0f} | {m['tp'] / n * 1e3:.2f} | {m['u1']} | | {m['m1']} |",
            f"| resume all (from pause) | {m['tr'] * 1e3:.0f} | {m['tr'] / n * 1e3:.2f} | | | |",
            f"| suspend all | {m['ts'] * 1e3:.0f} | {m['ts'] / n * 1e3:.2f} | {m['u2']} | {m['sw2']} | {m['m2']} |",
            f"| resume all (from suspend, prefetch) | {m['tsr'] * 1e3:.0f} | {m['tsr'] / n * 1e3:.2f} | {m['u3']} | | {m['m3']} |",
            f"| job.suspend() (one RPC) | {m['tjs'] * 1e3:.0f} | {m['tjs'] / n * 1e3:.2f} | | | |",
            f"| job.resume() (one RPC) | {m['tjr'] * 1e3:.0f} | {m['tjr'] / n * 1e3:.2f} | | | |",
            "", f"- zram while suspended: {m['z2']}", "",
            f"Resume latency of one sandbox holding {a.resume_mb} MiB anon (python bytearray of text) + "
            f"~{a.resume_mb // 2} MiB in /tmp, median of {a.resume_rounds}: resume RPC, then the holder touches every "
            "page and reads /tmp/data (its own timer), and end to end (exec that triggers the touch and waits).", "",
            "| mode | memory while stopped MiB | resume RPC ms | touch working set ms | first exec + touch ms |",
            "| --- | ---: | ---: | ---: | ---: |"]
    for mode, (r, inside, e2e, mem) in lat.items():
        mem_s = f"{mem / 2**20:.0f}" if mem is not None else "(resident)"
        out.append(f"| {mode} | {mem_s} | {r * 1e3:.1f} | {inside * 1e3:.1f} | {e2e * 1e3:.1f} |")
    out += ["", "| upper size | snapshot s | layer bytes | fork(%d) s |" % a.fork, "| ---: | ---: | ---: | ---: |"]
    for mb, ts, size, tf in snaps:
        out.append(f"| {mb} MiB + 200 small files | {ts:.2f} | {size} | {tf:.2f} |")
    text = "\n".join(out) + "\n"
    print(text)
    if a.append:
        with open(ROOT / "bench/RESULTS.md", "a") as f:
            f.write(text)


if __name__ == "__main__":
    main()
