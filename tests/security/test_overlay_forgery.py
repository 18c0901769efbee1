"""Forged overlayfs metadata carried through a snapshot: a sandbox sets
overlayfs's private xattrs (trusted.overlay.* / user.overlay.*: redirect,
opaque, metacopy, origin), makes whiteouts (char 0:0) and symlinks naming host
paths, then is snapshotted; a sandbox created from that snapshot must not see
host files or another sandbox's files, through exec or the file API."""

from __future__ import annotations

import secrets
from pathlib import Path

import warren

from .conftest import PROBE_PATH, Probe, assert_blocked, create_sandbox


def test_forged_overlay_metadata_through_snapshot(client: warren.Client, base_layer: str, backend: str,
                                                 probe_binaries, host_marker: Path, layer_store: Path):
    host_secret = host_marker.read_bytes().strip()
    other_secret = b"OTHER-SANDBOX-SECRET-" + secrets.token_hex(8).encode()
    with create_sandbox(client, backend, base_layer) as other:
        # Another tenant's files: in its running upper and in a snapshot layer in the store.
        other.files.write("/srv/other/secret", other_secret + b"\n", make_parents=True)
        other_snap = other.snapshot()
        with create_sandbox(client, backend, base_layer) as sb:
            probe = Probe(backend, sb, probe_binaries)
            # Redirect values naming: the host secret's dir (absolute, and
            # climbing), the other tenant's path, the layer store.
            redirects = {
                "f1": str(host_marker.parent),
                "f2": "/../../../../../../../.." + str(host_marker.parent),
                "f3": "/srv/other",
                "f4": str(layer_store),
                # A path the lower layers have: shows whether forged metadata is honoured at all.
                "f5": "/etc",
            }
            assert sb.exec("mkdir -p /work/forge", timeout=30).exit_code == 0
            forged = {}
            for d, red in redirects.items():
                forged[d] = probe.run("forge", f"/work/forge/{d}", red)
            for d, lines in forged.items():
                for name, line in lines.items():
                    if name.startswith("setxattr:") and ":trusted.overlay." in name:
                        # Only CAP_SYS_ADMIN of the initial namespace sets trusted.*.
                        assert_blocked(line)
            r = sb.exec("ln -s /srv/other/secret /work/forge/other-link; "
                        f"ln -s {host_marker} /work/forge/host-link; "
                        "mknod /work/forge/wh-etc c 0 0; ls -la /work/forge", timeout=30)
            print(r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace"))
            snap = sb.snapshot()
            print(f"snapshot layers: {snap.layers}")
        with client.create(backend=backend, layers=snap.layers, labels={"test": "security"}) as child:
            r = child.exec("find /work/forge | sort; "
                           "find /work/forge -type f -exec cat {} + 2>&1; "
                           "find /work/forge -type l -exec cat {} + 2>&1; "
                           "for d in /work/forge/*/subdir; do ls -la $d; cat $d/* 2>&1; done; "
                           "cat /srv/other/secret 2>&1; ls -la /srv 2>&1", timeout=60)
            seen = r.stdout + r.stderr
            print(seen.decode(errors="replace"))
            assert host_secret not in seen, "a sandbox made from the snapshot sees the host secret"
            assert other_secret not in seen, "a sandbox made from the snapshot sees another sandbox's file"
            # The file API too, on every path the forgery named.
            for d in redirects:
                for p in [f"/work/forge/{d}/file", f"/work/forge/{d}/subdir", f"/work/forge/{d}/hostlink",
                          f"/work/forge/{d}/subdir/secret"]:
                    try:
                        info = child.files.stat(p)
                    except (warren.NotFound, warren.PermissionDenied, warren.InvalidArgument):
                        continue
                    if info.is_dir:
                        names = [e.name for e in child.files.list(p)]
                        assert "secret" not in names or p.endswith("/other"), (p, names)
                    else:
                        try:
                            data = child.files.read(p)
                        except (warren.NotFound, warren.PermissionDenied, warren.InvalidArgument):
                            continue
                        assert host_secret not in data and other_secret not in data, p
            for p in ["/work/forge/host-link", "/work/forge/other-link", "/srv/other/secret"]:
                try:
                    data = child.files.read(p)
                except (warren.NotFound, warren.PermissionDenied, warren.InvalidArgument):
                    continue
                assert host_secret not in data and other_secret not in data, p
            # Inside, the forged redirect dirs read as plain sandbox dirs.
            child.files.write(PROBE_PATH, probe_binaries.x86_64.read_bytes(), mode=0o755, make_parents=True)
            r = child.exec([PROBE_PATH, "read"] + [f"/work/forge/{d}/subdir" for d in redirects], timeout=30)
            for d in redirects:
                line = [l for l in r.stdout.decode().splitlines() if f"/work/forge/{d}/subdir " in l + " "]
                assert line and "entries=0" in line[0], (d, r.stdout)
