"""What harness adapters needed from the native SDK: HOME in exec
environments, stderr merged into stdout in order, a unary exec killed when
its client goes away, and directory trees moved as one tar stream."""

import io
import os
import tarfile
import time

import grpc
import pytest

import warren
from warren import _tardir
from warren._requests import _exec_request


def test_home_is_the_users_home(sandbox):
    assert sandbox.exec("echo $HOME").stdout == b"/root\n"
    # Debian's nobody: /etc/passwd says /nonexistent.
    assert sandbox.exec("echo $HOME", user="nobody").stdout == b"/nonexistent\n"
    assert sandbox.exec("echo $HOME", user="65534").stdout == b"/nonexistent\n"
    # A uid without a passwd entry gets "/".
    assert sandbox.exec("echo $HOME", user="4242").stdout == b"/\n"
    # Given env wins.
    assert sandbox.exec("echo $HOME", env={"HOME": "/work"}).stdout == b"/work\n"
    # Python's expanduser (what harness code calls) sees it too.
    r = sandbox.exec(["python3", "-c", "import os; print(os.path.expanduser('~'))"])
    assert r.stdout == b"/root\n", r


def test_merge_stderr_keeps_write_order(sandbox):
    cmd = "for i in 1 2 3; do echo out$i; echo err$i >&2; done"
    r = sandbox.exec(cmd, merge_stderr=True)
    assert r.exit_code == 0
    assert r.stdout == b"out1\nerr1\nout2\nerr2\nout3\nerr3\n"
    assert r.stderr == b""
    r = sandbox.exec(cmd)
    assert r.stdout == b"out1\nout2\nout3\n" and r.stderr == b"err1\nerr2\nerr3\n"

    chunks = list(sandbox.exec_stream(cmd, merge_stderr=True))
    assert {c.stream for c in chunks} == {"stdout"}
    assert b"".join(c.data for c in chunks) == b"out1\nerr1\nout2\nerr2\nout3\nerr3\n"

    p = sandbox.spawn(cmd, merge_stderr=True)
    p.wait(timeout=10)
    out = p.output()
    assert out.stdout == b"out1\nerr1\nout2\nerr2\nout3\nerr3\n" and out.stderr == b""


def _alive(sandbox, pid: int) -> bool:
    return sandbox.exec(f"kill -0 {pid}").exit_code == 0


def test_unary_exec_dies_with_its_client(client, sandbox):
    req, _ = _exec_request(sandbox.id, "echo $$ > /tmp/exec.pid; exec sleep 120")
    fut = client._sandboxes.Exec.future(req, metadata=client._metadata)
    pid = 0
    for _ in range(100):
        r = sandbox.exec("cat /tmp/exec.pid")
        if r.exit_code == 0 and r.stdout.strip():
            pid = int(r.stdout)
            break
        time.sleep(0.05)
    assert pid and _alive(sandbox, pid)
    fut.cancel()
    with pytest.raises(grpc.FutureCancelledError):
        fut.result()
    deadline = time.monotonic() + 10
    while _alive(sandbox, pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(sandbox, pid), "the exec's command outlived its cancelled client"


def _make_tree(root: str, n: int) -> None:
    for i in range(n):
        d = os.path.join(root, f"d{i % 10}", f"e{i % 7}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i}.txt"), "w") as f:
            f.write(f"file {i}\n")
    with open(os.path.join(root, "run.sh"), "w") as f:
        f.write("#!/bin/sh\necho ran\n")
    os.chmod(os.path.join(root, "run.sh"), 0o755)
    os.symlink("d0/e0/f0.txt", os.path.join(root, "link"))


def test_upload_and_download_dir_round_trip(sandbox, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    n = 2000
    _make_tree(str(src), n)
    t0 = time.monotonic()
    size = sandbox.files.upload_dir(str(src), "/work/tree")
    t_tar = time.monotonic() - t0
    assert size > 0
    r = sandbox.exec("find /work/tree -type f | wc -l; cat /work/tree/link; /work/tree/run.sh; "
                     "readlink /work/tree/link; ls -A /tmp | grep -c warren-upload || true")
    assert r.stdout.split(b"\n")[:5] == [str(n + 1).encode(), b"file 0", b"ran", b"d0/e0/f0.txt", b"0"], r

    # The same files one by one, for comparison.
    files = [os.path.join(dp, f) for dp, _, fs in os.walk(src) for f in fs][:200]
    t0 = time.monotonic()
    for i, p in enumerate(files):
        with open(p, "rb") as f:
            sandbox.files.write(f"/work/one/{i}", f.read(), make_parents=True)
    t_one = (time.monotonic() - t0) * n / len(files)
    print(f"\n{n} files: one tar {t_tar:.3f}s; one by one (extrapolated from {len(files)}) {t_one:.3f}s")

    dst = tmp_path / "dst"
    count = sandbox.files.download_dir("/work/tree", str(dst))
    assert count >= n + 1
    assert (dst / "d3" / "e6" / "f1203.txt").read_text() == "file 1203\n"
    assert os.readlink(dst / "link") == "d0/e0/f0.txt"
    assert os.stat(dst / "run.sh").st_mode & 0o100
    assert sum(len(fs) for _, _, fs in os.walk(dst)) == n + 2  # files + run.sh + link
    assert sandbox.exec("ls -A /tmp | grep -c warren-download || true").stdout == b"0\n"


def test_download_refuses_links_leaving_the_destination(sandbox, tmp_path):
    sandbox.exec("mkdir -p /work/evil/sub && echo x > /work/evil/sub/ok && ln -s /etc /work/evil/abs")
    dst = tmp_path / "dst"
    with pytest.raises(warren.InvalidArgument, match="'abs'"):
        sandbox.files.download_dir("/work/evil", str(dst))
    assert not (dst / "sub").exists(), "nothing is written before every entry was checked"
    sandbox.exec("rm /work/evil/abs && ln -s ../../../../etc/passwd /work/evil/sub/up")
    with pytest.raises(warren.InvalidArgument, match="sub/up"):
        sandbox.files.download_dir("/work/evil", str(dst))
    with pytest.raises(warren.NotFound, match="/work/nothing"):
        sandbox.files.download_dir("/work/nothing", str(dst))


def _tar(entries) -> io.BytesIO:
    f = io.BytesIO()
    with tarfile.open(fileobj=f, mode="w") as tf:
        for info, data in entries:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    f.seek(0)
    return f


def test_unpack_refuses_escaping_entries(tmp_path):
    # A tar from a sandbox is untrusted: these cannot come from GNU tar -c, but
    # a sandbox can hand any bytes to the client.
    up = tarfile.TarInfo("../outside")
    up.size = 1
    absolute = tarfile.TarInfo("/tmp/abs")
    absolute.size = 1
    link = tarfile.TarInfo("l")
    link.type = tarfile.SYMTYPE
    link.linkname = "ok"
    below = tarfile.TarInfo("l/x")
    below.size = 1
    dev = tarfile.TarInfo("dev")
    dev.type = tarfile.CHRTYPE
    hard = tarfile.TarInfo("h")
    hard.type = tarfile.LNKTYPE
    hard.linkname = "../../etc/passwd"
    for entries, name in [([(up, b"x")], "../outside"), ([(absolute, b"x")], "/tmp/abs"),
                          ([(link, None), (below, b"x")], "l/x"), ([(dev, None)], "dev"),
                          ([(hard, None)], "h")]:
        with pytest.raises(warren.InvalidArgument, match=name.replace(".", r"\.")):
            _tardir.unpack(_tar(entries), str(tmp_path / "d"))
    assert not (tmp_path / "outside").exists()
    assert os.listdir(tmp_path / "d") == []


def test_upload_error_names_the_entry(sandbox, tmp_path):
    src = tmp_path / "src"
    (src / "locked").mkdir(parents=True)
    (src / "locked" / "f.txt").write_text("x")
    sandbox.exec("mkdir -p /srv/dst/locked && chown nobody /srv/dst && chmod 755 /srv/dst/locked")
    with pytest.raises(warren.FailedPrecondition, match=r"locked/f\.txt"):
        sandbox.files.upload_dir(str(src), "/srv/dst", user="nobody")
    with pytest.raises(warren.InvalidArgument, match="not a local directory"):
        sandbox.files.upload_dir(str(tmp_path / "missing"), "/srv/dst")
