"""Snapshot, fork and grade of microVMs (runtime/microvm/changes.h,
src/guest/agent/changes.h): the guest agent streams its overlay's upper dir
as a tar, the host turns it into the layer format every backend's changes
take, so a microVM's snapshot starts a container and a container's snapshot
starts a microVM.

Runs on the daemon of the integration suite, which takes this tree's guest
(build/microvm-guest, see conftest.microvm_dir_args). VMs run under TCG
here: every test keeps at most 2 up.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest
import warren
from conftest import qemu_pids, running

CREATE_TIMEOUT = 180
CLK_TCK = os.sysconf("SC_CLK_TCK")
LONG = "d" * 150

# Every kind of change a layer holds: data (binary, several chunks), modes
# with setuid, owners, a symlink, a hardlink, an xattr, an mtime with
# nanoseconds, a deleted file (whiteout), a dir deleted and recreated
# (opaque), a fifo, a long path, a name with a newline and a non-UTF-8 byte.
CHANGES = rf"""
set -e
mkdir -p /w/sub /w/{LONG}
printf 'hello\000world' > /w/bin.dat
chown 1234:5678 /w/bin.dat && chmod 4750 /w/bin.dat
head -c 300000 /dev/urandom > /w/rand.bin
ln /w/rand.bin /w/hard.bin
ln -s ../etc/hostname /w/link
echo deep > /w/{LONG}/f
mkfifo /w/fifo
touch -d '2001-02-03 04:05:06.123456789' /w/sub
rm /etc/issue
rm -rf /etc/apt && mkdir /etc/apt && echo new > /etc/apt/only
echo skip > /root/skip.txt
python3 -c "import os; os.setxattr('/w/bin.dat', 'user.tag', b'v1'); open(b'/w/n\nl\xff', 'w').write('odd')"
sha256sum /w/rand.bin | cut -d' ' -f1
"""

# What a sandbox started from that snapshot shows (one line per check).
CHECK = rf"""
stat -c '%a %u %g %s' /w/bin.dat
od -An -c /w/bin.dat | tr -s ' '
sha256sum /w/rand.bin | cut -d' ' -f1
stat -c '%h' /w/hard.bin
[ "$(stat -c %i /w/rand.bin)" = "$(stat -c %i /w/hard.bin)" ] && echo same-inode
readlink /w/link
cat /w/{LONG}/f
[ -p /w/fifo ] && echo fifo
stat -c '%y' /w/sub
[ -e /etc/issue ] && echo issue-present || echo issue-gone
ls /etc/apt | tr '\n' ' '; echo
[ -e /root/skip.txt ] && echo skip-present || echo skip-gone
python3 -c "import os; print(os.getxattr('/w/bin.dat', 'user.tag'), sorted(os.listdir(b'/w')))"
"""


def _expected(rand_sha: str) -> list[str]:
    return [
        "4750 1234 5678 11",
        " h e l l o \\0 w o r l d",
        rand_sha,
        "2",
        "same-inode",
        "../etc/hostname",
        "deep",
        "fifo",
        "2001-02-03 04:05:06.123456789 +0000",
        "issue-gone",
        "only ",
        "skip-gone",
        "b'v1' " + repr(sorted([b"bin.dat", b"fifo", b"hard.bin", b"link", b"n\nl\xff", b"rand.bin", b"sub", LONG.encode()])),
    ]


def _check(sb: warren.Sandbox) -> list[str]:
    r = sb.exec(CHECK, env={"TZ": "UTC"}, timeout=120)
    assert r.exit_code == 0, r.stderr
    return r.stdout.decode("utf-8", "surrogateescape").split("\n")[:13]


@pytest.fixture(scope="module")
def offered(client: warren.Client) -> None:
    if "microvm" not in client.status().backends:
        pytest.skip("microvm: not offered by this warrend (qemu-system-x86_64 or the guest files are missing)")


def _vm(client: warren.Client, layers: list[str]) -> warren.Sandbox:
    return client.create(backend="microvm", layers=layers, memory_mb=256, timeout=CREATE_TIMEOUT)


def test_a_microvm_snapshot_starts_a_container_and_a_microvm(
        client: warren.Client, base_layer: str, offered: None) -> None:
    vm = _vm(client, [base_layer])
    try:
        r = vm.exec(CHANGES, env={"TZ": "UTC"}, timeout=120)
        assert r.exit_code == 0, r.stderr
        rand_sha = r.stdout.decode().split()[-1]
        snap = vm.snapshot(exclude=["/root/skip*"], timeout=300)
        assert snap.layers[:-1] == vm.info().layers and snap.layers[-1] == snap.layer.digest
        assert vm.info().state == "running"
        assert vm.exec("cat /root/skip.txt", timeout=60).stdout == b"skip\n", "the source is unchanged"
    finally:
        vm.destroy(timeout=60)
    with client.create(layers=snap.layers) as ct:
        assert _check(ct) == _expected(rand_sha)
    vm2 = _vm(client, snap.layers)
    try:
        assert _check(vm2) == _expected(rand_sha)
    finally:
        vm2.destroy(timeout=60)


def test_a_container_snapshot_starts_a_microvm(client: warren.Client, base_layer: str, offered: None) -> None:
    with client.create(layers=[base_layer]) as ct:
        r = ct.exec("mkdir -p /w && echo from-container > /w/c.txt && rm /etc/issue", timeout=60)
        assert r.exit_code == 0, r.stderr
        snap = ct.snapshot()
    vm = _vm(client, snap.layers)
    try:
        r = vm.exec("cat /w/c.txt; [ -e /etc/issue ] || echo gone; uname -r", timeout=60)
        assert r.stdout.split(b"\n")[:2] == [b"from-container", b"gone"], r
        assert r.stdout.split(b"\n")[2].decode() != os.uname().release
    finally:
        vm.destroy(timeout=60)


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def test_a_paused_microvm_snapshots_and_stays_paused_then_forks(
        client: warren.Client, base_layer: str, offered: None) -> None:
    vm = _vm(client, [base_layer])
    fork = None
    try:
        r = vm.exec("echo 42 > /root/answer; nohup sh -c 'while :; do :; done' >/dev/null 2>&1 &", timeout=60)
        assert r.exit_code == 0, r.stderr
        (qemu,) = [p for p in qemu_pids(vm.id) if running(p)]
        assert vm.pause().state == "paused"
        snap = vm.snapshot(timeout=300)
        assert len(snap.layers) == 2
        assert vm.info().state == "paused"
        t0 = _cpu_ticks(qemu)
        time.sleep(1.5)
        assert _cpu_ticks(qemu) - t0 <= 0.1 * CLK_TCK, "the VM's vCPUs are stopped again after the snapshot"
        vm.resume()
        # A fork is a microVM of the source's changes; its own changes are its own.
        (fork,) = vm.fork(1, timeout=300)
        assert fork.info().backend == "microvm"
        r = fork.exec("cat /root/answer; echo mine > /root/fork-only; uname -r", timeout=60)
        assert r.stdout.split(b"\n")[:1] == [b"42"], r
        assert r.stdout.split(b"\n")[1].decode() != os.uname().release
        assert vm.exec("[ -e /root/fork-only ] && echo leaked || echo own", timeout=60).stdout == b"own\n"
    finally:
        if fork is not None:
            fork.destroy(timeout=60)
        vm.destroy(timeout=60)


def test_a_microvm_is_graded_in_a_fresh_microvm_on_its_solution_only(
        client: warren.Client, base_layer: str, offered: None) -> None:
    vm = _vm(client, [base_layer])
    try:
        r = vm.exec("mkdir -p /w && echo 42 > /w/answer.txt && echo x > /etc/agent-was-here", timeout=60)
        assert r.exit_code == 0, r.stderr
        g = vm.grade(
            "grep -q 42 /w/answer.txt && [ ! -e /etc/agent-was-here ] && uname -r",
            solution=["/w"],
            timeout=300,
        )
        assert g.result.exit_code == 0, (g.result.stderr, g.rejected)
        assert g.result.stdout.decode().strip() != os.uname().release, "graded on a guest kernel"
        assert "/etc/agent-was-here" in g.touched
        assert not any(p.startswith("/w") for p in g.touched)
        assert not qemu_pids(g.grade_sandbox_id), "the grading VM is gone"
    finally:
        vm.destroy(timeout=60)


def test_changes_too_big_for_the_budget_fail_the_snapshot_only(
        client: warren.Client, base_layer: str, offered: None) -> None:
    """A snapshot is bounded by the sandbox's disk (the copy budget): a
    sparse file far larger than disk_mb fails it with ResourceExhausted
    naming the sandbox, nothing is left, and the VM keeps working."""
    vm = client.create(backend="microvm", layers=[base_layer], memory_mb=256, disk_mb=64,
                       timeout=CREATE_TIMEOUT)
    try:
        assert vm.exec("truncate -s 4G /root/sparse", timeout=60).exit_code == 0
        with pytest.raises(warren.ResourceExhausted, match=vm.id):
            vm.snapshot(timeout=300)
        assert vm.exec("echo ok", timeout=60).stdout == b"ok\n"
        assert vm.info().state == "running"
    finally:
        vm.destroy(timeout=60)
