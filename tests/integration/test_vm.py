"""The vm backend end to end (src/runtime/vm, src/runtime/desktop.h): a full
QEMU q35 VM booting Debian with systemd, Xorg, a window manager and xterm
(scripts/vm/build-guest.sh), driven through the SDK's computer-use API:
screenshots (QMP screendump, PNG) and keyboard/pointer input (QMP
input-send-event); QEMU's jail; failed creates; a `kill -9` of warrend.

Needs qemu-system-x86_64, qemu-img and the guest of scripts/vm/build-guest.sh
(/var/cache/warren/vm/{system.erofs,upper.img,vmlinuz,initrd.img}; scripts/setup.sh
builds it); skipped with the reason otherwise. The VM's root is the sandbox's
layers (the session's base layer and a workspace layer of this module) with
the guest's system layer stacked over the base, on a writable disk.

Bounded for CI: ONE VM boot (TCG, a full systemd boot and X on 2 shared
cores) serves every test of the module, on a daemon of this module (so that
it can be killed and restarted with the VM running); the failed creates cost
no boot. Tests that would cost more (a second boot) are opt-in:
WARREN_VM_FULL=1.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import subprocess
import threading
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
from test_microvm_network import serve_in
from test_network import (  # noqa: F401 (internet: the test internet, a module fixture)
    ALLOWED,
    DNS,
    METADATA,
    OTHER,
    PRESETS,
    TRANSIT_HOST,
    assert_clean,
    drop_table,
    http_from_host,
    http_get,
    internet,
    probe,
    resolve,
)
from desktop_helpers import (
    PNG_SIG,
    RECEIVED,
    SERVER,
    SERVER_PATH,
    field_box,
    has_colour,
    pixels,
    region,
    stable_shot,
)

QEMU = shutil.which("qemu-system-x86_64")
QEMU_IMG = shutil.which("qemu-img")
VM_DIR = Path(os.environ.get("WARREN_VM_DIR", "/var/cache/warren/vm"))
GUEST_FILES = ("system.erofs", "upper.img", "vmlinuz", "initrd.img")
_missing = [str(VM_DIR / f) for f in GUEST_FILES if not (VM_DIR / f).exists()]
if QEMU is None:
    _missing.insert(0, "qemu-system-x86_64 (apt-get install qemu-system-x86)")
if QEMU_IMG is None:
    _missing.insert(0, "qemu-img (apt-get install qemu-utils)")
pytestmark = [
    pytest.mark.skipif(
        bool(_missing),
        reason="vm: missing " + ", ".join(_missing) + " (scripts/setup.sh builds the guest unless WARREN_SETUP_VM=0; "
        "or run scripts/vm/build-guest.sh)",
    ),
    pytest.mark.timeout(900),
]
FULL = os.environ.get("WARREN_VM_FULL") == "1"
full_only = pytest.mark.skipif(
    not FULL,
    reason="vm: costs a second VM boot under TCG (minutes on 2 cores); opt in with WARREN_VM_FULL=1",
)

BOOT_TIMEOUT = 600  # create: QEMU start to the agent's hello (systemd boot, TCG)
DESKTOP_TIMEOUT = 300  # the agent's hello to X and xterm up
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


@pytest.fixture(scope="module")
def vmd(test_root: Path, layer_store: Path, internet: str):  # noqa: F811
    """This module's daemon: the VM's, killed and restarted by a test; with a
    sandbox network onto the tests' internet (test_network.py)."""
    d = Daemon(
        test_root,
        "vm",
        layer_store,
        f"{NODE_PREFIX}dv",
        extra_args=[
            "--vm-dir",
            str(VM_DIR),
            "--warm-shells",
            "0",
            "--sandbox-net",
            "10.213.7.0/24",
            "--net-dns-upstream",
            DNS,
            *PRESETS,
        ],
    ).start()
    yield d
    d.stop()
    drop_table(d)


WS_MARKER = b"the workspace layer of test_vm\n"


@pytest.fixture(scope="module")
def vm_layers(vmd: Daemon, base_layer: str, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The module's VMs' layers: the base and a workspace layer with /w/marker.txt."""
    assert vmd.client is not None
    d = tmp_path_factory.mktemp("vm-ws")
    (d / "w").mkdir()
    (d / "w" / "marker.txt").write_bytes(WS_MARKER)
    name = "workspace/test-vm@1"
    try:
        vmd.client.layers.get(name)
    except warren.NotFound:
        vmd.client.layers.build(name, dir=str(d), timeout=300)
    return [base_layer, name]


@pytest.fixture(scope="module")
def vm(vmd: Daemon, vm_layers: list[str]):
    """The module's one VM (booted once; later tests re-attach by id)."""
    t0 = time.monotonic()
    assert vmd.client is not None
    sb = vmd.client.create(backend="vm", layers=vm_layers, memory_mb=1024, timeout=BOOT_TIMEOUT)
    r = sb.exec("cat /proc/1/comm", timeout=60)
    print(f"\nvm: create to first exec {time.monotonic() - t0:.1f} s (TCG, systemd boot)")
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
        r = vm.exec("test -S /tmp/.X11-unix/X0 && grep -qx xterm /proc/[0-9]*/comm", timeout=30)
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
    stable_shot(vm, timeout=120)
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
    assert (UID_SLOTS / str(ruid)).read_text().strip() == str(vmd.state_dir / "vm-disks")
    # No host path of the guest, the disk or the run dir on its command
    # line: it could not open them as its uid. They are open fds.
    cmdline = Path(f"/proc/{qemu}/cmdline").read_bytes().split(b"\0")
    assert b"-sandbox" in cmdline
    text = b" ".join(cmdline)
    for path in (str(VM_DIR), str(vmd.state_dir), "/run/warren"):
        assert path.encode() not in text, (path, text)
    fds = {os.readlink(f"/proc/{qemu}/fd/{n}") for n in os.listdir(f"/proc/{qemu}/fd")}
    disk = vmd.state_dir / "vm-disks" / f"{vm.id}.qcow2"
    assert str(disk) in fds and str(VM_DIR / "upper.img") in fds and str(VM_DIR / "system.erofs") in fds, fds
    # The sandbox's layers, as the store's image files (read-only).
    store_layers = [f for f in fds if f.startswith(str(vmd.layer_store))]
    assert len(store_layers) == 2, fds
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


def test_the_root_is_the_sandboxs_layers_over_a_writable_disk(vm: warren.Sandbox) -> None:
    """One set of layers serves every backend: the VM's root is an overlay of
    the sandbox's layers with the guest's system layer over the base (its
    initramfs mounts them: boot=warren), its upper dir on the VM's writable
    disk; what the guest writes lands there, never in a layer."""
    r = vm.exec(
        "cat /w/marker.txt; findmnt -no FSTYPE /; grep -c ' erofs ' /proc/mounts;"
        " findmnt -no OPTIONS / | tr , '\\n' | grep -E '^(lowerdir|upperdir)='",
        timeout=60,
    )
    assert r.exit_code == 0, r
    out = r.stdout.decode()
    assert out.startswith(WS_MARKER.decode()), out
    lines = out[len(WS_MARKER) :].splitlines()
    assert lines == [
        "overlay",
        "3",
        "lowerdir=/run/warren/layers/2:/run/warren/layers/1:/run/warren/layers/0",
        "upperdir=/run/warren/disk/upper",
    ], out
    r = vm.exec(
        "echo new > /w/written && cat /run/warren/disk/upper/w/written && [ ! -e /run/warren/layers/2/w/written ]"
        " && rm /w/written && echo ok",
        timeout=60,
    )
    assert r.stdout == b"new\nok\n", r


def test_without_a_network_the_vm_has_loopback_only(vm: warren.Sandbox) -> None:
    """The template's NIC stays without a driver in a VM created without a
    network (the guest's udev never loads virtio_net): lo only, as a container."""
    r = vm.exec(["cat", "/proc/net/dev"], timeout=30)
    assert [ln.split(":")[0].strip() for ln in r.stdout.decode().splitlines()[2:]] == ["lo"], r.stdout
    assert probe(vm, ALLOWED).startswith("err")  # ENETUNREACH
    with pytest.raises(warren.FailedPrecondition, match="without a network"):
        vm.set_network({"allow": [ALLOWED]})


def test_a_networked_vm_reaches_what_its_policy_allows(vm: warren.Sandbox, vmd: Daemon, vm_layers: list[str]) -> None:
    """Network on vm (issue 16), as on microvm: a clone of the module's
    template plugs its own tap into the NIC every template carries; the guest
    agent configures eth0; the node's policy, DNS forwarder, set_network,
    exposed ports and counters apply; destroy leaves no tap, chain or rule."""
    assert vmd.client is not None
    with vmd.client.create(
        backend="vm", layers=vm_layers, memory_mb=1024, network={"allow": ["pypi"]}, timeout=BOOT_TIMEOUT
    ) as sb:
        assert http_get(sb, ALLOWED) == "hello from the test internet\n"
        assert probe(sb, OTHER) == "refused"
        assert probe(sb, METADATA) == "refused"  # protected
        assert probe(sb, TRANSIT_HOST) == "refused"  # the node
        assert resolve(sb, "pypi.test") == ALLOWED
        assert resolve(sb, "npm.test").startswith("fail")
        t0 = time.monotonic()
        assert sb.set_network({"allow": ["npm"]}) == {"allow": ["npm"], "deny": []}
        assert time.monotonic() - t0 < 0.1
        assert probe(sb, OTHER) == "open"
        assert probe(sb, ALLOWED) == "refused"
        serve_in(sb, 8000, bind="0.0.0.0")
        e = sb.expose(8000)
        assert http_from_host(e.address, e.token) == (200, "hello from inside\n")
        assert http_from_host(e.address)[0] == 401
        traffic = sb.info().traffic
        assert traffic is not None and traffic.denied > 0 and traffic.egress_bytes > 0
    assert_clean(vmd)


def test_a_vm_snapshot_starts_a_container(vm: warren.Sandbox, vmd: Daemon) -> None:
    """A VM's snapshot: its changes (the upper dir, streamed by the guest
    agent) become a layer over the sandbox's own layers (not the guest's
    system layer, which is the backend's), so it starts a container too."""
    assert vmd.client is not None
    r = vm.exec("echo from-vm > /root/vm.txt && rm /etc/issue", timeout=60)
    assert r.exit_code == 0, r
    snap = vm.snapshot(timeout=300)
    assert snap.layers[:-1] == vm.info().layers and snap.layers[-1] == snap.layer.digest
    assert vm.info().state == "running"
    with vmd.client.create(layers=snap.layers) as ct:
        r = ct.exec("cat /root/vm.txt /w/marker.txt; [ -e /etc/issue ] || echo gone", timeout=60)
        assert r.stdout == b"from-vm\n" + WS_MARKER + b"gone\n", r
        # The system layer's files are not in the changes.
        assert ct.exec("[ -e /usr/lib/xorg/Xorg ] || echo no-x", timeout=60).stdout == b"no-x\n"


@full_only
def test_a_vm_forks(vm: warren.Sandbox, vmd: Daemon) -> None:
    """A fork is a vm of the source's layers and changes (a boot of its own
    template: its layer set is new); its own changes are its own."""
    vm.exec("echo 42 > /root/answer", timeout=60)
    (fork,) = vm.fork(1, timeout=2 * BOOT_TIMEOUT)
    try:
        assert fork.info().backend == "vm"
        r = fork.exec("cat /root/answer; echo mine > /root/fork-only; cat /proc/1/comm", timeout=60)
        assert r.stdout == b"42\nsystemd\n", r
        assert vm.exec("[ -e /root/fork-only ] && echo leaked || echo own", timeout=60).stdout == b"own\n"
    finally:
        fork.destroy(timeout=60)


def test_screenshot_is_a_png_of_the_screen(desktop: warren.Sandbox) -> None:
    shot = desktop.screenshot(timeout=30)
    assert shot.png.startswith(PNG_SIG)
    assert (shot.width, shot.height) == (1024, 768)
    assert desktop.screen_size() == (1024, 768)
    t0 = time.monotonic()
    n = 5
    for _ in range(n):
        desktop.screenshot(timeout=30)
    print(f"\nvm: screenshot round trip {(time.monotonic() - t0) / n * 1000:.0f} ms (mean of {n})")


def test_typing_reaches_the_app_and_changes_the_screen(desktop: warren.Sandbox) -> None:
    """Keys go through QEMU's PS/2 keyboard to X to xterm's shell: the shell
    writes the typed line to a file, and the screen shows it."""
    desktop.exec("rm -f /tmp/typed", timeout=30)
    before = stable_shot(desktop)
    desktop.input.type("echo Typed-By-Warren > /tmp/typed\n")

    def typed() -> bool:
        r = desktop.exec("cat /tmp/typed", timeout=30)
        return r.exit_code == 0 and r.stdout == b"Typed-By-Warren\n"

    _wait(typed, 60, "the typed command's file in the guest")
    after = stable_shot(desktop)
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


@contextlib.contextmanager
def _vcpus_frozen(qemu_pid: int):
    """QEMU's vCPU threads ("CPU n/TCG" or "CPU n/KVM") frozen in a v1
    freezer cgroup of their own (below the one they are in), its other
    threads (the monitor's main loop) running: the guest takes no interrupt
    while the monitor still takes input events."""
    tids = [t for t in os.listdir(f"/proc/{qemu_pid}/task")
            if Path(f"/proc/{qemu_pid}/task/{t}/comm").read_text().startswith("CPU ")]
    assert tids, f"no vCPU thread in QEMU {qemu_pid}"
    line = next(l for l in Path(f"/proc/{qemu_pid}/task/{tids[0]}/cgroup").read_text().splitlines()
                if l.split(":")[1] == "freezer")
    parent = Path("/sys/fs/cgroup/freezer" + line.split(":", 2)[2])
    cg = parent / f"warren-test-vcpus-{qemu_pid}"
    cg.mkdir()
    try:
        for t in tids:
            (cg / "tasks").write_text(t)
        (cg / "freezer.state").write_text("FROZEN")
        yield
    finally:
        (cg / "freezer.state").write_text("THAWED")
        for t in tids:
            try:
                (parent / "tasks").write_text(t)
            except OSError:
                pass
        cg.rmdir()


@pytest.mark.skipif(not Path("/sys/fs/cgroup/freezer/tasks").exists(),
                    reason="no cgroup v1 freezer: a test cannot freeze one thread of QEMU")
def test_keys_typed_while_the_guest_stalls_all_arrive(desktop: warren.Sandbox) -> None:
    """QEMU's PS/2 keyboard queue holds 16 bytes and drops what comes while
    the guest reads none (a guest descheduled on a loaded host): with the
    VM's vCPU frozen, a typed line of ~180 scancode bytes waits for the
    guest (warren paces keys by the guest's i8042 interrupt count) and
    arrives whole once it runs again."""
    desktop.exec("rm -f /tmp/typed5", timeout=30)
    text = "The-Quick-Brown-Fox-" * 3
    (qemu,) = qemu_pids(desktop.id)
    errors: list[BaseException] = []

    def type_line() -> None:
        try:
            desktop.input.type(f"echo {text} > /tmp/typed5\n", timeout=120)
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            errors.append(e)

    typing = threading.Thread(target=type_line)
    with _vcpus_frozen(qemu):
        typing.start()
        time.sleep(2)
        assert typing.is_alive(), f"typing ended while the guest could read no key: {errors}"
    typing.join(120)
    assert not typing.is_alive() and not errors, errors

    def typed() -> bool:
        r = desktop.exec("cat /tmp/typed5", timeout=30)
        return r.exit_code == 0 and r.stdout == f"{text}\n".encode()

    _wait(typed, 60, "the line typed while the guest was frozen, whole")


def test_pointer_reaches_the_guest(desktop: warren.Sandbox) -> None:
    """The USB tablet is an input device of the guest; pointer events are
    taken (test_clicks_reach_the_app shows they reach the app)."""
    devices = desktop.exec("cat /proc/bus/input/devices", timeout=30).stdout
    assert b"QEMU QEMU USB Tablet" in devices
    desktop.input.mouse(10, 10)
    desktop.input.mouse(700, 500)
    desktop.input.scroll(0, 2)


def _shot_until(sb: warren.Sandbox, pred, what: str, timeout: float = 60):
    """The first screenshot for which pred(png) holds, polled (the guest
    takes the tablet's reports at its own pace: seconds under a loaded
    TCG)."""
    deadline = time.monotonic() + timeout
    while True:
        shot = sb.screenshot(timeout=30)
        if pred(shot.png):
            return shot
        if time.monotonic() > deadline:
            Path("/tmp/warren-vm-pointer.png").write_bytes(shot.png)
            pytest.fail(f"timed out after {timeout} s waiting for {what} (screen: /tmp/warren-vm-pointer.png)")
        time.sleep(0.5)


def test_pointer_moves_on_screen(desktop: warren.Sandbox) -> None:
    """The pointer shows in screendumps: each move changes the screen, and
    the pointer back where it was shows that screen again. Each step waits
    for the change it caused (not for a quiet second: under load the guest
    may take a tablet report later than that). An expected failure until
    2026-12-02 on cold boots; it passes on the desktop template's clones.
    It failed 2 of 4 runs on 2026-12-03 while it compared screens 1 s apart
    on a loaded machine."""
    desktop.input.mouse(500, 300)
    s0 = stable_shot(desktop, interval=2)  # the move above taken (2 quiet seconds)
    desktop.input.mouse(10, 10)
    _shot_until(desktop, lambda png: png != s0.png, "the pointer moved to (10, 10)")
    a = stable_shot(desktop)
    desktop.input.mouse(700, 500)
    _shot_until(desktop, lambda png: png != a.png, "the pointer moved to (700, 500)")
    desktop.input.mouse(10, 10)
    _shot_until(desktop, lambda png: png == a.png, "the pointer back at (10, 10) showing the first screen again")


def test_clicks_reach_the_app(desktop: warren.Sandbox) -> None:
    """A left-button drag selects a word xterm shows, a middle click pastes
    it into the shell's line: the command that runs writes it to a file.
    Keyboard and pointer are two devices with their own queues, so each step
    waits for the screen to settle before the next (as an agent would look
    before it acts)."""
    desktop.exec("rm -f /tmp/clicked", timeout=30)
    desktop.input.key("ctrl+l")
    stable_shot(desktop)
    # Row 1 (y 20..39, 10x20 font) shows it; cells 0..11 hold "clicked_word".
    desktop.input.type("echo clicked_word_and_more\n")
    stable_shot(desktop)
    desktop.input.mouse(1, 30, button="left", action="down")
    stable_shot(desktop)
    desktop.input.mouse(125, 30)  # into cell 12: the selection ends before it
    stable_shot(desktop)
    desktop.input.mouse(125, 30, button="left", action="up")
    stable_shot(desktop)
    desktop.input.type("echo ")
    stable_shot(desktop)
    desktop.input.mouse(500, 400, button="middle", action="click")
    stable_shot(desktop)
    desktop.input.type(" > /tmp/clicked\n")

    def pasted() -> bool:
        r = desktop.exec("cat /tmp/clicked", timeout=30)
        return r.exit_code == 0 and r.stdout == b"clicked_word\n"

    _wait(pasted, 60, "the word selected and pasted with the pointer")


def test_cli_screenshot_and_input(desktop: warren.Sandbox, vmd: Daemon, tmp_path: Path) -> None:
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
    assert warren_cli("input", desktop.id, "type", "echo via-cli > /tmp/cli-typed").returncode == 0
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


# ------------------------------------------------ warm starts (vm_template.h)


@pytest.fixture(scope="module")
def clone(desktop: warren.Sandbox, vmd: Daemon, vm_layers: list[str]):
    """A second VM of the module's memory size and layers: a clone of the
    desktop template the module's first create saved (no boot)."""
    assert vmd.client is not None
    t0 = time.monotonic()
    sb = vmd.client.create(backend="vm", layers=vm_layers, memory_mb=1024, timeout=BOOT_TIMEOUT)
    shot = sb.screenshot(timeout=30)
    took = time.monotonic() - t0
    print(f"\nvm: warm start (create → first screenshot) {took:.2f} s")
    assert shot.png.startswith(PNG_SIG) and (shot.width, shot.height) == (1024, 768)
    sb.warm_start_s = took  # type: ignore[attr-defined]
    yield sb
    if vmd.client is not None:  # (the daemon may have restarted since: a new client)
        try:
            vmd.client.get(sb.id).destroy(timeout=60)
        except warren.NotFound:
            pass


def test_warm_start_clones_the_booted_desktop(clone: warren.Sandbox, desktop: warren.Sandbox, vmd: Daemon) -> None:
    """The clone runs the template's booted guest (no boot: the create took
    seconds, not minutes), its desktop takes keys at once, its clock is the
    host's, its RNG is its own, its disk its own copy-on-write overlay, and
    its RAM the template's memfd mapped privately."""
    assert clone.warm_start_s < 60, clone.warm_start_s  # type: ignore[attr-defined]
    # Keys reach xterm's shell on the first try: the template was saved once
    # X took input.
    before = clone.screenshot(timeout=30).png
    clone.input.type("touch /tmp/clone-typed\n")
    try:
        # 90 s: a just-restored TCG guest on a loaded 2-core host (CI's
        # background sanitizer builds) once took longer than 30 s.
        _wait(
            lambda: clone.exec("test -e /tmp/clone-typed", timeout=30).exit_code == 0,
            90,
            "typing into the clone",
        )
    except pytest.fail.Exception:
        # Which half failed: the keys never reached X (screen unchanged), or
        # the shell did not run the line (what the guest was doing).
        changed = clone.screenshot(timeout=30).png != before
        ps = clone.exec(
            "cat /proc/loadavg; ps -eo stat,pcpu,comm --sort=-pcpu | head -15",
            timeout=30,
        )
        pytest.fail(
            f"typing into the clone: no file after 90 s; screen changed since the keys: {changed}; "
            f"guest: {ps.stdout.decode(errors='replace')}"
        )
    host = time.time()
    guest = float(clone.exec("date +%s.%N", timeout=30).stdout)
    assert abs(guest - host) < 10, (guest, host)
    a = clone.exec("head -c 16 /dev/urandom | od -An -tx1", timeout=30).stdout
    b = desktop.exec("head -c 16 /dev/urandom | od -An -tx1", timeout=30).stdout
    assert a != b
    # Each its own disk: a file of one is not in the other.
    clone.exec("echo mine > /root/clone-only", timeout=30)
    assert desktop.exec("test -e /root/clone-only", timeout=30).exit_code == 1
    disk = vmd.state_dir / "vm-disks" / f"{clone.id}.qcow2"
    assert disk.exists()
    qemu = one_qemu(clone.id)
    maps = Path(f"/proc/{qemu}/maps").read_text()
    assert "memfd:warren-vm-template-ram" in maps
    # The template: its state and disk, no QEMU of its own left.
    tmpl = [p for p in (vmd.state_dir / "vm-templates").iterdir() if p.is_dir()]
    assert len(tmpl) == 1 and {f.name for f in tmpl[0].iterdir()} == {
        "state",
        "disk.qcow2",
    }, tmpl
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmd_has(p, str(tmpl[0]))]
    # Memory: the clone holds what it changed, not the guest's RAM.
    mem = [
        int((cg / f).read_text())
        for cg in vm_cgroups(clone.id, "warren-vm")
        for f in ("memory.current", "memory.usage_in_bytes")
        if (cg / f).exists()
    ]
    print(f"\nvm: clone's cgroup memory {[m >> 20 for m in mem]} MiB (guest RAM 1024 MiB, shared)")


def _cmd_has(p: Path, needle: str) -> bool:
    """Whether process `p` is a QEMU whose command line holds `needle`."""
    try:
        cmd = (p / "cmdline").read_bytes()
    except OSError:
        return False
    return b"qemu-system" in cmd.split(b"\0")[0] and needle.encode() in cmd


def test_browser_form_reaches_the_server_in_the_vm(clone: warren.Sandbox) -> None:
    """Must-show: a page served inside the VM, opened in its browser (dillo);
    a click into the text field, a typed string, Return submits: the server
    in the VM receives the string, and the screenshot changed in the field's
    region when the string was typed."""
    sb = clone
    sb.files.write(SERVER_PATH, SERVER.encode(), make_parents=True)
    r = sb.exec(f"systemd-run --unit=warren-web perl {SERVER_PATH}", timeout=60)
    assert r.exit_code == 0, r
    # Listening before the browser asks (dillo keeps "Contacting host" after
    # a refused connection): 127.0.0.1:8080 in state LISTEN (0A).
    _wait(
        lambda: b"0100007F:1F90 00000000:0000 0A" in sb.exec("cat /proc/net/tcp", timeout=30).stdout,
        60,
        "the server in the VM listening",
    )
    r = sb.exec(
        "systemd-run --unit=warren-dillo --setenv=DISPLAY=:0 --setenv=HOME=/root dillo http://127.0.0.1:8080/",
        timeout=60,
    )
    assert r.exit_code == 0, r
    page_bg = (0xFF, 0xD0, 0x00)

    def page_shown() -> bool:
        w, _, rows = pixels(sb.screenshot(timeout=30).png)
        return has_colour(rows, w, page_bg) >= 0

    _wait(page_shown, 120, "dillo showing the page", step=1)
    sb.input.mouse(1000, 700)  # the pointer out of the way
    shot = stable_shot(sb, timeout=60)
    w, _, rows = pixels(shot.png)
    # The text field: the widest box of one colour inside the page.
    page_top = has_colour(rows, w, page_bg)
    field = field_box(rows, w, page_bg)
    x, y = (field[0] + field[2]) // 2, (field[1] + field[3]) // 2
    print(f"\nvm: page from y={page_top}, text field {field}, clicking ({x}, {y})")
    before = region(rows, field)
    sb.input.mouse(x, y, button="left", action="click")
    stable_shot(sb)
    sb.input.type("warren-typed-42")
    after_shot = stable_shot(sb)
    _, _, after_rows = pixels(after_shot.png)
    assert region(after_rows, field) != before, "typing into the field changed no pixel of it"
    sb.input.key("Return")
    _wait(
        lambda: sb.exec(f"cat {RECEIVED}", timeout=30).stdout == b"warren-typed-42",
        60,
        "the server in the VM receiving the form",
    )
    sb.exec("systemctl stop warren-dillo warren-web", timeout=60)


def test_files_go_through_the_guest_agent(clone: warren.Sandbox) -> None:
    data = bytes(range(256)) * 1024
    clone.files.write("/root/up/blob.bin", data, make_parents=True)
    assert clone.exec("sha256sum /root/up/blob.bin", timeout=30).stdout.split()[0].decode() == (
        __import__("hashlib").sha256(data).hexdigest()
    )
    clone.exec("printf guest-made > /root/up/g.txt", timeout=30)
    assert clone.files.read("/root/up/g.txt") == b"guest-made"
    with pytest.raises(warren.NotFound):
        clone.files.read("/root/up/none")


def test_pause_then_any_call_resumes(clone: warren.Sandbox) -> None:
    """Pause stops the vCPUs (QMP stop); a screenshot, input or exec of the
    paused VM resumes it first, as on every backend."""
    clone.pause()
    assert clone.info().state == "paused"
    shot = clone.screenshot(timeout=30)
    assert shot.png.startswith(PNG_SIG)
    assert clone.info().state == "running"
    clone.pause()
    clone.input.key("ctrl+l")
    assert clone.info().state == "running"
    clone.pause()
    assert clone.exec("echo up", timeout=60).stdout == b"up\n"
    assert clone.info().state == "running"


def test_suspend_ends_qemu_and_any_call_restores_the_desktop(clone: warren.Sandbox, vmd: Daemon) -> None:
    """Suspend saves the stopped VM (devices, video RAM, all of its RAM) to a
    file and ends QEMU: nothing of it runs. Any call (here a screenshot)
    restores it: the same boot, the same screen, the guest's processes and
    files as they were, QEMU jailed as at the create, the desktop taking
    keys again."""
    sb = clone
    r = sb.exec("echo before > /root/mark; nohup sleep 100000 >/dev/null 2>&1 & echo $!; "
                "cat /proc/sys/kernel/random/boot_id", timeout=60)
    sleeper, boot_id = r.stdout.decode().split()
    sb.input.key("ctrl+l")
    before = stable_shot(sb)
    qemu = one_qemu(sb.id)
    jail = {k: _status(qemu)[k] for k in ("Uid", "Gid", "Groups", "CapEff", "Seccomp", "NoNewPrivs")}
    t0 = time.monotonic()
    assert sb.suspend().state == "suspended"
    print(f"\nvm: suspend {time.monotonic() - t0:.2f} s")
    assert not running(qemu)
    assert not [p for p in qemu_pids(sb.id) if running(p)]
    t0 = time.monotonic()
    shot = sb.screenshot(timeout=300)
    print(f"vm: screenshot of a suspended VM (restore + resume + screendump) {time.monotonic() - t0:.2f} s")
    assert sb.info().state == "running"
    assert (shot.width, shot.height) == (1024, 768)
    assert stable_shot(sb).png == before.png, "the restored screen differs from the suspended one"
    restored = one_qemu(sb.id)
    assert restored != qemu
    st = _status(restored)
    assert {k: st[k] for k in jail} == jail, (st, jail)
    r = sb.exec(f"cat /root/mark; kill -0 {sleeper} && echo alive; cat /proc/sys/kernel/random/boot_id", timeout=60)
    assert r.stdout.decode().split() == ["before", "alive", boot_id], r
    sb.exec("rm -f /tmp/after-restore", timeout=30)
    sb.input.type("touch /tmp/after-restore\n")
    _wait(lambda: sb.exec("test -e /tmp/after-restore", timeout=30).exit_code == 0, 60, "typing after a restore")


def test_kill9_of_warrend_then_restart_adopts_the_vm(
    desktop: warren.Sandbox, clone: warren.Sandbox, vmd: Daemon, vm_layers: list[str]
) -> None:
    """README: sandboxes outlive the daemon and a restarted warrend re-adopts
    them. The same QEMU (pid, uid, boot) comes back under the new daemon,
    with exec, screenshots and input; no second QEMU, no orphan. A VM
    suspended at the time is adopted suspended (its state file is the VM)
    and restored by its next call; a networked VM keeps its link, its
    policy re-applied."""
    assert vmd.client is not None
    netvm = vmd.client.create(
        backend="vm", layers=vm_layers, memory_mb=1024, network={"allow": [ALLOWED]}, timeout=BOOT_TIMEOUT
    )
    assert probe(netvm, ALLOWED) == "open"
    sid = desktop.id
    qemu = one_qemu(sid)
    uid = _status(qemu)["Uid"]
    boot_id = desktop.exec("cat /proc/sys/kernel/random/boot_id", timeout=60).stdout
    clone.exec("echo suspended-across > /root/susp", timeout=60)
    assert clone.suspend().state == "suspended"
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
    susp = vmd.client.get(clone.id)
    assert susp.info().state == "suspended"
    assert not [p for p in qemu_pids(clone.id) if running(p)]
    assert susp.exec("cat /root/susp", timeout=300).stdout == b"suspended-across\n"
    assert susp.info().state == "running"
    assert int(_status(one_qemu(clone.id))["Uid"].split()[0]) >= 1_000_000
    netvm = vmd.client.get(netvm.id)
    assert probe(netvm, ALLOWED) == "open" and probe(netvm, OTHER) == "refused"
    assert netvm.set_network({"allow": [OTHER]})["allow"] == [f"{OTHER}/32"]
    assert probe(netvm, OTHER) == "open" and probe(netvm, ALLOWED) == "refused"
    netvm.destroy(timeout=60)
    assert_clean(vmd)


def test_destroy_leaves_no_process_disk_socket_or_cgroup(vm: warren.Sandbox, vmd: Daemon) -> None:
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
    # Nor a template's QEMU (named by its dir in the daemon's state dir).
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmd_has(p, str(d.state_dir))]
    disks = d.state_dir / "vm-disks"
    assert not disks.exists() or list(disks.iterdir()) == []
    assert _vm_cgroups_of(node) == []
    assert list((d.state_dir / "run").iterdir()) == []
    assert list((d.state_dir / "sandboxes").iterdir()) == []
    assert d.client.list(timeout=30) == []


def test_create_with_an_impossible_memory_size_is_refused(broken: Daemon, base_layer: str) -> None:
    assert broken.client is not None
    with pytest.raises(warren.InvalidArgument, match=r"memory_mb=100 is below the 384 MiB"):
        broken.client.create(backend="vm", layers=[base_layer], memory_mb=100, timeout=60)
    with pytest.raises(warren.InvalidArgument, match="memory_mb"):
        broken.client.create(backend="vm", layers=[base_layer], memory_mb=10_000_000, timeout=60)
    _nothing_left(broken)


def test_a_guest_that_never_answers_fails_create_and_leaves_nothing(broken: Daemon, base_layer: str) -> None:
    """The boot timeout (3 s here: the guest cannot boot that fast under TCG
    or KVM) fails the create after QEMU, its disk, cgroup, uid and sockets
    were all made: every one is undone."""
    assert broken.client is not None
    t0 = time.monotonic()
    with pytest.raises(warren.DeadlineExceeded, match=r"boot timeout 3000 ms") as e:
        broken.client.create(backend="vm", layers=[base_layer], memory_mb=512, timeout=120)
    took = time.monotonic() - t0
    assert took < 60, took
    m = re.search(re.escape(broken.node_id) + r"-[0-9a-f]+", str(e.value))
    assert m, f"the error names the sandbox: {e.value}"
    assert not qemu_pids(m.group(0))
    _nothing_left(broken)
    # The uid slot it took is free again: no claim names this daemon.
    owner = str(broken.state_dir / "vm-disks")
    assert not [p.name for p in UID_SLOTS.iterdir() if p.read_text().strip() == owner]


def test_a_missing_guest_file_fails_create_naming_it(broken: Daemon, base_layer: str) -> None:
    assert broken.client is not None
    guest: Path = broken.guest  # type: ignore[attr-defined]
    (guest / "initrd.img").unlink()
    try:
        with pytest.raises(
            warren.FailedPrecondition,
            match=r"guest initrd\.img \(scripts/vm/build-guest\.sh\) \S*/initrd\.img: No such file",
        ):
            broken.client.create(backend="vm", layers=[base_layer], memory_mb=512, timeout=60)
    finally:
        (guest / "initrd.img").symlink_to(VM_DIR / "initrd.img")
    _nothing_left(broken)


def test_kill9_during_a_template_build_leaves_nothing_after_restart(
    test_root: Path, layer_store: Path, base_layer: str
) -> None:
    """A daemon killed while its first create boots the desktop template:
    the restarted daemon kills the template's QEMU (it runs in no sandbox's
    cgroup), empties its template dir and cleans the interrupted create up.
    Costs seconds (QEMU is killed early in its boot)."""
    d = Daemon(
        test_root,
        "vm-kill",
        layer_store,
        f"{NODE_PREFIX}dk",
        extra_args=["--vm-dir", str(VM_DIR), "--warm-shells", "0"],
    ).start()
    try:
        assert d.client is not None

        def create() -> None:
            # A client of its own: the daemon's is closed by kill9 while
            # this call is in flight.
            c = warren.Client("unix:" + str(d.socket))
            try:
                with pytest.raises(warren.WarrenError):
                    c.create(backend="vm", layers=[base_layer], memory_mb=512, timeout=120)
            finally:
                c.close()

        worker = threading.Thread(target=create, daemon=True)
        worker.start()

        def template_qemus() -> list[Path]:
            return [
                p
                for p in Path("/proc").iterdir()
                if p.name.isdigit() and _cmd_has(p, "warren-vm-template:" + str(d.state_dir))
            ]

        _wait(lambda: bool(template_qemus()), 60, "the template's QEMU", step=0.2)
        qemus = template_qemus()
        d.kill9()
        worker.join(60)
        assert [p for p in qemus if running(int(p.name))], "the template's QEMU outlives its daemon (its own session)"
        d.start()
        assert not [p for p in qemus if running(int(p.name))]
        assert not (d.state_dir / "vm-templates").exists() or not list((d.state_dir / "vm-templates").iterdir())
        _wait(
            lambda: not d.client.list(timeout=30),
            60,
            "the interrupted create cleaned up",
        )
        _nothing_left(d)
    finally:
        d.stop()


@full_only
def test_a_second_vm_boots_beside_the_first(vmd: Daemon, base_layer: str) -> None:
    """Two VMs at once get two uids and two cgroups (a second boot: opt-in)."""
    assert vmd.client is not None
    with (
        vmd.client.create(backend="vm", layers=[base_layer], memory_mb=768, timeout=BOOT_TIMEOUT) as a,
        vmd.client.create(backend="vm", layers=[base_layer], memory_mb=768, timeout=BOOT_TIMEOUT) as b,
    ):
        ua = _status(one_qemu(a.id))["Uid"].split()[0]
        ub = _status(one_qemu(b.id))["Uid"].split()[0]
        assert ua != ub
        assert a.exec("true", timeout=60).exit_code == 0
        assert b.exec("true", timeout=60).exit_code == 0


@full_only
def test_a_desktop_that_never_comes_up_fails_create_clearly(
    test_root: Path, layer_store: Path, base_layer: str
) -> None:
    """A template whose desktop does not take input within
    --vm-desktop-timeout-ms (1 ms here: the guest answers, its X is not up
    yet) fails the create that waited with DeadlineExceeded naming the step,
    and leaves nothing (a boot to the agent's hello: opt-in)."""
    d = Daemon(
        test_root,
        "vm-nodesk",
        layer_store,
        f"{NODE_PREFIX}dn",
        extra_args=[
            "--vm-dir",
            str(VM_DIR),
            "--vm-desktop-timeout-ms",
            "1",
            "--warm-shells",
            "0",
        ],
    ).start()
    try:
        assert d.client is not None
        with pytest.raises(
            warren.DeadlineExceeded,
            match=r"desktop did not come up in time: waited for .*desktop timeout 1 ms",
        ):
            d.client.create(backend="vm", layers=[base_layer], memory_mb=768, timeout=BOOT_TIMEOUT)
        _nothing_left(d)
        assert not [p for p in (d.state_dir / "vm-templates").iterdir()]
        assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmd_has(p, str(d.state_dir))]
    finally:
        d.stop()


FIREFOX_ROOTFS = Path("/var/cache/warren/rootfs/toolset-firefox")


@full_only
@pytest.mark.skipif(
    not FIREFOX_ROOTFS.is_dir(),
    reason=f"vm: no {FIREFOX_ROOTFS} (apt-get install firefox-esr, then scripts/build-toolset-rootfs.sh "
    f"{FIREFOX_ROOTFS} /var/cache/warren/rootfs/debian-12 firefox-esr)",
)
def test_a_firefox_toolset_layer_stacks_on_the_vm(vmd: Daemon, base_layer: str) -> None:
    """The heavy browser, where KVM runs a stock guest: firefox-esr as a
    toolset layer stacked on the vm (the desktop's dillo stays the default:
    firefox takes minutes to start under TCG). Here it renders a page
    headless into a PNG (a boot of its own template, minutes under TCG)."""
    assert vmd.client is not None
    name = "toolset/firefox@1"
    try:
        vmd.client.layers.get(name)
    except warren.NotFound:
        vmd.client.layers.build(name, dir=str(FIREFOX_ROOTFS), timeout=900)
    sb = vmd.client.create(backend="vm", layers=[base_layer, name], memory_mb=1024, timeout=2 * BOOT_TIMEOUT)
    try:
        sb.files.write("/tmp/page.html", b"<html><body style='background:#00ff00'>warren</body></html>")
        r = sb.exec(
            "HOME=/root firefox-esr --headless --window-size 400,300 --screenshot /tmp/shot.png file:///tmp/page.html",
            timeout=900,
        )
        assert r.exit_code == 0, r
        w, _, rows = pixels(sb.files.read("/tmp/shot.png"))
        assert has_colour(rows, w, (0, 255, 0)) >= 0, "the page's green is on firefox's screenshot"
    finally:
        sb.destroy(timeout=60)
