"""Warm starts of the microvm backend (src/runtime/microvm/template.h): a
bare template saved once per shape, a template with its root mounted per
layer set and disk size made from it, sandboxes created as copy-on-write
clones of that (restored at the create, or taken from the pool of restored
clones warrend keeps), each with the host's clock, a fresh RNG and its own
identity.

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
from conftest import (
    NODE_PREFIX,
    Daemon,
    cgroup_dirs,
    microvm_pool_cgroup_prefix,
    qemu_pids,
    running,
)

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


_RUN_DIRS: dict[str, Path] = {}


def _run_dir(d: Daemon) -> Path:
    """The daemon's run dir (found while it runs, remembered after)."""
    key = str(d.state_dir)
    if key not in _RUN_DIRS:
        _RUN_DIRS[key] = Path(os.path.realpath(d.state_dir / "sandboxes")).parent
    return _RUN_DIRS[key]


def _templates(d: Daemon) -> list[str]:
    """The saved templates (bare and with their root), not the pool's dirs."""
    t = _run_dir(d) / "microvm-templates"
    return (
        sorted(p.name for p in t.iterdir() if not p.name.startswith("pool-"))
        if t.is_dir()
        else []
    )


def _pool_qemus(d: Daemon) -> set[int]:
    """This daemon's pool VMs' QEMUs (-name warren-pool:<its disk dir>/pool-<k>)."""
    return qemu_pids(f"warren-pool:{d.state_dir}/microvm-disks/")


def _template_qemus(d: Daemon) -> set[int]:
    """This daemon's template QEMUs (-name warren-template:<template dir>)."""
    return qemu_pids(f"warren-template:{_run_dir(d)}/microvm-templates/")


def _pool_leftovers(d: Daemon) -> list[str]:
    """What pool VMs hold: QEMUs, cgroups pool-<h>-<k>, disks pool-*.img."""
    left = [f"qemu pid {p}" for p in _pool_qemus(d)]
    left += [str(p) for p in (d.state_dir / "microvm-disks").glob("pool-*")]
    for cg in cgroup_dirs().values():
        left += [str(p) for p in (cg / "warren-microvm").glob(microvm_pool_cgroup_prefix(d) + "*")]
    return left


def _wait_pool(d: Daemon, ready: int, timeout: float = 120) -> None:
    """Until the log says `ready` pool clones were made in all."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if d.log_tail(2000).count("microvm pool clone ready") >= ready:
            return
        time.sleep(0.2)
    raise AssertionError("the pool did not fill: " + d.log_tail(60))


def _layer_files(sandbox_id: str, layer_store: Path) -> list[Path]:
    """The layer files the sandbox's QEMU has open (from its cgroup)."""
    out: set[Path] = set()
    store = Path(os.path.realpath(layer_store))
    for cg in cgroup_dirs().values():
        procs = cg / "warren-microvm" / sandbox_id / "cgroup.procs"
        if not procs.exists():
            continue
        for pid in procs.read_text().split():
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    target = Path(os.readlink(fd))
                except OSError:
                    continue
                if str(target).startswith(str(store) + "/"):
                    out.add(target)
    return sorted(out)


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
    _run_dir(d)
    yield d
    d.stop()
    # A clean shutdown removes the templates (their RAM memfd is gone too)
    # and the pool's VMs.
    assert not (_run_dir(d) / "microvm-templates").exists()
    assert not _template_qemus(d)
    assert _pool_leftovers(d) == []


def test_five_clones_have_the_hosts_clock_and_their_own_rng_and_identity(
    warm: Daemon, base_layer: str
) -> None:
    boot_ids, randoms = set(), set()
    for i in range(5):
        if i >= 2:
            # Clones that waited in the pool (the first create made the
            # templates, the second restored a clone or took one from the
            # pool; from here on the pool is full, its clones aged).
            _wait_pool(warm, i)
            time.sleep(1.5)
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
                # The bare template and the one with this layer's root.
                names = _templates(warm)
                assert (
                    len(names) == 2 and names[1] == names[0] + names[1][len(names[0]) :]
                ), names
                assert names[1][len(names[0]) :].startswith("-r"), names
        finally:
            sb.destroy(timeout=60)
        assert _vm_leftovers(warm, sb.id) == []
    assert len(boot_ids) == 5, boot_ids
    assert len(randoms) == 5, randoms
    log = warm.log_tail(400)
    # One template of each kind for all five, no cold boot among them, the
    # last ones from the pool.
    assert log.count("microvm template saved") == 1, log
    assert log.count("microvm root template saved") == 1, log
    assert log.count("clone=pool") >= 3, log
    assert "booting cold" not in log and "creates boot cold" not in log, log
    assert "pool: starting a clone failed" not in log, log
    assert "clone of a root template failed" not in log, log
    assert "pool clone failed" not in log, log
    # The template's QEMU is gone once it is saved.
    assert not _template_qemus(warm)


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
    # A file where the templates' dir goes: the build cannot start. Removed
    # however the test ends (the daemon's run dir, and the run root's tmpfs
    # with it, go only when empty).
    blocker = _run_dir(d) / "microvm-templates"
    try:
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
        assert not _template_qemus(d)
    finally:
        blocker.unlink(missing_ok=True)
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


def test_templates_are_rebuilt_when_a_layer_or_the_guest_changes(
    test_root: Path, layer_store: Path, base_layer: str
) -> None:
    # The guest files in a dir of this test's own: the initramfs changes.
    guest = test_root / "mvm-guest-copy"
    guest.mkdir()
    for f in ("vmlinux", "vmlinuz", "initramfs.cpio", "kernel.release"):
        if (GUEST / f).exists():
            shutil.copy2(GUEST / f, guest / f)
    d = Daemon(
        test_root,
        "mvm-warm-rebuild",
        layer_store,
        f"{NODE_PREFIX}r",
        extra_args=[
            "--microvm-dir",
            str(guest),
            "--warm-shells",
            "0",
            "--microvm-pool",
            "0",
        ],
    ).start()

    def create_and_check() -> list[Path]:
        """A VM that answers as itself; the layer files its QEMU had open."""
        sb = d.client.create(
            backend="microvm",
            layers=[base_layer],
            memory_mb=256,
            timeout=CREATE_TIMEOUT,
        )
        try:
            r = sb.exec("cat /etc/debian_version; hostname", timeout=60)
            assert r.exit_code == 0 and r.stdout.split(b"\n")[1] == sb.id.encode(), r
            return _layer_files(sb.id, layer_store)
        finally:
            sb.destroy(timeout=60)

    try:
        files = create_and_check()
        assert files, "the VM's QEMU had no layer file open"
        log = d.log_tail(400)
        assert log.count("microvm template saved") == 1, log
        assert log.count("microvm root template saved") == 1, log
        # Unchanged inputs: the templates are reused.
        create_and_check()
        log = d.log_tail(400)
        assert log.count("microvm root template saved") == 1, log
        assert "clone=root" in log, log

        # A layer file replaced under its path (here: its mtime): the
        # template with its root is rebuilt, the bare one is not.
        st = files[0].stat()
        os.utime(files[0], ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        create_and_check()
        log = d.log_tail(400)
        assert (
            "microvm root template out of date (a layer changed); rebuilding" in log
        ), log
        assert log.count("microvm root template saved") == 2, log
        assert log.count("microvm template saved") == 1, log

        # The guest changed (the initramfs: trailing zeros the kernel skips):
        # both are rebuilt, the old ones removed.
        before = set(_templates(d))
        with open(guest / "initramfs.cpio", "ab") as f:
            f.write(b"\0" * 512)
        create_and_check()
        log = d.log_tail(400)
        assert log.count("microvm template saved") == 2, log
        assert log.count("microvm root template saved") == 3, log
        after = set(_templates(d))
        assert len(after) == 2 and not (after & before), (before, after)
        assert "booting cold" not in log and "creates boot cold" not in log, log
    finally:
        d.stop()
    assert not _template_qemus(d)


def test_pool_vms_left_by_a_kill9_are_removed_at_restart(
    test_root: Path, layer_store: Path, base_layer: str
) -> None:
    d = Daemon(
        test_root,
        "mvm-warm-pool-kill",
        layer_store,
        f"{NODE_PREFIX}p",
        extra_args=[
            "--microvm-dir",
            str(GUEST),
            "--warm-shells",
            "0",
            "--microvm-pool",
            "1",
        ],
    ).start()
    try:
        sb = d.client.create(
            backend="microvm",
            layers=[base_layer],
            memory_mb=256,
            timeout=CREATE_TIMEOUT,
        )
        _wait_pool(d, 1)
        pids = _pool_qemus(d)
        assert len(pids) == 1, pids
        # Another daemon started in the same cgroup (the tests', or a host
        # running several nodes) sweeps only its own pool cgroups: this
        # daemon's pool VM lives on (with cgroups named pool-<k> alike, the
        # neighbour's start killed it, and two fillers shared one cgroup).
        n = Daemon(
            test_root,
            "mvm-warm-pool-neighbour",
            layer_store,
            f"{NODE_PREFIX}q",
            extra_args=["--microvm-dir", str(GUEST), "--warm-shells", "0"],
        ).start()
        try:
            assert all(running(p) for p in pids), "a neighbour's start killed the pool VM"
        finally:
            n.stop()
        assert all(running(p) for p in pids), "a neighbour's stop killed the pool VM"
        d.kill9()
        assert all(running(p) for p in pids), "the pool QEMU outlived the daemon"
        d.start()
        # The sandbox is re-adopted; the pool VM is not a sandbox: killed,
        # its cgroup and disk removed (a new pool clone comes only with the
        # next create of a root template).
        for _ in range(100):
            if not any(running(p) for p in pids):
                break
            time.sleep(0.05)
        assert not any(running(p) for p in pids)
        assert _pool_leftovers(d) == []
        assert "removing a microvm pool VM left by an earlier daemon" in d.log_tail(200)
        sb = d.client.get(sb.id)  # the old handle's client closed with the daemon
        assert sb.exec("echo ok", timeout=60).stdout == b"ok\n"
        sb.destroy(timeout=60)
        # After the restart the pool fills again once a create used the
        # template; a pool clone taken by a create is the sandbox's: its
        # destroy leaves nothing, neither does the daemon's end.
        sb1 = d.client.create(
            backend="microvm",
            layers=[base_layer],
            memory_mb=256,
            timeout=CREATE_TIMEOUT,
        )
        sb1.destroy(timeout=60)
        _wait_pool(d, 2)  # the log is appended to across the restart
        sb2 = d.client.create(
            backend="microvm",
            layers=[base_layer],
            memory_mb=256,
            timeout=CREATE_TIMEOUT,
        )
        assert "clone=pool" in d.log_tail(50), d.log_tail(50)
        assert sb2.exec("hostname", timeout=60).stdout == sb2.id.encode() + b"\n"
        sb2.destroy(timeout=60)
        assert _vm_leftovers(d, sb2.id) == []
    finally:
        d.stop()
    assert _pool_leftovers(d) == []
