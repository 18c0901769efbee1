"""One containment plan (src/jail/plan.h): every way a process starts in a
sandbox (the sandbox's init, an exec, a background process, a PTY process,
an fncall call) sees the same confinement: /proc masks and read-only dirs,
/dev entries, capability sets, seccomp mode, no_new_privs and rlimits.
Differences by design are asserted explicitly:

* fncall: /dev is a read-only tmpfs without tty/ptmx/pts/mqueue (no
  terminal, nothing a call could leave for the next one); the call's stack
  rlimit and nofile are the zygote's; /sys is not mounted.
* the sandbox's init (warren-init, pid 1) holds no capability at all and
  runs with /dev/null on its stdio; commands run as root keep the default
  capability set.

Runs its own fncall daemon (the session daemon plus --fncall-layers)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, Iterable

import pytest

from conftest import NODE_PREFIX, Daemon

# What a process sees, as JSON on stdout. python3 -I -S: no site, no env.
PROBE = r'''
import json, os, stat
MASK_FILES = ["kcore", "sysrq-trigger", "keys", "kpagecount", "kpageflags", "kpagecgroup",
              "timer_list", "sched_debug", "latency_stats", "timer_stats", "kallsyms", "vmallocinfo"]
MASK_DIRS = ["/proc/acpi", "/proc/scsi", "/proc/driver", "/sys/firmware"]
RO_DIRS = ["/proc/sys", "/proc/bus", "/proc/fs", "/proc/irq"]
def masked_file(p):
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return "absent"
    if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == 1 and os.minor(st.st_rdev) == 3:
        return "masked"
    return "OPEN"
def masked_dir(p):
    try:
        return "masked" if not os.listdir(p) else "OPEN"
    except FileNotFoundError:
        return "absent"
    except PermissionError:
        return "masked"
def ro(p):
    try:
        return "ro" if os.statvfs(p).f_flag & os.ST_RDONLY else "RW"
    except FileNotFoundError:
        return "absent"
def status(pid):
    out = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        if k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"):
            out[k] = v.strip()
    return out
def limits(pid):
    out = {}
    for line in open(f"/proc/{pid}/limits").read().splitlines()[1:]:
        name = line[:26].strip()
        out[name] = line[26:].split()[:2]
    return out
print(json.dumps({
    "mask_files": {f: masked_file("/proc/" + f) for f in MASK_FILES},
    "mask_dirs": {d: masked_dir(d) for d in MASK_DIRS},
    "ro_dirs": {d: ro(d) for d in RO_DIRS},
    "dev": sorted(os.listdir("/dev")),
    "self": status("self"), "limits": limits("self"),
    "init": status(1) if os.getpid() != 1 else None,
    "init_limits": limits(1) if os.getpid() != 1 else None,
}, sort_keys=True))
'''

MASKED_FILE_OK = ("masked", "absent")
MASKED_DIR_OK = ("masked", "absent")


@pytest.fixture(scope="module")
def fnd(test_root: Path, layer_store: Path, base_layer: str) -> Iterable[Daemon]:
    d = Daemon(test_root, "contain", layer_store, NODE_PREFIX + "k",
               extra_args=["--fncall-layers", base_layer])
    d.start()
    yield d
    d.stop()


def _parse(out: bytes) -> Dict:
    return json.loads(out.decode().strip().splitlines()[-1])


def _views(d: Daemon, base_layer: str) -> Dict[str, Dict]:
    c = d.client
    sb = c.create(layers=[base_layer])
    try:
        argv = ["/usr/bin/python3", "-I", "-S", "-c", PROBE]
        views = {}
        r = sb.exec(argv, timeout=30)
        assert r.exit_code == 0, r
        views["exec"] = _parse(r.stdout)
        p = sb.spawn(argv, timeout=30)
        res = p.wait(timeout=60)
        assert res.exit_code == 0, res
        views["background"] = _parse(p.output().stdout)
        p = sb.spawn(argv, timeout=30, pty=True)
        res = p.wait(timeout=60)
        assert res.exit_code == 0, res
        views["pty"] = _parse(p.output().stdout.replace(b"\r\n", b"\n"))
        # The sandbox's init: what pid 1 holds, read by an exec.
        views["init"] = dict(views["exec"], self=views["exec"]["init"], limits=views["exec"]["init_limits"])
        f = c.fncall(PROBE)
        assert f.ok, f
        views["fncall"] = _parse(f.stdout)
        return views
    finally:
        sb.destroy()


@pytest.fixture(scope="module")
def views(fnd: Daemon, base_layer: str) -> Dict[str, Dict]:
    return _views(fnd, base_layer)


@pytest.mark.parametrize("path", ["exec", "background", "pty", "fncall"])
def test_proc_masks_on_every_spawn_path(views: Dict[str, Dict], path: str) -> None:
    v = views[path]
    assert all(s in MASKED_FILE_OK for s in v["mask_files"].values()), (path, v["mask_files"])
    # Every file of the list this kernel has (the host's /proc) is masked, not merely absent.
    for f, state in v["mask_files"].items():
        if Path("/proc", f).exists():
            assert state == "masked", (path, f, v["mask_files"])
    assert all(s in MASKED_DIR_OK for s in v["mask_dirs"].values()), (path, v["mask_dirs"])
    assert all(s in ("ro", "absent") for s in v["ro_dirs"].values()), (path, v["ro_dirs"])
    assert v["ro_dirs"]["/proc/sys"] == "ro", (path, v["ro_dirs"])


def test_same_masks_across_paths(views: Dict[str, Dict]) -> None:
    ref = views["exec"]
    for path in ("background", "pty", "fncall"):
        for k in ("mask_files", "ro_dirs"):
            assert views[path][k] == ref[k], (path, k, views[path][k], ref[k])
        # /sys/firmware: fncall mounts no /sys at all (absent), containers mask it.
        want = dict(ref["mask_dirs"])
        got = dict(views[path]["mask_dirs"])
        if path == "fncall":
            assert got.pop("/sys/firmware") == "absent"
            want.pop("/sys/firmware")
        assert got == want, (path, got, want)


def test_dev_entries(views: Dict[str, Dict]) -> None:
    ref = views["exec"]["dev"]
    for path in ("background", "pty"):
        assert views[path]["dev"] == ref, (path, views[path]["dev"], ref)
    # Container /dev: the nodes of the one list, plus terminals, shm, mqueue and the fd links.
    for n in ("null", "zero", "full", "random", "urandom", "tty", "pts", "ptmx", "shm", "mqueue",
              "fd", "stdin", "stdout", "stderr"):
        assert n in ref, (n, ref)
    # fncall: the same device nodes minus the terminal ones (no tty in a call).
    fn = views["fncall"]["dev"]
    assert sorted(set(ref) - {"tty", "pts", "ptmx", "mqueue", "core"}) == fn, (fn, ref)


def test_capabilities_seccomp_no_new_privs(views: Dict[str, Dict]) -> None:
    ref = views["exec"]["self"]
    assert ref["Seccomp"] == "2" and ref["NoNewPrivs"] == "1", ref
    assert ref["CapAmb"] == "0000000000000000" and ref["CapInh"] == "0000000000000000", ref
    assert ref["CapEff"] == ref["CapPrm"] == ref["CapBnd"] != "0000000000000000", ref
    for path in ("background", "pty"):
        assert views[path]["self"] == ref, (path, views[path]["self"], ref)
    # The init and an fncall call hold no capability at all, same seccomp and no_new_privs.
    for path in ("init", "fncall"):
        s = views[path]["self"]
        assert s["Seccomp"] == "2" and s["NoNewPrivs"] == "1", (path, s)
        for k in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
            assert s[k] == "0000000000000000", (path, k, s)


def test_rlimits(views: Dict[str, Dict]) -> None:
    ref = views["exec"]["limits"]
    assert ref["Max core file size"] == ["0", "0"], ref
    for path in ("background", "pty"):
        assert views[path]["limits"] == ref, (path, views[path]["limits"], ref)
    for path in ("init", "fncall"):
        assert views[path]["limits"]["Max core file size"] == ["0", "0"], (path, views[path]["limits"])


# ---------------------------------------------------------------- limit views
# Programs that size themselves from their limits (JVM heaps, thread pools,
# os.cpu_count, `free`) read /proc/meminfo, /proc/cpuinfo, /proc/stat,
# sysconf (/sys/devices/system/cpu/online) and the cgroup files: inside a
# sandbox these show the sandbox's limits (lxcfs, jail/lxcfs.h, and the
# sandbox's own cgroup at /sys/fs/cgroup). sched_getaffinity (`nproc`) is
# left alone by design: pinning a sandbox to ceil(cpu) cpus would take the
# kernel's load balancing away from it (the CFS quota already caps its share).
VIEWS = r'''
import json, os
def kb(k):
    for l in open("/proc/meminfo"):
        if l.startswith(k + ":"):
            return int(l.split()[1])
cg = {}
for p in ["memory/memory.limit_in_bytes", "cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us", "pids/pids.max",
          "memory.max", "cpu.max", "pids.max"]:
    try:
        cg[p] = open("/sys/fs/cgroup/" + p).read().strip()
    except OSError:
        pass
print(json.dumps({"MemTotal": kb("MemTotal"), "MemAvailable": kb("MemAvailable"),
                  "cpuinfo": sum(1 for l in open("/proc/cpuinfo") if l.startswith("processor")),
                  "stat_cpus": sum(1 for l in open("/proc/stat") if l.startswith("cpu") and l[3].isdigit()),
                  "cpu_count": os.cpu_count(), "cgroup": cg,
                  "self_cgroup": open("/proc/self/cgroup").read()}))
'''


def _lxcfs_or_skip() -> None:
    import shutil
    if shutil.which("lxcfs") is None or not Path("/dev/fuse").exists():
        pytest.skip("lxcfs or /dev/fuse missing on this host (scripts/setup.sh installs lxcfs)")


def _check_views(v: Dict, memory_mb: int, cpus: int, pids: int) -> None:
    assert v["MemTotal"] == memory_mb * 1024, v
    assert 0 < v["MemAvailable"] <= memory_mb * 1024, v
    assert v["cpuinfo"] == cpus and v["stat_cpus"] == cpus and v["cpu_count"] == cpus, json.dumps(v)
    cg = v["cgroup"]
    if "memory.max" in cg:  # v2
        assert cg["memory.max"] == str(memory_mb << 20), cg
    else:
        assert cg["memory/memory.limit_in_bytes"] == str(memory_mb << 20), cg
        quota, period = int(cg["cpu/cpu.cfs_quota_us"]), int(cg["cpu/cpu.cfs_period_us"])
        assert -(-quota // period) == cpus, cg
    # A cgroup namespace rooted at the sandbox's cgroup: the limit-holding
    # hierarchies name "/" (an exec has a child cgroup of its own in the
    # freezer/pids hierarchies: "/exec-N").
    for line in v["self_cgroup"].split():
        _, ctrls, path = line.split(":", 2)
        if {"memory", "cpu", "cpuset"} & set(ctrls.split(",")):
            assert path == "/", v["self_cgroup"]
        elif ctrls == "":  # v2: the exec's own child cgroup, below the namespace's root
            assert path == "/" or path.startswith("/exec-"), v["self_cgroup"]


def test_limit_views_in_a_container(fnd: Daemon, base_layer: str) -> None:
    _lxcfs_or_skip()
    if (os_cpus := len(os.sched_getaffinity(0))) < 2:
        pytest.skip("one host cpu: a 0.5-cpu sandbox would see as many as the host")
    sb = fnd.client.create(layers=[base_layer], cpu=0.5, memory_mb=256)
    try:
        r = sb.exec(["/usr/bin/python3", "-I", "-S", "-c", VIEWS], timeout=30)
        assert r.exit_code == 0, r
        _check_views(_parse(r.stdout), 256, 1, os_cpus)
    finally:
        sb.destroy()


def test_limit_views_in_an_fncall_call(fnd: Daemon) -> None:
    _lxcfs_or_skip()
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one host cpu: a 1-cpu worker would see as many as the host")
    f = fnd.client.fncall(VIEWS)
    assert f.ok, f
    _check_views(_parse(f.stdout), 512, 1, 0)


def test_limit_views_off_shows_the_host(test_root: Path, layer_store: Path, base_layer: str) -> None:
    """--limit-views=off: no lxcfs; a sandbox's /proc/meminfo is the host's."""
    d = Daemon(test_root, "views-off", layer_store, NODE_PREFIX + "vo", extra_args=["--limit-views=off"])
    d.start()
    try:
        sb = d.client.create(layers=[base_layer], memory_mb=256)
        try:
            r = sb.exec(["/usr/bin/python3", "-I", "-S", "-c", VIEWS], timeout=30)
            assert r.exit_code == 0, r
            host_kb = int(next(l for l in open("/proc/meminfo") if l.startswith("MemTotal:")).split()[1])
            assert _parse(r.stdout)["MemTotal"] == host_kb
        finally:
            sb.destroy()
    finally:
        d.stop()


def test_limit_views_on_without_lxcfs_refuses_to_start(test_root: Path, layer_store: Path) -> None:
    """--limit-views=on with no lxcfs: warrend exits at start naming the flag, and leaves no lxcfs dir."""
    import subprocess
    from conftest import WARREND
    state = test_root / "views-on-state"
    before = set(os.listdir("/run/warren/lxcfs")) if os.path.isdir("/run/warren/lxcfs") else set()
    p = subprocess.run([str(WARREND), "--state-dir", str(state), "--socket", str(test_root / "views-on.sock"),
                        "--layer-store", str(layer_store), "--node-id", NODE_PREFIX + "von",
                        "--limit-views=on", "--lxcfs", "/nonexistent/lxcfs"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode != 0, p
    assert "--limit-views=on" in p.stdout + p.stderr and "/nonexistent/lxcfs" in p.stdout + p.stderr, p
    after = set(os.listdir("/run/warren/lxcfs")) if os.path.isdir("/run/warren/lxcfs") else set()
    assert after <= before, after - before
