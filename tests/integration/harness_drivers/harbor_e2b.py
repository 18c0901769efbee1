"""Drives Harbor's own E2B environment (harbor.environments.e2b.E2BEnvironment,
unmodified, on the real `e2b` SDK) against warrend's E2B front end, through
Harbor's BaseEnvironment surface (run in the harness venv by
test_e2b_harbor.py). The SDK finds warren only through its documented
variables E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY, set by the test.

argv[1] = the template reference to launch (Harbor's prebuilt_template_id),
argv[2] = the template key warren resolves it to, argv[3] = a scratch dir.
Prints one JSON line {"ok": true, "sandbox": id} last; exits non-zero on the
first failed check."""

import asyncio
import hashlib
import json
import os
import sys
import time
from pathlib import Path

from e2b.exceptions import TimeoutException
from harbor.environments.factory import EnvironmentFactory
from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

from e2b import AsyncSandbox

TEMPLATE, RESOLVED, SCRATCH = sys.argv[1], sys.argv[2], Path(sys.argv[3])


def make_env(env_dir: Path, name: str, **kw):
    trial = TrialPaths(SCRATCH / f"trial-{name}")
    trial.mkdir()
    return EnvironmentFactory.create_environment_from_import_path(
        "harbor.environments.e2b:E2BEnvironment", environment_dir=env_dir, environment_name=name,
        session_id=f"{name}__driver__env", trial_paths=trial,
        task_env_config=EnvironmentConfig(network_mode=NetworkMode.NO_NETWORK),
        network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK), prebuilt_template_id=TEMPLATE, **kw)


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


async def main() -> str:
    env_dir = SCRATCH / "env"
    env_dir.mkdir()
    # A short lease renewed every 2 s: the sandbox lives on past its first
    # timeout only through Harbor's set_timeout renewals.
    env = make_env(env_dir, "e2b-direct", sandbox_timeout_sec=8, renew_interval_sec=2)
    t0 = time.time()
    await env.start(force_build=False)
    sb = env._sandbox
    check(sb is not None, "no sandbox after start")
    sandbox_id = sb.sandbox_id
    try:
        info = await sb.get_info()
        check(info.template_id == RESOLVED, f"template {info.template_id!r}, want {RESOLVED!r}")
        check(info.metadata.get("session_id") == "e2b-direct__driver__env", f"metadata {info.metadata}")
        check(info.metadata.get("template_ref") == TEMPLATE, f"metadata {info.metadata}")

        # Exit codes, stdout and stderr apart.
        r = await env.exec("echo out; echo err >&2; exit 3")
        check((r.return_code, r.stdout, r.stderr) == (3, "out\n", "err\n"), f"exit 3: {r}")
        r = await env.exec("true")
        check((r.return_code, r.stdout, r.stderr) == (0, "", ""), f"true: {r}")
        # cwd, env (over the startup env), default user root, another user.
        r = await env.exec("pwd; echo \"$X|$HOME\"; id -un", cwd="/tmp", env={"X": "two words"})
        check((r.return_code, r.stdout) == (0, "/tmp\ntwo words|/root\nroot\n"), f"cwd/env: {r}")
        r = await env.exec("id -un; pwd", user="nobody", cwd="/")
        check(r.stdout == "nobody\n/\n", f"user: {r}")
        # Output byte for byte, more than one data event.
        r = await env.exec("seq 1 40000")
        want = "".join(f"{i}\n" for i in range(1, 40001))
        check(r.stdout == want, f"seq: {len(r.stdout)} chars, sha {hashlib.sha256(r.stdout.encode()).hexdigest()}")
        # A timeout ends the command, and warren killed it (not only the client giving up).
        t = time.monotonic()
        try:
            await env.exec("sleep 30; echo late", timeout_sec=2)
            check(False, "sleep 30 with timeout_sec=2 returned")
        except TimeoutException:
            pass
        check(time.monotonic() - t < 15, f"the timeout took {time.monotonic() - t:.1f} s")
        for _ in range(50):
            procs = await sb.commands.list()
            if not any("sleep 30" in " ".join([p.cmd, *p.args]) for p in procs):
                break
            await asyncio.sleep(0.2)
        else:
            check(False, "the timed-out command still runs")

        # Files: one file (its mode kept), a tree (modes, a symlink, an empty dir) both ways.
        src = SCRATCH / "tree"
        (src / "sub" / "empty").mkdir(parents=True)
        (src / "sub" / "run.sh").write_text("#!/bin/sh\necho ran-$1\n")
        (src / "sub" / "run.sh").chmod(0o755)
        blob = bytes(range(256)) * 1024
        (src / "blob.bin").write_bytes(blob)
        os.symlink("sub/run.sh", src / "link")
        await env.upload_file(src / "sub" / "run.sh", "/up/one/run.sh")
        r = await env.exec("/up/one/run.sh a && stat -c %a /up/one/run.sh")
        check(r.stdout == "ran-a\n755\n", f"upload_file: {r}")
        await env.upload_dir(src, "/up/tree")
        r = await env.exec("/up/tree/link b; readlink /up/tree/link; test -d /up/tree/sub/empty && echo dir; "
                           "sha256sum < /up/tree/blob.bin")
        check(r.stdout == f"ran-b\nsub/run.sh\ndir\n{hashlib.sha256(blob).hexdigest()}  -\n", f"upload_dir: {r}")
        check(await env.is_dir("/up/tree/sub") and not await env.is_file("/up/tree/sub"), "is_dir")
        check(await env.is_file("/up/tree/blob.bin") and not await env.is_dir("/up/tree/blob.bin"), "is_file")
        check(not await env.is_file("/up/none") and not await env.is_dir("/up/none"), "missing path")
        await env.exec("mkdir -p /out/d && printf 'made\\n' > /out/d/f.txt && ln -s f.txt /out/d/l")
        await env.download_file("/up/tree/blob.bin", SCRATCH / "blob.copy")
        check((SCRATCH / "blob.copy").read_bytes() == blob, "download_file")
        await env.download_dir("/out", SCRATCH / "out")
        check((SCRATCH / "out" / "d" / "f.txt").read_text() == "made\n", "download_dir file")
        check(os.readlink(SCRATCH / "out" / "d" / "l") == "f.txt", "download_dir symlink")

        # The lease was renewed (set_timeout) past the sandbox's first 8 s.
        while time.time() - t0 < 10:
            await asyncio.sleep(0.5)
        check((await env.exec("echo alive")).stdout == "alive\n", "the sandbox did not outlive its first lease")
    finally:
        await env.stop(delete=True)
    check(await AsyncSandbox.kill(sandbox_id) is False, f"sandbox {sandbox_id} still there after stop")
    return sandbox_id


if __name__ == "__main__":
    sid = asyncio.run(main())
    print(json.dumps({"ok": True, "sandbox": sid}))
