"""A shell session survives whatever its commands do to the shell itself:
strict-mode options, traps, a failing command, redirections of the shell's
own stdout/stderr. Each command ends with its exit status; the session, its
cwd and its variables stay; the shell's options, traps and fds are back as
they were for the next command. Only an explicit `exit` ends the session,
reported as such."""

from __future__ import annotations

import asyncio

import pytest

import warren

# (command, exit code, stdout): each is followed by a check that the session,
# its cwd and its variables are intact and that nothing of the command's
# options, traps or redirections is left.
CASES = [
    ("set -e; false; echo after", 1, b""),
    ("set -e; (exit 4); echo after", 4, b""),
    ("set -e; x=$(false); echo after", 1, b""),
    ("f() { false; echo in-f; }; set -e; f; echo after", 1, b""),
    ("set -e; false || echo ok; if false; then :; fi; echo fine", 0, b"ok\nfine\n"),
    ("set -euo pipefail; echo $nope; echo after", 1, b""),
    ("set -u; echo ${undefined_var}", 1, b""),
    ("set -o pipefail; false | true", 1, b""),
    ("trap 'exit 3' ERR; false; echo after", 3, b""),
    ("trap 'echo caught $?' ERR; false; echo next", 0, b"caught 1\nnext\n"),
    ("set -e; trap 'echo cleanup' ERR; false; echo after", 1, b"cleanup\n"),
    ("trap 'echo bye' EXIT; echo set", 0, b"set\n"),
    ("trap '' INT; true", 0, b""),
    ("trap - ERR; set -e; false; echo after", 1, b""),
    ("false", 1, b""),
    ("exec 2>/dev/null; echo hidden >&2; echo shown", 0, b"shown\n"),
    ("exec 1>/dev/null; echo gone", 0, b""),
    ("exec 2>&- 1>&-; echo x", 1, b""),
    ("exec </dev/null; echo in", 0, b"in\n"),
    ("exec 3>/dev/null; echo three", 0, b"three\n"),
    ("shopt -s nullglob extglob; set -o noglob", 0, b""),
    ("(set -e; false; echo no); echo sub=$?", 0, b"sub=1\n"),
]


def _intact(sh: warren.Session, i: int) -> None:
    r = sh.run("echo \"$keep $PWD $-\"; shopt -p nullglob; echo err >&2; false | true; echo ${nope-}", timeout=30)
    assert r.exit_code == 0, (i, r)
    assert r.stdout.startswith(b"kept /tmp "), (i, r)
    flags = r.stdout.split(b"\n")[0].split(b" ")[-1]
    assert b"e" not in flags and b"u" not in flags and b"f" not in flags, (i, r)
    assert b"shopt -u nullglob\n" in r.stdout and r.stderr == b"err\n", (i, r)


def test_session_survives_what_commands_do_to_the_shell(sandbox: warren.Sandbox) -> None:
    with sandbox.session() as sh:
        sh.run("keep=kept; cd /tmp", timeout=30)
        for i, (cmd, code, out) in enumerate(CASES):
            r = sh.run(cmd, timeout=30)
            assert (r.exit_code, r.stdout) == (code, out), (cmd, r)
            _intact(sh, i)
        # a timeout still interrupts (a trap '' INT of an earlier command is gone)
        r = sh.run("sleep 50", timeout=1)
        assert r.timed_out and r.exit_code == 130
        _intact(sh, -1)


def test_an_exit_trap_does_not_end_the_session_and_exit_does(sandbox: warren.Sandbox) -> None:
    with sandbox.session() as sh:
        assert sh.run("trap 'echo bye' EXIT; x=1", timeout=30).exit_code == 0
        assert sh.run("echo $x", timeout=30).stdout == b"1\n"
        with pytest.raises(warren.FailedPrecondition, match=r"shell exited \(exit code 7\)"):
            sh.run("exit 7", timeout=30)
        with pytest.raises(warren.FailedPrecondition):
            sh.run("true", timeout=30)


def test_exit_in_a_function_ends_the_session(sandbox: warren.Sandbox) -> None:
    with sandbox.session() as sh:
        sh.run("quit() { exit 2; }", timeout=30)
        with pytest.raises(warren.FailedPrecondition, match="exit code 2"):
            sh.run("quit", timeout=30)


def test_async_session_survives_errexit(daemon, base_layer) -> None:
    async def main() -> None:
        async with warren.AsyncClient("unix:" + str(daemon.socket)) as ac:
            async with await ac.create(layers=[base_layer]) as sb:
                async with await sb.session() as sh:
                    await sh.run("v=1", timeout=30)
                    r = await sh.run("set -e; trap 'exit 9' ERR; false; echo no", timeout=30)
                    assert (r.exit_code, r.stdout) == (9, b"")
                    assert (await sh.run("echo $v; false; echo $?", timeout=30)).stdout == b"1\n1\n"

    asyncio.run(main())
