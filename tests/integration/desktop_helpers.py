"""Helpers of the desktop tests (test_vm.py: the vm backend's QEMU display;
test_desktop_x11.py: an X server inside a container or microVM): screens
that settle, a PNG's pixels decoded with zlib alone, a text field found by
colour, and the form server the browser tests submit to."""

from __future__ import annotations

import importlib.util
import time
import zlib
from pathlib import Path

import pytest
import warren

PNG_SIG = b"\x89PNG\r\n\x1a\n"


def wait(pred, timeout: float, what: str, step: float = 0.5) -> None:
    """Polls `pred` until true; fails naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


def stable_shot(sb: warren.Sandbox, timeout: float = 60, interval: float = 1.0) -> warren.desktop.ScreenImage:
    """A screenshot equal to the one taken `interval` s before it (nothing drawing)."""
    prev = sb.screenshot(timeout=30)
    deadline = time.monotonic() + timeout
    while True:
        time.sleep(interval)
        cur = sb.screenshot(timeout=30)
        if cur.png == prev.png:
            return cur
        if time.monotonic() > deadline:
            pytest.fail(f"the screen kept changing for {timeout} s")
        prev = cur


def pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the RGB rows of a PNG as QEMU's screendump writes it
    (8-bit RGB or RGBA, not interlaced): zlib and the five row filters."""
    assert png.startswith(PNG_SIG)
    pos, idat, ihdr = 8, b"", b""
    while pos < len(png):
        n = int.from_bytes(png[pos : pos + 4], "big")
        kind, body = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            ihdr = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h = int.from_bytes(ihdr[0:4], "big"), int.from_bytes(ihdr[4:8], "big")
    assert ihdr[8] == 8 and ihdr[9] in (2, 6) and ihdr[12] == 0, ihdr
    bpp = 3 if ihdr[9] == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        prev = line
        rows.append(bytes(line) if bpp == 3 else bytes(v for i, v in enumerate(line) if i % 4 != 3))
    return w, h, rows


def has_colour(rows: list[bytes], w: int, rgb: tuple[int, int, int]) -> int:
    """The first row holding a pixel of colour `rgb`, or -1."""
    pix = bytes(rgb)
    for y, row in enumerate(rows):
        if any(row[3 * x : 3 * x + 3] == pix for x in range(0, w, 4)):
            return y
    return -1


def field_box(rows: list[bytes], w: int, bg: tuple[int, int, int]) -> tuple[int, int, int, int]:
    """A text field's inside on a page of colour `bg`: of the runs (40 px or
    wider) of one other colour in rows that also show the page, the one that
    grows (up and down, while the rows hold it) into the largest box:
    (x0, y0, x1, y1)."""
    page = bytes(bg)
    best, box = 0, (0, 0, 0, 0)
    seen = set()
    for y, row in enumerate(rows):
        if not any(row[3 * x : 3 * x + 3] == page for x in range(0, w, 4)):
            continue
        x = 0
        while x < w:
            pix = row[3 * x : 3 * x + 3]
            x0 = x
            while x < w and row[3 * x : 3 * x + 3] == pix:
                x += 1
            if pix == page or x - x0 < 40 or (x0, x, pix) in seen:
                continue
            seen.add((x0, x, pix))
            run = row[3 * x0 : 3 * x]
            y0 = y1 = y
            while y0 > 0 and rows[y0 - 1][3 * x0 : 3 * x] == run:
                y0 -= 1
            while y1 + 1 < len(rows) and rows[y1 + 1][3 * x0 : 3 * x] == run:
                y1 += 1
            if (x - x0) * (y1 - y0 + 1) > best:
                best, box = (x - x0) * (y1 - y0 + 1), (x0, y0, x - 1, y1)
    assert best >= 40 * 8, f"no text field on the page (largest box {box})"
    return box


def region(rows: list[bytes], box: tuple[int, int, int, int]) -> list[bytes]:
    x0, y0, x1, y1 = box
    return [r[3 * x0 : 3 * (x1 + 1)] for r in rows[y0 : y1 + 1]]


def _form_server() -> str:
    """The form server of the computer-use eval tasks (one copy: eval/tasks/
    gen_computer_use.py): a page with a text field and Send on
    127.0.0.1:8080; a submission lands in RECEIVED."""
    gen = Path(__file__).resolve().parents[2] / "eval" / "tasks" / "gen_computer_use.py"
    spec = importlib.util.spec_from_file_location("gen_computer_use", gen)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return str(mod.SERVER)


SERVER = _form_server()
SERVER_PATH = "/srv/form/server.pl"  # written there (the dir is where RECEIVED goes)
RECEIVED = "/srv/form/received"
