"""Bearer-token auth (the flow of Docker Hub, GHCR, Harbor...): a registry
that answers 401 with `WWW-Authenticate: Bearer realm=...,service=...,scope=...`
and accepts only a token from that realm. Debian's docker-registry has no
token server of its own, so a small front (a token endpoint that checks
basic credentials, and a /v2/ proxy that checks the token) stands before the
docker-registry of test_images on loopback."""

# ruff: noqa: F811  (the fixtures imported from test_images are parameters here)
from __future__ import annotations

import base64
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import warren
from test_images import (  # noqa: F401 - fixtures used by name
    layout,
    pytestmark,
    registry,
    run,
    work,
)

TOKEN = "tok-" + "5" * 32
BASIC = "Basic " + base64.b64encode(b"alice:s3cret").decode()


class TokenFront(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream = upstream
        self.token_requests: list[tuple[bool, dict]] = []  # (credentials good, query)
        self.challenged = 0  # /v2/ requests answered 401

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: TokenFront

    def log_message(self, *args) -> None:
        pass

    def _send(self, code: int, body: bytes, headers: dict, head: bool = False) -> None:
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _handle(self, head: bool) -> None:
        u = urllib.parse.urlsplit(self.path)
        if u.path == "/token":
            good = self.headers.get("Authorization", "") == BASIC
            self.server.token_requests.append((good, urllib.parse.parse_qs(u.query)))
            if not good:
                return self._send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', {"Content-Type": "application/json"})
            return self._send(200, json.dumps({"token": TOKEN}).encode(), {"Content-Type": "application/json"})
        if not u.path.startswith("/v2/"):
            return self._send(404, b"", {})
        if self.headers.get("Authorization", "") != f"Bearer {TOKEN}":
            self.server.challenged += 1
            parts = u.path[len("/v2/"):].split("/")
            kinds = [i for i, p in enumerate(parts) if p in ("manifests", "blobs")]
            repo = "/".join(parts[:kinds[-1]]) if kinds else ""
            challenge = (f'Bearer realm="http://{self.server.host}/token",service="warren-test",'
                         f'scope="repository:{repo}:pull"')
            return self._send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}',
                              {"WWW-Authenticate": challenge, "Content-Type": "application/json"}, head)
        req = urllib.request.Request(f"http://{self.server.upstream}{self.path}", method="HEAD" if head else "GET",
                                     headers={"Accept": self.headers.get("Accept", "*/*")})
        try:
            r = urllib.request.urlopen(req, timeout=60)
        except urllib.error.HTTPError as e:
            r = e
        with r:
            body = b"" if head else r.read()
            headers = {k: r.headers[k] for k in ("Content-Type", "Docker-Content-Digest") if r.headers.get(k)}
            self._send(r.status, body, headers, head)

    def do_GET(self) -> None:
        self._handle(head=False)

    def do_HEAD(self) -> None:
        self._handle(head=True)


@contextmanager
def token_front(upstream: str) -> Iterator[TokenFront]:
    srv = TokenFront(upstream)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        th.join(10)


def test_bearer_token_flow(client, registry, layout):
    host, _ = registry
    run("skopeo", "copy", "--dest-tls-verify=false", f"oci:{layout}:t1", f"docker://{host}/bearer/img:v1")
    with token_front(host) as front:
        ref = f"{front.host}/bearer/img:v1"
        # No credentials: the token endpoint refuses, and the error says where.
        with pytest.raises(warren.Unauthenticated) as ei:
            client.images.pull(ref, name="bearer/none:1", timeout=120)
        assert f"http://{front.host}/token" in ei.value.details and "401" in ei.value.details
        with pytest.raises(warren.Unauthenticated):
            client.images.pull(ref, name="bearer/wrong:1", username="alice", password="nope", timeout=120)
        # Credentials: a token fetched from the realm for this repo's pull scope.
        img = client.images.pull(ref, name="bearer/img:1", username="alice", password="s3cret", timeout=300)
        assert len(img.layers) == 3 and img.source == f"registry {ref}"
        good = [q for ok, q in front.token_requests if ok]
        assert good and all(q == {"service": ["warren-test"], "scope": ["repository:bearer/img:pull"]} for q in good)
        with client.create(image=img.name) as sb:
            assert sb.exec("cat /d/sub/f", timeout=30).stdout == b"second\n"
        # A ready token: sent from the first request on, no challenge, no token request.
        asked, challenged = len(front.token_requests), front.challenged
        img2 = client.images.pull(ref, name="bearer/ready:1", bearer_token=TOKEN, timeout=300)
        assert [x.layer for x in img2.layers] == [x.layer for x in img.layers]
        assert (len(front.token_requests), front.challenged) == (asked, challenged)
    for name in ("bearer/img:1", "bearer/ready:1"):
        client.images.remove(name)
