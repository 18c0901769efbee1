"""Fault soak of warrend: seeded, bounded create -> use -> fault -> destroy
cycles against a real daemon, with every fault kind of the reliability
issue injected, and `kill -9` of warrend followed by a restart at even
intervals. Fails on any leak, orphan, zombie, undestroyable sandbox, blocked
or slow restart, INTERNAL/UNKNOWN error, server-made DEADLINE_EXCEEDED, or
call that outlives its deadline; reports numbers either way.

Two forms:
  * CI (tests/soak/test_soak.py): a few thousand cycles, several kills.
  * long (a benchmark, bench/soak/README.md):
        .venv/bin/python tests/soak/soak.py --cycles 20000 --kills 20 --report soak.json

Fault kinds (one per cycle, chosen by the seeded RNG; weights in KINDS):
  create_cancel   create with a deadline shorter than a create takes
  tiny_deadline   exec and file calls whose RPC deadline passes mid-call
  stream_close    exec stream whose client closes its channel mid-stream
  destroy_race    destroy racing exec, file write, spawn, pause, suspend
  pause_race      pause / suspend / resume racing each other and a destroy
  fork_bomb       a fork bomb under a small pids limit, ended by the exec timeout
  output_flood    an exec writing 32 MiB to a 1 MiB output cap
  oom             an exec allocating past memory_mb
  disk_fill       writes until the upper (disk_mb) is full, then a cleanup
  ttl_race        a destroy racing the node's TTL reaper
plus kill9: at each kill, sandboxes kept running / paused / suspended and a
burst of creates in flight; after the restart the kept ones must answer in
their state, the half-made ones must be gone.

Item 1 of the issue (an exec helper frozen by a pause holds the daemon's API
socket) shows as a blocked restart: the holders of the socket are named in
the failure, then thawed and killed so that the run goes on.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Tuple


import warren
from warren._proto import warren_pb2 as pb

REPO = Path(__file__).resolve().parents[2]


def _integration_conftest() -> Any:
    """tests/integration/conftest.py (Daemon, host snapshot helpers), loaded
    once under its own name."""
    name = "warren_it_conftest"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "tests/integration/conftest.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


itc = _integration_conftest()

# kind -> weight
KINDS: Dict[str, int] = {
    "create_cancel": 12, "tiny_deadline": 12, "stream_close": 8, "destroy_race": 14, "pause_race": 14,
    "fork_bomb": 3, "output_flood": 4, "oom": 3, "disk_fill": 3, "ttl_race": 6, "plain": 21,
}
# Seconds a call may run past its deadline before it counts as outliving it.
DEADLINE_SLACK_S = 3.0
RESTART_LIMIT_S = 10.0
# RSS growth allowed within one daemon life between its first checkpoint
# after warm-up and its last one.
RSS_GROWTH_CAP = 64 << 20
RETRYABLE = {"Unavailable", "Aborted", "ResourceExhausted"}
# A create finishing this close to its deadline is given up by the node
# (DEADLINE_EXCEEDED: its reply would reach the client too late).
CREATE_REPLY_MARGIN_S = 0.02


class SoakFailure(Exception):
    pass


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cycles = 0
        self.faults: Dict[str, int] = collections.Counter()
        self.fault_s: Dict[str, float] = collections.Counter()  # seconds spent per kind
        self.codes: Dict[str, int] = collections.Counter()
        self.failures: List[str] = []
        self.kills = 0
        self.restart_s: List[float] = []
        self.readopted = 0
        self.gone = 0
        self.kept_ok = 0
        self.checkpoints: List[Dict[str, Any]] = []
        self.lives: List[List[int]] = [[]]  # RSS per checkpoint, per daemon life

    def fail(self, msg: str) -> None:
        with self.lock:
            if len(self.failures) < 200:
                self.failures.append(msg)

    def code(self, c: str) -> None:
        with self.lock:
            self.codes[c] += 1


def _code(e: BaseException) -> str:
    return type(e).__name__


class Soak:
    def __init__(self, daemon: Any, base_layer: str, *, cycles: int, kills: int, seed: int, workers: int,
                 max_seconds: float = 0, log: Callable[[str], None] = print):
        self.d = daemon
        self.base = base_layer
        self.cycles = cycles
        self.kills = kills
        self.seed = seed
        self.workers = workers
        self.max_seconds = max_seconds  # 0 = none; else no new cycle starts after it (kills still all run)
        self.log = log
        self.tag = f"soak-{os.getpid()}-{seed}"
        self.stats = Stats()
        self.epoch = 0            # bumped when a kill starts and when the restart is done
        self.down = threading.Event()
        self.addr = "unix:" + str(daemon.socket)
        self.next_cycle = 0
        self.cycle_lock = threading.Lock()
        self.stop = threading.Event()
        self.baseline: Dict[str, Set[str]] = {}
        self.timed_out = False  # the time budget ended the cycles early
        self.threads_baseline = 0

    # ------------------------------------------------------------ calls
    def around_kill(self, e0: int, down0: bool) -> bool:
        """Whether something that started at kill epoch e0 (daemon down then:
        down0) overlapped a kill: down at its start or now, or restarted in
        between."""
        return down0 or self.down.is_set() or self.epoch != e0

    def call(self, what: str, fn: Callable[[], Any], deadline: float, allowed: Set[str] = frozenset(),
             client_deadline: bool = True) -> Tuple[Optional[Any], str]:
        """Runs fn (an SDK call whose RPC deadline is `deadline` s); returns
        (result, code). Fails the soak on INTERNAL/UNKNOWN, a DEADLINE_EXCEEDED
        the client's deadline does not explain, a code not allowed (retryable
        ones are allowed around a kill) and a call outliving its deadline."""
        e0 = self.epoch
        down0 = self.down.is_set()
        t0 = time.monotonic()
        try:
            r = fn()
            code = "OK"
        except warren.WarrenError as e:
            r, code = e, _code(e)
        except ValueError as e:  # a raw error from the SDK: never acceptable
            self.stats.fail(f"{what}: raw ValueError {e}")
            return e, "ValueError"
        dt = time.monotonic() - t0
        self.stats.code(code)
        around_kill = self.around_kill(e0, down0)
        if dt > deadline + DEADLINE_SLACK_S:
            self.stats.fail(f"{what}: took {dt:.1f} s, past its deadline of {deadline:.3f} s")
        if code in ("Internal", "Unknown"):
            self.stats.fail(f"{what}: {code}: {r}")
        elif code == "DeadlineExceeded" and not (client_deadline and dt >= deadline * 0.9 - CREATE_REPLY_MARGIN_S) \
                and not around_kill:
            self.stats.fail(f"{what}: DEADLINE_EXCEEDED after {dt:.3f} s of a {deadline:.3f} s deadline "
                            f"(the server's own time-out): {r}")
        elif code not in allowed and code != "OK" and code != "DeadlineExceeded" and not (
                around_kill and code in RETRYABLE | {"Cancelled", "NotFound", "FailedPrecondition"}):
            self.stats.fail(f"{what}: unexpected {code}: {r}")
        return r, code

    def create(self, c: warren.Client, timeout: float = 60, **kw: Any) -> Optional[warren.Sandbox]:
        labels = dict(kw.pop("labels", {}))
        labels["soak"] = self.tag
        for _ in range(40):
            r, code = self.call("create", lambda: c.create(layers=[self.base], labels=labels, timeout=timeout, **kw),
                                timeout, allowed=RETRYABLE)
            if code == "OK":
                return r
            if code in RETRYABLE or self.down.is_set():
                time.sleep(0.25)
                continue
            return None
        self.stats.fail("create: still refused after 40 attempts")
        return None

    def destroy(self, c: warren.Client, sid: str, what: str = "destroy") -> None:
        """Destroys until gone: an undestroyable sandbox fails the soak."""
        end = time.monotonic() + 90
        last = ""
        while time.monotonic() < end:
            r, code = self.call(what, lambda: c.destroy(sid, timeout=30), 30,
                                allowed=RETRYABLE | {"NotFound", "Cancelled"})
            if code in ("OK", "NotFound"):
                return
            last = f"{code}: {r}"
            time.sleep(0.25)
        self.stats.fail(f"sandbox {sid} undestroyable for 90 s: {last}")

    def answers(self, sb: warren.Sandbox, what: str) -> None:
        for _ in range(40):
            r, code = self.call(what, lambda: sb.exec("echo ok", timeout=20), 50.5, allowed=RETRYABLE)
            if code == "OK":
                if r.stdout != b"ok\n":
                    self.stats.fail(f"{what}: {r!r}")
                return
            if code in RETRYABLE or self.down.is_set():
                time.sleep(0.25)
                continue
            return

    # ------------------------------------------------------------ faults
    def cycle(self, c: warren.Client, rng: random.Random) -> None:
        kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        with self.stats.lock:
            self.stats.faults[kind] += 1
        t0 = time.monotonic()
        try:
            self._cycle(c, rng, kind)
        finally:
            with self.stats.lock:
                self.stats.fault_s[kind] += time.monotonic() - t0

    def _cycle(self, c: warren.Client, rng: random.Random, kind: str) -> None:
        if kind == "create_cancel":
            t = rng.uniform(0.002, 0.15)
            r, code = self.call("create(tiny deadline)",
                                lambda: c.create(layers=[self.base], labels={"soak": self.tag}, timeout=t), t,
                                allowed=RETRYABLE | {"Cancelled"})
            if code == "OK":
                self.destroy(c, r.id)
            return
        kw: Dict[str, Any] = {}
        if kind == "fork_bomb":
            kw = {"pids": 64}
        elif kind == "oom":
            kw = {"memory_mb": 48}
        elif kind == "disk_fill":
            kw = {"disk_mb": 16, "memory_mb": 256}
        elif kind == "ttl_race":
            kw = {"ttl_s": 1}
        sb = self.create(c, **kw)
        if sb is None:
            return
        t_created = time.monotonic()
        try:
            getattr(self, "f_" + kind)(c, sb, rng, t_created)
        finally:
            if kind != "ttl_race":
                self.destroy(c, sb.id)

    def f_plain(self, c, sb, rng, t0) -> None:
        self.answers(sb, "exec")
        if rng.random() < 0.3:
            self.call("write", lambda: sb.files.write("/w/x", b"x" * 1000, make_parents=True, timeout=30), 30,
                      allowed=RETRYABLE)

    def f_tiny_deadline(self, c, sb, rng, t0) -> None:
        t = rng.uniform(0.001, 0.05)
        req = pb.ExecRequest(sandbox_id=sb.id, shell=b"sleep 0.2; echo late", timeout_ms=10000)
        self.call("exec(tiny deadline)", lambda: warren.client._call(c._sandboxes.Exec)(req, timeout=t), t,
                  allowed=RETRYABLE)
        self.call("read(tiny deadline)", lambda: sb.files.read("/etc/os-release", timeout=t), t,
                  allowed=RETRYABLE | {"NotFound"})
        self.answers(sb, "exec after tiny deadlines")

    def f_stream_close(self, c, sb, rng, t0) -> None:
        tmp = warren.Client(self.addr)
        try:
            s2 = tmp.get(sb.id)
            st = s2.exec_stream("yes | head -c 4M; sleep 30")
            it = iter(st)
            self.call("stream", lambda: next(it), 30, allowed=RETRYABLE | {"Cancelled"})
        except warren.WarrenError as e:
            self.stats.code(_code(e))
        finally:
            tmp.close()
        self.answers(sb, "exec after a closed stream")

    def _race(self, calls: List[Tuple[str, Callable[[], Any], float]], allowed: Set[str]) -> None:
        ts = [threading.Thread(target=self.call, args=(w, f, dl, allowed)) for w, f, dl in calls]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
            if t.is_alive():
                self.stats.fail("a racing call still runs after 120 s")

    def f_destroy_race(self, c, sb, rng, t0) -> None:
        allowed = RETRYABLE | {"NotFound", "FailedPrecondition", "Cancelled"}
        delay = rng.uniform(0, 0.05)

        def late_destroy() -> None:
            time.sleep(delay)
            c.destroy(sb.id, timeout=30)

        calls = [("exec(racing destroy)", lambda: sb.exec("sleep 0.3", timeout=10), 40.5),
                 ("write(racing destroy)", lambda: sb.files.write("/w/y", b"y" * 65536, make_parents=True,
                                                                  timeout=30), 30),
                 ("spawn(racing destroy)", lambda: sb.spawn("sleep 100"), 30),
                 (rng.choice(["pause", "suspend"]) + "(racing destroy)",
                  lambda: (sb.pause() if rng.random() < 0.5 else sb.suspend()), 30),
                 ("destroy(racing calls)", late_destroy, 30)]
        self._race(calls, allowed)

    def f_pause_race(self, c, sb, rng, t0) -> None:
        allowed = RETRYABLE | {"NotFound", "FailedPrecondition"}
        sb.exec("sleep 1000 >/dev/null 2>&1 &", timeout=30)
        ops = [("pause", sb.pause), ("suspend", sb.suspend), ("resume", sb.resume),
               ("exec(racing pause)", lambda: sb.exec("echo ok", timeout=10))]
        calls = [(n + "(race)", f, 40.5) for n, f in rng.sample(ops, k=len(ops))]
        if rng.random() < 0.5:
            calls.append(("destroy(racing pause)", lambda: c.destroy(sb.id, timeout=30), 30))
        self._race(calls, allowed)

    def f_fork_bomb(self, c, sb, rng, t0) -> None:
        r, code = self.call("fork bomb", lambda: sb.exec("f(){ f|f& }; f; sleep 5", timeout=1.5, kill_grace=0.2),
                            32)
        self.answers(sb, "exec after a fork bomb")

    def f_output_flood(self, c, sb, rng, t0) -> None:
        r, code = self.call("flood", lambda: sb.exec("head -c 32M /dev/zero", timeout=60, output_cap=1 << 20), 90.5)
        if code == "OK" and not (r.stdout_truncated and r.stdout_total_bytes == 32 << 20 and len(r.stdout) == 1 << 20):
            self.stats.fail(f"flood: {r.stdout_total_bytes} bytes, truncated={r.stdout_truncated}")

    def f_oom(self, c, sb, rng, t0) -> None:
        r, code = self.call("oom", lambda: sb.exec("head -c 400M /dev/zero | tail -n 1 >/dev/null", timeout=60), 90.5)
        if code == "OK" and not (r.oom_killed or r.exit_code != 0):
            self.stats.fail(f"oom: not OOM-killed: {r!r}")
        self.answers(sb, "exec after an OOM")

    def f_disk_fill(self, c, sb, rng, t0) -> None:
        r, code = self.call("disk fill", lambda: sb.exec("dd if=/dev/zero of=/fill bs=1M count=64 2>&1", timeout=60),
                            90.5)
        if code == "OK" and r.exit_code == 0:
            self.stats.fail(f"disk fill: 64 MiB fit in a 16 MiB upper: {r!r}")
        self.call("write(full disk)", lambda: sb.files.write("/w/more", b"z" * (1 << 20), make_parents=True,
                                                             timeout=30), 30,
                  allowed={"ResourceExhausted"})
        self.call("rm", lambda: sb.exec("rm -f /fill", timeout=30), 60.5)
        self.answers(sb, "exec after a full disk")

    def f_ttl_race(self, c, sb, rng, t0) -> None:
        time.sleep(max(0.0, t0 + rng.uniform(0.7, 1.3) - time.monotonic()))
        self.destroy(c, sb.id, "destroy(racing ttl)")

    # ------------------------------------------------------------ kill -9
    def kill_and_restart(self, rng: random.Random, n: int) -> None:
        c = self.d.client
        kept: Dict[str, str] = {}
        for state in ("running", "paused", "suspended"):
            sb = self.create(c, labels={"kept": str(n)})
            if sb is None:
                continue
            sb.exec("sleep 1000 >/dev/null 2>&1 &", timeout=30)
            if state == "paused":
                self.call("pause(kept)", sb.pause, 30)
            elif state == "suspended":
                self.call("suspend(kept)", sb.suspend, 30)
            kept[sb.id] = c.get(sb.id).cached_info.state
        # A burst of creates in flight when the daemon dies (their own client:
        # its background abandons outlive the kill).
        half = f"{n}"
        hc = warren.Client(self.addr)
        made: List[str] = []
        failed: List[str] = []

        def one() -> None:
            try:
                made.append(hc.create(layers=[self.base], labels={"soak": self.tag, "half": half}, timeout=60).id)
            except warren.WarrenError as e:
                failed.append(_code(e))

        ts = [threading.Thread(target=one) for _ in range(4)]
        for t in ts:
            t.start()
        time.sleep(rng.uniform(0.005, 0.08))
        self.epoch += 1
        self.down.set()
        self.stats.kills += 1
        self.d.kill9()
        for t in ts:
            t.join(90)
        self.restart()
        self.epoch += 1
        self.down.clear()
        c = self.d.client
        # Kept sandboxes: back in their state, answering.
        for sid, state in kept.items():
            try:
                got = c.get(sid).cached_info.state
            except warren.WarrenError as e:
                self.stats.fail(f"kill {n}: kept sandbox {sid} ({state}) lost: {e}")
                continue
            if got != state:
                self.stats.fail(f"kill {n}: kept sandbox {sid} was {state}, came back {got}")
            self.answers(c.get(sid), f"kept {state} sandbox after kill {n}")
            with self.stats.lock:
                self.stats.kept_ok += 1
            self.destroy(c, sid)
        # Half-made creates: the ones a create returned are re-adopted; every
        # other one goes (the node's cleanup, or the SDK's abandon).
        hc.close()  # waits (bounded) for the abandons
        deadline = time.monotonic() + 60
        while True:
            listed = {s.id for s in c.list(labels={"soak": self.tag, "half": half}, timeout=30)}
            extra = listed - set(made)
            if not extra or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if extra:
            self.stats.fail(f"kill {n}: half-made sandboxes left after 60 s: {sorted(extra)}")
        if set(made) - listed:
            self.stats.fail(f"kill {n}: created sandboxes lost at the restart: {sorted(set(made) - listed)}")
        with self.stats.lock:
            self.stats.readopted += len(set(made) & listed) + len(kept)
            self.stats.gone += 4 - len(made)
        for sid in listed:
            self.destroy(c, sid)
        self.checkpoint(f"after kill {n}", new_life=True)

    def restart(self) -> None:
        t0 = time.monotonic()
        for attempt in range(4):
            try:
                self.d.start(timeout=30)
                break
            except BaseException as e:  # noqa: BLE001 - pytest.fail raises Failed (a BaseException)
                holders = socket_holders(str(self.d.socket))
                frozen = frozen_tasks(self.d.node_id)
                self.stats.fail(
                    f"blocked restart (attempt {attempt + 1}): {str(e)[-200:].strip()}; processes holding the API "
                    f"socket: {holders or 'none found'}; frozen tasks of our sandboxes outside their pid "
                    f"namespace: {frozen or 'none'}" +
                    (" -- an exec helper frozen by a pause keeps the daemon's fds (issue 19 item 1)"
                     if holders or frozen else ""))
                # Unblock it so that the run goes on (and reports the rest).
                for pid, _ in holders:
                    thaw_and_kill(pid)
                if attempt >= 1:
                    thaw_all(self.d.node_id)
                time.sleep(1)
        else:
            raise SoakFailure("warrend does not restart: " + "; ".join(self.stats.failures[-4:]))
        dt = time.monotonic() - t0
        self.stats.restart_s.append(dt)
        if dt > RESTART_LIMIT_S:
            self.stats.fail(f"restart took {dt:.1f} s")

    # ------------------------------------------------------------ host objects
    def checkpoint(self, label: str, new_life: bool = False) -> Dict[str, Any]:
        pid = self.d.pid
        snap = itc.host_snapshot([self.d])
        status = proc_status(pid)
        cp = {"label": label, "t": round(time.monotonic() - self.t_start, 1), "cycles": self.stats.cycles,
              "mounts": len(snap["mount"]), "cgroups": len(snap["cgroup"]), "processes": len(snap["proc"]),
              "zombies": len(zombies_of(pid)), "netns": count_netns(),
              "run_dir_files": len(snap[f"{self.d.name}/run"]), "records": len(snap[f"{self.d.name}/sandboxes"]),
              "daemon_fds": len(os.listdir(f"/proc/{pid}/fd")), "daemon_threads": int(status.get("Threads", 0)),
              "rss_mb": round(int(status.get("VmRSS", "0 kB").split()[0]) / 1024, 1)}
        with self.stats.lock:
            self.stats.checkpoints.append(cp)
            if new_life:
                self.stats.lives.append([])
            self.stats.lives[-1].append(int(status.get("VmRSS", "0 kB").split()[0]) * 1024)
        self.log(json.dumps(cp))
        return cp

    # ------------------------------------------------------------ run
    def worker(self, w: int) -> None:
        rng = random.Random(self.seed * 1000 + w)
        c = warren.Client(self.addr)
        try:
            while not self.stop.is_set():
                with self.cycle_lock:
                    if self.next_cycle >= self.cycles:
                        return
                    if self.max_seconds and time.monotonic() - self.t_start > self.max_seconds:
                        self.timed_out = True
                        return
                    self.next_cycle += 1
                e0, down0 = self.epoch, self.down.is_set()
                try:
                    self.cycle(c, rng)
                except warren.WarrenError as e:  # a call outside self.call
                    if not (self.around_kill(e0, down0) and _code(e) in RETRYABLE | {"Cancelled", "NotFound"}):
                        self.stats.fail(f"worker {w}: {_code(e)}: {e}")
                except Exception as e:  # noqa: BLE001 - the soak reports, never stops on one cycle
                    self.stats.fail(f"worker {w}: {type(e).__name__}: {e}")
                with self.stats.lock:
                    self.stats.cycles += 1
        finally:
            c.close()

    def run(self) -> Dict[str, Any]:
        self.t_start = time.monotonic()
        rng = random.Random(self.seed)
        c = self.d.client
        with c.create(layers=[self.base]) as sb:  # warm-up: lazily made host objects exist
            sb.exec("true", timeout=30)
        itc.wait_warm_pool(self.d)
        self.baseline = itc.host_snapshot([self.d])
        self.threads_baseline = threading.active_count()
        self.checkpoint("start")
        ws = [threading.Thread(target=self.worker, args=(w,), name=f"soak-{w}") for w in range(self.workers)]
        for t in ws:
            t.start()
        # Kills at even intervals of the cycles, or of the time budget if it
        # ends the cycles first.
        kill_at = [self.cycles * (k + 1) // (self.kills + 1) for k in range(self.kills)]
        kill_t = [self.max_seconds * (k + 1) / (self.kills + 1) if self.max_seconds else float("inf")
                  for k in range(self.kills)]
        every = max(1, self.cycles // 10)
        next_cp = every
        k = 0
        while any(t.is_alive() for t in ws):
            time.sleep(0.2)
            if k < len(kill_at) and (self.stats.cycles >= kill_at[k] or time.monotonic() - self.t_start >= kill_t[k]):
                self.kill_and_restart(rng, k)
                k += 1
            if self.stats.cycles >= next_cp:
                self.checkpoint(f"cycle {self.stats.cycles}")
                next_cp += every
        while k < len(kill_at):  # cycles ran out before every kill
            self.kill_and_restart(rng, k)
            k += 1
        self.finish()
        return self.report()

    def run_reporting(self) -> Dict[str, Any]:
        """run(), but a soak that cannot go on (warrend does not restart)
        still returns its report, with the reason among the failures."""
        try:
            return self.run()
        except SoakFailure as e:
            self.stop.set()
            self.stats.fail(f"soak aborted: {e}")
            return self.report()

    def finish(self) -> None:
        c = self.d.client
        for sb in c.list(labels={"soak": self.tag}, timeout=30):
            self.stats.fail(f"orphan: sandbox {sb.id} ({sb.cached_info.labels}) still listed after the cycles")
            self.destroy(c, sb.id)
        # Everything settles (destroys, background abandons, reaps).
        deadline = time.monotonic() + 60
        while True:
            now = itc.host_snapshot([self.d])
            extra = {k: sorted(now[k] - self.baseline.get(k, set()))[:10] for k in now}
            extra = {k: v for k, v in extra.items() if v}
            in_use = [f"{l.name or l.digest}: in_use={l.in_use}" for l in c.layers.list() if l.in_use]
            zombies = zombies_of(self.d.pid)
            threads = threading.active_count()
            if (not extra and not in_use and not zombies and threads <= self.threads_baseline) or \
                    time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if extra:
            self.stats.fail(f"host objects left: {extra}")
        if in_use:
            self.stats.fail(f"layer references left: {in_use}")
        if zombies:
            self.stats.fail(f"zombie children of warrend: {zombies}")
        if threads > self.threads_baseline:
            self.stats.fail(f"client threads leaked: {threads - self.threads_baseline}: "
                            f"{[t.name for t in threading.enumerate()]}")
        end = self.checkpoint("end")
        start = self.stats.checkpoints[0]
        if end["daemon_fds"] > start["daemon_fds"] + 16:
            self.stats.fail(f"daemon fds {start['daemon_fds']} -> {end['daemon_fds']}")
        for life in self.stats.lives:
            if len(life) >= 3:
                grown = life[-1] - life[len(life) // 4]
                if grown > RSS_GROWTH_CAP:
                    self.stats.fail(f"daemon RSS grew by {grown >> 20} MiB within one life: "
                                    f"{[x >> 20 for x in life]} MiB")

    def report(self) -> Dict[str, Any]:
        s = self.stats
        return {"seed": self.seed, "cycles": s.cycles, "cycles_asked": self.cycles,
                "stopped_by_time_budget": self.timed_out, "workers": self.workers,
                "seconds": round(time.monotonic() - self.t_start, 1),
                "faults": dict(sorted(s.faults.items())),
                "fault_seconds": {k: round(v, 1) for k, v in sorted(s.fault_s.items())}, "kills": s.kills,
                "restart_s": [round(x, 2) for x in s.restart_s], "readopted": s.readopted, "gone": s.gone,
                "kept_ok": s.kept_ok, "codes": dict(sorted(s.codes.items())), "checkpoints": s.checkpoints,
                "failures": s.failures}


# ---------------------------------------------------------------- host helpers


def proc_status(pid: int) -> Dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        out[k] = v.strip()
    return out


def zombies_of(pid: int) -> List[str]:
    return [f"{p}:{comm}" for p, (ppid, comm, state) in itc.proc_table().items() if ppid == pid and state == "Z"]


def count_netns() -> int:
    seen = set()
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                seen.add(os.readlink(f"/proc/{e}/ns/net"))
            except OSError:
                pass
    return len(seen)


def socket_holders(path: str) -> List[Tuple[int, str]]:
    """Processes with an fd on the unix socket bound at path."""
    inodes = set()
    try:
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            f = line.split()
            if len(f) >= 8 and f[7] == path:
                inodes.add(f"socket:[{f[6]}]")
    except OSError:
        return []
    out = []
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{e}/fd"):
                if os.readlink(f"/proc/{e}/fd/{fd}") in inodes:
                    out.append((int(e), Path(f"/proc/{e}/comm").read_text().strip()))
                    break
        except OSError:
            continue
    return out


def _our_freezer_dirs(node_id: str) -> List[Path]:
    """Freezer (v1) or unified (v2) cgroup dirs of the sandboxes of node_id."""
    out = []
    for key, base in itc.cgroup_dirs().items():
        if key not in ("freezer", "unified"):
            continue
        for dirpath, dirnames, _ in os.walk(base):
            for d in dirnames:
                if d.startswith(node_id + "-"):
                    out.append(Path(dirpath) / d)
            if len(out) > 10000:
                break
    return out


def frozen_tasks(node_id: str) -> List[Tuple[int, str]]:
    """Tasks of our sandboxes' cgroups in the host's pid namespace (exec
    helpers, not sandbox processes) whose cgroup is frozen."""
    out = []
    me = os.readlink("/proc/self/ns/pid")
    for top in _our_freezer_dirs(node_id):
        for dirpath, _, files in os.walk(top):
            st = Path(dirpath) / ("freezer.state" if "freezer.state" in files else "cgroup.events")
            try:
                text = st.read_text()
                if "FROZEN" not in text and "frozen 1" not in text:
                    continue
                for p in (Path(dirpath) / "cgroup.procs").read_text().split():
                    if os.readlink(f"/proc/{p}/ns/pid") == me:
                        out.append((int(p), Path(f"/proc/{p}/comm").read_text().strip()))
            except OSError:
                continue
    return out


def thaw_all(node_id: str) -> None:
    for top in _our_freezer_dirs(node_id):
        for dirpath, _, files in os.walk(top):
            for f, v in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
                if f in files:
                    try:
                        (Path(dirpath) / f).write_text(v)
                    except OSError:
                        pass


def thaw_and_kill(pid: int) -> None:
    """Thaws the freezer cgroup of pid and its ancestors (v1 and v2), then
    SIGKILLs it."""
    try:
        for key, d in itc.cgroup_dirs(pid).items():
            for c in [d] + list(d.parents):
                for f, v in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
                    p = c / f
                    if p.exists():
                        try:
                            p.write_text(v)
                        except OSError:
                            pass
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=20000)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--max-seconds", type=float, default=0, help="time budget of the cycles (0 = none)")
    ap.add_argument("--root", default=os.environ.get("WARREN_TEST_ROOT", "/var/tmp"))
    ap.add_argument("--report", help="write the JSON report here")
    a = ap.parse_args()
    import tempfile
    root = Path(tempfile.mkdtemp(prefix="warren-soak-", dir=a.root))
    store = root / "layers"
    store.mkdir()
    d = itc.Daemon(root, "soak", store, f"soak{os.getpid()}")
    d.start()
    try:
        try:
            d.client.layers.get(itc.BASE)
        except warren.NotFound:
            d.client.layers.build(itc.BASE, dir=str(itc.BASE_ROOTFS), timeout=900)
        soak = Soak(d, itc.BASE, cycles=a.cycles, kills=a.kills, seed=a.seed, workers=a.workers,
                    max_seconds=a.max_seconds, log=lambda s: print(s, file=sys.stderr, flush=True))
        rep = soak.run_reporting()
    finally:
        d.stop()
        itc._kill_leftover_sandboxes(root)
        itc._unmount_under(root)
        os.system(f"rm -rf --one-file-system {root}")
    text = json.dumps(rep, indent=1)
    if a.report:
        Path(a.report).write_text(text)
    print(text)
    return 1 if rep["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
