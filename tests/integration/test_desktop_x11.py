"""The desktop API on container and microvm sandboxes (src/runtime/desktop/
x11_desktop.h): an X server inside the sandbox from the toolset/desktop
layer (scripts/build-toolset-desktop-rootfs.sh: Xvfb, xdotool, matchbox,
xterm, dillo), started by the first desktop call; screenshots read from
Xvfb's framebuffer file and encoded by the node; input through xdotool.

Needs the layer's rootfs dir (/var/cache/warren/rootfs/toolset-desktop,
built by scripts/setup.sh; WARREN_DESKTOP_ROOTFS overrides); skipped with
the reason otherwise. The microvm case needs the microvm backend (skipped
with the reason when this warrend does not offer it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import warren
import warren.eval as we
from conftest import CLI
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
    wait,
)

DESKTOP_ROOTFS = Path(os.environ.get("WARREN_DESKTOP_ROOTFS", "/var/cache/warren/rootfs/toolset-desktop"))
DESKTOP = "toolset/desktop@1"
pytestmark = [
    pytest.mark.skipif(
        not (DESKTOP_ROOTFS / "usr/bin/Xvfb").exists(),
        reason=f"desktop: no {DESKTOP_ROOTFS}/usr/bin/Xvfb (scripts/build-toolset-desktop-rootfs.sh; setup.sh runs it)",
    ),
    pytest.mark.timeout(600),
]


@pytest.fixture(scope="module")
def desktop_layer(client: warren.Client) -> str:
    try:
        client.layers.get(DESKTOP)
    except warren.NotFound:
        client.layers.build(DESKTOP, dir=str(DESKTOP_ROOTFS), timeout=600)
    return DESKTOP


@pytest.fixture(scope="module")
def desk(client: warren.Client, base_layer: str, desktop_layer: str):
    """A container with the desktop layer; its first screenshot starts X."""
    sb = client.create(layers=[base_layer, desktop_layer], memory_mb=1024, labels={"test": "desktop"})
    t0 = time.monotonic()
    shot = sb.screenshot(timeout=60)
    print(f"\ndesktop (container): create → first screenshot (X started) {time.monotonic() - t0:.2f} s")
    assert shot.png.startswith(PNG_SIG)
    yield sb
    sb.destroy(timeout=60)


def test_screenshot_is_a_png_of_the_x_screen(desk: warren.Sandbox) -> None:
    shot = desk.screenshot(timeout=30)
    w, h, rows = pixels(shot.png)
    assert (shot.width, shot.height) == (w, h) == (1024, 768)
    assert desk.screen_size() == (1024, 768)
    # The X server is the sandbox's own process, on the display every
    # program of the sandbox reaches with DISPLAY=:0.
    r = desk.exec("DISPLAY=:0 xdotool getdisplaygeometry; cat /proc/[0-9]*/comm | sort -u", timeout=30)
    assert r.stdout.startswith(b"1024 768\n"), r
    assert b"Xvfb" in r.stdout and b"xterm" in r.stdout, r
    # xterm's white window over the screen: mostly white pixels.
    white = sum(row.count(b"\xff\xff\xff") for row in rows[::16])
    assert white > 1024 * (768 // 16) // 2, "xterm's white window is not on the screen"
    n, t0 = 10, time.monotonic()
    for _ in range(n):
        desk.screenshot(timeout=30)
    print(f"\ndesktop (container): screenshot round trip {(time.monotonic() - t0) / n * 1000:.1f} ms (mean of {n})")


def test_typing_and_keys_reach_xterm(desk: warren.Sandbox) -> None:
    """xdotool's keys reach xterm's shell: the typed line runs; a
    combination (ctrl+u) clears a line; the screen changed."""
    desk.exec("rm -f /tmp/typed /tmp/typed2", timeout=30)
    before = stable_shot(desk, interval=0.3)
    desk.input.type("echo Typed-By-Warren > /tmp/typed\n")
    wait(lambda: desk.exec("cat /tmp/typed", timeout=30).stdout == b"Typed-By-Warren\n", 30, "the typed line's file")
    after = stable_shot(desk, interval=0.3)
    assert after.png != before.png, "typing into xterm changed no pixel"
    desk.input.type("echo not-run")
    desk.input.key("ctrl+u")
    desk.input.type("echo $((6*7)) > /tmp/typed2")
    desk.input.key("Return")
    wait(lambda: desk.exec("cat /tmp/typed2", timeout=30).stdout == b"42\n", 30, "ctrl+u, then a shifted line")


def test_pointer_selects_and_pastes(desk: warren.Sandbox) -> None:
    """A left-button drag selects a word xterm shows, a middle click pastes
    it: the command that runs writes it to a file."""
    desk.exec("rm -f /tmp/clicked", timeout=30)
    desk.input.key("ctrl+l")
    stable_shot(desk, interval=0.3)
    desk.input.type("echo clicked_word_and_more\n")
    stable_shot(desk, interval=0.3)
    # Row 1 (y 20..39, 10x20 font); cells 0..11 hold "clicked_word".
    desk.input.mouse(1, 30, button="left", action="down")
    desk.input.mouse(125, 30)
    desk.input.mouse(125, 30, button="left", action="up")
    desk.input.type("echo ")
    desk.input.mouse(500, 400, button="middle", action="click")
    desk.input.type(" > /tmp/clicked\n")
    wait(lambda: desk.exec("cat /tmp/clicked", timeout=30).stdout == b"clicked_word\n", 30, "the pasted word")
    desk.input.scroll(0, 2)
    desk.input.scroll(-1, 0)


def test_browser_form_reaches_the_server_in_the_sandbox(desk: warren.Sandbox) -> None:
    """The issue's browser case on a container: a page served inside the
    sandbox (loopback), opened in dillo, a click into its text field, a
    typed string, Return: the server receives it, and the field's pixels
    changed when it was typed."""
    sb = desk
    sb.files.write(SERVER_PATH, SERVER.encode(), make_parents=True)
    sb.exec(f"rm -f {RECEIVED}; setsid perl {SERVER_PATH} </dev/null >/tmp/server.log 2>&1 &", timeout=30)
    wait(
        lambda: b"0100007F:1F90 00000000:0000 0A" in sb.exec("cat /proc/net/tcp", timeout=30).stdout,
        30,
        "the server listening on 127.0.0.1:8080",
    )
    sb.exec("HOME=/root DISPLAY=:0 setsid dillo http://127.0.0.1:8080/ </dev/null >/tmp/dillo.log 2>&1 &", timeout=30)
    page_bg = (0xFF, 0xD0, 0x00)

    def page_shown() -> bool:
        w, _, rows = pixels(sb.screenshot(timeout=30).png)
        return has_colour(rows, w, page_bg) >= 0

    wait(page_shown, 60, "dillo showing the page")
    sb.input.mouse(1000, 700)
    shot = stable_shot(sb, interval=0.5)
    w, _, rows = pixels(shot.png)
    field = field_box(rows, w, page_bg)
    x, y = (field[0] + field[2]) // 2, (field[1] + field[3]) // 2
    before = region(rows, field)
    sb.input.mouse(x, y, button="left", action="click")
    stable_shot(sb, interval=0.5)
    sb.input.type("warren-typed-42")
    after = stable_shot(sb, interval=0.5)
    assert region(pixels(after.png)[2], field) != before, "typing into the field changed no pixel of it"
    sb.input.key("Return")
    wait(lambda: sb.exec(f"cat {RECEIVED}", timeout=30).stdout == b"warren-typed-42", 30, "the form's submission")
    sb.exec("pkill -x dillo; pkill -f server.pl; true", timeout=30)


def test_bad_input_is_refused_with_the_reason(desk: warren.Sandbox) -> None:
    with pytest.raises(warren.InvalidArgument, match='unknown key "hyper"'):
        desk.input.key("ctrl+hyper")
    with pytest.raises(warren.InvalidArgument, match="outside the 1024x768 screen"):
        desk.input.mouse(1024, 10)
    with pytest.raises(warren.InvalidArgument, match="outside the 1024x768 screen"):
        desk.input.mouse(-1, 10)
    with pytest.raises(warren.InvalidArgument, match="needs a button"):
        desk.input.mouse(10, 10, action="click")
    with pytest.raises(warren.InvalidArgument, match="not printable ASCII"):
        desk.input.type("caf\u00e9")
    with pytest.raises(warren.InvalidArgument, match="at most 100"):
        desk.input.scroll(0, 1000)
    desk.exec("rm -f /tmp/after-bad", timeout=30)
    desk.input.type("touch /tmp/after-bad\n")
    wait(lambda: desk.exec("test -e /tmp/after-bad", timeout=30).exit_code == 0, 30, "typing after refused input")


def test_a_killed_x_server_is_started_again_and_a_pause_resumes(desk: warren.Sandbox) -> None:
    """The X server is the agent's to break: killed, the next call starts
    it again. A paused sandbox is resumed by a desktop call, as by any."""
    desk.exec("pkill -x Xvfb; sleep 0.5", timeout=30)
    assert desk.exec("DISPLAY=:0 xdotool getdisplaygeometry", timeout=30).exit_code != 0
    shot = desk.screenshot(timeout=60)
    assert (shot.width, shot.height) == (1024, 768)
    assert desk.exec("DISPLAY=:0 xdotool getdisplaygeometry", timeout=30).stdout == b"1024 768\n"
    desk.pause()
    assert desk.screenshot(timeout=60).png.startswith(PNG_SIG)
    assert desk.info().state == "running"


def test_a_forged_framebuffer_is_refused_not_trusted(desk: warren.Sandbox) -> None:
    """The framebuffer file is inside the sandbox: one the agent replaced
    (a huge screen, a FIFO) gives a clear error and sizes nothing; an X
    server killed with SIGKILL (its file left behind) is noticed within a
    second and started again."""
    fb = "/tmp/.warren-desktop/Xvfb_screen0"
    assert desk.screenshot(timeout=60).width == 1024
    # Header of a 100000 x 100000 screen (file version 7, ZPixmap, depth 24).
    fields = (100, 7, 2, 24, 100000, 100000, 0, 0, 32, 0, 32, 32, 400000, 4, 0xFF0000, 0xFF00, 0xFF, 8, 256, 0)
    hdr = b"".join(v.to_bytes(4, "big") for v in fields) + bytes(20)
    desk.exec(f"rm -f {fb}; mkfifo {fb}", timeout=30)
    with pytest.raises(warren.WarrenError, match="not a regular file"):
        desk.screenshot(timeout=30)
    desk.exec(f"rm -f {fb}", timeout=30)
    desk.files.write(fb, hdr)
    with pytest.raises(warren.InvalidArgument, match="screen 100000x100000"):
        desk.screenshot(timeout=30)
    # SIGKILL: the file stays (here: the forged one); the next screenshot
    # after a second finds the display dead and starts X, which rewrites it.
    desk.exec("pkill -9 -x Xvfb; sleep 0.3", timeout=30)
    time.sleep(1.2)
    shot = desk.screenshot(timeout=60)
    assert (shot.width, shot.height) == (1024, 768)
    assert desk.exec("DISPLAY=:0 xdotool getdisplaygeometry", timeout=30).stdout == b"1024 768\n"


def test_a_fork_of_a_running_desktop_starts_its_own(desk: warren.Sandbox) -> None:
    """A fork carries the desktop's files (the framebuffer file, X's stale
    lock and socket) but not its processes: its first desktop call starts
    its own X server, and the two desktops are apart."""
    desk.screenshot(timeout=60)
    desk.exec("echo from-parent > /root/mark", timeout=30)
    (child,) = desk.fork(1)
    try:
        shot = child.screenshot(timeout=60)
        assert (shot.width, shot.height) == (1024, 768)
        assert child.exec("cat /root/mark", timeout=30).stdout == b"from-parent\n"
        child.input.type("echo child-typed > /root/child.txt\n")
        wait(lambda: child.exec("cat /root/child.txt", timeout=30).stdout == b"child-typed\n", 30, "the fork's xterm")
        assert desk.exec("test -e /root/child.txt", timeout=30).exit_code != 0
    finally:
        child.destroy(timeout=60)


def test_a_sandbox_without_the_layer_names_it(sandbox: warren.Sandbox) -> None:
    with pytest.raises(warren.FailedPrecondition, match="Xvfb is not in this sandbox: stack the toolset/desktop layer"):
        sandbox.screenshot()
    with pytest.raises(warren.FailedPrecondition, match="toolset/desktop"):
        sandbox.input.key("a")


def test_microvm_desktop(client: warren.Client, base_layer: str, desktop_layer: str) -> None:
    """The same desktop on a microVM: X inside the guest, reached through
    the guest agent's exec and file calls."""
    if "microvm" not in client.status().backends:
        pytest.skip("microvm: not offered by this warrend (qemu-system-x86_64 or the guest files are missing)")
    sb = client.create(backend="microvm", layers=[base_layer, desktop_layer], memory_mb=512, timeout=180)
    try:
        t0 = time.monotonic()
        shot = sb.screenshot(timeout=120)
        print(f"\ndesktop (microvm): first screenshot (X started in the guest) {time.monotonic() - t0:.2f} s")
        assert (shot.width, shot.height) == (1024, 768) and shot.png.startswith(PNG_SIG)
        t0 = time.monotonic()
        for _ in range(3):
            sb.screenshot(timeout=60)
        print(f"desktop (microvm): screenshot round trip {(time.monotonic() - t0) / 3 * 1000:.0f} ms (mean of 3)")
        sb.input.type("echo in-the-vm > /tmp/typed\n")
        wait(lambda: sb.exec("cat /tmp/typed", timeout=30).stdout == b"in-the-vm\n", 90, "typing in the microVM's xterm")
    finally:
        sb.destroy(timeout=60)


CU_TASKS = Path(__file__).resolve().parents[2] / "eval" / "tasks" / "computer-use"


@pytest.mark.timeout(900)
def test_computer_use_eval_set_runs_with_warren_eval(daemon, client: warren.Client, base_layer: str,
                                                      desktop_layer: str, tmp_path: Path) -> None:
    """eval/tasks/computer-use through `warren eval`: every task once, each
    rollout a fresh container driven only through the desktop API and graded
    by the state the apps left (the form's server, the files the typed
    commands wrote); the trajectories that do the task pass, the others
    fail, every outcome as expected. Then the same set graded isolated
    (sb.grade(): only the solution paths reach a fresh grader)."""
    n = len(we.load_tasks(CU_TASKS))
    before = {s.id for s in client.list()}  # the module's own sandboxes
    report = tmp_path / "report.json"
    env = dict(os.environ, WARREN_PYTHON=sys.executable, WARREN_ADDR=f"unix:{daemon.socket}")
    p = subprocess.run([str(CLI), "eval", "--tasks", str(CU_TASKS), "-n", str(n), "-c", "2", "--report", str(report)],
                       env=env, capture_output=True, text=True, timeout=800, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"correct:     {n}/{n}" in p.stdout, p.stdout
    rep = json.loads(report.read_text())
    outcomes = {r["task"]: r["outcome"] for r in rep["rollouts"]}
    assert outcomes["cu-form-send-button"] == "pass" and outcomes["cu-form-wrong-text"] == "fail", outcomes
    print(f"\ncomputer-use eval: {n} rollouts in {rep['wall_s']:.1f} s, rollout p50 "
          f"{rep['latency_ms']['rollout']['p50'] / 1000:.1f} s")
    iso = we.run(client, [t for t in we.load_tasks(CU_TASKS) if t.id.startswith("cu-form")], concurrency=2,
                 grade="isolated")
    assert iso.all_correct, [(r.task, r.outcome, r.error, r.output_tail) for r in iso.rollouts]
    assert {s.id for s in client.list()} == before, "a rollout's sandbox was left"
