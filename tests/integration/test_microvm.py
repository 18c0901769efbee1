"""The microvm backend end to end (src/runtime/microvm, src/guest/agent):
a QEMU microVM booting Debian's cloud kernel into warren's guest agent,
created and used through the SDK like a container.

Needs qemu-system-x86_64 and the guest files of scripts/microvm/build-guest.sh
(/var/cache/warren/microvm/{vmlinuz,initramfs.cpio}); skipped with the reason
otherwise. VMs run under TCG here (2 cores): every test keeps at most 2 up.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path

import pytest
import warren
from conftest import NODE_PREFIX, Daemon, qemu_pids, running, vm_cgroups

QEMU = shutil.which("qemu-system-x86_64")
MICROVM_DIR = Path(os.environ.get("WARREN_MICROVM_DIR", "/var/cache/warren/microvm"))
_missing = [
    str(p)
    for p in (MICROVM_DIR / "vmlinuz", MICROVM_DIR / "initramfs.cpio")
    if not p.exists()
]
if QEMU is None:
    _missing.insert(0, "qemu-system-x86_64 (apt-get install qemu-system-x86)")
pytestmark = pytest.mark.skipif(
    bool(_missing),
    reason="microvm: missing "
    + ", ".join(_missing)
    + " (run scripts/setup.sh or scripts/microvm/build-guest.sh)",
)

# Generous: a cold boot under TCG takes seconds, more while other VMs boot.
CREATE_TIMEOUT = 180






@pytest.fixture(scope="module")
def vm(client: warren.Client, base_layer: str):
    sb = client.create(
        backend="microvm", layers=[base_layer], memory_mb=256, timeout=CREATE_TIMEOUT
    )
    yield sb
    sb.destroy(timeout=60)


def test_node_status_lists_microvm(client: warren.Client) -> None:
    assert "microvm" in client.status().backends


def test_node_status_reports_the_probed_accelerator(client: warren.Client, vm) -> None:
    """--microvm-accel=auto (the default): the KVM probe decides, once at
    start; Node.Status says which and why, and the VMs run on it."""
    st = client.status()
    assert st.microvm_accel in ("kvm", "tcg")
    assert st.microvm_accel_reason.startswith("KVM probe: ")
    if not os.path.exists("/dev/kvm") or os.path.exists("/sys/module/kvm_pvm"):
        # No /dev/kvm, or PVM's (which emulates stock guests): the probe says tcg.
        assert st.microvm_accel == "tcg", st.microvm_accel_reason
    pids = qemu_pids(vm.id)
    assert pids
    for pid in pids:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        accel = argv[argv.index(b"-accel") + 1].decode()
        assert accel.split(",")[0] == st.microvm_accel


def test_accel_flag_overrides_the_probe(test_root: Path, layer_store: Path) -> None:
    d = Daemon(
        test_root,
        "mvm-accel-tcg",
        layer_store,
        f"{NODE_PREFIX}t",
        extra_args=[
            "--microvm-dir",
            str(MICROVM_DIR),
            "--microvm-accel",
            "tcg",
            "--warm-shells",
            "0",
        ],
    ).start()
    try:
        st = d.client.status()
        assert st.microvm_accel == "tcg"
        assert "accel=tcg" in st.microvm_accel_reason
        assert "KVM probe" not in st.microvm_accel_reason
    finally:
        d.stop()


def test_exec_runs_on_the_guest_kernel(vm) -> None:
    r = vm.exec(["uname", "-r"], timeout=60)
    guest = (MICROVM_DIR / "kernel.release").read_text().strip()
    assert (r.exit_code, r.signal, r.timed_out) == (0, 0, False)
    assert r.stdout == (guest + "\n").encode()
    assert guest != os.uname().release
    # The layer is the root, the writable disk under it.
    r = vm.exec(
        "cat /etc/debian_version && echo hi > /root/f && cat /root/f && hostname",
        timeout=60,
    )
    assert r.exit_code == 0, r.stderr
    assert r.stdout.split(b"\n")[1:3] == [b"hi", vm.id.encode()]


def test_guest_processes_cannot_open_the_agent_channel(vm) -> None:
    # virtio-serial ports are exclusive-open and the agent holds its port:
    # root in the guest cannot read the host's requests or forge replies.
    r = vm.exec("grep -l warren.agent /sys/class/virtio-ports/*/name", timeout=60)
    assert r.exit_code == 0, r.stderr
    port = "/dev/" + r.stdout.decode().strip().split("/")[-2]
    r = vm.exec(["sh", "-c", 'echo x > "$0"', port], timeout=60)
    assert r.exit_code != 0 and b"busy" in r.stderr.lower(), r.stderr


def test_unprivileged_guest_processes_cannot_reach_the_agents_channel(vm) -> None:
    # Issue 12's "processes inside the guest cannot forge the agent's
    # replies": no per-boot key; the channel is the agent's alone. A
    # process without root in the guest can neither open the port (0600,
    # and exclusive-open while the agent holds it) nor reach the agent's
    # fd (PID 1's /proc/1/fd, ptrace and pidfd_getfd need root's
    # capabilities); the agent's fds are close-on-exec, so no command
    # inherits it. Root in the guest owns the guest kernel (README: Trust).
    r = vm.exec("grep -l warren.agent /sys/class/virtio-ports/*/name", timeout=60)
    port = "/dev/" + r.stdout.decode().strip().split("/")[-2]
    r = vm.exec(["sh", "-c", 'echo x > "$0"', port], user="nobody", timeout=60)
    assert r.exit_code != 0 and b"permission denied" in r.stderr.lower(), r.stderr
    r = vm.exec("ls /proc/1/fd", user="nobody", timeout=60)
    assert r.exit_code != 0 and b"permission denied" in r.stderr.lower(), r.stderr
    # What a command inherits: its stdio pipes only, never the port.
    r = vm.exec("ls -l /proc/self/fd/ | grep -c vport || true", timeout=60)
    assert r.stdout == b"0\n", r.stdout
    steal = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "pfd = os.pidfd_open(1)\n"
        "n = libc.syscall(438, pfd, 3, 0)\n"  # pidfd_getfd(PID 1, its fd 3)
        "print(n, ctypes.get_errno())"
    )
    r = vm.exec(["python3", "-c", steal], user="nobody", timeout=60)
    assert r.exit_code == 0, r.stderr
    fd, err = r.stdout.split()
    assert fd == b"-1" and int(err) == 1, r.stdout  # EPERM


def test_exec_is_byte_exact_with_exit_codes_signals_stdin_env_cwd(vm) -> None:
    blob = bytes(range(256)) * 3
    r = vm.exec(
        ["sh", "-c", "cat; printf 'e\\000rr' >&2; exit 7"], stdin=blob, timeout=60
    )
    assert (r.exit_code, r.signal) == (7, 0)
    assert r.stdout == blob
    assert r.stderr == b"e\x00rr"
    r = vm.exec("kill -TERM $$", timeout=60)
    assert (r.exit_code, r.signal) == (128 + 15, 15)
    r = vm.exec('echo "$A|$(pwd)"', env={"A": "x y"}, cwd="/tmp", timeout=60)
    assert r.stdout == b"x y|/tmp\n"
    r = vm.exec("id -u; id -g", user="nobody", timeout=60)
    assert r.stdout == b"65534\n65534\n"
    assert vm.exec("id -u", user="1234:5", timeout=60).stdout == b"1234\n"
    with pytest.raises(warren.NotFound, match="no-such-user"):
        vm.exec("true", user="no-such-user", timeout=60)
    r = vm.exec(["no-such-command-xyz"], timeout=60)
    assert r.exit_code == 127 and b"not found" in r.stderr
    with pytest.raises(warren.NotFound):
        vm.exec("true", cwd="/no/such/dir", timeout=60)
    r = vm.exec("head -c 100000 /dev/zero", output_cap=1000, timeout=60)
    assert (
        r.stdout == b"\0" * 1000
        and r.stdout_truncated
        and r.stdout_total_bytes == 100000
    )


def test_timeout_kills_the_whole_tree(vm) -> None:
    t0 = time.monotonic()
    r = vm.exec(
        "(setsid sh -c 'trap \"\" TERM; sleep 300' &); sh -c 'sleep 300' & sleep 300",
        timeout=2,
        kill_grace=0.5,
    )
    took = time.monotonic() - t0
    assert r.timed_out and r.signal == 15 and r.exit_code == 128 + 15
    assert took < 30
    # Nothing of the tree is left: not the setsid'ed child that ignores TERM.
    r = vm.exec("ps -eo comm= | grep -c '^sleep$' || true", timeout=60)
    assert r.stdout.strip() == b"0"


def test_guest_oom_kill_is_reported(vm) -> None:
    # One allocation touched at memset speed past the commands' memory limit
    # (the guest's 256 MiB of RAM less the agent's reserve): OOM-killed in
    # its cgroup. (A slow filler, `head -c 600M /dev/zero | tail -n 1`, can
    # keep its cgroup reclaiming its own file pages under TCG for about as
    # long as the exec's timeout before the OOM kill: 1 run in 4 here.)
    r = vm.exec("python3 -c \"x = b'a' * (600 << 20)\"", timeout=120)
    assert r.oom_killed and r.exit_code == 128 + 9, (r.exit_code, r.stderr)
    assert vm.exec("echo alive", timeout=60).stdout == b"alive\n"
    # The limit: RAM less max(24 MiB, RAM/8) in whole pages, on the cgroup every command runs under.
    total = int(vm.exec("awk '/MemTotal/ {print $2}' /proc/meminfo", timeout=60).stdout) * 1024
    limit = int(vm.exec("cat /sys/fs/cgroup/warren/memory.max", timeout=60).stdout)
    assert limit == (total - max(24 << 20, total // 8)) // 4096 * 4096, (limit, total)


def test_destroy_leaves_no_process_file_or_cgroup(
    client: warren.Client, daemon: Daemon, base_layer: str
) -> None:
    sb = client.create(
        backend="microvm", layers=[base_layer], memory_mb=192, timeout=CREATE_TIMEOUT
    )
    assert sb.exec("true", timeout=60).exit_code == 0
    pids = qemu_pids(sb.id)
    assert len(pids) == 1
    disk = daemon.state_dir / "microvm-disks" / f"{sb.id}.img"
    assert disk.exists()
    assert vm_cgroups(sb.id), "the VM runs in its own cgroup"
    cg_procs = {
        int(x)
        for c in vm_cgroups(sb.id)
        for x in (c / "cgroup.procs").read_text().split()
    }
    assert pids <= cg_procs
    sb.destroy(timeout=60)
    assert not any(running(p) for p in pids)
    assert not disk.exists()
    assert vm_cgroups(sb.id) == []
    assert not qemu_pids(sb.id)
    assert not list(daemon.state_dir.rglob(f"*{sb.id}*"))


def test_memory_below_the_kernel_minimum_is_refused(
    client: warren.Client, base_layer: str
) -> None:
    with pytest.raises(warren.InvalidArgument, match="below the 128 MiB"):
        client.create(backend="microvm", layers=[base_layer], memory_mb=64, timeout=60)
    # The minimum itself boots and runs (QEMU's overhead is charged beyond it).
    sb = client.create(
        backend="microvm", layers=[base_layer], memory_mb=128, timeout=CREATE_TIMEOUT
    )
    try:
        r = sb.exec("grep MemTotal /proc/meminfo", timeout=60)
        assert r.exit_code == 0 and int(r.stdout.split()[1]) <= 128 * 1024
    finally:
        sb.destroy(timeout=60)


def test_missing_kernel_is_a_clear_error(
    test_root: Path, layer_store: Path, base_layer: str
) -> None:
    vdir = test_root / "microvm-missing-kernel"
    vdir.mkdir(exist_ok=True)
    shutil.copy(MICROVM_DIR / "vmlinuz", vdir / "vmlinuz")
    shutil.copy(MICROVM_DIR / "initramfs.cpio", vdir / "initramfs.cpio")
    d = Daemon(
        test_root,
        "mvm-nokernel",
        layer_store,
        f"{NODE_PREFIX}k",
        extra_args=["--microvm-dir", str(vdir), "--warm-shells", "0"],
    ).start()
    try:
        assert "microvm" in d.client.status().backends
        (vdir / "vmlinuz").unlink()
        with pytest.raises(
            warren.WarrenError, match=r"guest kernel .*vmlinuz.*No such file"
        ):
            d.client.create(backend="microvm", layers=[base_layer], timeout=60)
        assert not qemu_pids(f"{NODE_PREFIX}k-")
        assert not list((d.state_dir / "microvm-disks").iterdir())
        d.stop()
        # Without the files the backend is not offered at all, and says so.
        d2 = Daemon(
            test_root,
            "mvm-nokernel2",
            layer_store,
            f"{NODE_PREFIX}l",
            extra_args=["--microvm-dir", str(vdir), "--warm-shells", "0"],
        ).start()
        try:
            assert "microvm" not in d2.client.status().backends
            with pytest.raises(warren.InvalidArgument, match="microvm"):
                d2.client.create(backend="microvm", layers=[base_layer], timeout=60)
            assert "microvm backend not offered" in d2.log_tail(200)
        finally:
            d2.stop()
    finally:
        d.stop()


def test_cold_create_to_first_exec(client: warren.Client, base_layer: str) -> None:
    """Cold create → first exec result, p50 of 3 (printed; bounded loosely
    here, the target lives in bench/)."""
    times = []
    for _ in range(3):
        t0 = time.monotonic()
        sb = client.create(
            backend="microvm",
            layers=[base_layer],
            memory_mb=256,
            timeout=CREATE_TIMEOUT,
        )
        try:
            assert sb.exec("true", timeout=60).exit_code == 0
            times.append((time.monotonic() - t0) * 1000)
        finally:
            sb.destroy(timeout=60)
    p50 = statistics.median(times)
    print(
        f"\nmicrovm cold create -> first exec: p50 {p50:.0f} ms ({', '.join(f'{t:.0f}' for t in times)} ms)"
    )
    assert p50 < 60000


def test_vm_survives_a_kill9_of_the_daemon_and_is_readopted(
    test_root: Path, layer_store: Path, base_layer: str
) -> None:
    d = Daemon(
        test_root,
        "mvm-restart",
        layer_store,
        f"{NODE_PREFIX}r",
        extra_args=["--warm-shells", "0"],
    ).start()
    try:
        sb = d.client.create(
            backend="microvm",
            layers=[base_layer],
            memory_mb=192,
            timeout=CREATE_TIMEOUT,
        )
        assert sb.exec("echo before > /root/mark", timeout=60).exit_code == 0
        boot_id = sb.exec("cat /proc/sys/kernel/random/boot_id", timeout=60).stdout
        pids = qemu_pids(sb.id)
        assert len(pids) == 1
        d.kill9()
        assert all(running(p) for p in pids), "QEMU outlives the daemon"
        d.start()
        again = d.client.get(sb.id)
        r = again.exec("cat /root/mark /proc/sys/kernel/random/boot_id", timeout=60)
        assert r.exit_code == 0, r.stderr
        assert r.stdout == b"before\n" + boot_id, "the same VM, not a new boot"
        again.destroy(timeout=60)
        assert not any(running(p) for p in pids)
        assert vm_cgroups(sb.id) == []
        # Nothing of it on disk either: disk image, sockets, logs, record.
        assert not list(d.state_dir.rglob(f"*{sb.id}*"))
    finally:
        d.stop()


def _busybox_initramfs(path: Path) -> None:
    """An initramfs whose /init never answers the host (it only sleeps)."""
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox (busybox-static) is needed to build a silent guest")
    stage = path.parent / "silent-stage"
    (stage / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy(busybox, stage / "bin" / "busybox")
    init = stage / "init"
    init.write_text("#!/bin/busybox sh\n/bin/busybox sleep 100000\n")
    init.chmod(0o755)
    files = "bin\nbin/busybox\ninit\n"
    with open(path, "wb") as out:
        subprocess.run(
            ["cpio", "--quiet", "-o", "-H", "newc"],
            input=files.encode(),
            cwd=stage,
            stdout=out,
            check=True,
        )


def test_a_guest_that_never_answers_fails_create_in_bounded_time(
    test_root: Path, layer_store: Path, base_layer: str
) -> None:
    vdir = test_root / "microvm-silent"
    vdir.mkdir(exist_ok=True)
    shutil.copy(MICROVM_DIR / "vmlinuz", vdir / "vmlinuz")
    _busybox_initramfs(vdir / "initramfs.cpio")
    d = Daemon(
        test_root,
        "mvm-silent",
        layer_store,
        f"{NODE_PREFIX}q",
        extra_args=[
            "--microvm-dir",
            str(vdir),
            "--microvm-boot-timeout-ms",
            "8000",
            "--warm-shells",
            "0",
        ],
    )
    d.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(warren.DeadlineExceeded, match="did not answer") as e:
            d.client.create(
                backend="microvm", layers=[base_layer], timeout=120, retries=0
            )
        assert time.monotonic() - t0 < 60
        assert "8000 ms" in str(e.value)
        assert not qemu_pids(f"{NODE_PREFIX}q-")
        assert not list((d.state_dir / "microvm-disks").iterdir())
        assert d.client.list(timeout=30) == []
    finally:
        d.stop()


def test_a_missing_layer_is_a_clear_error_and_leaves_nothing(
    client: warren.Client, daemon: Daemon, base_layer: str
) -> None:
    # A layer the node does not have.
    with pytest.raises(warren.NotFound, match="toolset/no-such"):
        client.create(backend="microvm", layers=[base_layer, "toolset/no-such@1"], timeout=60)
    # A layer the node has on record whose image file is gone.
    with client.create(layers=[base_layer]) as ct:
        assert ct.exec("echo x > /x", timeout=60).exit_code == 0
        snap = ct.snapshot(name="workspace/mvm-missing-blob@1")
    blob = daemon.layer_store / "blobs" / "sha256" / snap.layer.digest.split(":", 1)[1]
    assert blob.exists()
    aside = blob.with_name(blob.name + ".aside")
    blob.rename(aside)
    before = qemu_pids(NODE_PREFIX)
    try:
        with pytest.raises(warren.WarrenError, match=r"layers?\[1\]") as e:
            client.create(backend="microvm", layers=snap.layers, timeout=60)
        assert isinstance(e.value, (warren.NotFound, warren.FailedPrecondition)), e.value
        assert qemu_pids(NODE_PREFIX) <= before, "no QEMU of the failed create"
        disks = daemon.state_dir / "microvm-disks"
        live = {s.id for s in client.list(timeout=30)}
        left = list(disks.iterdir()) if disks.exists() else []
        # pool-*: the disks of the node's pool of restored clones (not
        # sandboxes; test_microvm_warm.py checks what they leave).
        assert [p for p in left if p.name.split(".")[0] not in live and not p.name.startswith("pool-")] == []
    finally:
        aside.rename(blob)
        client.layers.remove("workspace/mvm-missing-blob@1")
