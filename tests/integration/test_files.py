"""A09–A11 of CASES.md (files API), plus the structured calls (stat, list,
mkdir, remove, rename) with byte-exact names."""

import hashlib
import io
import os
import uuid
import zipfile

import pytest

import warren


def test_a09_path_traversal(sandbox):
    tag = uuid.uuid4().hex[:8]
    host_checks = [f"/tmp/pwned-{tag}", "/etc/cron.d/x", f"/tmp/%2fpwned-{tag}"]
    before = {p: os.path.lexists(p) for p in host_checks}
    # Symlinks planted in the sandbox must be followed as the sandbox sees them.
    r = sandbox.exec("mkdir -p /w && ln -s / /w/root && ln -s /tmp /w/tmplink && "
                     "ln -s ../../../../../../tmp /w/rel", timeout=30)
    assert r.exit_code == 0, r.stderr
    attempts = [
        f"../../tmp/pwned-{tag}",
        f"/w/../../../../tmp/pwned-{tag}",
        f"..%2f..%2ftmp%2fpwned-{tag}",
        "/etc/cron.d/x",
        f"/w/root/tmp/pwned-{tag}",
        f"/w/tmplink/pwned-{tag}",
        f"/w/rel/pwned-{tag}",
    ]
    for i, p in enumerate(attempts):
        try:
            sandbox.files.write(p, f"pwned {i}\n", make_parents=True)
        except warren.WarrenError as e:
            assert not isinstance(e, (warren.Internal, warren.Unknown)), e
    for p, existed in before.items():
        if not existed:
            assert not os.path.lexists(p), f"{p} was created on the host"
    # ".." stopped at the sandbox's "/": the writes landed inside it.
    r = sandbox.exec(f"cat /tmp/pwned-{tag}", timeout=30)
    assert r.exit_code == 0 and r.stdout.startswith(b"pwned ")
    assert sandbox.files.read(f"/../../../tmp/pwned-{tag}") == r.stdout
    assert sandbox.files.exists("/etc/cron.d/x")
    # Reads resolve inside the sandbox too: /w/root/etc/hostname is the
    # sandbox's, never the host's.
    inside = sandbox.exec("cat /etc/hostname", timeout=30).stdout
    assert sandbox.files.read("/w/root/etc/hostname") == inside
    assert sandbox.files.read("/../../etc/hostname") == inside
    st = sandbox.files.stat("/w/root")
    assert st.is_symlink and st.symlink_target == b"/"


SIZES = [1000, 17_000, 19_000, 65535, 65536, 65537, 1_000_000, 100_000_000]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("size", SIZES)
def test_a10_sizes(sandbox, size):
    data = os.urandom(size)
    assert sandbox.files.write(f"/w/f{size}", data, make_parents=True) == size
    r = sandbox.exec(["sha256sum", f"/w/f{size}"], timeout=120)
    assert r.exit_code == 0
    assert r.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
    assert sandbox.files.stat(f"/w/f{size}").size == size
    if size <= 1_000_000:
        assert sandbox.files.read(f"/w/f{size}") == data


class _RandomStream(io.RawIOBase):
    """A file-like object of n pseudo-random bytes, hashed as it is read."""

    def __init__(self, n: int):
        self.left = n
        self.h = hashlib.sha256()
        self.seed = os.urandom(1 << 20)

    def readable(self):
        return True

    def read(self, size=-1):
        n = self.left if size < 0 else min(size, self.left)
        if n <= 0:
            return b""
        chunk = (self.seed * (n // len(self.seed) + 1))[:n]
        self.seed = hashlib.sha256(self.seed[:64]).digest() + self.seed[32:]
        self.left -= n
        self.h.update(chunk)
        return chunk


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a10_one_gigabyte(client, base_layer):
    with client.create(layers=[base_layer], disk_mb=2048, memory_mb=4096) as sb:
        src = _RandomStream(1_000_000_000)
        assert sb.files.write("/w/big", src, make_parents=True) == 1_000_000_000
        assert sb.files.stat("/w/big").size == 1_000_000_000
        r = sb.exec("sha256sum /w/big", timeout=600)
        assert r.exit_code == 0
        assert r.stdout.split()[0].decode() == src.h.hexdigest()
        # And back out, streamed.
        h, n = hashlib.sha256(), 0
        for chunk in sb.files.read_stream("/w/big"):
            assert len(chunk) <= warren.CHUNK_SIZE
            h.update(chunk)
            n += len(chunk)
        assert n == 1_000_000_000 and h.hexdigest() == src.h.hexdigest()


def test_a10_failed_write_names_path_and_reason(client, base_layer):
    with client.create(layers=[base_layer], disk_mb=64) as sb:
        with pytest.raises(warren.ResourceExhausted) as ei:
            sb.files.write("/w/too-big", os.urandom(100 << 20), make_parents=True)
        assert "/w/too-big" in ei.value.details
        assert "space" in ei.value.details.lower()
        # The sandbox keeps working, and the partial file is not passed off as written.
        assert sb.exec("echo ok", timeout=30).stdout == b"ok\n"
        st = sb.files.stat("/w/too-big") if sb.files.exists("/w/too-big") else None
        assert st is None or st.size < (100 << 20)
        sb.files.write("/w/small", b"x")  # space comes back once the failed write is gone
    with client.create(layers=[base_layer]) as sb:
        with pytest.raises(warren.WarrenError) as ei:
            sb.files.write("/etc/passwd/child", b"x")
        assert "/etc/passwd/child" in ei.value.details
        assert isinstance(ei.value, (warren.FailedPrecondition, warren.InvalidArgument,
                                     warren.NotFound)), ei.value
        with pytest.raises(warren.NotFound) as ei:
            sb.files.read("/no/such/file")
        assert "/no/such/file" in ei.value.details


def test_a11_binary_reads_byte_exact(sandbox):
    data = bytes(range(256)) * 4096
    sandbox.files.write("/w/all.bin", data, make_parents=True)
    back = sandbox.files.read("/w/all.bin")
    assert hashlib.sha256(back).digest() == hashlib.sha256(data).digest()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.txt", "hello\n")
        z.writestr("b.bin", os.urandom(100_000))
        z.writestr("dir/c", data[:70_000])
    zdata = buf.getvalue()
    sandbox.files.write("/w/a.zip", zdata)
    assert sandbox.files.read("/w/a.zip") == zdata
    r = sandbox.exec("python3 -c \"import zipfile; print(zipfile.ZipFile('/w/a.zip').testzip())\"",
                     timeout=30)
    assert r.stdout == b"None\n", r.stderr
    # offset/length reads
    assert sandbox.files.read("/w/all.bin", offset=255, length=3) == b"\xff\x00\x01"


def test_structured_calls_byte_exact_names(sandbox):
    files = sandbox.files
    files.mkdir("/w/d/e", parents=True)
    files.mkdir("/w/d/e", parents=True)  # -p: no error when it exists
    with pytest.raises(warren.AlreadyExists):
        files.mkdir("/w/d/e")
    with pytest.raises(warren.NotFound):
        files.mkdir("/w/nope/x")
    r = sandbox.exec("touch \"/w/d/$(printf 'n\\377\\001')\"", timeout=30)
    assert r.exit_code == 0
    files.write(b"/w/d/\xfe.txt", b"abc", mode=0o600)
    names = {e.name_bytes: e for e in files.list("/w/d")}
    assert set(names) == {b"e", b"n\xff\x01", b"\xfe.txt"}
    assert names[b"e"].is_dir and names[b"\xfe.txt"].is_file
    assert names[b"\xfe.txt"].size == 3 and names[b"\xfe.txt"].mode == 0o600
    assert os.fsencode(names[b"n\xff\x01"].name) == b"n\xff\x01"
    assert names[b"\xfe.txt"].uid == 0 and names[b"\xfe.txt"].gid == 0
    st = sandbox.exec("stat -c '%u %g %a %s' \"/w/d/$(printf '\\376').txt\"", timeout=30)
    assert st.stdout == b"0 0 600 3\n"
    files.rename(b"/w/d/\xfe.txt", "/w/d/e/moved")
    assert not files.exists(b"/w/d/\xfe.txt")
    assert files.read("/w/d/e/moved") == b"abc"
    with pytest.raises(warren.FailedPrecondition):
        files.remove("/w/d")
    files.remove("/w/d", recursive=True)
    assert not files.exists("/w/d")
    with pytest.raises(warren.NotFound):
        files.stat("/w/d")
    files.write("/w/new/deep/f", b"1", make_parents=True)
    assert files.read("/w/new/deep/f") == b"1"
    with pytest.raises(warren.NotFound):
        files.write("/w/missing-parent/f", b"1")


def test_write_and_mkdir_on_the_sandboxes_own_tmpfs(sandbox):
    """/dev/shm is a tmpfs mounted inside the sandbox's user namespace: host
    root has no mapping there (creating a file as host root fails with
    EOVERFLOW); the file API creates as the sandbox's root instead."""
    sandbox.files.write("/dev/shm/q", b"hi\n")
    sandbox.files.mkdir("/dev/shm/d/e", parents=True)
    sandbox.files.write("/dev/shm/d/e/f", b"x" * 70000)
    r = sandbox.exec("cat /dev/shm/q; stat -c '%u:%g %a' /dev/shm/q /dev/shm/d/e; wc -c < /dev/shm/d/e/f",
                     timeout=30)
    assert r.exit_code == 0, r
    assert r.stdout == b"hi\n0:0 644\n0:0 755\n70000\n"
    assert sandbox.files.read("/dev/shm/d/e/f") == b"x" * 70000
    sandbox.files.remove("/dev/shm/d", recursive=True)
    assert sandbox.exec("ls -A /dev/shm", timeout=30).stdout == b"q\n"


def test_write_takes_an_iterable_and_reports_its_errors(sandbox):
    big = bytes(range(256)) * 8192  # 2 MiB: split across chunks
    n = sandbox.files.write("/w/gen.bin", (p for p in [b"head:", "text:", big]), make_parents=True)
    assert n == 10 + len(big)
    assert sandbox.files.read("/w/gen.bin") == b"head:text:" + big

    def broken():
        yield b"partial"
        raise ValueError("the producer failed")

    with pytest.raises(ValueError, match="the producer failed"):
        sandbox.files.write("/w/broken.bin", broken())
    assert not sandbox.files.exists("/w/broken.bin")  # nothing half-written
    with pytest.raises(warren.InvalidArgument, match="got int"):
        sandbox.files.write("/w/x", 42)
    with pytest.raises(warren.InvalidArgument, match="pieces, got int"):
        sandbox.files.write("/w/x", [b"a", 1])
    assert not sandbox.files.exists("/w/x")
