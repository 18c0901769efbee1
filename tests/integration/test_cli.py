"""The C++ CLI `warren` end to end against the session's warrend: create,
exec, cp in/out, ls --json, get, rm, layer ls, status, error exit codes."""

import base64
import hashlib
import json
import os
import subprocess

import pytest

import warren
from conftest import CLI


@pytest.fixture(scope="module")
def cli(daemon):
    if not CLI.exists():
        pytest.fail(f"CLI binary not found at {CLI} (build it or set WARREN_CLI)")
    addr = "unix:" + str(daemon.socket)

    def run(*args, input=None, check=True, timeout=120):
        p = subprocess.run([str(CLI), "--addr", addr, *args], input=input,
                           capture_output=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"warren {' '.join(args)} → {p.returncode}: {p.stderr!r}")
        return p

    return run


def test_cli_end_to_end(cli, client, base_layer, tmp_path):
    sid = cli("create", "--layer", base_layer, "--label", "cli=1", "--memory", "512").stdout.decode().strip()
    assert sid and "\n" not in sid
    try:
        info = client.get(sid).cached_info
        assert info.labels == {"cli": "1"} and info.resources.memory_mb == 512

        # exec: a single word is a shell string; raw bytes out; exit code passed through
        p = cli("exec", sid, "--", "printf 'a\\0b\\377'; printf err >&2; exit 3", check=False)
        assert p.returncode == 3
        assert p.stdout == b"a\0b\xff" and p.stderr.endswith(b"err")
        p = cli("exec", sid, "--", "printf", "%s-%s", "x y", "z")
        assert p.stdout == b"x y-z"
        p = cli("exec", "-i", sid, "--", "cat", input=b"from stdin\n")
        assert p.stdout == b"from stdin\n"
        p = cli("--json", "exec", sid, "--", "printf '\\376'; exit 2", check=False)
        j = json.loads(p.stdout)
        assert j["exit_code"] == 2 and base64.b64decode(j["stdout_b64"]) == b"\xfe"

        # cp in and out, byte exact
        src = tmp_path / "in.bin"
        data = os.urandom(3 * (1 << 20) + 7)
        src.write_bytes(data)
        cli("cp", "-p", str(src), f"{sid}:/w/in.bin")
        r = client.get(sid).exec(["sha256sum", "/w/in.bin"], timeout=30)
        assert r.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
        out = tmp_path / "out.bin"
        cli("cp", f"{sid}:/w/in.bin", str(out))
        assert out.read_bytes() == data
        assert cli("cp", f"{sid}:/w/in.bin", "-").stdout == data

        # ls / get
        listed = json.loads(cli("ls", "--json").stdout)["sandboxes"]
        mine = [s for s in listed if s["id"] == sid]
        assert len(mine) == 1 and mine[0]["state"] == "running" and mine[0]["labels"] == {"cli": "1"}
        assert sid in cli("ls").stdout.decode()
        assert json.loads(cli("--json", "get", sid).stdout)["id"] == sid
        assert json.loads(cli("ls", "--json", "--label", "cli=nope").stdout)["sandboxes"] == []
    finally:
        p = cli("rm", sid, check=False)
    assert p.returncode == 0 and sid in p.stdout.decode()
    with pytest.raises(warren.NotFound):
        client.get(sid)
    p = cli("get", sid, check=False)
    assert p.returncode == 1 and b"NOT_FOUND" in p.stderr
    p = cli("rm", sid, check=False)
    assert p.returncode == 1


def test_cli_layers_status_and_usage(cli, daemon, base_layer):
    layers = json.loads(cli("layer", "ls", "--json").stdout)["layers"]
    assert base_layer in [l["name"] for l in layers]
    l = json.loads(cli("--json", "layer", "get", base_layer).stdout)
    assert l["digest"].startswith("sha256:")
    st = json.loads(cli("status", "--json").stdout)
    assert st["node_id"] == daemon.node_id and "container" in st["backends"]
    assert cli("status").stdout  # human form prints something
    p = cli("create", "--no-such-flag", check=False)
    assert p.returncode == 2
    p = cli("create", "--layer", "base/does-not-exist@1", check=False)
    assert p.returncode == 1 and b"NOT_FOUND" in p.stderr
