"""Images: built here with umoci, served by a real docker-registry on
loopback (pushed with skopeo), pulled / imported by warren, run, and compared
file by file with `umoci unpack` of the same image (the reference). Bad input
(a tampered blob, a malicious tar, another platform only, a stalling
registry) is refused with a clear error and leaves nothing behind."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import stat
import subprocess
import tarfile
import threading
import time
import urllib.request
import warnings
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

import pytest

import warren
from conftest import CLI

TOOLS = ("umoci", "skopeo", "docker-registry")
pytestmark = pytest.mark.skipif(any(shutil.which(t) is None for t in TOOLS),
                                reason="needs umoci, skopeo and docker-registry (scripts/setup.sh installs them)")

LONG_NAME = "n" * 200


def run(*argv: str, timeout: float = 120) -> str:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{argv}: {r.stderr}"
    return r.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("images")


@pytest.fixture(scope="module")
def registry(work: Path) -> Iterable[Tuple[str, Path]]:
    """docker-registry on a loopback port with its storage under `work`."""
    port = free_port()
    storage = work / "registry"
    storage.mkdir()
    cfg = work / "registry.yml"
    cfg.write_text(f"""version: 0.1
log: {{level: warn}}
storage:
  filesystem: {{rootdirectory: {storage}}}
  delete: {{enabled: true}}
http: {{addr: "127.0.0.1:{port}"}}
""")
    log = open(work / "registry.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(["docker-registry", "serve", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (work / "registry.log").read_text()
            time.sleep(0.1)
        yield f"127.0.0.1:{port}", storage
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _add_tar_layer(layout: Path, tag: str, members: List[Tuple[tarfile.TarInfo, bytes]], work: Path) -> None:
    tar = work / f"layer-{tag}-{time.monotonic_ns()}.tar"
    with tarfile.open(tar, "w", format=tarfile.PAX_FORMAT) as t:
        for ti, data in members:
            t.addfile(ti, io.BytesIO(data) if data else None)
    run("umoci", "raw", "add-layer", "--image", f"{layout}:{tag}", str(tar))
    tar.unlink()


def _ti(name: str, type_: bytes = tarfile.REGTYPE, mode: int = 0o644, data: bytes = b"") -> Tuple[tarfile.TarInfo, bytes]:
    ti = tarfile.TarInfo(name)
    ti.type = type_
    ti.mode = mode
    ti.size = len(data)
    ti.mtime = 1_700_000_000
    return ti, data


@pytest.fixture(scope="module")
def layout(work: Path) -> Path:
    """An OCI layout with tag t1 (3 layers: a busybox tree with a hardlink,
    xattr, setuid file and long name; a layer removing and changing files
    (umoci's whiteouts); an opaque dir and a whiteout of a dir) and tag t2 =
    t1 plus one layer."""
    lay = work / "oci"
    run("umoci", "init", "--layout", str(lay))
    run("umoci", "new", "--image", f"{lay}:t1")
    b = work / "bundle"
    run("umoci", "unpack", "--image", f"{lay}:t1", str(b))
    r = b / "rootfs"
    for d in ("bin", "etc", "tmp", "proc", "dev", "sys", "d/sub", "opq/keep", "gone-dir/x", "work"):
        (r / d).mkdir(parents=True, exist_ok=True)
    os.chmod(r / "tmp", 0o1777)
    shutil.copy2("/bin/busybox", r / "bin/busybox")
    for applet in ("sh", "cat", "ls", "stat", "find", "env", "pwd", "id"):
        os.symlink("busybox", r / "bin" / applet)
    (r / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/work:/bin/sh\n")
    (r / "etc/group").write_text("root:x:0:\nuser:x:1000:\n")
    (r / "d/sub/f").write_text("first\n")
    os.link(r / "d/sub/f", r / "d/hard")
    (r / "d/suid").write_bytes(b"#!/bin/sh\n")
    os.chmod(r / "d/suid", 0o4755)
    (r / "d/sgid").write_bytes(b"x")
    os.chmod(r / "d/sgid", 0o2711)
    (r / "d" / LONG_NAME).write_text("long\n")
    (r / "d/xattr").write_text("x\n")
    os.setxattr(r / "d/xattr", "user.warren", b"test-value")
    os.chown(r / "work", 1000, 1000)
    (r / "opq/a").write_text("a\n")
    (r / "opq/keep/b").write_text("b\n")
    (r / "gone").write_text("gone\n")
    (r / "gone-dir/x/y").write_text("y\n")
    (r / "escape").symlink_to("../../../etc/shadow")  # symlink text may climb: it resolves in the sandbox
    (r / "abs").symlink_to("/etc/passwd")
    run("umoci", "repack", "--refresh-bundle", "--image", f"{lay}:t1", str(b))
    # Layer 2 (umoci's diff): a removed file, a changed file, a new file.
    (r / "gone").unlink()
    (r / "d/sub/f").write_text("second\n")  # d/hard is the same inode: both change
    (r / "new").write_text("new\n")
    run("umoci", "repack", "--image", f"{lay}:t1", str(b))
    # Layer 3: an opaque dir (hides opq/a and opq/keep/b, adds opq/c) and a
    # whiteout of a whole dir.
    _add_tar_layer(lay, "t1", [_ti("opq/", tarfile.DIRTYPE, 0o755), _ti("opq/.wh..wh..opq"),
                               _ti("opq/c", data=b"c\n"), _ti(".wh.gone-dir")], work)
    run("umoci", "config", "--image", f"{lay}:t1", "--config.env", "FOO=bar", "--config.env", "PATH=/bin",
        "--config.workingdir", "/work", "--config.user", "1000:1000", "--config.cmd", "/bin/sh",
        "--config.exposedports", "8080/tcp")
    # t2: t1 plus one layer (shares t1's).
    run("umoci", "tag", "--image", f"{lay}:t1", "t2")
    _add_tar_layer(lay, "t2", [_ti("t2-only", data=b"t2\n")], work)
    shutil.rmtree(b)
    return lay


@pytest.fixture(scope="module")
def reference(work: Path, layout: Path) -> Path:
    """`umoci unpack` of t1: the tree a sandbox from t1 must show."""
    ref = work / "ref"
    run("umoci", "unpack", "--image", f"{layout}:t1", str(ref))
    return ref / "rootfs"


@pytest.fixture(scope="module")
def pushed(registry, layout: Path) -> Dict[str, str]:
    host, _ = registry
    out = {}
    for tag, repo in (("t1", "test/img:v1"), ("t2", "test/img2:v1")):
        ref = f"{host}/{repo}"
        run("skopeo", "copy", "--dest-tls-verify=false", f"oci:{layout}:{tag}", f"docker://{ref}")
        out[tag] = ref
    return out


# ---------------------------------------------------------------- helpers

# What the runtime mounts over a sandbox's tree (not the image's content).
MOUNTED = {"proc", "dev", "sys", "tmp", "run", "etc/hosts", "etc/hostname", "etc/resolv.conf"}


def tree(root: Path, uid_shift: int = 0) -> Dict[str, tuple]:
    """path -> (type, mode, uid, gid, size, content sha / link target,
    user.* xattrs, hardlink group) of every entry under root, less what
    lies under MOUNTED."""
    out: Dict[str, tuple] = {}
    inodes: Dict[Tuple[int, int], str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == root:
            dirnames[:] = [d for d in dirnames if d not in MOUNTED]
        for name in sorted(dirnames + filenames):
            if str((Path(dirpath) / name).relative_to(root)) in MOUNTED:
                continue
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                content = hashlib.sha256(p.read_bytes()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                content = os.readlink(p)
            else:
                content = ""
            xattrs = tuple(sorted((k, os.getxattr(p, k, follow_symlinks=False))
                                  for k in os.listxattr(p, follow_symlinks=False) if k.startswith("user.")))
            link = ""
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                link = inodes.setdefault((st.st_dev, st.st_ino), rel)
            out[rel] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid - uid_shift,
                        st.st_gid - uid_shift, st.st_size if not stat.S_ISDIR(st.st_mode) else 0, content, xattrs,
                        link)
    return out


def sandbox_tree(sb: warren.Sandbox) -> Dict[str, tuple]:
    """The sandbox's tree seen from the host through its init's root, less
    what the runtime mounts over it (proc, dev, sys, tmp...)."""
    root = Path(f"/proc/{sb.info().init_pid}/root")
    shift = os.lstat(root).st_uid  # the sandbox's uid 0 on the host
    return tree(root, shift)


def assert_same_tree(got: Dict[str, tuple], want: Dict[str, tuple]) -> None:
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    assert not missing and not extra, f"missing {missing[:10]}, extra {extra[:10]}"
    diff = [(k, got[k], want[k]) for k in sorted(want) if got[k][:7] != want[k][:7]]
    assert not diff, f"{len(diff)} entries differ, first: {diff[:3]}"
    # Hardlink groups: the same sets of paths share an inode.
    def groups(t):
        g: Dict[str, set] = {}
        for k, v in t.items():
            if v[7]:
                g.setdefault(v[7], set()).add(k)
        return sorted(sorted(s) for s in g.values())
    assert groups(got) == groups(want)


def store_tmp(layer_store: Path) -> List[str]:
    return sorted(os.listdir(layer_store / "tmp")) if (layer_store / "tmp").exists() else []


def layer_names(client: warren.Client) -> List[str]:
    return sorted(x.name for x in client.layers.list())


# ---------------------------------------------------------------- tests

def test_pull_create_and_compare_with_umoci(client, pushed, reference, layer_store):
    events: List[warren.ImageProgress] = []
    img = client.images.pull(pushed["t1"], progress=events.append, timeout=300)
    assert img.name == pushed["t1"]
    assert len(img.layers) == 3
    assert all(x.layer_name == "base/oci-sha256@" + x.digest.split(":")[1] for x in img.layers)
    assert {e.layer_index for e in events if e.phase == "done"} == {0, 1, 2}
    assert any(e.phase == "fetching" for e in events)
    assert img.config.env == ("FOO=bar", "PATH=/bin") and img.config.workdir == "/work"
    assert img.config.user == "1000:1000" and img.config.cmd == ("/bin/sh",)
    assert img.config.exposed_ports == ("8080/tcp",)
    assert client.images.get(pushed["t1"]) == img
    with client.create(image=img.name) as sb:
        r = sb.exec("echo $FOO; pwd; id -u; cat /d/sub/f /d/hard", timeout=30)
        assert r.exit_code == 0, r.stderr
        assert r.stdout.decode().split() == ["bar", "/work", "1000", "second", "second"]
        want = tree(reference)
        # The reference has every case: whiteouts, an opaque dir, a hardlink,
        # an xattr, setuid/setgid bits, a long name, a uid-owned dir.
        assert "gone" not in want and "gone-dir" not in want and "new" in want
        assert "opq/a" not in want and "opq/keep" not in want and "opq/c" in want
        assert want["d/hard"][7] == want["d/sub/f"][7] != ""
        assert want["d/xattr"][6] == (("user.warren", b"test-value"),)
        assert want["d/suid"][1] == 0o4755 and want["d/sgid"][1] == 0o2711
        assert "d/" + LONG_NAME in want and want["work"][2:4] == (1000, 1000)
        assert_same_tree(sandbox_tree(sb), want)
        assert client.images.get(img.name).in_use == 1
        with pytest.raises(warren.FailedPrecondition) as ei:
            client.images.remove(img.name)
        assert "in use" in ei.value.details
    # The request overrides the image's defaults.
    with client.create(image=img.name, env={"FOO": "x"}, workdir="/", user="root") as sb:
        r = sb.exec("echo $FOO $PATH; pwd; id -u", timeout=30)
        assert r.stdout.decode().split() == ["x", "/bin", "/", "0"]
    assert store_tmp(layer_store) == []


def test_shared_layers_are_converted_once(client, pushed):
    first = client.images.pull(pushed["t1"], timeout=300)
    before = layer_names(client)
    events: List[warren.ImageProgress] = []
    second = client.images.pull(pushed["t2"], progress=events.append, timeout=300)
    assert [x.layer for x in second.layers[:3]] == [x.layer for x in first.layers]
    phases = {e.layer_index: e.phase for e in events if e.phase in ("exists", "done")}
    assert phases == {0: "exists", 1: "exists", 2: "exists", 3: "done"}
    assert not any(e.phase == "fetching" and e.layer_index < 3 for e in events)
    after = layer_names(client)
    assert sorted(set(after) - set(before)) == [second.layers[3].layer_name]
    with client.create(image=second.name) as sb:
        assert sb.exec("cat /t2-only", timeout=30).stdout == b"t2\n"


def test_toolset_layer_on_top_of_an_image(client, pushed, work):
    img = client.images.pull(pushed["t1"], timeout=300)
    tool = work / "tool"
    (tool / "opt/tool").mkdir(parents=True)
    (tool / "opt/tool/run").write_text("tool\n")
    try:
        client.layers.get("toolset/imgtest@1")
    except warren.NotFound:
        client.layers.build("toolset/imgtest@1", dir=str(tool))
    with client.create(image=img.name, layers=["toolset/imgtest@1"]) as sb:
        assert sb.info().layer_names[-1] == "toolset/imgtest@1"
        assert sb.exec("cat /opt/tool/run /d/sub/f", timeout=30).stdout == b"tool\nsecond\n"


def test_import_oci_layout_and_docker_archive(client, layout, reference, work, layer_store):
    pulled_names = set(layer_names(client))
    img = client.images.import_(str(layout), ref_name="t1", name="local/layout:t1", timeout=300)
    assert img.name == "local/layout:t1" and img.source == f"OCI layout {layout}"
    # Same blobs as the registry's: nothing new converted.
    assert {x.layer_name for x in img.layers} <= pulled_names
    archive = work / "t1-docker.tar"
    run("skopeo", "copy", f"oci:{layout}:t1", f"docker-archive:{archive}:local/archive:v1")
    img2 = client.images.import_(str(archive), timeout=300)
    # skopeo writes the tag fully qualified into manifest.json's RepoTags.
    assert img2.name == "docker.io/local/archive:v1" and len(img2.layers) == 3
    assert img2.source == f"docker archive {archive}"
    with client.create(image=img2.name) as sb:
        assert sb.exec("pwd", timeout=30).stdout == b"/work\n"
        assert_same_tree(sandbox_tree(sb), tree(reference))
    names = [i.name for i in client.images.list()]
    assert "docker.io/local/archive:v1" in names and "local/layout:t1" in names
    assert store_tmp(layer_store) == []


def test_concurrent_imports_convert_each_layer_once(client, work):
    """Two imports of one new image at once: both succeed, with the same
    layers, each converted once."""
    lay = make_layout(work / "concurrent", [tar_bytes([_ti("c1", data=b"1" * 5000)]),
                                            tar_bytes([_ti("c2", data=b"2" * 5000)])])
    before = set(layer_names(client))
    results: Dict[int, object] = {}

    def one(i: int) -> None:
        try:
            results[i] = client.images.import_(str(lay), name=f"conc/img:{i}", timeout=120)
        except Exception as e:  # noqa: BLE001 - reported by the assert below
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(isinstance(r, warren.Image) for r in results.values()), results
    a, b = results[0], results[1]
    assert [x.layer for x in a.layers] == [x.layer for x in b.layers]
    assert len(set(layer_names(client)) - before) == 2
    client.images.remove("conc/img:0")
    client.images.remove("conc/img:1")
    assert set(layer_names(client)) == before


def test_async_client_pull_with_coroutine_progress(daemon, pushed):
    async def main() -> Tuple[warren.Image, List[str]]:
        phases: List[str] = []

        async def progress(p: warren.ImageProgress) -> None:
            phases.append(p.phase)

        async with warren.AsyncClient("unix:" + str(daemon.socket)) as c:
            img = await c.images.pull(pushed["t1"], progress=progress, timeout=300)
            assert img.name in [i.name for i in await c.images.list()]
            return img, phases

    img, phases = asyncio.run(main())
    assert len(img.layers) == 3 and set(phases) <= {"fetching", "converting", "done", "exists"} and phases


def test_remove_keeps_shared_layers(client, pushed):
    a = client.images.pull(pushed["t1"], timeout=300)
    b = client.images.pull(pushed["t2"], timeout=300)
    client.images.remove(b.name)
    names = set(layer_names(client))
    assert b.layers[3].layer_name not in names
    assert {x.layer_name for x in a.layers} <= names
    with pytest.raises(warren.NotFound):
        client.images.get(b.name)


def test_cli_pull_ls_inspect_create_rm(daemon, client, registry, layout, work):
    host, _ = registry
    ref = f"{host}/test/cli:v1"
    run("skopeo", "copy", "--dest-tls-verify=false", f"oci:{layout}:t2", f"docker://{ref}")
    addr = "unix:" + str(daemon.socket)

    def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run([str(CLI), "--addr", addr, *args], capture_output=True, text=True, timeout=300)
        assert not check or p.returncode == 0, f"warren {args} -> {p.returncode}: {p.stderr}"
        return p

    p = cli("image", "pull", ref, "--name", "cli/img:1")
    assert p.stdout.split()[0] == "cli/img:1"
    progress = p.stderr.splitlines()
    assert any(line.startswith("[4/4] ") and line.endswith((" done", " exists")) for line in progress), progress
    assert any(line.startswith("[1/4] ") for line in progress), progress
    assert "cli/img:1" in cli("image", "ls").stdout
    info = json.loads(cli("image", "inspect", "cli/img:1").stdout)
    assert info["config"]["workdir"] == "/work" and len(info["layers"]) == 4
    sid = cli("create", "--image", "cli/img:1").stdout.strip()
    try:
        assert cli("exec", sid, "--", "cat", "/t2-only").stdout == "t2\n"
        p = cli("image", "rm", "cli/img:1", check=False)
        assert p.returncode == 1 and "FAILED_PRECONDITION" in p.stderr
    finally:
        cli("rm", sid)
    cli("image", "rm", "cli/img:1")
    p = cli("image", "inspect", "cli/img:1", check=False)
    assert p.returncode == 1 and "NOT_FOUND" in p.stderr


@pytest.fixture(scope="module")
def tls_registry(work: Path) -> Iterable[Tuple[str, Path]]:
    """docker-registry over HTTPS (a certificate of a CA made here) with
    basic auth (htpasswd, bcrypt): user "alice", password "s3cret"."""
    with warnings.catch_warnings():  # crypt is deprecated; it is the stdlib's only bcrypt (for htpasswd)
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # noqa: PLC0415

    d = work / "tls"
    d.mkdir()
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=warren-test-ca",
        "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", str(d / "srv.key"),
        "-out", str(d / "srv.csr"))
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("openssl", "x509", "-req", "-in", str(d / "srv.csr"), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
        "-CAcreateserial", "-days", "2", "-extfile", str(d / "ext"), "-out", str(d / "srv.pem"))
    (d / "htpasswd").write_text("alice:" + crypt.crypt("s3cret", crypt.mksalt(crypt.METHOD_BLOWFISH)) + "\n")
    port = free_port()
    (d / "storage").mkdir()
    cfg = d / "registry.yml"
    cfg.write_text(f"""version: 0.1
log: {{level: warn}}
storage:
  filesystem: {{rootdirectory: {d / "storage"}}}
http:
  addr: "127.0.0.1:{port}"
  tls: {{certificate: {d / "srv.pem"}, key: {d / "srv.key"}}}
auth:
  htpasswd: {{realm: warren-test, path: {d / "htpasswd"}}}
""")
    log = open(d / "registry.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(["docker-registry", "serve", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while subprocess.run(["curl", "-s", "-o", "/dev/null", "--cacert", str(d / "ca.pem"),
                              f"https://127.0.0.1:{port}/v2/"], timeout=5).returncode != 0:
            assert proc.poll() is None and time.monotonic() < deadline, (d / "registry.log").read_text()
            time.sleep(0.2)
        yield f"127.0.0.1:{port}", d
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_https_with_ca_file_and_basic_auth(client, tls_registry, layout):
    host, d = tls_registry
    ref = f"{host}/secure/img:v1"
    run("skopeo", "copy", "--dest-cert-dir", str(d / "certs"), "--dest-tls-verify=false", "--dest-creds",
        "alice:s3cret", f"oci:{layout}:t1", f"docker://{ref}")
    ca = str(d / "ca.pem")
    with pytest.raises(warren.Unauthenticated) as ei:
        client.images.pull(ref, ca_file=ca, timeout=120)
    assert "basic auth" in ei.value.details
    with pytest.raises(warren.Unauthenticated):
        client.images.pull(ref, ca_file=ca, username="alice", password="wrong", timeout=120)
    with pytest.raises(warren.FailedPrecondition) as ei:  # TLS without our CA: the system CAs do not know it
        client.images.pull(ref, username="alice", password="s3cret", ca_file="/etc/ssl/certs/ca-certificates.crt",
                           timeout=120)
    assert "TLS" in ei.value.details
    img = client.images.pull(ref, ca_file=ca, username="alice", password="s3cret", timeout=120)
    assert len(img.layers) == 3 and img.source == f"registry {ref}"


# ---------------------------------------------------------------- bad input

def _blob(layout: Path, data: bytes) -> Dict:
    h = hashlib.sha256(data).hexdigest()
    (layout / "blobs/sha256" / h).write_bytes(data)
    return {"digest": "sha256:" + h, "size": len(data)}


def make_layout(dest: Path, layer_tars: List[bytes], platforms: List[str] = ("linux/amd64",),
                gz: bool = True) -> Path:
    """A hand-made OCI layout: one manifest per platform over the same
    layers, in an image index that index.json names "bad". The layers are
    gzip media type: gz=False takes layer_tars as the (compressed) blobs."""
    (dest / "blobs/sha256").mkdir(parents=True)
    (dest / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    manifests = []
    for p in platforms:
        os_, arch = p.split("/")
        cfg = _blob(dest, json.dumps({"os": os_, "architecture": arch, "config": {},
                                      "rootfs": {"type": "layers", "diff_ids": []}}).encode())
        layers = [dict(_blob(dest, gzip.compress(t, mtime=0) if gz else t),
                       mediaType="application/vnd.oci.image.layer.v1.tar+gzip")
                  for t in layer_tars]
        man = _blob(dest, json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                                      "config": dict(cfg, mediaType="application/vnd.oci.image.config.v1+json"),
                                      "layers": layers}).encode())
        manifests.append(dict(man, mediaType="application/vnd.oci.image.manifest.v1+json",
                              platform={"os": os_, "architecture": arch}))
    inner = _blob(dest, json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                                    "manifests": manifests}).encode())
    top = dict(inner, mediaType="application/vnd.oci.image.index.v1+json",
               annotations={"org.opencontainers.image.ref.name": "bad"})
    (dest / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [top]}))
    return dest


def tar_bytes(members: List[Tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for ti, data in members:
            t.addfile(ti, io.BytesIO(data) if data else None)
    return buf.getvalue()


@pytest.fixture()
def nothing_left(client, layer_store):
    before = (layer_names(client), [i.name for i in client.images.list()], store_tmp(layer_store))
    yield
    assert (layer_names(client), [i.name for i in client.images.list()], store_tmp(layer_store)) == before


def test_tampered_blob_is_rejected(client, registry, layout, work, nothing_left):
    host, storage = registry
    lay = work / "tamper"
    good = tar_bytes([_ti("ok", data=b"fine\n")])
    evil = tar_bytes([_ti("ok2", data=b"x" * 1000)])
    make_layout(lay, [good, evil])
    ref = f"{host}/test/tamper:v1"
    run("skopeo", "copy", "--dest-tls-verify=false", f"oci:{lay}:bad", f"docker://{ref}")
    # Flip bytes of the second layer's blob in the registry's storage.
    digest = hashlib.sha256(gzip.compress(evil, mtime=0)).hexdigest()
    found = list(storage.rglob(f"blobs/sha256/{digest[:2]}/{digest}/data"))
    assert len(found) == 1, "layer blob not found in the registry storage"
    data = bytearray(found[0].read_bytes())
    data[-10] ^= 0xFF
    found[0].write_bytes(bytes(data))
    with pytest.raises(warren.DataLoss) as ei:
        client.images.pull(ref, timeout=120)
    assert "digest mismatch" in ei.value.details and digest in ei.value.details


@pytest.mark.parametrize("members,named", [
    ([_ti("ok", data=b"1"), _ti("../evil", data=b"x")], "../evil"),
    ([_ti("dev/null", tarfile.CHRTYPE, 0o666)], "dev/null"),
    ([_ti("target", data=b"t"), (lambda t: (setattr(t[0], "linkname", "../../etc/passwd"), t)[1])(
        _ti("hl", tarfile.LNKTYPE))], "hl"),
    ([_ti("/etc/evil", data=b"x")], "/etc/evil"),
    ([_ti("abshl", tarfile.LNKTYPE, 0o644)], "abshl"),  # linkname set below: /etc/passwd
    ([_ti("lnk", tarfile.SYMTYPE, 0o777), _ti("lnk/evil", data=b"x")], "lnk/evil"),  # lnk -> /etc
    ([_ti("dev/sda", tarfile.BLKTYPE, 0o660)], "dev/sda"),
])
def test_malicious_layer_is_rejected(client, work, members, named, nothing_left):
    for ti, _ in members:
        if ti.name == "abshl":
            ti.linkname = "/etc/passwd"
        elif ti.name == "lnk":
            ti.linkname = "/etc"
    lay = make_layout(work / f"evil-{time.monotonic_ns()}", [tar_bytes([_ti("fine", data=b"ok")]),
                                                              tar_bytes(members)])
    with pytest.raises(warren.InvalidArgument) as ei:
        client.images.import_(str(lay), name="evil:1", timeout=120)
    assert named in ei.value.details


@pytest.mark.parametrize("cut", ["tar", "gzip"])
def test_truncated_layer_is_rejected(client, work, cut, nothing_left):
    """A layer cut short: its tar ends inside a file's data (in a whole
    gzip stream), or its gzip stream ends early (the blob's digest is of the
    cut bytes, so only the conversion can tell)."""
    tar = tar_bytes([_ti("whole", data=b"w"), _ti("big", data=os.urandom(300_000))])
    blob = gzip.compress(tar[:len(tar) // 2], mtime=0) if cut == "tar" else gzip.compress(tar, mtime=0)[:200_000]
    lay = make_layout(work / f"trunc-{cut}", [gzip.compress(tar_bytes([_ti("fine", data=b"ok")]), mtime=0), blob],
                      gz=False)
    with pytest.raises(warren.InvalidArgument) as ei:
        client.images.import_(str(lay), name="trunc:1", timeout=120)
    assert "truncated" in ei.value.details.lower(), ei.value.details
    assert '"big"' in ei.value.details or cut == "gzip", ei.value.details


def test_other_platform_only(client, registry, work, nothing_left):
    lay = make_layout(work / "arm", [tar_bytes([_ti("f", data=b"1")])], platforms=["linux/arm64", "linux/s390x"])
    with pytest.raises(warren.FailedPrecondition) as ei:
        client.images.import_(str(lay), name="arm:1", timeout=120)
    assert "linux/amd64" in ei.value.details and "linux/arm64" in ei.value.details
    host, _ = registry
    ref = f"{host}/test/arm:v1"
    run("skopeo", "copy", "--all", "--dest-tls-verify=false", f"oci:{lay}:bad", f"docker://{ref}")
    with pytest.raises(warren.FailedPrecondition) as ei:
        client.images.pull(ref, timeout=120)
    assert "linux/s390x" in ei.value.details


def test_stalling_registry(client, nothing_left):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    conns = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])  # accepted, never answered
            except OSError:
                pass

    th = threading.Thread(target=accept, daemon=True)
    th.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(warren.DeadlineExceeded) as ei:
            client.images.pull(f"127.0.0.1:{srv.getsockname()[1]}/x/y:1", stall_timeout_s=2, timeout=60)
        took = time.monotonic() - t0
        assert took < 15, took
        assert "sent nothing for 2 s" in ei.value.details
    finally:
        stop.set()
        th.join(5)
        for c in conns:
            c.close()
        srv.close()
