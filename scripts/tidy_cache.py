#!/usr/bin/env python3
"""Which translation units clang-tidy must check again: a content-keyed record
of units that passed (.ci/tidy-clean), like ccache's direct mode keyed on the
preprocessor's inputs.

A unit's key is the SHA-256 of: the clang-tidy version (its text without the
host CPU model), .clang-tidy, the
unit's compile command (with the tree's root path taken out, so a clone
elsewhere has the same keys), and the path and content of every file the unit
includes from inside the tree (its source, our headers); generated headers in
BUILD (protobuf) and files from outside the tree (Debian's /usr/include) count
by path.
The include list is the build's own: Ninja's deps log (`ninja -t deps`), so
the record is only as fresh as the last build of BUILD.

  tidy_cache.py units BUILD CLEAN        units whose key is not in CLEAN, one a line
  tidy_cache.py record BUILD CLEAN UNIT...  add the keys of UNITs (just checked
                                         clean) to CLEAN, drop keys no unit has now

CLEAN's lines: "<key> <unit>"; missing CLEAN = nothing recorded.
Exit 2 with a message naming what is missing (compile database, deps log entry).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
from typing import Dict, List


def die(msg: str) -> None:
    print(f"tidy_cache: {msg}", file=sys.stderr)
    sys.exit(2)


def unit_commands(root: str, build: str) -> Dict[str, dict]:
    db_path = os.path.join(build, "compile_commands.json")
    try:
        with open(db_path) as f:
            db = json.load(f)
    except OSError as e:
        die(f"{db_path}: {e.strerror} (build the release preset first)")
    out = {}
    for e in db:
        unit = os.path.relpath(os.path.join(e["directory"], e["file"]), root)
        if unit.startswith(("src/", "tests/")):
            out[unit] = e
    return out


def object_of(entry: dict) -> str:
    args = shlex.split(entry["command"]) if "command" in entry else entry["arguments"]
    for i, a in enumerate(args[:-1]):
        if a == "-o":
            return args[i + 1]
    die(f"no -o in the compile command of {entry['file']}")
    return ""


def deps_log(build: str) -> Dict[str, List[str]]:
    """Object (relative to BUILD) -> its dependencies as the deps log lists them."""
    try:
        text = subprocess.run(["ninja", "-C", build, "-t", "deps"], capture_output=True, text=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        die(f"ninja -t deps in {build}: {e}")
    deps: Dict[str, List[str]] = {}
    cur: List[str] | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith((" ", "\t")):
            if cur is not None:
                cur.append(line.strip())
        else:
            cur = deps.setdefault(line.split(": #deps", 1)[0], [])
    return deps


def keys(root: str, build: str) -> Dict[str, str]:
    root = os.path.realpath(root)
    build = os.path.realpath(build)
    try:
        version = subprocess.run([os.environ.get("CLANG_TIDY", "clang-tidy-15"), "--version"],
                                 capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        die(f"clang-tidy --version: {e}")
    # Without its "Host CPU:" line: the same clang-tidy finds the same on
    # any CPU model, and a record made on one machine must serve CI's.
    version = "".join(ln + "\n" for ln in version.splitlines() if not ln.strip().startswith("Host CPU:"))
    with open(os.path.join(root, ".clang-tidy"), "rb") as f:
        config = f.read()
    deps = deps_log(build)
    file_hash: Dict[str, str] = {}

    def content(path: str) -> str:
        h = file_hash.get(path)
        if h is None:
            with open(path, "rb") as f:
                h = hashlib.sha256(f.read()).hexdigest()
            file_hash[path] = h
        return h

    out = {}
    for unit, entry in unit_commands(root, build).items():
        obj = object_of(entry)
        listed = deps.get(obj)
        if listed is None:
            die(f"{unit}: {obj} is not in {build}'s deps log (build it first)")
        h = hashlib.sha256()
        h.update(version.encode())
        h.update(config)
        h.update(entry.get("command", " ".join(entry.get("arguments", []))).replace(root, "<root>").encode())
        for d in listed:
            p = os.path.realpath(os.path.join(build, d))
            if p.startswith(build + "/"):
                # Generated (protobuf) headers count by path: any .proto change rewrites them and would
                # send nearly every unit back to clang-tidy (> 30 min on 2 cores) for findings that
                # the header filter keeps out of generated code anyway. `WARREN_TIDY=all` still
                # checks everything against them.
                h.update(f"\n{os.path.relpath(p, root)}".encode())
            elif p == root or p.startswith(root + "/"):
                h.update(f"\n{os.path.relpath(p, root)} {content(p)}".encode())
            else:
                h.update(f"\n{p}".encode())
        out[unit] = h.hexdigest()
    return out


def read_clean(path: str) -> Dict[str, str]:
    rec: Dict[str, str] = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and not line.startswith("#"):
                    rec[parts[0]] = parts[1]
    return rec


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[1] not in ("units", "record"):
        die("usage: tidy_cache.py units BUILD CLEAN | record BUILD CLEAN UNIT...")
    cmd, build, clean = sys.argv[1], sys.argv[2], sys.argv[3]
    root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    now = keys(root, build)
    recorded = read_clean(clean)
    if cmd == "units":
        for unit, key in sorted(now.items()):
            if key not in recorded:
                print(unit)
        return
    passed = set(sys.argv[4:])
    unknown = passed - set(now)
    if unknown:
        die(f"not units of {build}'s compile database: {' '.join(sorted(unknown))}")
    lines = [f"{key} {unit}" for unit, key in sorted(now.items()) if key in recorded or unit in passed]
    with open(clean + ".tmp", "w") as f:
        f.write("# clang-tidy passed on these units at these keys (scripts/tidy_cache.py; "
                "written by scripts/lint.sh tidy --record)\n")
        f.write("".join(line + "\n" for line in lines))
    os.replace(clean + ".tmp", clean)
    print(f"tidy_cache: {len(lines)} of {len(now)} units recorded clean in {clean}")


if __name__ == "__main__":
    main()
