"""Drives warren.integrations.harbor.WarrenEnvironment through Harbor's own
BaseEnvironment surface (run in the harness venv by
test_providers_harbor.py): argv[1] = warrend address, argv[2] = a base
layer, argv[3] = a scratch dir. Exits non-zero on the first failed check."""

import asyncio
import json
import sys
from pathlib import Path

from harbor.environments.factory import EnvironmentFactory
from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

import warren
from warren.integrations.harbor import WarrenEnvironment, parse_dockerfile

ADDR, BASE, SCRATCH = sys.argv[1], sys.argv[2], Path(sys.argv[3])


def make_env(env_dir: Path, cfg: EnvironmentConfig, name: str, **kw) -> WarrenEnvironment:
    trial = TrialPaths(SCRATCH / f"trial-{name}")
    trial.mkdir()
    env = EnvironmentFactory.create_environment_from_import_path(
        "warren.integrations.harbor:WarrenEnvironment", environment_dir=env_dir, environment_name=name,
        session_id=f"{name}__driver__env", trial_paths=trial, task_env_config=cfg,
        network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK), addr=ADDR, images={"debian:bookworm-slim": [BASE]}, **kw)
    assert isinstance(env, WarrenEnvironment), type(env)
    return env


async def main() -> None:
    # The parser: continuations, comments inside them, JSON forms.
    ins = parse_dockerfile("# c\nFROM a AS b\nRUN echo 1 \\\n  # inner\n  && echo 2\nCMD [\"x\"]\n")
    assert [(i.keyword, i.value, i.line) for i in ins] == [
        ("FROM", "a AS b", 2), ("RUN", "echo 1    && echo 2", 3), ("CMD", '["x"]', 6)], ins

    env_dir = SCRATCH / "env"
    env_dir.mkdir()
    (env_dir / "Dockerfile").write_text(
        "FROM debian:bookworm-slim\nENV A=1 B=\"two words\"\nWORKDIR /w\nRUN echo built > /w/built\n")
    cfg = EnvironmentConfig(network_mode=NetworkMode.NO_NETWORK, cpus=1, memory_mb=512)
    env = make_env(env_dir, cfg, "direct")
    assert env.capabilities.dynamic_network_policy and env.capabilities.network_allowlist
    await env.start(force_build=False)
    sb = env.sandbox
    assert sb is not None
    try:
        info = await sb.info()
        assert info.labels.get("harbor.session") == "direct__driver__env", info.labels
        r = await env.exec("pwd; echo $A $B; cat built; id -un")
        assert (r.return_code, r.stdout) == (0, "/w\n1 two words\nbuilt\nroot\n"), r
        r = await env.exec("echo $C >&2; pwd; exit 3", cwd="/tmp", env={"C": "see"})
        assert (r.return_code, r.stdout, r.stderr) == (3, "/tmp\n", "see\n"), r
        r = await env.exec("id -u", user=1234)
        assert r.stdout == "1234\n", r
        with env.with_default_user("nobody"):
            assert (await env.exec("id -un")).stdout == "nobody\n"
        try:
            await env.exec("sleep 30", timeout_sec=1)
            raise AssertionError("no timeout")
        except RuntimeError as e:
            assert "timed out after 1 seconds" in str(e), e
        # Streaming to Harbor's output callbacks.
        seen = []

        async def cb(text, stream):
            seen.append((stream, text))
        with env.scoped_output_callback(cb):
            await env.exec("echo out; echo err >&2")
        assert ("stdout", "out\n") in seen and ("stderr", "err\n") in seen, seen
        # Files and directories both ways.
        src = SCRATCH / "tree"
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "x.sh").write_text("#!/bin/sh\necho x\n")
        (src / "sub" / "x.sh").chmod(0o755)
        (src / "top.txt").write_text("top\n")
        await env.upload_dir(src, "/up/tree")
        await env.upload_file(src / "sub" / "x.sh", "/up/single/x.sh")
        r = await env.exec("/up/tree/sub/x.sh && /up/single/x.sh && cat /up/tree/top.txt")
        assert r.stdout == "x\nx\ntop\n", r
        assert await env.is_dir("/up/tree") and await env.is_file("/up/tree/top.txt")
        assert not await env.is_dir("/nope")
        out = SCRATCH / "down"
        await env.download_dir("/up/tree", out)
        assert (out / "sub" / "x.sh").read_text() == "#!/bin/sh\necho x\n" and (out / "top.txt").exists()
        await env.download_file("/w/built", out / "deep" / "built")
        assert (out / "deep" / "built").read_text() == "built\n"
        # Started without a link (no-network): a later no-network phase is a no-op,
        # a public one is refused.
        await env.set_network_policy(NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))
        try:
            await env.set_network_policy(NetworkPolicy(network_mode=NetworkMode.PUBLIC))
            raise AssertionError("public phase accepted without a link")
        except RuntimeError as e:
            assert "without a network link" in str(e), e
    finally:
        sid = sb.id
        await env.stop(delete=True)
    c = warren.AsyncClient(ADDR)
    try:
        try:
            await c.get(sid)
            raise AssertionError(f"sandbox {sid} left after stop(delete=True)")
        except warren.NotFound:
            pass
        left = [s.id for s in await c.list() if "harbor.session" in (s.cached_info().labels or {})]
        assert left == [], left
    finally:
        await c.close()

    # Refused before anything starts: multi-stage, compose; an unmapped image.
    (env_dir / "Dockerfile").write_text("FROM a AS x\nFROM b\n")
    try:
        make_env(env_dir, cfg, "multi")
        raise AssertionError("multi-stage accepted")
    except ValueError as e:
        assert "single-stage" in str(e), e
    (env_dir / "Dockerfile").write_text("FROM some/unknown:1\n")
    env = make_env(env_dir, cfg, "unknown")
    try:
        await env.start(force_build=False)
        raise AssertionError("unknown image accepted")
    except Exception as e:  # SandboxBuildFailedError naming the way out
        assert "some/unknown:1" in str(e) and "images=" in str(e), e
    print(json.dumps({"ok": True}))


asyncio.run(main())
