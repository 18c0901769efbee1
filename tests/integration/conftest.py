"""Shared fixtures of the integration tests: a REAL warrend started as a
subprocess on a private state dir, the base layer built once per session, and
the host "leak baseline" (what a sandbox may leave behind on the host).

Environment knobs:
  WARREN_WARREND      path of warrend (default build/src/warrend/warrend)
  WARREN_CLI          path of the CLI (default build/src/cli/warren)
  WARREN_BASE_ROOTFS  base rootfs dir (default /var/cache/warren/rootfs/debian-12)
  WARREN_TEST_ROOT    parent dir of the per-session test root (default /var/tmp)
  WARREN_A13_CYCLES   cycles of the leak test (default 5000)
  WARREN_TEST_CLUSTER N >= 2: the second configuration of the suite: the session
                      daemon is a cluster (a real etcd and N warrend nodes, each in
                      its own network namespace and cgroup subtree:
                      cluster_env.NetnsCluster) and the tests' client talks to its
                      entry node; only the files of CLUSTER_SUITE run, and tests
                      marked single_node are skipped, saying why (default: unset,
                      one daemon)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Set, TypeVar

import pytest

import warren

REPO = Path(__file__).resolve().parents[2]
WARREND = Path(os.environ.get("WARREN_WARREND", REPO / "build/src/warrend/warrend"))
CLI = Path(os.environ.get("WARREN_CLI", REPO / "build/src/cli/warren"))
BASE_ROOTFS = Path(os.environ.get("WARREN_BASE_ROOTFS", "/var/cache/warren/rootfs/debian-12"))
BASE = "base/debian-12@1"

# Node ids of the daemons of this session: distinct from any other warrend on
# the machine, so the leak checks below only count our own sandboxes (sandbox
# ids, and the cgroups named after them, start with "<node id>-").
NODE_PREFIX = f"it{os.getpid()}"

# ---------------------------------------------------------------- cluster configuration

def _cluster_nodes() -> int:
    """WARREN_TEST_CLUSTER's node count; -1 when it is not one (pytest_configure says so)."""
    v = os.environ.get("WARREN_TEST_CLUSTER", "").strip()
    if v in ("", "0"):
        return 0
    if not v.isdigit() or int(v) < 2 or int(v) > 16:
        return -1
    return int(v)


CLUSTER_NODES = _cluster_nodes()

# The SDK-level files that run in the cluster configuration (through the entry
# node, which places creates and forwards every later call): sandbox
# lifecycle, exec, streams, files, processes, sessions, the async SDK, fork,
# jobs, suspend, bad input, the CLI. Not listed: files about one host's
# internals (containment, isolation, cgroups, density, fast create, restart,
# faults, metrics, microVMs/VMs, network policy, images), the harness
# integrations, and the cluster's own tests (test_cluster*.py start their own).
CLUSTER_SUITE = (
    "test_cluster_suite.py",  # the configuration itself: namespaces, addresses, cgroups, spread
    "test_async.py",
    "test_bad_input.py",
    "test_cli.py",
    "test_cli_lifecycle.py",
    "test_cli_stream.py",
    "test_etc_hosts.py",
    "test_eval.py",
    "test_exec.py",
    "test_files.py",
    "test_fork.py",
    "test_fork_server.py",
    "test_isolation.py",
    "test_lifecycle.py",
    "test_lifecycle_rl.py",
    "test_sdk_gaps.py",
    "test_session_state.py",
    "test_stream.py",
    "test_suspend.py",
)


def pytest_configure(config):
    if CLUSTER_NODES < 0:
        raise pytest.UsageError(f"WARREN_TEST_CLUSTER={os.environ['WARREN_TEST_CLUSTER']!r}: expected a node count "
                                "from 2 to 16 (or unset, or 0: one daemon)")
    config.addinivalue_line(
        "markers", "single_node(reason): skipped in the cluster configuration (WARREN_TEST_CLUSTER), with reason")
    config.addinivalue_line(
        "markers", "cluster_gap(reason): fails in the cluster configuration for a known gap of the cluster (reason);"
        " expected to fail there (strict: a fixed gap fails the run until the mark goes)")


def pytest_collection_modifyitems(config, items):
    """Cluster configuration: keeps the files of CLUSTER_SUITE, skips their
    tests marked single_node with the mark's reason."""
    if not CLUSTER_NODES:
        return
    keep, drop = [], []
    for item in items:
        (keep if item.path.name in CLUSTER_SUITE else drop).append(item)
        if item.path.name not in CLUSTER_SUITE:
            continue
        for mark, make in (("single_node", lambda why: pytest.mark.skip(reason=f"single node only: {why}")),
                           ("cluster_gap", lambda why: pytest.mark.xfail(reason=f"cluster gap: {why}", strict=True))):
            m = item.get_closest_marker(mark)
            if m is None:
                continue
            why = m.args[0] if m.args else m.kwargs.get("reason", "")
            if not why:
                raise pytest.UsageError(f"{item.nodeid}: {mark} needs a reason")
            item.add_marker(make(why))
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# The nodes of the session cluster (cluster configuration): leak checks of
# the entry node cover them all.
_CLUSTER: List["Daemon"] = []
_CLUSTER_ENV: list = []  # the cluster_env.NetnsCluster of the session


# warrend's default --warm-shells (2 x cpus): pre-spawned shells a daemon keeps.
WARM_SHELLS_DEFAULT = 2 * (os.cpu_count() or 1)

# Documented cap (README "Limits"): warrend's resident memory may grow by at
# most this much while serving execs with huge outputs (default output cap
# 16 MiB per stream).
WARREND_RSS_GROWTH_CAP = 256 << 20


# ---------------------------------------------------------------- daemon

# Every daemon started in this session, for the logs attached to failures.
_DAEMONS: List["Daemon"] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for d in _DAEMONS:
            rep.sections.append((f"warrend {d.name} log (tail)", d.log_tail(60)))


def microvm_dir_args() -> List[str]:
    """--microvm-dir for test daemons: WARREN_MICROVM_DIR, else this tree's
    build/microvm-guest (scripts/microvm/build-guest.sh --out build/microvm-guest:
    a guest with this tree's agent), else warrend's default."""
    if "WARREN_MICROVM_DIR" in os.environ:
        return ["--microvm-dir", os.environ["WARREN_MICROVM_DIR"]]
    local = Path(__file__).resolve().parents[2] / "build" / "microvm-guest"
    if (local / "initramfs.cpio").exists():
        return ["--microvm-dir", str(local)]
    return []


class Daemon:
    """One warrend subprocess. state_dir/socket are private to it; the layer
    store may be shared between daemons (the store is designed to be shared by
    several nodes)."""

    def __init__(self, root: Path, name: str, layer_store: Path, node_id: str,
                 state_dir: Optional[Path] = None, extra_args: Iterable[str] = (),
                 wrap: Iterable[str] = ()):
        self.root = root
        self.name = name
        self.state_dir = state_dir or root / f"{name}-state"
        self.socket = root / f"{name}.sock"
        self.layer_store = layer_store
        self.node_id = node_id
        self.log_path = root / f"{name}.log"
        self.proc: Optional[subprocess.Popen] = None
        self.client: Optional[warren.Client] = None
        self.extra_args = list(extra_args)  # more warrend flags
        self.wrap = list(wrap)  # command prefix (cluster_env: cgroup and network namespace of a node)
        self.address = ""  # HOST:PORT of --listen (cluster nodes)
        self.past_pids: List[int] = []  # every pid this daemon ran as (warm shell cgroups are named by it)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 60.0) -> "Daemon":
        if not WARREND.exists():
            pytest.fail(f"warrend binary not found at {WARREND} (build it: cmake --preset release "
                        f"&& cmake --build build, or set WARREN_WARREND)")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self not in _DAEMONS:
            _DAEMONS.append(self)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [*self.wrap, str(WARREND), "--state-dir", str(self.state_dir), "--socket", str(self.socket),
             "--layer-store", str(self.layer_store), "--node-id", self.node_id] + self.extra_args,
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.root)
        log.close()
        self.past_pids.append(self.proc.pid)
        self.client = warren.Client("unix:" + str(self.socket))
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"warrend exited with {self.proc.returncode} at start:\n{self.log_tail()}")
            try:
                self.client.status(timeout=2)
                return self
            except warren.WarrenError:
                if time.monotonic() > deadline:
                    self.kill9()
                    pytest.fail(f"warrend did not answer Status within {timeout} s:\n{self.log_tail()}")
                time.sleep(0.1)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def destroy_all(self) -> None:
        assert self.client is not None
        for sb in self.client.list(timeout=30):
            try:
                sb.destroy(timeout=60)
            except warren.NotFound:
                pass

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
        if self.client:
            self.client.close()

    def stop(self, destroy: bool = True, timeout: float = 30.0) -> int:
        """Destroys every sandbox (they outlive the daemon otherwise), then
        SIGTERM; SIGKILL after timeout. Returns the exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        if destroy:
            try:
                self.destroy_all()
            except warren.WarrenError:
                pass
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait(timeout=30)
        if self.client:
            self.client.close()
        return rc


def _unmount_under(root: Path) -> None:
    """Last-resort cleanup so a failed run does not leak mounts on the machine."""
    for _ in range(3):
        mps = [mp for mp in _mount_points(Path("/proc/self/mountinfo")) if _under(mp, root)]
        if not mps:
            return
        for mp in sorted(mps, key=len, reverse=True):
            subprocess.run(["umount", "-l", mp], stderr=subprocess.DEVNULL, check=False)


def _ours_by_cgroup(cgroup_text: str) -> bool:
    """A sandbox cgroup of this session's daemons: named after one of our node
    ids (<node id>-<hex>), or a warm/recycled shell of one of our daemon pids
    (shell-<pid>-...)."""
    shells = tuple(f"shell-{pid}-" for d in _DAEMONS for pid in d.past_pids)
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        if "/warren/" not in path:
            continue
        leaf = path.rsplit("/warren/", 1)[1].split("/", 1)[0]
        if leaf.startswith(NODE_PREFIX) or (shells and leaf.startswith(shells)):
            return True
    return False


def _kill_leftover_sandboxes(root: Path) -> None:
    """Last resort after a hung or crashed daemon: SIGKILLs sandbox inits of
    this session (their cgroups carry our node ids or daemon pids; a
    sandbox's mountinfo does not name the host paths of its detached
    mounts), then removes their (now empty) cgroups."""
    cg_dirs: List[Path] = []
    mounts = _cgroup_mounts()
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            if Path(f"/proc/{e}/comm").read_text().strip() != "warren-init":
                continue
            cgroup_text = Path(f"/proc/{e}/cgroup").read_text()
            if not _ours_by_cgroup(cgroup_text) and str(root) not in Path(f"/proc/{e}/mountinfo").read_text():
                continue
            for line in cgroup_text.splitlines():
                _, ctrls, path = line.split(":", 2)
                key = ",".join(sorted(ctrls.split(","))) if ctrls else ""
                if key in mounts and "/warren/" in path:
                    cg_dirs.append(Path(mounts[key] + path))
            os.kill(int(e), signal.SIGKILL)
        except (OSError, ValueError):
            continue
    time.sleep(0.5)
    for d in cg_dirs:
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(str(p))):
            try:
                sub.rmdir()
            except OSError:
                pass
        try:
            d.rmdir()
        except OSError:
            pass


@pytest.fixture(scope="session")
def test_root() -> Iterable[Path]:
    parent = os.environ.get("WARREN_TEST_ROOT", "/var/tmp")
    root = Path(tempfile.mkdtemp(prefix="warren-it-", dir=parent))
    yield root
    for d in _DAEMONS:
        if d.proc and d.proc.poll() is None:
            d.stop()
    _kill_leftover_sandboxes(root)
    _unmount_under(root)
    subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)


@pytest.fixture(scope="session")
def layer_store(test_root: Path) -> Path:
    p = test_root / "layers"
    p.mkdir()
    return p


@pytest.fixture(scope="session")
def daemon(test_root: Path, layer_store: Path) -> Iterable[Daemon]:
    """The session's daemon: one warrend, or (WARREN_TEST_CLUSTER=N) the entry
    node of a cluster of N (cluster_env.NetnsCluster)."""
    if CLUSTER_NODES:
        from cluster_env import ETCD, NetnsCluster

        if not os.path.exists(ETCD):
            pytest.fail("WARREN_TEST_CLUSTER needs etcd (Debian's etcd-server: scripts/setup.sh)")
        cluster = NetnsCluster(test_root, layer_store, CLUSTER_NODES, NODE_PREFIX, Daemon,
                               extra_args=microvm_dir_args()).start()
        _CLUSTER[:] = cluster.nodes
        _CLUSTER_ENV[:] = [cluster]
        try:
            yield cluster.nodes[0]
        finally:
            rcs = cluster.stop()
            _CLUSTER.clear()
            _CLUSTER_ENV.clear()
        bad = {n.name: rc for n, rc in zip(cluster.nodes, rcs) if rc != 0}
        assert not bad, f"cluster nodes exited non-zero on SIGTERM: {bad}\n" + \
            "\n".join(n.log_tail() for n in cluster.nodes if n.name in bad)
        return
    d = Daemon(test_root, "main", layer_store, NODE_PREFIX + "a", extra_args=microvm_dir_args()).start()
    yield d
    rc = d.stop()
    assert rc == 0, f"warrend exited with {rc} on SIGTERM:\n{d.log_tail()}"


@pytest.fixture(scope="session")
def cluster(daemon: Daemon):
    """The cluster_env.NetnsCluster of the cluster configuration (skips otherwise)."""
    if not _CLUSTER_ENV:
        pytest.skip("the cluster configuration only (WARREN_TEST_CLUSTER=N)")
    return _CLUSTER_ENV[0]


@pytest.fixture(scope="session")
def client(daemon: Daemon) -> warren.Client:
    assert daemon.client is not None
    return daemon.client


@pytest.fixture(scope="session")
def base_layer(client: warren.Client) -> str:
    """Builds base/debian-12@1 from the debootstrapped rootfs (once)."""
    # build-base-rootfs.sh marks a finished tree with DIR.complete beside it.
    marker = BASE_ROOTFS.parent / (BASE_ROOTFS.name + ".complete")
    if not marker.exists() and not (BASE_ROOTFS / ".complete").exists():
        pytest.fail(f"base rootfs {BASE_ROOTFS} missing: run scripts/build-base-rootfs.sh {BASE_ROOTFS}")
    try:
        client.layers.get(BASE)
    except warren.NotFound:
        client.layers.build(BASE, dir=str(BASE_ROOTFS), timeout=900)
    return BASE


@pytest.fixture()
def sandbox(client: warren.Client, base_layer: str) -> Iterable[warren.Sandbox]:
    with client.create(layers=[base_layer], labels={"test": "1"}) as sb:
        yield sb


@pytest.fixture(scope="session")
def baseline(daemon: Daemon, client: warren.Client, base_layer: str) -> Dict[str, Set[str]]:
    """Host state with the daemon idle, after one warm-up sandbox (so lazily
    created, long-lived things such as the daemon's parent cgroup exist)."""
    with client.create(layers=[base_layer]) as sb:
        assert sb.exec("true", timeout=30).exit_code == 0
    return host_snapshot([daemon])


# ---------------------------------------------------------------- host snapshot


def _unescape(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def _mount_points(mountinfo: Path) -> List[str]:
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return []
    return [_unescape(l.split()[4]) for l in lines if len(l.split()) > 4]


def _under(path: str, root: Path) -> bool:
    r = str(root)
    return path == r or path.startswith(r.rstrip("/") + "/")


_DIGEST_DIR = re.compile(r"(^|/)(sha256[:_-]?)?[0-9a-f]{64}$")


def _cgroup_mounts() -> Dict[str, str]:
    """Controller set ("memory", "name=systemd", "" for v2) → mount point."""
    out: Dict[str, str] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        fields, pfields = pre.split(), post.split()
        if len(pfields) < 3:
            continue
        fstype, opts = pfields[0], pfields[2].split(",")
        mp = _unescape(fields[4])
        if fstype == "cgroup2":
            out.setdefault("", mp)
        elif fstype == "cgroup":
            ctrls = [o for o in opts if o not in ("rw", "ro") and not o.startswith(
                ("nosuid", "nodev", "noexec", "relatime", "release_agent", "clone_children", "xattr"))]
            out.setdefault(",".join(sorted(ctrls)), mp)
    return out


def cgroup_dirs(pid: int = 0) -> Dict[str, Path]:
    """For each hierarchy: the directory of the cgroup of pid (0 = self)."""
    mounts = _cgroup_mounts()
    out: Dict[str, Path] = {}
    for line in Path(f"/proc/{pid or 'self'}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        key = ",".join(sorted(ctrls.split(","))) if ctrls else ""
        mp = mounts.get(key)
        if mp is None:
            continue
        out[key or "unified"] = Path(mp + path)
    return out


def _walk_dirs(top: Path, limit: int = 200_000) -> Set[str]:
    out: Set[str] = set()
    for dirpath, dirnames, _ in os.walk(top):
        for d in dirnames:
            out.add(os.path.relpath(os.path.join(dirpath, d), top))
            if len(out) >= limit:
                return out
    return out


def _pidns(pid: object) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


def proc_table() -> Dict[int, tuple]:
    """pid -> (ppid, comm, state) of every process, from /proc/<pid>/stat."""
    table = {}
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            stat = Path(f"/proc/{e}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        rest = stat[stat.rindex(")") + 2:].split()
        table[int(e)] = (int(rest[1]), comm, rest[0])  # ppid, comm, state
    return table


def _ours(path: str, node_ids: Iterable[str]) -> bool:
    """True if a cgroup path has a component named after a sandbox of ours."""
    return any(c.startswith(n + "-") for c in path.split("/") for n in node_ids)


def sandbox_processes(daemon_pids: Iterable[int], node_ids: Iterable[str]) -> Set[str]:
    """Descendants of the daemons, plus processes in another pid namespace
    whose cgroup is one of our sandboxes' (sandbox inits are re-parented
    away from a daemon that died)."""
    node_ids = list(node_ids)
    table = proc_table()
    roots = set(daemon_pids)
    children: Dict[int, List[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: Set[int] = set()
    stack = list(roots)
    while stack:
        for c in children.get(stack.pop(), []):
            if c not in found:
                found.add(c)
                stack.append(c)
    ours = _pidns("self")
    my_cg = {k: str(v) for k, v in cgroup_dirs().items()}
    mounts = _cgroup_mounts()
    for pid in table:
        if pid in found or _pidns(pid) in ("", ours):
            continue
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            _, ctrls, path = line.split(":", 2)
            key = ",".join(sorted(ctrls.split(","))) if ctrls else ""
            mp = mounts.get(key)
            mine = my_cg.get(key or "unified")
            if mp and mine and (mp + path).startswith(mine.rstrip("/") + "/") and \
                    _ours(path, node_ids):
                found.add(pid)
                break
    # A live daemon's warm pool (--warm-shells, default 2 x cpus): its
    # children still named "warren-shell" come and go with every create; they
    # are no leak while there are at most the pool's size of them.
    shells: Dict[int, Set[int]] = {}
    for p in found:
        if p in table and table[p][1] == "warren-shell" and table[p][0] in roots:
            shells.setdefault(table[p][0], set()).add(p)
    for ppid, ps in shells.items():
        if len(ps) <= WARM_SHELLS_DEFAULT:
            found -= ps
    # A live daemon's pool of warmed-up microVM clones (--microvm-pool): it
    # fills in the background after the first microVM create, so its QEMUs
    # come after any baseline. A pool QEMU sits in a cgroup "pool-<h>-<k>"; once
    # a create takes it, its cgroup is the sandbox's (and it counts again).
    for p in list(found):
        if p in table and table[p][1].startswith("qemu-system") and _in_pool_cgroup(p):
            found.discard(p)
    return {f"{p}:{table[p][1]}" for p in found if p in table}


def _in_pool_cgroup(pid: int) -> bool:
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return False
    return any(re.fullmatch(r"pool-[0-9a-f]{8}-\d+", line.rsplit("/", 1)[-1]) for line in lines if "/" in line)


def microvm_pool_cgroup_prefix(daemon: "Daemon") -> str:
    """The name prefix of a daemon's microVM pool cgroups: pool-<h>- with h
    the FNV-1a 32 hash of its disk dir (PoolCgroup in
    src/runtime/microvm/microvm_backend.cc)."""
    h = 2166136261
    for c in f"{daemon.state_dir}/microvm-disks".encode():
        h = ((h ^ c) * 16777619) & 0xFFFFFFFF
    return f"pool-{h:08x}-"


def wait_warm_pool(daemon: "Daemon", timeout: float = 10.0) -> None:
    """Waits (bounded) until a daemon started with the default --warm-shells
    holds its full pool of shells (each holds a few fds in the daemon), so
    that counts of the daemon's fds/children compare like with like."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        table = proc_table()
        if sum(1 for ppid, comm, state in table.values()
               if ppid == daemon.pid and comm == "warren-shell" and state != "Z") >= WARM_SHELLS_DEFAULT:
            return
        time.sleep(0.05)


def _with_cluster(daemons: Iterable[Daemon]) -> List[Daemon]:
    daemons = list(daemons)
    if any(d in _CLUSTER for d in daemons):
        daemons += [n for n in _CLUSTER if n not in daemons]
    return daemons


def host_snapshot(daemons: Iterable[Daemon], extra_roots: Iterable[Path] = ()) -> Dict[str, Set[str]]:
    """What sandboxes may leave on the host, by kind. Layer mounts (mount
    points named by a digest) are excluded: they are shared, refcounted and
    kept for a grace period on purpose; layer refcounts are checked through
    the API (Layer.in_use) instead. The entry node of the cluster
    configuration stands for every node of it."""
    daemons = _with_cluster(daemons)
    node_ids = [d.node_id for d in daemons]
    snap: Dict[str, Set[str]] = {}
    snap["cgroup"] = set()
    # Warm shell cgroups ("shell-<daemon pid>-<n>") of a daemon pid that is
    # no longer running: the next start of the daemon must have swept them.
    live_pids = {d.pid for d in daemons if d.proc and d.proc.poll() is None}
    dead_pids = {str(p) for d in daemons for p in d.past_pids if p not in live_pids}
    for key, d in cgroup_dirs().items():
        snap["cgroup"] |= {f"{key}:{p}" for p in _walk_dirs(d) if _ours(p, node_ids) or
                           any(c.startswith("shell-") and c.split("-")[1:2] == [dp]
                               for c in p.split("/") for dp in dead_pids)}
    roots = [d.root for d in daemons] + [d.state_dir for d in daemons] + list(extra_roots)
    mps: Set[str] = set()
    for mi in [Path("/proc/self/mountinfo")] + [Path(f"/proc/{d.pid}/mountinfo")
                                                 for d in daemons if d.proc and d.proc.poll() is None]:
        for mp in _mount_points(mi):
            if any(_under(mp, r) for r in roots) and not _DIGEST_DIR.search(mp):
                mps.add(mp)
    snap["mount"] = mps
    lo = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=False).stdout
    snap["loop"] = {l for l in lo.splitlines() if any(str(r) in l for r in roots)}
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False).stdout
    snap["link"] = {l.split(":")[1].strip() for l in links.splitlines() if ":" in l}
    for d in daemons:
        for sub in ("run", "sandboxes"):
            p = d.state_dir / sub
            snap[f"{d.name}/{sub}"] = set(os.listdir(p)) if p.is_dir() else set()
    live = [d.pid for d in daemons if d.proc and d.proc.poll() is None]
    snap["proc"] = sandbox_processes(live, node_ids)
    return snap


def assert_back_to_baseline(daemons: Iterable[Daemon], base: Dict[str, Set[str]],
                            timeout: float = 30.0, clients: Iterable[warren.Client] = ()) -> None:
    """Waits (bounded) until nothing is on the host that was not in base, and
    no layer is still counted in use. Things that disappeared are fine."""
    daemons = _with_cluster(daemons)
    deadline = time.monotonic() + timeout
    while True:
        now = host_snapshot(daemons)
        extra = {k: sorted(now[k] - base.get(k, set()))[:20] for k in now}
        extra = {k: v for k, v in extra.items() if v}
        in_use = []
        for c in clients:
            in_use += [f"{l.name or l.digest}: in_use={l.in_use}" for l in c.layers.list() if l.in_use]
            in_use += [f"sandbox {s.id} still listed" for s in c.list()]
        if not extra and not in_use:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"host not back to baseline after {timeout} s: {extra} {in_use}")
        time.sleep(0.5)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


# ---------------------------------------------------------------- microVMs
def qemu_pids(needle: str) -> set[int]:
    """QEMU processes whose command line mentions `needle` (a sandbox id),
    and those in the cgroup of the microVM sandbox of that id (a microVM
    taken from the pool of restored clones keeps its pool name in `ps`)."""
    out = set()
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{e}/cmdline").read_bytes()
        except OSError:
            continue
        if cmd.startswith(b"/usr/bin/qemu-system") and needle.encode() in cmd:
            out.add(int(e))
    if needle and "/" not in needle and not needle.startswith("."):
        for cg in vm_cgroups(needle):
            try:
                pids = (cg / "cgroup.procs").read_text().split()
            except OSError:
                continue
            for pid in pids:
                try:
                    if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"/usr/bin/qemu-system"):
                        out.add(int(pid))
                except OSError:
                    continue
    return out


_T = TypeVar("_T")


def wait_until(pred: Callable[[], _T], timeout: float, what: str, step: float = 0.1) -> _T:
    """pred()'s first truthy value, polled every `step` s; fails the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


def vm_cgroups(sandbox_id: str, kind: str = "warren-microvm") -> List[Path]:
    """The sandbox's VM cgroup dirs that exist, in every hierarchy (`kind`:
    "warren-microvm" or "warren-vm"). The daemons are started from this
    process's cgroup: their subtrees are ours."""
    return [p for d in cgroup_dirs().values() if (p := d / kind / sandbox_id).exists()]


def one_qemu(sandbox_id: str) -> int:
    """The pid of the one running QEMU of a sandbox (fails if not exactly one)."""
    pids = [p for p in qemu_pids(sandbox_id) if running(p)]
    assert len(pids) == 1, [_qemu_what(p) for p in pids]
    return pids[0]


def _qemu_what(pid: int) -> str:
    """A QEMU named for a failure message: pid, parent, cgroups, -name."""
    try:
        st = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cgs = sorted({line.split(":", 2)[2] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()})
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        name = argv[argv.index(b"-name") + 1].decode() if b"-name" in argv else "?"
    except (OSError, ValueError, IndexError) as e:
        return f"{pid} ({e})"
    return f"{pid} ppid={st[1]} state={st[0]} name={name} cgroups={cgs}"


def running(pid: int) -> bool:
    """pid exists and is not a zombie (after a daemon restart QEMU is the
    host init's child: init reaps it, in its own time)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
