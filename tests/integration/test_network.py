"""Sandbox network (src/net): egress policy, NAT, isolation, leftovers.

The tests build their own "internet" on this machine: a network namespace
behind a veth pair whose addresses (documentation ranges 203.0.113.0/24,
198.51.100.0/24, and the metadata address 169.254.169.254) are routed into
it from the host. One HTTP server in it answers on all of them. Nothing
leaves the machine."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import pytest
import warren
from conftest import NODE_PREFIX, Daemon

ALLOWED = "203.0.113.10"  # allowed by the tests' policies
DENIED = "198.51.100.10"  # inside an allowed range, but denied
OTHER = "198.51.100.20"  # never allowed
METADATA = "169.254.169.254"
PORT = 8080
TRANSIT_HOST, TRANSIT_NS = "198.18.213.1", "198.18.213.2"
ROUTED = [f"{ALLOWED}/32", "198.51.100.0/24", f"{METADATA}/32"]

# In the sandbox: "open", "refused", "timeout" or "err <errno>" for a TCP connect.
PROBE = (
    "import socket,sys\n"
    "s=socket.socket(); s.settimeout(float(sys.argv[3]))\n"
    "try:\n"
    "    s.connect((sys.argv[1], int(sys.argv[2]))); print('open')\n"
    "except ConnectionRefusedError: print('refused')\n"
    "except socket.timeout: print('timeout')\n"
    "except OSError as e: print('err', e.errno)\n"
)


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=10)


def nft(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["nft", *args], check=check, capture_output=True, text=True, timeout=10)


@pytest.fixture(scope="module")
def internet(test_root: Path) -> Iterable[str]:
    """The tests' internet: netns + veth + routes + an HTTP server."""
    # Never take over addresses the host uses (its own network may sit in a
    # documentation range): every prefix we add must be unrouted but for the default.
    for prefix in [f"{TRANSIT_HOST}/30", *ROUTED]:
        used = [ln for ln in ip("-4", "route", "show", "match", prefix).stdout.splitlines()
                if not ln.startswith("default")]
        addrs = ip("-4", "-o", "addr", "show").stdout
        if used or prefix.split("/")[0] in addrs:
            pytest.skip(f"{prefix} is in use on this host ({used}): the test internet would shadow it")
    name = "wnt-" + uuid.uuid4().hex[:8]
    host_if = "wnth" + name[4:10]
    ip("netns", "add", name)
    server = None
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", name)
        ip("addr", "add", f"{TRANSIT_HOST}/30", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("-n", name, "addr", "add", f"{TRANSIT_NS}/30", "dev", "eth0")
        ip("-n", name, "link", "set", "eth0", "up")
        ip("-n", name, "link", "set", "lo", "up")
        for a in (ALLOWED, DENIED, OTHER, METADATA):
            ip("-n", name, "addr", "add", f"{a}/32", "dev", "lo")
        ip("-n", name, "route", "add", "default", "via", TRANSIT_HOST)
        for r in ROUTED:
            ip("route", "add", r, "via", TRANSIT_NS)
        www = test_root / f"{name}-www"
        www.mkdir()
        (www / "hello").write_text("hello from the test internet\n")
        server = subprocess.Popen(
            ["ip", "netns", "exec", name, "python3", "-m", "http.server", str(PORT), "--bind", "0.0.0.0",
             "--directory", str(www)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # The host reaches every server address (so a refusal in a sandbox is the policy's).
        deadline = time.monotonic() + 10
        while True:
            r = subprocess.run(["python3", "-c", PROBE, METADATA, str(PORT), "1"], capture_output=True, text=True,
                               timeout=10, check=False)
            if r.stdout.strip() == "open":
                break
            assert time.monotonic() < deadline, f"test internet's server did not come up: {r.stdout}"
            time.sleep(0.1)
        yield name
    finally:
        if server is not None:
            server.kill()
            server.wait(timeout=10)
        for r in ROUTED:
            ip("route", "del", r, check=False)
        ip("link", "del", host_if, check=False)
        ip("netns", "del", name, check=False)


def start_daemon(test_root: Path, layer_store: Path, name: str, node: str, rng: str) -> Daemon:
    return Daemon(test_root, name, layer_store, NODE_PREFIX + node, extra_args=["--sandbox-net", rng]).start()


def table_of(d: Daemon) -> str:
    m = re.search(r"nft_table[=\":\s]+\"?(warren_[0-9a-f]{1,4})", d.log_path.read_text(errors="replace"))
    assert m, f"no nft table in the log:\n{d.log_tail()}"
    return m.group(1)


def links_with(prefix: str) -> list[str]:
    out = ip("-o", "link", "show").stdout
    return [ln.split(":")[1].strip().split("@")[0] for ln in out.splitlines() if f" {prefix}" in ln]


def leftovers(d: Daemon) -> dict:
    table = table_of(d)
    tag = table.split("_")[1]
    t = json.loads(nft("-j", "list", "table", "inet", table).stdout)["nftables"]
    chains = [o["chain"]["name"] for o in t if "chain" in o and o["chain"]["name"].startswith("sb_")]
    elems = [o["map"].get("elem", []) for o in t if "map" in o and o["map"]["name"] == "egress"]
    routes = [ln for ln in ip("-4", "route", "show").stdout.splitlines() if f"wn{tag}-" in ln]
    return {"links": links_with(f"wn{tag}-"), "chains": chains, "elements": [e for es in elems for e in es],
            "routes": routes}


def assert_clean(d: Daemon) -> None:
    deadline = time.monotonic() + 5
    while True:
        left = leftovers(d)
        if not any(left.values()):
            return
        assert time.monotonic() < deadline, f"left behind: {left}"
        time.sleep(0.05)


def drop_table(d: Daemon) -> None:
    nft("delete", "table", "inet", table_of(d), check=False)


def probe(sb: warren.Sandbox, addr: str, port: int = PORT, timeout_s: float = 2.0) -> str:
    r = sb.exec(["python3", "-c", PROBE, addr, str(port), str(timeout_s)], timeout=timeout_s + 20)
    assert r.exit_code == 0, r.stderr
    return r.stdout.decode().strip()


def http_get(sb: warren.Sandbox, addr: str) -> str:
    code = ("import urllib.request,sys; sys.stdout.write(urllib.request.urlopen("
            f"'http://{addr}:{PORT}/hello', timeout=5).read().decode())")
    r = sb.exec(["python3", "-c", code], timeout=30)
    assert r.exit_code == 0, r.stderr
    return r.stdout.decode()


def own_addr(sb: warren.Sandbox) -> str:
    code = ("import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
            "s.connect(('203.0.113.1', 9)); print(s.getsockname()[0])")
    r = sb.exec(["python3", "-c", code], timeout=20)
    assert r.exit_code == 0, r.stderr
    return r.stdout.decode().strip()


@pytest.fixture(scope="module")
def netd(test_root: Path, layer_store: Path, base_layer: str, daemon: Daemon, internet: str) -> Iterable[Daemon]:
    d = start_daemon(test_root, layer_store, "net", "n", "10.213.0.0/24")
    yield d
    d.stop()
    drop_table(d)


def test_default_is_loopback_only(netd: Daemon, base_layer: str) -> None:
    assert netd.client is not None
    with netd.client.create(layers=[base_layer]) as sb:
        r = sb.exec(["cat", "/proc/net/dev"], timeout=20)
        ifaces = [ln.split(":")[0].strip() for ln in r.stdout.decode().splitlines()[2:]]
        assert ifaces == ["lo"]
        assert probe(sb, ALLOWED).startswith("err")  # ENETUNREACH: no route at all
        with pytest.raises(warren.FailedPrecondition, match="without a network"):
            sb.set_network({"allow": [ALLOWED]})
    assert_clean(netd)


def test_policy_allow_deny_protected(netd: Daemon, base_layer: str) -> None:
    assert netd.client is not None
    policy = {"allow": ["0.0.0.0/0", "tcp:203.0.113.0/24:8080", "198.51.100.0/24"], "deny": [f"{DENIED}/32"]}
    with netd.client.create(layers=[base_layer], network=policy) as sb:
        assert http_get(sb, ALLOWED) == "hello from the test internet\n"
        assert probe(sb, ALLOWED) == "open"
        assert probe(sb, DENIED) == "refused"  # deny wins over the allowed /24
        assert probe(sb, METADATA) == "refused"  # 0.0.0.0/0 does not open link-local
        assert probe(sb, TRANSIT_HOST) == "refused"  # the node's own address
        a, b, c, dd = own_addr(sb).split(".")
        assert probe(sb, f"{a}.{b}.{c}.{int(dd) - 1}") == "refused"  # its gateway: the node's end of its link
    with netd.client.create(layers=[base_layer], network={"allow": ["tcp:203.0.113.10:8080"]}) as sb:
        assert probe(sb, ALLOWED) == "open"
        assert probe(sb, OTHER) == "refused"  # not allowed
        assert probe(sb, ALLOWED, port=8081) == "refused"  # port not allowed
    assert_clean(netd)


def test_explicit_allow_opens_a_protected_range(netd: Daemon, base_layer: str) -> None:
    assert netd.client is not None
    with netd.client.create(layers=[base_layer], network={"allow": [f"{METADATA}/32"]}) as sb:
        assert probe(sb, METADATA) == "open"


def test_sibling_unreachable(netd: Daemon, base_layer: str) -> None:
    assert netd.client is not None
    with netd.client.create(layers=[base_layer], network={"allow": ["0.0.0.0/0"]}) as a, \
            netd.client.create(layers=[base_layer], network={"allow": ["0.0.0.0/0"]}) as b:
        b.exec(["sh", "-c", "nohup python3 -m http.server 8000 >/dev/null 2>&1 &"], timeout=20)
        b_addr = own_addr(b)
        deadline = time.monotonic() + 10
        while probe(b, b_addr, 8000) != "open":
            assert time.monotonic() < deadline, "sibling's server did not come up"
            time.sleep(0.1)
        assert probe(a, b_addr, 8000) == "refused"


def test_set_network_flips_within_100ms(netd: Daemon, base_layer: str) -> None:
    assert netd.client is not None
    with netd.client.create(layers=[base_layer], network={"allow": []}) as sb:
        assert probe(sb, ALLOWED) == "refused"
        # A connection the sandbox holds open, to see what a change does to it.
        held_code = ("nohup python3 -c \"import socket,time\ns=socket.socket(); s.settimeout(1)\n"
                 "for i in range(200):\n"
                 "    try: s.connect(('203.0.113.10', 8080)); break\n"
                 "    except OSError: s.close(); s=socket.socket(); s.settimeout(1); time.sleep(0.05)\n"
                 "open('/tmp/held','w').write('connected')\n"
                 "time.sleep(3)\n"
                 "try:\n"
                 "    s.sendall(b'GET /hello HTTP/1.0\\\\r\\\\n\\\\r\\\\n'); d=s.recv(100)\n"
                 "    open('/tmp/held','w').write('alive' if d else 'eof')\n"
                 "except OSError as e: open('/tmp/held','w').write('reset %d' % e.errno)\n"
                 "\" >/dev/null 2>&1 &")
        sb.exec(["sh", "-c", held_code], timeout=20)
        t0 = time.monotonic()
        got = sb.set_network({"allow": ["203.0.113.0/24"]})
        elapsed = time.monotonic() - t0
        assert got == {"allow": ["203.0.113.0/24"], "deny": []}
        assert probe(sb, ALLOWED, timeout_s=1) == "open"
        assert elapsed < 0.1, f"set_network took {elapsed * 1000:.1f} ms"
        deadline = time.monotonic() + 15
        while sb.exec(["cat", "/tmp/held"], timeout=20).stdout != b"connected":
            assert time.monotonic() < deadline, "held connection never connected"
            time.sleep(0.05)
        t0 = time.monotonic()
        sb.set_network({"allow": [], "deny": []})
        elapsed = time.monotonic() - t0
        assert elapsed < 0.1, f"set_network took {elapsed * 1000:.1f} ms"
        assert probe(sb, ALLOWED, timeout_s=1) == "refused"
        # The held connection is cut on its next packet (TCP reset).
        deadline = time.monotonic() + 15
        while (held := sb.exec(["cat", "/tmp/held"], timeout=20).stdout.decode()) == "connected":
            assert time.monotonic() < deadline, "held connection never reported"
            time.sleep(0.1)
        assert held.startswith("reset"), held
    assert_clean(netd)


def test_bad_policy_fails_create_and_leaves_nothing(netd: Daemon, base_layer: str) -> None:
    assert netd.client is not None
    before = len(netd.client.list())
    for bad, what in ((["pypi.org"], "host names"), (["10.0.0.1/8"], "host bits"), (["tcp:1.2.3.4:0"], "port"),
                      (["icmp:1.2.3.4:80"], "icmp")):
        with pytest.raises(warren.InvalidArgument, match=what):
            netd.client.create(layers=[base_layer], network={"allow": bad})
    with pytest.raises(warren.InvalidArgument, match="unknown keys"):
        netd.client.create(layers=[base_layer], network={"alow": []})
    assert len(netd.client.list()) == before
    assert_clean(netd)


def test_no_network_on_a_node_without_one(client: warren.Client, base_layer: str) -> None:
    with pytest.raises(warren.FailedPrecondition, match="sandbox-net"):
        client.create(layers=[base_layer], network={"allow": []})


def test_kill9_restart_reapplies_policy_and_cleans(test_root: Path, layer_store: Path, base_layer: str,
                                                   daemon: Daemon, internet: str) -> None:
    d = start_daemon(test_root, layer_store, "net-restart", "r", "10.213.1.0/24")
    try:
        assert d.client is not None
        sb = d.client.create(layers=[base_layer], network={"allow": [ALLOWED], "deny": []})
        gone = d.client.create(layers=[base_layer], network={"allow": [ALLOWED]})
        sid, gone_pid = sb.id, gone.info().init_pid
        assert probe(sb, ALLOWED) == "open"
        sb.set_network({"allow": [OTHER]})  # the record keeps the policy in force
        d.kill9()
        assert len(leftovers(d)["links"]) == 2  # the sandboxes' links outlive the daemon
        os.kill(gone_pid, 9)  # one dies while no daemon runs
        d.start()
        sb = d.client.get(sid)
        assert probe(sb, OTHER) == "open"
        assert probe(sb, ALLOWED) == "refused"
        assert [s.id for s in d.client.list()] == [sid]
        sb.destroy()
        assert_clean(d)
    finally:
        d.stop()
        drop_table(d)
