"""The unmodified `e2b` SDK from PyPI (pinned below) against warrend's
E2B-compatible front end (--e2b-listen, src/e2b): sandbox lifecycle over
E2B's REST API and commands over envd's Connect process service, with the
SDK configured only through its documented environment variables
(E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from conftest import NODE_PREFIX, Daemon

E2B_PIN = "e2b==2.63.0"
API_KEY = "e2b_warren_test_key_0123456789"


def _ensure_e2b() -> None:
    """Installs the pinned SDK into this venv when missing; skips (with the
    reason) only when PyPI cannot be reached."""
    try:
        from importlib.metadata import version

        import e2b  # noqa: F401

        if version("e2b") == E2B_PIN.split("==")[1]:
            return
    except ImportError:
        pass
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", E2B_PIN],
                       check=False, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        out = r.stdout + r.stderr
        if any(s in out for s in ("Could not find a version", "NewConnectionError", "Temporary failure",
                                  "Network is unreachable", "Max retries exceeded")):
            pytest.skip(f"PyPI unreachable, cannot install {E2B_PIN}: {out.strip()[-300:]}")
        pytest.fail(f"pip install {E2B_PIN} failed:\n{out}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def e2b_daemon(test_root: Path, layer_store: Path, base_layer: str) -> Iterable[Daemon]:
    _ensure_e2b()
    port = _free_port()
    keys = test_root / "e2b-keys"
    keys.write_text(f"# test keys\n{API_KEY}\n")
    templates = test_root / "e2b-templates.json"
    templates.write_text(json.dumps({"base": [base_layer], "debian": [base_layer]}))
    d = Daemon(test_root, "e2b", layer_store, NODE_PREFIX + "e",
               extra_args=["--e2b-listen", f"127.0.0.1:{port}", "--e2b-api-keys", str(keys),
                           "--e2b-templates", str(templates)]).start()
    d.e2b_url = f"http://127.0.0.1:{port}"
    yield d
    assert d.stop() == 0, d.log_tail()


@pytest.fixture()
def e2b_env(e2b_daemon: Daemon, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("E2B_API_URL", e2b_daemon.e2b_url)
    monkeypatch.setenv("E2B_SANDBOX_URL", e2b_daemon.e2b_url)
    monkeypatch.setenv("E2B_API_KEY", API_KEY)
    monkeypatch.delenv("E2B_DEBUG", raising=False)
    import e2b

    return e2b


@pytest.fixture()
def sbx(e2b_env):
    sb = e2b_env.Sandbox.create(timeout=120, metadata={"suite": "e2b"})
    yield sb
    with contextlib.suppress(e2b_env.SandboxException):
        sb.kill()


def test_create_is_a_warren_sandbox_and_kill_removes_it(e2b_env, e2b_daemon: Daemon):
    sb = e2b_env.Sandbox.create(timeout=60, metadata={"owner": "t1"})
    info = e2b_daemon.client.get(sb.sandbox_id).info()
    assert info.labels["e2b.template"] == "base"
    assert info.labels["e2b.meta.owner"] == "t1"
    assert 0 < info.expires_at_ns / 1e9 - time.time() <= 61
    got = sb.get_info()
    assert got.sandbox_id == sb.sandbox_id and got.metadata == {"owner": "t1"} and got.template_id == "base"
    assert sb.kill() is True
    assert all(s.id != sb.sandbox_id for s in e2b_daemon.client.list())
    assert e2b_env.Sandbox.kill(sb.sandbox_id) is False  # gone: E2B's 404


def test_commands_run_output_exit_env_cwd(sbx, e2b_env):
    r = sbx.commands.run("printf 'out\\n'; printf 'err' >&2")
    assert (r.stdout, r.stderr, r.exit_code) == ("out\n", "err", 0)
    with pytest.raises(e2b_env.CommandExitException) as ei:
        sbx.commands.run("echo nope >&2; exit 7")
    assert ei.value.exit_code == 7 and ei.value.stderr == "nope\n"
    assert sbx.commands.run("echo $FOO", envs={"FOO": "bar baz"}).stdout == "bar baz\n"
    sbx.commands.run("mkdir -p /tmp/wd")
    assert sbx.commands.run("pwd", cwd="/tmp/wd").stdout == "/tmp/wd\n"
    # Bytes beyond one data event, exactly.
    big = sbx.commands.run("head -c 600000 /dev/zero | tr '\\0' x").stdout
    assert big == "x" * 600000


def test_create_env_vars_reach_commands(e2b_env):
    sb = e2b_env.Sandbox.create(envs={"FROM_CREATE": "yes"}, timeout=60)
    try:
        assert sb.commands.run("echo $FROM_CREATE").stdout == "yes\n"
    finally:
        sb.kill()


def test_command_timeout_kills_it(sbx, e2b_env):
    t0 = time.monotonic()
    with pytest.raises(e2b_env.TimeoutException):
        sbx.commands.run("sleep 30", timeout=1)
    assert time.monotonic() - t0 < 10
    # warren killed it too (not only the client giving up).
    deadline = time.monotonic() + 10
    while any("sleep 30" in " ".join(p.args) for p in sbx.commands.list()):
        assert time.monotonic() < deadline, "the timed-out command still runs"
        time.sleep(0.2)


def test_background_list_and_kill(sbx):
    h = sbx.commands.run("sleep 300", background=True)
    assert h.pid > 0
    procs = sbx.commands.list()
    assert any(p.pid == h.pid and "sleep 300" in " ".join(p.args) for p in procs)
    assert sbx.commands.kill(h.pid) is True
    deadline = time.monotonic() + 10
    while any(p.pid == h.pid for p in sbx.commands.list()):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert sbx.commands.kill(h.pid) is False  # not found any more


def test_list_by_metadata_and_set_timeout(e2b_env, e2b_daemon: Daemon):
    a = e2b_env.Sandbox.create(timeout=60, metadata={"grp": "a"})
    b = e2b_env.Sandbox.create(timeout=60, metadata={"grp": "b"})
    try:
        found = e2b_env.Sandbox.list(query=e2b_env.SandboxQuery(metadata={"grp": "a"})).next_items()
        assert [s.sandbox_id for s in found] == [a.sandbox_id]
        a.set_timeout(600)
        exp = e2b_daemon.client.get(a.sandbox_id).info().expires_at_ns / 1e9
        assert 590 < exp - time.time() <= 601
    finally:
        a.kill()
        b.kill()


def test_wrong_api_key_is_401(e2b_env):
    with pytest.raises(e2b_env.AuthenticationException) as ei:
        e2b_env.Sandbox.create(api_key="e2b_wrong_key")
    assert "401" in str(ei.value)


def test_unknown_template_names_it(e2b_env):
    with pytest.raises(e2b_env.SandboxException) as ei:
        e2b_env.Sandbox.create("no-such-template")
    assert "no-such-template" in str(ei.value) and "--e2b-templates" in str(ei.value)


def test_envd_call_needs_the_sandbox_access_token(sbx, e2b_env):
    """Another sandbox's token (or none) does not reach this sandbox."""
    import urllib.request

    req = urllib.request.Request(
        os.environ["E2B_SANDBOX_URL"] + "/process.Process/List", data=b"{}", method="POST",
        headers={"Content-Type": "application/json", "E2b-Sandbox-Id": sbx.sandbox_id,
                 "X-Access-Token": "0" * 48})
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(req, timeout=10)
    assert ei.value.code == 401
    assert json.loads(ei.value.read())["code"] == "unauthenticated"


def test_files_round_trip_list_rename_remove(sbx, e2b_env):
    data = bytes(range(256)) * 4096 + b"\n\x00end"  # 1 MiB of every byte value
    info = sbx.files.write("/tmp/e2b/dir/blob.bin", data)  # parents created
    assert info.path == "/tmp/e2b/dir/blob.bin" and info.name == "blob.bin"
    assert bytes(sbx.files.read("/tmp/e2b/dir/blob.bin", format="bytes")) == data
    assert sbx.commands.run("sha256sum < /tmp/e2b/dir/blob.bin").stdout.split()[0] == \
        hashlib.sha256(data).hexdigest()
    sbx.files.write("/tmp/e2b/dir/t.txt", "héllo\n")
    assert sbx.files.read("/tmp/e2b/dir/t.txt") == "héllo\n"
    entries = {e.name: e for e in sbx.files.list("/tmp/e2b/dir")}
    assert set(entries) == {"blob.bin", "t.txt"}
    assert entries["blob.bin"].size == len(data) and entries["blob.bin"].type == e2b_env.FileType.FILE
    assert sbx.files.make_dir("/tmp/e2b/new/sub") is True
    assert sbx.files.make_dir("/tmp/e2b/new/sub") is False  # already there
    assert sbx.files.get_info("/tmp/e2b/new/sub").type == e2b_env.FileType.DIR
    moved = sbx.files.rename("/tmp/e2b/dir/t.txt", "/tmp/e2b/new/t2.txt")
    assert moved.path == "/tmp/e2b/new/t2.txt"
    assert sbx.files.exists("/tmp/e2b/new/t2.txt") and not sbx.files.exists("/tmp/e2b/dir/t.txt")
    deep = {e.path for e in sbx.files.list("/tmp/e2b", depth=2)}
    assert "/tmp/e2b/new/sub" in deep and "/tmp/e2b/dir/blob.bin" in deep
    sbx.files.remove("/tmp/e2b/new")
    assert not sbx.files.exists("/tmp/e2b/new")
    with pytest.raises(e2b_env.FileNotFoundException):
        sbx.files.read("/tmp/e2b/missing")


def test_file_paths_stay_inside_the_sandbox(sbx, test_root: Path):
    """'..' stops at the sandbox's root and symlinks resolve inside it: the
    host's files are neither read nor written."""
    host_file = test_root / "e2b-host-secret"
    host_file.write_text("host only")
    sbx.files.write("/tmp/x", "in sandbox")
    sbx.files.write(f"/../../../..{host_file}", "written from the sandbox")
    assert host_file.read_text() == "host only"
    assert sbx.commands.run(f"cat {host_file}").stdout == "written from the sandbox"
    sbx.commands.run(f"ln -s {host_file.parent} /tmp/up")
    assert sbx.files.read(f"/tmp/up/{host_file.name}") == "written from the sandbox"
    assert "host only" not in sbx.files.read(f"/../{host_file}")


def test_pause_then_connect_resumes(sbx, e2b_env, e2b_daemon: Daemon):
    sbx.commands.run("echo kept > /tmp/state")
    assert sbx.pause() is True
    assert e2b_daemon.client.get(sbx.sandbox_id).info().state == "paused"
    assert sbx.get_info().state == e2b_env.SandboxState.PAUSED
    assert sbx.pause() is False  # already paused
    again = e2b_env.Sandbox.connect(sbx.sandbox_id, timeout=300)
    assert e2b_daemon.client.get(sbx.sandbox_id).info().state == "running"
    assert again.commands.run("cat /tmp/state").stdout == "kept\n"
    exp = e2b_daemon.client.get(sbx.sandbox_id).info().expires_at_ns / 1e9
    assert 290 < exp - time.time() <= 301


def test_stdin_connect_and_user(sbx):
    h = sbx.commands.run("cat; echo done", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "line one\n")
    sbx.commands.close_stdin(h.pid)
    r = h.wait()
    assert r.stdout == "line one\ndone\n" and r.exit_code == 0
    bg = sbx.commands.run("sleep 1; echo late", background=True)
    again = sbx.commands.connect(bg.pid)
    assert again.wait().stdout == "late\n"
    assert sbx.commands.run("whoami", user="root").stdout == "root\n"


def test_output_lost_to_a_slow_reader_is_an_error(sbx, e2b_env):
    """More output than the 4 MiB buffer while the client reads slowly: the
    stream ends with an error naming the dropped bytes, never with a gap."""
    def slow(_chunk: str) -> None:
        time.sleep(0.05)

    with pytest.raises(e2b_env.SandboxException) as ei:
        sbx.commands.run("head -c 48000000 /dev/zero | tr '\\0' y", on_stdout=slow, timeout=120)
    assert "dropped" in str(ei.value)
