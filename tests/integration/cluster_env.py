"""Clusters of real warrend nodes for the integration tests.

* `Etcd`: one etcd member (Debian's etcd-server) on ports of its own.
* `EtcdMembers`: one or more etcd members of one cluster, each on an address
  of its own (a network namespace of NetnsCluster's), killable one by one.
* `NetnsCluster`: the second configuration of the SDK suite
  (WARREN_TEST_CLUSTER=N, conftest.py), and the failure tests'
  (test_cluster_failure.py): etcd (1 or 3 members) and N warrend nodes, each
  node and each etcd member in a network namespace of its own (`ip netns`),
  joined to the host by a veth pair on a bridge of the tests (addresses of a
  /24 of 198.18.0.0/15, the benchmarking range, checked unused on this host);
  each node with its own state dir, socket, run dir and cgroup subtree (a
  child cgroup of the tests' own in every hierarchy, which warrend's
  `warren/` subtree then lives in). The nodes listen, advertise and call
  each other on their namespace's address, etcd members on theirs (every
  node on the same port, every member on 2379/2380: the namespaces are
  apart). The tests talk to the entry node (node 1) on its unix socket (a
  path: reachable from any network namespace), and to etcd over the bridge.
  Everything is removed at stop (nodes, etcd, cgroups, veths, bridge,
  namespaces), every wait is bounded.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Dict, Iterable, List, Optional

import pytest
from conftest import wait_until

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
ETCDCTL = shutil.which("etcdctl") or "/usr/bin/etcdctl"



def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Etcd:
    """One etcd member on `host`: its own client and peer ports and data dir."""

    def __init__(self, root: Path, name: str = "etcd", host: str = "127.0.0.1") -> None:
        self.dir = root / name
        self.client_port = free_port(host)
        self.peer_port = free_port(host)
        self.url = f"http://{host}:{self.client_port}"
        self.peer = f"http://{host}:{self.peer_port}"
        self.log = root / f"{name}.log"
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "Etcd":
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [ETCD, "--name", "it", "--data-dir", str(self.dir), "--listen-client-urls", self.url,
                 "--advertise-client-urls", self.url, "--listen-peer-urls", self.peer,
                 "--initial-advertise-peer-urls", self.peer, "--initial-cluster", f"it={self.peer}",
                 "--initial-cluster-state", "new", "--listen-metrics-urls", ""],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail("etcd exited at start:\n" + self.log.read_text(errors="replace")[-3000:])
            if self.ctl("endpoint", "health", check=False).returncode == 0:
                return self
            time.sleep(0.2)
        self.stop()
        pytest.fail("etcd not healthy within 30 s:\n" + self.log.read_text(errors="replace")[-3000:])

    def ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([ETCDCTL, "--endpoints", self.url, "--dial-timeout", "2s", *args],
                              capture_output=True, text=True, timeout=20, check=check,
                              env={**os.environ, "ETCDCTL_API": "3"})

    def nodes(self) -> Dict[str, dict]:
        """The node records registered now, by node id."""
        out = self.ctl("get", "--prefix", "/warren/nodes/", "--print-value-only").stdout
        recs = [json.loads(line) for line in out.splitlines() if line.strip()]
        return {r["id"]: r for r in recs}

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)


class EtcdMembers:
    """The members of one etcd cluster, member i listening on `hosts[i]`
    (ports 2379 client, 2380 peer) and started behind the command prefix
    `wraps[i]` (NetnsCluster: its network namespace). `url` lists every
    member's client URL (what --cluster takes)."""

    CLIENT_PORT = 2379
    PEER_PORT = 2380

    def __init__(self, root: Path, name: str, hosts: List[str], wraps: List[List[str]]) -> None:
        self.root = root
        self.name = name
        self.members = [f"{name}{i}" for i in range(len(hosts))]
        self.urls = [f"http://{h}:{self.CLIENT_PORT}" for h in hosts]
        self.peers = [f"http://{h}:{self.PEER_PORT}" for h in hosts]
        self.url = ",".join(self.urls)
        self.wraps = wraps
        self.procs: List[subprocess.Popen] = []

    def log(self, i: int) -> Path:
        return self.root / f"{self.members[i]}.log"

    def start(self) -> "EtcdMembers":
        initial = ",".join(f"{n}={p}" for n, p in zip(self.members, self.peers))
        for i, (n, url, peer) in enumerate(zip(self.members, self.urls, self.peers)):
            with open(self.log(i), "ab") as log:
                self.procs.append(subprocess.Popen(
                    [*self.wraps[i], ETCD, "--name", n, "--data-dir", str(self.root / n), "--listen-client-urls",
                     url, "--advertise-client-urls", url, "--listen-peer-urls", peer, "--initial-advertise-peer-urls",
                     peer, "--initial-cluster", initial, "--initial-cluster-state", "new", "--initial-cluster-token",
                     self.name, "--listen-metrics-urls", ""],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for i, p in enumerate(self.procs):
                if p.poll() is not None:
                    self.stop()
                    pytest.fail(f"etcd member {self.members[i]} exited at start:\n" +
                                self.log(i).read_text(errors="replace")[-3000:])
            if self.ctl("endpoint", "health", check=False).returncode == 0:
                return self
            time.sleep(0.2)
        self.stop()
        pytest.fail(f"{len(self.procs)} etcd member(s) not healthy within 60 s:\n" +
                    "\n".join(self.log(i).read_text(errors="replace")[-1500:] for i in range(len(self.procs))))

    def live_urls(self) -> str:
        return ",".join(u for u, p in zip(self.urls, self.procs) if p.poll() is None)

    def ctl(self, *args: str, check: bool = True, urls: str = "") -> subprocess.CompletedProcess:
        return subprocess.run([ETCDCTL, "--endpoints", urls or self.url, "--dial-timeout", "2s",
                               "--command-timeout", "5s", *args], capture_output=True, text=True, timeout=30,
                              check=check, env={**os.environ, "ETCDCTL_API": "3"})

    def nodes(self) -> Dict[str, dict]:
        """The node records registered now (read from the live members), by node id."""
        out = self.ctl("get", "--prefix", "/warren/nodes/", "--print-value-only", urls=self.live_urls()).stdout
        recs = [json.loads(line) for line in out.splitlines() if line.strip()]
        return {r["id"]: r for r in recs}

    def kill(self, i: int) -> None:
        """SIGKILL to member i (the pid is etcd's own: the prefix execs it)."""
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait(timeout=30)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=20)


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=False)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def _subnet_free(prefix: str) -> bool:
    """No route of this host (but the default) covers the prefix, no address
    of it is on an interface."""
    routes = [ln for ln in ip("-4", "route", "show", "match", prefix).stdout.splitlines()
              if not ln.startswith("default")]
    net = prefix.rsplit(".", 1)[0] + "."
    return not routes and f" {net}" not in ip("-4", "-o", "addr", "show").stdout


# cgroup v1 controllers whose new child needs its parent's values before a
# task may join (cpuset), copied down.
_CPUSET_FILES = ("cpuset.cpus", "cpuset.mems")


class NetnsCluster:
    """etcd + N warrend nodes, each in its own network namespace and cgroup
    subtree (see the module doc). `nodes[0]` is the entry."""

    PORT = 7000  # every node's TCP port, in its own namespace
    LEASE_S = 3
    REFRESH_MS = 500

    def __init__(self, root: Path, layer_store: Path, n: int, node_prefix: str,
                 daemon_cls: type, extra_args: Iterable[str] = (), etcd_members: int = 1,
                 name: str = "node") -> None:
        from conftest import cgroup_dirs  # conftest imports this module lazily

        if not 1 <= n <= 50 or etcd_members not in (1, 3, 5):
            raise ValueError(f"NetnsCluster: want 1..50 nodes and 1, 3 or 5 etcd members, not {n} and {etcd_members}")
        self.root = root
        self.layer_store = layer_store
        self.n = n
        self.name = name
        self.tag = uuid.uuid4().hex[:6]
        self.bridge = f"wcb{self.tag}"
        self.netns = [f"wclu-{self.tag}-{i}" for i in range(n)]  # the nodes'
        self.veths = [f"wcv{self.tag}{i}" for i in range(n)]
        self.etcd_netns = [f"wclu-{self.tag}-e{j}" for j in range(etcd_members)]
        self.etcd_veths = [f"wce{self.tag}{j}" for j in range(etcd_members)]
        self.prefix = ""
        self.host_addr = ""
        self.addrs: List[str] = []  # the nodes'
        self.etcd_addrs: List[str] = []
        self.node_prefix = node_prefix
        self.daemon_cls = daemon_cls
        self.extra_args = list(extra_args)
        self.etcd: Optional[EtcdMembers] = None
        self.nodes: List = []
        # The tests' own cgroup per hierarchy: each node gets a child of it.
        self.own_cgroups: Dict[str, Path] = cgroup_dirs()
        self.node_cgroups: List[List[Path]] = []
        self.token_file = root / f"{name}-cluster.token"
        self._made_bridge = False
        self._made_netns: List[str] = []

    # ------------------------------------------------------------ network

    def _pick_subnet(self) -> None:
        # 198.18.0.0/15 (RFC 2544, benchmarking): a /24 of it no route or
        # address of this host covers; at most 16 tries.
        base = os.getpid() % 200
        for k in range(16):
            third = (base + k * 7) % 256
            prefix = f"198.18.{third}.0/24"
            if _subnet_free(prefix):
                self.prefix = prefix
                self.host_addr = f"198.18.{third}.1"
                self.addrs = [f"198.18.{third}.{10 + i}" for i in range(self.n)]
                self.etcd_addrs = [f"198.18.{third}.{200 + j}" for j in range(len(self.etcd_netns))]
                return
        pytest.fail("no free /24 in 198.18.0.0/15 for the cluster's namespaces (16 tried)")

    def _network_up(self) -> None:
        self._pick_subnet()
        ip("link", "add", self.bridge, "type", "bridge")
        self._made_bridge = True
        ip("addr", "add", f"{self.host_addr}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for ns, veth, addr in zip(self.netns + self.etcd_netns, self.veths + self.etcd_veths,
                                  self.addrs + self.etcd_addrs):
            ip("netns", "add", ns)
            self._made_netns.append(ns)
            ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            ip("link", "set", veth, "master", self.bridge)
            ip("link", "set", veth, "up")
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "route", "add", "default", "via", self.host_addr)

    def _network_down(self) -> None:
        for veth in self.veths + self.etcd_veths:
            if ip("link", "show", veth, check=False).returncode == 0:
                ip("link", "del", veth, check=False)
        for ns in self._made_netns:
            ip("netns", "del", ns, check=False)
        if self._made_bridge:
            ip("link", "del", self.bridge, check=False)

    # ------------------------------------------------------------ cgroups

    def _cgroups_up(self, i: int) -> List[Path]:
        made: List[Path] = []
        for own in self.own_cgroups.values():
            d = own / f"warren-cluster-{self.tag}-{i}"
            d.mkdir(exist_ok=True)
            made.append(d)
            for f in _CPUSET_FILES:
                if (own / f).exists() and (d / f).read_text().strip() == "":
                    (d / f).write_text((own / f).read_text())
        return made

    @staticmethod
    def _rmdir_tree(d: Path) -> None:
        """Removes an emptied cgroup and its (empty) children, deepest first."""
        if not d.exists():
            return
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(str(p))):
            try:
                sub.rmdir()
            except OSError:
                pass
        for _ in range(50):  # the last tasks may take a moment to leave
            try:
                d.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)

    # ------------------------------------------------------------ nodes

    def _wrap(self, i: int, cgroups: List[Path]) -> List[str]:
        """The command prefix of node i: join its cgroups (the shell's pid,
        which exec keeps), then its network namespace (nsenter --net only: the
        mount namespace stays the host's, unlike `ip netns exec`, which remounts
        /sys and would hide the cgroup file systems)."""
        joins = " ".join(f"echo $$ > {d / 'cgroup.procs'} &&" for d in cgroups)
        return ["/bin/sh", "-c", f'{joins} exec nsenter --net=/run/netns/{self.netns[i]} "$@"', "warrend"]

    def start(self) -> "NetnsCluster":
        try:
            self._network_up()
            self.token_file.write_text(f"cluster-{self.name}-{self.tag}\n")
            self.token_file.chmod(0o600)
            self.etcd = EtcdMembers(self.root, f"etcd-{self.name}-", self.etcd_addrs,
                                    [["nsenter", f"--net=/run/netns/{ns}"] for ns in self.etcd_netns]).start()
            for i in range(self.n):
                cgs = self._cgroups_up(i)
                self.node_cgroups.append(cgs)
                addr = f"{self.addrs[i]}:{self.PORT}"
                node = self.daemon_cls(
                    self.root, f"{self.name}{i + 1}", self.layer_store, f"{self.node_prefix}n{i + 1}",
                    extra_args=[*self.extra_args, "--listen", addr, "--token-file", str(self.token_file),
                                "--cluster", f"etcd={self.etcd.url}", "--cluster-lease-s", str(self.LEASE_S),
                                "--cluster-refresh-ms", str(self.REFRESH_MS)],
                    wrap=self._wrap(i, cgs))
                node.address = addr
                self.nodes.append(node)
                node.start()
            ids = {n.node_id for n in self.nodes}
            etcd = self.etcd
            wait_until(lambda: ids <= set(etcd.nodes()), 20, f"{self.n} registered nodes")
            # Every node sees every other before anything is placed.
            entry = self.nodes[0].client
            wait_until(lambda: {x.id for x in entry.nodes()} >= ids, 10, "the entry to see every node")
            return self
        except BaseException:
            self.stop()
            raise

    def stop(self, destroy: bool = True) -> List[int]:
        """Stops every node (destroying its sandboxes first), then etcd; removes
        the cgroups, veths, bridge and namespaces. Returns the nodes' exit codes."""
        rcs = []
        for node in self.nodes:
            rcs.append(node.stop(destroy=destroy))
        if self.etcd:
            self.etcd.stop()
        for cgs in self.node_cgroups:
            for d in cgs:
                self._rmdir_tree(d)
        self._network_down()
        return rcs

    def in_netns(self, i: int, *cmd: str, timeout: float = 20) -> subprocess.CompletedProcess:
        return subprocess.run(["nsenter", f"--net=/run/netns/{self.netns[i]}", *cmd], capture_output=True,
                              text=True, timeout=timeout, check=False)
