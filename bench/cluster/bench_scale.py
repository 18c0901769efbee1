#!/usr/bin/env python3
"""Scale simulation of cluster placement (issue 15): 160 simulated nodes
registered in a real etcd (records as a warrend writes them, under one lease),
each a fake warren.v1 Sandboxes service that accepts a create at once, and
one real warrend entry node (--cluster-drain: it places every create on the
others and makes none itself) placing creates sent to its unix socket.
Measures the entry's placed creates per second (each one placement decision
plus the forwarded Create RPC), the entry's CPU per create, and how they
spread over the 160.

  .venv/bin/python bench/cluster/bench_scale.py [--nodes 160] [--creates 20000]
      [--clients 2] [--concurrency 64] [--fake-procs 2] [--peer cpp|python]
      [--baseline OTHER_WARREND] [--rounds N] [--gets]

--peer cpp (default): the fakes and the load are build/src/cluster/scale_peer
(C++, gRPC callback API: one load process with clients x concurrency creates
in flight); python: grpc.aio fakes and --clients load processes. Either runs
on the same cores as the entry: the wall rate is a lower bound of what the
entry carries, the rate per CPU-second of the entry what a core of its own
would. --baseline: a second warrend (A) runs beside this build's (B), both
drained, measured in turns (ABBA) in the same invocation; the summary gives
B/A. --gets: also the same load of forwarded Gets (the relay alone). Needs
etcd (scripts/setup.sh) and a built warrend (and scale_peer).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[2]
WARREND = Path(os.environ.get("WARREN_WARREND", REPO / "build/src/warrend/warrend"))
SCALE_PEER = Path(os.environ.get("WARREN_SCALE_PEER", REPO / "build/src/cluster/scale_peer"))
PREFIX = "/warren/nodes/"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def etcdctl(url: str, *args: str, stdin: str | None = None) -> str:
    r = subprocess.run(["etcdctl", "--endpoints", url, "--dial-timeout", "2s", *args], input=stdin,
                       capture_output=True, text=True, timeout=60, check=False, env={**os.environ, "ETCDCTL_API": "3"})
    if r.returncode != 0:
        raise SystemExit(f"etcdctl {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


# ------------------------------------------------------------ fake nodes

def fake_main(ids: List[str], out: "mp.Queue") -> None:
    """Serves one fake Sandboxes service per node id, each on its own port;
    puts [(id, address)] on `out`, then serves until SIGTERM."""
    import grpc

    from warren._proto import warren_pb2, warren_pb2_grpc

    class Fake(warren_pb2_grpc.SandboxesServicer):
        def __init__(self, node: str) -> None:
            self.node = node
            self.n = 0

        async def Create(self, request, context):  # noqa: N802 (gRPC method name)
            self.n += 1
            return warren_pb2.Sandbox(id=f"{self.node}-{self.n:012x}", backend=request.backend or "container",
                                      state=warren_pb2.SANDBOX_STATE_RUNNING)

        async def Get(self, request, context):  # noqa: N802
            return warren_pb2.Sandbox(id=request.id, backend="container", state=warren_pb2.SANDBOX_STATE_RUNNING)

    async def serve() -> None:
        servers, addrs = [], []
        for node in ids:
            s = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
            warren_pb2_grpc.add_SandboxesServicer_to_server(Fake(node), s)
            port = s.add_insecure_port("127.0.0.1:0")
            await s.start()
            servers.append(s)
            addrs.append((node, f"127.0.0.1:{port}"))
        out.put(addrs)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        for s in servers:
            await s.stop(0)

    asyncio.run(serve())


def record(node: str, address: str) -> str:
    """A node record as a warrend writes it (src/cluster/node_record.cc):
    room for every create of the run."""
    return json.dumps({
        "id": node, "address": address, "version": "fake", "backends": ["container"], "cpus": 64,
        "memory_mb": 262144, "max_sandboxes": 16384, "sandboxes": 0, "free_slots": 16384,
        "free_cpu_millis": 64000, "free_memory_mb": 262144, "available_memory_mb": 262144,
        "creates_in_flight": 0, "creates_queued": 0, "load1": 0.0, "layers": ["base/debian-12@1"],
        "drain": False, "updated_ns": time.time_ns(), "core_scheduling": "absent"})


# ------------------------------------------------------------ load

def client_main(sock: str, creates: int, concurrency: int, out: "mp.Queue", kind: str = "create") -> None:
    """Sends `creates` Create calls to the entry (kind "get": Get of a fake
    node's sandbox, forwarded to it without a placement), `concurrency` in
    flight; puts (latencies, owners by node, errors, first, last) on `out`."""
    import grpc

    from warren._proto import warren_pb2, warren_pb2_grpc

    async def run() -> None:
        lat: List[float] = []
        owners: Dict[str, int] = {}
        errors: Dict[str, int] = {}
        async with grpc.aio.insecure_channel("unix:" + sock) as ch:
            stub = warren_pb2_grpc.SandboxesStub(ch)
            req = warren_pb2.CreateSandboxRequest(backend="container", layers=["base/debian-12@1"])
            get = warren_pb2.GetSandboxRequest(id="fake000-000000000001")
            left = [creates]

            async def worker() -> None:
                while left[0] > 0:
                    left[0] -= 1
                    t0 = time.perf_counter()
                    try:
                        sb = await (stub.Create(req, timeout=30) if kind == "create" else stub.Get(get, timeout=30))
                    except grpc.aio.AioRpcError as e:
                        errors[e.code().name] = errors.get(e.code().name, 0) + 1
                        continue
                    lat.append(time.perf_counter() - t0)
                    node = sb.id.rsplit("-", 1)[0]
                    owners[node] = owners.get(node, 0) + 1

            t_first = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            t_last = time.monotonic()
        out.put((lat, owners, errors, t_first, t_last))

    asyncio.run(run())


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all its threads (/proc/<pid>/stat)."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def pct(xs: List[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def start_cpp_fakes(ids: List[str], procs: int) -> tuple:
    """`scale_peer fakes` processes serving `ids`: (processes, [(id, address)])."""
    ps, addrs = [], []
    for k in range(procs):
        p = subprocess.Popen([str(SCALE_PEER), "fakes", *ids[k::procs]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
        ps.append(p)
        assert p.stdout is not None
        for line in p.stdout:
            if line.strip() == "ready":
                break
            node, address = line.split()
            addrs.append((node, address))
        else:
            raise SystemExit(f"scale_peer fakes exited with {p.wait()} before it was ready")
    return ps, addrs


def cpp_load(sock: str, kind: str, creates: int, concurrency: int) -> tuple:
    """`scale_peer load`: (latencies s, owners, errors, first, last) as client_main puts them."""
    r = subprocess.run([str(SCALE_PEER), "load", "unix:" + sock, kind, str(creates), str(concurrency)],
                       capture_output=True, text=True, timeout=900, check=False)
    if r.returncode != 0:
        raise SystemExit(f"scale_peer load failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    o = json.loads(r.stdout)
    names = {str(v): k for k, v in GRPC_CODES.items()}
    return ([x / 1e6 for x in o["lat_us"]], o["owners"], {names.get(k, k): v for k, v in o["errors"].items()},
            o["first"], o["last"])


GRPC_CODES = {"CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4, "NOT_FOUND": 5,
              "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8, "FAILED_PRECONDITION": 9, "ABORTED": 10,
              "INTERNAL": 13, "UNAVAILABLE": 14}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=160)
    ap.add_argument("--creates", type=int, default=20000)
    ap.add_argument("--clients", type=int, default=2, help="load processes (python load)")
    ap.add_argument("--concurrency", type=int, default=64, help="creates in flight per load process")
    ap.add_argument("--fake-procs", type=int, default=2, help="processes serving the fake nodes")
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--peer", choices=["cpp", "python"], default="cpp",
                    help="fakes and load: C++ (scale_peer, callback API) or Python (grpc.aio)")
    ap.add_argument("--baseline", metavar="WARREND",
                    help="a second warrend binary (A) measured against this build's (B) in the same run")
    ap.add_argument("--rounds", type=int, default=1, help="measured rounds per entry (ABBA order with --baseline)")
    ap.add_argument("--gets", action="store_true", help="also measure forwarded Gets (the relay alone)")
    args = ap.parse_args()
    if not 1 <= args.nodes <= 1000 or args.creates < 1 or args.clients < 1 or args.concurrency < 1 \
            or not 1 <= args.fake_procs <= args.nodes or not 1 <= args.rounds <= 50:
        raise SystemExit("bad arguments: want 1 <= --nodes <= 1000, --creates/--clients/--concurrency >= 1, "
                         "1 <= --fake-procs <= --nodes, 1 <= --rounds <= 50")
    if not shutil.which("etcd") or not shutil.which("etcdctl"):
        raise SystemExit("etcd/etcdctl not installed (scripts/setup.sh)")
    entries = [("B", WARREND)]
    if args.baseline:
        entries.insert(0, ("A", Path(args.baseline)))
    for _, binary in entries:
        if not binary.exists():
            raise SystemExit(f"warrend not found at {binary} (build it, or set WARREN_WARREND)")
    if args.peer == "cpp" and not SCALE_PEER.exists():
        raise SystemExit(f"{SCALE_PEER} not found (ninja -C build scale_peer), or use --peer python")
    root = Path(tempfile.mkdtemp(prefix="warren-bench-scale-", dir="/var/tmp"))
    procs: List[subprocess.Popen] = []
    fakes: List[mp.Process] = []
    ctx = mp.get_context("spawn")
    try:
        cport, pport = free_port(), free_port()
        url, peer = f"http://127.0.0.1:{cport}", f"http://127.0.0.1:{pport}"
        with open(root / "etcd.log", "wb") as log:
            procs.append(subprocess.Popen(
                ["etcd", "--name", "s", "--data-dir", str(root / "etcd"), "--listen-client-urls", url,
                 "--advertise-client-urls", url, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"s={peer}", "--listen-metrics-urls", ""], stdout=log, stderr=subprocess.STDOUT))
        for _ in range(150):
            if subprocess.run(["etcdctl", "--endpoints", url, "endpoint", "health"], capture_output=True,
                              check=False, env={**os.environ, "ETCDCTL_API": "3"}).returncode == 0:
                break
            time.sleep(0.2)
        else:
            raise SystemExit("etcd not healthy within 30 s")

        # The fake nodes: one lease for all their records (they never refresh).
        ids = [f"fake{i:03d}" for i in range(args.nodes)]
        if args.peer == "cpp":
            fps, addrs = start_cpp_fakes(ids, args.fake_procs)
            procs.extend(fps)
        else:
            q = ctx.Queue()
            for k in range(args.fake_procs):
                p = ctx.Process(target=fake_main, args=(ids[k::args.fake_procs], q), daemon=True)
                p.start()
                fakes.append(p)
            addrs = []
            for _ in fakes:
                addrs += q.get(timeout=120)
        lease = etcdctl(url, "lease", "grant", "3600").split()[1]
        for node, address in addrs:
            etcdctl(url, "put", f"--lease={lease}", PREFIX + node, record(node, address))

        # The entries: real warrends, drained (they place on the fakes only).
        token = root / "token"
        token.write_text("bench-scale-token\n")
        token.chmod(0o600)
        running = []
        for label, binary in entries:
            sock = root / f"entry-{label}.sock"
            with open(root / f"entry-{label}.log", "wb") as log:
                entry = subprocess.Popen(
                    [str(binary), "--state-dir", str(root / f"entry-{label}"), "--socket", str(sock), "--node-id",
                     f"entry-{label.lower()}", "--listen", f"127.0.0.1:{free_port()}", "--token-file", str(token),
                     "--cluster", f"etcd={url}", "--cluster-drain", "true", "--warm-shells", "0",
                     "--limit-views", "off", "--log-level", "warn"],
                    stdout=log, stderr=subprocess.STDOUT)
            procs.append(entry)
            running.append((label, binary, entry, str(sock)))
        import warren

        for label, _, entry, sock in running:
            c = warren.Client("unix:" + sock)
            for _ in range(600):
                if entry.poll() is not None:
                    raise SystemExit(f"warrend {label} exited:\n" +
                                     (root / f"entry-{label}.log").read_text(errors="replace")[-2000:])
                try:
                    if len(c.nodes(timeout=2)) == args.nodes + len(entries):
                        break
                except warren.WarrenError:
                    pass
                time.sleep(0.1)
            else:
                raise SystemExit(f"entry {label} does not see {args.nodes} + {len(entries)} nodes within 60 s")
            c.close()

        def load(sock: str, creates: int, kind: str = "create") -> tuple:
            if args.peer == "cpp":
                t0 = time.perf_counter()
                lat, owners, errors, first, last = cpp_load(sock, kind, creates, args.concurrency * args.clients)
                return time.perf_counter() - t0, last - first, lat, owners, errors
            outq = ctx.Queue()
            per = [creates // args.clients + (1 if i < creates % args.clients else 0) for i in range(args.clients)]
            ps = [ctx.Process(target=client_main, args=(sock, n, args.concurrency, outq, kind)) for n in per]
            t0 = time.perf_counter()
            for p in ps:
                p.start()
            res = [outq.get(timeout=600) for _ in ps]
            wall = time.perf_counter() - t0
            for p in ps:
                p.join(timeout=30)
            lat = [x for r in res for x in r[0]]
            span = max(r[4] for r in res) - min(r[3] for r in res)
            owners: Dict[str, int] = {}
            errors: Dict[str, int] = {}
            for r in res:
                for k, v in r[1].items():
                    owners[k] = owners.get(k, 0) + v
                for k, v in r[2].items():
                    errors[k] = errors.get(k, 0) + v
            return wall, span, lat, owners, errors

        print(f"scale simulation: {args.nodes} fake nodes in etcd ({args.peer} fakes and load), "
              f"{len(entries)} warrend entr{'ies' if len(entries) > 1 else 'y'} (drained) placing; "
              f"{args.clients * args.concurrency} creates in flight; {os.cpu_count()} cpus, "
              f"load {os.getloadavg()[0]:.1f} before", flush=True)
        for label, binary, entry, sock in running:
            load(sock, args.warmup)
        results: Dict[str, List[dict]] = {label: [] for label, *_ in running}
        for r in range(args.rounds):
            order = running if r % 2 == 0 else list(reversed(running))
            for label, binary, entry, sock in order:
                cpu0 = cpu_seconds(entry.pid)
                wall, span, lat, owners, errors = load(sock, args.creates)
                entry_cpu = cpu_seconds(entry.pid) - cpu0
                placed = len(lat)
                shares = [owners.get(i, 0) for i in ids]
                res = {"rate": placed / span, "per_cpu_s": placed / max(entry_cpu, 1e-9),
                       "cpu_us": entry_cpu / max(1, placed) * 1e6, "p50_ms": statistics.median(lat) * 1e3,
                       "p99_ms": pct(lat, 99) * 1e3, "spread": max(shares) / max(1, min(shares)),
                       "errors": errors, "load": os.getloadavg()[0]}
                results[label].append(res)
                print(f"  round {r + 1} entry {label} ({binary}): placed {placed} of {args.creates} in {span:.2f} s: "
                      f"{res['rate']:,.0f} decisions/s; entry cpu {entry_cpu:.2f} s = {res['cpu_us']:.0f} us per "
                      f"create = {res['per_cpu_s']:,.0f} decisions per cpu-second of the entry; latency p50 "
                      f"{res['p50_ms']:.2f} ms p99 {res['p99_ms']:.2f} ms; spread max/min {max(shares)}/"
                      f"{min(shares)} = {res['spread']:.3f} ({sum(1 for s in shares if s)} nodes); "
                      f"load {res['load']:.1f}{f'; errors {errors}' if errors else ''}", flush=True)
                if args.gets:
                    # The same load of forwarded calls without a placement (Get
                    # of a fake node's sandbox): what the relay costs alone.
                    cpu0 = cpu_seconds(entry.pid)
                    _, gspan, glat, _, gerr = load(sock, args.creates, "get")
                    gcpu = cpu_seconds(entry.pid) - cpu0
                    print(f"    same load of forwarded Gets (no placement): {len(glat) / gspan:,.0f}/s, entry cpu "
                          f"{gcpu / max(1, len(glat)) * 1e6:.0f} us per call{f'; errors {gerr}' if gerr else ''}",
                          flush=True)
        print("summary (medians over rounds):")
        for label, binary, *_ in running:
            rs = results[label]
            print(f"  {label} {binary}: {statistics.median(x['rate'] for x in rs):,.0f} decisions/s wall, "
                  f"{statistics.median(x['per_cpu_s'] for x in rs):,.0f} per entry cpu-second "
                  f"({statistics.median(x['cpu_us'] for x in rs):.0f} us), p99 "
                  f"{statistics.median(x['p99_ms'] for x in rs):.2f} ms, spread max "
                  f"{max(x['spread'] for x in rs):.3f}")
        if len(running) == 2:
            a, b = results["A"], results["B"]
            print(f"  B/A: wall rate {statistics.median(x['rate'] for x in b) / statistics.median(x['rate'] for x in a):.2f}x, "
                  f"per entry cpu-second "
                  f"{statistics.median(x['per_cpu_s'] for x in b) / statistics.median(x['per_cpu_s'] for x in a):.2f}x")
        etcdctl(url, "lease", "revoke", lease)
    finally:
        for p in fakes:
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
        for p in reversed(procs):
            if p.poll() is None:
                if p.stdin is not None:
                    p.stdin.close()  # scale_peer fakes: ends on stdin's end
                    try:
                        p.wait(timeout=10)
                        continue
                    except subprocess.TimeoutExpired:
                        pass
                p.terminate()
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)


if __name__ == "__main__":
    sys.exit(main())
