"""The vm backend end to end (src/runtime/vm, src/runtime/desktop.h): a full
QEMU q35 VM booting Debian with systemd, Xorg, a window manager and xterm
(scripts/vm/build-guest.sh), driven through the SDK's computer-use API:
screenshots (QMP screendump, PNG) and keyboard/pointer input (QMP
input-send-event).

Needs qemu-system-x86_64, qemu-img and the guest of scripts/vm/build-guest.sh
(/var/cache/warren/vm/{disk.img,vmlinuz,initrd.img}); skipped with the
reason otherwise. One VM for the module: a full systemd boot under TCG on
this 2-core machine takes minutes, so every wait is long but bounded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import warren
from conftest import CLI, Daemon, cgroup_dirs, qemu_pids, running

QEMU = shutil.which("qemu-system-x86_64")
QEMU_IMG = shutil.which("qemu-img")
VM_DIR = Path(os.environ.get("WARREN_VM_DIR", "/var/cache/warren/vm"))
_missing = [
    str(VM_DIR / f)
    for f in ("disk.img", "vmlinuz", "initrd.img")
    if not (VM_DIR / f).exists()
]
if QEMU is None:
    _missing.insert(0, "qemu-system-x86_64 (apt-get install qemu-system-x86)")
if QEMU_IMG is None:
    _missing.insert(0, "qemu-img (apt-get install qemu-utils)")
pytestmark = [
    pytest.mark.skipif(
        bool(_missing),
        reason="vm: missing "
        + ", ".join(_missing)
        + " (run scripts/vm/build-guest.sh)",
    ),
    pytest.mark.timeout(900),
]

BOOT_TIMEOUT = 600  # create: QEMU start to the agent's hello (systemd boot, TCG)
DESKTOP_TIMEOUT = 300  # the agent's hello to X and xterm up
PNG_SIG = b"\x89PNG\r\n\x1a\n"


def _vm_cgroups(sandbox_id: str) -> list[Path]:
    return [
        p
        for d in cgroup_dirs().values()
        if (p := d / "warren-vm" / sandbox_id).exists()
    ]


def _wait(pred, timeout: float, what: str, step: float = 1.0):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s")
        time.sleep(step)


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
def vm(client: warren.Client, base_layer: str):
    t0 = time.monotonic()
    sb = client.create(
        backend="vm", layers=[base_layer], memory_mb=1024, timeout=BOOT_TIMEOUT
    )
    r = sb.exec("cat /proc/1/comm", timeout=60)
    boot_s = time.monotonic() - t0
    print(f"\nvm: create to first exec {boot_s:.1f} s (TCG, systemd boot)")
    assert r.stdout == b"systemd\n", r
    yield sb
    try:
        sb.destroy(timeout=60)
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


def test_node_status_lists_vm(client: warren.Client) -> None:
    assert "vm" in client.status().backends


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
    # A combination: ctrl+u clears the typed line, ctrl+l the screen.
    desktop.input.type("echo not-run")
    desktop.input.key("ctrl+u")
    desktop.input.type("echo $((6*7)) > /tmp/typed2")
    desktop.input.key("Return")

    def typed2() -> bool:
        r = desktop.exec("cat /tmp/typed2", timeout=30)
        return r.exit_code == 0 and r.stdout == b"42\n"

    _wait(typed2, 60, "ctrl+u then a typed line with shifted characters")


def test_pointer_reaches_the_guest_and_moves_on_screen(desktop: warren.Sandbox) -> None:
    """The USB tablet is an input device of the guest, and moving it moves
    X's (software-drawn) pointer: the screen changes."""
    devices = desktop.exec("cat /proc/bus/input/devices", timeout=30).stdout
    assert b"QEMU QEMU USB Tablet" in devices
    desktop.input.mouse(10, 10)
    a = _stable_shot(desktop)
    desktop.input.mouse(700, 500)
    b = _stable_shot(desktop)
    assert a.png != b.png, "moving the pointer changed no pixel"
    desktop.input.mouse(10, 10)
    c = _stable_shot(desktop)
    assert c.png == a.png, "the pointer back at (10, 10) shows the first screen again"
    desktop.input.scroll(0, 2)


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
    desktop: warren.Sandbox, daemon: Daemon, tmp_path: Path
) -> None:
    def warren_cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(CLI), "--addr", f"unix:{daemon.socket}", *args],
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


def test_container_has_no_desktop(sandbox: warren.Sandbox) -> None:
    with pytest.raises(warren.Unimplemented, match="container backend"):
        sandbox.screenshot()
    with pytest.raises(warren.Unimplemented, match="backend=vm"):
        sandbox.input.key("a")


def test_destroy_leaves_no_process_disk_socket_or_cgroup(
    vm: warren.Sandbox, daemon: Daemon
) -> None:
    pids = qemu_pids(vm.id)
    assert len(pids) == 1
    disk = daemon.state_dir / "vm-disks" / f"{vm.id}.qcow2"
    assert disk.exists()
    assert _vm_cgroups(vm.id), "the VM runs in its own cgroup"
    vm.destroy(timeout=60)
    assert not any(running(p) for p in pids)
    assert not disk.exists()
    assert _vm_cgroups(vm.id) == []
    assert not qemu_pids(vm.id)
    assert not list(daemon.state_dir.rglob(f"*{vm.id}*"))
    with pytest.raises(warren.NotFound):
        vm.screenshot()
