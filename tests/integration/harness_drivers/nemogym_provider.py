"""Drives warren.integrations.nemogym.WarrenProvider through NeMo-Gym's own
sandbox API (run in the harness venv by test_providers_nemogym.py):
argv[1] = warrend address, argv[2] = a base layer, argv[3] = a scratch dir.
Exits non-zero on the first failed check."""

import asyncio
import inspect
import json
import sys
import time
from pathlib import Path

from nemo_gym.sandbox import AsyncSandbox
from nemo_gym.sandbox.providers import get_provider_class
from nemo_gym.sandbox.providers.base import (
    ConnectableProvider,
    SandboxCreateError,
    SandboxProvider,
    SandboxSpec,
    SandboxStatus,
    SupportsSandboxEndpoint,
    SupportsSandboxPauseResume,
)

import warren
from warren.integrations.nemogym import WarrenProvider

ADDR, BASE, SCRATCH = sys.argv[1], sys.argv[2], Path(sys.argv[3])
CONF = {"warren": {"addr": ADDR, "layers": [BASE]}}


def check_contract() -> None:
    # Found through NeMo-Gym's registry (the SDK's entry point), and the
    # protocol's methods with the protocol's own signatures.
    assert get_provider_class("warren") is WarrenProvider
    p = WarrenProvider(addr=ADDR)
    for proto in (SupportsSandboxPauseResume, SupportsSandboxEndpoint, ConnectableProvider):
        assert isinstance(p, proto), proto
    for name in ("create", "exec", "upload_file", "download_file", "status", "close", "aclose", "pause", "resume",
                 "endpoint", "serialize_handle", "connect"):
        proto = next(c for c in (SandboxProvider, SupportsSandboxPauseResume, SupportsSandboxEndpoint,
                                 ConnectableProvider) if name in c.__dict__)
        want = [(q.name, q.kind) for q in inspect.signature(getattr(proto, name)).parameters.values()]
        got = [(q.name, q.kind) for q in inspect.signature(getattr(WarrenProvider, name)).parameters.values()]
        assert got == want, (name, got, want)
    assert p.name == "warren"


async def wait_counter_moves(sb: AsyncSandbox) -> None:
    a = (await sb.exec("cat /work/counter")).stdout
    for _ in range(50):
        await asyncio.sleep(0.2)
        if (await sb.exec("cat /work/counter")).stdout != a:
            return
    raise AssertionError("the counter process does not run")


async def pause_cycle(mode: str, client: warren.AsyncClient) -> None:
    conf = {"warren": {**CONF["warren"], "pause_mode": mode}}
    spec = SandboxSpec(workdir="/work", env={"A": "1"}, files={"/work/f.txt": "hello"},
                       metadata={"rollout": "7"}, resources={"cpu": 1, "memory_mib": 512}, ttl_s=600)
    async with AsyncSandbox(conf, spec) as sb:
        await sb.start()
        sid = sb._require_handle().sandbox_id
        info = await (await client.get(sid)).info()
        assert info.labels["rollout"] == "7" and info.ttl_s == 600 and info.resources.memory_mb == 512, info
        r = await sb.exec("pwd; echo $A; cat f.txt")
        assert (r.return_code, r.stdout, r.error_type) == (0, "/work\n1\nhello", None), r
        r = await sb.exec("echo e >&2; exit 4", cwd="/tmp", env={"B": "b"})
        assert (r.return_code, r.stderr) == (4, "e\n"), r
        assert (await sb.exec("id -u", user=1234)).stdout == "1234\n"
        t0 = time.monotonic()
        r = await sb.exec("echo started; sleep 30", timeout_s=1)
        assert (r.return_code, r.error_type, r.stdout) == (125, "timeout", "started\n"), r
        assert time.monotonic() - t0 < 10
        r = await sb.exec("true", cwd="/no/such/dir")
        assert (r.return_code, r.error_type) == (125, "sandbox"), r
        # A file and a process, kept over pause/resume.
        await sb.exec("(i=0; while :; do i=$((i+1)); echo $i > /work/counter; sleep 0.1; done) "
                      ">/dev/null 2>&1 & echo $! > /work/pid")
        await sb.exec("echo state > /work/state.txt")
        await wait_counter_moves(sb)
        pid = (await sb.exec("cat /work/pid")).stdout.strip()
        assert await sb.status() == SandboxStatus.RUNNING
        await sb.pause()
        assert await sb.status() == SandboxStatus.PAUSED
        info = await (await client.get(sid)).info()
        assert info.state == ("suspended" if mode == "suspend" else "paused"), info.state
        frozen = (await (await client.get(sid)).info()).state
        await asyncio.sleep(1)
        await sb.resume()
        assert frozen != "running" and await sb.status() == SandboxStatus.RUNNING
        r = await sb.exec(f"kill -0 {pid} && cat /work/state.txt")
        assert (r.return_code, r.stdout) == (0, "state\n"), r
        await wait_counter_moves(sb)
        # Files through NeMo-Gym's upload/download.
        local = SCRATCH / f"up-{mode}.sh"
        local.write_text("#!/bin/sh\necho up\n")
        local.chmod(0o755)
        await sb.upload(local, "/work/deep/up.sh")
        assert (await sb.exec("/work/deep/up.sh")).stdout == "up\n"
        await sb.download("/work/state.txt", SCRATCH / mode / "state.txt")
        assert (SCRATCH / mode / "state.txt").read_text() == "state\n"
    assert await sb.status() == SandboxStatus.STOPPED
    try:
        await client.get(sid)
        raise AssertionError(f"{sid} left after stop")
    except warren.NotFound:
        pass


async def snapshot_and_connect(client: warren.AsyncClient) -> None:
    provider = WarrenProvider(addr=ADDR, layers=[BASE])
    sb = AsyncSandbox(provider, SandboxSpec(workdir="/work"), owns_provider=False)
    await sb.start()
    try:
        await sb.exec("echo from-parent > /work/state.txt; sleep 1000 >/dev/null 2>&1 &")
        snap_id = await provider.snapshot(sb._require_handle(), exclude=["/root/.bash_history"])
        assert snap_id.split("+")[-1].startswith("sha256:"), snap_id
        # The parent goes on after the snapshot.
        assert (await sb.exec("cat /work/state.txt")).stdout == "from-parent\n"
        child = AsyncSandbox(provider, SandboxSpec(workdir="/work", provider_options={"snapshot_id": snap_id}),
                             owns_provider=False)
        await child.start()
        try:
            r = await child.exec("cat /work/state.txt; cat /proc/[0-9]*/comm 2>/dev/null | grep -cx sleep")
            assert r.stdout == "from-parent\n0\n", r
            await child.exec("echo child > /work/state.txt")
            assert (await sb.exec("cat /work/state.txt")).stdout == "from-parent\n"
        finally:
            await child.stop()
        # serialize -> connect in "another process" (a new provider).
        desc = await sb.serialize()
        json.dumps(desc)
        other = WarrenProvider(addr=ADDR)
        again = await AsyncSandbox.connect(desc, provider=other)
        assert (await again.exec("pwd")).stdout == "/work\n"
        await again.disconnect()
        assert (await sb.exec("true")).return_code == 0  # disconnect left it alive
    finally:
        await sb.stop()
        await provider.aclose()

    # Refusals: unknown image, GPUs, unknown provider option.
    for spec, needle in ((SandboxSpec(image="no/such:image"), "no/such"),
                         (SandboxSpec(resources={"gpu": 1}), "GPU"),
                         (SandboxSpec(provider_options={"bogus": 1}), "bogus")):
        try:
            async with AsyncSandbox(CONF, spec) as s:
                await s.start()
            raise AssertionError(f"{spec} accepted")
        except SandboxCreateError as e:
            assert needle in str(e), e


async def main() -> None:
    check_contract()
    client = warren.AsyncClient(ADDR)
    try:
        await pause_cycle("pause", client)
        await pause_cycle("suspend", client)
        await snapshot_and_connect(client)
        left = [s.id for s in await client.list() if "rollout" in s.cached_info().labels]
        assert left == [], left
    finally:
        await client.close()
    print(json.dumps({"ok": True}))


asyncio.run(main())
