"""Suspend (issue 4): a suspended sandbox gives its memory back to the host
(its memory cgroup is reclaimed into swap: zram set up by warrend when the
host has none) and comes back intact: processes, open files, anonymous
memory and tmpfs files (the upper, /tmp) byte for byte."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import List

import pytest

import warren
from conftest import cgroup_dirs

MiB = 1 << 20

# A process that holds 200 MiB of anonymous memory (compressible text, as
# real heaps are; not zero pages, which swap stores for free) and an open
# file; on SIGUSR1 it re-hashes its memory and appends through the open fd.
HOLDER = r"""
import hashlib, os, signal, time
pat = b"".join(b"%08d some agent state " % i for i in range(4096))
buf = bytearray(pat * ((200 << 20) // len(pat)))
h = hashlib.sha256(buf).hexdigest()
f = open("/w/held.txt", "a", buffering=1)
f.write("before " + h + "\n")
def again(*_):
    f.write("after " + hashlib.sha256(buf).hexdigest() + "\n")
signal.signal(signal.SIGUSR1, again)
open("/w/ready", "w").close()
while True:
    time.sleep(0.05)
"""


def swap_devices() -> List[str]:
    lines = Path("/proc/swaps").read_text().splitlines()[1:]
    return [ln.split()[0] for ln in lines if ln.strip()]


def memcg_usage(init_pid: int) -> int:
    d = cgroup_dirs(init_pid)
    if "memory" in d:
        return int((d["memory"] / "memory.usage_in_bytes").read_text())
    return int((d["unified"] / "memory.current").read_text())


def wait_until(pred, timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


@pytest.mark.timeout(300)
def test_suspend_gives_memory_back_and_resume_keeps_everything(daemon, client, base_layer):
    if not swap_devices():
        pytest.skip("no swap on this host and warrend could not set up zram: "
                    + "\n".join(l for l in daemon.log_tail(200).splitlines() if "swap" in l))
    with client.create(layers=[base_layer], memory_mb=1024, disk_mb=512) as sb:
        r = sb.exec("mkdir -p /w && nohup python3 -c '" + HOLDER.replace("'", "'\\''") +
                    "' >/w/holder.log 2>&1 & echo $!", timeout=60)
        assert r.exit_code == 0, r.stderr
        holder = int(r.stdout)
        assert wait_until(lambda: sb.files.exists("/w/ready"), timeout=60), sb.files.read("/w/holder.log")
        r = sb.exec("yes 'a line of tmpfs data in the upper layer' | head -c 100M > /tmp/big && "
                    "sha256sum /tmp/big", timeout=120)
        assert r.exit_code == 0, r.stderr
        big_sum = r.stdout.split()[0]
        init_pid = sb.info().init_pid
        before = memcg_usage(init_pid)
        assert before >= 300 * MiB, before
        assert sb.info().memory_bytes >= 300 * MiB

        t0 = time.monotonic()
        info = sb.suspend()
        suspend_s = time.monotonic() - t0
        assert info.state == "suspended"
        assert sb.info().state == "suspended"
        assert [s.cached_info.state for s in client.list() if s.id == sb.id] == ["suspended"]
        after = memcg_usage(init_pid)
        # most of the 300 MiB (200 anon + 100 tmpfs) left the cgroup
        assert after <= before - 270 * MiB, (before, after)
        assert info.memory_bytes <= before - 270 * MiB
        assert info.swap_bytes >= 270 * MiB, info
        assert sb.suspend().state == "suspended"  # idempotent
        print(f"suspend: {before / MiB:.0f} MiB -> {after / MiB:.0f} MiB in {suspend_s:.2f} s")

        # Any call resumes it: the tmpfs file is byte-exact.
        r = sb.exec("sha256sum /tmp/big", timeout=120)
        assert r.exit_code == 0 and r.stdout.split()[0] == big_sum
        assert sb.info().state == "running"
        # the holder process, its memory and its open file survived
        r = sb.exec(f"kill -USR1 {holder}", timeout=30)
        assert r.exit_code == 0, r.stderr
        assert wait_until(lambda: b"after" in sb.files.read("/w/held.txt"), timeout=60)
        lines = sb.files.read("/w/held.txt").decode().split()
        assert lines[0] == "before" and lines[2] == "after" and lines[1] == lines[3], lines
        assert sb.exec(f"kill -0 {holder}", timeout=30).exit_code == 0


@pytest.mark.timeout(120)
def test_suspend_resume_explicit_and_exec_timeout_excludes_suspended_time(client, base_layer):
    with client.create(layers=[base_layer]) as sb:
        sb.exec("nohup sh -c 'while true; do echo x >> /tick; sleep 0.05; done' >/dev/null 2>&1 &")
        assert wait_until(lambda: sb.files.exists("/tick"), timeout=10)
        res: List[warren.ExecResult] = []
        t = threading.Thread(target=lambda: res.append(sb.exec("sleep 2; echo done", timeout=3)))
        t.start()
        time.sleep(0.5)
        assert sb.suspend().state == "suspended"
        time.sleep(4)  # longer than the exec's timeout: must not fire
        assert sb.info().state == "suspended"
        assert sb.resume().state == "running"
        t.join(30)
        assert res and not res[0].timed_out and res[0].stdout == b"done\n", res
        n = len(sb.files.read("/tick").splitlines())
        assert wait_until(lambda: len(sb.files.read("/tick").splitlines()) > n + 5, timeout=10)
        # suspending a paused sandbox works too, and resume from either is idempotent
        sb.pause()
        assert sb.suspend().state == "suspended"
        assert sb.resume().state == "running"
        assert sb.resume().state == "running"
