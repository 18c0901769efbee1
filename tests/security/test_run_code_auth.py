"""Hole class 6: the SandboxFusion-compatible POST /run_code endpoint
(src/http/run_code_server.cc) as an unauthenticated door.

A web page the node's user opens can post to it (a cross-origin text/plain
post needs no CORS preflight; a DNS-rebinding page becomes same-origin), its
"layers" took host paths and other tenants' snapshot layers, and its limits
were the caller's. Legitimate SandboxFusion clients (JSON posts) keep working.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
from pathlib import Path
from typing import Dict, Iterable, Optional, Tuple

import pytest

import warren
from warren_integration_conftest import Daemon

TOKEN = "s3cret-token-for-run-code-0123456789"
GRPC_TOKEN = "another-token-for-the-grpc-api-9876543210"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def rc(test_root: Path, layer_store: Path, base_layer: str) -> Iterable[Daemon]:
    port = _free_port()
    d = Daemon(test_root, "runcode", layer_store, "rc",
               extra_args=["--http-listen", f"127.0.0.1:{port}", "--fncall-layers", base_layer,
                           "--http-allowed-hosts", "sandbox-fusion.internal,Other.Example",
                           "--run-code-max-memory-mb", "2048", "--run-code-max-timeout-s", "60",
                           "--warm-shells", "0", "--fncall-max-workers", "2"])
    d.port = port
    d.start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def rc_token(test_root: Path, layer_store: Path, base_layer: str) -> Iterable[Daemon]:
    """/run_code with its own token, and the gRPC API on TCP with another."""
    port, grpc_port = _free_port(), _free_port()
    token_file, grpc_token_file = test_root / "run-code-token", test_root / "grpc-token"
    token_file.write_text(TOKEN + "\n")
    grpc_token_file.write_text(GRPC_TOKEN + "\n")
    os.chmod(token_file, 0o600)
    os.chmod(grpc_token_file, 0o600)
    d = Daemon(test_root, "runcode-token", layer_store, "rt",
               extra_args=["--http-listen", f"127.0.0.1:{port}", "--fncall-layers", base_layer,
                           "--http-token-file", str(token_file), "--warm-shells", "0",
                           "--listen", f"127.0.0.1:{grpc_port}", "--token-file", str(grpc_token_file),
                           "--fncall-max-workers", "1"])
    d.port = port
    d.grpc_addr = f"127.0.0.1:{grpc_port}"
    d.start()
    yield d
    d.stop()


def post(d: Daemon, body, headers: Optional[Dict[str, str]] = None, path: str = "/run_code",
         content_type: Optional[str] = "application/json") -> Tuple[int, dict, http.client.HTTPResponse]:
    """POST body (a dict is sent as JSON) with exactly these headers (plus
    Content-Type unless None, and Host unless given); returns (status, JSON body, response)."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=120)
    h = dict(headers or {})
    skip_host = "Host" in h
    conn.putrequest("POST", path, skip_host=skip_host, skip_accept_encoding=True)
    if content_type is not None:
        conn.putheader("Content-Type", content_type)
    for k, v in h.items():
        conn.putheader(k, v)
    conn.putheader("Content-Length", str(len(data)))
    conn.endheaders(data)
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    try:
        out = json.loads(raw)
    except ValueError:
        out = {"raw": raw.decode(errors="replace")}
    return resp.status, out, resp


HELLO = {"code": "print(6*7)", "language": "python"}


def ran(status: int, out: dict) -> bool:
    return status == 200 and (out.get("run_result") or {}).get("stdout") == "42\n"


def test_json_posts_of_sandboxfusion_clients_work(rc):
    for ct in ("application/json", "application/json; charset=utf-8", "Application/JSON"):
        status, out, _ = post(rc, HELLO, content_type=ct)
        assert ran(status, out), (ct, status, out)
        assert out["status"] == "Success"
    # SandboxFusion's own defaults: -1 = "no limit given".
    status, out, _ = post(rc, dict(HELLO, memory_limit_MB=-1, run_timeout=10, compile_timeout=10))
    assert ran(status, out), out
    status, out, _ = post(rc, HELLO, path="/v1/run_code")
    assert ran(status, out), out


@pytest.mark.parametrize("ct", ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                                "multipart/form-data; boundary=x", None])
def test_cross_origin_simple_posts_are_refused(rc, ct):
    """What a web page can send without a CORS preflight: refused before any code runs."""
    status, out, _ = post(rc, HELLO, content_type=ct, headers={"Origin": "http://127.0.0.1:1"})
    assert status in (403, 415) or (ct or "").startswith("multipart/") and status == 400, (status, out)
    assert not ran(status, out)
    status, out, _ = post(rc, HELLO, content_type=ct)
    if (ct or "").startswith("multipart/") and status == 400:
        return  # a JSON body is no multipart body: cpp-httplib refuses it before any handler
    assert status == 415, (status, out)
    assert "Content-Type" in out["message"] and out["status"] == "SandboxError", out


@pytest.mark.parametrize("host", ["evil.example.com", "evil.example.com:{port}", "localhost.evil.example:{port}",
                                  "127.0.0.1.nip.io:{port}"])
def test_a_foreign_host_is_refused(rc, host):
    """DNS rebinding: the page's own name is in Host."""
    h = host.format(port=rc.port)
    status, out, _ = post(rc, HELLO, headers={"Host": h})
    assert status == 421, (h, status, out)
    assert h in out["message"], out


@pytest.mark.parametrize("host", ["localhost:{port}", "127.0.0.1:{port}", "LOCALHOST", "sandbox-fusion.internal:{port}",
                                  "other.example", "10.1.2.3:{port}", "[::1]:{port}"])
def test_expected_hosts_are_served(rc, host):
    status, out, _ = post(rc, HELLO, headers={"Host": host.format(port=rc.port)})
    assert ran(status, out), (host, status, out)


def test_a_foreign_origin_is_refused(rc):
    for origin in ("http://evil.example.com", "null", "https://evil.example:443"):
        status, out, _ = post(rc, HELLO, headers={"Origin": origin})
        assert status == 403 and origin in out["message"], (origin, status, out)
    status, out, _ = post(rc, HELLO, headers={"Origin": f"http://localhost:{rc.port}"})
    assert ran(status, out), out


def test_no_cors_preflight_is_granted(rc):
    conn = http.client.HTTPConnection("127.0.0.1", rc.port, timeout=30)
    conn.request("OPTIONS", "/run_code", headers={"Origin": "http://evil.example.com",
                                                  "Access-Control-Request-Method": "POST",
                                                  "Access-Control-Request-Headers": "content-type"})
    resp = conn.getresponse()
    resp.read()
    assert resp.getheader("Access-Control-Allow-Origin") is None
    conn.close()


@pytest.mark.parametrize("layers", [["/"], ["/etc"], ["/var/cache/warren/rootfs/debian-12"], ["../../"],
                                    ["base/debian-12@1", "/"], ["workspace/"], ["nokind"], [7], "base/debian-12@1"])
def test_layers_are_names_not_paths(rc, base_layer, layers):
    status, out, _ = post(rc, dict(HELLO, code="print(open('/etc/hostname').read())", layers=layers))
    assert status == 400, (layers, status, out)
    assert "layers" in out["message"] and out["run_result"] is None, out


def test_layers_are_limited_to_the_allowed_set(rc, client, base_layer):
    """Another tenant's snapshot layer (or any layer not in --run-code-layers) is refused."""
    with client.create(layers=[base_layer]) as sb:
        sb.files.write("/w/tenant-secret", b"other tenant's data\n", make_parents=True)
        snap = sb.snapshot()
    snap_layer = snap.layer.name
    assert snap_layer.startswith("workspace/snap-"), snap_layer
    rc.client.layers.get(snap_layer)  # the store is shared: the layer is there
    code = "print(open('/w/tenant-secret').read())"
    status, out, _ = post(rc, dict(HELLO, code=code, layers=[base_layer, snap_layer]))
    assert status == 403, (status, out)
    assert snap_layer in out["message"] and "--run-code-layers" in out["message"], out
    assert "other tenant" not in json.dumps(out)
    status, out, _ = post(rc, dict(HELLO, code=code, layers=snap.layers))  # by digest
    assert status in (400, 403) and "other tenant" not in json.dumps(out), (status, out)
    status, out, _ = post(rc, dict(HELLO, layers=[base_layer]))  # allowed: the fncall default
    assert ran(status, out), out
    status, out, _ = post(rc, dict(HELLO, layers=[base_layer.split("@")[0] + "@2"]))
    assert status == 403, out  # only the allowed version
    client.layers.remove(snap_layer)


@pytest.mark.parametrize("field,value", [("memory_limit_MB", 4096), ("memory_limit_MB", 10 ** 9),
                                         ("memory_limit_MB", 2 ** 40), ("run_timeout", 61),
                                         ("run_timeout", 1e9), ("compile_timeout", 3600)])
def test_limits_are_capped_by_the_nodes(rc, field, value):
    status, out, _ = post(rc, dict(HELLO, **{field: value}))
    assert status == 400, (field, value, status, out)
    msg = out["message"]
    assert field in msg and "maximum" in msg and ("2048" in msg or "60" in msg), msg
    assert str(int(value)) in msg.replace("e+", "") or f"{value:g}" in msg, msg


def test_limits_within_the_caps_are_served(rc):
    status, out, _ = post(rc, dict(HELLO, memory_limit_MB=2048, run_timeout=60, compile_timeout=1.5))
    assert ran(status, out), out


def test_bearer_token(rc_token):
    status, out, resp = post(rc_token, HELLO)
    assert status == 401 and "Bearer" in out["message"], (status, out)
    assert resp.getheader("WWW-Authenticate") == "Bearer"
    for bad in ("Bearer wrong", "Bearer " + TOKEN + "x", TOKEN, "Basic " + TOKEN):
        status, out, _ = post(rc_token, HELLO, headers={"Authorization": bad})
        assert status == 403, (bad, status, out)
    status, out, _ = post(rc_token, HELLO, headers={"Authorization": "Bearer " + TOKEN})
    assert ran(status, out), out
    # --http-token-file's token, not the gRPC API's.
    status, out, _ = post(rc_token, HELLO, headers={"Authorization": "Bearer " + GRPC_TOKEN})
    assert status == 403, out
    # The token does not replace the other checks.
    status, out, _ = post(rc_token, HELLO, content_type="text/plain", headers={"Authorization": "Bearer " + TOKEN})
    assert status == 415, out


def test_grpc_fncall_over_tcp_names_layers_not_host_paths(rc_token, base_layer):
    """The FnCall gRPC service's twin of the /run_code hole: a TCP caller's
    token grants the API, not host directories as a call's root."""
    with warren.Client(rc_token.grpc_addr, token=GRPC_TOKEN) as c:
        for layers in (["/"], [base_layer, "/etc"]):
            with pytest.raises(warren.PermissionDenied) as ei:
                c.fncall("print(open('/etc/hostname').read())", layers=layers, timeout=60)
            assert "unix socket" in str(ei.value), ei.value
        with pytest.raises(warren.PermissionDenied):
            c.fncall_batch([warren.FnCallRequest(code="print(1)"),
                            warren.FnCallRequest(code="print(2)", layers=["/"])])
        assert c.fncall("print(6*7)", layers=[base_layer], timeout=60).stdout == b"42\n"
