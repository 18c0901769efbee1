"""Computer use: the screen, keyboard and pointer of a sandbox with a virtual
display (``backend="vm"``), through QEMU's monitor, so it works for any
guest OS.

    shot = sb.screenshot()             # ScreenImage: png bytes, width, height
    sb.input.key("ctrl+l")             # keys joined by "+", released in reverse
    sb.input.type("hello\\n")          # printable ASCII, \\n and \\t (US layout)
    sb.input.mouse(100, 200, button="left", action="click")
    sb.input.scroll(0, 3)              # wheel clicks: dy > 0 down, dx > 0 right
    w, h = sb.screen_size()

Sandboxes of other backends raise Unimplemented naming the reason. Bad input
(an unknown key, non-ASCII text, a point outside the screen, a click without
a button) raises InvalidArgument naming what was wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ._core import Gen, Rpc, op
from ._proto import desktop_pb2 as dpb

__all__ = ["ScreenImage", "InputCore"]

_BUTTONS = {
    None: dpb.MOUSE_BUTTON_NONE,
    "none": dpb.MOUSE_BUTTON_NONE,
    "left": dpb.MOUSE_BUTTON_LEFT,
    "middle": dpb.MOUSE_BUTTON_MIDDLE,
    "right": dpb.MOUSE_BUTTON_RIGHT,
}
_ACTIONS = {
    "move": dpb.MOUSE_ACTION_MOVE,
    "click": dpb.MOUSE_ACTION_CLICK,
    "down": dpb.MOUSE_ACTION_DOWN,
    "up": dpb.MOUSE_ACTION_UP,
}


@dataclass(frozen=True)
class ScreenImage:
    """One screenshot: the whole screen as PNG bytes and its size in pixels."""

    png: bytes
    width: int
    height: int


def _screenshot(sb: Any, timeout: Optional[float]) -> Gen[ScreenImage]:
    c = sb._client
    r = yield Rpc(c._desktop.Screenshot, dpb.ScreenshotRequest(id=sb.id), c._metadata, timeout)
    return ScreenImage(png=bytes(r.png), width=r.width, height=r.height)


class InputCore:
    """Keyboard and pointer of one sandbox's display (``sb.input``). Each
    call returns once QEMU queued the events for the guest."""

    def __init__(self, sandbox: Any):
        self._sb = sandbox

    def _send(self, req: dpb.InputRequest, timeout: Optional[float]) -> Rpc:
        c = self._sb._client
        req.id = self._sb.id
        return Rpc(c._desktop.Input, req, c._metadata, timeout)

    @op
    def key(self, keys: str, timeout: Optional[float] = None) -> Gen[None]:
        """Presses a combination: "ctrl+l", "Return", "shift+Tab", "F5"."""
        yield self._send(dpb.InputRequest(key=dpb.KeyInput(keys=keys)), timeout)

    @op
    def type(self, text: str, timeout: Optional[float] = None) -> Gen[None]:
        """Types text (printable ASCII, \\n and \\t) on a US layout."""
        yield self._send(dpb.InputRequest(type=dpb.TypeInput(text=text)), timeout)

    @op
    def mouse(
        self, x: int, y: int, button: Optional[str] = None, action: str = "move", timeout: Optional[float] = None
    ) -> Gen[None]:
        """Moves the pointer to (x, y) (pixels, 0-based), then action:
        "move" (default), "click", "down" or "up" with button "left",
        "middle" or "right" (required but for "move")."""
        if button not in _BUTTONS:
            raise ValueError(f"button must be left, middle, right or None, not {button!r}")
        if action not in _ACTIONS:
            raise ValueError(f"action must be move, click, down or up, not {action!r}")
        m = dpb.MouseInput(x=x, y=y, button=_BUTTONS[button], action=_ACTIONS[action])
        yield self._send(dpb.InputRequest(mouse=m), timeout)

    @op
    def scroll(self, dx: int = 0, dy: int = 0, timeout: Optional[float] = None) -> Gen[None]:
        """Wheel clicks: dy > 0 scrolls down, dx > 0 right (at most 100 each)."""
        yield self._send(dpb.InputRequest(scroll=dpb.ScrollInput(dx=dx, dy=dy)), timeout)
