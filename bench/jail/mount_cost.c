// CPU per fncall-style call process for each part of the masked /proc:
// clone into fresh mount, ipc and pid namespaces (inside a user and mount
// namespace of this process), mount a fresh /proc, add one kind of mask,
// exit, reap. CPU of the process and its reaped children (user + system),
// per iteration, for each variant in turn, `reps` times interleaved.
//   gcc -O2 -o /tmp/mount_cost bench/jail/mount_cost.c && /tmp/mount_cost 500 3
// Variants: 0 proc only; 1 + the 7 masked files of this kernel (/dev/null
// binds); 2 + the 4 read-only dirs (bind + read-only remount each); 3 + a
// masked dir as a fresh tmpfs (a superblock per call) and a bind of it;
// 4 + the same masked dir as a clone of one detached tmpfs (open_tree
// OPEN_TREE_CLONE + move_mount) and a bind; 5 + 7 binds of a plain proc file
// (what the lxcfs views cost, without FUSE). Needs root (or unprivileged
// user namespaces).
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/mount.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static const char* kFiles[] = {"keys",       "kpagecount", "kpageflags", "kpagecgroup",
                               "timer_list", "kallsyms",   "vmallocinfo"};
static const char* kReadOnly[] = {"sys", "bus", "fs", "irq"};
static const char* kNames[] = {"proc only",
                               "+7 masked files",
                               "+4 read-only dirs",
                               "+masked dir, fresh tmpfs",
                               "+masked dir, cloned tmpfs",
                               "+7 file binds (lxcfs-like)"};

static double Cpu(void) {
  struct rusage c, s;
  getrusage(RUSAGE_CHILDREN, &c);
  getrusage(RUSAGE_SELF, &s);
  return c.ru_utime.tv_sec + c.ru_stime.tv_sec + s.ru_utime.tv_sec + s.ru_stime.tv_sec +
         (c.ru_utime.tv_usec + c.ru_stime.tv_usec + s.ru_utime.tv_usec + s.ru_stime.tv_usec) / 1e6;
}

static void Child(int mode, int zfd) {
  char p[64];
  mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, 0);
  if (mode == 1)
    for (int k = 0; k < 7; k++) snprintf(p, sizeof p, "/proc/%s", kFiles[k]), mount("/dev/null", p, 0, MS_BIND, 0);
  if (mode == 2)
    for (int k = 0; k < 4; k++) {
      snprintf(p, sizeof p, "/proc/%s", kReadOnly[k]);
      mount(p, p, 0, MS_BIND | MS_REC, 0);
      mount(0, p, 0, MS_BIND | MS_REMOUNT | MS_RDONLY, 0);
    }
  if (mode == 3) mount("tmpfs", "/proc/acpi", "tmpfs", MS_RDONLY, "size=0,mode=555");
  if (mode == 4) {
    int c = syscall(SYS_open_tree, zfd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
    if (c < 0 || syscall(SYS_move_mount, c, "", AT_FDCWD, "/proc/acpi", MOVE_MOUNT_F_EMPTY_PATH) != 0) _exit(1);
  }
  if (mode == 3 || mode == 4) mount("/proc/acpi", "/proc/driver", 0, MS_BIND, 0);
  if (mode == 5)
    for (int k = 0; k < 7; k++) snprintf(p, sizeof p, "/proc/%s", kFiles[k]), mount("/proc/version", p, 0, MS_BIND, 0);
  _exit(0);
}

int main(int argc, char** argv) {
  const int iters = argc > 1 ? atoi(argv[1]) : 500, reps = argc > 2 ? atoi(argv[2]) : 3;
  if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0 || mount(0, "/", 0, MS_REC | MS_PRIVATE, 0) != 0) {
    perror("unshare/mount");
    return 1;
  }
  int fs = syscall(SYS_fsopen, "tmpfs", FSOPEN_CLOEXEC);
  syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "size", "0", 0);
  syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, 0, 0, 0);
  const int zfd = syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_RDONLY);
  for (int r = 0; r < reps; r++)
    for (int mode = 0; mode < 6; mode++) {
      double c0 = Cpu();
      int fails = 0;
      for (int i = 0; i < iters; i++) {
        pid_t pid = syscall(SYS_clone, CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID | SIGCHLD, 0, 0, 0, 0);
        if (pid == 0) Child(mode, zfd);
        int st;
        waitpid(pid, &st, 0);
        fails += st != 0;
      }
      printf("rep %d | %-28s | %6.1f us CPU per call | failures %d\n", r, kNames[mode], (Cpu() - c0) / iters * 1e6,
             fails);
    }
  return 0;
}
