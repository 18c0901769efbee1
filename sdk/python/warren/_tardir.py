"""Directory trees as one tar stream (Files.upload_dir / download_dir).

The client packs and unpacks with Python's tarfile; the sandbox side is
GNU tar run inside the sandbox. A tar coming *from* a sandbox is untrusted:
every entry is checked before anything is written on the host (no absolute
names, no "..", no links or hard links whose target leaves the destination,
no devices or FIFOs), and the error names the offending entry.
"""

from __future__ import annotations

import os
import posixpath
import tarfile
import tempfile
from typing import BinaryIO, List

from . import errors

# Shell run in the sandbox: $1 = directory, $2 = tar file.
UNPACK_SH = 'mkdir -p -- "$1" && tar -x --no-same-owner -f "$2" -C "$1"'
PACK_SH = 'cd -- "$1" && tar -c -f "$2" .'

# Local tar files above this size spill from memory to a temporary file.
_SPOOL_BYTES = 64 << 20


def pack(local_dir: str) -> BinaryIO:
    """A seekable tar of local_dir's contents (names relative to it, "./x"),
    positioned at 0. Symlinks are stored as links, not followed."""
    if not os.path.isdir(local_dir):
        raise errors.InvalidArgument(f"upload_dir: {local_dir!r} is not a local directory")
    f = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)  # noqa: SIM115 (returned open)
    with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name in sorted(os.listdir(local_dir)):
            tf.add(os.path.join(local_dir, name), arcname=name, recursive=True)
    f.seek(0)
    return f  # type: ignore[return-value]


def _inside(dest: str, rel: str) -> bool:
    target = os.path.normpath(os.path.join(dest, rel))
    return target == dest or target.startswith(dest + os.sep)


def check_members(members: List[tarfile.TarInfo], dest: str) -> None:
    """Raises InvalidArgument naming the first entry that would land outside
    dest (an absolute path) or is not a file, directory or link."""
    dest = os.path.realpath(dest)
    for m in members:
        name = m.name
        if name.startswith("/") or ".." in name.split("/"):
            raise errors.InvalidArgument(f"download_dir: tar entry {name!r} escapes the destination")
        if not (m.isreg() or m.isdir() or m.issym() or m.islnk()):
            raise errors.InvalidArgument(f"download_dir: tar entry {name!r} is not a file, directory or link")
        if m.issym() and (m.linkname.startswith("/") or
                          not _inside(dest, posixpath.join(posixpath.dirname(name), m.linkname))):
            raise errors.InvalidArgument(
                    f"download_dir: symlink {name!r} -> {m.linkname!r} points outside the destination")
        if m.islnk() and (m.linkname.startswith("/") or not _inside(dest, m.linkname)):
            raise errors.InvalidArgument(
                f"download_dir: hard link {name!r} -> {m.linkname!r} points outside the destination")


def unpack(f: BinaryIO, local_dir: str) -> int:
    """Checks, then extracts the tar in f into local_dir (created). Returns
    the number of entries. A symlink met on the way is never followed: an
    entry below a symlink entry is refused as escaping."""
    os.makedirs(local_dir, exist_ok=True)
    f.seek(0)
    with tarfile.open(fileobj=f, mode="r:") as tf:
        members = [m for m in tf.getmembers() if m.name not in (".", "./")]
        for m in members:
            m.name = m.name[2:] if m.name.startswith("./") else m.name
            if m.islnk() and m.linkname.startswith("./"):
                m.linkname = m.linkname[2:]
        check_members(members, local_dir)
        links = {m.name for m in members if m.issym()}
        for m in members:
            parts = m.name.split("/")
            for i in range(1, len(parts)):
                if "/".join(parts[:i]) in links:
                    raise errors.InvalidArgument(f"download_dir: tar entry {m.name!r} lies below a symlink")
        # The stdlib's "data" filter (3.12, backported) re-checks the same rules.
        if hasattr(tarfile, "data_filter"):
            tf.extractall(local_dir, members=members, filter="data")
        else:
            tf.extractall(local_dir, members=members)
    return len(members)
