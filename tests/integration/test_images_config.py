"""The image config at create: Env/WorkingDir/User as defaults, and what a
create asks of Entrypoint/Cmd (start: a main process, `docker run -d`) and
ExposedPorts (expose_image_ports: `docker run -P`). The image is built here
with umoci (busybox, an entrypoint script, httpd as its Cmd) and imported
from its OCI layout; a second daemon with a sandbox network serves the
exposures."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterable, List

import pytest

import warren
from conftest import CLI, NODE_PREFIX, Daemon

pytestmark = pytest.mark.skipif(shutil.which("umoci") is None, reason="needs umoci (scripts/setup.sh installs it)")

# The exposures' daemon: a sandbox range of its own (test_network.py uses 10.213.0.0/24).
NET_RANGE = "10.213.77.0/24"

ENTRY = """#!/bin/sh
# The image's Entrypoint: records how it was started, then runs its arguments.
echo "args=$*" > /work/started.tmp
echo "pwd=$(pwd) uid=$(id -u) greeting=$GREETING" >> /work/started.tmp
mv /work/started.tmp /work/started
exec "$@"
"""


def run(*argv: str, timeout: float = 120) -> str:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{argv}: {r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Path:
    """OCI layout: tag "srv" = busybox + /bin/entry.sh + /www/index.html with
    Entrypoint ["/bin/entry.sh"], Cmd ["httpd", "-f", "-p", "8080", "-h",
    "/www"], ExposedPorts 8080/tcp and 5353/udp, Env, WorkingDir /www, User
    1000:1000; tag "bare" = the same without Entrypoint and Cmd."""
    work = tmp_path_factory.mktemp("imgcfg")
    lay = work / "oci"
    run("umoci", "init", "--layout", str(lay))
    run("umoci", "new", "--image", f"{lay}:srv")
    b = work / "bundle"
    run("umoci", "unpack", "--image", f"{lay}:srv", str(b))
    r = b / "rootfs"
    for d in ("bin", "etc", "tmp", "proc", "dev", "sys", "www", "work"):
        (r / d).mkdir(parents=True, exist_ok=True)
    os.chmod(r / "tmp", 0o1777)
    shutil.copy2("/bin/busybox", r / "bin/busybox")
    for applet in ("sh", "cat", "echo", "id", "pwd", "mv", "sleep", "httpd", "test", "wget"):
        os.symlink("busybox", r / "bin" / applet)
    (r / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/work:/bin/sh\n")
    (r / "etc/group").write_text("root:x:0:\nuser:x:1000:\n")
    (r / "bin/entry.sh").write_text(ENTRY)
    os.chmod(r / "bin/entry.sh", 0o755)
    (r / "www/index.html").write_text("hello from the image\n")
    os.chown(r / "work", 1000, 1000)
    run("umoci", "repack", "--image", f"{lay}:srv", str(b))
    run("umoci", "config", "--image", f"{lay}:srv", "--config.env", "PATH=/bin", "--config.env", "GREETING=hi",
        "--config.workingdir", "/www", "--config.user", "1000:1000", "--config.entrypoint", "/bin/entry.sh",
        "--config.cmd", "httpd", "--config.cmd", "-f", "--config.cmd", "-p", "--config.cmd", "8080",
        "--config.cmd", "-h", "--config.cmd", "/www", "--config.exposedports", "8080/tcp",
        "--config.exposedports", "5353/udp")
    run("umoci", "tag", "--image", f"{lay}:srv", "bare")
    run("umoci", "config", "--image", f"{lay}:bare", "--clear=config.entrypoint", "--clear=config.cmd")
    shutil.rmtree(b)
    return lay


@pytest.fixture(scope="module")
def netd(test_root: Path, layer_store: Path, daemon: Daemon) -> Iterable[Daemon]:
    """A daemon with a sandbox network (exposures need one), on the main
    daemon's layer store (so the images imported there are its too)."""
    d = Daemon(test_root, "imgcfg", layer_store, NODE_PREFIX + "c", extra_args=["--sandbox-net", NET_RANGE]).start()
    yield d
    d.stop()
    # Its empty base table stays after it exits (README "Network"): drop it.
    m = re.search(r"nft_table[=\":\s]+\"?(warren_[0-9a-f]{1,4})", d.log_path.read_text(errors="replace"))
    if m:
        subprocess.run(["nft", "delete", "table", "inet", m.group(1)], capture_output=True, check=False)


@pytest.fixture(scope="module")
def images(client: warren.Client, layout: Path) -> dict:
    srv = client.images.import_(str(layout), ref_name="srv", name="cfg/srv:1", timeout=300)
    bare = client.images.import_(str(layout), ref_name="bare", name="cfg/bare:1", timeout=300)
    return {"srv": srv.name, "bare": bare.name}


def started(sb: warren.Sandbox, timeout: float = 20) -> List[str]:
    """The lines the entrypoint script wrote, once it did."""
    deadline = time.monotonic() + timeout
    while True:
        r = sb.exec(["cat", "/work/started"], user="root", timeout=20)
        if r.exit_code == 0:
            return r.stdout.decode().splitlines()
        assert time.monotonic() < deadline, "the main process never ran the entrypoint"
        time.sleep(0.1)


def http_get(address: str, token: str, deadline_s: float = 20) -> tuple:
    host, port = address.rsplit(":", 1)
    end = time.monotonic() + deadline_s
    while True:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            conn.request("GET", "/index.html", headers={"X-Warren-Token": token})
            resp = conn.getresponse()
            out = (resp.status, resp.read().decode(errors="replace"))
        finally:
            conn.close()
        if out[0] != 502 or time.monotonic() > end:  # 502: the server is not listening yet
            return out
        time.sleep(0.1)


def listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((host, int(port))) == 0


def ids(c: warren.Client) -> List[str]:
    return sorted(s.id for s in c.list())


# ---------------------------------------------------------------- tests


def test_config_is_recorded_and_env_workdir_user_are_defaults(client, daemon, images):
    img = client.images.get(images["srv"])
    assert img.config.entrypoint == ("/bin/entry.sh",)
    assert img.config.cmd == ("httpd", "-f", "-p", "8080", "-h", "/www")
    assert img.config.exposed_ports == ("5353/udp", "8080/tcp")
    assert img.config.env == ("PATH=/bin", "GREETING=hi") and img.config.workdir == "/www"
    p = subprocess.run([str(CLI), "--addr", "unix:" + str(daemon.socket), "image", "inspect", images["srv"]],
                       capture_output=True, text=True, timeout=60, check=True)
    cfg = json.loads(p.stdout)["config"]
    assert cfg["entrypoint"] == ["/bin/entry.sh"] and cfg["cmd"][0] == "httpd"
    assert cfg["exposed_ports"] == ["5353/udp", "8080/tcp"]
    # Without start nothing runs: an exec-driven sandbox has no main process.
    with client.create(image=images["srv"]) as sb:
        assert sb.main_process == "" and sb.processes() == []
        r = sb.exec("echo $GREETING; pwd; id -u", timeout=30)
        assert r.stdout.decode().split() == ["hi", "/www", "1000"]


def test_start_runs_entrypoint_and_cmd_and_exposes_the_image_ports(netd, images):
    c = netd.client
    assert c is not None
    with c.create(image=images["srv"], start=True, expose_image_ports=True) as sb:
        assert sb.main_process
        p = sb.process(sb.main_process)
        assert p.info().argv == (b"/bin/entry.sh", b"httpd", b"-f", b"-p", b"8080", b"-h", b"/www")
        assert p.info().running
        # The image's env, workdir and user apply to it as to any exec.
        assert started(sb) == ["args=httpd -f -p 8080 -h /www", "pwd=/www uid=1000 greeting=hi"]
        # 8080/tcp is exposed at create; 5353/udp is not (exposures are TCP).
        exposed = sb.cached_info.exposed
        assert [e.port for e in exposed] == [8080] and sb.info().exposed == exposed
        assert http_get(exposed[0].address, exposed[0].token) == (200, "hello from the image\n")
        assert http_get(exposed[0].address, "0" * 32)[0] == 401
    assert not listening(exposed[0].address)


def test_command_replaces_cmd_and_the_request_wins(netd, images):
    c = netd.client
    assert c is not None
    # Docker's rule: arguments replace the Cmd, the Entrypoint stays; and the
    # request's env/workdir/user win over the image's for the main process.
    with c.create(image=images["srv"], command=["sleep", "300"], env={"GREETING": "yo"}, workdir="/",
                  user="root", expose=[9000]) as sb:
        assert sb.process(sb.main_process).info().argv == (b"/bin/entry.sh", b"sleep", b"300")
        assert started(sb) == ["args=sleep 300", "pwd=/ uid=0 greeting=yo"]
        assert [e.port for e in sb.info().exposed] == [9000]  # expose= without expose_image_ports
    # An image without Entrypoint/Cmd: the command is the whole argv.
    with c.create(image=images["bare"], command=["/bin/entry.sh", "sleep", "300"]) as sb:
        assert sb.process(sb.main_process).info().argv == (b"/bin/entry.sh", b"sleep", b"300")
        assert started(sb)[0] == "args=sleep 300"


def test_retry_with_the_same_request_id_starts_nothing_again(netd, images):
    c = netd.client
    assert c is not None
    key = f"imgcfg-{time.monotonic_ns()}"
    sb = c.create(image=images["srv"], command=["sleep", "300"], request_id=key)
    try:
        again = c.create(image=images["srv"], command=["sleep", "300"], request_id=key)
        assert again.id == sb.id and again.main_process == sb.main_process
        assert [p.id for p in sb.processes()] == [sb.main_process]
    finally:
        sb.destroy()


def test_nothing_to_run_or_a_bad_start_is_refused_and_leaves_nothing(netd, client, images):
    c = netd.client
    assert c is not None
    before, before_main = ids(c), ids(client)
    with pytest.raises(warren.InvalidArgument, match="nothing to run"):
        c.create(image=images["bare"], start=True)
    with pytest.raises(warren.InvalidArgument, match="expose_image_ports needs an image"):
        c.create(layers=[x.layer_name for x in c.images.get(images["bare"]).layers], expose_image_ports=True)
    with pytest.raises(warren.InvalidArgument, match="port"):
        c.create(image=images["srv"], expose=[70000])
    with pytest.raises(warren.InvalidArgument, match="list of"):
        c.create(image=images["srv"], command="sleep 300")  # type: ignore[arg-type]
    # Exposing on a node without a sandbox network: the create fails once the
    # sandbox is up, which is destroyed again (nothing kept).
    with pytest.raises(warren.FailedPrecondition, match="sandbox-net"):
        client.create(image=images["srv"], start=True, expose_image_ports=True)
    assert ids(c) == before and ids(client) == before_main
    # A command not found is what a spawn of it is (as a shell: exit 127,
    # the reason on stderr), not a failed create.
    with c.create(image=images["bare"], command=["/no/such/binary"]) as sb:
        p = sb.process(sb.main_process)
        assert p.wait(timeout=30).exit_code == 127
        assert b"not found" in p.output().stderr


def test_cli_create_start_with_a_command(daemon, images):
    addr = "unix:" + str(daemon.socket)

    def cli(*args: str) -> str:
        p = subprocess.run([str(CLI), "--addr", addr, *args], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, f"warren {args} -> {p.returncode}: {p.stderr}"
        return p.stdout

    out = json.loads(cli("--json", "create", "--image", images["srv"], "--", "sleep", "300"))
    try:
        assert out["main_process"]
        deadline = time.monotonic() + 20
        while True:
            r = subprocess.run([str(CLI), "--addr", addr, "exec", out["id"], "--", "cat", "/work/started"],
                               capture_output=True, text=True, timeout=60)
            if r.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert r.stdout.splitlines()[0] == "args=sleep 300", r.stderr
    finally:
        cli("rm", out["id"])
