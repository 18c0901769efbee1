"""The exposure gateway (warrend --expose-gateway, src/net/gateway.h): one
listener reaching any sandbox's exposed port by the request's Host,
PORT-SANDBOX_ID.DOMAIN, on this node or, in a cluster, on the node that
owns the sandbox; the exposure's token is still checked by the exposure.

Two nodes of a real etcd cluster on loopback: the sandbox lives on one, the
request enters through the other's gateway."""

from __future__ import annotations

import http.client
import re
import subprocess
import time
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

import pytest
import warren
from conftest import NODE_PREFIX, WARREND
from test_cluster import ETCD, REFRESH_MS, Etcd, Node, free_port, owner, wait_until

pytestmark = pytest.mark.skipif(ETCD is None, reason="etcd not installed (scripts/setup.sh installs etcd-server)")


def get(gateway_port: int, host: str, token: Optional[str] = None, query: str = "") -> Tuple[int, str]:
    """(status, body) of GET /hello through the gateway with this Host."""
    conn = http.client.HTTPConnection("127.0.0.1", gateway_port, timeout=10)
    try:
        headers = {"Host": host}
        if token:
            headers["X-Warren-Token"] = token
        conn.request("GET", "/hello" + query, headers=headers)
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        conn.close()


def create_on(via: Node, node_id: str, base_layer: str, tries: int = 8) -> warren.Sandbox:
    """A sandbox placed on `node_id` (the cluster places creates over its
    nodes: creates through `via` until one lands there; the others go)."""
    assert via.client is not None
    extra = []
    try:
        for _ in range(tries):
            sb = via.client.create(layers=[base_layer])
            if owner(sb.id) == node_id:
                return sb
            extra.append(sb)
        pytest.fail(f"no create of {tries} landed on {node_id}")
    finally:
        for sb in extra:
            sb.destroy()


def serve_in(sb: warren.Sandbox, port: int) -> None:
    """An HTTP server in the sandbox serving /hello on 127.0.0.1:port."""
    sb.exec(["sh", "-c", "mkdir -p /srv && echo hello from inside > /srv/hello && cd /srv && "
             f"nohup python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 &"], timeout=20)
    probe = ("import socket,sys; s=socket.socket(); s.settimeout(1); "
             f"sys.exit(s.connect_ex(('127.0.0.1', {port})))")
    wait_until(lambda: sb.exec(["python3", "-c", probe], timeout=20).exit_code == 0, 15, "the sandbox's server")


@pytest.fixture(scope="module")
def gw_etcd(test_root: Path) -> Iterable[Etcd]:
    e = Etcd(test_root, "gw-etcd").start()
    yield e
    e.stop()


@pytest.fixture(scope="module")
def gw_nodes(test_root: Path, layer_store: Path, base_layer: str, gw_etcd: Etcd) -> Iterable[Tuple[List[Node], int]]:
    token_file = test_root / "gw.token"
    token_file.write_text("gateway-test-token\n")
    token_file.chmod(0o600)
    gw_port = free_port()
    # Exposing needs the node's sandbox network (a range of the tests' own).
    net = ["--net-dns-upstream", "none", "--sandbox-net"]
    entry = Node(test_root, "gwa", layer_store, gw_etcd, token_file,
                 extra=[*net, "10.213.4.0/24", "--expose-gateway", f"127.0.0.1:{gw_port}"])
    other = Node(test_root, "gwb", layer_store, gw_etcd, token_file, extra=[*net, "10.213.5.0/24"])
    ns = [entry, other]
    try:
        for n in ns:
            n.start()
        wait_until(lambda: {n.node_id for n in ns} <= set(gw_etcd.nodes()), 10, "2 registered nodes")
        time.sleep(2 * REFRESH_MS / 1000)  # each node sees the other
        yield ns, gw_port
    finally:
        for n in ns:
            n.stop()
            # The node's (empty) base nft table outlives it while its state dir
            # is in use (README "Network"): the test's own, dropped here.
            m = re.search(r"nft_table[=\":\s]+\"?(warren_[0-9a-f]{1,4})", n.log_path.read_text(errors="replace"))
            if m:
                subprocess.run(["nft", "delete", "table", "inet", m.group(1)], check=False, capture_output=True)


def test_gateway_reaches_a_sandbox_on_another_node(gw_nodes: Tuple[List[Node], int], base_layer: str) -> None:
    (entry, other), gw = gw_nodes
    assert entry.client is not None and other.client is not None
    with create_on(other, other.node_id, base_layer) as sb:
        serve_in(sb, 8000)
        e = sb.expose(8000)
        host = f"8000-{sb.id}.localhost:{gw}"
        # Through the entry node's gateway, not the owner's address.
        assert get(gw, host, e.token) == (200, "hello from inside\n")
        assert get(gw, host, query=f"?warren_token={e.token}") == (200, "hello from inside\n")
        assert get(gw, host.upper(), e.token) == (200, "hello from inside\n")  # host names ignore case
        status, body = get(gw, host)
        assert status == 401 and "X-Warren-Token" in body, body  # the exposure still wants its token
        status, body = get(gw, f"9000-{sb.id}.localhost:{gw}", e.token)
        assert status == 404 and "no exposed port 9000" in body, body
        # The same sandbox asked through the entry node's own API: the same exposure.
        assert entry.client.get(sb.id).info().exposed == [e]
    status, body = get(gw, host, e.token)
    assert status == 404 and "no sandbox" in body, body  # gone with the sandbox


def test_gateway_serves_its_own_node_and_refuses_other_names(gw_nodes: Tuple[List[Node], int],
                                                              base_layer: str) -> None:
    (entry, _), gw = gw_nodes
    assert entry.client is not None
    with create_on(entry, entry.node_id, base_layer) as sb:
        serve_in(sb, 8000)
        e = sb.expose(8000)
        assert get(gw, f"8000-{sb.id}.localhost", e.token) == (200, "hello from inside\n")
    status, body = get(gw, "example.com", "x")
    assert status == 404 and "PORT-SANDBOX_ID.localhost" in body, body
    status, body = get(gw, f"8000-{entry.node_id}-nosuchid.localhost", "x")
    assert status == 404 and "no sandbox" in body, body
    status, body = get(gw, "8000-nonode-abc.localhost", "x")
    assert status == 404, body  # a node the cluster does not know


def test_bad_gateway_flags_are_clear_errors(test_root: Path, layer_store: Path) -> None:
    for i, (flags, says) in enumerate([
        (["--expose-gateway", "nowhere"], "--expose-gateway 'nowhere': expected IPv4:PORT"),
        (["--expose-gateway", "localhost:8090"], "not an IPv4 address"),
        (["--expose-gateway", "127.0.0.1:0", "--expose-domain", ".localhost"], "expose gateway domain"),
    ]):
        p = subprocess.run([str(WARREND), "--state-dir", str(test_root / f"gwbad{i}"),
                            "--socket", str(test_root / f"gwbad{i}.sock"), "--layer-store", str(layer_store),
                            "--node-id", f"{NODE_PREFIX}gwbad{i}", "--limit-views", "off", *flags],
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert p.returncode != 0, p
        assert says in p.stdout + p.stderr, p.stdout + p.stderr
