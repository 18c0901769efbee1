"""Unit tests of the SDK against an in-process fake warrend (a Python gRPC
server on a unix socket that records requests and answers scripted
replies). They check what the SDK sends and how it maps answers; the real
daemon is tested by tests/integration."""

import io
import os
import shutil
import tempfile
import threading
from concurrent import futures

import grpc
import pytest

import warren
from warren._proto import warren_pb2 as pb
from warren._proto import warren_pb2_grpc as pb_grpc


class Fake(pb_grpc.SandboxesServicer, pb_grpc.FilesServicer, pb_grpc.LayersServicer,
           pb_grpc.NodeServicer):
    def __init__(self):
        self.requests = []
        self.metadata = []
        self.fail = None  # (grpc.StatusCode, message) for the next call
        self.exec_reply = pb.ExecResult()
        self.read_chunks = []
        self.lock = threading.Lock()

    def _record(self, req, ctx):
        with self.lock:
            self.requests.append(req)
            self.metadata.append(dict(ctx.invocation_metadata()))
        if self.fail:
            code, msg = self.fail
            self.fail = None
            ctx.abort(code, msg)

    def Create(self, req, ctx):
        self._record(req, ctx)
        return pb.Sandbox(id="n0-abc", backend=req.backend, state=pb.SANDBOX_STATE_RUNNING,
                          resources=req.resources, labels=req.labels, job=req.job)

    def Get(self, req, ctx):
        self._record(req, ctx)
        return pb.Sandbox(id=req.id, state=pb.SANDBOX_STATE_RUNNING)

    def List(self, req, ctx):
        self._record(req, ctx)
        return pb.ListSandboxesResponse(sandboxes=[pb.Sandbox(id="n0-1"), pb.Sandbox(id="n0-2")])

    def Destroy(self, req, ctx):
        self._record(req, ctx)
        return pb.DestroySandboxResponse()

    def Exec(self, req, ctx):
        self._record(req, ctx)
        with self.lock:
            self.metadata[-1]["__remaining"] = ctx.time_remaining()
        return self.exec_reply

    def Write(self, it, ctx):
        msgs = list(it)
        self._record(msgs, ctx)
        return pb.WriteFileResponse(bytes_written=sum(len(m.data) for m in msgs))

    def Read(self, req, ctx):
        self._record(req, ctx)
        for c in self.read_chunks:
            if isinstance(c, tuple):
                ctx.abort(*c)
            yield pb.ReadFileChunk(data=c)

    def Stat(self, req, ctx):
        self._record(req, ctx)
        return pb.FileInfo(name=b"\xff\xfeabc", path=b"/w/\xff\xfeabc", type=pb.FILE_TYPE_REGULAR,
                           size=3, mode=0o644)

    def ListDir(self, req, ctx):
        self._record(req, ctx)
        return pb.ListDirResponse(entries=[pb.FileInfo(name=b"d", type=pb.FILE_TYPE_DIRECTORY)])

    def Mkdir(self, req, ctx):
        self._record(req, ctx)
        return pb.Empty()

    def Remove(self, req, ctx):
        self._record(req, ctx)
        return pb.Empty()

    def Rename(self, req, ctx):
        self._record(req, ctx)
        return pb.Empty()

    def Build(self, it, ctx):
        msgs = list(it)
        self._record(msgs, ctx)
        return pb.Layer(digest="sha256:" + "0" * 64, name=msgs[0].name)

    def Status(self, req, ctx):
        self._record(req, ctx)
        return pb.NodeStatus(node_id="n0", cgroup_version="v1", cpus=2)


@pytest.fixture()
def fake():
    d = tempfile.mkdtemp()
    sock = os.path.join(d, "fake.sock")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    f = Fake()
    pb_grpc.add_SandboxesServicer_to_server(f, server)
    pb_grpc.add_FilesServicer_to_server(f, server)
    pb_grpc.add_LayersServicer_to_server(f, server)
    pb_grpc.add_NodeServicer_to_server(f, server)
    server.add_insecure_port("unix:" + sock)
    server.start()
    f.sock = sock
    yield f
    server.stop(None).wait()
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture()
def client(fake):
    with warren.Client(fake.sock, token="s3cret") as c:
        yield c


def test_addr_from_env_and_default(monkeypatch):
    monkeypatch.delenv("WARREN_ADDR", raising=False)
    assert warren.Client().addr == "unix:/run/warren/warrend.sock"
    monkeypatch.setenv("WARREN_ADDR", "127.0.0.1:7000")
    assert warren.Client().addr == "127.0.0.1:7000"


def test_token_sent_as_bearer(fake, client):
    client.status()
    assert fake.metadata[-1]["authorization"] == "Bearer s3cret"


def test_token_from_env(fake, monkeypatch):
    monkeypatch.setenv("WARREN_TOKEN", "tok")
    with warren.Client(fake.sock) as c:
        c.status()
    assert fake.metadata[-1]["authorization"] == "Bearer tok"


def test_no_token_no_header(fake, monkeypatch):
    monkeypatch.delenv("WARREN_TOKEN", raising=False)
    with warren.Client("unix:" + fake.sock) as c:
        assert c.status().node_id == "n0"
    assert "authorization" not in fake.metadata[-1]


@pytest.mark.parametrize("code", [c for c in grpc.StatusCode if c != grpc.StatusCode.OK])
def test_every_status_code_maps_to_its_own_class(fake, client, code):
    fake.fail = (code, f"boom {code.name}")
    with pytest.raises(warren.WarrenError) as ei:
        client.status()
    assert ei.value.code == code
    assert ei.value.details == f"boom {code.name}"
    assert type(ei.value).code == code  # the class itself, not a generic one
    assert ei.value.retryable == (code in (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                           grpc.StatusCode.UNAVAILABLE))


def test_error_classes_are_distinct():
    classes = {warren.errors.from_rpc_error(_E(c)).__class__
               for c in grpc.StatusCode if c != grpc.StatusCode.OK}
    assert len(classes) == len(grpc.StatusCode) - 1


class _E(grpc.RpcError):
    def __init__(self, c):
        self._c = c

    def code(self):
        return self._c

    def details(self):
        return "x"


def test_unreachable_daemon_is_unavailable(tmp_path):
    with warren.Client(str(tmp_path / "nothing.sock")) as c:
        with pytest.raises(warren.Unavailable):
            c.status(timeout=5)


def test_create_request(fake, client):
    sb = client.create(layers=["base/debian-12@1", "workspace/x"], cpu=0.5, memory_mb=256,
                       disk_mb=1024, pids=64, env={"A": "1", "B": b"\xff"}, workdir="/w",
                       user="1000:1000", hostname="h", labels={"k": "v"}, ttl_s=60, job="j")
    req = fake.requests[-1]
    assert sb.id == "n0-abc" and sb.cached_info.state == "running"
    assert req.backend == "container"
    assert list(req.layers) == ["base/debian-12@1", "workspace/x"]
    assert req.resources.cpu_millis == 500 and req.resources.memory_mb == 256
    assert req.resources.disk_mb == 1024 and req.resources.pids == 64
    assert dict(req.env) == {"A": b"1", "B": b"\xff"}
    assert (req.workdir, req.user, req.hostname, req.job, req.ttl_s) == ("/w", "1000:1000", "h", "j", 60)
    assert dict(req.labels) == {"k": "v"}


@pytest.mark.parametrize("kwargs,word", [
    (dict(memory_mb=-1), "memory_mb"), (dict(disk_mb=-5), "disk_mb"), (dict(pids=-1), "pids"),
    (dict(memory_mb=1 << 40), "memory_mb"), (dict(cpu=-1), "cpu"), (dict(cpu=0), "cpu"),
    (dict(ttl_s=-1), "ttl_s"), (dict(memory_mb=1.5), "memory_mb")])
def test_create_rejects_bad_limits_before_sending(fake, client, kwargs, word):
    with pytest.raises(warren.InvalidArgument, match=word):
        client.create(layers=["base/debian-12"], **kwargs)
    assert fake.requests == []


def test_context_manager_destroys(fake, client):
    with client.create(layers=["base/x"]) as sb:
        pass
    assert isinstance(fake.requests[-1], pb.DestroySandboxRequest)
    assert fake.requests[-1].id == sb.id


def test_exec_shell_argv_stdin_timeout(fake, client):
    sb = client.get("n0-abc")
    fake.exec_reply = pb.ExecResult(exit_code=3, stdout=b"ok \xff\xfe\x8d end\n",
                                    stderr=b"err \xc3\x28\n", stdout_total_bytes=11,
                                    duration_ns=1_500_000_000)
    r = sb.exec("echo hi", timeout=2.5, stdin="abc", env={"X": "y"}, cwd="/w", user="nobody")
    req = fake.requests[-1]
    assert req.shell == b"echo hi" and list(req.argv) == []
    assert req.timeout_ms == 2500 and req.stdin == b"abc" and dict(req.env) == {"X": b"y"}
    assert (req.cwd, req.user) == ("/w", "nobody")
    # RPC deadline = timeout + grace + margin, not unlimited and not just timeout.
    remaining = fake.metadata[-1]["__remaining"]
    assert 2.5 + 0.5 < remaining <= 2.5 + 0.5 + warren.client.EXEC_DEADLINE_MARGIN_S + 0.5
    assert r.exit_code == 3 and not r.ok
    assert r.stdout == b"ok \xff\xfe\x8d end\n"
    assert r.text == "ok \ufffd\ufffd\ufffd end\n"
    assert r.stderr_text == "err \ufffd(\n"
    assert r.duration_s == pytest.approx(1.5)

    sb.exec(["printf", b"\xff", "x y"])
    req = fake.requests[-1]
    assert list(req.argv) == [b"printf", b"\xff", b"x y"] and req.shell == b""
    assert req.timeout_ms == 0 and req.stdin == b""
    assert fake.metadata[-1]["__remaining"] > 1e9  # no timeout → no deadline


@pytest.mark.parametrize("kwargs", [dict(timeout=0), dict(timeout=-1), dict(output_cap=0),
                                    dict(output_cap=(256 << 20) + 1)])
def test_exec_rejects_bad_arguments(fake, client, kwargs):
    sb = warren.Sandbox(client, client.get("n0-abc").cached_info)
    n = len(fake.requests)
    with pytest.raises(warren.InvalidArgument):
        sb.exec("true", **kwargs)
    assert len(fake.requests) == n


def test_write_streams_1mib_chunks(fake, client):
    sb = client.get("n0-abc")
    data = os.urandom(3 * (1 << 20) + 1)
    assert sb.files.write("/w/f", data, mode=0o600, make_parents=True) == len(data)
    msgs = fake.requests[-1]
    assert [len(m.data) for m in msgs] == [1 << 20] * 3 + [1]
    assert msgs[0].path == b"/w/f" and msgs[0].mode == 0o600 and msgs[0].make_parents
    assert msgs[0].sandbox_id == "n0-abc"
    assert all(m.path == b"" for m in msgs[1:])
    assert b"".join(m.data for m in msgs) == data
    # file object, read lazily
    sb.files.write("/w/g", io.BytesIO(data))
    assert b"".join(m.data for m in fake.requests[-1]) == data
    # empty file still sends the header
    assert sb.files.write("/w/e", b"") == 0
    assert len(fake.requests[-1]) == 1 and fake.requests[-1][0].path == b"/w/e"


def test_read_and_errors_while_streaming(fake, client):
    sb = client.get("n0-abc")
    fake.read_chunks = [b"a" * 10, b"\x00\xff"]
    assert sb.files.read(b"/w/\xff") == b"a" * 10 + b"\x00\xff"
    assert fake.requests[-1].path == b"/w/\xff"
    fake.read_chunks = [b"x", (grpc.StatusCode.NOT_FOUND, "/nope: no such file")]
    with pytest.raises(warren.NotFound, match="/nope"):
        sb.files.read("/nope")


def test_stat_list_names(fake, client):
    sb = client.get("n0-abc")
    st = sb.files.stat("/w/x")
    assert st.name_bytes == b"\xff\xfeabc" and os.fsencode(st.name) == st.name_bytes
    assert st.is_file and st.size == 3 and st.mode == 0o644
    assert [e.name for e in sb.files.list("/w")] == ["d"]
    assert sb.files.list("/w")[0].is_dir
    assert sb.files.exists("/w/x")
    fake.fail = (grpc.StatusCode.NOT_FOUND, "no")
    assert not sb.files.exists("/w/y")


def test_mkdir_remove_rename(fake, client):
    sb = client.get("n0-abc")
    sb.files.mkdir("/a/b", parents=True)
    assert fake.requests[-1].parents and fake.requests[-1].path == b"/a/b"
    sb.files.remove("/a", recursive=True)
    assert fake.requests[-1].recursive
    sb.files.rename("/a", "/b")
    r = fake.requests[-1]
    assert getattr(r, "from") == b"/a" and r.to == b"/b"


def test_layers_build_tar_streams(fake, client, tmp_path):
    tar = tmp_path / "l.tar"
    data = os.urandom((1 << 20) + 5)
    tar.write_bytes(data)
    layer = client.layers.build("workspace/x@1", tar=str(tar))
    msgs = fake.requests[-1]
    assert layer.name == "workspace/x@1" and layer.digest.startswith("sha256:")
    assert msgs[0].name == "workspace/x@1" and msgs[0].tar_chunk == b""
    assert b"".join(m.tar_chunk for m in msgs[1:]) == data
    assert max(len(m.tar_chunk) for m in msgs) <= 1 << 20
    client.layers.build("base/y@1", dir=str(tmp_path))
    assert fake.requests[-1][0].source_dir == str(tmp_path)
    with pytest.raises(warren.InvalidArgument):
        client.layers.build("base/y@1")


def test_list_returns_sandboxes(fake, client):
    sbs = client.list(labels={"a": "b"}, job="j")
    assert [s.id for s in sbs] == ["n0-1", "n0-2"]
    assert dict(fake.requests[-1].labels) == {"a": "b"} and fake.requests[-1].job == "j"


def test_async_client(fake):
    import asyncio

    async def main():
        async with warren.AsyncClient(fake.sock) as c:
            st = await c.status()
            assert st.node_id == "n0"
            async with await c.create(layers=["base/x"], memory_mb=64) as sb:
                fake.exec_reply = pb.ExecResult(exit_code=0, stdout=b"ok\n")
                rs = await asyncio.gather(*[sb.exec("echo ok", timeout=5) for _ in range(10)])
                assert [r.stdout for r in rs] == [b"ok\n"] * 10
                fake.read_chunks = [b"ab", b"cd"]
                assert [c async for c in sb.files.read_stream("/f")] == [b"ab", b"cd"]
                assert await sb.files.write("/f", b"xyz") == 3
            assert isinstance(fake.requests[-1], pb.DestroySandboxRequest)
            fake.fail = (grpc.StatusCode.NOT_FOUND, "gone")
            with pytest.raises(warren.NotFound):
                await c.get("n0-x")

    asyncio.run(main())


def test_close_racing_a_background_start_never_joins_an_unstarted_thread(monkeypatch):
    """A Background thread is tracked and started under one lock: a close()
    (WaitBackground) on another thread in between once raised "cannot join
    thread before it is started" (a kill -9 of the daemon under concurrent
    creates, whose abandons go to the background while the client closes)."""
    from warren import _core

    class Owner:
        def __init__(self):
            self._background = set()
            self._background_lock = threading.Lock()

    owner = Owner()
    real_start = threading.Thread.start
    between = threading.Event()
    waited = []

    def slow_start(self):
        if self.name == "warren-background":
            between.set()
            waiter.join(0.3)  # the closing thread runs while this one is tracked but not started
        real_start(self)

    def close():
        between.wait(5)
        try:
            _core.run_sync(_gen(_core.WaitBackground(owner, 5.0)))
            waited.append("ok")
        except RuntimeError as e:
            waited.append(e)

    def _gen(effect):
        yield effect

    def work():
        yield _core.Sleep(0.01)

    monkeypatch.setattr(threading.Thread, "start", slow_start)
    waiter = threading.Thread(target=close)
    real_start(waiter)
    _core.run_sync(_gen(_core.Background(owner, work())))
    waiter.join(10)
    assert waited == ["ok"], waited
