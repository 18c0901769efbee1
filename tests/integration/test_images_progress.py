"""Progress of a conversion: while a layer's tar is extracted the node
reports the bytes of the blob read so far (phase "converting"), and `warren
image import|pull` on a terminal draws a bar per layer for fetching and
converting (one line per layer and phase off a terminal)."""

# ruff: noqa: F811  (the fixtures imported from test_images are parameters here)
from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import tarfile
import time
from pathlib import Path

import warren
from conftest import CLI
from test_images import (  # noqa: F401 - fixtures used by name
    _ti,
    make_layout,
    pytestmark,
    tar_bytes,
    work,
)


def many_files_layout(where: Path, files: int = 20000) -> Path:
    """One layer of many small incompressible files: its extraction takes a
    while (per-entry work), so progress is reported between its start and end."""
    members = [_ti("many/", tarfile.DIRTYPE, 0o755)]
    members += [_ti(f"many/f{i}", data=os.urandom(1024)) for i in range(files)]
    return make_layout(where, [tar_bytes(members)])


def test_conversion_reports_bytes_read(client, work):
    lay = many_files_layout(work / "progress-sdk")
    events: list[warren.ImageProgress] = []
    img = client.images.import_(str(lay), name="progress/sdk:1", progress=events.append, timeout=600)
    try:
        conv = [e for e in events if e.phase == "converting"]
        assert conv and conv[0].bytes_done == 0 and conv[0].bytes_total > 0, events
        total = conv[0].bytes_total
        done = [e.bytes_done for e in conv]
        assert done == sorted(done) and all(d <= total for d in done), done
        assert any(0 < d for d in done), done  # bytes read reported during the extraction
        assert [e.phase for e in events][-1] == "done"
    finally:
        client.images.remove(img.name)


def test_cli_import_draws_bars_on_a_terminal(daemon, client, work):
    lay = many_files_layout(work / "progress-cli")
    master, slave = pty.openpty()
    p = subprocess.Popen([str(CLI), "--addr", f"unix:{daemon.socket}", "image", "import", str(lay), "--name",
                          "progress/cli:1"], stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            r, _, _ = select.select([master], [], [], 1)
            if not r:
                if p.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the CLI closed the terminal
                break
            if not chunk:
                break
            out += chunk
        assert p.wait(60) == 0, out
    finally:
        os.close(master)
        if p.poll() is None:
            p.kill()
            p.wait()
    text = out.decode(errors="replace")
    assert p.stdout is not None and p.stdout.read().decode().startswith("progress/cli:1 ")
    bar = r"\[[#.]{24}\] +\d{1,3}%"
    assert re.search(r"\r\x1b\[K\[1/1\] sha256:[0-9a-f]{12} fetching " + bar, text), text[-2000:]
    assert re.search(r"\r\x1b\[K\[1/1\] sha256:[0-9a-f]{12} converting " + bar, text), text[-2000:]
    assert re.search(r"\[1/1\] sha256:[0-9a-f]{12} done\r?\n", text), text[-2000:]
    client.images.remove("progress/cli:1")
