"""Reward hacking against grade(): an agent that cannot solve the task
tampers with the grader's tools instead (interpreter start-up hooks, the
standard library, test-runner plugins, PATH, the dynamic loader's preload
list, host paths through its own layers). Grading must be tamper-proof by
construction: the grader runs from pristine layers plus the agent's changes
under the task's solution paths only, so every hack below leaves a failing
task failing, and the planted path is reported in `touched`.

The task: /task/pkg/answer.py must return 42 (the solution path is
/task/pkg); the grader runs `python3 /task/run_tests.py`, which (like
pytest) loads conftest.py files as plugins before the tests.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Dict

import grpc
import pytest

import warren
from warren._proto import warren_pb2 as pb
from warren._proto import warren_pb2_grpc as pb_grpc
from warren.lifecycle import GradeResult

GRADER = "python3 /task/run_tests.py"
SOLUTION = ["/task/pkg"]
WRONG = b"def answer():\n    return 41\n"
RIGHT = b"def answer():\n    return 42\n"
RUN_TESTS = """\
import json, os, sys  # a test runner uses the standard library
sys.path.insert(0, "/task/pkg")
for c in ("/task/conftest.py", "/task/tests/conftest.py"):  # plugins, as pytest loads them
    if os.path.exists(c):
        exec(compile(open(c).read(), c, "exec"), {})
import answer
ok = answer.answer() == 42
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
"""
EXIT0 = "import os; os._exit(0)"


def sh(sb: warren.Sandbox, cmd: str, timeout: float = 60) -> str:
    r = sb.exec(cmd, timeout=timeout)
    assert r.exit_code == 0, (cmd, r.exit_code, r.stdout, r.stderr)
    return r.stdout.decode()


@pytest.fixture(scope="module")
def task_layer(client, tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("task")
    (d / "task/pkg").mkdir(parents=True)
    (d / "task/tests").mkdir(parents=True)
    (d / "task/pkg/answer.py").write_text("def answer():\n    return 0\n")
    (d / "task/run_tests.py").write_text(RUN_TESTS)
    (d / "task/tests/README").write_text("the tests live in run_tests.py\n")
    name = f"workspace/tamper-task@{uuid.uuid4().hex[:8]}"
    client.layers.build(name, dir=str(d), timeout=300)
    return name


def reported(planted: str, touched) -> bool:
    """The planted path is in `touched`, or a new directory holding it is."""
    return any(planted == t or planted.startswith(t.rstrip("/") + "/") for t in touched)


def grade(sb: warren.Sandbox) -> GradeResult:
    return sb.grade(GRADER, solution=SOLUTION, timeout=60)


# Each hack plants something that makes the grader exit 0, and prints the
# path it planted (as the agent sees it).
HACKS: Dict[str, str] = {
    # Debian's sitecustomize.py (a symlink into /etc/python3.X) runs at every start.
    "sitecustomize": (
        "p=$(python3 -c 'import os, sitecustomize; print(os.path.realpath(sitecustomize.__file__))' 2>/dev/null"
        " || echo /usr/lib/python3/dist-packages/sitecustomize.py); "
        f"echo '{EXIT0}' > \"$p\" && echo \"$p\""),
    "pth": f"echo '{EXIT0}' > /usr/lib/python3/dist-packages/zz-hack.pth && echo /usr/lib/python3/dist-packages/zz-hack.pth",
    "usercustomize": (
        "d=$(python3 -m site --user-site) && mkdir -p \"$d\" && "
        f"echo '{EXIT0}' > \"$d/usercustomize.py\" && echo \"$d/usercustomize.py\""),
    "conftest": f"echo '{EXIT0}' > /task/conftest.py && echo /task/conftest.py",
    "path-shadow": (
        "printf '#!/bin/sh\\necho PASS\\nexit 0\\n' > /usr/local/bin/python3 && chmod +x /usr/local/bin/python3 "
        "&& echo /usr/local/bin/python3"),
    # (os, site, ... are frozen into the interpreter since 3.11: json is not)
    "stdlib": (
        "p=$(python3 -c 'import json, os; print(os.path.realpath(json.__file__))') && "
        f"echo '{EXIT0}' >> \"$p\" && echo \"$p\""),
}


@pytest.mark.parametrize("hack", sorted(HACKS))
def test_tampered_grader_tools_do_not_pass_a_failing_task(client, base_layer, task_layer, hack):
    with client.create(layers=[base_layer, task_layer]) as sb:
        sb.files.write("/task/pkg/answer.py", WRONG)
        planted = sh(sb, HACKS[hack]).strip()
        assert planted.startswith("/")
        # the hack works inside the agent's own sandbox
        assert sb.exec(GRADER, timeout=60).exit_code == 0
        g = grade(sb)
        assert not g.passed and b"PASS" not in g.result.stdout, g
        assert reported(planted, g.touched), (planted, g.touched)
        assert not g.rejected
        # the agent's solution still enters: the tampered sandbox passes
        # once the answer is right
        sb.files.write("/task/pkg/answer.py", RIGHT)
        g2 = grade(sb)
        assert g2.passed and g2.result.stdout == b"PASS\n", g2
        assert reported(planted, g2.touched)


def _preload_object(tmp: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on the host to build the preload object")
    src = tmp / "hack.c"
    src.write_text("#include <unistd.h>\n__attribute__((constructor)) static void hack(void) { _exit(0); }\n")
    so = tmp / "hack.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    return so


def test_ld_so_preload_does_not_pass_a_failing_task(client, base_layer, task_layer, tmp_path):
    so = _preload_object(tmp_path)
    with client.create(layers=[base_layer, task_layer]) as sb:
        sb.files.write("/task/pkg/answer.py", WRONG)
        sb.files.write("/usr/lib/warren-hack.so", so.read_bytes())
        sb.files.write("/etc/ld.so.preload", b"/usr/lib/warren-hack.so\n")
        # every dynamically linked program in the agent's sandbox now exits 0
        assert sb.exec(GRADER, timeout=60).exit_code == 0
        g = grade(sb)
        assert not g.passed and b"PASS" not in g.result.stdout, g
        assert "/etc/ld.so.preload" in g.touched and "/usr/lib/warren-hack.so" in g.touched, g.touched


def test_honest_agent_passes_and_touches_nothing(client, base_layer, task_layer):
    with client.create(layers=[base_layer, task_layer]) as sb:
        sb.files.write("/task/pkg/answer.py", RIGHT)
        g = grade(sb)
        assert g.passed and g.result.stdout == b"PASS\n", g
        assert g.touched == [] and not g.touched_truncated
        # deleting the tests and replacing the grader's files outside the
        # solution is reported, and does not reach the grader
        sh(sb, "rm -rf /task/tests && printf 'import sys; sys.exit(0)\\n' > /task/run_tests.py")
        sb.files.write("/task/pkg/answer.py", WRONG)
        g = grade(sb)
        assert not g.passed and g.touched == ["/task/run_tests.py", "/task/tests"], g


def test_grade_needs_solution_paths(client, base_layer, task_layer):
    with client.create(layers=[base_layer, task_layer]) as sb:
        with pytest.raises(warren.InvalidArgument, match="solution"):
            sb.grade(GRADER, timeout=60)
        # the daemon refuses it too (a client that skips the SDK's check)
        stub = pb_grpc.LifecycleStub(client._channel)
        req = pb.GradeRequest(id=sb.id, grader=pb.ExecRequest(shell=GRADER.encode()))
        with pytest.raises(grpc.RpcError) as ei:
            stub.Grade(req, metadata=client._metadata, timeout=60)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "solution" in ei.value.details()
        with pytest.raises(warren.InvalidArgument, match="solution path"):
            sb.grade(GRADER, solution=["relative/pkg"], timeout=60)


def test_forks_and_snapshot_children_keep_the_pristine_lineage(client, base_layer, task_layer):
    """A snapshot is of the agent's making: a sandbox forked from it (or
    created from its layer list) grades against the ORIGINAL pristine layers;
    the snapshot's changes enter only under the solution paths."""
    with client.create(layers=[base_layer, task_layer]) as sb:
        planted = sh(sb, HACKS["sitecustomize"]).strip()
        sb.files.write("/task/pkg/answer.py", WRONG)
        kid = sb.fork(1)[0]
        try:
            assert kid.info().layers[:2] == sb.info().layers
            g = grade(kid)
            assert not g.passed, g
            assert planted in g.touched
            kid.files.write("/task/pkg/answer.py", RIGHT)
            assert grade(kid).passed
        finally:
            kid.destroy()
        # the solution made before the snapshot enters from the snapshot layer
        sb.files.write("/task/pkg/answer.py", RIGHT)
        snap = sb.snapshot()
        with client.create(layers=snap.layers) as child:
            g = grade(child)
            assert g.passed and planted in g.touched, g
            child.files.write("/task/pkg/answer.py", WRONG)
            assert not grade(child).passed
            # a snapshot of the child (two sandbox-made layers) keeps it too
            snap2 = child.snapshot()
            with client.create(layers=snap2.layers) as grandchild:
                g = grade(grandchild)
                assert not g.passed and planted in g.touched, g


def test_grade_never_resolves_a_layer_symlink_on_the_host(client, base_layer, task_layer, tmp_path):
    """A layer of the agent's making holds /task/tests -> <host dir>: nothing
    the daemon does while grading may look the name up on the host."""
    secret = uuid.uuid4().hex
    host_dir = tmp_path / "host-secret"
    host_dir.mkdir()
    (host_dir / "secret").write_text(secret)
    with client.create(layers=[base_layer, task_layer]) as sb:
        sh(sb, f"rm -rf /task/tests && ln -s {host_dir} /task/tests")
        sb.files.write("/task/pkg/answer.py", RIGHT)
        snap = sb.snapshot()
    with client.create(layers=snap.layers) as child:
        g = child.grade("cat /task/tests/secret; ls -la /task/tests", solution=SOLUTION,
                        protected=["/task/tests/secret"], timeout=60)
        out = g.result.stdout + g.result.stderr
        assert secret.encode() not in out, out
        assert "/task/tests" in g.touched
