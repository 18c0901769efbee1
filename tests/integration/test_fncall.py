"""fncall backend (issue 5) through a real warrend: the SDK calls, the
SandboxFusion-compatible POST /run_code endpoint, isolation between calls and
hostile calls (fork bomb, 10 GB allocation, endless loop, closed stdout).

Uses its own daemon (the session daemon of conftest.py plus --http-listen),
sharing the session's layer store and base layer.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterable

import pytest

import warren
from conftest import BASE_ROOTFS, WARREND, Daemon

HAVE_GXX = (BASE_ROOTFS / "usr/bin/g++").exists()
NO_GXX = f"{BASE_ROOTFS} has no g++: C/C++ fncalls need a toolset layer with build-essential"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FnDaemon(Daemon):
    """A Daemon started with extra flags (the fncall HTTP endpoint)."""

    def __init__(self, *a, extra=(), **kw):
        super().__init__(*a, **kw)
        self.extra = list(extra)

    def start(self, timeout: float = 60.0) -> "FnDaemon":
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(WARREND), "--state-dir", str(self.state_dir), "--socket", str(self.socket),
             "--layer-store", str(self.layer_store), "--node-id", self.node_id] + self.extra,
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.root)
        log.close()
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
                    pytest.fail(f"warrend did not answer within {timeout} s:\n{self.log_tail()}")
                time.sleep(0.1)


@pytest.fixture(scope="module")
def fn(test_root: Path, layer_store: Path, base_layer: str) -> Iterable[FnDaemon]:
    port = _free_port()
    d = FnDaemon(test_root, "fncall", layer_store, "nf",
                 extra=["--http-listen", f"127.0.0.1:{port}", "--fncall-layers", base_layer,
                        "--run-code-layers", f"{base_layer},toolset/gcc"])
    d.http = f"http://127.0.0.1:{port}"
    d.start()
    yield d
    d.stop()


def run_code(fn: FnDaemon, **req) -> dict:
    body = json.dumps(req).encode()
    r = urllib.request.Request(fn.http + "/run_code", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(r, timeout=120) as resp:
        return json.loads(resp.read())


# ---------------------------------------------------------------- SDK

def test_python_call_and_result_type(fn: FnDaemon) -> None:
    r = fn.client.fncall("import sys\nprint(sum(map(int, sys.stdin.read().split())))", stdin=b"1 2 3")
    assert r.ok and r.stdout == b"6\n", r
    assert isinstance(r.run, warren.ExecResult)
    r = fn.client.fncall("raise SystemExit(3)")
    assert r.exit_code == 3 and not r.sandbox_error
    r = fn.client.fncall("echo hi; exit 4", language="bash")
    assert (r.exit_code, r.stdout) == (4, b"hi\n")
    r = fn.client.fncall("print(open('in.txt').read()); open('out.bin','wb').write(bytes(range(256)))",
                         files={"in.txt": b"data"}, fetch_files=["out.bin"])
    assert r.stdout == b"data\n" and r.files["out.bin"] == bytes(range(256))


def test_no_state_carries_over(fn: FnDaemon) -> None:
    probe = ("import os, json, sys\n"
             "print(json.dumps({'file': os.path.exists('/tmp/mark'), 'env': os.environ.get('MARK'),"
             " 'mod': hasattr(json, 'mark'), 'sys': getattr(sys, 'mark', None),"
             " 'procs': sorted(p for p in os.listdir('/proc') if p.isdigit())}, sort_keys=True))\n")
    dirty = ("import os, json, sys, subprocess\n"
             "open('/tmp/mark', 'w').write('x'); os.environ['MARK'] = '1'; json.mark = 1; sys.mark = 1\n"
             "json.dumps = lambda *a, **k: 'PATCHED'\n"
             "subprocess.Popen(['sh', '-c', 'sleep 1000 &'], start_new_session=True)\n"
             "subprocess.Popen(['sleep', '1000'])\n")
    clean = fn.client.fncall(probe)
    assert clean.ok, clean
    for _ in range(5):
        d = fn.client.fncall(dirty)
        assert d.ok, d
        again = fn.client.fncall(probe)
        assert again.stdout == clean.stdout, (again.stdout, clean.stdout)
    assert json.loads(clean.stdout)["procs"] == ["1"]
    # bash: env and files do not carry over either.
    fn.client.fncall("export MARK=1; touch /tmp/x; (sleep 1000 &)", language="bash")
    r = fn.client.fncall("echo ${MARK:-unset}; ls -A /tmp; ps -e 2>/dev/null | wc -l || true", language="bash")
    assert r.stdout.startswith(b"unset\n"), r.stdout


def test_calls_get_fresh_random_state_threads_env_and_stdio(fn: FnDaemon) -> None:
    # The call process is a fork of the zygote without PyOS_AfterFork_Child
    # (zygote.py): random is reseeded per call, threads work, the env set by
    # one call's request is not seen by the next, stdio are pipes.
    outs = {fn.client.fncall("import random; print(random.random(), random.getrandbits(64))").stdout
            for _ in range(6)}
    assert len(outs) == 6, outs
    r = fn.client.fncall("import threading\nout = []\n"
                         "t = threading.Thread(target=lambda: out.append(threading.get_ident()))\n"
                         "t.start(); t.join()\n"
                         "print(len(out), out[0] != threading.get_ident(), threading.active_count(),"
                         " threading.current_thread() is threading.main_thread())")
    assert r.stdout == b"1 True 1 True\n", r
    r = fn.client.fncall("import os; print(os.environ.get('FOO'), sorted(os.environ))", env={"FOO": "bar"})
    assert r.stdout == b"bar ['FOO', 'HOME', 'LANG', 'PATH', 'TMPDIR']\n", r
    r = fn.client.fncall("import os; print(os.environ.get('FOO'), sorted(os.environ))")
    assert r.stdout == b"None ['HOME', 'LANG', 'PATH', 'TMPDIR']\n", r
    r = fn.client.fncall("import sys; print(sys.stdin.seekable(), sys.stdout.isatty(), sys.stdin.read() == '')")
    assert r.stdout == b"False False True\n", r


def test_big_calls_and_streams(fn: FnDaemon) -> None:
    # Calls above the inline limit travel in a memfd; stdin and output larger
    # than a pipe buffer are streamed by warrend.
    big = bytes(range(256)) * 1024  # 256 KiB
    code = "# " + "x" * (100 << 10) + "\nimport sys\nd = open('big.bin','rb').read()\n" \
        "s = sys.stdin.buffer.read()\nprint(len(d), d == bytes(range(256)) * 1024, len(s))\n" \
        "sys.stdout.write('y' * (3 << 20))\n"
    r = fn.client.fncall(code, files={"big.bin": big}, stdin=b"z" * (2 << 20))
    assert r.ok, r
    assert r.stdout.startswith(b"262144 True 2097152\n") and len(r.stdout) == 20 + (3 << 20), r.stdout[:40]
    r = fn.client.fncall("import sys; sys.stdout.write('y' * 1000)", output_cap=100)
    assert r.run.stdout == b"y" * 100 and r.run.stdout_truncated and r.run.stdout_total_bytes == 1000, r


def test_garbage_on_the_status_fd_only_affects_that_call(fn: FnDaemon) -> None:
    # A python call can reach its status fd (1023: the signal emulation
    # reports there); whatever it writes, warrend must not crash and the
    # worker must stay usable.
    for junk in (b"\xff\xff\xff\xff garbage", b"\x05\x00\x00\x00{bad}", b"\x02\x00\x00\x00[]" * 1000):
        r = fn.client.fncall("import os; os.write(1023, %r); print('done')" % junk)
        assert r.run is not None and r.stdout == b"done\n" and r.exit_code == 0, r
    rs = fn.client.fncall_batch([warren.FnCallRequest(f"print({i})") for i in range(20)])
    assert [x.stdout for x in rs] == [f"{i}\n".encode() for i in range(20)]


def test_hostile_calls_have_clear_outcomes_and_pool_stays_healthy(fn: FnDaemon) -> None:
    t0 = time.monotonic()
    r = fn.client.fncall("while True: pass", timeout=1)
    assert r.timed_out and r.run.signal == 9 and time.monotonic() - t0 < 10
    t0 = time.monotonic()
    r = fn.client.fncall(":(){ :|:& };:; sleep 3", language="bash", timeout=2)
    assert r.timed_out and time.monotonic() - t0 < 15, r
    r = fn.client.fncall("x = bytearray(10 << 30)\nprint('survived')", memory_mb=256, timeout=30)
    assert r.exit_code != 0 and (r.run.oom_killed or b"MemoryError" in r.stderr), r
    r = fn.client.fncall("import os, sys, time\nos.close(1)\ntime.sleep(0.2)\nsys.stderr.write('bye')")
    assert r.run is not None and r.stderr == b"bye", r
    r = fn.client.fncall("import os; os.close(1); os.close(2)\nwhile True: pass", timeout=1)
    assert r.timed_out
    # Healthy: quick and correct afterwards, many times over.
    rs = fn.client.fncall_batch([warren.FnCallRequest(f"print({i})") for i in range(50)])
    assert [x.stdout for x in rs] == [f"{i}\n".encode() for i in range(50)]


def test_batch_is_ordered_and_concurrent(fn: FnDaemon) -> None:
    reqs = [warren.FnCallRequest("import time; time.sleep(0.5); print(%d)" % i) for i in range(8)]
    t0 = time.monotonic()
    rs = fn.client.fncall_batch(reqs)
    took = time.monotonic() - t0
    assert [r.stdout for r in rs] == [b"%d\n" % i for i in range(8)]
    assert took < 8 * 0.5, f"batch of 8 x 0.5 s took {took:.1f} s: not concurrent"


def test_bad_requests(fn: FnDaemon) -> None:
    with pytest.raises(warren.InvalidArgument):
        fn.client.fncall("x", language="cobol")
    with pytest.raises(warren.NotFound):
        fn.client.fncall("print(1)", layers=["base/does-not-exist@1"])
    r = fn.client.fncall("print(1)", files={"../../etc/evil": b"x"})
    assert "escapes" in r.sandbox_error


# ---------------------------------------------------------------- /run_code

def _check_stage(st: dict) -> None:
    assert set(st) >= {"status", "execution_time", "return_code", "stdout", "stderr"}
    assert st["status"] in ("Finished", "Error", "TimeLimitExceeded")


@pytest.mark.parametrize("lang,ok,rt_err,slow", [
    ("python", "print('hello')", "raise ValueError('bad')", "while True: pass"),
    ("bash", "echo hello", "echo oops >&2; exit 2", "while :; do :; done"),
])
def test_run_code_schema(fn: FnDaemon, lang: str, ok: str, rt_err: str, slow: str) -> None:
    r = run_code(fn, code=ok, language=lang)
    assert r["status"] == "Success", r
    assert r["compile_result"] is None
    _check_stage(r["run_result"])
    assert r["run_result"] == {**r["run_result"], "status": "Finished", "return_code": 0, "stdout": "hello\n"}

    r = run_code(fn, code=rt_err, language=lang)
    assert r["status"] == "Failed" and r["run_result"]["status"] == "Finished"
    assert r["run_result"]["return_code"] != 0 and r["run_result"]["stderr"]

    t0 = time.monotonic()
    r = run_code(fn, code=slow, language=lang, run_timeout=1)
    assert r["status"] == "Failed" and r["run_result"]["status"] == "TimeLimitExceeded", r
    assert time.monotonic() - t0 < 10

    # python's "compile error" is a SyntaxError at run time, as in SandboxFusion.
    r = run_code(fn, code="def f(:" if lang == "python" else "if then fi", language=lang)
    assert r["status"] == "Failed" and r["run_result"]["return_code"] != 0

    r = run_code(fn, code="cat in.txt; echo x > out.txt" if lang == "bash" else
                 "print(open('in.txt').read()); open('out.txt','w').write('x\\n')",
                 language=lang, stdin="", files={"in.txt": base64.b64encode(b"file-data").decode()},
                 fetch_files=["out.txt"])
    assert r["status"] == "Success" and "file-data" in r["run_result"]["stdout"], r
    assert base64.b64decode(r["files"]["out.txt"]) == b"x\n"


TOOLSET_ROOTFS = Path(__import__("os").environ.get("WARREN_TOOLSET_ROOTFS", "/var/cache/warren/rootfs/toolset-gcc"))


@pytest.fixture(scope="module")
def cpp_layers(fn: FnDaemon, base_layer: str):
    """Layers with g++: the base alone if it has one, else base + a toolset
    layer built from scripts/build-toolset-gcc-rootfs.sh's dir; None if neither."""
    if HAVE_GXX:
        return [base_layer]
    if not (TOOLSET_ROOTFS / "usr/bin/g++").exists():
        return None
    layer = fn.client.layers.build("toolset/gcc@1", dir=str(TOOLSET_ROOTFS), timeout=600).name
    return [base_layer, layer]


@pytest.mark.timeout(900)
def test_run_code_cpp(fn: FnDaemon, cpp_layers) -> None:
    if cpp_layers is None:
        r = run_code(fn, code="#include <cstdio>\nint main(){puts(\"hi\");}", language="cpp")
        assert r["status"] == "SandboxError" and "g++" in r["message"], r
        pytest.skip(NO_GXX + f" (and no toolset rootfs at {TOOLSET_ROOTFS}: scripts/build-toolset-gcc-rootfs.sh)")
    common = dict(language="cpp", layers=cpp_layers, compile_timeout=60)
    r = run_code(fn, code="#include <cstdio>\nint main(){puts(\"hello\");}", **common)
    assert r["status"] == "Success", r
    _check_stage(r["compile_result"])
    _check_stage(r["run_result"])
    assert r["compile_result"]["status"] == "Finished" and r["run_result"]["stdout"] == "hello\n"
    r = run_code(fn, code="int main( {", **common)
    assert r["status"] == "Failed" and r["compile_result"]["return_code"] != 0 and r["run_result"] is None, r
    assert "error" in r["compile_result"]["stderr"]
    r = run_code(fn, code="#include <cstdio>\nint main(){fputs(\"oops\", stderr); return 3;}", **common)
    assert r["status"] == "Failed" and r["run_result"]["status"] == "Finished"
    assert (r["run_result"]["return_code"], r["run_result"]["stderr"]) == (3, "oops")
    r = run_code(fn, code="int main(){return *(volatile int*)0;}", **common)
    assert r["status"] == "Failed" and r["run_result"]["return_code"] == -11  # SIGSEGV, as SandboxFusion says
    t0 = time.monotonic()
    r = run_code(fn, code="int main(){for(;;);}", run_timeout=1, **common)
    assert r["status"] == "Failed" and r["run_result"]["status"] == "TimeLimitExceeded", r
    assert time.monotonic() - t0 < 30
    # The SDK path, with stdin.
    res = fn.client.fncall("#include <iostream>\nint main(){int a,b;std::cin>>a>>b;std::cout<<a*b;}",
                           language="cpp", stdin="6 7", layers=cpp_layers, compile_timeout=60)
    assert res.compile.exit_code == 0 and res.stdout == b"42", res


def test_run_code_bad_body(fn: FnDaemon) -> None:
    r = urllib.request.Request(fn.http + "/run_code", data=b"{not json", headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(r, timeout=30)
    assert ei.value.code == 400
    out = json.loads(ei.value.read())
    assert out["status"] == "SandboxError" and "not JSON" in out["message"]
