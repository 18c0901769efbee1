#!/usr/bin/env python3
"""Density: N concurrent idle sandboxes from the Debian base on one node, and
the host memory each costs (issue 3: ">= 5,000 idle sandboxes, <= 1 MiB each").

Rows, in one invocation:
  sleep_procs     N plain host processes (`sleep`), the floor of "a process
                  exists": what any sandbox costs at the very least
  warren_idle     N warren container sandboxes (create, one `true` exec so
                  each is really up, then left idle)

Memory per item = drop of the host's MemAvailable (and of MemFree, and the
rise of Slab+KernelStack+PageTables) between before and after, divided by N,
after dropping clean caches is NOT done (the machine is shared): other work
on the machine adds noise, so each row runs `--repeat` times and the median
is kept. Also reported for warren: the sum of the sandboxes' own memory
cgroups (memory.usage_in_bytes / memory.current, as the kernel charges them),
the daemon's RSS, and what limited N if the target was not reached.

Caveat: slab caches keep the free objects of earlier runs (e.g. a bigger
density run just destroyed): a small N then reuses them and the kernel
columns read low (214 KiB per sandbox at N=50 right after a 5000 run, ~930
at N=1000). Compare runs of the same N, the bigger the better.

Both rows stop adding items when the host's MemAvailable drops below
--min-available-gib (default 8: the machine is shared) or after
--max-seconds; everything created is destroyed. With --daemon-pid, the
daemon's RSS growth per sandbox, its open fds against its RLIMIT_NOFILE and
the slab caches that grew most per sandbox are reported too, with the host
limits that bound N (pid_max, threads-max, namespace limits).

Usage (warrend running with --max-sandboxes >= N; base layer built):
  bench/density/bench.py --addr unix:/path/sock [-n 5000] [--concurrency 8]
                         [--daemon-pid PID] [--record]
"""
import argparse
import glob
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import warren

ROOT = Path(__file__).resolve().parents[2]


def meminfo():
    m = {}
    for line in open("/proc/meminfo"):
        k, v = line.split(":", 1)
        m[k] = int(v.split()[0]) * 1024
    return m


def kernel_bytes(m):
    return m["Slab"] + m["KernelStack"] + m["PageTables"]


def unreclaimable_bytes(m):
    """Kernel memory the kernel cannot give back under pressure (MemAvailable
    counts reclaimable slab, e.g. dentries and inodes, as available)."""
    return m["SUnreclaim"] + m["KernelStack"] + m["PageTables"] + m.get("Percpu", 0)


def settle():
    time.sleep(2.0)


MIN_AVAILABLE = [8 << 30]  # bytes; set from --min-available-gib


def below_floor():
    return meminfo()["MemAvailable"] < MIN_AVAILABLE[0]


def slabinfo():
    """cache name -> bytes allocated (num_objs * objsize); {} if unreadable."""
    out = {}
    try:
        for line in open("/proc/slabinfo").readlines()[2:]:
            f = line.split()
            out[f[0]] = int(f[2]) * int(f[3])
    except OSError:
        pass
    return out


def read_int(path):
    try:
        return int(open(path).read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def daemon_facts(pid):
    """RSS bytes, open fds, RLIMIT_NOFILE soft limit, threads of `pid`."""
    if not pid:
        return {}
    f = {"fds": len(os.listdir(f"/proc/{pid}/fd"))}
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            f["rss"] = int(line.split()[1]) * 1024
        elif line.startswith("Threads:"):
            f["threads"] = int(line.split()[1])
    for line in open(f"/proc/{pid}/limits"):
        if line.startswith("Max open files"):
            f["nofile"] = line.split()[3]
    return f


def host_limits():
    lim = {k: read_int(p) for k, p in {
        "pid_max": "/proc/sys/kernel/pid_max", "threads_max": "/proc/sys/kernel/threads-max",
        "max_user_namespaces": "/proc/sys/user/max_user_namespaces",
        "max_net_namespaces": "/proc/sys/user/max_net_namespaces",
        "mount_max": "/proc/sys/fs/mount-max", "nr_open": "/proc/sys/fs/nr_open"}.items()}
    lim["pids_in_use"] = len([d for d in os.listdir("/proc") if d.isdigit()])
    return lim


def sleep_row(n, max_seconds):
    m0 = meminfo()
    procs = []
    t_end = time.monotonic() + max_seconds
    try:
        for i in range(n):
            if time.monotonic() > t_end or (i % 100 == 0 and below_floor()):
                break
            procs.append(subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL))
        settle()
        m1 = meminfo()
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
    return m0, m1, len(procs), None


def sandbox_cgroup_bytes(ids):
    # The "warren" subtrees are found once (a recursive glob per sandbox walks
    # the whole hierarchy each time: hours at N=5000).
    bases = [(b, "memory.usage_in_bytes") for b in glob.glob("/sys/fs/cgroup/memory/**/warren", recursive=True)]
    bases += [(b, "memory.current") for b in glob.glob("/sys/fs/cgroup/**/warren", recursive=True)
              if "/memory/" not in b and os.path.exists(os.path.join(b, "cgroup.subtree_control"))]
    total = 0
    for sid in ids:
        for base, name in bases:
            v = read_int(os.path.join(base, sid, name))
            if v is not None:
                total += v
                break
    return total


def warren_row(client, layer, n, conc, max_seconds, daemon_pid=0, while_up=""):
    m0 = meminfo()
    slab0 = slabinfo()
    d0 = daemon_facts(daemon_pid)
    sbs, errors = [], []
    stopped = []
    lock = threading.Lock()
    t_end = time.monotonic() + max_seconds
    left = [n]

    def worker():
        while time.monotonic() < t_end:
            with lock:
                if left[0] == 0 or errors or stopped:
                    return
                if left[0] % 50 == 0 and below_floor():
                    stopped.append(f"MemAvailable below {MIN_AVAILABLE[0] >> 30} GiB")
                    return
                left[0] -= 1
            for attempt in range(100):
                try:
                    sb = client.create(layers=[layer], memory_mb=64, timeout=120)
                    break
                except warren.ResourceExhausted as e:
                    if "admission" not in str(e) and "in flight" not in str(e):
                        with lock:
                            errors.append(str(e))
                        return
                    time.sleep(0.01 * (attempt + 1))
                except warren.WarrenError as e:
                    with lock:
                        errors.append(str(e))
                    return
            else:
                return
            with lock:
                sbs.append(sb)  # destroyed at the end whatever happens next
            try:
                r = sb.exec(["true"], timeout=60)
            except warren.WarrenError as e:
                with lock:
                    errors.append(f"exec: {e}")
                return
            if r.exit_code != 0:
                with lock:
                    errors.append(f"true exited {r.exit_code}")
    t0 = time.monotonic()
    ths = [threading.Thread(target=worker) for _ in range(conc)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    create_s = time.monotonic() - t0
    if errors:
        stopped.append("an error (below)")
    elif not stopped and left[0] > 0:
        stopped.append(f"time bound ({max_seconds:.0f} s)")
    settle()
    m1 = meminfo()
    slab1 = slabinfo()
    d1 = daemon_facts(daemon_pid)
    lim = host_limits()
    cg = sandbox_cgroup_bytes([s.id for s in sbs])
    up_out = ""
    if while_up:
        r = subprocess.run(while_up, shell=True, capture_output=True, text=True, timeout=600)
        up_out = (r.stdout + r.stderr).strip()
    st = client.status(timeout=30)
    got = len(sbs)
    t1 = time.monotonic()
    def destroyer(chunk):
        for s in chunk:
            try:
                s.destroy()
            except warren.NotFound:
                pass
    chunks = [sbs[i::conc] for i in range(conc)]
    ths = [threading.Thread(target=destroyer, args=(c,)) for c in chunks]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    destroy_s = time.monotonic() - t1
    settle()
    d2 = daemon_facts(daemon_pid)
    grew = sorted(((slab1.get(k, 0) - slab0.get(k, 0), k) for k in set(slab0) | set(slab1)), reverse=True)[:6]
    extra = {"cgroup_bytes": cg, "create_s": create_s, "destroy_s": destroy_s, "stopped": stopped,
             "slab_top": grew, "daemon0": d0, "daemon1": d1, "daemon2": d2, "limits": lim, "while_up": up_out,
             "errors": errors[:3], "n_errors": len(errors), "status_sandboxes": getattr(st, "sandboxes", None)}
    return m0, m1, got, extra


def per_item(m0, m1, n):
    return {"avail": (m0["MemAvailable"] - m1["MemAvailable"]) / n,
            "free": (m0["MemFree"] - m1["MemFree"]) / n,
            "kernel": (kernel_bytes(m1) - kernel_bytes(m0)) / n,
            "unrecl": (unreclaimable_bytes(m1) - unreclaimable_bytes(m0)) / n}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True)
    ap.add_argument("--layer", default="base/debian-12@1")
    ap.add_argument("-n", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-seconds", type=float, default=900)
    ap.add_argument("--min-available-gib", type=float, default=8.0)
    ap.add_argument("--daemon-pid", type=int, default=0)
    ap.add_argument("--while-up", default="", help="shell command run while the sandboxes are up (output reported)")
    ap.add_argument("--record", action="store_true")
    a = ap.parse_args()
    MIN_AVAILABLE[0] = int(a.min_available_gib * (1 << 30))
    if a.n < 1 or a.concurrency < 1:
        sys.exit("density bench: -n and --concurrency must be >= 1")
    client = warren.Client(a.addr)
    load0 = os.getloadavg()
    s0, s1, sn, _ = sleep_row(a.n, a.max_seconds)
    w0, w1, wn, extra = warren_row(client, a.layer, a.n, a.concurrency, a.max_seconds, a.daemon_pid, a.while_up)
    load1 = os.getloadavg()
    if wn == 0:
        sys.exit(f"no sandbox created: {extra['errors']}")
    ps, pw = per_item(s0, s1, sn), per_item(w0, w1, wn)
    mib = 1 << 20
    lines = ["| row | n | MemAvailable drop / item KiB | MemFree drop / item KiB | kernel (slab+stacks+PT) / item KiB | "
             "unreclaimable kernel (SUnreclaim+stacks+PT+Percpu) / item KiB | ratio to sleep_procs (MemAvailable) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
             f"| sleep_procs | {sn} | {ps['avail'] / 1024:.0f} | {ps['free'] / 1024:.0f} | {ps['kernel'] / 1024:.0f} | "
             f"{ps['unrecl'] / 1024:.0f} | 1.00 |",
             f"| warren_idle | {wn} | {pw['avail'] / 1024:.0f} | {pw['free'] / 1024:.0f} | {pw['kernel'] / 1024:.0f} | "
             f"{pw['unrecl'] / 1024:.0f} | {pw['avail'] / max(ps['avail'], 1):.1f} |"]
    table = "\n".join(lines)
    notes = (f"- warren: {wn} of {a.n} sandboxes up in {extra['create_s']:.1f} s "
             f"({wn / extra['create_s']:.0f}/s at concurrency {a.concurrency}), destroyed in {extra['destroy_s']:.1f} s; "
             f"sum of their memory cgroups {extra['cgroup_bytes'] / wn / 1024:.0f} KiB each; "
             f"errors {extra['n_errors']} {extra['errors']}\n"
             f"- 1 MiB target: MemAvailable {pw['avail'] / 1024:.0f} KiB per sandbox "
             f"({'meets' if pw['avail'] <= mib else 'misses'}), kernel accounting {pw['kernel'] / 1024:.0f} KiB "
             f"({'meets' if pw['kernel'] <= mib else 'misses'}): "
             f"{'met' if max(pw['avail'], pw['kernel']) <= mib else 'not met by both measures'}\n"
             f"- stopped by: {', '.join(extra['stopped']) or 'reached n'}; MemAvailable at the peak "
             f"{w1['MemAvailable'] / (1 << 30):.1f} GiB\n"
             f"- slab caches that grew most, KiB per sandbox: "
             + ", ".join(f"{k} {v / wn / 1024:.1f}" for v, k in extra["slab_top"]) + "\n"
             f"- host limits: {extra['limits']}")
    d0, d1 = extra["daemon0"], extra["daemon1"]
    if d0 and d1:
        notes += (f"\n- warrend: RSS {d0['rss'] >> 20} -> {d1['rss'] >> 20} MiB "
                  f"({(d1['rss'] - d0['rss']) / wn / 1024:.1f} KiB per sandbox, part of MemAvailable drop; "
                  f"{extra['daemon2'].get('rss', 0) >> 20} MiB after the destroys: heap kept by malloc), "
                  f"open fds {d0['fds']} -> {d1['fds']} of RLIMIT_NOFILE {d1['nofile']}, threads {d1['threads']}")
    if extra["while_up"]:
        notes += f"\n- while up, `{a.while_up}`:\n\n" + "\n".join("  " + l for l in extra["while_up"].splitlines())
    print(table)
    print(notes)
    if a.record:
        cmd = os.environ.get("DENSITY_COMMAND") or "bench/density/bench.py " + shlex.join(sys.argv[1:])
        with open(ROOT / "bench/RESULTS.md", "a") as f:
            f.write(f"\n## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} — density (issue 3)\n\n"
                    f"- command: `{cmd}`\n"
                    f"- machine: kernel {os.uname().release}, nproc {os.cpu_count()}; load average before/after: "
                    f"{' '.join(f'{x:.2f}' for x in load0)} / {' '.join(f'{x:.2f}' for x in load1)}\n\n"
                    f"{table}\n\n{notes}\n")


if __name__ == "__main__":
    main()
