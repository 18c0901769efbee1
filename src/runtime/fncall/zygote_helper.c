// The fncall zygote's per-call loop, in C (fncall.h, zygote.py). warrend
// builds this file as a freestanding shared object (raw system calls, no
// libc, no relocation against anything outside itself), embeds it, and hands
// it to every worker as a memfd on fd 4; the python zygote loads it with
// ctypes.PyDLL (GIL held) and calls warren_fncall_loop once, after its
// imports. From then on the zygote runs no python bytecode at all: per call
// it only clones the next call process, passes its pidfd to warrend and
// reports its wait status. Every page the zygote writes after a fork is a
// copy-on-write fault, and faults are expensive on this VM: the python loop
// this replaces touched ~185 pages per call.
//
// Protocol on the worker channel (fd 3, SOCK_SEQPACKET: one message per send):
//   zygote -> warrend  'S' spawned: struct ZygoteMsg + SCM_RIGHTS [pidfd of D]
//   zygote -> warrend  'X' exited:  struct ZygoteMsg (si_code, si_status of D)
//   zygote -> warrend  'F' clone failed: struct ZygoteMsg (err); the loop returns
//   D      -> warrend  'E' set-up failed: struct ZygoteMsg + text; D exits 127
//   warrend -> D       the call: struct CallHead, json, blob (inline; a
//                      kCallPlainPython call has no json and blob = code) +
//                      SCM_RIGHTS [stdin_r, stdout_w, stderr_w, status_w
//                      (, compile stdout_w, compile stderr_w)] (, memfd
//                      holding json+blob when kCallInMemfd)
// Only D reads the channel (the zygote only writes to it), and at most one D
// exists at a time, so the call reaches the pre-forked D directly.
//
// D (the call process) is cloned into fresh mount, pid and ipc namespaces.
// Before it reads its call it runs PyOS_AfterFork_Child, applies the call's
// containment plan (jail/plan.h, built by warrend: worker_jail.cc CallJailPlan)
// with the one executor every spawn path uses: a fresh tmpfs on /tmp (its
// cwd) and /dev/shm, a fresh /proc with the masks of every sandbox, then
// RLIMIT_CORE 0, no capabilities, no_new_privs, the seccomp filter (after
// making itself the OOM victim); then it receives the call, moves the
// pipe ends to fds 0, 1, 2 and 1023 (status, close-on-exec) (and 1021, 1022:
// the compile stage's stdout and stderr, close-on-exec), closes the channel
// and returns to python, which runs the call (zygote.py: call_child).
#include <asm/unistd.h>
#include <linux/capability.h>
#include <linux/fcntl.h>
#include <linux/filter.h>
#include <linux/mman.h>
#include <linux/mount.h>
#include <linux/prctl.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <linux/wait.h>
#include "common/raw_syscall.h"
#include "jail/plan.h"

#define EXPORT __attribute__((visibility("default")))
#define NOINLINE __attribute__((noinline))

typedef unsigned int u32;
typedef unsigned long ulong;

// ------------------------------------------------------------------ syscalls
#ifndef WARREN_HAVE_RAW_SYSCALL
#error "zygote_helper.c: x86_64 or aarch64 only"
#endif
#define SYS(n, a, b, c, d, e, f) \
  warren_raw_syscall6(__NR_##n, (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), (long)(f))

// The compiler may emit calls to these for struct copies and zeroing.
void* memset(void* d, int c, ulong n) {
  volatile unsigned char* p = d;
  for (ulong i = 0; i < n; ++i) p[i] = (unsigned char)c;
  return d;
}
void* memcpy(void* d, const void* s, ulong n) {
  volatile unsigned char* p = d;
  const unsigned char* q = s;
  for (ulong i = 0; i < n; ++i) p[i] = q[i];
  return d;
}

// ------------------------------------------------------------------ sockets (LP64 kernel ABI)
struct iov {
  const void* base;
  ulong len;
};
struct msghdr_ {
  void* name;
  int namelen;
  struct iov* iov;
  ulong iovlen;
  void* control;
  ulong controllen;
  int flags;
};
struct cmsghdr_ {
  ulong len;
  int level;
  int type;
};
#define SOL_SOCKET_ 1
#define SCM_RIGHTS_ 1
#define MSG_NOSIGNAL_ 0x4000
#define MSG_CTRUNC_ 0x8
#define MAX_FDS 8
#define CMSG_SPACE_FDS (sizeof(struct cmsghdr_) + MAX_FDS * sizeof(int))

// The messages (fncall_internal.h mirrors these).
struct ZygoteMsg {
  u32 kind;  // 'S', 'X', 'F', 'E'
  u32 serial;
  int a;  // 'X': si_code; 'F', 'E': errno
  int b;  // 'X': si_status; 'E': failed step
};
struct CallHead {
  u32 magic;  // kCallMagic
  u32 flags;  // kCallInMemfd, kCallPlainPython
  u32 nfds;
  u32 json_len;
  u32 blob_len;
};
#define kCallMagic 0x434e4657u  // "WFNC"
#define kCallInMemfd 1u
#define kCallPlainPython 2u  // python with the default env, no files, nothing to fetch: json is empty, blob = code

static long send_msg(int sock, const void* data, ulong len, int fd) {
  struct iov v = {data, len};
  union {
    struct cmsghdr_ h;
    char buf[CMSG_SPACE_FDS];
  } c;
  struct msghdr_ m = {0, 0, &v, 1, 0, 0, 0};
  if (fd >= 0) {
    c.h.len = sizeof(struct cmsghdr_) + sizeof(int);
    c.h.level = SOL_SOCKET_;
    c.h.type = SCM_RIGHTS_;
    *(int*)(c.buf + sizeof(struct cmsghdr_)) = fd;
    m.control = c.buf;
    m.controllen = sizeof(struct cmsghdr_) + 8;  // CMSG_SPACE(sizeof(int)) on LP64
  }
  long r;
  do r = SYS(sendmsg, sock, &m, MSG_NOSIGNAL_, 0, 0, 0);
  while (r == -4);  // EINTR
  return r;
}

// ------------------------------------------------------------------ the call process
struct warren_loop_args {
  void (*after_fork_child)(void);  // called first in D if set (e.g. PyOS_AfterFork_Child)
  struct WarrenJailPlan* plan;     // the call's containment plan + its seccomp program, as sent by warrend
  ulong plan_len;                  // bytes at plan
  long sock;                       // the worker channel (3)
  // Filled with fresh random bytes in D before the call runs (0: none): the
  // Mersenne Twister state of python's random module (zygote.py).
  void* reseed;
  ulong reseed_len;
  int* reseed_index;  // set to reseed_index_value after the fill
  long reseed_index_value;
};
struct warren_call_in {  // filled in D for python
  const char* json;
  ulong json_len;
  const char* blob;
  ulong blob_len;
  long nfds;   // 4, or 6 with the compile stage's pipes
  long flags;  // CallHead.flags
};

// channel.cc mirrors these; from kJailStep0 on, the plan's steps (plan.h), offset.
enum { kStepChdir = 1, kStepOom, kStepRecv, kStepBadCall, kStepMap, kStepFds, kStepReseed };
#define kJailStep0 1000

// Space for an inline call (warrend sends bigger ones in a memfd). In .bss:
// never touched by the zygote, so a call faults in only what it receives.
// Exported: zygote.py slices a plain python call's code out of it (cheaper
// than ctypes.string_at: no foreign call).
#define kInlineMax (64u << 10)
EXPORT char g_call[kInlineMax + sizeof(struct CallHead)];  // zygote.py reads plain python code here

static unsigned long long rotl64(unsigned long long v, int k) { return (v << k) | (v >> (64 - k)); }

static __attribute__((noreturn)) void child_fail(int sock, u32 serial, int step, long err) {
  struct ZygoteMsg m = {'E', serial, (int)-err, step};
  send_msg(sock, &m, sizeof m, -1);
  for (;;) SYS(exit_group, 127, 0, 0, 0, 0, 0);
}

static int move_fd(int from, int to, int cloexec) {
  if (from == to) return 0;
  long r = SYS(dup3, from, to, cloexec ? O_CLOEXEC : 0, 0, 0, 0);
  if (r < 0) return (int)r;
  SYS(close, from, 0, 0, 0, 0, 0);
  return 0;
}

// The plan's fd slots (worker_jail.cc kCallMaskSlot: 0). Slot 0: an empty
// read-only tmpfs, detached, made once by the zygote; each call's masked
// dirs show clones of it (plan.h WARREN_JAIL_CLONE_FD). -1 if it could not
// be made: each call then makes its own.
static int g_fds[WARREN_JAIL_MAX_FD_SLOTS] = {-1, -1, -1, -1, -1};

static void make_mask_tmpfs(void) {
  long fs = SYS(fsopen, "tmpfs", FSOPEN_CLOEXEC, 0, 0, 0, 0);
  if (fs < 0) return;
  long m = -1;
  if (SYS(fsconfig, fs, FSCONFIG_SET_STRING, "size", "0", 0, 0) == 0 &&
      SYS(fsconfig, fs, FSCONFIG_SET_STRING, "mode", "555", 0, 0) == 0 &&
      SYS(fsconfig, fs, FSCONFIG_CMD_CREATE, 0, 0, 0, 0) == 0) {
    m = SYS(fsmount, fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
            0, 0, 0);
  }
  SYS(close, fs, 0, 0, 0, 0, 0);
  if (m >= 0) g_fds[0] = (int)m;
}

static NOINLINE int call_setup(const struct warren_loop_args* a, u32 serial, struct warren_call_in* out) {
  const int s = (int)a->sock;
  if (a->after_fork_child != 0) a->after_fork_child();
  int step = 0;
  long r = warren_jail_mount(a->plan, g_fds, &step);
  if (r < 0) child_fail(s, serial, kJailStep0 + step, r);
  r = SYS(chdir, "/tmp", 0, 0, 0, 0, 0);
  if (r < 0) child_fail(s, serial, kStepChdir, r);
  // The call, never the zygote, is the OOM victim.
  r = SYS(openat, AT_FDCWD, "/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC, 0, 0, 0);
  if (r < 0) child_fail(s, serial, kStepOom, r);
  (void)SYS(write, r, "1000", 4, 0, 0, 0);
  SYS(close, r, 0, 0, 0, 0, 0);
  r = warren_jail_lockdown(&a->plan->creds, &step);
  if (r < 0) child_fail(s, serial, kJailStep0 + step, r);
  if (a->reseed != 0) {
    // 256 bits from the kernel, stretched with xoshiro256** over the state
    // (getrandom of the whole 2.5 KB state cost ~1.5 % of a call here).
    unsigned long long x[4] = {0, 0, 0, 0};
    for (ulong off = 0; off < sizeof x;) {
      r = SYS(getrandom, (char*)x + off, sizeof x - off, 0, 0, 0, 0);
      if (r == -4) continue;
      if (r <= 0) child_fail(s, serial, kStepReseed, r);
      off += (ulong)r;
    }
    if ((x[0] | x[1] | x[2] | x[3]) == 0) x[0] = 1;
    unsigned char* p = a->reseed;
    for (ulong off = 0; off < a->reseed_len; off += 8) {
      unsigned long long v = rotl64(x[1] * 5, 7) * 9, t = x[1] << 17;
      x[2] ^= x[0];
      x[3] ^= x[1];
      x[1] ^= x[2];
      x[0] ^= x[3];
      x[2] ^= t;
      x[3] = rotl64(x[3], 45);
      for (ulong k = 0; k < 8 && off + k < a->reseed_len; ++k) p[off + k] = (unsigned char)(v >> (8 * k));
    }
    *a->reseed_index = (int)a->reseed_index_value;
  }
  // Nothing of the call runs unconfined: it arrives only now.
  struct iov v = {g_call, sizeof g_call};
  union {
    struct cmsghdr_ h;
    char buf[CMSG_SPACE_FDS];
  } c;
  struct msghdr_ m = {0, 0, &v, 1, c.buf, sizeof c.buf, 0};
  do r = SYS(recvmsg, s, &m, 0, 0, 0, 0);
  while (r == -4);
  if (r == 0) SYS(exit_group, 0, 0, 0, 0, 0, 0);  // warrend closed the channel
  if (r < 0) child_fail(s, serial, kStepRecv, r);
  const struct CallHead* h = (const struct CallHead*)g_call;
  int nfds = 0;
  int fds[MAX_FDS];
  if (m.controllen >= sizeof(struct cmsghdr_) && c.h.level == SOL_SOCKET_ && c.h.type == SCM_RIGHTS_) {
    nfds = (int)((c.h.len - sizeof(struct cmsghdr_)) / sizeof(int));
    for (int i = 0; i < nfds && i < MAX_FDS; ++i) fds[i] = ((int*)(c.buf + sizeof(struct cmsghdr_)))[i];
  }
  const int memfd = (h->flags & kCallInMemfd) != 0;
  if ((ulong)r < sizeof *h || h->magic != kCallMagic || (m.flags & MSG_CTRUNC_) != 0 ||
      (h->nfds != 4 && h->nfds != 6) || (int)h->nfds + memfd != nfds ||
      (!memfd && (ulong)r != sizeof *h + h->json_len + h->blob_len))
    child_fail(s, serial, kStepBadCall, -22);
  if (memfd) {
    const ulong len = (ulong)h->json_len + h->blob_len;
    long p = SYS(mmap, 0, len ? len : 1, PROT_READ, MAP_PRIVATE, fds[nfds - 1], 0);
    if (p < 0 && p > -4096) child_fail(s, serial, kStepMap, p);
    SYS(close, fds[nfds - 1], 0, 0, 0, 0, 0);
    out->json = (const char*)p;
  } else {
    out->json = g_call + sizeof *h;
  }
  out->json_len = h->json_len;
  out->blob = out->json + h->json_len;
  out->blob_len = h->blob_len;
  out->nfds = h->nfds;
  out->flags = h->flags;
  // Received fds are >= 4 (0-3 are open), so these moves cannot collide.
  if (move_fd(fds[0], 0, 0) < 0 || move_fd(fds[1], 1, 0) < 0 || move_fd(fds[2], 2, 0) < 0 ||
      move_fd(fds[3], 1023, 1) < 0)
    child_fail(s, serial, kStepFds, -9);
  if (h->nfds == 6 && (move_fd(fds[4], 1021, 1) < 0 || move_fd(fds[5], 1022, 1) < 0))
    child_fail(s, serial, kStepFds, -9);
  SYS(close, s, 0, 0, 0, 0, 0);
  // Nothing else of the zygote's stays open in the call (the channel
  // included): 0-2, 1021-1023 only.
  SYS(close_range, 3, 1020, 0, 0, 0, 0);
  SYS(close_range, 1024, ~0u, 0, 0, 0, 0);
  return 0;
}

// ------------------------------------------------------------------ the zygote
// Returns 0 in a call process (D), set up and with its call in *out; in the
// zygote it loops until warrend closes the channel (returns 0 after exiting:
// never) or a clone fails (returns -errno after telling warrend).
EXPORT long warren_fncall_loop(const struct warren_loop_args* a, struct warren_call_in* out) {
  const int s = (int)a->sock;
  if (warren_jail_plan_attach_filter(a->plan, a->plan_len) != 0) {
    struct ZygoteMsg f = {'F', 0, 71 /* EPROTO: a malformed plan */, 0};
    send_msg(s, &f, sizeof f, -1);
    return -71;
  }
  make_mask_tmpfs();
  for (u32 serial = 1;; ++serial) {
    // PID 1 of the worker: reap anything orphaned onto us (nothing should be:
    // a call's processes die with its pid namespace).
    for (int i = 0; i < 64; ++i) {
      if (SYS(wait4, -1, 0, WNOHANG, 0, 0, 0) <= 0) break;
    }
    int pidfd = -1;
    struct clone_args ca;
    memset(&ca, 0, sizeof ca);
    ca.flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_PIDFD;
    ca.pidfd = (ulong)&pidfd;
    ca.exit_signal = 17;  // SIGCHLD
    long pid = SYS(clone3, &ca, sizeof ca, 0, 0, 0, 0);
    if (pid == 0) return call_setup(a, serial, out);
    if (pid < 0) {
      struct ZygoteMsg f = {'F', serial, (int)-pid, 0};
      send_msg(s, &f, sizeof f, -1);
      return pid;
    }
    struct ZygoteMsg m = {'S', serial, (int)pid, 0};
    if (send_msg(s, &m, sizeof m, pidfd) < 0) {
      SYS(kill, pid, 9, 0, 0, 0, 0);  // warrend is gone
      SYS(exit_group, 0, 0, 0, 0, 0, 0);
    }
    // siginfo_t (LP64): si_signo, si_errno, si_code, pad, then si_pid,
    // si_uid, si_status for SIGCHLD; 128 bytes.
    int info[32];
    long r;
    for (int i = 0;; ++i) {
      memset(info, 0, sizeof info);
      r = SYS(waitid, P_PIDFD, pidfd, info, WEXITED, 0, 0);
      if (r != -4 || i > (1 << 20)) break;  // EINTR: a signal to us, retry
    }
    SYS(close, pidfd, 0, 0, 0, 0, 0);
    struct ZygoteMsg x = {'X', serial, r < 0 ? -1 : info[2], r < 0 ? (int)-r : info[6]};
    if (send_msg(s, &x, sizeof x, -1) < 0) SYS(exit_group, 0, 0, 0, 0, 0, 0);
  }
}
