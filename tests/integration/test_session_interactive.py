"""Interactive commands in a shell session (issue 18: "sessions have no
interactive/expect mode for prompts"): start(cmd) runs a program that reads
the session's input, send()/sendline() type to it, expect() waits for its
prompts, wait() gives its exit code; on pipes and on a terminal
(session(pty=True)), sync and async. Programs that prompt: python's input(),
bash's `read -p` (prompts only on a terminal), a y/n loop, the python REPL."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
import warren
from warren.process import EOF, TIMEOUT

# A y/n prompt as a script runs it (`exit` in the session itself would end
# the session, as in run()).
YN = ("bash -c 'while true; do read -r -p \"Continue? [y/n] \" a; case $a in y) echo yes; exit 0;;"
      " n) echo no; exit 1;; *) echo \"please answer y or n\";; esac; done'")


@pytest.mark.parametrize("pty", [False, True])
def test_python_input_prompts(sandbox: warren.Sandbox, pty: bool) -> None:
    with sandbox.session(pty=pty) as sh:
        sh.run("cd /tmp; greeting=hi", timeout=30)  # run() and start() share the shell
        sh.start("python3 -c 'n = input(\"name? \"); a = int(input(\"age? \")); print(\"'$greeting'\", n, a + 1)'")
        assert sh.expect("name\\? ", timeout=30) == 0
        sh.sendline("bob")
        assert sh.expect([b"nope", re.compile(b"age\\? ")], timeout=30) == 1
        sh.sendline("41")
        assert sh.expect(r"hi bob (\d+)", timeout=30) == 0 and sh.match is not None
        assert sh.match.group(1) == b"42"
        r = sh.wait(timeout=30)
        assert r.exit_code == 0 and not r.timed_out, r
        # The session goes on: cwd and variables kept, commands read no input.
        r = sh.run("echo $greeting $PWD; cat", timeout=30)
        assert (r.exit_code, r.stdout) == (0, b"hi /tmp\n"), r


def test_yes_no_prompt_on_a_terminal(sandbox: warren.Sandbox) -> None:
    with sandbox.session(pty=True) as sh:
        sh.start(YN)
        assert sh.expect(r"Continue\? \[y/n\] ", timeout=30) == 0
        sh.sendline("maybe")
        assert sh.expect(["please answer y or n", EOF], timeout=30) == 0
        assert sh.expect(r"\[y/n\] ", timeout=30) == 0
        sh.sendline("n")
        assert sh.expect(["yes", "no"], timeout=30) == 1
        assert sh.wait(timeout=30).exit_code == 1
        # A terminal: stdin is a tty for commands too, output is as written (no \r\n).
        r = sh.run("[ -t 1 ] && echo tty; printf 'a\\nb\\n'", timeout=30)
        assert r.stdout == b"tty\na\nb\n", r


def test_read_p_prompts_only_on_a_terminal(sandbox: warren.Sandbox) -> None:
    """bash's read -p writes its prompt only when stdin is a terminal: on
    pipes expect() never sees it (TIMEOUT), on a pty it does."""
    with sandbox.session() as sh:
        sh.start("read -r -p 'Password: ' p; echo got=$p")
        assert sh.expect(["Password: ", TIMEOUT], timeout=2) == 1 and sh.after is TIMEOUT
        sh.sendline("s3cret")
        assert sh.expect(["got=(.*)\n", EOF], timeout=30) == 0 and sh.match is not None
        assert sh.match.group(1) == b"s3cret"
        assert sh.wait(timeout=30).exit_code == 0
    with sandbox.session(pty=True) as sh:
        sh.start("read -r -p 'Password: ' p; echo got=$p")
        assert sh.expect("Password: ", timeout=30) == 0
        sh.sendline("s3cret")
        assert sh.expect("got=s3cret", timeout=30) == 0


def test_eof_timeout_errors_and_wait_interrupts(sandbox: warren.Sandbox) -> None:
    with sandbox.session(pty=True) as sh:
        sh.start("sh -c 'echo one; echo two; exit 3'")
        assert sh.expect("one\n", timeout=30) == 0
        assert sh.expect(EOF, timeout=30) == 0 and sh.before == b"two\n"
        assert sh.wait(timeout=30).exit_code == 3
        # No match before the end: FailedPrecondition naming the exit code and the output.
        sh.start("echo done; false")
        with pytest.raises(warren.FailedPrecondition, match="exit code 1.*done"):
            sh.expect("never", timeout=30)
        sh.wait(timeout=30)
        # A time-out without TIMEOUT among the patterns raises; the output read is kept.
        sh.start("echo partial; sleep 600")
        with pytest.raises(warren.DeadlineExceeded, match="partial"):
            sh.expect("never", timeout=1)
        r = sh.wait(timeout=1)  # interrupted with SIGINT, as run()'s time-out
        # (bash on a terminal writes a newline when interrupted)
        assert r.timed_out and r.exit_code == 130 and r.stdout.rstrip(b"\n") == b"partial", r
        # One started command at a time; nothing to expect without one.
        sh.start("cat")
        with pytest.raises(warren.FailedPrecondition, match="wait"):
            sh.run("true", timeout=10)
        with pytest.raises(warren.FailedPrecondition, match="wait"):
            sh.start("true")
        sh.send(b"raw bytes\n\x04")  # ^D at the start of a line on a terminal: end of input
        assert sh.expect("raw bytes", timeout=30) == 0
        assert sh.wait(timeout=30).exit_code == 0
        with pytest.raises(warren.FailedPrecondition, match="start"):
            sh.expect("x", timeout=1)
        with pytest.raises(warren.InvalidArgument):
            sh.start("echo a\0b")
        # A long command on a terminal (over the line discipline's 4095 bytes).
        long = "x=" + "a" * 10000 + "; echo ${#x}"
        assert sh.run(long, timeout=30).stdout == b"10000\n"
        sh.start(long + "; read -r -p 'go? ' y; echo $y")
        assert sh.expect("10000\r?\ngo\\? ", timeout=30) == 0
        sh.sendline("went")
        assert sh.expect("went", timeout=30) == 0
        assert sh.wait(timeout=30).exit_code == 0


def test_python_repl_async(daemon: Any, base_layer: str) -> None:
    """The python REPL (prompts on stderr, a terminal) through AsyncSession."""

    async def main() -> None:
        async with warren.AsyncClient("unix:" + str(daemon.socket)) as c:
            async with await c.create(layers=[base_layer], ttl_s=300) as sb:
                async with await sb.session(pty=True) as sh:
                    await sh.start("python3 -q")
                    assert await sh.expect(">>> ", timeout=30) == 0
                    await sh.sendline("x = 6 * 7")
                    assert await sh.expect(">>> ", timeout=30) == 0
                    await sh.sendline("print(x)")
                    assert await sh.expect("42", timeout=30) == 0
                    await sh.sendline("exit()")
                    r = await sh.wait(timeout=30)
                    assert r.exit_code == 0, r

    asyncio.run(main())
