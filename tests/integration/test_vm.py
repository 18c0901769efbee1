"""The vm backend end to end (src/runtime/vm, src/runtime/desktop.h): a full
QEMU q35 VM booting Debian with systemd, Xorg, a window manager and xterm
(scripts/vm/build-guest.sh), driven through the SDK's computer-use API:
screenshots (QMP screendump, PNG) and keyboard/pointer input (QMP
input-send-event); QEMU's jail; failed creates; a `kill -9` of warrend.

Needs qemu-system-x86_64, qemu-img and the guest of scripts/vm/build-guest.sh
(/var/cache/warren/vm/{disk.img,vmlinuz,initrd.img}; scripts/setup.sh builds
it); skipped with the reason otherwise.

Bounded for CI: ONE VM boot (TCG, a full systemd boot and X on 2 shared
cores) serves every test of the module, on a daemon of this module (so that
it can be killed and restarted with the VM running); the failed creates cost
no boot. Tests that would cost more (a second boot) are opt-in:
WARREN_VM_FULL=1.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import warren
from conftest import (
    CLI,
    NODE_PREFIX,
    Daemon,
    cgroup_dirs,
    one_qemu,
    qemu_pids,
    running,
    vm_cgroups,
    wait_until,
)

QEMU = shutil.which("qemu-system-x86_64")
QEMU_IMG = shutil.which("qemu-img")
VM_DIR = Path(os.environ.get("WARREN_VM_DIR", "/var/cache/warren/vm"))
GUEST_FILES = ("disk.img", "vmlinuz", "initrd.img")
_missing = [str(VM_DIR / f) for f in GUEST_FILES if not (VM_DIR / f).exists()]
if QEMU is None:
    _missing.insert(0, "qemu-system-x86_64 (apt-get install qemu-system-x86)")
if QEMU_IMG is None:
    _missing.insert(0, "qemu-img (apt-get install qemu-utils)")
pytestmark = [
    pytest.mark.skipif(
        bool(_missing),
        reason="vm: missing "
        + ", ".join(_missing)
        + " (scripts/setup.sh builds the guest unless WARREN_SETUP_VM=0; "
        "or run scripts/vm/build-guest.sh)",
    ),
    pytest.mark.timeout(900),
]
FULL = os.environ.get("WARREN_VM_FULL") == "1"
full_only = pytest.mark.skipif(
    not FULL,
    reason="vm: costs a second VM boot under TCG (minutes on 2 cores); "
    "opt in with WARREN_VM_FULL=1",
)

BOOT_TIMEOUT = 600  # create: QEMU start to the agent's hello (systemd boot, TCG)
DESKTOP_TIMEOUT = 300  # the agent's hello to X and xterm up
PNG_SIG = b"\x89PNG\r\n\x1a\n"
UID_SLOTS = Path("/run/warren/uid-slots")
# QEMU's memory beyond the guest's (vm_backend.cc kVmOverheadMb: microvm's
# 128 MiB plus the display and the PCI/USB devices).
OVERHEAD_MB = 128 + 64


def _vm_cgroups_of(node_id: str) -> list[Path]:
    """Every VM cgroup of a daemon (its sandbox ids start with its node id)."""
    return [
        p
        for d in cgroup_dirs().values()
        if (d / "warren-vm").is_dir()
        for p in (d / "warren-vm").iterdir()
        if p.name.startswith(node_id + "-")
    ]


# The guest is slow: polled once a second unless a call says otherwise.
_wait = functools.partial(wait_until, step=1.0)


def _status(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        out[k] = v.strip()
    return out


def _stable_shot(sb: warren.Sandbox, timeout: float = 60) -> warren.desktop.ScreenImage:
    """A screenshot equal to the one taken 1 s before it (nothing drawing)."""
    prev = sb.screenshot(timeout=30)
    deadline = time.monotonic() + timeout
    while True:
        time.sleep(1)
        cur = sb.screenshot(timeout=30)
        if cur.png == prev.png:
            return cur
        if time.monotonic() > deadline:
            pytest.fail(f"the screen kept changing for {timeout} s")
        prev = cur


@pytest.fixture(scope="module")
def vmd(test_root: Path, layer_store: Path):
    """This module's daemon: the VM's, killed and restarted by a test."""
    d = Daemon(
        test_root,
        "vm",
        layer_store,
        f"{NODE_PREFIX}dv",
        extra_args=["--vm-dir", str(VM_DIR), "--warm-shells", "0"],
    ).start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def vm(vmd: Daemon, base_layer: str):
    """The module's one VM (booted once; later tests re-attach by id)."""
    t0 = time.monotonic()
    assert vmd.client is not None
    sb = vmd.client.create(
        backend="vm", layers=[base_layer], memory_mb=1024, timeout=BOOT_TIMEOUT
    )
    r = sb.exec("cat /proc/1/comm", timeout=60)
    print(
        f"\nvm: create to first exec {time.monotonic() - t0:.1f} s (TCG, systemd boot)"
    )
    assert r.stdout == b"systemd\n", r
    yield sb
    if vmd.client is not None:
        try:
            vmd.client.get(sb.id).destroy(timeout=60)
        except warren.NotFound:
            pass


@pytest.fixture(scope="module")
def desktop(vm: warren.Sandbox) -> warren.Sandbox:
    """The VM with X and xterm up and the screen settled."""
    t0 = time.monotonic()

    def up() -> bool:
        r = vm.exec(
            "test -S /tmp/.X11-unix/X0 && grep -qx xterm /proc/[0-9]*/comm", timeout=30
        )
        return r.exit_code == 0

    _wait(up, DESKTOP_TIMEOUT, "X and xterm up in the guest", step=2)
    # xterm's process runs before its window is mapped and focused and its
    # shell reads: keys typed before then are lost. Typing a command until
    # it runs tells when the desktop takes input.
    deadline = time.monotonic() + DESKTOP_TIMEOUT
    while True:
        vm.input.type("touch /tmp/ready\n")
        try:
            _wait(
                lambda: vm.exec("test -e /tmp/ready", timeout=30).exit_code == 0,
                15,
                "ready",
                step=1,
            )
            break
        except pytest.fail.Exception:
            if time.monotonic() > deadline:
                raise
    vm.input.key("ctrl+l")
    _stable_shot(vm, timeout=120)
    print(f"\nvm: first exec to a settled desktop {time.monotonic() - t0:.1f} s")
    return vm


def test_node_status_lists_vm(vmd: Daemon) -> None:
    assert vmd.client is not None
    assert "vm" in vmd.client.status().backends


def test_qemu_runs_jailed(vm: warren.Sandbox, vmd: Daemon) -> None:
    """As a microVM's QEMU: its own uid (no groups, no capabilities),
    seccomp, stdin /dev/null, every host file an open fd, its own cgroup
    with the guest's memory plus QEMU's overhead."""
    qemu = one_qemu(vm.id)
    st = _status(qemu)
    ruid, euid, suid, fsuid = (int(x) for x in st["Uid"].split())
    assert ruid == euid == suid == fsuid and ruid >= 1_000_000, st["Uid"]
    assert [int(x) for x in st["Gid"].split()] == [ruid] * 4, st["Gid"]
    assert st["Groups"] == ""
    assert int(st["CapEff"], 16) == 0 and int(st["CapPrm"], 16) == 0, st
    assert st["Seccomp"] == "2" and st["NoNewPrivs"] == "1", st
    assert os.readlink(f"/proc/{qemu}/fd/0") == "/dev/null"
    # The uid's claim names this daemon's vm disk dir (a host-wide slot,
    # the microvm backend's pool).
    assert (UID_SLOTS / str(ruid)).read_text().strip() == str(
        vmd.state_dir / "vm-disks"
    )
    # No host path of the guest, the disk or the run dir on its command
    # line: it could not open them as its uid. They are open fds.
    cmdline = Path(f"/proc/{qemu}/cmdline").read_bytes().split(b"\0")
    assert b"-sandbox" in cmdline
    text = b" ".join(cmdline)
    for path in (str(VM_DIR), str(vmd.state_dir), "/run/warren"):
        assert path.encode() not in text, (path, text)
    fds = {os.readlink(f"/proc/{qemu}/fd/{n}") for n in os.listdir(f"/proc/{qemu}/fd")}
    disk = vmd.state_dir / "vm-disks" / f"{vm.id}.qcow2"
    assert str(disk) in fds and str(VM_DIR / "disk.img") in fds, fds
    # QEMU itself cannot reach the disk by path (0700 dir, another uid).
    assert (os.stat(disk.parent).st_mode & 0o077) == 0
    # Its own cgroup under the daemon's, memory = 1024 MiB + overhead.
    cgs = vm_cgroups(vm.id, "warren-vm")
    assert cgs, "the VM runs in its own cgroup"
    limits = []
    for cg in cgs:
        if (cg / "cgroup.procs").exists():
            assert str(qemu) in (cg / "cgroup.procs").read_text().split()
        for f in ("memory.max", "memory.limit_in_bytes"):
            if (cg / f).exists():
                limits.append(int((cg / f).read_text()))
    assert limits == [(1024 + OVERHEAD_MB) << 20], limits


def test_exec_in_the_guest(vm: warren.Sandbox) -> None:
    r = vm.exec(["sh", "-c", "uname -r; printf 'a\\0b' >&2; exit 3"], timeout=60)
    assert r.exit_code == 3
    assert r.stdout.decode().strip().endswith("-amd64")
    assert r.stderr == b"a\0b"
    # systemd runs the agent as a service (not PID 1 as in a microvm).
    r = vm.exec("systemctl is-active warren-agent warren-desktop", timeout=60)
    assert r.stdout.split() == [b"active", b"active"], r


def test_screenshot_is_a_png_of_the_screen(desktop: warren.Sandbox) -> None:
    shot = desktop.screenshot(timeout=30)
    assert shot.png.startswith(PNG_SIG)
    assert (shot.width, shot.height) == (1024, 768)
    assert desktop.screen_size() == (1024, 768)
    t0 = time.monotonic()
    n = 5
    for _ in range(n):
        desktop.screenshot(timeout=30)
    print(
        f"\nvm: screenshot round trip {(time.monotonic() - t0) / n * 1000:.0f} ms (mean of {n})"
    )


def test_typing_reaches_the_app_and_changes_the_screen(desktop: warren.Sandbox) -> None:
    """Keys go through QEMU's PS/2 keyboard to X to xterm's shell: the shell
    writes the typed line to a file, and the screen shows it."""
    desktop.exec("rm -f /tmp/typed", timeout=30)
    before = _stable_shot(desktop)
    desktop.input.type("echo Typed-By-Warren > /tmp/typed\n")

    def typed() -> bool:
        r = desktop.exec("cat /tmp/typed", timeout=30)
        return r.exit_code == 0 and r.stdout == b"Typed-By-Warren\n"

    _wait(typed, 60, "the typed command's file in the guest")
    after = _stable_shot(desktop)
    assert after.png != before.png, "typing into xterm changed no pixel"
    # A combination: ctrl+u clears the typed line.
    desktop.input.type("echo not-run")
    desktop.input.key("ctrl+u")
    desktop.input.type("echo $((6*7)) > /tmp/typed2")
    desktop.input.key("Return")

    def typed2() -> bool:
        r = desktop.exec("cat /tmp/typed2", timeout=30)
        return r.exit_code == 0 and r.stdout == b"42\n"

    _wait(typed2, 60, "ctrl+u then a typed line with shifted characters")


def test_pointer_reaches_the_guest(desktop: warren.Sandbox) -> None:
    """The USB tablet is an input device of the guest; pointer events are
    taken (test_clicks_reach_the_app shows they reach the app)."""
    devices = desktop.exec("cat /proc/bus/input/devices", timeout=30).stdout
    assert b"QEMU QEMU USB Tablet" in devices
    desktop.input.mouse(10, 10)
    desktop.input.mouse(700, 500)
    desktop.input.scroll(0, 2)


@pytest.mark.xfail(
    reason="the pointer does not show in QEMU's screendump here (seen 2026-12-02: "
    "moving it changes no pixel; X's cursor is not drawn into the framebuffer "
    "QEMU dumps); not investigated yet",
    strict=False,
)
def test_pointer_moves_on_screen(desktop: warren.Sandbox) -> None:
    desktop.input.mouse(10, 10)
    a = _stable_shot(desktop)
    desktop.input.mouse(700, 500)
    b = _stable_shot(desktop)
    assert a.png != b.png, "moving the pointer changed no pixel"
    desktop.input.mouse(10, 10)
    c = _stable_shot(desktop)
    assert c.png == a.png, "the pointer back at (10, 10) shows the first screen again"


def test_clicks_reach_the_app(desktop: warren.Sandbox) -> None:
    """A left-button drag selects a word xterm shows, a middle click pastes
    it into the shell's line: the command that runs writes it to a file.
    Keyboard and pointer are two devices with their own queues, so each step
    waits for the screen to settle before the next (as an agent would look
    before it acts)."""
    desktop.exec("rm -f /tmp/clicked", timeout=30)
    desktop.input.key("ctrl+l")
    _stable_shot(desktop)
    # Row 1 (y 20..39, 10x20 font) shows it; cells 0..11 hold "clicked_word".
    desktop.input.type("echo clicked_word_and_more\n")
    _stable_shot(desktop)
    desktop.input.mouse(1, 30, button="left", action="down")
    _stable_shot(desktop)
    desktop.input.mouse(125, 30)  # into cell 12: the selection ends before it
    _stable_shot(desktop)
    desktop.input.mouse(125, 30, button="left", action="up")
    _stable_shot(desktop)
    desktop.input.type("echo ")
    _stable_shot(desktop)
    desktop.input.mouse(500, 400, button="middle", action="click")
    _stable_shot(desktop)
    desktop.input.type(" > /tmp/clicked\n")

    def pasted() -> bool:
        r = desktop.exec("cat /tmp/clicked", timeout=30)
        return r.exit_code == 0 and r.stdout == b"clicked_word\n"

    _wait(pasted, 60, "the word selected and pasted with the pointer")


def test_cli_screenshot_and_input(
    desktop: warren.Sandbox, vmd: Daemon, tmp_path: Path
) -> None:
    def warren_cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(CLI), "--addr", f"unix:{vmd.socket}", *args],
            capture_output=True,
            timeout=120,
            check=False,
        )

    desktop.exec("rm -f /tmp/cli-typed", timeout=30)
    out = tmp_path / "screen.png"
    p = warren_cli("screenshot", desktop.id, "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert out.read_bytes().startswith(PNG_SIG)
    assert p.stdout.decode().split() == [str(out), "1024x768"]
    assert (
        warren_cli(
            "input", desktop.id, "type", "echo via-cli > /tmp/cli-typed"
        ).returncode
        == 0
    )
    assert warren_cli("input", desktop.id, "key", "Return").returncode == 0
    _wait(
        lambda: desktop.exec("cat /tmp/cli-typed", timeout=30).stdout == b"via-cli\n",
        60,
        "the CLI's typing",
    )
    assert warren_cli("input", desktop.id, "mouse", "20", "20").returncode == 0
    p = warren_cli("input", desktop.id, "mouse", "5000", "20")
    assert p.returncode == 1 and b"outside the 1024x768 screen" in p.stderr, p.stderr
    p = warren_cli("input", desktop.id, "key", "ctrl+hyper")
    assert p.returncode == 1 and b"INVALID_ARGUMENT" in p.stderr, p.stderr


def test_bad_input_is_refused_with_the_reason(desktop: warren.Sandbox) -> None:
    with pytest.raises(warren.InvalidArgument, match='unknown key "hyper"'):
        desktop.input.key("ctrl+hyper")
    with pytest.raises(warren.InvalidArgument, match="outside the 1024x768 screen"):
        desktop.input.mouse(1024, 10)
    with pytest.raises(warren.InvalidArgument, match="need a button"):
        desktop.input.mouse(10, 10, action="click")
    with pytest.raises(warren.InvalidArgument, match="not printable ASCII"):
        desktop.input.type("caf\u00e9")
    with pytest.raises(warren.InvalidArgument, match="at most 100"):
        desktop.input.scroll(0, 1000)
    with pytest.raises(ValueError):
        desktop.input.mouse(1, 1, button="fourth", action="click")
    # Refused input reached nothing: the guest still takes keys.
    desktop.exec("rm -f /tmp/after-bad", timeout=30)
    desktop.input.type("touch /tmp/after-bad\n")
    _wait(
        lambda: desktop.exec("test -e /tmp/after-bad", timeout=30).exit_code == 0,
        60,
        "typing after refused input",
    )


def test_container_has_no_desktop(sandbox: warren.Sandbox) -> None:
    with pytest.raises(warren.Unimplemented, match="container backend"):
        sandbox.screenshot()
    with pytest.raises(warren.Unimplemented, match="backend=vm"):
        sandbox.input.key("a")


def test_kill9_of_warrend_then_restart_adopts_the_vm(
    desktop: warren.Sandbox, vmd: Daemon
) -> None:
    """README: sandboxes outlive the daemon and a restarted warrend re-adopts
    them. The same QEMU (pid, uid, boot) comes back under the new daemon,
    with exec, screenshots and input; no second QEMU, no orphan."""
    sid = desktop.id
    qemu = one_qemu(sid)
    uid = _status(qemu)["Uid"]
    boot_id = desktop.exec("cat /proc/sys/kernel/random/boot_id", timeout=60).stdout
    vmd.kill9()
    assert running(qemu), "QEMU runs on without its daemon (its own session)"
    vmd.start()
    assert vmd.client is not None
    sb = vmd.client.get(sid)
    assert sb.info().state == "running"
    assert one_qemu(sid) == qemu and _status(qemu)["Uid"] == uid
    r = sb.exec("cat /proc/sys/kernel/random/boot_id", timeout=60)
    assert r.exit_code == 0 and r.stdout == boot_id, r
    shot = sb.screenshot(timeout=30)
    assert shot.png.startswith(PNG_SIG) and (shot.width, shot.height) == (1024, 768)
    sb.exec("rm -f /tmp/adopted", timeout=30)
    sb.input.type("touch /tmp/adopted\n")
    _wait(
        lambda: sb.exec("test -e /tmp/adopted", timeout=30).exit_code == 0,
        60,
        "typing into the adopted VM",
    )
    # The uid is claimed again in this daemon's name.
    ruid = uid.split()[0]
    assert (UID_SLOTS / ruid).read_text().strip() == str(vmd.state_dir / "vm-disks")


def test_destroy_leaves_no_process_disk_socket_or_cgroup(
    vm: warren.Sandbox, vmd: Daemon
) -> None:
    assert vmd.client is not None
    sb = vmd.client.get(vm.id)  # (the daemon may have restarted since the create)
    pids = qemu_pids(sb.id)
    assert len(pids) == 1
    ruid = _status(next(iter(pids)))["Uid"].split()[0]
    disk = vmd.state_dir / "vm-disks" / f"{sb.id}.qcow2"
    assert disk.exists()
    run = (vmd.state_dir / "run" / sb.id).resolve()
    assert (run / "qmp.sock").exists() and (run / "agent.sock").exists()
    assert vm_cgroups(sb.id, "warren-vm"), "the VM runs in its own cgroup"
    sb.destroy(timeout=60)
    assert not any(running(p) for p in pids)
    assert not disk.exists()
    assert not run.exists()
    assert vm_cgroups(sb.id, "warren-vm") == []
    assert not qemu_pids(sb.id)
    assert not list(vmd.state_dir.rglob(f"*{sb.id}*"))
    # Its uid is free again (the claim emptied).
    assert (UID_SLOTS / ruid).read_text() == ""
    with pytest.raises(warren.NotFound):
        sb.screenshot()


# ------------------------------------------------------------ failed creates


@pytest.fixture(scope="module")
def broken(test_root: Path, layer_store: Path, tmp_path_factory):
    """A daemon whose guest never answers in time (a 3 s boot timeout) and
    whose guest files can be taken away after it started (its --vm-dir
    holds links to the real ones)."""
    guest = tmp_path_factory.mktemp("vm-guest")
    for f in GUEST_FILES:
        (guest / f).symlink_to(VM_DIR / f)
    d = Daemon(
        test_root,
        "vm-broken",
        layer_store,
        f"{NODE_PREFIX}dx",
        extra_args=[
            "--vm-dir",
            str(guest),
            "--vm-boot-timeout-ms",
            "3000",
            "--warm-shells",
            "0",
        ],
    ).start()
    d.guest = guest  # type: ignore[attr-defined]
    yield d
    d.stop()


def _nothing_left(d: Daemon) -> None:
    """No QEMU, disk, cgroup, socket, runtime dir or record of any sandbox
    of daemon `d` (all its creates failed)."""
    assert d.client is not None
    node = d.node_id
    assert not [p for p in qemu_pids(node + "-") if running(p)]
    disks = d.state_dir / "vm-disks"
    assert not disks.exists() or list(disks.iterdir()) == []
    assert _vm_cgroups_of(node) == []
    assert list((d.state_dir / "run").iterdir()) == []
    assert list((d.state_dir / "sandboxes").iterdir()) == []
    assert d.client.list(timeout=30) == []


def test_create_with_an_impossible_memory_size_is_refused(
    broken: Daemon, base_layer: str
) -> None:
    assert broken.client is not None
    with pytest.raises(
        warren.InvalidArgument, match=r"memory_mb=100 is below the 384 MiB"
    ):
        broken.client.create(
            backend="vm", layers=[base_layer], memory_mb=100, timeout=60
        )
    with pytest.raises(warren.InvalidArgument, match="memory_mb"):
        broken.client.create(
            backend="vm", layers=[base_layer], memory_mb=10_000_000, timeout=60
        )
    _nothing_left(broken)


def test_a_guest_that_never_answers_fails_create_and_leaves_nothing(
    broken: Daemon, base_layer: str
) -> None:
    """The boot timeout (3 s here: the guest cannot boot that fast under TCG
    or KVM) fails the create after QEMU, its disk, cgroup, uid and sockets
    were all made: every one is undone."""
    assert broken.client is not None
    t0 = time.monotonic()
    with pytest.raises(warren.DeadlineExceeded, match=r"boot timeout 3000 ms") as e:
        broken.client.create(
            backend="vm", layers=[base_layer], memory_mb=512, timeout=120
        )
    took = time.monotonic() - t0
    assert took < 60, took
    m = re.search(re.escape(broken.node_id) + r"-[0-9a-f]+", str(e.value))
    assert m, f"the error names the sandbox: {e.value}"
    assert not qemu_pids(m.group(0))
    _nothing_left(broken)
    # The uid slot it took is free again: no claim names this daemon.
    owner = str(broken.state_dir / "vm-disks")
    assert not [p.name for p in UID_SLOTS.iterdir() if p.read_text().strip() == owner]


def test_a_missing_guest_file_fails_create_naming_it(
    broken: Daemon, base_layer: str
) -> None:
    assert broken.client is not None
    guest: Path = broken.guest  # type: ignore[attr-defined]
    (guest / "initrd.img").unlink()
    try:
        with pytest.raises(
            warren.FailedPrecondition,
            match=r"guest initrd\.img \(scripts/vm/build-guest\.sh\) \S*/initrd\.img: No such file",
        ):
            broken.client.create(
                backend="vm", layers=[base_layer], memory_mb=512, timeout=60
            )
    finally:
        (guest / "initrd.img").symlink_to(VM_DIR / "initrd.img")
    _nothing_left(broken)


@full_only
def test_a_second_vm_boots_beside_the_first(vmd: Daemon, base_layer: str) -> None:
    """Two VMs at once get two uids and two cgroups (a second boot: opt-in)."""
    assert vmd.client is not None
    with (
        vmd.client.create(
            backend="vm", layers=[base_layer], memory_mb=768, timeout=BOOT_TIMEOUT
        ) as a,
        vmd.client.create(
            backend="vm", layers=[base_layer], memory_mb=768, timeout=BOOT_TIMEOUT
        ) as b,
    ):
        ua = _status(one_qemu(a.id))["Uid"].split()[0]
        ub = _status(one_qemu(b.id))["Uid"].split()[0]
        assert ua != ub
        assert a.exec("true", timeout=60).exit_code == 0
        assert b.exec("true", timeout=60).exit_code == 0
