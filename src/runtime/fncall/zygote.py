# warren fncall zygote: runs as PID 1 of a jailed worker (user+mnt+pid+net+
# ipc+uts namespaces, read-only root, worker cgroup; see fncall_worker.cc) as
# `python3 -I -S -c <this file>`, with the daemon's socket on fd 3.
#
# Protocol (stream socket, little endian): frame = u32 json_len, u32 blob_len,
# json, blob; byte fields in the json are [offset, length] into the blob.
#   daemon -> zygote  {"op":"init","scratch_mb":N} + seccomp BPF (sock_filter array)
#   zygote -> daemon  {"op":"ready"}
#   daemon -> zygote  {"op":"call","seq":N,...}      (see CallManager)
#   zygote -> daemon  {"seq":N,"compile":outcome|null,"run":outcome|null,
#                      "files":[[path,off,len]],"missing":[path],"error":str,
#                      "fatal":bool (the zygote exits after this answer)}
#
# Per call the zygote (which never runs user code and so stays pristine)
# clones D into fresh mount, pid and ipc namespaces; it does so AHEAD of the
# call (right after answering the previous one), so the fork and the mounts
# are off the call's critical path: the zygote's only child between calls is
# that one waiting D. D is PID 1 of its pid namespace; it mounts a fresh tmpfs
# on /tmp (the call's cwd and scratch) and /dev/shm and a fresh /proc, drops
# every capability, sets no_new_privs, installs the seccomp filter, waits for
# the call on a pipe, writes the files, then runs the code: python by
# exec() in itself (a fork of the pristine interpreter, standard library
# already imported; as PID 1 it would ignore catchable signals with the
# default action, so those are emulated (DEATH_SIGNALS); its own SIGKILL is
# dropped; faults still kill it), bash and compiled programs by posix_spawn
# (vfork) with D as their reaping init. Compile stages (C/C++) run first, in
# their own process group, killed at compile_timeout. When D exits the kernel
# kills every process of the call's pid namespace and its mounts go away. The
# zygote feeds stdin, collects output, kills D at the time-out and answers.
import builtins
import ctypes
import io
import json
import os
import resource
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
CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWIPC = 0x08000000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SRC_DIR = "/tmp/.warren"
READ_CHUNK = 1 << 16
SCRATCH_MB = 256  # size of a call's /tmp (the pool's scratch_mb, from the init frame)

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


SECCOMP = None  # (buffer, SockFprog), prepared at init
# Raw clone() called with the GIL held (pythonapi), bracketed by
# PyOS_BeforeFork/AfterFork_*: os.fork() cannot pass namespace flags.
SYS_CLONE = 220 if os.uname().machine == "aarch64" else 56
_syscall = ctypes.pythonapi.syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = [ctypes.c_long, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulong]


def _clone(flags):
    return _syscall(SYS_CLONE, flags, None, None, None, 0)
CAP_HDR = CapHeader(0x20080522, 0)
CAP_ZERO = (CapData * 2)()
SYS_CAPSET = 126  # x86_64
if os.uname().machine == "aarch64":
    SYS_CAPSET = 91


def check(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)))


# ------------------------------------------------------------------ framing
def read_exact(fd, n):
    parts = []
    while n > 0:
        b = os.read(fd, min(n, 1 << 20))
        if not b:
            raise EOFError
        parts.append(b)
        n -= len(b)
    return b"".join(parts)


def recv_frame():
    jl, bl = struct.unpack("<II", read_exact(SOCK, 8))
    raw = read_exact(SOCK, jl)
    blob = read_exact(SOCK, bl) if bl else b""
    return json.loads(raw), raw, blob


class Blobs:
    def __init__(self):
        self.parts, self.size = [], 0

    def add(self, b):
        ref = [self.size, len(b)]
        self.parts.append(b)
        self.size += len(b)
        return ref


def send_frame(hdr, blobs=None):
    j = json.dumps(hdr).encode()
    parts = [struct.pack("<II", len(j), blobs.size if blobs else 0), j]
    if blobs:
        parts.extend(blobs.parts)
    data = memoryview(b"".join(parts))
    while data:
        n = os.write(SOCK, data)
        data = data[n:]


# ------------------------------------------------------------------ child side
def lock_down():
    """In D, before user code: no capabilities, no_new_privs, seccomp."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    check(libc.syscall(SYS_CAPSET, ctypes.byref(CAP_HDR), ctypes.byref(CAP_ZERO)), "capset(0)")
    if SECCOMP is not None:
        check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(SECCOMP[1]), 0, 0),
              "prctl(PR_SET_SECCOMP)")


# Signals whose default action ends the process. Python code runs as PID 1 of
# its pid namespace, and the kernel drops a signal PID 1 gets from inside its
# namespace while its action is SIG_DFL: os.kill(os.getpid(), SIGTERM), an
# unhandled alarm() and the like would do nothing. So the call installs a
# handler for them that reports the signal to the zygote (on SIGFD) and
# exits; the zygote reports the call as ended by that signal. (SIGKILL and
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
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8")
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True)
    sys.argv = ["main.py"]
    sys.path.insert(0, os.getcwd())
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


def lock_down_fds(fds):
    os.dup2(fds[0], 0)
    os.dup2(fds[1], 1)
    os.dup2(fds[2], 2)


def spawn(argv, env, fds, pgroup):
    """posix_spawn (vfork: no page-table copy of the interpreter)."""
    acts = [(os.POSIX_SPAWN_DUP2, fds[0], 0), (os.POSIX_SPAWN_DUP2, fds[1], 1),
            (os.POSIX_SPAWN_DUP2, fds[2], 2)]
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


def read_request(fd):
    """D: the call's frame from the zygote (u32 json_len, u32 blob_len, json,
    blob). EOF before a whole frame: the zygote is gone or shutting down."""
    def exact(n):
        parts = []
        while n > 0:
            b = os.read(fd, min(n, 1 << 20))
            if not b:
                os._exit(0)
            parts.append(b)
            n -= len(b)
        return b"".join(parts)
    jl, bl = struct.unpack("<II", exact(8))
    hdr = json.loads(exact(jl))
    return hdr, (exact(bl) if bl else b"")


def call_child(go_r, pipes, st_w, req=None):
    """D: PID 1 of the call's fresh pid namespace, in its fresh mount
    namespace, cloned by the zygote BEFORE the call arrives (pre-forked: the
    fork, the mounts and the lock-down are off the call's critical path).
    Mounts the scratch dir, /dev/shm and /proc, locks itself down (no
    capabilities, no_new_privs, seccomp), then waits for the call on go_r and
    runs the code (python: here, in this fork of the pristine
    interpreter; others: spawned) and reports each stage's wait status on
    st_w. Fetched files go back on st_w too, after the run."""
    def report(rec):
        raw = json.dumps(rec).encode()
        os.write(st_w, struct.pack("<I", len(raw)) + raw)

    try:
        opts = ("size=%dm,nr_inodes=65536,mode=1777" % SCRATCH_MB).encode()
        check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, opts), "mount(tmpfs, /tmp)")
        check(libc.mount(b"shm", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV,
                         b"size=64m,nr_inodes=4096,mode=1777"), "mount(tmpfs, /dev/shm)")
        libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        os.chdir("/tmp")
        # The call, never the zygote, is the OOM victim. (os.open: the io
        # stack would allocate, and every page the call writes is a COW fault.)
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
        os.write(fd, b"1000")
        os.close(fd)
        lock_down()  # before the call arrives: nothing of the call runs unconfined
        if req is None:
            hdr, blob = read_request(go_r)
            os.close(go_r)
        else:
            hdr, blob = req  # cloned for this call: it is already in our memory
        for path, off, ln in hdr.get("files", []):
            p = scratch_path(path)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(blob[off:off + ln])
        lang = hdr["lang"]
        code = get_ref(blob, hdr["code"])
        env = dict(hdr.get("env", {}))
        if lang in COMPILERS and not os.path.exists(COMPILERS[lang][0]):
            raise FileNotFoundError("%s is not in this image: %s needs a layer with build-essential"
                                    % (COMPILERS[lang][0], lang))
        if lang != "python":
            os.makedirs(SRC_DIR, exist_ok=True)
            with open(SRC_DIR + "/" + ("main.sh" if lang == "bash" else COMPILERS[lang][1]), "wb") as f:
                f.write(code)
        nul = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        if lang in COMPILERS:
            cc, src, flags = COMPILERS[lang]
            argv = [cc, SRC_DIR + "/" + src, "-o", SRC_DIR + "/main"] + flags
            pid = spawn(argv, env, (nul, pipes[3], pipes[4]), True)
            status, timed_out = wait_child(pid, hdr.get("compile_timeout_ms", 10000))
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            report({"stage": "compile", "status": status, "timed_out": timed_out})
            if timed_out or status != 0:
                os._exit(0)
        if lang == "python" and not hdr.get("fetch"):
            os.dup2(st_w, SIGFD, inheritable=False)
            os.close(st_w)
            lock_down_fds(pipes[:3])
            os.closerange(3, SIGFD)
            os.closerange(SIGFD + 1, 65536)
            run_python(code.decode("utf-8", "surrogateescape"), env, pid1=True)
        if lang == "python":
            # Files to fetch: the code runs in a child so that we can read
            # them after it ended (a second fork, only for such calls).
            pid = os.fork()
            if pid == 0:
                os.close(st_w)
                lock_down_fds(pipes[:3])
                os.closerange(3, 65536)
                run_python(code.decode("utf-8", "surrogateescape"), env)
        else:
            argv = ["/bin/bash", SRC_DIR + "/main.sh"] if lang == "bash" else [SRC_DIR + "/main"]
            pid = spawn(argv, env, pipes[:3], False)
        for fd in pipes:
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


def outcome(status, timed_out, t0, out, err):
    if status is None:
        sig, code = signal.SIGKILL, 128 + signal.SIGKILL
    elif os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        code = 128 + sig
    else:
        sig, code = 0, os.WEXITSTATUS(status)
    return {"exit_code": code, "signal": int(sig), "timed_out": timed_out,
            "stdout_total": out[1], "stderr_total": err[1], "duration_ns": time.monotonic_ns() - t0}


def get_ref(blob, ref):
    return blob[ref[0]:ref[0] + ref[1]]


def prepare(req=None):
    """Clones a call process D (fresh mount, pid and ipc namespaces) with its
    pipes. req=None: the next call's, ahead of time (D sets up, then waits
    for the call on its go pipe); req=(hdr, blob): for this call (D has it
    in memory; no go pipe). Returns the zygote's ends: (pid, go_w or -1,
    in_w, out_r, err_r, cout_r, cerr_r, st_r). Raises OSError when the
    clone fails."""
    fds = [os.pipe2(os.O_CLOEXEC) for _ in range(6 if req else 7)]
    if req is None:
        (in_r, in_w), (out_r, out_w), (err_r, err_w), (cout_r, cout_w), (cerr_r, cerr_w), (st_r, st_w), \
            (go_r, go_w) = fds
    else:
        (in_r, in_w), (out_r, out_w), (err_r, err_w), (cout_r, cout_w), (cerr_r, cerr_w), (st_r, st_w) = fds
        go_r = go_w = -1
    ctypes.pythonapi.PyOS_BeforeFork()
    pid = _clone(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | signal.SIGCHLD)
    if pid == 0:
        ctypes.pythonapi.PyOS_AfterFork_Child()
        try:
            for fd in (in_w, out_r, err_r, cout_r, cerr_r, st_r, go_w, SOCK):
                if fd >= 0:
                    os.close(fd)
        finally:
            call_child(go_r, [in_r, out_w, err_w, cout_w, cerr_w], st_w, req)
    err = ctypes.get_errno()
    ctypes.pythonapi.PyOS_AfterFork_Parent()
    for fd in (in_r, out_w, err_w, cout_w, cerr_w, st_w, go_r):
        if fd >= 0:
            os.close(fd)
    if pid < 0:
        for fd in (in_w, out_r, err_r, cout_r, cerr_r, st_r, go_w):
            if fd >= 0:
                os.close(fd)
        raise OSError(err, "clone(CLONE_NEWNS|CLONE_NEWPID|CLONE_NEWIPC): %s" % os.strerror(err))
    return pid, go_w, in_w, out_r, err_r, cout_r, cerr_r, st_r


def serve_call(hdr, raw_hdr, blob, prepared):
    """Zygote side of one call: hand the call to the pre-forked D (or clone
    one now), feed stdin, collect output, enforce the time-out, answer the
    daemon."""
    t0 = time.monotonic_ns()
    cap = hdr.get("cap", 16 << 20)
    lang = hdr.get("lang")
    compiled = lang in COMPILERS
    resp = {"seq": hdr["seq"], "compile": None, "run": None, "files": [], "missing": [], "error": ""}
    blobs = Blobs()
    if prepared is None:
        try:
            prepared = prepare((hdr, blob))
        except OSError as e:
            resp["error"] = str(e)
            send_frame(resp, blobs)
            return
    pid, go_w, in_w, out_r, err_r, cout_r, cerr_r, st_r = prepared
    if go_w >= 0:
        try:
            data = memoryview(struct.pack("<II", len(raw_hdr), len(blob)) + raw_hdr + blob)
            while data:
                n = os.write(go_w, data)
                data = data[n:]
        except OSError:
            pass  # D died during its set-up: its report is on st_r
        os.close(go_w)
    pidfd = os.pidfd_open(pid)
    streams = {out_r: [[], 0, 0], err_r: [[], 0, 0], cout_r: [[], 0, 0], cerr_r: [[], 0, 0], st_r: [[], 0, 0]}
    poller = select.poll()
    for fd in streams:
        poller.register(fd, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    stdin_view = memoryview(get_ref(blob, hdr["stdin"]))
    if stdin_view:
        os.set_blocking(in_w, False)
        poller.register(in_w, select.POLLOUT)
    else:
        os.close(in_w)
        in_w = -1
    run_ms = hdr.get("timeout_ms", 0)
    if compiled:
        # D enforces compile_timeout itself; the run's clock starts when D
        # reports the compile stage (its first status record).
        deadline = t0 + (hdr.get("compile_timeout_ms", 10000) + 5000) * 1_000_000
    else:
        deadline = t0 + run_ms * 1_000_000 if run_ms > 0 else None
    run_clock_started = not compiled
    timed_out = False
    exited = False
    open_pipes = len(streams)
    for _ in range(1 << 30):
        if exited and open_pipes == 0:
            break
        now = time.monotonic_ns()
        if deadline is not None and not timed_out and now >= deadline:
            timed_out = True
            os.kill(pid, signal.SIGKILL)  # PID 1: its whole namespace dies
        wait_ms = -1
        if deadline is not None and not timed_out:
            wait_ms = max(0, (deadline - now) // 1_000_000 + 1)
        for fd, ev in poller.poll(wait_ms):
            if fd == pidfd:
                exited = True
                poller.unregister(pidfd)
            elif fd == in_w:
                try:
                    n = os.write(in_w, stdin_view[:READ_CHUNK])
                    stdin_view = stdin_view[n:]
                except BlockingIOError:
                    continue
                except OSError:
                    stdin_view = stdin_view[:0]
                if not stdin_view:
                    poller.unregister(in_w)
                    os.close(in_w)
                    in_w = -1
            else:
                try:
                    b = os.read(fd, READ_CHUNK)
                except OSError:
                    b = b""
                if not b:
                    poller.unregister(fd)
                    open_pipes -= 1
                    continue
                if fd == st_r and not run_clock_started:
                    run_clock_started = True
                    deadline = time.monotonic_ns() + run_ms * 1_000_000 if run_ms > 0 else None
                st = streams[fd]
                st[2] += len(b)
                room = cap - st[1] if fd != st_r else len(b)
                if room > 0:
                    st[0].append(b[:room])
                    st[1] += min(room, len(b))
    if in_w >= 0:
        os.close(in_w)
    os.close(pidfd)
    _, wstatus = os.waitpid(pid, 0)
    stage = {}
    raw = b"".join(streams[st_r][0])
    while len(raw) >= 4:
        n = struct.unpack("<I", raw[:4])[0]
        rec = json.loads(raw[4:4 + n])
        if rec["stage"] == "file":
            if rec.get("missing"):
                resp["missing"].append(rec["path"])
            else:
                resp["files"].append([rec["path"]] + blobs.add(base64.b64decode(rec["b64"])))
        else:
            stage[rec["stage"]] = rec
        raw = raw[4 + n:]
    for fd in streams:
        os.close(fd)

    def data(fd):
        return b"".join(streams[fd][0]), streams[fd][2]

    if "setup" in stage:
        resp["error"] = stage["setup"]["error"]
    if compiled and ("compile" in stage or timed_out):
        c = stage.get("compile")
        out, err = data(cout_r), data(cerr_r)
        o = outcome(c["status"] if c else None, (c["timed_out"] if c else True), t0, out, err)
        o["stdout"], o["stderr"] = blobs.add(out[0]), blobs.add(err[0])
        resp["compile"] = o
        if not c or c["timed_out"] or c["status"] != 0:
            send_frame(resp, blobs)
            return
    if "setup" not in stage:
        if "run" in stage:
            status = stage["run"]["status"]
        elif lang == "python" and not timed_out:
            status = wstatus  # the code ran as PID 1 itself
            if "signal" in stage and os.WIFEXITED(wstatus) and \
                    os.WEXITSTATUS(wstatus) == 128 + stage["signal"]["sig"]:
                status = stage["signal"]["sig"]  # wait status of "killed by sig"
        else:
            status = None
        out, err = data(out_r), data(err_r)
        o = outcome(status, timed_out, t0, out, err)
        o["stdout"], o["stderr"] = blobs.add(out[0]), blobs.add(err[0])
        resp["run"] = o
    send_frame(resp, blobs)


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


COMPILERS = {"cpp": ("/usr/bin/g++", "main.cpp", ["-O2", "-std=c++17"]),
             "c": ("/usr/bin/gcc", "main.c", ["-O2", "-std=c11", "-lm"])}


def main():
    global SECCOMP
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
    hdr, _, blob = recv_frame()
    if hdr.get("op") != "init":
        os._exit(2)
    global SCRATCH_MB
    SCRATCH_MB = int(hdr.get("scratch_mb", SCRATCH_MB))
    if blob:
        buf = ctypes.create_string_buffer(blob, len(blob))
        SECCOMP = (buf, SockFprog(len(blob) // 8, ctypes.addressof(buf)))
    os.umask(0o022)
    # Everything imported so far is shared copy-on-write with every call:
    # keep the calls' garbage collector off those pages.
    import gc
    gc.collect()
    gc.freeze()
    send_frame({"op": "ready", "pid": os.getpid()})
    prefork = True
    for _ in range(1 << 62):
        # Pre-fork the next call's process while the daemon is busy with the
        # answer to the last one (a fork of the pristine zygote made after
        # the previous call's process and namespaces are gone): the fork and
        # set-up leave the next call's latency. It costs CPU (D must receive
        # the call over a pipe and wait for it), so the daemon turns it off
        # ("prefork": false) when its workers are all busy (throughput mode):
        # then D is cloned when the call arrives, with the call in memory.
        nxt = None
        if prefork:
            try:
                nxt = prepare()
            except OSError:
                nxt = None  # serve_call clones on demand and reports the error
        try:
            hdr, raw, blob = recv_frame()
        except EOFError:
            os._exit(0)
        prefork = bool(hdr.get("prefork", True))
        try:
            serve_call(hdr, raw, blob, nxt)
        except Exception as e:  # noqa: BLE001
            # The call's process may still run: answer, then die (the
            # worker's pid namespace dies with us; the daemon discards it).
            send_frame({"seq": hdr.get("seq"), "error": "zygote: %s: %s" % (type(e).__name__, e),
                        "fatal": True})
            os._exit(3)
        # PID 1 of the worker: reap whatever was orphaned onto us.
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass


main()
