"""Network for microVMs (issue 16): a tap per VM on the node's sandbox network
(src/net, runtime/microvm/network.cc), the same policy as containers.

Uses test_network.py's test "internet" (network namespaces on this machine)
and its helpers. Needs the guest of scripts/microvm/build-guest.sh built from
this tree's agent (build/microvm-guest or WARREN_MICROVM_DIR: virtio_net and
the agent's NIC setup). TCG on 2 cores: at most 2 VMs up at once.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
import warren
from conftest import NODE_PREFIX, Daemon, microvm_dir_args, qemu_pids
from test_network import (  # noqa: F401 (internet: the module's fixture)
    ALLOWED,
    DENIED,
    DNS,
    METADATA,
    OTHER,
    PRESETS,
    TRANSIT_HOST,
    assert_clean,
    drop_table,
    http_from_host,
    http_get,
    internet,
    leftovers,
    listening,
    own_addr,
    probe,
    resolve,
    table_of,
)

CREATE_TIMEOUT = 180
pytestmark = pytest.mark.skipif(not microvm_dir_args() and not Path("/var/cache/warren/microvm/vmlinuz").exists(),
                                reason="microvm: no guest (scripts/microvm/build-guest.sh)")


def start(test_root: Path, layer_store: Path, name: str, node: str, rng: str, *extra: str) -> Daemon:
    d = Daemon(test_root, name, layer_store, NODE_PREFIX + node,
               extra_args=[*microvm_dir_args(), "--warm-shells", "0", "--sandbox-net", rng, "--net-dns-upstream", DNS,
                           *PRESETS, *extra]).start()
    assert d.client is not None
    if "microvm" not in d.client.status().backends:
        d.stop()
        pytest.skip("microvm: not offered by this warrend")
    return d


def vm(d: Daemon, base_layer: str, **kw) -> warren.Sandbox:
    assert d.client is not None
    return d.client.create(backend="microvm", layers=[base_layer], memory_mb=256, timeout=CREATE_TIMEOUT, **kw)


def serve_in(sb: warren.Sandbox, port: int, bind: str = "0.0.0.0") -> None:
    """An HTTP server in the VM serving /hello on bind:port, waited for in the
    guest (python's start takes seconds under TCG), reached on its loopback."""
    cmd = (f"mkdir -p /srv && echo hello from inside > /srv/hello && cd /srv && "
           f"(nohup python3 -m http.server {port} --bind {bind} >/dev/null 2>&1 &) && "
           f"for i in $(seq 600); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 1)' "
           f"2>/dev/null && exit 0; sleep 0.1; done; exit 1")
    r = sb.exec(["sh", "-c", cmd], timeout=120)
    assert r.exit_code == 0, "the VM's server did not come up"


def taps(d: Daemon) -> list[str]:
    return leftovers(d)["links"]


@pytest.fixture(scope="module")
def mvnet(test_root: Path, layer_store: Path, base_layer: str, daemon: Daemon,
          internet: str) -> Iterable[Daemon]:  # noqa: F811
    d = start(test_root, layer_store, "mvnet", "v", "10.213.2.0/24")
    yield d
    d.stop()
    drop_table(d)


def test_policy_node_sibling_and_set_network(mvnet: Daemon, base_layer: str) -> None:
    policy = {"allow": ["0.0.0.0/0", "198.51.100.0/24"], "deny": [f"{DENIED}/32"]}
    with vm(mvnet, base_layer, network=policy) as a, vm(mvnet, base_layer, network={"allow": ["pypi"]}) as b:
        assert len(taps(mvnet)) == 2  # one tap each, on the host
        assert http_get(a, ALLOWED) == "hello from the test internet\n"
        assert probe(a, DENIED) == "refused"  # deny wins
        assert probe(a, METADATA) == "refused"  # protected
        assert probe(a, TRANSIT_HOST) == "refused"  # the node
        a_addr, b_addr = own_addr(a), own_addr(b)
        assert a_addr != b_addr
        x, y, z, w = a_addr.split(".")
        assert probe(a, f"{x}.{y}.{z}.{int(w) - 1}") == "refused"  # its gateway, the node's end of its tap
        # Each clone has its own MAC (the template's NIC restored, then set by the agent).
        macs = {sb.exec(["cat", "/sys/class/net/eth0/address"], timeout=30).stdout.strip() for sb in (a, b)}
        assert len(macs) == 2, macs
        # A sibling's server is out of reach.
        serve_in(b, 8000, bind="0.0.0.0")
        assert probe(a, b_addr, 8000) == "refused"
        # Names: the forwarder answers only allowed ones, over the node's end.
        assert b.exec(["cat", "/etc/resolv.conf"], timeout=30).stdout.decode().split() == \
            ["nameserver", f"{b_addr.rsplit('.', 1)[0]}.{int(b_addr.rsplit('.', 1)[1]) - 1}"]
        assert resolve(b, "pypi.test") == ALLOWED
        assert resolve(b, "npm.test").startswith("fail")
        assert probe(b, OTHER) == "refused"
        # set_network applies to the next connection.
        t0 = time.monotonic()
        assert b.set_network({"allow": ["npm"]}) == {"allow": ["npm"], "deny": []}
        assert time.monotonic() - t0 < 0.1
        assert probe(b, OTHER) == "open"
        assert probe(b, ALLOWED) == "refused"
        a.set_network({"allow": []})
        assert probe(a, ALLOWED) == "refused"
        traffic = a.info().traffic
        assert traffic is not None and traffic.denied > 0 and traffic.egress_bytes > 0
    assert_clean(mvnet)


def test_default_is_loopback_only_and_exposing_needs_a_link(mvnet: Daemon, base_layer: str) -> None:
    with vm(mvnet, base_layer) as sb:
        # A clone's NIC (the template's) stays unbound: loopback only, as in a container.
        r = sb.exec(["cat", "/proc/net/dev"], timeout=30)
        assert [ln.split(":")[0].strip() for ln in r.stdout.decode().splitlines()[2:]] == ["lo"]
        assert probe(sb, ALLOWED).startswith("err")  # ENETUNREACH
        with pytest.raises(warren.FailedPrecondition, match="without a network"):
            sb.set_network({"allow": [ALLOWED]})
        with pytest.raises(warren.FailedPrecondition, match="network link"):
            sb.expose(8000)
        assert taps(mvnet) == []
    assert_clean(mvnet)


def test_expose_serves_with_the_token_only(mvnet: Daemon, base_layer: str) -> None:
    with vm(mvnet, base_layer, network={"allow": []}) as sb:
        serve_in(sb, 8000, bind="0.0.0.0")
        e = sb.expose(8000)
        assert http_from_host(e.address, e.token) == (200, "hello from inside\n")
        assert http_from_host(e.address, query=f"?warren_token={e.token}") == (200, "hello from inside\n")
        assert http_from_host(e.address)[0] == 401
        assert http_from_host(e.address, "0" * 32)[0] == 401
        assert sb.info().exposed == [e]
        e2 = sb.expose(8001)  # nothing listens there: 502
        assert http_from_host(e2.address, e2.token)[0] == 502
    assert not listening(e.address) and not listening(e2.address)
    assert_clean(mvnet)


def test_suspend_resume_keeps_the_link(mvnet: Daemon, base_layer: str) -> None:
    with vm(mvnet, base_layer, network={"allow": [ALLOWED]}) as sb:
        assert probe(sb, ALLOWED) == "open"
        sb.pause()
        sb.suspend()
        sb.resume()
        assert probe(sb, ALLOWED) == "open"
        assert probe(sb, OTHER) == "refused"
    assert_clean(mvnet)


def test_bad_policy_and_failed_boot_leave_nothing(mvnet: Daemon, test_root: Path, layer_store: Path,
                                                  base_layer: str) -> None:
    assert mvnet.client is not None
    before = len(mvnet.client.list())
    with pytest.raises(warren.InvalidArgument, match="protected range"):
        vm(mvnet, base_layer, network={"allow": [METADATA]})
    assert len(mvnet.client.list()) == before
    assert_clean(mvnet)
    # A boot that times out after the tap was made: tap, chains and QEMU go.
    d = start(test_root, layer_store, "mvnet-fail", "f", "10.213.3.0/24", "--microvm-boot-timeout-ms", "300",
              "--microvm-templates=false")
    try:
        with pytest.raises(warren.WarrenError, match="(?i)deadline|hello"):
            vm(d, base_layer, network={"allow": [ALLOWED]})
        assert d.client is not None and d.client.list() == []
        assert_clean(d)
    finally:
        d.stop()
        drop_table(d)


def test_kill9_restart_reapplies_policy_and_cleans(test_root: Path, layer_store: Path, base_layer: str,
                                                   daemon: Daemon, internet: str) -> None:  # noqa: F811
    d = start(test_root, layer_store, "mvnet-restart", "r", "10.213.4.0/24")
    try:
        assert d.client is not None
        sb = vm(d, base_layer, network={"allow": [ALLOWED]})
        sid = sb.id
        assert probe(sb, ALLOWED) == "open"
        sb.set_network({"allow": [OTHER]})  # the record keeps the policy in force
        serve_in(sb, 8000, bind="0.0.0.0")
        exposed = sb.expose(8000)
        d.kill9()
        assert len(taps(d)) == 1  # the tap stays with the running QEMU
        # A tap of a create the crash cut short (no record): removed at the restart.
        stray = f"wn{table_of(d).split('_')[1]}-3f"
        subprocess.run(["ip", "tuntap", "add", "dev", stray, "mode", "tap"], check=True, timeout=10)
        assert stray in taps(d)
        d.start()
        assert taps(d) == [t for t in taps(d) if t != stray]
        sb = d.client.get(sid)
        assert probe(sb, OTHER) == "open"
        assert probe(sb, ALLOWED) == "refused"
        assert sb.info().exposed == [exposed]
        assert http_from_host(exposed.address, exposed.token) == (200, "hello from inside\n")
        assert http_from_host(exposed.address)[0] == 401
        sb.destroy()
        assert not listening(exposed.address)
        assert not qemu_pids(sid)
        assert_clean(d)
    finally:
        d.stop()
        drop_table(d)


def test_no_network_on_a_node_without_one(client: warren.Client, base_layer: str) -> None:
    if "microvm" not in client.status().backends:
        pytest.skip("microvm: not offered by this warrend")
    with pytest.raises(warren.FailedPrecondition, match="microvm offers no network.*sandbox-net"):
        client.create(backend="microvm", layers=[base_layer], memory_mb=256, network={"allow": []})
