"""Pause, resume and suspend of microVMs (src/runtime/microvm/sandbox.h):
pause stops the vCPUs (QMP stop/cont); suspend saves the stopped VM's device
state and RAM to a file beside its disk and ends its QEMU; resume restores it
on this node, with everything in the guest as it was.

Needs qemu-system-x86_64 and the guest files of scripts/microvm/build-guest.sh
(WARREN_MICROVM_DIR, else /var/cache/warren/microvm). TCG on 2 shared cores:
every test keeps at most 2 VMs up.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import warren
from conftest import (
    NODE_PREFIX,
    Daemon,
    cgroup_dirs,
    one_qemu,
    qemu_pids,
    running,
    vm_cgroups,
)

QEMU = shutil.which("qemu-system-x86_64")
MICROVM_DIR = Path(os.environ.get("WARREN_MICROVM_DIR", "/var/cache/warren/microvm"))
pytestmark = pytest.mark.skipif(
    QEMU is None or not (MICROVM_DIR / "vmlinuz").exists(),
    reason=f"microvm: needs qemu-system-x86_64 and {MICROVM_DIR}/vmlinuz "
    "(scripts/setup.sh or scripts/microvm/build-guest.sh)",
)
CREATE_TIMEOUT = 180
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _cgroup_procs(sandbox_id: str) -> set[int]:
    procs: set[int] = set()
    for cg in vm_cgroups(sandbox_id):
        procs |= {int(p) for p in (cg / "cgroup.procs").read_text().split()}
    return procs


def _state_files(d: Daemon, sandbox_id: str) -> list[Path]:
    return sorted((d.state_dir / "microvm-disks").glob(f"{sandbox_id}.vmstate*"))


def _leftovers(d: Daemon, sandbox_id: str) -> list[str]:
    left = [f"qemu pid {p}" for p in qemu_pids(sandbox_id) if running(p)]
    left += [str(p) for p in (d.state_dir / "microvm-disks").glob(f"{sandbox_id}*")]
    left += [str(p) for p in vm_cgroups(sandbox_id)]
    return left


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14, 15)


@pytest.fixture(scope="module")
def mvm(test_root: Path, layer_store: Path):
    """A daemon of this module (warm starts on: its VMs are clones)."""
    d = Daemon(
        test_root,
        "mvm-life",
        layer_store,
        f"{NODE_PREFIX}l",
        extra_args=["--microvm-dir", str(MICROVM_DIR), "--warm-shells", "0"],
    ).start()
    yield d
    d.stop()


def _create(d: Daemon, base_layer: str) -> warren.Sandbox:
    return d.client.create(
        backend="microvm", layers=[base_layer], memory_mb=256, timeout=CREATE_TIMEOUT
    )


def test_pause_stops_the_vcpus_and_resume_continues(
    mvm: Daemon, base_layer: str
) -> None:
    sb = _create(mvm, base_layer)
    try:
        # A guest that keeps its vCPU busy: QEMU burns CPU while it runs.
        r = sb.exec(
            "nohup sh -c 'while :; do :; done' >/dev/null 2>&1 & echo $!", timeout=60
        )
        assert r.exit_code == 0, r.stderr
        spinner = r.stdout.decode().strip()
        qemu = one_qemu(sb.id)
        assert sb.pause().state == "paused"
        assert sb.pause().state == "paused"  # idempotent
        t0 = _cpu_ticks(qemu)
        time.sleep(1.5)
        paused_ticks = _cpu_ticks(qemu) - t0
        assert running(qemu), "pause keeps QEMU"
        assert sb.resume().state == "running"
        t0 = _cpu_ticks(qemu)
        time.sleep(1.5)
        running_ticks = _cpu_ticks(qemu) - t0
        print(
            f"QEMU CPU over 1.5 s: paused {paused_ticks}, running {running_ticks} ticks"
        )
        assert paused_ticks <= 0.1 * CLK_TCK, paused_ticks
        assert running_ticks > paused_ticks + 0.2 * CLK_TCK, (
            paused_ticks,
            running_ticks,
        )
        # An exec on a paused VM resumes it first.
        sb.pause()
        r = sb.exec(f"kill {spinner}; echo ok", timeout=60)
        assert r.exit_code == 0 and r.stdout == b"ok\n", r
        assert sb.info().state == "running"
        assert one_qemu(sb.id) == qemu
    finally:
        sb.destroy(timeout=60)
    assert _leftovers(mvm, sb.id) == []


def test_suspend_ends_qemu_and_resume_restores_the_guest_as_it_was(
    mvm: Daemon, base_layer: str
) -> None:
    sb = _create(mvm, base_layer)
    try:
        r = sb.exec(
            "echo disk > /root/mark; head -c 3000000 /dev/urandom > /dev/shm/blob; "
            "md5sum /dev/shm/blob | cut -c1-32; "
            "nohup sleep 100000 >/dev/null 2>&1 & echo $!; "
            "cat /proc/sys/kernel/random/boot_id",
            timeout=60,
        )
        assert r.exit_code == 0, r.stderr
        md5, sleeper, boot_id = r.stdout.decode().split()
        qemu = one_qemu(sb.id)
        jail_before = {k: _status(qemu)[k] for k in ("Uid", "Gid", "Groups", "CapEff", "Seccomp", "NoNewPrivs")}
        assert int(jail_before["Uid"].split()[0]) >= 1_000_000, jail_before
        assert sb.info().memory_bytes > 0

        t0 = time.monotonic()
        assert sb.suspend().state == "suspended"
        print(f"suspend: {time.monotonic() - t0:.2f} s")
        assert sb.info().state == "suspended"
        assert sb.suspend().state == "suspended"  # idempotent
        # No QEMU while suspended, its cgroup empty; the state on disk.
        assert not running(qemu)
        assert not [p for p in qemu_pids(sb.id) if running(p)]
        assert _cgroup_procs(sb.id) == set()
        assert [p.name for p in _state_files(mvm, sb.id)] == [f"{sb.id}.vmstate"]
        assert sb.info().memory_bytes == 0

        t0 = time.monotonic()
        assert sb.resume().state == "running"
        print(f"resume: {time.monotonic() - t0:.2f} s")
        before = time.time()
        r = sb.exec(
            f"date +%s.%N; cat /root/mark; md5sum /dev/shm/blob | cut -c1-32; "
            f"kill -0 {sleeper} && echo alive; cat /proc/sys/kernel/random/boot_id",
            timeout=60,
        )
        after = time.time()
        assert r.exit_code == 0, r.stderr
        now, mark, md5_2, alive, boot_id_2 = r.stdout.decode().split()
        assert (mark, md5_2, alive, boot_id_2) == ("disk", md5, "alive", boot_id)
        # The guest's clock is the host's again (the hello after restore).
        assert before - 1 <= float(now) <= after + 1, (before, now, after)
        assert _state_files(mvm, sb.id) == []
        assert len([p for p in qemu_pids(sb.id) if running(p)]) == 1
        # The restored QEMU is jailed as the created one was: its own uid,
        # no capabilities, its seccomp filter; its files open fds.
        restored = one_qemu(sb.id)
        st = _status(restored)
        assert {k: st[k] for k in jail_before} == jail_before, (st, jail_before)
        assert os.readlink(f"/proc/{restored}/fd/0") == "/dev/null"

        # Any call resumes a suspended VM.
        assert sb.suspend().state == "suspended"
        r = sb.exec("cat /root/mark", timeout=60)
        assert r.exit_code == 0 and r.stdout == b"disk\n", r
        assert sb.info().state == "running"
    finally:
        sb.destroy(timeout=60)
    assert _leftovers(mvm, sb.id) == []


def test_destroy_of_a_suspended_vm_leaves_nothing(mvm: Daemon, base_layer: str) -> None:
    sb = _create(mvm, base_layer)
    assert sb.exec("echo x > /root/x", timeout=60).exit_code == 0
    assert sb.suspend().state == "suspended"
    assert _state_files(mvm, sb.id)
    sb.destroy(timeout=60)
    assert _leftovers(mvm, sb.id) == []
    with pytest.raises(warren.NotFound):
        sb.info()


def test_a_suspended_vm_survives_a_daemon_restart(
    test_root: Path, layer_store: Path, base_layer: str
) -> None:
    # Cold boots here (the module's daemon makes clones): both kinds of RAM
    # are saved and restored.
    d = Daemon(
        test_root,
        "mvm-life-restart",
        layer_store,
        f"{NODE_PREFIX}m",
        extra_args=[
            "--microvm-dir",
            str(MICROVM_DIR),
            "--warm-shells",
            "0",
            "--microvm-templates",
            "false",
        ],
    ).start()
    sid = None
    try:
        sb = _create(d, base_layer)
        sid = sb.id
        r = sb.exec(
            "echo kept > /root/mark; cat /proc/sys/kernel/random/boot_id", timeout=60
        )
        boot_id = r.stdout.decode().split()[0]
        assert sb.suspend().state == "suspended"
        d.kill9()
        assert not [p for p in qemu_pids(sid) if running(p)]
        d.start()
        again = d.client.get(sid)
        assert again.info().state == "suspended"
        assert not [p for p in qemu_pids(sid) if running(p)]
        r = again.exec("cat /root/mark /proc/sys/kernel/random/boot_id", timeout=60)
        assert r.exit_code == 0, r.stderr
        assert r.stdout.decode().split() == ["kept", boot_id]
        # Restored, then the daemon dies again: the restored QEMU (a pid the
        # node's record of the create does not name) is adopted.
        qemu = one_qemu(sid)
        d.kill9()
        assert running(qemu)
        d.start()
        again = d.client.get(sid)
        assert again.info().state == "running"
        r = again.exec("cat /root/mark /proc/sys/kernel/random/boot_id", timeout=60)
        assert r.stdout.decode().split() == ["kept", boot_id], r
        assert one_qemu(sid) == qemu
        again.destroy(timeout=60)
        assert _leftovers(d, sid) == []
    finally:
        d.stop()
    if sid:
        assert _leftovers(d, sid) == []


def _status(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        out[k] = v.strip()
    return out


def _limit(dirs: dict[str, Path], v1: tuple[str, str], v2: str) -> str:
    """A cgroup file of the QEMU's cgroup: v1 (controller, file) or v2 file."""
    if "unified" in dirs and (dirs["unified"] / v2).exists():
        return (dirs["unified"] / v2).read_text().strip()
    for key, d in dirs.items():
        if v1[0] in key.split(","):
            return (d / v1[1]).read_text().strip()
    raise AssertionError(f"no {v1} or {v2} in {dirs}")


def test_qemu_runs_jailed(mvm: Daemon, base_layer: str) -> None:
    sbs = [_create(mvm, base_layer) for _ in range(2)]
    try:
        uids = set()
        for sb in sbs:
            qemu = one_qemu(sb.id)
            st = _status(qemu)
            # Its own unprivileged uid and gid, no groups, no capabilities.
            ruid, euid, suid, fsuid = (int(x) for x in st["Uid"].split())
            assert ruid == euid == suid == fsuid and ruid >= 1_000_000, st["Uid"]
            assert [int(x) for x in st["Gid"].split()] == [ruid] * 4, st["Gid"]
            assert st["Groups"] == ""
            assert int(st["CapEff"], 16) == 0 and int(st["CapPrm"], 16) == 0
            uids.add(ruid)
            # QEMU's seccomp filter (-sandbox on), no_new_privs.
            assert st["Seccomp"] == "2" and st["NoNewPrivs"] == "1", st
            # stdin /dev/null; no file of the host reachable by path is
            # needed: the disks and console are open fds.
            assert os.readlink(f"/proc/{qemu}/fd/0") == "/dev/null"
            cmdline = Path(f"/proc/{qemu}/cmdline").read_bytes().split(b"\0")
            assert b"-sandbox" in cmdline
            # Its own cgroup under the daemon's, with the VM's limits:
            # memory = 256 MiB of guest + QEMU's overhead, pids, cpu.
            dirs = cgroup_dirs(qemu)
            # v1: the memory, pids and cpu hierarchies; v2: the unified one.
            keys = [k for k in dirs if {"memory", "pids", "cpu"} & set(k.split(","))]
            for key, d in dirs.items():
                if key in (keys or ["unified"]):
                    assert d.name == sb.id and d.parent.name == "warren-microvm", (
                        key,
                        d,
                    )
                    assert str(d.parent.parent).startswith(
                        str(cgroup_dirs(mvm.pid)[key])
                    ), (
                        key,
                        d,
                    )
            mem = int(_limit(dirs, ("memory", "memory.limit_in_bytes"), "memory.max"))
            assert mem == (256 + 128) << 20, mem
            assert _limit(dirs, ("pids", "pids.max"), "pids.max") == "64"
            cpu = _limit(dirs, ("cpu", "cpu.cfs_quota_us"), "cpu.max").split()[0]
            assert cpu not in ("-1", "max"), cpu
        assert len(uids) == 2, "each VM has its own uid"
        # The guest works under all of it.
        r = sbs[0].exec("echo ok > /root/f && cat /root/f", timeout=60)
        assert r.exit_code == 0 and r.stdout == b"ok\n", r
    finally:
        for sb in sbs:
            sb.destroy(timeout=60)
    for sb in sbs:
        assert _leftovers(mvm, sb.id) == []
