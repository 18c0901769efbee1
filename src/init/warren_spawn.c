// warren-spawn: starts one command (an exec or a background process) inside
// a container sandbox on behalf of warrend. Plan and fds: spawn_plan.h.
//
// Why a program of its own: whatever enters a sandbox's namespaces before
// the command's execve can be seen and signalled (and, were it dumpable,
// traced) by the sandbox's own code. A child cloned from warrend there would
// run on warrend's address space, signal handlers, fds and argv: a signal
// from inside would run the daemon's handlers, a stop signal would hold a
// daemon thread. warrend instead posix_spawns this static program (so the
// daemon thread is released at its execve, before anything of the sandbox is
// touched); it has nothing of the daemon: its own small address space,
// default signal dispositions, only the fds listed in spawn_plan.h, argv
// "warren-spawn", and it is non-dumpable (no ptrace or /proc/<pid>/mem from
// the sandbox, whose root shares its uid once it has switched ids).
//
// Two processes, as setns(CLONE_NEWPID) only moves the caller's children:
//   helper      joins the cgroups, setgroups, setns into the sandbox's
//               namespaces, clones the command as a sibling (CLONE_PARENT:
//               warrend is its parent and waits for it by pidfd), reports
//               its pid, exits. Never visible inside (it stays in the host
//               pid namespace).
//   command     rlimits, ids, capabilities (none at all for a non-root
//               user: empty bounding set, so file capabilities grant nothing
//               either), cwd, session/terminal, fds, no_new_privs, seccomp
//               last, execve over the PATH candidates. The credential steps
//               are the containment plan's executor (jail/plan.c, compiled
//               in), applied to the plan's WarrenJailCreds.
// Every failure is reported to warrend as {step, errno} on fd 4.
//
// Freestanding like warren-init (no libc, raw syscalls, x86_64 and
// aarch64): it runs once per exec, and a static glibc program costs ~0.4 ms
// more to start and fork than this (measured: posix_spawn + exit of a
// static glibc `true` ~580 us, of a freestanding one ~180 us, on the
// project's 2-cpu VMs).
#include <asm/ioctls.h>
#include <linux/capability.h>
#include <linux/close_range.h>
#include <linux/errno.h>
#include <linux/filter.h>
#include <linux/mman.h>
#include <linux/prctl.h>
#include <linux/resource.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/syscall.h>

#include "common/freestanding_start.h"
#include "common/raw_syscall.h"
#include "init/spawn_plan.h"
#include "jail/plan.h"

WARREN_FREESTANDING_START(SpawnMain)

static long Sys(long n, long a, long b, long c, long d, long e) { return warren_raw_syscall6(n, a, b, c, d, e, 0); }

// The compiler may emit calls to these for struct copies and zeroing.
void* memset(void* d, int c, size_t n) {
  unsigned char* p = d;
  while (n--) *p++ = (unsigned char)c;
  return d;
}
void* memcpy(void* d, const void* s, size_t n) {
  unsigned char* p = d;
  const unsigned char* q = s;
  while (n--) *p++ = *q++;
  return d;
}
static size_t Strlen(const char* s) {
  size_t n = 0;
  while (s[n]) ++n;
  return n;
}

__attribute__((noreturn)) static void Exit(int code) {
  for (;;) Sys(__NR_exit_group, code, 0, 0, 0, 0);
}

static void WriteAll(int fd, const void* buf, size_t len) {
  const char* p = buf;
  while (len > 0) {
    long n = Sys(__NR_write, fd, (long)p, (long)len, 0, 0);
    if (n == -EINTR) continue;
    if (n <= 0) return;
    p += n;
    len -= (size_t)n;
  }
}

static void Report(int step, int err) {
  struct WarrenSpawnReport r = {step, err};
  WriteAll(WARREN_SPAWN_FD_REPORT, &r, sizeof r);
}

// `rc` is a raw syscall result (-errno).
__attribute__((noreturn)) static void Fail(int step, long rc) {
  Report(step, (int)(rc < 0 ? -rc : rc));
  Exit(127);
}

struct Plan {
  struct WarrenSpawnHeader* h;
  const char* cwd;
  const char* not_found_msg;
  char* argv[4096 + 1];
  char** envp;
  const char** candidates;
  int32_t* child_pid;  // in the plan's shared first page (spawn_plan.h)
};

// Next NUL-terminated string in [*p, end); NULL if there is none.
static char* NextString(char** p, char* end) {
  for (char* q = *p; q < end; ++q) {
    if (*q == '\0') {
      char* s = *p;
      *p = q + 1;
      return s;
    }
  }
  return NULL;
}

static void* Map(size_t len, int prot, int flags, int fd) {
  long r = warren_raw_syscall6(__NR_mmap, 0, (long)len, prot, flags, fd, 0);
  return r < 0 && r > -4096 ? NULL : (void*)r;
}

// Maps and checks the plan; every length is bounded by the plan's size.
// 0 or -errno.
static long LoadPlan(struct Plan* plan) {
  long rc = Sys(__NR_lseek, WARREN_SPAWN_FD_PLAN, 0, 2 /* SEEK_END */, 0, 0);
  if (rc < 0) return rc;
  if (rc < (long)sizeof(struct WarrenSpawnHeader) || rc > (long)WARREN_SPAWN_MAX_PLAN_BYTES) return -EPROTO;
  const size_t size = (size_t)rc;
  char* base = Map(size, PROT_READ | PROT_WRITE, MAP_PRIVATE, WARREN_SPAWN_FD_PLAN);
  char* shared = Map(sizeof(struct WarrenSpawnHeader), PROT_READ | PROT_WRITE, MAP_SHARED, WARREN_SPAWN_FD_PLAN);
  if (base == NULL || shared == NULL) return -ENOMEM;
  plan->child_pid = &((struct WarrenSpawnHeader*)shared)->child_pid;
  Sys(__NR_close, WARREN_SPAWN_FD_PLAN, 0, 0, 0, 0);
  char* end = base + size;
  struct WarrenSpawnHeader* h = (struct WarrenSpawnHeader*)base;
  if (h->magic != WARREN_SPAWN_MAGIC || h->argc == 0 || h->argc > 4096 || h->creds.n_filters > BPF_MAXINSNS ||
      h->creds.n_rlimits > WARREN_JAIL_MAX_RLIMITS || h->n_cgroup_fds > 16 || h->envc > (1u << 20) ||
      h->n_candidates > (1u << 16))
    return -EPROTO;
  size_t fixed = sizeof *h + (size_t)h->creds.n_filters * sizeof(struct sock_filter);
  if (fixed + h->strings_bytes != size) return -EPROTO;
  plan->h = h;
  h->creds.filter = h->creds.n_filters ? (const struct sock_filter*)(base + sizeof *h) : NULL;
  char* s = base + fixed;
  if ((plan->cwd = NextString(&s, end)) == NULL) return -EPROTO;
  if ((plan->not_found_msg = NextString(&s, end)) == NULL) return -EPROTO;
  for (uint32_t i = 0; i < h->argc; ++i) {
    if ((plan->argv[i] = NextString(&s, end)) == NULL) return -EPROTO;
  }
  plan->argv[h->argc] = NULL;
  size_t ptrs = ((size_t)h->envc + 1 + (size_t)h->n_candidates + 1) * sizeof(char*);
  char** arr = Map(ptrs, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1);
  if (arr == NULL) return -ENOMEM;
  plan->envp = arr;
  for (uint32_t i = 0; i < h->envc; ++i) {
    if ((arr[i] = NextString(&s, end)) == NULL) return -EPROTO;
  }
  arr[h->envc] = NULL;
  plan->candidates = (const char**)(arr + h->envc + 1);
  for (uint32_t i = 0; i < h->n_candidates; ++i) {
    if ((plan->candidates[i] = NextString(&s, end)) == NULL) return -EPROTO;
  }
  plan->candidates[h->n_candidates] = NULL;
  return s == end ? 0 : -EPROTO;
}

static const char* ErrnoText(int e) {
  switch (e) {
    case EACCES: return "Permission denied";
    case EPERM: return "Operation not permitted";
    case ENOEXEC: return "Exec format error";
    case ETXTBSY: return "Text file busy";
    case ENOMEM: return "Cannot allocate memory";
    case E2BIG: return "Argument list too long";
    case ELOOP: return "Too many levels of symbolic links";
    case ENAMETOOLONG: return "File name too long";
    case EISDIR: return "Is a directory";
    case EINVAL: return "Invalid argument";
    case EIO: return "Input/output error";
    case ELIBBAD: return "Accessing a corrupted shared library";
    default: return "cannot execute";
  }
}

static long Dup2(int from, int to) { return Sys(__NR_dup3, from, to, 0, 0, 0); }

__attribute__((noreturn)) static void Command(const struct Plan* p) {
  const struct WarrenSpawnHeader* h = p->h;
  Sys(__NR_prctl, PR_SET_DUMPABLE, 0, 0, 0, 0);  // the mm is a copy: keep it private too
  // rlimits, then ids and capabilities (the plan's executor checks that the
  // process holds exactly the plan's sets afterwards: a non-root command
  // none at all, its bounding set empty).
  int step = 0;
  long rc = warren_jail_rlimits(&h->creds, &step);
  if (rc == 0) rc = warren_jail_identity(&h->creds, &step);
  if (rc != 0) Fail(WARREN_SPAWN_STEP_JAIL0 + step, rc);
  if ((rc = Sys(__NR_chdir, (long)p->cwd, 0, 0, 0, 0)) != 0) Fail(WARREN_SPAWN_STEP_CHDIR, rc);
  if (h->flags & WARREN_SPAWN_SETSID) {
    if ((rc = Sys(__NR_setsid, 0, 0, 0, 0, 0)) < 0) Fail(WARREN_SPAWN_STEP_SESSION, rc);
    if ((h->flags & WARREN_SPAWN_TTY) && (rc = Sys(__NR_ioctl, 0, TIOCSCTTY, 0, 0, 0)) != 0)
      Fail(WARREN_SPAWN_STEP_SESSION, rc);
  }
  // fd 3 of the command: the control pipe or nothing; the report pipe (4)
  // closes at execve, which is how warrend learns the command runs.
  if (h->flags & WARREN_SPAWN_CONTROL) {
    if ((rc = Dup2(WARREN_SPAWN_FD_CONTROL, 3)) < 0) Fail(WARREN_SPAWN_STEP_FDS, rc);
  } else {
    Sys(__NR_close, 3, 0, 0, 0, 0);
  }
  if ((rc = Sys(__NR_close_range, 4, ~0U, CLOSE_RANGE_CLOEXEC, 0, 0)) != 0) Fail(WARREN_SPAWN_STEP_FDS, rc);
  Sys(__NR_umask, 022, 0, 0, 0, 0);
  // no_new_privs, seccomp last.
  if ((rc = warren_jail_seal(&h->creds, &step)) != 0) Fail(WARREN_SPAWN_STEP_JAIL0 + step, rc);
  long last = -ENOENT;
  for (const char* const* c = p->candidates; *c != NULL; ++c) {
    rc = Sys(__NR_execve, (long)*c, (long)p->argv, (long)p->envp, 0, 0);
    if (rc != -ENOENT && rc != -ENOTDIR) last = rc;
  }
  // Like a shell: "not found" -> 127, found but not executable -> 126
  // (with the reason: EACCES, ENOEXEC, or EPERM for file capabilities that
  // cannot be granted).
  if (last == -ENOENT) {
    WriteAll(2, p->not_found_msg, Strlen(p->not_found_msg));
    Exit(127);
  }
  const char* parts[] = {"warren: ", p->argv[0], ": ", ErrnoText((int)-last), "\n"};
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; ++i) WriteAll(2, parts[i], Strlen(parts[i]));
  Exit(126);
}

static struct Plan g_plan;

__attribute__((noreturn, used)) void SpawnMain(long* sp) {
  (void)sp;
  Sys(__NR_prctl, PR_SET_DUMPABLE, 0, 0, 0, 0);
  // The parent's death (warrend killed) ends a helper still on its way in.
  Sys(__NR_prctl, PR_SET_PDEATHSIG, 9 /* SIGKILL */, 0, 0, 0);
  struct Plan* plan = &g_plan;
  long rc = LoadPlan(plan);
  if (rc != 0) Fail(WARREN_SPAWN_STEP_PLAN, rc);
  const struct WarrenSpawnHeader* h = plan->h;
  for (uint32_t i = 0; i < h->n_cgroup_fds; ++i) {
    const int fd = WARREN_SPAWN_FD_CGROUP0 + (int)i;
    if ((rc = Sys(__NR_write, fd, (long)"0", 1, 0, 0)) != 1) Fail(WARREN_SPAWN_STEP_CGROUP, rc < 0 ? rc : -EIO);
    Sys(__NR_close, fd, 0, 0, 0, 0);
  }
  int step = 0;
  if ((rc = warren_jail_qos_oom_score(&h->creds, &step)) != 0) Fail(WARREN_SPAWN_STEP_JAIL0 + step, rc);
  if ((rc = Sys(__NR_setgroups, 0, 0, 0, 0, 0)) != 0) Fail(WARREN_SPAWN_STEP_SETGROUPS, rc);
  if ((rc = Sys(__NR_setns, WARREN_SPAWN_FD_INIT, h->ns_flags, 0, 0, 0)) != 0) Fail(WARREN_SPAWN_STEP_SETNS, rc);
  Sys(__NR_close, WARREN_SPAWN_FD_INIT, 0, 0, 0, 0);
  // CLONE_PARENT: the command is warrend's child (its exit signal is ours,
  // SIGCHLD); it is pid 2+ of the sandbox's pid namespace.
  // CLONE_PARENT_SETTID: its pid lands in the plan's shared first page
  // before clone returns (spawn_plan.h, child_pid); parent_tid is the third
  // argument on x86_64 and aarch64 alike. No CLONE_VM: the child continues
  // on a copy of this (small) address space, like fork.
  long pid = Sys(__NR_clone, CLONE_PARENT | CLONE_PARENT_SETTID, 0, (long)plan->child_pid, 0, 0);
  if (pid == 0) Command(plan);
  if (pid < 0) Fail(WARREN_SPAWN_STEP_FORK, pid);
  Report(WARREN_SPAWN_STEP_STARTED, (int)pid);
  Exit(0);
}
