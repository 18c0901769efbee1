"""Bad input gives a typed exception whose message names the problem, and
leaves nothing behind."""

import errno
import io
import os
import subprocess
import tarfile
import time
import uuid

import pytest

import warren
from conftest import NODE_PREFIX, Daemon, assert_back_to_baseline, host_snapshot


def test_unknown_layer(daemon, client, base_layer, baseline):
    with pytest.raises(warren.NotFound) as ei:
        client.create(layers=[base_layer, "workspace/no-such-layer@1"])
    assert "workspace/no-such-layer" in ei.value.details
    with pytest.raises(warren.NotFound):
        client.create(layers=["sha256:" + "0" * 64])
    with pytest.raises(warren.NotFound):
        client.layers.get("base/nope@7")
    assert_back_to_baseline([daemon], baseline, clients=[client])


@pytest.mark.parametrize("ref", [
    "BASE/x@1", "base/", "nokind", "foo/bar@1", "base/x@", "base/../x", "base/x@1@2",
    "sha256:zz", "base/a b", "base/x/y@1", "/base/x", "base/" + "a" * 300,
])
def test_malformed_layer_names(daemon, client, base_layer, ref):
    with pytest.raises(warren.InvalidArgument) as ei:
        client.create(layers=[base_layer, ref])
    assert ref[:40] in ei.value.details
    assert client.list() == []


def test_empty_layer_list_and_unknown_backend(client):
    with pytest.raises(warren.InvalidArgument):
        client.create(layers=[])
    with pytest.raises((warren.InvalidArgument, warren.Unimplemented)) as ei:
        client.create(backend="no-such-backend", layers=["base/debian-12@1"])
    assert "no-such-backend" in ei.value.details


@pytest.mark.parametrize("kwargs", [dict(memory_mb=-1), dict(pids=-1), dict(disk_mb=-1),
                                    dict(cpu=-0.5), dict(ttl_s=-3)])
def test_negative_limits_rejected_before_sending(client, base_layer, kwargs):
    with pytest.raises(warren.InvalidArgument) as ei:
        client.create(layers=[base_layer], **kwargs)
    assert list(kwargs)[0] in ei.value.details


@pytest.mark.parametrize("kwargs,word", [
    (dict(memory_mb=2 ** 32 - 1), "memory"),
    (dict(disk_mb=2 ** 32 - 1), "disk"),
    (dict(pids=2 ** 32 - 1), "pids"),
    (dict(cpu=1_000_000), "cpu"),
    (dict(open_files=2 ** 32 - 1), "open_files"),
    (dict(tmpfs_mb=2 ** 32 - 1), "tmpfs"),
])
def test_huge_limits(daemon, client, base_layer, baseline, kwargs, word):
    with pytest.raises((warren.InvalidArgument, warren.ResourceExhausted)) as ei:
        client.create(layers=[base_layer], **kwargs)
    assert word in ei.value.details.lower()
    assert client.list() == []


@pytest.mark.parametrize("key", ["A=B", "A\0B", "", "=x"])
def test_bad_env_keys(daemon, client, base_layer, baseline, key):
    with pytest.raises(warren.InvalidArgument) as ei:
        client.create(layers=[base_layer], env={key: "v"})
    assert "env" in ei.value.details.lower()
    assert client.list() == []
    with client.create(layers=[base_layer]) as sb:
        with pytest.raises(warren.InvalidArgument) as ei:
            sb.exec("true", env={key: "v"}, timeout=10)
        assert "env" in ei.value.details.lower()
    assert_back_to_baseline([daemon], baseline, clients=[client])


def test_bad_exec_arguments(sandbox):
    with pytest.raises(warren.InvalidArgument) as ei:
        sandbox.exec("true", cwd="relative/dir", timeout=10)
    assert "relative/dir" in ei.value.details
    with pytest.raises((warren.InvalidArgument, warren.NotFound)) as ei:
        sandbox.exec("true", user="no-such-user", timeout=10)
    assert "no-such-user" in ei.value.details
    with pytest.raises(warren.NotFound):
        sandbox.exec("true", cwd="/no/such/dir", timeout=10)
    with pytest.raises(warren.NotFound):
        sandbox._client.get(sandbox.id.rsplit("-", 1)[0] + "-000000000000").exec("true")


def _tar(entries) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for info, data in entries:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    buf.seek(0)
    return buf


def _file(name, data=b"x"):
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.mode = 0o644
    return ti, data


def _dev(name):
    ti = tarfile.TarInfo(name)
    ti.type = tarfile.CHRTYPE
    ti.devmajor, ti.devminor = 1, 3
    ti.mode = 0o666
    return ti, None


def _symlink(name, target):
    ti = tarfile.TarInfo(name)
    ti.type = tarfile.SYMTYPE
    ti.linkname = target
    return ti, None


def _hardlink(name, target):
    ti = tarfile.TarInfo(name)
    ti.type = tarfile.LNKTYPE
    ti.linkname = target
    return ti, None


@pytest.mark.parametrize("bad,needle", [
    (_file("/etc/evil"), "/etc/evil"),
    (_file("../evil"), "../evil"),
    (_file("a/../../evil"), "a/../../evil"),
    (_dev("dev/mynull"), "dev/mynull"),
    (_hardlink("evil-hardlink", "../../etc/passwd"), "evil-hardlink"),
])
def test_bad_tar_layers(daemon, client, baseline, bad, needle):
    name = f"workspace/bad-{uuid.uuid4().hex[:8]}@1"
    before = {l.digest for l in client.layers.list()}
    with pytest.raises(warren.InvalidArgument) as ei:
        client.layers.build(name, tar=_tar([_file("ok.txt"), bad]), timeout=120)
    assert needle in ei.value.details
    with pytest.raises(warren.NotFound):
        client.layers.get(name)
    assert {l.digest for l in client.layers.list()} == before
    tmp = daemon.layer_store / "tmp"
    assert not tmp.exists() or os.listdir(tmp) == []
    assert_back_to_baseline([daemon], baseline, clients=[client])


def test_good_tar_layer_and_whiteout(client, base_layer, tmp_path):
    name = f"workspace/good-{uuid.uuid4().hex[:8]}@1"
    layer = client.layers.build(name, tar=_tar([_file("w/hello.txt", b"hello\n"),
                                                _symlink("w/link", "hello.txt"),
                                                _file("etc/.wh.hostname", b"")]), timeout=120)
    assert layer.name == name and layer.digest.startswith("sha256:")
    assert client.layers.get(name).digest == layer.digest
    with client.create(layers=[base_layer, name]) as sb:
        assert sb.files.read("/w/hello.txt") == b"hello\n"
        assert sb.exec("cat /w/link", timeout=10).stdout == b"hello\n"
        assert client.layers.get(name).in_use == 1
        with pytest.raises(warren.FailedPrecondition):
            client.layers.remove(name)
    assert client.layers.get(name).in_use == 0
    # same name@version with other content → AlreadyExists
    with pytest.raises(warren.AlreadyExists):
        client.layers.build(name, tar=_tar([_file("w/other", b"1")]), timeout=120)
    client.layers.remove(name)
    with pytest.raises(warren.NotFound):
        client.layers.get(name)


def test_corrupt_erofs_layer(daemon, client, base_layer, baseline, tmp_path):
    src = tmp_path / "src"
    (src / "w").mkdir(parents=True)
    (src / "w" / "data.bin").write_bytes(os.urandom(200_000))
    name = f"workspace/corrupt-{uuid.uuid4().hex[:8]}@1"
    layer = client.layers.build(name, dir=str(src), timeout=300)
    hexd = layer.digest.split(":", 1)[1]
    blob = daemon.layer_store / "blobs" / "sha256" / hexd
    assert blob.is_file(), f"layer store layout changed: {blob} missing"
    os.chmod(blob, 0o644)
    with open(blob, "r+b") as f:  # EROFS superblock lives at offset 1024
        f.seek(1024)
        f.write(os.urandom(4096))
    with pytest.raises(warren.WarrenError) as ei:
        client.create(layers=[base_layer, name], timeout=120)
    e = ei.value
    assert not isinstance(e, (warren.DeadlineExceeded, warren.Unavailable, warren.Unknown)), e
    assert hexd[:12] in e.details or name.split("@")[0] in e.details, e.details
    assert client.list() == []
    assert_back_to_baseline([daemon], baseline, clients=[client])
    client.layers.remove(name)


@pytest.mark.single_node("runs a warrend of its own on a full state dir: no cluster node is involved")
@pytest.mark.timeout(300)
def test_full_state_dir(test_root, layer_store, base_layer, daemon):
    small = test_root / "small-state"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "warren-it-small", str(small)],
                   check=True)
    d = Daemon(test_root, "full", layer_store, NODE_PREFIX + "c", state_dir=small)
    try:
        base = host_snapshot([daemon, d])
        d.start()
        c = d.client
        with c.create(layers=[base_layer]) as sb:  # works while there is space
            assert sb.exec("echo ok", timeout=30).stdout == b"ok\n"
        filler = small / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for _ in range(10_000):  # 2 MiB tmpfs: full after a few dozen writes
                os.write(fd, b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC
        finally:
            os.close(fd)
        with pytest.raises(warren.ResourceExhausted) as ei:
            c.create(layers=[base_layer], timeout=60)
        msg = ei.value.details.lower()
        assert "space" in msg or "enospc" in msg, ei.value.details
        assert str(small) in ei.value.details, ei.value.details
        assert c.list() == []
        filler.unlink()
        with c.create(layers=[base_layer]) as sb:  # and recovers
            assert sb.exec("echo ok", timeout=30).stdout == b"ok\n"
        assert_back_to_baseline([daemon, d], base, clients=[c])
    finally:
        if d.proc and d.proc.poll() is None:
            d.stop()
        for _ in range(20):
            if subprocess.run(["umount", str(small)], stderr=subprocess.DEVNULL).returncode == 0:
                break
            time.sleep(0.5)
        else:
            subprocess.run(["umount", "-l", str(small)], check=False)


def _hard_nofile(pid):
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                return line.split()[4]
    raise AssertionError("no 'Max open files' in /proc/<pid>/limits")


def test_open_files_above_the_daemons_hard_limit(daemon, client, base_layer, baseline):
    """A sandbox cannot get more open files than its daemon holds: refused in
    validation (InvalidArgument naming the field, the value and the maximum),
    never a PermissionDenied from the sandbox's setup."""
    hard = _hard_nofile(daemon.pid)
    if hard == "unlimited" or int(hard) >= 1048576:
        pytest.skip(f"the daemon's hard RLIMIT_NOFILE ({hard}) is not below warren's own maximum")
    ask = int(hard) + 1
    with pytest.raises(warren.InvalidArgument) as ei:
        client.create(layers=[base_layer], open_files=ask)
    assert f"open_files={ask}" in ei.value.details and hard in ei.value.details, ei.value.details
    assert client.list() == []
    with client.create(layers=[base_layer], open_files=int(hard)) as sb:
        assert sb.exec("ulimit -n", timeout=30).stdout.strip() == hard.encode()
    assert_back_to_baseline([daemon], baseline, clients=[client])


def test_default_locale_is_utf8(client, base_layer):
    with client.create(layers=[base_layer]) as sb:
        r = sb.exec("echo $LANG; python3 -c 'import sys; print(sys.stdout.encoding); print(\"\\u00e9\")'", timeout=60)
        assert r.exit_code == 0, r.stderr
        assert r.stdout == "C.UTF-8\nutf-8\n\u00e9\n".encode(), r.stdout
    with client.create(layers=[base_layer], env={"LC_ALL": "C"}) as sb:
        assert sb.exec("echo \"[$LANG]\"", timeout=30).stdout == b"[]\n"
