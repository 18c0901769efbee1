#!/usr/bin/env python3
"""Generates the computer-use eval tasks (eval/tasks/computer-use): each
rollout is a container sandbox with the toolset/desktop layer (Xvfb,
matchbox, xterm, dillo; scripts/build-toolset-desktop-rootfs.sh) driven only
through the desktop API (screenshots, keys, text, pointer), graded by the
state the apps left behind:

  * form: a page served inside the sandbox (a Perl server on 127.0.0.1:8080)
    is open in dillo; the agent clicks the text field, types, and clicks
    Send (or presses Return). Graded by what the server received
    (/srv/form/received).
  * terminal: the agent types a command into xterm. Graded by the file the
    command wrote.
  * paste: the agent selects a word xterm shows with a left-button drag and
    pastes it with a middle click into a command line. Graded by the file
    that line wrote.

Each kind has a trajectory that does the task (expected: pass) and ones that
do not (a wrong string, a command never sent, a paste with nothing
selected: expected: fail). Pointer coordinates are the screen's as the
toolset/desktop@1 layer draws it at 1024x768 (dillo 3.0.5's window under
matchbox, xterm's 10x20 font): the text field's inside spans (7..224,
137..155) and Send (228..268, 137..155), measured from a screenshot
(tests/integration/test_desktop_x11.py finds the field by colour). Formats:
docs/eval-format.md.

Usage: gen_computer_use.py [--out eval/tasks/computer-use]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Dict, List

LAYERS = ["base/debian-12@1", "toolset/desktop@1"]
REPO = "/root"

SERVER = r"""use IO::Socket::INET;
my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 8080, Listen => 5, ReuseAddr => 1) or die "listen: $!";
my $page = '<html><body bgcolor="#ffd000"><h1>warren form</h1>'
  . '<form action="/submit" method="get"><input type="text" name="q" size="24" style="background-color:#ffffff">'
  . '<input type="submit" value="Send"></form></body></html>';
while (my $c = $s->accept) {
  my $req = <$c>;
  while (my $l = <$c>) { last if $l =~ /^\r?\n$/ }
  my $body = $page;
  if ($req =~ m{^GET /submit\?q=([^ &]*)}) {
    my $v = $1; $v =~ s/\+/ /g; $v =~ s/%([0-9A-Fa-f]{2})/chr(hex($1))/ge;
    open(my $f, '>', '/srv/form/received.part') or die "open: $!";
    print $f $v;
    close($f);
    rename('/srv/form/received.part', '/srv/form/received');
    $body = "<html><body bgcolor=\"#80ff80\"><h1>received</h1></body></html>";
  }
  print $c "HTTP/1.0 200 OK\r\nContent-Type: text/html\r\nContent-Length: " . length($body) . "\r\nConnection: close\r\n\r\n$body";
  close $c;
  if ($req =~ m{^GET / }) { open(my $m, '>', '/srv/form/served'); close($m); }
}
"""

# Shell waits, bounded (an exec turn's timeout_s bounds them again).
WAIT_LISTEN = ("i=0; until grep -q '0100007F:1F90 00000000:0000 0A' /proc/net/tcp; do "
               "i=$((i+1)); [ $i -ge 200 ] && exit 1; sleep 0.05; done")
WAIT_PAGE = ("i=0; until [ -e /srv/form/served ] && DISPLAY=:0 xdotool search --onlyvisible --class Dillo "
             ">/dev/null; do i=$((i+1)); [ $i -ge 300 ] && exit 1; sleep 0.1; done; sleep 1")


def wait_file(path: str, seconds: int = 10) -> Dict[str, Any]:
    """An agent checking its work: waits (bounded) for `path`; never fails
    the rollout (the grader decides)."""
    n = seconds * 10
    return {"type": "exec", "cmd": f"i=0; until [ -s {path} ]; do i=$((i+1)); [ $i -ge {n} ] && break; "
                                   f"sleep 0.1; done; cat {path} 2>/dev/null; true", "timeout_s": seconds + 5}


FIELD = (115, 146)  # the text field's middle
SEND = (247, 146)   # the Send button

FORM_SETUP: List[Dict[str, Any]] = [
    {"type": "screenshot", "note": "the first desktop call starts X, matchbox and xterm"},
    {"type": "write", "path": "/srv/form/server.pl", "content": SERVER},
    {"type": "exec", "cmd": "setsid perl /srv/form/server.pl </dev/null >/tmp/server.log 2>&1 & " + WAIT_LISTEN,
     "expect_exit": 0, "timeout_s": 30},
    {"type": "exec", "cmd": "HOME=/root DISPLAY=:0 setsid dillo http://127.0.0.1:8080/ </dev/null >/tmp/dillo.log "
                            "2>&1 & " + WAIT_PAGE, "expect_exit": 0, "timeout_s": 60},
]
FORM_GRADE = 'test -f /srv/form/received && [ "$(cat /srv/form/received)" = {tests} ]'

TERM_SETUP: List[Dict[str, Any]] = [
    {"type": "screenshot", "note": "the first desktop call starts X, matchbox and xterm"},
]


def form(text: str, submit: str) -> List[Dict[str, Any]]:
    turns: List[Dict[str, Any]] = [
        {"type": "screenshot"},
        {"type": "mouse", "x": FIELD[0], "y": FIELD[1], "button": "left", "action": "click"},
        {"type": "type", "text": text},
        {"type": "screenshot"},
    ]
    if submit == "button":
        turns.append({"type": "mouse", "x": SEND[0], "y": SEND[1], "button": "left", "action": "click"})
    elif submit == "return":
        turns.append({"type": "key", "keys": "Return"})
    turns += [wait_file("/srv/form/received"), {"type": "screenshot"}]
    return turns


def terminal(line: str) -> List[Dict[str, Any]]:
    return [{"type": "screenshot"}, {"type": "key", "keys": "ctrl+l"}, {"type": "type", "text": line},
            wait_file("/root/answer.txt", 5), {"type": "screenshot"}]


def paste(select: bool) -> List[Dict[str, Any]]:
    # After ctrl+l the echoed line is xterm's row 1 (y 20..39); its cells
    # 0..11 hold "clicked_word" (10 px each): a drag from x=1 to x=125.
    turns: List[Dict[str, Any]] = [
        {"type": "key", "keys": "ctrl+l"},
        {"type": "type", "text": "echo clicked_word_and_more\n"},
        {"type": "exec", "cmd": "sleep 0.5"},
        {"type": "screenshot"},
    ]
    if select:
        turns += [
            {"type": "mouse", "x": 1, "y": 30, "button": "left", "action": "down"},
            {"type": "mouse", "x": 125, "y": 30},
            {"type": "mouse", "x": 125, "y": 30, "button": "left", "action": "up"},
        ]
    turns += [
        {"type": "type", "text": "echo "},
        {"type": "mouse", "x": 500, "y": 400, "button": "middle", "action": "click"},
        {"type": "type", "text": " > /root/pasted.txt\n"},
        wait_file("/root/pasted.txt", 5),
    ]
    return turns


def tasks() -> List[Dict[str, Any]]:
    out = []

    def add(tid: str, setup: List[Dict[str, Any]], grade: str, tests: List[str], expected: str,
            turns: List[Dict[str, Any]], solution: List[str], note: str) -> None:
        out.append({
            "id": tid, "layers": LAYERS, "repo": REPO, "setup": setup, "test_command": grade, "tests": tests,
            "expected": expected, "trajectory": {"id": tid, "turns": turns}, "solution": solution,
            "resources": {"memory_mb": 1024}, "timeout_s": 60, "note": note,
        })

    add("cu-form-send-button", FORM_SETUP, FORM_GRADE, ["warren-form-42"], "pass", form("warren-form-42", "button"),
        ["/srv/form"], "click the field, type, click Send")
    add("cu-form-return-key", FORM_SETUP, FORM_GRADE, ["warren-form-42"], "pass", form("warren-form-42", "return"),
        ["/srv/form"], "click the field, type, press Return")
    add("cu-form-wrong-text", FORM_SETUP, FORM_GRADE, ["warren-form-42"], "fail", form("warren-form-24", "button"),
        ["/srv/form"], "types another string")
    add("cu-form-never-sent", FORM_SETUP, FORM_GRADE, ["warren-form-42"], "fail", form("warren-form-42", "none"),
        ["/srv/form"], "types, never submits")
    term_grade = '[ "$(cat /root/answer.txt)" = {tests} ]'
    add("cu-terminal-echo", TERM_SETUP, term_grade, ["warren-cu-7"], "pass",
        terminal("echo warren-cu-$((3+4)) > /root/answer.txt\n"), ["/root"], "a command typed into xterm")
    add("cu-terminal-unsent", TERM_SETUP, term_grade, ["warren-cu-7"], "fail",
        terminal("echo warren-cu-$((3+4)) > /root/answer.txt"), ["/root"], "typed, Return never pressed")
    paste_grade = '[ "$(cat /root/pasted.txt)" = {tests} ]'
    add("cu-paste-selected-word", TERM_SETUP, paste_grade, ["clicked_word"], "pass", paste(True), ["/root"],
        "select a word with a drag, paste it with a middle click")
    add("cu-paste-nothing-selected", TERM_SETUP, paste_grade, ["clicked_word"], "fail", paste(False), ["/root"],
        "a middle click with nothing selected")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "computer-use"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ts = tasks()
    with open(out / "tasks.jsonl", "w") as f:
        f.write("# generated by eval/tasks/gen_computer_use.py: computer-use tasks (docs/eval-format.md)\n")
        for t in ts:
            f.write(json.dumps(t, sort_keys=True) + "\n")
    print(f"{out}: {len(ts)} tasks")


if __name__ == "__main__":
    main()
