# warren fncall zygote: runs as PID 1 of a jailed worker (user+mnt+pid+net+
# ipc+uts namespaces, read-only root, worker cgroup; see worker_jail.cc) as
# `python3 -I -S -c <this file>`, with the worker channel (SOCK_SEQPACKET) on
# fd 3 and the zygote helper (zygote_helper.c, a freestanding shared object)
# as a memfd on fd 4.
#
# Start-up (one message each way, u32 json_len, u32 blob_len, json, blob):
#   daemon -> zygote  {"op":"init","env":{...}} + the call processes' containment
#                     plan (jail/plan.h: struct WarrenJailPlan + its seccomp program)
#   zygote -> daemon  {"op":"ready"}
# Then the zygote calls warren_fncall_loop (the helper) and never runs python
# bytecode again: per call the helper clones the call process D into fresh
# mount, pid and ipc namespaces AHEAD of the call (right after the previous
# D ended), passes D's pidfd to the daemon and reports D's wait status when
# it ends (protocol: zygote_helper.c). D sets itself up in C by the plan
# (fresh tmpfs /tmp = cwd and scratch, /dev/shm, /proc with its masks; no
# capabilities, no_new_privs, seccomp), receives the call from the daemon with the pipe ends the daemon
# owns (stdin 0, stdout 1, stderr 2, status records 1023, compile stdout
# 1021 and stderr 1022), and returns here (call_child). The daemon feeds
# stdin, collects output, kills D at the time-outs and builds the result.
#
# call_child runs python by exec() in D itself (a fork of the pristine
# interpreter, standard library already imported; as PID 1 it would ignore
# catchable signals with the default action, so those are emulated
# (DEATH_SIGNALS); its own SIGKILL is dropped; faults still kill it), bash and
# compiled programs by posix_spawn (vfork) with D as their reaping init.
# Compile stages (C/C++) run first, in their own process group, killed at
# compile_timeout. Status records on fd 1023 (u32 len + json): {"stage":
# "compile"|"run", "status": wait status, "timed_out"[, "t_ns"]}, {"stage":"signal",
# "sig"}, {"stage":"file","path","b64"|"missing"}, {"stage":"setup","error"}.
# When D exits the kernel kills every process of the call's pid namespace
# and its mounts go away.
import builtins
import glob
import ctypes
import io
import json
import os
import select
import signal
import struct
import sys
import time
import traceback

# The standard library user code most often imports, loaded once here so that
# a call pays nothing for it. A smaller set (no dataclasses, decimal, random,
# statistics, pathlib, unittest, ...: 11.5 instead of 20 MB RSS) forks faster
# in a micro-benchmark (1.2 vs 2.3 ms CPU for fork + trivial exec + exit), but
# measured SLOWER end to end in the worker (3.7 vs 2.7 ms CPU per call,
# `perf stat -p <zygote>`, inherited to the calls), so the set stays.
import abc, array, base64, bisect, collections, copy, dataclasses, datetime  # noqa: E401,F401
import decimal, enum, fractions, functools, hashlib, heapq, itertools  # noqa: E401,F401
import math, numbers, operator, random, re, statistics, string, textwrap  # noqa: E401,F401
import typing, queue, pathlib, json as _json, pprint, unittest, csv  # noqa: E401,F401

SOCK = 3
HELPER_FD = 4
PR_CAPBSET_DROP = 24
SRC_DIR = "/tmp/.warren"
COUT_FD, CERR_FD = 1021, 1022  # the compile stage's stdout and stderr (compiled languages)

libc = ctypes.CDLL(None, use_errno=True)
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class LoopArgs(ctypes.Structure):  # struct warren_loop_args (zygote_helper.c)
    _fields_ = [("after_fork_child", ctypes.c_void_p), ("plan", ctypes.c_void_p),
                ("plan_len", ctypes.c_ulong), ("sock", ctypes.c_long),
                ("reseed", ctypes.c_void_p), ("reseed_len", ctypes.c_ulong), ("reseed_index", ctypes.c_void_p),
                ("reseed_index_value", ctypes.c_long)]


class CallIn(ctypes.Structure):  # struct warren_call_in
    _fields_ = [("json", ctypes.c_void_p), ("json_len", ctypes.c_ulong), ("blob", ctypes.c_void_p),
                ("blob_len", ctypes.c_ulong), ("nfds", ctypes.c_long), ("flags", ctypes.c_long)]


CALL_IN_MEMFD = 1  # CallIn.flags: the call came in a memfd (else inline, in CALL_BUF)
CALL_PLAIN_PYTHON = 2  # CallIn.flags: python, default env, no files, no fetch; blob = code
CALL_HEAD = 20  # sizeof(struct CallHead)
CALL_BUF = None  # the helper's g_call (a ctypes char array over it)


def recv_frame():
    """The init message: u32 json_len, u32 blob_len, json, blob."""
    raw = os.read(SOCK, 1 << 24)
    if len(raw) < 8:
        raise EOFError
    jl, bl = struct.unpack("<II", raw[:8])
    return json.loads(raw[8:8 + jl]), raw[8 + jl:8 + jl + bl]


def send_frame(hdr):
    j = json.dumps(hdr).encode()
    os.write(SOCK, struct.pack("<II", len(j), 0) + j)


# Signals whose default action ends the process. Python code runs as PID 1 of
# its pid namespace, and the kernel drops a signal PID 1 gets from inside its
# namespace while its action is SIG_DFL: os.kill(os.getpid(), SIGTERM), an
# unhandled alarm() and the like would do nothing. So the call installs a
# handler for them that reports the signal to warrend (on SIGFD) and
# exits; warrend reports the call as ended by that signal. (SIGKILL and
# SIGSTOP cannot be emulated; SIGINT keeps python's KeyboardInterrupt;
# SIGPIPE and SIGXFSZ stay ignored as in python; signal.getsignal() shows
# this handler instead of SIG_DFL; faults are forced by the kernel and
# kill PID 1 anyway.) The zygote installs the handler once at start (every
# call inherits it: nothing per call); it acts only in a python call running
# as PID 1 (PY_PID1), and elsewhere ignores the signal, as SIG_DFL on PID 1
# does.
DEATH_SIGNALS = (signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2,
                 signal.SIGALRM, signal.SIGABRT, signal.SIGVTALRM, signal.SIGPROF, signal.SIGXCPU)
SIGFD = 1023  # a python call's status fd (below the default RLIMIT_NOFILE)


PY_PID1 = False


def _die_by_signal(sig, frame):
    if not PY_PID1:
        return
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:  # noqa: BLE001
            pass
    raw = json.dumps({"stage": "signal", "sig": int(sig)}).encode()
    try:
        os.write(SIGFD, struct.pack("<I", len(raw)) + raw)
    except OSError:
        pass
    os._exit(128 + int(sig))


def run_python(code, env, pid1=False):
    global PY_PID1
    if pid1:
        PY_PID1 = True
    else:
        for s in DEATH_SIGNALS:  # not PID 1: the kernel's default actions work
            signal.signal(s, signal.SIG_DFL)
    # sys.stdin/stdout/stderr, sys.argv and sys.path[0] (/tmp, the cwd)
    # are set in the zygote (main): nothing to write here.
    if env is not None and env != DEFAULT_ENV:  # the zygote's environment is the default one
        os.environ.clear()
        os.environ.update(env)
    rc = 0
    g = {"__name__": "__main__", "__builtins__": builtins, "__file__": "main.py"}
    try:
        exec(compile(code, "main.py", "exec"), g)
    except SystemExit as e:
        if e.code is None:
            rc = 0
        elif isinstance(e.code, int):
            rc = e.code & 0xFF
        else:
            try:
                print(e.code, file=sys.stderr)
            except Exception:
                pass
            rc = 1
    except BaseException:
        try:
            traceback.print_exc()
        except Exception:
            pass
        rc = 1
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:
            pass
    os._exit(rc)


def spawn(argv, env, fds, pgroup):
    """posix_spawn (vfork: no page-table copy of the interpreter); fds =
    (stdin, stdout, stderr), or None to pass on ours."""
    acts = [(os.POSIX_SPAWN_DUP2, fds[0], 0), (os.POSIX_SPAWN_DUP2, fds[1], 1),
            (os.POSIX_SPAWN_DUP2, fds[2], 2)] if fds else []
    kw = {"setpgroup": 0} if pgroup else {}
    return os.posix_spawn(argv[0], argv, env, file_actions=acts,
                          setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT), **kw)


def wait_child(pid, timeout_ms):
    """Reaps everything (we are PID 1) until `pid` ends; kills its process
    group at the time-out. Returns (wait status, timed_out)."""
    deadline = time.monotonic() + timeout_ms / 1000.0 if timeout_ms > 0 else None
    timed_out = False
    pidfd = os.pidfd_open(pid)
    try:
        for _ in range(1 << 30):
            if deadline is not None and not timed_out:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([pidfd], [], [], left)[0]:
                    if time.monotonic() >= deadline:
                        timed_out = True
                        try:
                            os.killpg(pid, signal.SIGKILL)
                        except OSError:
                            os.kill(pid, signal.SIGKILL)
                    continue
            p, status = os.wait()
            if p == pid:
                return status, timed_out
    finally:
        os.close(pidfd)
    return 0, timed_out


def report(rec):
    raw = json.dumps(rec).encode()
    os.write(SIGFD, struct.pack("<I", len(raw)) + raw)


def get_ref(blob, ref):
    return blob[ref[0]:ref[0] + ref[1]]


def call_child(ci):
    """D: PID 1 of the call's fresh pid namespace, set up and locked down by
    the helper, with its call in `ci` and its pipes on fds 0, 1, 2, SIGFD
    (and COUT_FD, CERR_FD). Writes the files, runs the code (python: here,
    in this fork of the pristine interpreter; others: spawned) and reports
    each stage's wait status on SIGFD. Fetched files go there too, after
    the run."""
    if not LOOP_ARGS.reseed:
        random.seed()  # a call's random numbers are its own (the helper could not do it)
    if ci.flags & CALL_PLAIN_PYTHON:
        # The common case: no json to parse, nothing to prepare; the code
        # is in the helper's buffer, right after the call's head (or, when
        # big, in its memfd mapping).
        if ci.flags & CALL_IN_MEMFD:
            code = ctypes.string_at(ci.blob, ci.blob_len)
        else:
            code = CALL_BUF[CALL_HEAD:CALL_HEAD + ci.blob_len]
        run_python(code.decode("utf-8", "surrogateescape"), None, pid1=True)
    try:
        hdr = json.loads(ctypes.string_at(ci.json, ci.json_len))
        blob = ctypes.string_at(ci.blob, ci.blob_len) if ci.blob_len else b""
        for path, off, ln in hdr.get("files", []):
            p = scratch_path(path)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(blob[off:off + ln])
        lang = hdr["lang"]
        code = get_ref(blob, hdr["code"])
        env = hdr.get("env", {})
        plan = None if lang == "python" else lang_plan(lang, [p for p, _, _ in hdr.get("files", [])])
        if plan is not None:
            env = dict(plan.get("env", {}), **env)
            os.makedirs(SRC_DIR, exist_ok=True)
            with open(SRC_DIR + "/" + plan["src"], "wb") as f:
                f.write(code)
        if plan is not None and plan.get("compile"):
            nul = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
            pid = spawn(plan["compile"], env, (nul, COUT_FD, CERR_FD), True)
            os.close(nul)
            os.close(COUT_FD)
            os.close(CERR_FD)
            status, timed_out = wait_child(pid, hdr.get("compile_timeout_ms", 10000))
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            # t_ns: when the compile stage ended (CLOCK_MONOTONIC, the daemon's
            # steady clock): the run's time starts here, not when warrend got
            # around to reading this record.
            report({"stage": "compile", "status": status, "timed_out": timed_out, "t_ns": time.monotonic_ns()})
            if timed_out or status != 0:
                os._exit(0)
        if lang == "python" and not hdr.get("fetch"):
            run_python(code.decode("utf-8", "surrogateescape"), env, pid1=True)
        if lang == "python":
            # Files to fetch: the code runs in a child so that we can read
            # them after it ended (a second fork, only for such calls).
            pid = os.fork()
            if pid == 0:
                os.closerange(3, 65536)
                run_python(code.decode("utf-8", "surrogateescape"), env)
        else:
            pid = spawn(plan["run"], env, None, False)
        for fd in (0, 1, 2):  # the code's pipes are the code's alone
            os.close(fd)
        status, _ = wait_child(pid, 0)
        report({"stage": "run", "status": status, "timed_out": False})
        cap = hdr.get("cap", 16 << 20)
        for path in hdr.get("fetch", []):
            try:
                with open(scratch_path(path), "rb") as f:
                    data = f.read(cap)
                report({"stage": "file", "path": path, "b64": base64.b64encode(data).decode()})
            except (OSError, ValueError):
                report({"stage": "file", "path": path, "missing": True})
    except BaseException as e:  # noqa: BLE001
        try:
            report({"stage": "setup", "error": "%s: %s" % (type(e).__name__, e)})
        except BaseException:  # noqa: BLE001
            pass
    os._exit(0)


def scratch_path(path):
    """A `files` / `fetch_files` path inside the scratch dir (/tmp)."""
    if path.startswith("/tmp/"):
        path = path[5:]
    elif path.startswith("/"):
        raise ValueError("%s: only paths under /tmp (the call's scratch dir) are writable" % path)
    norm = os.path.normpath(path)
    if norm.startswith("..") or norm in (".", ""):
        raise ValueError("%s: path escapes the scratch dir" % path)
    return os.path.join("/tmp", norm)


def newest(pattern):
    """The last match of a glob in version order (e.g. the newest of
    /usr/lib/go-*/bin/go), or None."""
    found = sorted(glob.glob(pattern), key=lambda p: [int(x) if x.isdigit() else x
                                                      for x in re.split(r"(\d+)", p)])
    return found[-1] if found else None


def need(path, lang, layer):
    """`path` if it exists in the call's root (the layers), else the error
    naming the tool, the language and the toolset layer that has it."""
    if path is None or not os.path.exists(path):
        raise FileNotFoundError("%s is not in this image: %s needs a layer with it (%s)" % (path, lang, layer))
    return path


# How each language other than python runs: its source file (in SRC_DIR),
# the compile stage's argv (None: no compile stage), the run's argv and the
# environment both get (the call's own env wins). Tools are called by the
# path Debian's packages install them at (alternatives symlinks such as
# /usr/bin/java, /usr/bin/cc are made by maintainer scripts, so toolset
# layers built from dpkg -L do not have them). Flags follow SandboxFusion's
# runners (sandbox/runners/major.py) with optimisation on for C, C++, Rust.
def lang_plan(lang, files):
    src = SRC_DIR + "/"
    if lang == "bash":
        return {"src": "main.sh", "compile": None, "run": ["/bin/bash", src + "main.sh"]}
    if lang in ("cpp", "c"):
        cc = need("/usr/bin/g++" if lang == "cpp" else "/usr/bin/gcc", lang, "toolset/gcc: build-essential")
        name, std = ("main.cpp", "-std=c++17") if lang == "cpp" else ("main.c", "-std=c11")
        return {"src": name, "compile": [cc, src + name, "-o", src + "main", "-O2", std, "-lm"],
                "run": [src + "main"]}
    if lang == "rust":
        rustc = need("/usr/bin/rustc", lang, "toolset/rust")
        cc = need("/usr/bin/gcc", lang, "toolset/gcc: rustc links with gcc")
        return {"src": "main.rs", "compile": [rustc, "-O", "-C", "linker=" + cc, src + "main.rs", "-o", src + "main"],
                "run": [src + "main"]}
    if lang == "go":
        go = need(newest("/usr/lib/go-*/bin/go") or "/usr/lib/go/bin/go", lang, "toolset/go")
        env = {"GOCACHE": src + "go-cache", "GOPATH": src + "go", "GOPROXY": "off", "GO111MODULE": "auto",
               "CGO_ENABLED": "0", "GOTOOLCHAIN": "local"}
        return {"src": "main.go", "compile": [go, "build", "-o", src + "main", src + "main.go"],
                "run": [src + "main"], "env": env}
    if lang == "java":
        jdk = os.path.dirname(os.path.dirname(need(newest("/usr/lib/jvm/*/bin/javac"), lang, "toolset/jdk")))
        # SandboxFusion: class Main in Main.java, `-cp .:<jars among files>`, `java -ea`.
        cp = ":".join([SRC_DIR, "/tmp"] + [scratch_path(p) for p in files if p.endswith(".jar")])
        return {"src": "Main.java",
                "compile": [jdk + "/bin/javac", "-J-XX:+UseSerialGC", "-J-XX:TieredStopAtLevel=1", "-J-XX:-UsePerfData", "-encoding",
                            "UTF-8", "-d", SRC_DIR, "-cp", cp, src + "Main.java"],
                "run": [jdk + "/bin/java", "-XX:+UseSerialGC", "-XX:-UsePerfData", "-cp", cp, "-ea", "Main"]}
    if lang == "nodejs":
        node = need("/usr/bin/node", lang, "toolset/node")
        return {"src": "main.js", "compile": None, "run": [node, src + "main.js"]}
    raise ValueError("unsupported language %r" % lang)


def make_stdio():
    """The call's sys.stdin/stdout/stderr, made once in the zygote (every
    call would otherwise build them anew, 85 page faults and ~0.3 ms here):
    fds 0, 1, 2 become pipes like a call's (so the wrappers see what a call's
    streams are: not seekable, not ttys), and the wrappers are built on them.
    The call process gets its own pipes dup3'd onto 0, 1, 2 by the helper."""
    for fd in (0, 1, 2):
        r, w = os.pipe()
        os.dup2(r if fd == 0 else w, fd)
        os.close(r)
        os.close(w)
    return (io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8"),
            io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8"),
            io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding="utf-8",
                             errors="backslashreplace", line_buffering=True))


def mt_state():
    """(address, size) of the Mersenne Twister state of random's shared
    instance and the address of its index, if its C layout is CPython's
    (RandomObject: PyObject_HEAD, int index, uint32_t state[624]; checked
    against getstate()), else None. The helper fills the state with fresh
    random bytes in every call process (cheaper than random.seed(): ~20
    fewer page faults) and sets the index to 624 (regenerate on next use)."""
    try:
        inst = random._inst
        words = inst.getstate()[1]
        head = ctypes.sizeof(ctypes.c_ssize_t) + ctypes.sizeof(ctypes.c_void_p)
        index = ctypes.c_int.from_address(id(inst) + head)
        state = (ctypes.c_uint32 * 624).from_address(id(inst) + head + 4)
        if len(words) != 625 or index.value != words[624] or tuple(state) != words[:624]:
            return None
        return ctypes.addressof(state), ctypes.sizeof(state), ctypes.addressof(index)
    except Exception:  # noqa: BLE001
        return None


STDIO = None
DEFAULT_ENV = {}  # a call's environment unless it sets more (from the init message)
# Kept alive for the helper (it reads them in every call process).
LOOP_ARGS = LoopArgs()
CALL_IN = CallIn()
KEEP = []


def main():
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last_cap = int(f.read())
    except OSError:
        last_cap = 40
    # Nothing exec'd from here on can regain a capability; the zygote keeps
    # its own (CAP_SYS_ADMIN in its user namespace) to make per-call mounts.
    for c in range(last_cap + 1):
        libc.prctl(PR_CAPBSET_DROP, c, 0, 0, 0)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for s in DEATH_SIGNALS:
        signal.signal(s, _die_by_signal)
    hdr, blob = recv_frame()
    if hdr.get("op") != "init":
        os._exit(2)
    global STDIO, DEFAULT_ENV
    DEFAULT_ENV = {str(k): str(v) for k, v in hdr.get("env", {}).items()}
    os.environ.clear()
    os.environ.update(DEFAULT_ENV)
    STDIO = make_stdio()
    # What every python call starts with, set here once rather than per call
    # (each assignment in the call process would copy the pages it writes).
    sys.stdin, sys.stdout, sys.stderr = STDIO
    sys.argv = ["main.py"]
    sys.path.insert(0, "/tmp")
    # -S left out site: the layers' third-party packages (toolset/python-sci's
    # numpy, scipy, ...) are where Debian's site would look.
    sys.path.extend(p for p in ("/usr/local/lib/python%d.%d/dist-packages" % sys.version_info[:2],
                                "/usr/lib/python3/dist-packages") if os.path.isdir(p))
    helper = ctypes.PyDLL("/proc/self/fd/%d" % HELPER_FD)  # GIL held in the loop: it forks
    os.close(HELPER_FD)
    global CALL_BUF
    CALL_BUF = (ctypes.c_char * (CALL_HEAD + (64 << 10))).in_dll(helper, "g_call")
    loop = helper.warren_fncall_loop
    loop.argtypes = [ctypes.POINTER(LoopArgs), ctypes.POINTER(CallIn)]
    loop.restype = ctypes.c_long
    # No PyOS_AfterFork_Child in the call process: it costs ~210 page faults
    # per call, and the zygote is single-threaded and holds no lock but the
    # GIL when it forks (inside the helper), so the interpreter's locks are
    # consistent in the child as they are. Of the python-level at-fork
    # handlers of what the zygote imports (random's and threading's), only
    # random's matters (threading's re-registers the forking thread, the
    # only one, under the same ident): call_child reseeds random itself.
    LOOP_ARGS.after_fork_child = None
    mt = mt_state()
    if mt is not None:
        LOOP_ARGS.reseed, LOOP_ARGS.reseed_len, LOOP_ARGS.reseed_index = mt
        LOOP_ARGS.reseed_index_value = 624
    LOOP_ARGS.sock = SOCK
    plan = ctypes.create_string_buffer(blob, len(blob))  # writable: the helper points the plan at its filter
    KEEP.append(plan)
    LOOP_ARGS.plan = ctypes.addressof(plan)
    LOOP_ARGS.plan_len = len(blob)
    os.umask(0o022)
    # Everything imported so far is shared copy-on-write with every call:
    # keep the calls' garbage collector off those pages.
    import gc
    gc.collect()
    gc.freeze()
    send_frame({"op": "ready", "pid": os.getpid()})
    if loop(ctypes.byref(LOOP_ARGS), ctypes.byref(CALL_IN)) != 0:
        os._exit(4)  # a clone failed; the helper told the daemon
    call_child(CALL_IN)  # only a call process gets here


main()
