"""Network escapes, attempted from inside a sandbox that HAS a network link
(warrend --sandbox-net, policy "allow everything public"): raw sockets,
changing its own routes, addresses and link, sending from any address
(IP_TRANSPARENT), and scanning the node, a sibling sandbox and the cloud
metadata address. Policy under test: README "Network", src/net/policy.cc
(the chain), src/net/sandbox_network.cc (the table)."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
import warren

from .conftest import it

POLICY = {"allow": ["0.0.0.0/0"]}

# Each attack prints one line: "<case> blocked <errno>" or "<case> ALLOWED".
ATTACKS = r"""
import errno, socket, struct, sys

def report(case, fn):
    try:
        fn()
        print(case, "ALLOWED")
    except OSError as e:
        print(case, "blocked", errno.errorcode.get(e.errno, e.errno))

def raw(family, kind, proto):
    return lambda: socket.socket(family, kind, proto).close()

def netlink(msg_type, flags, body):
    def go():
        s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        s.bind((0, 0))
        hdr = struct.pack("=LHHLL", 16 + len(body), msg_type, flags | 0x1 | 0x4, 1, 0)  # REQUEST|ACK
        s.send(hdr + body)
        ack = s.recv(4096)
        err = struct.unpack("=i", ack[16:20])[0]
        s.close()
        if err != 0:
            raise OSError(-err, "netlink")
    return go

def rta(kind, data):
    return struct.pack("=HH", 4 + len(data), kind) + data + b"\0" * ((4 - len(data) % 4) % 4)

ifindex = socket.if_nametoindex("eth0")
gw = socket.inet_aton(sys.argv[1])
# RTM_NEWROUTE 203.0.113.0/24 via the gateway (CREATE|EXCL)
route = struct.pack("=BBBBBBBBI", socket.AF_INET, 24, 0, 0, 254, 4, 0, 1, 0) + \
    rta(1, socket.inet_aton("203.0.113.0")) + rta(5, gw)
# RTM_NEWADDR 10.99.0.2/30 on eth0
addr = struct.pack("=BBBBI", socket.AF_INET, 30, 0, 0, ifindex) + rta(2, socket.inet_aton("10.99.0.2")) + \
    rta(1, socket.inet_aton("10.99.0.2"))
# RTM_NEWLINK eth0 down
link = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, ifindex, 0, 1)

report("raw-packet", raw(socket.AF_PACKET, socket.SOCK_RAW, 0))
report("raw-inet-icmp", raw(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
report("raw-inet-tcp", raw(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP))
report("raw-inet6", raw(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6))
report("route-add", netlink(24, 0x400 | 0x200, route))
report("addr-add", netlink(20, 0x400 | 0x200, addr))
report("link-down", netlink(16, 0, link))

def transparent():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_IP, 19, 1)  # IP_TRANSPARENT: send from any address
    s.close()
report("ip-transparent", transparent)
"""

# Connects to every (host, port) given as host:p1-p2; prints the open ones and a count.
SCAN = r"""
import socket, sys
opened = []
for target in sys.argv[1:]:
    host, ports = target.rsplit(":", 1)
    lo, hi = map(int, ports.split("-"))
    for port in range(lo, hi + 1):
        s = socket.socket(); s.settimeout(1)
        try:
            s.connect((host, port)); opened.append(f"{host}:{port}")
        except OSError:
            pass
        s.close()
print("open", len(opened), *opened)
"""

@pytest.fixture(scope="module")
def netd(test_root: Path, layer_store: Path, base_layer: str, daemon) -> Iterable[it.Daemon]:
    d = it.Daemon(test_root, "net-escape", layer_store, it.NODE_PREFIX + "ne",
                  extra_args=["--sandbox-net", "10.213.9.0/24", "--net-dns-upstream", "none"]).start()
    yield d
    d.stop()
    m = re.search(r"nft_table[=\":\s]+\"?(warren_[0-9a-f]{1,4})", d.log_path.read_text(errors="replace"))
    if m:
        subprocess.run(["nft", "delete", "table", "inet", m.group(1)], check=False, capture_output=True)


def run(sb: warren.Sandbox, code: str, *args: str) -> str:
    r = sb.exec(["python3", "-c", code, *args], timeout=120)
    assert r.exit_code == 0, r.stderr
    return r.stdout.decode()


def own_addr(sb: warren.Sandbox) -> str:
    return run(sb, "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                   "s.connect(('203.0.113.1', 9)); print(s.getsockname()[0])").strip()


def gateway_of(addr: str) -> str:
    a, b, c, d = addr.split(".")
    return f"{a}.{b}.{c}.{int(d) - 1}"


def test_raw_sockets_and_link_changes_blocked_with_a_link(netd, base_layer: str):
    with netd.client.create(layers=[base_layer], network=POLICY) as sb:
        lines = run(sb, ATTACKS, gateway_of(own_addr(sb))).split("\n")
        results = dict(ln.split(" ", 1) for ln in lines if ln)
        assert set(results) == {"raw-packet", "raw-inet-icmp", "raw-inet-tcp", "raw-inet6", "route-add",
                                "addr-add", "link-down", "ip-transparent"}
        for case, res in results.items():
            assert res.startswith("blocked"), f"{case}: {res}"
        # Its link is as the node made it.
        r = run(sb, "import socket; print(socket.if_nameindex())")
        assert "eth0" in r


def test_scan_of_node_sibling_and_metadata_finds_nothing(netd, base_layer: str):
    with netd.client.create(layers=[base_layer], network=POLICY) as a, \
            netd.client.create(layers=[base_layer], network=POLICY) as b:
        b.exec(["sh", "-c", "nohup python3 -m http.server 8000 >/dev/null 2>&1 &"], timeout=20)
        b_addr = own_addr(b)
        deadline = time.monotonic() + 10
        while "open 1" not in run(b, SCAN, "127.0.0.1:8000-8000"):
            assert time.monotonic() < deadline, "sibling's server did not come up"
            time.sleep(0.1)
        node = gateway_of(own_addr(a))
        before = a.info().traffic
        out = run(a, SCAN, f"{node}:1-1024", f"{b_addr}:7990-8010", f"{gateway_of(b_addr)}:1-100",
                  "169.254.169.254:80-80", "169.254.169.254:443-443")
        assert out.split()[:2] == ["open", "0"], out
        after = a.info().traffic
        assert after.denied - before.denied >= 1024 + 21 + 100 + 2, (before, after)



def test_api_caller_cannot_open_metadata_private_or_sibling_ranges(netd, base_layer: str):
    # Only an operator's --net-preset opens a protected range; this node has none.
    for entry in ("169.254.169.254", "tcp:169.254.169.254:80", "169.254.0.0/16", "10.0.0.0/8", "127.0.0.1",
                  "172.16.0.0/12", "192.168.1.0/24", "100.64.0.0/10", "10.213.9.0/24"):
        with pytest.raises(warren.InvalidArgument, match="protected range"):
            netd.client.create(layers=[base_layer], network={"allow": [entry]})
    with netd.client.create(layers=[base_layer], network=POLICY) as sb:
        with pytest.raises(warren.InvalidArgument, match="protected range 169.254.0.0/16"):
            sb.set_network({"allow": ["0.0.0.0/0", "169.254.169.254/32"]})
        assert sb.info().network == {"allow": ["0.0.0.0/0"], "deny": []}
        before = sb.info().traffic
        out = run(sb, SCAN, "169.254.169.254:80-80", "169.254.169.254:443-443")
        assert out.split()[:2] == ["open", "0"], out
        assert sb.info().traffic.denied - before.denied >= 2


# Tries IPv6 over the sandbox's link: the node end's link-local address (a
# listener on [::] of the node takes it), the node's other addresses, a
# global one. Prints "<target> blocked <errno>" or "<target> ALLOWED".
V6 = r"""
import errno, socket, sys
import time
port = int(sys.argv[1])
# Wait (bounded) for eth0's own link-local address to leave DAD (tentative
# 0x40), so a link-local connect is really tried, not refused for want of a
# source address.
deadline = time.monotonic() + 10
while True:
    try:
        rows = [ln.split() for ln in open("/proc/net/if_inet6") if ln.split()[5] == "eth0"]
    except OSError:  # no IPv6 in this kernel
        rows = []
    ready = [r for r in rows if r[0].startswith("fe80") and not int(r[4], 16) & 0x40]
    if ready or time.monotonic() > deadline:
        break
    time.sleep(0.1)
print("eth0-link-local", bool(ready))
for target in sys.argv[2:]:
    host, scope = (target.split("%") + [""])[:2]
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError as e:
        print(target, "blocked", errno.errorcode.get(e.errno, e.errno))
        continue
    s.settimeout(2)
    try:
        s.connect((host, port, 0, socket.if_nametoindex(scope) if scope else 0))
        print(target, "ALLOWED")
    except OSError as e:
        print(target, "blocked", errno.errorcode.get(e.errno, e.errno) if e.errno else type(e).__name__)
    s.close()
"""


def _host_v6_addrs() -> dict[str, list[str]]:
    """The node's IPv6 addresses by link (from /proc/net/if_inet6)."""
    out: dict[str, list[str]] = {}
    for ln in Path("/proc/net/if_inet6").read_text().splitlines():
        hexaddr, *_, dev = ln.split()
        addr = ":".join(hexaddr[i:i + 4] for i in range(0, 32, 4))
        out.setdefault(dev, []).append(addr)
    return out


def _link_with_addr(v4: str) -> str:
    r = subprocess.run(["ip", "-o", "-4", "addr", "show"], check=True, capture_output=True, text=True)
    for ln in r.stdout.splitlines():
        if f" {v4}/" in ln:
            return ln.split()[1]
    raise AssertionError(f"no link of the node holds {v4}")


def test_ipv6_reaches_neither_the_node_nor_beyond(netd, base_layer: str):
    if not Path("/proc/net/if_inet6").exists():
        pytest.skip("this kernel has no IPv6 (no /proc/net/if_inet6): nothing to reach over it")
    # A listener on the node's every address, IPv6 and IPv4 (dual stack).
    srv = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    srv.bind(("::", 0))
    srv.listen(16)
    port = srv.getsockname()[1]
    try:
        with netd.client.create(layers=[base_layer], network=POLICY) as sb:
            node_addr = gateway_of(own_addr(sb))
            host_link = _link_with_addr(node_addr)
            v6 = _host_v6_addrs()
            link_local = [a for a in v6.get(host_link, []) if a.startswith("fe80")]
            others = [a for dev, addrs in v6.items() if dev not in (host_link, "lo") for a in addrs
                      if not a.startswith("fe80")]
            targets = [f"{a}%eth0" for a in link_local] + others + ["2001:db8::1", "::ffff:" + node_addr]
            before = sb.info().traffic
            lines = run(sb, V6, str(port), *targets).split("\n")
            print("targets:", targets, "results:", lines)
            results = dict(ln.split(" ", 1) for ln in lines if ln)
            if results.pop("eth0-link-local") != "True":
                print("the sandbox's eth0 has no usable IPv6 link-local address: nothing link-local can be tried")
            for t in targets:
                assert results[t].startswith("blocked"), f"{t}: {results[t]}"
            if not link_local:
                print(f"the node end {host_link} has no IPv6 link-local address here: that target was not tried")
            assert sb.info().traffic.denied - before.denied >= 1, (before, sb.info().traffic)
    finally:
        srv.close()
