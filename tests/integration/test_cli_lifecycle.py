"""The C++ CLI's RL lifecycle verbs end to end against the session's warrend:
suspend, ttl, snapshot (--exclude, --name), fork -n, grade -- CMD
(--protected), job ls|show|heartbeat|suspend|resume|rm, each with --json."""

import json
import subprocess
import time
import uuid

import pytest

import warren
from conftest import CLI


@pytest.fixture(scope="module")
def cli(daemon):
    if not CLI.exists():
        pytest.fail(f"CLI binary not found at {CLI} (build it or set WARREN_CLI)")
    addr = "unix:" + str(daemon.socket)

    def run(*args, input=None, check=True, timeout=120):
        p = subprocess.run([str(CLI), "--addr", addr, *args], input=input,
                           capture_output=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"warren {' '.join(args)} → {p.returncode}: {p.stderr!r}")
        return p

    return run


def test_cli_suspend_ttl(cli, client, base_layer):
    with client.create(layers=[base_layer]) as sb:
        j = json.loads(cli("--json", "suspend", sb.id).stdout)
        assert j["id"] == sb.id and j["state"] == "suspended"
        assert sb.info().state == "suspended"
        assert cli("resume", sb.id).stdout.decode().strip() == sb.id
        assert sb.info().state == "running"
        assert cli("suspend", sb.id).stdout.decode().strip() == sb.id
        assert sb.exec("echo back").stdout == b"back\n"  # any call resumes
        before = time.time_ns()
        j = json.loads(cli("--json", "ttl", sb.id, "600").stdout)
        assert j["ttl_s"] == 600 and j["expires_at_ns"] >= before + 599 * 10**9
        assert sb.info().expires_at_ns == j["expires_at_ns"]
        assert json.loads(cli("--json", "ttl", sb.id, "0").stdout)["expires_at_ns"] == 0
    p = cli("suspend", sb.id, check=False)
    assert p.returncode == 1 and b"NOT_FOUND" in p.stderr
    assert cli("ttl", check=False).returncode == 2  # usage


def test_cli_snapshot_fork_grade(cli, client, base_layer):
    with client.create(layers=[base_layer]) as sb:
        sb.files.write("/w/answer.txt", b"42\n", make_parents=True)
        sb.files.write("/w/secret/key", b"hidden", make_parents=True)
        name = f"workspace/cli-snap-{uuid.uuid4().hex[:8]}@1"
        j = json.loads(cli("--json", "snapshot", sb.id, "--exclude", "/w/secret*", "--name", name).stdout)
        assert j["layer"]["name"] == name and j["layers"][-1] == j["layer"]["digest"]
        assert j["layers"][:-1] == sb.info().layers
        with client.create(layers=j["layers"]) as twin:
            assert twin.files.read("/w/answer.txt") == b"42\n"
            assert not twin.files.exists("/w/secret")
        digest, lname = cli("snapshot", sb.id).stdout.decode().strip().split("\t")
        assert digest.startswith("sha256:") and lname.startswith("workspace/snap-")

        kids = cli("fork", sb.id, "-n", "3").stdout.decode().split()
        try:
            assert len(set(kids)) == 3
            for k in kids:
                assert client.get(k).files.read("/w/answer.txt") == b"42\n"
        finally:
            for k in kids:
                client.destroy(k)
        j = json.loads(cli("--json", "fork", sb.id, "-n", "1").stdout)
        assert len(j["ids"]) == 1
        client.destroy(j["ids"][0])
        assert cli("fork", sb.id, "-n", "0", check=False).returncode == 2

        # grade: the grader's exit code and output; the agent's changes enter
        # only under --solution, the others are reported
        sb.exec("rm -rf /etc/apt", timeout=30)
        p = cli("grade", sb.id, "--solution", "/w", "--", "test -d /etc/apt && cat /w/answer.txt", check=False)
        assert p.returncode == 0, p.stderr
        assert p.stdout == b"42\n" and b"changed by the agent outside the solution: /etc/apt" in p.stderr
        p = cli("--json", "grade", sb.id, "--solution", "/w", "--", "sh", "-c", "echo no; exit 4", check=False)
        assert p.returncode == 4
        j = json.loads(p.stdout)
        assert j["passed"] is False and j["result"]["exit_code"] == 4 and j["touched"] == ["/etc/apt"]
        assert cli("grade", sb.id, "--", "true", check=False).returncode == 2  # no --solution
        assert cli("grade", sb.id, check=False).returncode == 2  # no grader command


def test_cli_job(cli, client, base_layer):
    name = f"cli-job-{uuid.uuid4().hex[:8]}"
    sbs = [client.create(layers=[base_layer], job=name) for _ in range(2)]
    try:
        j = json.loads(cli("--json", "job", "heartbeat", name, "--lease", "3600", "--grace", "60").stdout)
        assert j["name"] == name and j["lease_s"] == 3600 and j["grace_s"] == 60 and j["sandboxes"] == 2
        listed = {x["name"]: x for x in json.loads(cli("--json", "job", "ls").stdout)}
        assert listed[name]["sandboxes"] == 2 and not listed[name]["lapsed"]
        assert name in cli("job", "ls").stdout.decode()
        assert json.loads(cli("--json", "job", "show", name).stdout)["sandboxes"] == 2
        j = json.loads(cli("--json", "job", "suspend", name).stdout)
        assert j["affected"] == 2
        assert {s.info().state for s in sbs} == {"suspended"}
        assert cli("job", "resume", name).stdout.decode().strip() == "2"
        assert {s.info().state for s in sbs} == {"running"}
        assert cli("job", "rm", name).stdout.decode().strip() == "2"
        for s in sbs:
            with pytest.raises(warren.NotFound):
                s.info()
        p = cli("job", "show", name, check=False)
        assert p.returncode == 1 and b"NOT_FOUND" in p.stderr
        assert cli("job", check=False).returncode == 2
    finally:
        for s in sbs:
            try:
                s.destroy()
            except warren.NotFound:
                pass
