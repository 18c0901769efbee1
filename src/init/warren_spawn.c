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
//   command     ids, capabilities (none at all for a non-root user: empty
//               bounding set, so file capabilities grant nothing either),
//               cwd, session/terminal, rlimits, no_new_privs, fds, seccomp
//               last, execve over the PATH candidates.
// Every failure is reported to warrend as {step, errno} on fd 4.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "init/spawn_plan.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

static void Report(int step, int err) {
  struct WarrenSpawnReport r = {step, err};
  const char* p = (const char*)&r;
  size_t left = sizeof r;
  while (left > 0) {
    ssize_t n = write(WARREN_SPAWN_FD_REPORT, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    left -= (size_t)n;
  }
}

__attribute__((noreturn)) static void Fail(int step, int err) {
  Report(step, err);
  _exit(127);
}

struct Plan {
  const struct WarrenSpawnHeader* h;
  const struct WarrenSpawnRlimit* rlimits;
  const struct sock_filter* filters;
  const char* cwd;
  const char* not_found_msg;
  char* argv[4096 + 1];
  char** envp;
  const char** candidates;
};

// Next NUL-terminated string in [*p, end); NULL if there is none.
static char* NextString(char** p, char* end) {
  char* s = *p;
  char* nul = memchr(s, '\0', (size_t)(end - s));
  if (nul == NULL) return NULL;
  *p = nul + 1;
  return s;
}

// Maps and checks the plan; every length is bounded by the plan's size.
static int LoadPlan(struct Plan* plan) {
  struct stat st;
  if (fstat(WARREN_SPAWN_FD_PLAN, &st) != 0) return -errno;
  if (st.st_size < (off_t)sizeof(struct WarrenSpawnHeader) || st.st_size > (off_t)WARREN_SPAWN_MAX_PLAN_BYTES)
    return -EPROTO;
  const size_t size = (size_t)st.st_size;
  char* base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, WARREN_SPAWN_FD_PLAN, 0);
  if (base == MAP_FAILED) return -errno;
  close(WARREN_SPAWN_FD_PLAN);
  char* end = base + size;
  const struct WarrenSpawnHeader* h = (const struct WarrenSpawnHeader*)base;
  if (h->magic != WARREN_SPAWN_MAGIC || h->argc == 0 || h->argc > 4096 || h->n_filters > BPF_MAXINSNS ||
      h->n_rlimits > 64 || h->n_cgroup_fds > 16 || h->envc > (1u << 20) || h->n_candidates > (1u << 16))
    return -EPROTO;
  size_t fixed = sizeof *h + (size_t)h->n_rlimits * sizeof(struct WarrenSpawnRlimit) +
                 (size_t)h->n_filters * sizeof(struct sock_filter);
  if (fixed + h->strings_bytes != size) return -EPROTO;
  plan->h = h;
  plan->rlimits = (const struct WarrenSpawnRlimit*)(base + sizeof *h);
  plan->filters = (const struct sock_filter*)(base + sizeof *h + (size_t)h->n_rlimits * sizeof(struct WarrenSpawnRlimit));
  char* s = base + fixed;
  if ((plan->cwd = NextString(&s, end)) == NULL) return -EPROTO;
  if ((plan->not_found_msg = NextString(&s, end)) == NULL) return -EPROTO;
  for (uint32_t i = 0; i < h->argc; ++i) {
    if ((plan->argv[i] = NextString(&s, end)) == NULL) return -EPROTO;
  }
  plan->argv[h->argc] = NULL;
  // envp and candidates live in the plan's own (private, writable) mapping
  // tail: pointers go into a second mapping sized for them.
  size_t ptrs = ((size_t)h->envc + 1 + (size_t)h->n_candidates + 1) * sizeof(char*);
  char** arr = mmap(NULL, ptrs, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (arr == MAP_FAILED) return -errno;
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

// Drops every capability not in `bounding` from the bounding set (needs
// CAP_SETPCAP: before the uid change), clears ambient and inheritable, sets
// permitted = effective = `keep`.
static int DropCapabilities(uint64_t bounding, uint64_t keep, int last_cap) {
  for (int c = 0; c <= last_cap && c < 64; ++c) {
    if (bounding & ((uint64_t)1 << c)) continue;
    if (prctl(PR_CAPBSET_READ, c, 0, 0, 0) == 0) continue;  // gone already (no CAP_SETPCAP needed)
    if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) != 0 && errno != EINVAL) return -errno;
  }
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL) return -errno;
  struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  memset(data, 0, sizeof data);
  data[0].effective = data[0].permitted = (uint32_t)keep;
  data[1].effective = data[1].permitted = (uint32_t)(keep >> 32);
  if (syscall(SYS_capset, &hdr, data) != 0) return -errno;
  return 0;
}

// True if the calling process holds no capability in any set.
static int HoldsNoCapability(void) {
  struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  memset(data, 0, sizeof data);
  if (syscall(SYS_capget, &hdr, data) != 0) return 0;
  for (int i = 0; i < 2; ++i) {
    if (data[i].effective | data[i].permitted | data[i].inheritable) return 0;
  }
  for (int c = 0; c < 64; ++c) {
    int r = prctl(PR_CAPBSET_READ, c, 0, 0, 0);
    if (r > 0) return 0;
    if (r < 0) break;  // EINVAL past the kernel's last capability
  }
  return 1;
}

static void WriteAll2(const char* m) {
  size_t left = strlen(m);
  while (left > 0) {
    ssize_t n = write(2, m, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    m += n;
    left -= (size_t)n;
  }
}

__attribute__((noreturn)) static void Command(const struct Plan* p) {
  const struct WarrenSpawnHeader* h = p->h;
  (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);  // the mm is a copy: keep it private too
  // Raw id syscalls: glibc's wrappers would be fine in this single-threaded
  // program, the raw ones say exactly what happens.
  if (syscall(SYS_setresgid, h->gid, h->gid, h->gid) != 0) Fail(WARREN_SPAWN_STEP_SETID, errno);
  // A non-root command: empty bounding set, so no file capability can
  // grant it anything at execve (no_new_privs alone would cap it at the
  // permitted set it had, and that set is emptied by the uid change).
  const uint64_t bounding = h->uid == 0 ? h->caps : 0;
  if (DropCapabilities(bounding, h->caps, h->last_cap) != 0) Fail(WARREN_SPAWN_STEP_CAPS, errno);
  if (syscall(SYS_setresuid, h->uid, h->uid, h->uid) != 0) Fail(WARREN_SPAWN_STEP_SETID, errno);
  // The uid change does NOT clear permitted and effective here: the kernel
  // clears them only on a change away from the namespace's root, and this
  // process entered the namespace as host root (unmapped inside). So a
  // non-root command drops them itself, and it is checked.
  if (h->uid != 0) {
    if (DropCapabilities(0, 0, h->last_cap) != 0) Fail(WARREN_SPAWN_STEP_CAPS, errno);
    if (!HoldsNoCapability()) Fail(WARREN_SPAWN_STEP_CAPS, EPERM);
  }
  if (chdir(p->cwd) != 0) Fail(WARREN_SPAWN_STEP_CHDIR, errno);
  if (h->flags & WARREN_SPAWN_SETSID) {
    if (setsid() < 0) Fail(WARREN_SPAWN_STEP_SESSION, errno);
    if ((h->flags & WARREN_SPAWN_TTY) && ioctl(0, TIOCSCTTY, 0) != 0) Fail(WARREN_SPAWN_STEP_SESSION, errno);
  }
  for (uint32_t i = 0; i < h->n_rlimits; ++i) {
    struct rlimit rl = {(rlim_t)p->rlimits[i].cur, (rlim_t)p->rlimits[i].max};
    if (setrlimit((__rlimit_resource_t)p->rlimits[i].resource, &rl) != 0) Fail(WARREN_SPAWN_STEP_RLIMITS, errno);
  }
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) Fail(WARREN_SPAWN_STEP_NO_NEW_PRIVS, errno);
  // fd 3 of the command: the control pipe or nothing; the report pipe (4)
  // closes at execve, which is how warrend learns the command runs.
  if (h->flags & WARREN_SPAWN_CONTROL) {
    if (dup2(WARREN_SPAWN_FD_CONTROL, 3) < 0) Fail(WARREN_SPAWN_STEP_FDS, errno);
  } else {
    (void)close(3);
  }
  if (syscall(SYS_close_range, 4, ~0U, CLOSE_RANGE_CLOEXEC) != 0) Fail(WARREN_SPAWN_STEP_FDS, errno);
  umask(022);
  if (h->n_filters > 0) {
    struct sock_fprog prog = {(unsigned short)h->n_filters, (struct sock_filter*)p->filters};
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0) Fail(WARREN_SPAWN_STEP_SECCOMP, errno);
  }
  int last = ENOENT;
  for (const char* const* c = p->candidates; *c != NULL; ++c) {
    execve(*c, p->argv, p->envp);
    if (errno != ENOENT && errno != ENOTDIR) last = errno;
  }
  // Like a shell: "not found" -> 127, found but not executable -> 126
  // (with the reason: EACCES, ENOEXEC, or EPERM for file capabilities that
  // cannot be granted).
  if (last == ENOENT) {
    WriteAll2(p->not_found_msg);
    _exit(127);
  }
  WriteAll2("warren: ");
  WriteAll2(p->argv[0]);
  WriteAll2(": ");
  WriteAll2(strerror(last));
  WriteAll2("\n");
  _exit(126);
}

int main(void) {
  (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  // The parent's death (warrend killed) ends a helper still on its way in.
  (void)prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  static struct Plan plan;
  int rc = LoadPlan(&plan);
  if (rc != 0) Fail(WARREN_SPAWN_STEP_PLAN, -rc);
  const struct WarrenSpawnHeader* h = plan.h;
  for (uint32_t i = 0; i < h->n_cgroup_fds; ++i) {
    const int fd = WARREN_SPAWN_FD_CGROUP0 + (int)i;
    if (write(fd, "0", 1) != 1) Fail(WARREN_SPAWN_STEP_CGROUP, errno);
    close(fd);
  }
  if (syscall(SYS_setgroups, 0, NULL) != 0) Fail(WARREN_SPAWN_STEP_SETGROUPS, errno);
  if (setns(WARREN_SPAWN_FD_INIT, (int)h->ns_flags) != 0) Fail(WARREN_SPAWN_STEP_SETNS, errno);
  close(WARREN_SPAWN_FD_INIT);
  // CLONE_PARENT: the command is warrend's child (its exit signal is ours,
  // SIGCHLD); it is pid 2+ of the sandbox's pid namespace.
  long pid = syscall(SYS_clone, CLONE_PARENT, 0, 0, 0, 0);
  if (pid == 0) Command(&plan);
  if (pid < 0) Fail(WARREN_SPAWN_STEP_FORK, errno);
  Report(WARREN_SPAWN_STEP_STARTED, (int)pid);
  _exit(0);
}
