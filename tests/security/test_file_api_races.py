"""The file API (sb.files) against a sandbox that races it: a path swapped
between a directory and a symlink to "/" (or a ".." chain) in a tight loop,
hardlinks to files of the shared read-only layers, symlinks naming host
paths. Nothing outside the sandbox may be read, listed or written."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import List

import pytest

import warren

from .conftest import PROBE_PATH, Probe, create_sandbox

# Refusals the file API may answer while the path flips under it.
_REFUSED = (warren.NotFound, warren.PermissionDenied, warren.InvalidArgument, warren.FailedPrecondition)


@pytest.mark.parametrize("target", ["/", "../../../../../../../../../../.."])
def test_symlink_swap_race_stays_inside(fresh_probe: Probe, host_marker: Path, target: str):
    sb = fresh_probe.sb
    secret = host_marker.read_bytes()
    host_dir = host_marker.parent
    rel = str(host_marker)                  # the host path, re-rooted under the racing dir inside
    rel_dir = str(host_dir)
    # /race/a: a directory holding a decoy at the host secret's path; /race/b:
    # a symlink to `target`. The probe exchanges them (renameat2
    # RENAME_EXCHANGE) as fast as it can.
    sb.files.write(f"/race/a{rel}", b"SANDBOX-DECOY\n", make_parents=True)
    sb.files.write(f"/race/a{rel_dir}/decoy-marker", b"", make_parents=True)
    swapper: List[warren.ExecResult] = []
    t = threading.Thread(target=lambda: swapper.append(
        sb.exec([PROBE_PATH, "race-swap", "/race", target, "4"], timeout=60)))
    t.start()
    reads = writes = refused = 0
    leaks: List[str] = []
    deadline = time.monotonic() + 30
    i = 0
    try:
        while t.is_alive() and time.monotonic() < deadline:
            i += 1
            for side in "ab":
                try:
                    data = sb.files.read(f"/race/{side}{rel}")
                    reads += 1
                    if secret in data:
                        leaks.append(f"read /race/{side}{rel} returned the host secret")
                except _REFUSED:
                    refused += 1
                try:
                    sb.files.write(f"/race/{side}{rel_dir}/w{i}{side}", b"written through the race\n")
                    writes += 1
                except _REFUSED:
                    refused += 1
                try:
                    names = {e.name for e in sb.files.list(f"/race/{side}{rel_dir}")}
                    if "secret" in names and "decoy-marker" not in names:
                        leaks.append(f"list /race/{side}{rel_dir} listed the host dir: {sorted(names)}")
                except _REFUSED:
                    refused += 1
                if i % 7 == 0:
                    try:
                        sb.files.remove(f"/race/{side}{rel}")
                        sb.files.write(f"/race/{side}{rel}", b"SANDBOX-DECOY\n")
                    except _REFUSED:
                        refused += 1
    finally:
        t.join(timeout=60)
    print(f"target={target} iterations={i} reads={reads} writes={writes} refused={refused} "
          f"swapper={swapper[0].stdout if swapper else None!r}")
    assert swapper and swapper[0].exit_code == 0, swapper
    assert b"swaps=" in swapper[0].stdout
    assert not leaks, leaks
    # Nothing was written, removed or replaced on the host.
    assert sorted(os.listdir(host_dir)) == ["secret"], os.listdir(host_dir)
    assert host_marker.read_bytes() == secret
    assert i > 5, "the race loop did not run"


def test_symlink_to_host_path_resolves_inside(fresh_probe: Probe, host_marker: Path):
    sb = fresh_probe.sb
    secret = host_marker.read_bytes()
    r = sb.exec(f"ln -s {host_marker} /tmp/to-host && ln -s {host_marker.parent} /tmp/to-host-dir", timeout=30)
    assert r.exit_code == 0, r
    with pytest.raises(warren.NotFound):
        sb.files.read("/tmp/to-host")
    with pytest.raises(_REFUSED):
        sb.files.list("/tmp/to-host-dir")
    try:
        sb.files.write("/tmp/to-host", b"PWNED\n")
    except _REFUSED:
        pass
    try:
        sb.files.write("/tmp/to-host-dir/new-file", b"PWNED\n")
    except _REFUSED:
        pass
    try:
        sb.files.rename("/tmp/to-host-dir/secret", "/tmp/stolen")
    except _REFUSED:
        pass
    assert host_marker.read_bytes() == secret
    assert sorted(os.listdir(host_marker.parent)) == ["secret"]


def test_hardlink_to_layer_file_write_stays_in_sandbox(client: warren.Client, base_layer: str, backend: str):
    """A hardlink to a file of the shared read-only base layer, then a write
    through the file API (and inside) to that link: the layer, the host's
    rootfs copy and every other sandbox keep the original."""
    with create_sandbox(client, backend, base_layer) as sb, create_sandbox(client, backend, base_layer) as other:
        before = other.exec("cat /etc/passwd", timeout=30).stdout
        assert b"root:" in before
        r = sb.exec("ln /etc/passwd /tmp/hl && ln /etc/os-release /tmp/hl2 && echo PWNED-SHELL >> /tmp/hl2",
                    timeout=30)
        assert r.exit_code == 0, r
        sb.files.write("/tmp/hl", b"PWNED-FILE-API\n")
        # A race: the link's name flips between two layer files while the API writes.
        t = threading.Thread(target=lambda: sb.exec(
            "end=$(($(date +%s)+3)); while [ $(date +%s) -lt $end ]; do "
            "ln -f /etc/passwd /tmp/hl3; ln -f /etc/group /tmp/hl3; done", timeout=30))
        t.start()
        n = 0
        while t.is_alive() and n < 300:
            n += 1
            try:
                sb.files.write("/tmp/hl3", b"PWNED-RACE\n")
            except (warren.NotFound, warren.FailedPrecondition):
                pass
        t.join(timeout=30)
        for path in ["/etc/passwd", "/etc/os-release", "/etc/group"]:
            r = other.exec(["cat", path], timeout=30)
            assert b"PWNED" not in r.stdout, (path, r.stdout[:200])
        assert other.exec("cat /etc/passwd", timeout=30).stdout == before
    with create_sandbox(client, backend, base_layer) as fresh:
        for path in ["/etc/passwd", "/etc/os-release", "/etc/group"]:
            assert b"PWNED" not in fresh.exec(["cat", path], timeout=30).stdout, path
