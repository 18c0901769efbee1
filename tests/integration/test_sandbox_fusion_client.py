"""SandboxFusion parity through the real clients (issue 18): the
``sandbox-fusion`` client package from PyPI (pinned in scripts/setup.sh)
and verl's reward code (``verl.utils.reward_score.sandbox_fusion.utils``
from the pinned ``verl`` wheel, loaded by file: importing the ``verl``
package needs torch) against warrend's ``/run_code``.

The daemon serves every language with one default layer set, as an
operator runs it for clients that cannot pick layers (``--fncall-layers
base,toolset/gcc,...``; here the toolset rootfs dirs scripts/setup.sh built,
passed as directories). Each language gets the held cases: correct output
from stdin, compile error (compiled languages), runtime error, time limit,
files in and out, and memory limits (verl sends ``memory_limit_MB``; the
client's RunCodeRequest has no such field). Every answer must have the
fields and status rules of SandboxFusion's own server
(sandbox/server/sandbox_api.py: parse_run_status). Then verl's
check_correctness scores samples at its concurrency of 64.
"""

from __future__ import annotations

import base64
import http.client
import importlib.util
import json
import os
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, Iterable, List, Optional

import pytest
from test_fncall import FnDaemon, _free_port

sandbox_fusion = pytest.importorskip("sandbox_fusion", reason="scripts/setup.sh installs sandbox-fusion==0.3.7")

ROOTFS = Path("/var/cache/warren/rootfs")
# A directory of toolset rootfs dirs that take precedence over ROOTFS's (a
# toolset rebuilt beside the shared one, e.g. by a branch that changes it).
TOOLSET_OVERRIDE = Path(os.environ.get("WARREN_TEST_TOOLSET_DIR", "/nonexistent"))


def _toolset(name: str) -> Path:
    return TOOLSET_OVERRIDE / name if (TOOLSET_OVERRIDE / name).is_dir() else ROOTFS / name
# language -> the toolset rootfs dirs it needs (scripts/setup.sh builds them).
TOOLSETS: Dict[str, List[str]] = {
    "python": [], "bash": [], "cpp": ["toolset-gcc"], "c": ["toolset-gcc"], "java": ["toolset-jdk"],
    "go": ["toolset-go"], "rust": ["toolset-gcc", "toolset-rust"], "nodejs": ["toolset-node"],
}
ALL_TOOLSETS = ["toolset-gcc", "toolset-jdk", "toolset-go", "toolset-rust", "toolset-node", "toolset-python-sci"]
RESPONSE_FIELDS = {"status", "message", "compile_result", "run_result", "executor_pod_name", "files"}
STAGE_FIELDS = {"status", "execution_time", "return_code", "stdout", "stderr"}
COMPILED = {"cpp", "c", "java", "go", "rust"}

# Per language: ok (reverses the first line of stdin), ce (compile error),
# rte (exit code 3), tle (endless loop), files (upper-cases in.txt to
# stdout, writes "out" to out.txt), mem (allocates and touches 256 MiB,
# java 160 MiB: fits at 1024 MB, not at 128).
CASES: Dict[str, Dict[str, Optional[str]]] = {
    "python": {
        "ok": "import sys\nprint(sys.stdin.readline().rstrip('\\n')[::-1])",
        "ce": None,
        "rte": "import sys\nsys.exit(3)",
        "tle": "while True: pass",
        "files": "print(open('in.txt').read().upper(), end='')\nopen('out.txt', 'w').write('out')",
        "mem": "b = bytearray(256 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('ok')",
    },
    "bash": {
        "ok": 'read -r s; o=; for ((i=${#s}-1; i>=0; i--)); do o+=${s:i:1}; done; echo "$o"',
        "ce": None,
        "rte": "exit 3",
        "tle": "while :; do :; done",
        "files": "tr a-z A-Z < in.txt; printf out > out.txt",
        "mem": None,  # bash allocates nothing of its own worth limiting
    },
    "cpp": {
        "ok": "#include <algorithm>\n#include <iostream>\n#include <string>\n"
              "int main(){std::string s; std::getline(std::cin, s); std::reverse(s.begin(), s.end());"
              " std::cout << s << '\\n';}",
        "ce": "int main() { return undefined_name; }",
        "rte": "int main() { return 3; }",
        "tle": "int main() { volatile unsigned x = 0; for (;;) x = x + 1; }",
        "files": "#include <cctype>\n#include <fstream>\n#include <iostream>\n#include <string>\n"
                 "int main(){std::ifstream f(\"in.txt\"); std::string s; std::getline(f, s);"
                 " for (auto& c : s) c = std::toupper(c); std::cout << s; std::ofstream(\"out.txt\") << \"out\";}",
        # volatile: at -O2 gcc drops a malloc + memset whose bytes it can predict.
        "mem": "#include <cstdlib>\n#include <cstdio>\n"
               "int main(){size_t n = 256u << 20; volatile char* p = (volatile char*)malloc(n);"
               " for (size_t i = 0; i < n; i += 4096) p[i] = 1; printf(\"%d\\n\", p[n - 4096]);}",
    },
    "c": {
        "ok": "#include <stdio.h>\n#include <string.h>\nint main(void){char s[256]; fgets(s, sizeof s, stdin);"
              " size_t n = strcspn(s, \"\\n\"); for (size_t i = n; i > 0; i--) putchar(s[i - 1]); putchar('\\n');}",
        "ce": "int main(void) { return undefined_name; }",
        "rte": "int main(void) { return 3; }",
        "tle": "int main(void) { volatile unsigned x = 0; for (;;) x = x + 1; }",
        "files": "#include <ctype.h>\n#include <stdio.h>\nint main(void){FILE* f = fopen(\"in.txt\", \"r\"); int c;"
                 " while ((c = fgetc(f)) != EOF) putchar(toupper(c)); FILE* o = fopen(\"out.txt\", \"w\");"
                 " fputs(\"out\", o); fclose(o);}",
        "mem": None,  # not a SandboxFusion language (verl refuses it); cpp's case covers the C runtime
    },
    "java": {
        "ok": "import java.util.Scanner;\npublic class Main { public static void main(String[] a) {"
              " System.out.println(new StringBuilder(new Scanner(System.in).nextLine()).reverse()); } }",
        "ce": "public class Main { public static void main(String[] a) { int x = \"s\"; } }",
        "rte": "public class Main { public static void main(String[] a) { System.exit(3); } }",
        "tle": "public class Main { public static void main(String[] a) { long x = 0; while (true) { x++; } } }",
        "files": "import java.nio.file.*;\npublic class Main { public static void main(String[] a) throws Exception {"
                 " System.out.print(Files.readString(Path.of(\"in.txt\")).toUpperCase());"
                 " Files.writeString(Path.of(\"out.txt\"), \"out\"); } }",
        # 160 MiB: the JVM sizes its heap by the call's memory limit (1/4 of it), 256 MiB at 1024 MB.
        "mem": "public class Main { public static void main(String[] a) { byte[][] b = new byte[160][];"
               " for (int i = 0; i < 160; i++) { b[i] = new byte[1 << 20]; java.util.Arrays.fill(b[i], (byte) 1); }"
               " System.out.println(b[159][0]); } }",
    },
    "go": {
        "ok": "package main\nimport (\"bufio\"; \"fmt\"; \"os\"; \"strings\")\nfunc main() {"
              " s, _ := bufio.NewReader(os.Stdin).ReadString('\\n'); r := []rune(strings.TrimRight(s, \"\\n\"));"
              " for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 { r[i], r[j] = r[j], r[i] }; fmt.Println(string(r)) }",
        "ce": "package main\nfunc main() { x := 1 }",
        "rte": "package main\nimport \"os\"\nfunc main() { os.Exit(3) }",
        "tle": "package main\nfunc main() { x := 0; for { x++ } }",
        "files": "package main\nimport (\"fmt\"; \"os\"; \"strings\")\nfunc main() { b, _ := os.ReadFile(\"in.txt\");"
                 " fmt.Print(strings.ToUpper(string(b))); os.WriteFile(\"out.txt\", []byte(\"out\"), 0o644) }",
        "mem": "package main\nimport \"fmt\"\nfunc main() { b := make([]byte, 256<<20); for i := range b { b[i] = 1 };"
               " fmt.Println(b[len(b)-1]) }",
    },
    "rust": {
        "ok": "use std::io::stdin;\nfn main() { let mut s = String::new(); stdin().read_line(&mut s).unwrap();"
              " println!(\"{}\", s.trim_end().chars().rev().collect::<String>()); }",
        "ce": "fn main() { let x: i32 = \"s\"; }",
        "rte": "fn main() { std::process::exit(3); }",
        "tle": "fn main() { loop {} }",
        "files": "use std::fs;\nfn main() { print!(\"{}\", fs::read_to_string(\"in.txt\").unwrap().to_uppercase());"
                 " fs::write(\"out.txt\", \"out\").unwrap(); }",
        "mem": "fn main() { let v = vec![1u8; 256 << 20]; println!(\"{}\", v[v.len() - 1]); }",
    },
    "nodejs": {
        "ok": "const s = require('fs').readFileSync(0, 'utf8').split('\\n')[0];"
              " console.log([...s].reverse().join(''));",
        "ce": None,
        "rte": "process.exit(3);",
        "tle": "while (true) {}",
        "files": "const fs = require('fs'); process.stdout.write(fs.readFileSync('in.txt', 'utf8').toUpperCase());"
                 " fs.writeFileSync('out.txt', 'out');",
        "mem": "const b = Buffer.alloc(256 << 20, 1); console.log(b[b.length - 1]);",
    },
}


def _have(lang: str) -> Optional[str]:
    """None when `lang`'s toolsets exist, else why not."""
    for t in TOOLSETS[lang]:
        if not _toolset(t).is_dir():
            return f"no {_toolset(t)} (scripts/setup.sh builds it with scripts/build-toolset-rootfs.sh)"
    return None


@pytest.fixture(scope="module")
def sf(test_root: Path, layer_store: Path, base_layer: str) -> Iterable[FnDaemon]:
    port = _free_port()
    layers = [base_layer] + [str(_toolset(t)) for t in ALL_TOOLSETS if _toolset(t).is_dir()]
    d = FnDaemon(test_root, "sfclient", layer_store, "nsf",
                 extra=["--http-listen", f"127.0.0.1:{port}", "--fncall-layers", ",".join(layers),
                        "--run-code-max-memory-mb", "1024"])
    d.url = f"http://127.0.0.1:{port}"
    d.port = port
    d.start()
    yield d
    d.stop()


def _client_run(sf: FnDaemon, lang: str, code: str, **kw: Any) -> Any:
    """The sandbox-fusion client's run_code (one attempt: a SandboxError or a
    non-200 raises at once, as the client does after its retries)."""
    if lang == "c":  # warren's own: not in the client's Language literal; same request, parsed by its model
        return sandbox_fusion.RunCodeResponse(**_raw(sf, {"code": code, "language": lang, "compile_timeout": 60,
                                                           **kw}))
    req = sandbox_fusion.RunCodeRequest(code=code, language=lang, compile_timeout=60, **kw)
    return sandbox_fusion.run_code(req, endpoint=sf.url, max_attempts=1, client_timeout=180)


def _raw(sf: FnDaemon, body: dict) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", sf.port, timeout=180)
    try:
        conn.request("POST", "/run_code", body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, (resp.status, resp.read())
        return json.loads(resp.read())
    finally:
        conn.close()


def _check_fields(out: dict, lang: str) -> None:
    """SandboxFusion's RunCodeResponse and CommandRunResult fields, exactly."""
    assert set(out) == RESPONSE_FIELDS, out
    for stage in ("compile_result", "run_result"):
        if out[stage] is not None:
            assert set(out[stage]) == STAGE_FIELDS, out
    if lang not in COMPILED:
        assert out["compile_result"] is None, out


@pytest.mark.timeout(900)
@pytest.mark.parametrize("lang", list(CASES))
def test_held_cases_through_the_client(sf: FnDaemon, lang: str) -> None:
    if why := _have(lang):
        pytest.skip(why)
    c = CASES[lang]
    RS, CS = sandbox_fusion.RunStatus, sandbox_fusion.CommandRunStatus
    sandbox_fusion.set_endpoint(sf.url)  # the client's documented way; calls below also pass it

    r = _client_run(sf, lang, c["ok"], stdin="olleh\nrest\n")
    assert r.status == RS.Success and r.message == "", r
    assert r.run_result.status == CS.Finished and r.run_result.return_code == 0
    assert r.run_result.stdout == "hello\n", r
    if lang in COMPILED:
        assert r.compile_result.status == CS.Finished and r.compile_result.return_code == 0, r
        assert 0 < r.compile_result.execution_time < 60
    else:
        assert r.compile_result is None
    assert sandbox_fusion.summary_run_code_result(r, sandbox_fusion.SummaryMapping()) == "Success"

    if c["ce"] is not None:
        r = _client_run(sf, lang, c["ce"])
        assert r.status == RS.Failed and r.message == "" and r.run_result is None, r
        assert r.compile_result.status == CS.Finished and r.compile_result.return_code != 0
        assert r.compile_result.stderr, r
        assert sandbox_fusion.summary_run_code_result(r, sandbox_fusion.SummaryMapping(CompileFailed="CE")) == "CE"

    r = _client_run(sf, lang, c["rte"])
    assert r.status == RS.Failed and r.message == "", r
    assert r.run_result.status == CS.Finished and r.run_result.return_code == 3, r

    t0 = time.monotonic()
    r = _client_run(sf, lang, c["tle"], run_timeout=1)
    assert r.status == RS.Failed, r
    assert r.run_result.status == CS.TimeLimitExceeded and r.run_result.return_code is None, r
    assert 1.0 <= r.run_result.execution_time < 5, r
    assert time.monotonic() - t0 < 60
    assert sandbox_fusion.summary_run_code_result(r, sandbox_fusion.SummaryMapping(RunTimeout="TLE")) == "TLE"

    r = _client_run(sf, lang, c["files"], files={"in.txt": base64.b64encode(b"in-data").decode()},
                    fetch_files=["out.txt", "never-written.txt"])
    assert r.status == RS.Success and r.run_result.stdout == "IN-DATA", r
    # SandboxFusion leaves a file that is not there out of `files`.
    assert r.files == {"out.txt": base64.b64encode(b"out").decode()}, r

    # The raw answers carry SandboxFusion's fields, no more, no fewer.
    for code in (c["ok"], c["rte"]):
        _check_fields(_raw(sf, {"code": code, "language": lang, "stdin": "olleh\n", "compile_timeout": 60}), lang)


def _verl() -> ModuleType:
    """verl's sandbox_fusion reward utils, from the installed wheel."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed (scripts/setup.sh: pip install --no-deps verl==0.9.1)")
    path = Path(list(spec.submodule_search_locations)[0]) / "utils/reward_score/sandbox_fusion/utils.py"
    mod_spec = importlib.util.spec_from_file_location("verl_sandbox_fusion_utils", path)
    assert mod_spec is not None and mod_spec.loader is not None
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


@pytest.mark.timeout(900)
@pytest.mark.parametrize("lang", [x for x in CASES if CASES[x]["mem"]])
def test_memory_limits_as_verl_sends_them(sf: FnDaemon, lang: str) -> None:
    if why := _have(lang):
        pytest.skip(why)
    verl = _verl()
    code = CASES[lang]["mem"]
    out, err = verl.call_sandbox_api(f"{sf.url}/run_code", code, None, 60, 10, 1024, lang)
    assert err is None and out["status"] == "Success", (err, out)
    _check_fields(out, lang)
    out, err = verl.call_sandbox_api(f"{sf.url}/run_code", code, None, 60, 10, 128, lang)
    assert err is None and out["status"] == "Failed", (err, out)
    assert out["run_result"]["status"] == "Finished" and out["run_result"]["return_code"] != 0, out


VERL_CONCURRENCY = 64  # verl's sandbox_fusion max_concurrent default
PROGRAMS = {
    "python": {"right": "a, b = map(int, input().split())\nprint(a * b)",
               "wrong": "a, b = map(int, input().split())\nprint(a + b)",
               "broken": "print(", "slow": "while True: pass"},
    "cpp": {"right": "#include <iostream>\nint main(){long a, b; std::cin >> a >> b; std::cout << a * b << '\\n';}",
            "wrong": "#include <iostream>\nint main(){long a, b; std::cin >> a >> b; std::cout << a + b << '\\n';}",
            "broken": "int main( {", "slow": "int main(){volatile int x = 0; for (;;) x = x + 1;}"},
}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("lang", list(PROGRAMS))
def test_verl_check_correctness_at_concurrency_64(sf: FnDaemon, lang: str) -> None:
    if why := _have(lang):
        pytest.skip(why)
    verl = _verl()
    cases = 32 if lang == "python" else 16  # g++ takes ~1 s of CPU a case, on 2 shared cores here
    in_outs = {"inputs": [f"{i} {i + 7}\n" for i in range(cases)],
               "outputs": [f"{i * (i + 7)}\n" for i in range(cases)]}
    sem = threading.Semaphore(VERL_CONCURRENCY)
    results: Dict[str, Any] = {}

    def score(name: str, program: str, timeout: int) -> None:
        results[name] = verl.check_correctness(f"{sf.url}/run_code", in_outs, program, timeout=timeout,
                                               memory_limit_mb=1024, language=lang, concurrent_semaphore=sem)

    # verl scores many samples at once through one semaphore of 64: these
    # four put 64 (cpp) or 128 (python) cases in flight together.
    jobs = [("right", PROGRAMS[lang]["right"], 30), ("right2", PROGRAMS[lang]["right"], 30),
            ("wrong", PROGRAMS[lang]["wrong"], 30), ("broken", PROGRAMS[lang]["broken"], 30)]
    threads = [threading.Thread(target=score, args=j) for j in jobs]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    n = cases * len(jobs)
    print(f"\nverl check_correctness, {lang}: {n} cases in {time.monotonic() - t0:.1f} s")
    for name in ("right", "right2"):
        res, meta = results[name]
        bad = [(m["status"], m.get("api_request_error"), m.get("stderr")) for r, m in zip(res, meta) if r is not True]
        assert res == [True] * cases, bad[:3]
        for m in meta:
            _check_fields(m["api_response"], lang)
    res, meta = results["wrong"]
    # i * (i + 7) == i + (i + 7) only for no i >= 0 but these: none in range.
    assert res == [False] * cases and {m["status"] for m in meta} == {"wrong_answer"}, meta[:2]
    res, meta = results["broken"]
    want = -4 if lang == "cpp" else -2  # a compile error; python's SyntaxError is a runtime error
    assert res == [want] * cases, [m["status"] for m in meta][:4]
    # The time limit, as verl scores it (-3), on two cases.
    small = {"inputs": in_outs["inputs"][:2], "outputs": in_outs["outputs"][:2]}
    res, meta = verl.check_correctness(f"{sf.url}/run_code", small, PROGRAMS[lang]["slow"], timeout=2,
                                       memory_limit_mb=1024, language=lang, concurrent_semaphore=sem)
    assert res == [-3, -3], [m["status"] for m in meta]


def test_python_has_the_scientific_packages(sf: FnDaemon) -> None:
    """A stock client's python importing numpy & co. (SandboxFusion's runtime
    has them): the python-sci toolset must hold numpy itself, not only the
    packages over it (its build once subtracted pythran's closure, numpy
    included), with the BLAS/LAPACK alternatives links numpy loads."""
    sci = _toolset("toolset-python-sci")
    if not sci.is_dir():
        pytest.skip(f"no {sci} (scripts/setup.sh builds it)")
    code = ("import numpy, scipy.special, pandas, sympy, networkx\n"
            "print(int(numpy.arange(4).sum()), int(scipy.special.comb(5, 2)), len(pandas.DataFrame({'a': [1, 2]})),"
            " sympy.factor('x**2 - 1'), networkx.path_graph(3).number_of_edges(),"
            " int(round(numpy.linalg.det(numpy.eye(3) * 2))))")  # det: LAPACK, through libblas/liblapack.so.3
    r = _client_run(sf, "python", code, run_timeout=60)
    assert r.status == sandbox_fusion.RunStatus.Success, r
    assert r.run_result.stdout == "6 10 2 (x - 1)*(x + 1) 2 8\n", r


JUPYTER_FIELDS = {"status", "message", "driver", "cells", "executor_pod_name", "files"}
CELL_FIELDS = {"stdout", "stderr", "display", "error"}


def _jupyter(sf: FnDaemon, **kw: Any) -> Any:
    """The sandbox-fusion client's run_jupyter (one attempt)."""
    req = sandbox_fusion.RunJupyterRequest(**kw)
    return sandbox_fusion.run_jupyter(req, endpoint=sf.url, max_attempts=1, client_timeout=180)


def _raw_jupyter(sf: FnDaemon, body: Any) -> Any:
    conn = http.client.HTTPConnection("127.0.0.1", sf.port, timeout=180)
    try:
        conn.request("POST", "/run_jupyter", body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@pytest.mark.timeout(300)
def test_run_jupyter_through_the_client(sf: FnDaemon) -> None:
    """/run_jupyter as SandboxFusion's server answers it (sandbox/tests/
    runners/test_jupyter.py's cases and more): cells share one kernel per
    request, each with its stdout, stderr, display and error; a failing cell
    does not stop the next."""
    RS, CS = sandbox_fusion.RunStatus, sandbox_fusion.CommandRunStatus
    r = _jupyter(sf, cells=["print(123)"])
    assert r.status == RS.Success and r.message == "" and r.cells[0].stdout == "123\n", r
    assert r.driver.status == CS.Finished and r.driver.return_code == 0, r

    r = _jupyter(sf, cells=['a = "hello"', "a", "print(a)", 'import sys\nsys.stderr.write("This is an error message\\n")',
                            "assert False", "print(a)", "b = 2;", "1/0\nprint('not reached')", "b * 21",
                            "import os; os.system('echo from a subprocess')", "display(1, 'x'); None"])
    assert r.status == RS.Success, r
    c = r.cells
    assert (c[0].stdout, c[0].stderr, c[0].display, c[0].error) == ("", "", [], []), c[0]
    assert c[1].display == [{"text/plain": "'hello'"}], c[1]
    assert c[2].stdout == "hello\n" and c[2].display == [], c[2]
    assert c[3].stderr == "This is an error message\n" and c[3].display == [{"text/plain": "25"}], c[3]  # write()'s count, as IPython shows it
    assert c[4].error[0]["ename"] == "AssertionError" and c[4].error[0]["traceback"], c[4]
    assert c[5].stdout == "hello\n" and c[5].error == [], c[5]  # the kernel went on after the error
    assert c[6].display == [], c[6]  # a trailing ';' shows nothing
    assert c[7].error[0]["ename"] == "ZeroDivisionError" and c[7].stdout == "", c[7]
    assert c[8].display == [{"text/plain": "42"}], c[8]
    assert c[9].stdout == "from a subprocess\n", c[9]  # fd-level capture
    assert c[10].display == [{"text/plain": "1"}, {"text/plain": "'x'"}], c[10]

    # A kernel per request: nothing carries over to the next one.
    r = _jupyter(sf, cells=["a"])
    assert r.status == RS.Success and r.cells[0].error[0]["ename"] == "NameError", r


@pytest.mark.timeout(300)
def test_run_jupyter_timeouts_files_and_schema(sf: FnDaemon) -> None:
    RS, CS = sandbox_fusion.RunStatus, sandbox_fusion.CommandRunStatus
    # cell_timeout interrupts that cell; the kernel and the next cells go on.
    t0 = time.monotonic()
    r = _jupyter(sf, cells=["x = 5", "import time\ntime.sleep(60)", "while True: pass", "print(x)"],
                 cell_timeout=1, total_timeout=30)
    assert time.monotonic() - t0 < 20
    assert r.status == RS.Success, r
    for i in (1, 2):
        assert r.cells[i].error and r.cells[i].error[0]["ename"] == "TimeoutError", r.cells[i]
    assert r.cells[3].stdout == "5\n", r

    # total_timeout kills the driver: Failed, TimeLimitExceeded, no cells (SandboxFusion's rule).
    t0 = time.monotonic()
    r = _jupyter(sf, cells=["print(1)", "while True: pass"], total_timeout=2)
    assert 2 <= time.monotonic() - t0 < 20
    assert r.status == RS.Failed and r.cells == [] and r.files == {}, r
    assert r.driver.status == CS.TimeLimitExceeded, r

    # files in and out; a file never written is left out; warren's own answer file is not shown.
    r = _jupyter(sf, cells=["d = open('in.txt').read()", "open('out.txt', 'w').write(d.upper())"],
                 files={"in.txt": base64.b64encode(b"data").decode()}, fetch_files=["out.txt", "nope.txt"])
    assert r.status == RS.Success and r.files == {"out.txt": base64.b64encode(b"DATA").decode()}, r

    # Exactly SandboxFusion's fields.
    status, out = _raw_jupyter(sf, {"cells": ["1", "print(2)"]})
    assert status == 200 and set(out) == JUPYTER_FIELDS and out["executor_pod_name"] is None, out
    assert all(set(c) == CELL_FIELDS for c in out["cells"]), out
    assert set(out["driver"]) == STAGE_FIELDS, out

    # Malformed requests: FastAPI's 422 naming the field.
    for body, loc in (({}, ["body", "cells"]), ({"cells": "print(1)"}, ["body", "cells"]),
                      ({"cells": [1]}, ["body", "cells", 0]), ({"cells": [], "kernel": "python2"}, ["body", "kernel"]),
                      ({"cells": [], "total_timeout": "x"}, ["body", "total_timeout"]),
                      ({"cells": [], "files": {"a": None}}, ["body", "files", "a"])):
        status, out = _raw_jupyter(sf, body)
        assert status == 422 and out["detail"][0]["loc"] == loc, (body, status, out)
    status, out = _raw_jupyter(sf, {"cells": [], "fetch_files": [".warren-jupyter-out.json"]})
    assert status == 400 and out["status"] == "SandboxError" and ".warren-jupyter-out.json" in out["message"], out


def test_run_jupyter_scientific_display(sf: FnDaemon) -> None:
    """numpy and pandas in cells; a DataFrame displays text/html and
    text/plain as on an IPython kernel."""
    if not _toolset("toolset-python-sci").is_dir():
        pytest.skip("no toolset-python-sci (scripts/setup.sh builds it)")
    r = _jupyter(sf, cells=["import numpy as np, pandas as pd", "int(np.arange(5).sum())",
                            "pd.DataFrame({'a': [1, 2]})"], total_timeout=60)
    assert r.status == sandbox_fusion.RunStatus.Success, r
    assert r.cells[1].display == [{"text/plain": "10"}], r.cells[1]
    d = r.cells[2].display[0]
    assert "<table" in d["text/html"] and "a" in d["text/plain"], d
