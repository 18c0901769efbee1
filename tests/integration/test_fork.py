"""Fork made by the daemon (Lifecycle.Fork) through the SDK (sync and async)
and the CLI: the copies keep the sandbox's env, workdir, user, limits,
labels and job; labels/ttl_s/exclude/pause are the only overrides."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid

import pytest

import warren
from conftest import CLI


def test_fork_keeps_env_workdir_user_limits_labels_and_job(client, base_layer):
    job = f"fork-{uuid.uuid4().hex[:8]}"
    with client.create(layers=[base_layer], env={"FORK_ENV": "v-\u00e9"}, workdir="/srv/w", user="1000:1000",
                       memory_mb=300, pids=77, labels={"a": "1", "b": "2"}, job=job, ttl_s=900) as sb:
        sb.exec("echo parent > /srv/w/state", user="root", timeout=30)
        sb.exec("mkdir -p /tmp/skip && echo x > /tmp/skip/f", timeout=30)
        kids = sb.fork(2, labels={"b": "3", "c": "4"}, exclude=["/tmp/skip*"])
        try:
            assert len({k.id for k in kids}) == 2 and sb.id not in {k.id for k in kids}
            for k in kids:
                info = k.info()
                assert info.state == "running"
                assert info.labels == {"a": "1", "b": "3", "c": "4"}  # merged over the sandbox's
                assert info.job == job
                assert info.resources.memory_mb == 300 and info.resources.pids == 77
                assert info.ttl_s == 900
                r = k.exec("printf '%s' \"$FORK_ENV\"; echo; pwd; id -u; cat state; test -e /tmp/skip; echo $?",
                           timeout=30)
                assert r.stdout == "v-\u00e9\n/srv/w\n1000\nparent\n1\n".encode(), r
            kids[0].exec("echo k0 >> state", user="root", timeout=30)
            assert kids[1].exec("cat state", timeout=30).stdout == b"parent\n"
            assert sb.exec("cat state", timeout=30).stdout == b"parent\n"
        finally:
            for k in kids:
                k.destroy()


def test_fork_ttl_override_and_refusals(client, base_layer):
    with client.create(layers=[base_layer]) as sb:
        (k,) = sb.fork(1, ttl_s=120, pause=False)
        try:
            assert k.info().ttl_s == 120 and k.info().expires_at_ns > time.time_ns()
        finally:
            k.destroy()
        before = {s.id for s in client.list()}
        with pytest.raises(warren.InvalidArgument, match="memory_mb"):
            sb.fork(2, memory_mb=64)
        with pytest.raises(warren.InvalidArgument):
            sb.fork(100000)  # beyond the daemon's maximum: nothing made
        assert {s.id for s in client.list()} == before


def test_async_fork(daemon, base_layer):
    async def main() -> None:
        async with warren.AsyncClient("unix:" + str(daemon.socket)) as ac:
            async with await ac.create(layers=[base_layer], env={"E": "e"}) as sb:
                await sb.exec("echo a > /f", timeout=30)
                kids = await sb.fork(3, labels={"async": "fork"})
                try:
                    assert all(isinstance(k, warren.AsyncSandbox) for k in kids)
                    for k in kids:
                        assert (await k.exec("cat /f; echo $E", timeout=30)).stdout == b"a\ne\n"
                        assert (await k.info()).labels == {"async": "fork"}
                finally:
                    for k in kids:
                        await k.destroy()

    asyncio.run(main())


def test_cli_fork_options(daemon, client, base_layer):
    if not CLI.exists():
        pytest.fail(f"CLI binary not found at {CLI} (build it or set WARREN_CLI)")
    with client.create(layers=[base_layer], labels={"a": "1"}, env={"E": "cli"}) as sb:
        sb.exec("echo x > /keep; mkdir -p /drop && echo y > /drop/f", timeout=30)
        p = subprocess.run([str(CLI), "--addr", "unix:" + str(daemon.socket), "--json", "fork", sb.id, "-n", "2",
                            "--label", "b=2", "--ttl", "300", "--exclude", "/drop*", "--no-pause"],
                           capture_output=True, timeout=120)
        assert p.returncode == 0, p.stderr
        j = json.loads(p.stdout)
        try:
            assert len(j["ids"]) == 2 and j["layer"]["digest"] == j["layers"][-1]
            for kid in j["ids"]:
                k = client.get(kid)
                assert k.cached_info.labels == {"a": "1", "b": "2"} and k.cached_info.ttl_s == 300
                assert k.exec("cat /keep; echo $E; test -e /drop; echo $?", timeout=30).stdout == b"x\ncli\n1\n"
        finally:
            for kid in j["ids"]:
                client.destroy(kid)
        p = subprocess.run([str(CLI), "--addr", "unix:" + str(daemon.socket), "fork", sb.id, "-n", "1",
                            "--label", "novalue"], capture_output=True, timeout=60)
        assert p.returncode == 2 and b"--label" in p.stderr
