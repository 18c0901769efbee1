"""SWE-ReX on warren, driven the way SWE-agent drives a deployment: start,
a bash session with several commands (state kept between them), syntax
errors, timeouts and exit-code checks, plain commands, file reads, writes
and uploads, stop."""

import asyncio

import pytest

from harness_venv import install_pin

PIN = "swe-rex==1.4.0"


@pytest.fixture(scope="module")
def swerex():
    install_pin(PIN, "swerex")
    import swerex

    return swerex


def test_session_commands_and_files(swerex, daemon, client, base_layer, tmp_path):
    from swerex.exceptions import (
        BashIncorrectSyntaxError,
        CommandTimeoutError,
        NonZeroExitCodeError,
        SessionDoesNotExistError,
        SessionExistsError,
    )
    from swerex.runtime.abstract import (
        BashAction,
        BashInterruptAction,
        CloseBashSessionRequest,
        Command,
        CreateBashSessionRequest,
        ReadFileRequest,
        UploadRequest,
        WriteFileRequest,
    )

    from warren.integrations.swerex import WarrenDeploymentConfig

    (tmp_path / "repo" / "pkg").mkdir(parents=True)
    (tmp_path / "repo" / "pkg" / "mod.py").write_text("X = 1\n")
    (tmp_path / "single.txt").write_text("one file\n")

    async def main():
        dep = WarrenDeploymentConfig(layers=[base_layer], addr="unix:" + str(daemon.socket),
                                     create={"labels": {"test": "1"}}).get_deployment()
        steps = []
        dep.add_hook(type("H", (), {"on_custom_step": lambda self, m: steps.append(m)})())
        await dep.start()
        sb = dep.sandbox
        try:
            rt = dep.runtime
            assert await dep.is_alive()
            await rt.write_file(WriteFileRequest(path="/root/.bashrc_extra", content="export FROM_RC=yes\n"))
            await rt.create_session(CreateBashSessionRequest(startup_source=["/root/.bashrc_extra"]))
            with pytest.raises(SessionExistsError):
                await rt.create_session(CreateBashSessionRequest())
            run = rt.run_in_session
            assert (await run(BashAction(command="cd /tmp && export A=42"))).exit_code == 0
            obs = await run(BashAction(command="pwd; echo $A $FROM_RC; echo to-stderr >&2"))
            assert obs.output == "/tmp\n42 yes\nto-stderr\n" and obs.exit_code == 0
            obs = await run(BashAction(command="false", check="silent"))
            assert obs.exit_code == 1
            assert (await run(BashAction(command="false", check="ignore"))).exit_code is None
            with pytest.raises(NonZeroExitCodeError, match="exit code 3"):
                await run(BashAction(command="(exit 3)", error_msg="boom"))
            with pytest.raises(BashIncorrectSyntaxError):
                await run(BashAction(command="if then fi"))
            with pytest.raises(CommandTimeoutError):
                await run(BashAction(command="sleep 30", timeout=1))
            await run(BashInterruptAction())
            assert (await run(BashAction(command="echo still $A"))).output == "still 42\n"
            with pytest.raises(SessionDoesNotExistError):
                await run(BashAction(command="true", session="other"))
            # Interactive programs as SWE-agent drives them (gdb, REPLs, prompts):
            # is_interactive_command starts the program or types to it, output up to
            # an `expect` string; is_interactive_quit ends it (SWE-ReX's PS1 matched).
            obs = await run(BashAction(command="python3 -q", is_interactive_command=True, expect=[">>> "]))
            assert obs.exit_code == 0 and obs.expect_string == ">>> ", obs
            obs = await run(BashAction(command="print(6 * 7)", is_interactive_command=True, expect=[">>> "]))
            assert obs.output == "42" and obs.expect_string == ">>> ", obs
            obs = await run(BashAction(command="input('sure? [y/n] ')", is_interactive_command=True,
                                       expect=[r"\[y/n\] "]))
            assert obs.output.endswith("sure?") and obs.expect_string == r"\[y/n\] ", obs
            obs = await run(BashAction(command="y", is_interactive_command=True, expect=[">>> "]))
            assert obs.output == "'y'", obs
            obs = await run(BashAction(command="exit()", is_interactive_quit=True, expect=[]))
            assert obs.exit_code == 0 and obs.expect_string == "SHELLPS1PREFIX", obs
            with pytest.raises(CommandTimeoutError):
                await run(BashAction(command="sleep 30", is_interactive_command=True, expect=["never"], timeout=1))
            await rt.close_session(CloseBashSessionRequest())
            await rt.create_session(CreateBashSessionRequest(startup_source=["/root/.bashrc_extra"]))
            await run(BashAction(command="cd /tmp && export A=42"))

            r = await rt.execute(Command(command="echo $B; echo e >&2", shell=True, env={"B": "b"}))
            assert (r.stdout, r.stderr, r.exit_code) == ("b\n", "e\n", 0)
            r = await rt.execute(Command(command=["sh", "-c", "echo o; echo e >&2"], merge_output_streams=True))
            assert (r.stdout, r.stderr) == ("o\ne\n", "")
            with pytest.raises(NonZeroExitCodeError):
                await rt.execute(Command(command="exit 4", shell=True, check=True))
            with pytest.raises(CommandTimeoutError):
                await rt.execute(Command(command="sleep 30", shell=True, timeout=1))

            await rt.write_file(WriteFileRequest(path="/work/new/dir/f.txt", content="héllo\n"))
            assert (await rt.read_file(ReadFileRequest(path="/work/new/dir/f.txt"))).content == "héllo\n"
            with pytest.raises(FileNotFoundError):
                await rt.read_file(ReadFileRequest(path="/nope"))
            await rt.upload(UploadRequest(source_path=str(tmp_path / "repo"), target_path="/work/repo"))
            await rt.upload(UploadRequest(source_path=str(tmp_path / "single.txt"), target_path="/work/s.txt"))
            obs = await run(BashAction(command="cat /work/repo/pkg/mod.py /work/s.txt"))
            assert obs.output == "X = 1\none file\n"
            await rt.close_session(CloseBashSessionRequest())
            with pytest.raises(SessionDoesNotExistError):
                await rt.close_session(CloseBashSessionRequest())
        finally:
            await dep.stop()
        assert steps == ["Starting warren sandbox"]
        return sb.id

    sid = asyncio.run(main())
    import warren
    with pytest.raises(warren.NotFound):
        client.get(sid)
