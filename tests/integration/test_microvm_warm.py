"""Warm starts of the microvm backend (src/runtime/microvm/template.h): a
template saved once per shape, sandboxes created as copy-on-write clones of
it, each with the host's clock, a fresh RNG and its own identity.

Needs the guest files of scripts/microvm/build-guest.sh built from this tree's
agent (WARREN_MICROVM_DIR, else build/microvm-guest of this tree, else
/var/cache/warren/microvm). TCG on 2 cores: at most 2 VMs up at once.
"""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import NODE_PREFIX, Daemon, cgroup_dirs, qemu_pids, running

REPO = Path(__file__).resolve().parents[2]
QEMU = shutil.which("qemu-system-x86_64")


def _guest_dir() -> Path:
    if "WARREN_MICROVM_DIR" in os.environ:
        return Path(os.environ["WARREN_MICROVM_DIR"])
    local = REPO / "build" / "microvm-guest"
    if (local / "initramfs.cpio").exists():
        return local
    return Path("/var/cache/warren/microvm")


GUEST = _guest_dir()
pytestmark = pytest.mark.skipif(
    QEMU is None or not (GUEST / "vmlinuz").exists(),
    reason=f"microvm: needs qemu-system-x86_64 and {GUEST}/vmlinuz (scripts/microvm/build-guest.sh)",
)
CREATE_TIMEOUT = 180




def _run_dir(d: Daemon) -> Path:
    return Path(os.path.realpath(d.state_dir / "sandboxes")).parent


def _templates(d: Daemon) -> list[str]:
    t = _run_dir(d) / "microvm-templates"
    return sorted(p.name for p in t.iterdir()) if t.is_dir() else []


def _vm_leftovers(d: Daemon, sandbox_id: str) -> list[str]:
    left = [f"qemu pid {p}" for p in qemu_pids(sandbox_id)]
    left += [str(p) for p in (d.state_dir / "microvm-disks").glob(f"{sandbox_id}*")]
    for cg in cgroup_dirs().values():
        if (cg / "warren-microvm" / sandbox_id).exists():
            left.append(str(cg / "warren-microvm" / sandbox_id))
    return left


@pytest.fixture(scope="module")
def warm(test_root: Path, layer_store: Path, base_layer: str):
    d = Daemon(
        test_root,
        "mvm-warm",
        layer_store,
        f"{NODE_PREFIX}w",
        extra_args=["--microvm-dir", str(GUEST), "--warm-shells", "0"],
    ).start()
    yield d
    d.stop()
    # A clean shutdown removes the templates (their RAM memfd is gone too).
    assert not (_run_dir(d) / "microvm-templates").exists()
    assert not qemu_pids("warren.template=1")


def test_five_clones_have_the_hosts_clock_and_their_own_rng_and_identity(
    warm: Daemon, base_layer: str
) -> None:
    boot_ids, randoms = set(), set()
    for i in range(5):
        sb = warm.client.create(
            backend="microvm",
            layers=[base_layer],
            memory_mb=256,
            timeout=CREATE_TIMEOUT,
        )
        try:
            before = time.time()
            r = sb.exec(
                "date +%s.%N; cat /proc/sys/kernel/random/boot_id; "
                "head -c16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; hostname",
                timeout=60,
            )
            after = time.time()
            assert r.exit_code == 0, r.stderr
            guest_time, boot_id, rnd, host = r.stdout.decode().split("\n")[:4]
            # The first exec's clock: within 1 s of the host's.
            assert before - 1 <= float(guest_time) <= after + 1, (
                before,
                guest_time,
                after,
            )
            boot_ids.add(boot_id)
            randoms.add(rnd)
            assert len(rnd) == 32
            assert host == sb.id[:63]
            # The clone's own disks: its writable disk, the layer as its root.
            r = sb.exec(
                "echo $((1+1)) > /root/x && cat /root/x /etc/debian_version", timeout=60
            )
            assert r.exit_code == 0 and r.stdout.startswith(b"2\n12"), r
            if i == 0:
                assert len(_templates(warm)) == 1, _templates(warm)
        finally:
            sb.destroy(timeout=60)
        assert _vm_leftovers(warm, sb.id) == []
    assert len(boot_ids) == 5, boot_ids
    assert len(randoms) == 5, randoms
    log = warm.log_tail(400)
    # One template for all five, and no cold boot among them.
    assert log.count("microvm template saved") == 1, log
    assert "booting cold" not in log and "creates boot cold" not in log, log
    # The template's QEMU is gone once it is saved.
    assert not qemu_pids("warren.template=1")


def test_a_failed_template_build_falls_back_to_a_cold_boot_and_says_why(
    test_root: Path, layer_store: Path, base_layer: str
) -> None:
    d = Daemon(
        test_root,
        "mvm-warm-fail",
        layer_store,
        f"{NODE_PREFIX}v",
        extra_args=["--microvm-dir", str(GUEST), "--warm-shells", "0"],
    ).start()
    try:
        # A file where the templates' dir goes: the build cannot start.
        blocker = _run_dir(d) / "microvm-templates"
        blocker.write_text("not a dir")
        sb = d.client.create(
            backend="microvm",
            layers=[base_layer],
            memory_mb=256,
            timeout=CREATE_TIMEOUT,
        )
        try:
            assert sb.exec("echo ok", timeout=60).stdout == b"ok\n"
        finally:
            sb.destroy(timeout=60)
        assert _vm_leftovers(d, sb.id) == []
        log = d.log_tail(200)
        assert "no microvm template; creates boot cold" in log, log
        assert "microvm-templates" in log, log
        assert not qemu_pids("warren.template=1")
        blocker.unlink()
    finally:
        d.stop()


def test_templates_off_boot_cold_with_the_hosts_clock(
    test_root: Path, layer_store: Path, base_layer: str
) -> None:
    d = Daemon(
        test_root,
        "mvm-warm-off",
        layer_store,
        f"{NODE_PREFIX}u",
        extra_args=[
            "--microvm-dir",
            str(GUEST),
            "--microvm-templates",
            "false",
            "--warm-shells",
            "0",
        ],
    ).start()
    try:
        sb = d.client.create(
            backend="microvm",
            layers=[base_layer],
            memory_mb=256,
            timeout=CREATE_TIMEOUT,
        )
        try:
            # A cold boot's clock is right on the first exec too (its first
            # hello waited in the port while the kernel booted).
            before = time.time()
            r = sb.exec("date +%s.%N", timeout=60)
            after = time.time()
            assert before - 1 <= float(r.stdout) <= after + 1, (before, r.stdout, after)
        finally:
            sb.destroy(timeout=60)
        assert _templates(d) == []
        assert "template" not in d.log_tail(200)
    finally:
        d.stop()




def test_a_template_build_cut_short_by_kill9_is_cleaned_up_at_restart(
    test_root: Path, layer_store: Path, base_layer: str
) -> None:
    d = Daemon(
        test_root,
        "mvm-warm-kill",
        layer_store,
        f"{NODE_PREFIX}k",
        extra_args=["--microvm-dir", str(GUEST), "--warm-shells", "0"],
    ).start()
    try:
        tdir = str(_run_dir(d) / "microvm-templates")
        pool = ThreadPoolExecutor(1)
        fut = pool.submit(
            d.client.create,
            backend="microvm",
            layers=[base_layer],
            memory_mb=256,
            timeout=CREATE_TIMEOUT,
            retries=0,
        )
        for _ in range(300):  # the template's QEMU starts at the first create
            pids = qemu_pids(tdir)
            if pids:
                break
            time.sleep(0.02)
        assert pids, "no template QEMU started"
        d.kill9()
        with pytest.raises(Exception):  # noqa: B017 (the daemon died under the call)
            fut.result(timeout=60)
        pool.shutdown()
        assert all(running(p) for p in pids), "the template QEMU outlived the daemon"
        d.start()
        # The restarted daemon killed it and emptied the templates' dir.
        for _ in range(100):
            if not any(running(p) for p in pids):
                break
            time.sleep(0.05)
        assert not any(running(p) for p in pids)
        assert _templates(d) == []
        assert "killing a template QEMU left by an earlier daemon" in d.log_tail(100)
    finally:
        d.stop()
