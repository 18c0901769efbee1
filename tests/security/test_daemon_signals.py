"""`kill -9` and SIGTERM of warrend are the only ways to stop it: a sandbox
signals every process it can see (every signal 1..31 but SIGKILL, SIGSTOP
and SIGTSTP included, in a tight loop over /proc) for the duration of many
execs in the same sandbox and in a second one, while the daemon keeps
serving: it stays alive, answers Status, and every exec returns within its
timeout.

Runs on a daemon of its own: if the daemon is stopped, the session's shared
daemon is not."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import List, Tuple

import pytest

import warren

from .conftest import PROBE_PATH, Probe, it

EXECS = 300  # per sandbox, at least: both keep exec'ing while the storm lasts
EXEC_TIMEOUT = 10.0
STORM_SECONDS = 15.0


@pytest.mark.timeout(240)
def test_sandbox_signalling_everything_it_sees_does_not_stop_the_daemon(
        test_root: Path, layer_store: Path, base_layer: str, backend: str, probe_binaries):
    d = it.Daemon(test_root, "signals", layer_store, it.NODE_PREFIX + "s").start()
    c = d.client
    assert c is not None
    sandboxes: List[warren.Sandbox] = []
    try:
        attacker = c.create(backend=backend, layers=[base_layer], pids=512, cpu=2, labels={"test": "security"})
        sandboxes.append(attacker)
        other = c.create(backend=backend, layers=[base_layer], labels={"test": "security"})
        sandboxes.append(other)
        Probe(backend, attacker, probe_binaries)

        storm: List[warren.ExecResult] = []
        storm_err: List[BaseException] = []

        def run_storm() -> None:
            try:
                storm.append(attacker.exec([PROBE_PATH, "signal-storm", str(STORM_SECONDS), "3"],
                                           timeout=STORM_SECONDS + 30))
            except BaseException as e:  # noqa: BLE001 (reported below)
                storm_err.append(e)

        # (sandbox name, seconds, outcome or error) of every exec
        results: List[Tuple[str, float, str]] = []
        lock = threading.Lock()

        def run_execs(name: str, sb: warren.Sandbox) -> None:
            # At least EXECS, and on for as long as the storm lasts.
            end = time.monotonic() + STORM_SECONDS + 10
            n = 0
            while (n < EXECS or st.is_alive()) and time.monotonic() < end:
                n += 1
                t0 = time.monotonic()
                try:
                    r = sb.exec(["true"], timeout=EXEC_TIMEOUT)
                    out = f"exit={r.exit_code} signal={r.signal} timed_out={r.timed_out}"
                except warren.WarrenError as e:
                    out = f"ERROR {type(e).__name__}: {e}"
                with lock:
                    results.append((name, time.monotonic() - t0, out))
                if out.startswith("ERROR") and d.proc.poll() is not None:
                    return

        st = threading.Thread(target=run_storm)
        st.start()
        time.sleep(0.5)
        workers = [threading.Thread(target=run_execs, args=("same", attacker)),
                   threading.Thread(target=run_execs, args=("other", other))]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=200)
        st.join(timeout=60)

        alive = d.proc.poll() is None
        errors = [r for r in results if r[2].startswith("ERROR")]
        slow = [r for r in results if r[1] > EXEC_TIMEOUT + 5]
        other_bad = [r for r in results if r[0] == "other" and r[2] != "exit=0 signal=0 timed_out=False"]
        same = {}
        for r in results:
            if r[0] == "same":
                same[r[2]] = same.get(r[2], 0) + 1
        print(f"outcomes of the execs in the signalling sandbox: {same}")
        print(f"daemon alive={alive} rc={d.proc.returncode}; execs={len(results)} errors={len(errors)} "
              f"slow={len(slow)} other_not_ok={len(other_bad)}; first errors: {errors[:3]}; "
              f"storm: {storm[0].stdout.decode(errors='replace') if storm else storm_err}")
        log = d.log_path.read_text(errors="replace")
        assert "shutting down" not in log, \
            f"warrend began its shutdown while a sandbox signalled what it sees:\n{d.log_tail(10)}"
        assert alive, f"warrend exited (rc {d.proc.returncode}) while a sandbox signalled what it sees:\n" \
                      f"{d.log_tail(30)}"
        c.status(timeout=10)
        assert not any(w.is_alive() for w in workers), "an exec call is stuck"
        assert sum(1 for r in results if r[0] == "same") >= EXECS, len(results)
        assert sum(1 for r in results if r[0] == "other") >= EXECS, len(results)
        assert not errors, errors[:5]
        assert not slow, slow[:5]
        assert not other_bad, other_bad[:5]
        assert storm and storm[0].exit_code == 0, (storm, storm_err)
    finally:
        if d.proc is not None and d.proc.poll() is None:
            for sb in sandboxes:
                try:
                    sb.destroy(timeout=60)
                except warren.WarrenError:
                    pass
            d.stop()
        else:
            d.kill9()
