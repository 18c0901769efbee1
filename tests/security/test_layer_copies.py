"""Snapshot, fork and grade copy what a sandbox controls onto the host (a
staging tree, then a layer in the store). A sandbox must not be able to fill
the host's disk through them (sparse files stay sparse, copies are bounded by
its disk limit and a node-wide cap), make them fail with a deep tree, smuggle
file capabilities into layers, or have its layers readable by other local
users."""

from __future__ import annotations

import errno
import os
import struct
import uuid

import pytest

import warren

GIB = 1 << 30


def sh(sb: warren.Sandbox, cmd: str, timeout: float = 120) -> str:
    r = sb.exec(cmd, timeout=timeout)
    assert r.exit_code == 0, (cmd, r.exit_code, r.stdout, r.stderr)
    return r.stdout.decode()


# ---------------------------------------------------------------- disk bounds


def test_snapshot_keeps_holes(client, base_layer):
    with client.create(layers=[base_layer], disk_mb=64) as sb:
        sh(sb, "mkdir -p /w && truncate -s 1G /w/sparse && "
               "printf data | dd of=/w/sparse bs=1 seek=536870912 conv=notrunc status=none")
        snap = sb.snapshot()
        # 1 GiB of apparent size costs the chunk index (1 MiB) and a block
        assert snap.layer.size_bytes < 8 << 20, snap.layer
        with client.create(layers=snap.layers, disk_mb=64) as kid:
            assert sh(kid, "stat -c %s /w/sparse").strip() == str(GIB)
            assert sh(kid, "dd if=/w/sparse bs=1 skip=536870912 count=4 status=none") == "data"


def test_snapshot_beyond_the_disk_limit_is_refused(client, base_layer):
    with client.create(layers=[base_layer], disk_mb=16) as sb:
        # 64 GiB apparent: its share (1/16: 4 GiB) is over 16 MiB + 1/4
        sh(sb, "mkdir -p /w && truncate -s 64G /w/huge")
        with pytest.raises(warren.ResourceExhausted) as ei:
            sb.snapshot()
        msg = str(ei.value)
        assert sb.id in msg and "disk limit" in msg and str(20 << 20) in msg, msg
        # nothing left behind: the sandbox still snapshots once the file is gone
        sh(sb, "rm /w/huge")
        assert sb.snapshot().layer.size_bytes < 4 << 20


def test_grade_of_an_oversized_solution_is_a_graded_failure(client, base_layer):
    with client.create(layers=[base_layer], disk_mb=16) as sb:
        sh(sb, "mkdir -p /w/pkg /w/other && echo ok > /w/pkg/a && truncate -s 64G /w/other/huge")
        # outside the solution: reported, never copied
        g = sb.grade("cat /w/pkg/a", solution=["/w/pkg"], timeout=60)
        assert g.passed and g.result.stdout == b"ok\n" and "/w/other" in g.touched, g
        sh(sb, "truncate -s 64G /w/pkg/huge")
        g = sb.grade("cat /w/pkg/a", solution=["/w/pkg"], timeout=60)
        assert not g.passed and g.result.exit_code == 1, g
        assert sb.id in g.rejected and "disk limit" in g.rejected, g
        assert b"not graded" in g.result.stderr


def test_node_wide_staging_cap(daemon, test_root, layer_store, base_layer):
    it = __import__("warren_integration_conftest")
    d = it.Daemon(test_root, "capped", layer_store, it.NODE_PREFIX + "cap",
                  extra_args=["--max-staging-mb", "1"]).start()
    try:
        c = d.client
        with c.create(layers=[base_layer], disk_mb=64) as sb:
            sh(sb, "mkdir -p /w && head -c 4194304 /dev/urandom > /w/blob")
            with pytest.raises(warren.ResourceExhausted, match="max-staging-mb"):
                sb.snapshot()
            sh(sb, "rm /w/blob && echo small > /w/f")
            sb.snapshot()  # the failed one gave its bytes back
    finally:
        assert d.stop() == 0


# ---------------------------------------------------------------- walks


def _deep(sb: warren.Sandbox, top: str, levels: int) -> None:
    # relative mkdir/chdir: the path may be longer than PATH_MAX
    sh(sb, "python3 -c \"import os\nos.makedirs('%s', exist_ok=True)\nos.chdir('%s')\n"
           "for _ in range(%d):\n    os.mkdir('d'); os.chdir('d')\nopen('f', 'w').write('deep')\"" % (top, top, levels))


def test_deep_trees_snapshot_fork_and_grade(client, base_layer):
    with client.create(layers=[base_layer]) as sb:
        _deep(sb, "/w/pkg", 300)  # deeper than any fixed recursion limit of 256
        deep_file = "/w/pkg/" + "d/" * 300 + "f"
        snap = sb.snapshot()
        with client.create(layers=snap.layers) as kid:
            assert sh(kid, f"cat {deep_file}") == "deep"
        g = sb.grade(f"cat {deep_file}", solution=["/w/pkg"], timeout=60)
        assert g.passed and g.result.stdout == b"deep", g
        # a tree whose paths are longer than a layer holds (PATH_MAX)
        _deep(sb, "/w/long", 2100)
        g = sb.grade(f"cat {deep_file}", solution=["/w/pkg"], timeout=60)
        assert g.passed and "/w/long" in g.touched, g  # outside the solution: listed only
        g = sb.grade("true", solution=["/w/long"], timeout=60)
        assert not g.passed and "longer than a layer" in g.rejected, g  # a graded failure
        with pytest.raises(warren.FailedPrecondition, match="longer than a layer"):
            sb.snapshot()


# ---------------------------------------------------------------- xattrs, privacy


def test_security_xattrs_are_not_copied_into_layers(daemon, client, base_layer):
    # VFS_CAP_REVISION_2 | effective, CAP_NET_RAW permitted: what setcap
    # cap_net_raw+ep writes.
    cap = struct.pack("<IIIII", 0x02000001, 1 << 13, 0, 0, 0).hex()
    with client.create(layers=[base_layer]) as sb:
        sh(sb, "cp /bin/true /usr/local/bin/pinger && python3 -c \"import os\n"
               f"os.setxattr('/usr/local/bin/pinger', 'security.capability', bytes.fromhex('{cap}'))\n"
               "os.setxattr('/usr/local/bin/pinger', 'user.note', b'kept')\"")
        snap = sb.snapshot()
    with client.create(layers=snap.layers) as kid:
        # in the layer itself (as the host sees it), not only as a sandbox
        # with another id mapping sees it
        mnt = daemon.state_dir / "mnt" / snap.layer.digest.split(":", 1)[1]
        f = mnt / "usr/local/bin/pinger"
        assert os.getxattr(f, "user.note", follow_symlinks=False) == b"kept"
        with pytest.raises(OSError) as ei:
            os.getxattr(f, "security.capability", follow_symlinks=False)
        assert ei.value.errno == errno.ENODATA
        r = kid.exec("python3 -c \"import os\ntry:\n    os.getxattr('/usr/local/bin/pinger', 'security.capability')\n"
                     "    print('present')\nexcept OSError as e:\n    print(e.errno)\"", timeout=60)
        assert r.stdout.decode().split() == [str(errno.ENODATA)], r


def test_state_dir_and_layer_mounts_are_private(daemon, client, base_layer, layer_store):
    with client.create(layers=[base_layer]) as sb:
        sh(sb, f"echo {uuid.uuid4().hex} > /secret")
        snap = sb.snapshot()
    with client.create(layers=snap.layers):
        # the state dir: not listable (0711: fncall workers attach their root
        # below it from inside their user namespace); what holds sandbox
        # contents: private to root
        assert os.stat(daemon.state_dir).st_mode & 0o066 == 0, oct(os.stat(daemon.state_dir).st_mode)
        for d in (daemon.state_dir / "mnt", daemon.state_dir / "tmp", layer_store / "blobs", layer_store / "tmp"):
            assert os.stat(d).st_mode & 0o077 == 0, (d, oct(os.stat(d).st_mode))
        # another local user cannot reach the snapshot layer's mount
        mnt = daemon.state_dir / "mnt" / snap.layer.digest.split(":", 1)[1]
        assert (mnt / "secret").exists()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            try:
                os.setgid(65534)
                os.setuid(65534)
                try:
                    (mnt / "secret").read_bytes()
                    os._exit(1)
                except PermissionError:
                    os._exit(0)
            except BaseException:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
