"""Sandbox network (src/net): egress policy, NAT, isolation, leftovers.

The tests build their own "internet" on this machine: a network namespace
behind a veth pair whose addresses (documentation ranges 203.0.113.0/24,
198.51.100.0/24, and the metadata address 169.254.169.254) are routed into
it from the host. One HTTP server in it answers on all of them, and a DNS
server (203.0.113.53) knows pypi.test, npm.test and meta.test. Nothing
leaves the machine."""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
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
DNS = "203.0.113.53"
NAMES = {"pypi.test": ALLOWED, "npm.test": OTHER, "meta.test": METADATA}
PORT = 8080
TRANSIT_HOST, TRANSIT_NS = "198.18.213.1", "198.18.213.2"
ROUTED = [f"{ALLOWED}/32", f"{DNS}/32", "198.51.100.0/24", f"{METADATA}/32"]

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

# The test internet's DNS server: A records of NAMES, NXDOMAIN for the rest.
DNS_SERVER = (
    "import socket,struct,sys,json\n"
    "names=json.loads(sys.argv[2])\n"
    "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.bind((sys.argv[1],53))\n"
    "while True:\n"
    "    q,a=s.recvfrom(512); i=12; labels=[]\n"
    "    while q[i]: labels.append(q[i+1:i+1+q[i]].decode()); i+=1+q[i]\n"
    "    qtype=struct.unpack('>H',q[i+1:i+3])[0]; qend=i+5; ip=names.get('.'.join(labels).lower())\n"
    "    if ip is None: s.sendto(q[:2]+b'\\x81\\x83'+q[4:6]+bytes(6)+q[12:qend],a); continue\n"
    "    ans=b'\\xc0\\x0c'+struct.pack('>HHIH',1,1,60,4)+socket.inet_aton(ip) if qtype==1 else b''\n"
    "    s.sendto(q[:2]+b'\\x81\\x80'+q[4:6]+struct.pack('>HHH',1 if ans else 0,0,0)+q[12:qend]+ans,a)\n"
)

# In the sandbox: the address a name resolves to, or "fail <error>".
RESOLVE = (
    "import socket,sys\n"
    "try: print(socket.gethostbyname(sys.argv[1]))\n"
    "except OSError as e: print('fail', e)\n"
)


# In the sandbox: an A query for argv[1] over TCP to argv[2]:53; prints the
# first address, "nxdomain", or "fail <error>".
RESOLVE_TCP = (
    "import socket,struct,sys\n"
    "q=struct.pack('>HHHHHH',0x4242,0x0100,1,0,0,0)+b''.join(bytes([len(x)])+x.encode() for x in sys.argv[1].split('.'))"
    "+b'\\0'+struct.pack('>HH',1,1)\n"
    "try:\n"
    "    s=socket.create_connection((sys.argv[2],53),timeout=5); s.sendall(struct.pack('>H',len(q))+q)\n"
    "    n=struct.unpack('>H',s.recv(2,socket.MSG_WAITALL))[0]; r=s.recv(n,socket.MSG_WAITALL)\n"
    "    if r[3]&15==3: print('nxdomain')\n"
    "    elif struct.unpack('>H',r[6:8])[0]: print(socket.inet_ntoa(r[-4:]))\n"
    "    else: print('fail empty')\n"
    "except OSError as e: print('fail', e)\n"
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
    server = dns = None
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", name)
        ip("addr", "add", f"{TRANSIT_HOST}/30", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("-n", name, "addr", "add", f"{TRANSIT_NS}/30", "dev", "eth0")
        ip("-n", name, "link", "set", "eth0", "up")
        ip("-n", name, "link", "set", "lo", "up")
        for a in (ALLOWED, DENIED, OTHER, METADATA, DNS):
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
        dns = subprocess.Popen(["ip", "netns", "exec", name, "python3", "-c", DNS_SERVER, DNS, json.dumps(NAMES)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
        for p in (server, dns):
            if p is not None:
                p.kill()
                p.wait(timeout=10)
        for r in ROUTED:
            ip("route", "del", r, check=False)
        ip("link", "del", host_if, check=False)
        ip("netns", "del", name, check=False)


# Node presets of the tests' daemons: "pypi" is one server, by address and
# by name, on its HTTP port; "npm" another address; "meta" the metadata
# endpoint (a protected range only an operator's preset opens).
PRESETS = ["--net-preset", f"pypi=tcp:{ALLOWED}:{PORT},tcp:pypi.test:{PORT}", "--net-preset", f"npm=tcp:{OTHER}:{PORT}",
           "--net-preset", f"meta=tcp:{METADATA}:{PORT}"]


def start_daemon(test_root: Path, layer_store: Path, name: str, node: str, rng: str) -> Daemon:
    return Daemon(test_root, name, layer_store, NODE_PREFIX + node,
                  extra_args=["--sandbox-net", rng, "--net-dns-upstream", DNS, *PRESETS]).start()


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
    chains = [o["chain"]["name"] for o in t if "chain" in o and o["chain"]["name"].startswith(("sb_", "rf_"))]
    counters = [o["counter"]["name"] for o in t if "counter" in o]
    elems = [o["map"].get("elem", []) for o in t if "map" in o and o["map"]["name"] == "egress"]
    elems += [o["set"].get("elem", []) for o in t
              if "set" in o and o["set"]["name"].startswith("names_") or o.get("set", {}).get("name") == "dns_tcp"]
    sets = [o["set"]["name"] for o in t if "set" in o and o["set"]["name"].startswith("names_")]
    routes = [ln for ln in ip("-4", "route", "show").stdout.splitlines() if f"wn{tag}-" in ln]
    return {"links": links_with(f"wn{tag}-"), "chains": chains, "counters": counters, "sets": sets,
            "elements": [e for es in elems for e in es], "routes": routes}


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


def test_explicit_allow_cannot_open_a_protected_range(netd: Daemon, base_layer: str) -> None:
    assert netd.client is not None
    before = len(netd.client.list())
    for entry, prot in ((f"{METADATA}/32", r"169\.254\.0\.0/16 \(link-local"),
                        ("tcp:10.1.2.0/24:443", r"10\.0\.0\.0/8 \(private\)"),
                        ("10.213.0.4/30", r"10\.0\.0\.0/8"),  # a sibling's link
                        (TRANSIT_HOST, r"198\.18\.0\.0/15")):  # the node's own address there
        with pytest.raises(warren.InvalidArgument, match=rf"network\.allow\[0\]: '{re.escape(entry)}' lies inside "
                                                         rf"the protected range {prot}.*--net-preset"):
            netd.client.create(layers=[base_layer], network={"allow": [entry]})
    assert len(netd.client.list()) == before
    with netd.client.create(layers=[base_layer], network={"allow": [ALLOWED]}) as sb:
        with pytest.raises(warren.InvalidArgument, match="protected range 169.254.0.0/16"):
            sb.set_network({"allow": [ALLOWED, METADATA]})
        assert sb.info().network == {"allow": [f"{ALLOWED}/32"], "deny": []}  # unchanged
        assert probe(sb, METADATA) == "refused"
        assert probe(sb, ALLOWED) == "open"
        # Wider than a protected range: allowed, its protected parts stay closed.
        sb.set_network({"allow": ["0.0.0.0/0"]})
        assert probe(sb, METADATA) == "refused"
        assert probe(sb, ALLOWED) == "open"
    assert_clean(netd)


def test_explicit_allow_of_the_node_is_refused(netd: Daemon, base_layer: str, internet: str) -> None:
    assert netd.client is not None
    node_addr = "203.0.113.250"  # an address of the node outside every protected range, for this test
    host_if = "wnth" + internet[4:10]
    ip("addr", "add", f"{node_addr}/32", "dev", host_if)
    try:
        with socket.socket() as server:
            server.bind((node_addr, 0))
            server.listen(8)
            port = server.getsockname()[1]
            with pytest.raises(warren.InvalidArgument, match=rf"network\.allow\[0\]: 'tcp:{re.escape(node_addr)}:{port}' "
                                                             "is an address of this node"):
                netd.client.create(layers=[base_layer], network={"allow": [f"tcp:{node_addr}:{port}"]})
            with netd.client.create(layers=[base_layer], network={"allow": ["203.0.113.0/24"]}) as sb:
                assert probe(sb, ALLOWED) == "open"
                assert probe(sb, node_addr, port) == "refused"  # the node's part of the range stays closed
    finally:
        ip("addr", "del", f"{node_addr}/32", "dev", host_if, check=False)
    assert_clean(netd)


def test_operator_preset_opens_a_protected_range(netd: Daemon, base_layer: str) -> None:
    assert netd.client is not None
    with netd.client.create(layers=[base_layer], network={"allow": ["meta"]}) as sb:
        assert sb.info().network == {"allow": ["meta"], "deny": []}
        assert probe(sb, METADATA) == "open"
        assert probe(sb, METADATA, port=8081) == "refused"  # the preset's port only
        assert probe(sb, ALLOWED) == "refused"
        assert sb.set_network({"allow": ["meta"], "deny": [METADATA]})["deny"] == [f"{METADATA}/32"]
        assert probe(sb, METADATA) == "refused"  # deny still wins
    assert_clean(netd)


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
    for bad, what in ((["bad_name.example"], "nor a host name"), (["10.0.0.1/8"], "host bits"), (["tcp:1.2.3.4:0"], "port"),
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
        serve_in(sb, 8000)
        exposed = sb.expose(8000)
        d.kill9()
        assert len(leftovers(d)["links"]) == 2  # the sandboxes' links outlive the daemon
        os.kill(gone_pid, 9)  # one dies while no daemon runs
        d.start()
        sb = d.client.get(sid)
        assert probe(sb, OTHER) == "open"
        assert probe(sb, ALLOWED) == "refused"
        assert [s.id for s in d.client.list()] == [sid]
        assert sb.info().exposed == [exposed]  # listening again, same address and token
        assert http_from_host(exposed.address, exposed.token) == (200, "hello from inside\n")
        assert http_from_host(exposed.address)[0] == 401
        sb.destroy()
        assert not listening(exposed.address)
        assert_clean(d)
    finally:
        d.stop()
        drop_table(d)


def http_from_host(address: str, token: str | None = None, query: str = "") -> tuple[int, str]:
    """(status, body) of GET /hello on an exposed address, from the host."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", "/hello" + query, headers={"X-Warren-Token": token} if token else {})
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        conn.close()


def listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((host, int(port))) == 0


def serve_in(sb: warren.Sandbox, port: int, bind: str = "127.0.0.1") -> None:
    """An HTTP server in the sandbox serving /hello on bind:port."""
    cmd = (f"mkdir -p /srv && echo hello from inside > /srv/hello && cd /srv && "
           f"nohup python3 -m http.server {port} --bind {bind} >/dev/null 2>&1 &")
    sb.exec(["sh", "-c", cmd], timeout=20)
    deadline = time.monotonic() + 10
    while probe(sb, bind if bind != "0.0.0.0" else "127.0.0.1", port) != "open":
        assert time.monotonic() < deadline, "the sandbox's server did not come up"
        time.sleep(0.1)


def test_expose_serves_with_the_token_only(netd: Daemon, base_layer: str) -> None:
    assert netd.client is not None
    with netd.client.create(layers=[base_layer]) as sb:  # loopback only: exposing needs no link
        serve_in(sb, 8000)
        e = sb.expose(8000)
        assert e.port == 8000 and len(e.token) == 32
        assert http_from_host(e.address, e.token) == (200, "hello from inside\n")
        assert http_from_host(e.address, query=f"?warren_token={e.token}") == (200, "hello from inside\n")
        status, body = http_from_host(e.address)
        assert status == 401 and "X-Warren-Token" in body
        assert http_from_host(e.address, "0" * 32)[0] == 401
        assert sb.expose(8000) == e  # the same port: the same exposure
        assert sb.info().exposed == [e]
        # A port nothing listens on: the node answers 502, not silence.
        e2 = sb.expose(8001)
        status, body = http_from_host(e2.address, e2.token)
        assert status == 502 and "refused" in body.lower(), body
        sb.unexpose(8001)
        assert not listening(e2.address)
        with pytest.raises(warren.NotFound, match="8001"):
            sb.unexpose(8001)
        with pytest.raises(warren.InvalidArgument):
            sb.expose(0)
    assert not listening(e.address)  # gone with the sandbox
    assert_clean(netd)


def test_presets_by_name(netd: Daemon, base_layer: str) -> None:
    assert netd.client is not None
    with netd.client.create(layers=[base_layer], network={"allow": ["pypi"]}) as sb:
        assert http_get(sb, ALLOWED) == "hello from the test internet\n"
        assert probe(sb, OTHER) == "refused"
        assert probe(sb, ALLOWED, port=8081) == "refused"
        assert sb.info().network == {"allow": ["pypi"], "deny": []}
        assert sb.set_network({"allow": ["npm"]}) == {"allow": ["npm"], "deny": []}
        assert probe(sb, OTHER) == "open"
        assert probe(sb, ALLOWED) == "refused"
        assert sb.set_network({"allow": ["0.0.0.0/0"], "deny": ["pypi"]})["deny"] == ["pypi"]
        assert probe(sb, ALLOWED) == "refused"
        assert probe(sb, OTHER) == "open"
    with pytest.raises(warren.InvalidArgument, match="no preset of this node.*npm, pypi"):
        netd.client.create(layers=[base_layer], network={"allow": ["debian"]})
    assert_clean(netd)


def test_port_scan_finds_nothing_open_and_is_counted(netd: Daemon, base_layer: str) -> None:
    assert netd.client is not None
    scan = ("import socket,sys\n"
            "opened=0\n"
            "for host in sys.argv[1:]:\n"
            "    for port in list(range(1, 101)) + [8000, 8080]:\n"
            "        s=socket.socket(); s.settimeout(1)\n"
            "        try: s.connect((host, port)); opened+=1; print('OPEN', host, port)\n"
            "        except OSError: pass\n"
            "        s.close()\n"
            "print('opened', opened)\n")
    with netd.client.create(layers=[base_layer], network={"allow": ["0.0.0.0/0"]}) as a, \
            netd.client.create(layers=[base_layer], network={"allow": ["0.0.0.0/0"]}) as b:
        serve_in(b, 8000, bind="0.0.0.0")
        a_addr, b_addr = own_addr(a), own_addr(b)
        x, y, z, w = a_addr.split(".")
        gateway = f"{x}.{y}.{z}.{int(w) - 1}"  # the node's end of a's link
        before = a.info().traffic
        assert before is not None
        targets = [gateway, TRANSIT_HOST, b_addr]  # the node (two of its addresses) and a sibling
        r = a.exec(["python3", "-c", scan, *targets], timeout=120)
        assert r.exit_code == 0, r.stderr
        assert r.stdout.decode().strip().splitlines()[-1] == "opened 0", r.stdout
        after = a.info().traffic
        probes = len(targets) * 102
        assert after.denied - before.denied >= probes, (before, after)  # every refused SYN counted
        assert after.connections - before.connections >= probes, (before, after)
        assert after.egress_bytes > before.egress_bytes
        assert b.info().traffic.denied < probes  # counted for the scanner, not the target
        # ... and audited, rate-limited (20/s, burst 40): a scan is never silence.
        deadline = time.monotonic() + 5
        while True:
            denied = [e for e in a.audit_log() if e.get("op") == "net_denied"]
            if len(denied) >= 40 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert len(denied) >= 40, denied
        seen = {(e["dst"], e["proto"], e["port"]) for e in denied}
        assert {(gateway, "tcp", 1), (gateway, "tcp", 2)} <= seen, sorted(seen)[:10]
    assert_clean(netd)


def test_failed_create_after_the_link_leaves_nothing(netd: Daemon, base_layer: str) -> None:
    assert netd.client is not None
    before = len(netd.client.list())
    # The workdir step runs after the network is attached: a file in its path fails it.
    with pytest.raises(warren.WarrenError, match="workdir"):
        netd.client.create(layers=[base_layer], network={"allow": [ALLOWED]}, workdir="/usr/bin/env/x")
    assert len(netd.client.list()) == before
    assert_clean(netd)


def resolve(sb: warren.Sandbox, name: str) -> str:
    r = sb.exec(["python3", "-c", RESOLVE, name], timeout=30)
    assert r.exit_code == 0, r.stderr
    return r.stdout.decode().strip()


def test_pypi_preset_by_name_and_address_only(netd: Daemon, base_layer: str) -> None:
    assert netd.client is not None
    with netd.client.create(layers=[base_layer], network={"allow": ["pypi"]}) as sb:
        assert resolve(sb, "npm.test").startswith("fail")  # a name it may not use does not resolve
        assert resolve(sb, "meta.test").startswith("fail")
        assert resolve(sb, "pypi.test") == ALLOWED
        assert http_get(sb, "pypi.test") == "hello from the test internet\n"  # by name
        assert http_get(sb, ALLOWED) == "hello from the test internet\n"  # by address
        assert probe(sb, OTHER) == "refused"  # npm's server, by address
        assert probe(sb, METADATA) == "refused"
        assert probe(sb, ALLOWED, port=8081) == "refused"


def test_names_pinned_on_resolution_and_flushed_by_a_change(netd: Daemon, base_layer: str) -> None:
    assert netd.client is not None
    with netd.client.create(layers=[base_layer], network={"allow": ["tcp:npm.test:8080"]}) as sb:
        assert probe(sb, OTHER) == "refused"  # not before the name was resolved
        assert resolve(sb, "npm.test") == OTHER
        assert probe(sb, OTHER) == "open"  # its answer was pinned into the filter
        assert probe(sb, OTHER, port=8081) == "refused"
        assert sb.set_network({"allow": ["*.test"], "deny": ["npm.test"]}) == {"allow": ["*.test"],
                                                                                "deny": ["npm.test"]}
        assert probe(sb, OTHER) == "refused"  # the change flushed the pins
        assert resolve(sb, "npm.test").startswith("fail")  # deny wins over the wildcard
        assert resolve(sb, "meta.test") == METADATA
        assert probe(sb, METADATA) == "refused"  # a name never opens a protected range
        assert resolve(sb, "pypi.test") == ALLOWED
        assert probe(sb, ALLOWED) == "open"
    assert_clean(netd)


def test_dns_over_tcp_follows_the_same_rules(netd: Daemon, base_layer: str) -> None:
    assert netd.client is not None

    def resolve_tcp(sb: warren.Sandbox, name: str, server: str) -> str:
        r = sb.exec(["python3", "-c", RESOLVE_TCP, name, server], timeout=30)
        assert r.exit_code == 0, r.stderr
        return r.stdout.decode().strip()

    with netd.client.create(layers=[base_layer], network={"allow": ["tcp:npm.test:8080"]}) as sb:
        assert probe(sb, OTHER) == "refused"  # not before the name was resolved
        assert resolve_tcp(sb, "npm.test", DNS) == OTHER
        assert probe(sb, OTHER) == "open"  # pinned by a TCP lookup too
        assert resolve_tcp(sb, "pypi.test", DNS) == "nxdomain"  # not allowed
        assert resolve_tcp(sb, "npm.test", ALLOWED) == OTHER  # whatever server it names: the node's forwarder
        sb.set_network({"allow": ["*.test"], "deny": ["npm.test"]})
        assert resolve_tcp(sb, "npm.test", DNS) == "nxdomain"  # deny wins, over TCP as over UDP
        assert resolve_tcp(sb, "meta.test", DNS) == METADATA
        assert probe(sb, METADATA) == "refused"  # a name never opens a protected range
        # A policy naming no host: the node's TCP port 53 is closed like any other.
        sb.set_network({"allow": ["0.0.0.0/0"]})
        a, b, c, dd = own_addr(sb).split(".")
        assert probe(sb, f"{a}.{b}.{c}.{int(dd) - 1}", 53) == "refused"
    assert_clean(netd)
