// raw_floor: the cheapest way this kernel can start a process in a warren-like
// container sandbox, measured one sandbox at a time. Per iteration:
//
//   clone3(CLONE_NEWUSER|NEWNS|NEWPID|NEWUTS|NEWIPC|NEWNET|NEWCGROUP)
//   parent: uid/gid map (root inside = host uid 1000000, 65536 ids, as warren)
//           fresh tmpfs (upper/, work/) + idmapped read-only clone of the lower
//           + overlay, all detached (fsopen/fsmount/open_tree), fd sent to
//           the child over SCM_RIGHTS (exactly warren's container backend path)
//   child:  make / private, move_mount the overlay, pivot_root, exec /bin/true
//   parent: EOF on the CLOEXEC error pipe, waitpid
//
// No mount is ever made in the caller's mount namespace: every per-iteration
// mount lives only in the child's mount namespace and dies with it.
// No cgroup is created unless --cgroup is given.
//
// Usage: raw_floor [--no-idmap] [--full] [--cgroup] LOWERDIR ITERATIONS MAX_SECONDS
//   --no-idmap  root inside = host root (uid map "0 0 1"), lower not idmapped;
//               the overlay is built before clone and inherited.
//   --full      also mount /proc, a tmpfs /dev with bind-mounted device nodes,
//               devpts and /dev/shm (roughly bwrap's --proc --dev work).
//   --cgroup    per iteration, a cgroup with limits (memory 1 GiB, pids 1024,
//               cpu 1 core) under our own cgroup, in the memory, pids, cpu and
//               freezer v1 hierarchies (or the unified one on a v2 host):
//               <own cgroup>/raw_floor-<pid>/<n>. The child joins it before it
//               is released and then unshares its cgroup namespace (as
//               warren); the cgroup is removed after the child is reaped.
// Output: progress on stderr, one JSON object on the last stdout line; with
// $BENCH_SAMPLES set, every iteration's latency (µs) appended to that file.
// Exit status 0 only if every iteration's /bin/true exited 0.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef CLONE_NEWCGROUP
#define CLONE_NEWCGROUP 0x02000000
#endif

enum { kHostUid = 1000000, kUidRange = 65536, kMaxIterations = 1000000, kWarmupIteration = -1 };

static int sys_fsopen(const char* fs, unsigned flags) { return (int)syscall(SYS_fsopen, fs, flags); }
static int sys_fsconfig(int fd, unsigned cmd, const char* key, const void* val, int aux) {
  return (int)syscall(SYS_fsconfig, fd, cmd, key, val, aux);
}
static int sys_fsmount(int fd, unsigned flags, unsigned attrs) { return (int)syscall(SYS_fsmount, fd, flags, attrs); }
static int sys_open_tree(int dfd, const char* path, unsigned flags) {
  return (int)syscall(SYS_open_tree, dfd, path, flags);
}
static int sys_mount_setattr(int dfd, const char* path, unsigned flags, struct mount_attr* attr) {
  return (int)syscall(SYS_mount_setattr, dfd, path, flags, attr, sizeof(*attr));
}
static int sys_move_mount(int fdfd, const char* fp, int tdfd, const char* tp, unsigned flags) {
  return (int)syscall(SYS_move_mount, fdfd, fp, tdfd, tp, flags);
}

// SIGINT/SIGTERM: finish the current iteration, clean up, report failure.
static volatile sig_atomic_t g_stop = 0;
static void on_stop(int sig) {
  (void)sig;
  g_stop = 1;
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

// Child-side failure report: {step, errno} over the CLOEXEC pipe.
struct child_err {
  int step;
  int err;
};
static const char* const kSteps[] = {"?",
                                     "recvmsg",
                                     "sethostname",
                                     "mount(/, MS_PRIVATE)",
                                     "move_mount",
                                     "chdir",
                                     "setresuid",
                                     "mount(proc)",
                                     "mount(dev)",
                                     "dev node",
                                     "devpts",
                                     "shm",
                                     "pivot_root",
                                     "umount2(.)",
                                     "execve(/bin/true)",
                                     "unshare(CLONE_NEWCGROUP)"};
enum {
  kRecv = 1,
  kHostname,
  kPrivate,
  kMove,
  kChdir,
  kSetid,
  kProc,
  kDev,
  kDevNode,
  kDevpts,
  kShm,
  kPivot,
  kUmount,
  kExec,
  kCgroupns
};

static void child_fail(int efd, int step, int err) {
  struct child_err ce = {step, err};
  ssize_t n = write(efd, &ce, sizeof ce);
  (void)n;
  _exit(127);
}

struct plan {
  int sock;       // child end of the socketpair: go byte (+ overlay fd in idmap mode)
  int rootfs_fd;  // inherited detached overlay (no-idmap mode), -1 otherwise
  int err_fd;     // CLOEXEC write end: EOF in the parent = exec succeeded
  int full;
  int unshare_cgroupns;  // --cgroup: new cgroup ns only after joining the cgroup
  const char* mnt;       // empty directory: overlay mount point inside the child's mount ns
};

// Async-signal-safe: runs between clone3 and execve.
static void child_main(const struct plan* p) {
  const int e = p->err_fd;
  int rootfs = p->rootfs_fd;
  {
    // Barrier: the parent has written our id maps (and, in idmap mode, sends
    // the overlay along with this byte).
    char byte = 0;
    char cbuf[CMSG_SPACE(sizeof(int))];
    memset(cbuf, 0, sizeof cbuf);
    struct iovec iov = {&byte, 1};
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof cbuf;
    ssize_t n;
    do n = recvmsg(p->sock, &msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n <= 0) _exit(126);  // parent gave up
    if (rootfs < 0) {
      struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
      if (!c || c->cmsg_type != SCM_RIGHTS) child_fail(e, kRecv, EBADF);
      memcpy(&rootfs, CMSG_DATA(c), sizeof(int));
    }
  }
  if (p->unshare_cgroupns && unshare(CLONE_NEWCGROUP) != 0) child_fail(e, kCgroupns, errno);
  if (sethostname("sandbox", 7) != 0) child_fail(e, kHostname, errno);
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) child_fail(e, kPrivate, errno);
  if (sys_move_mount(rootfs, "", AT_FDCWD, p->mnt, MOVE_MOUNT_F_EMPTY_PATH) != 0) child_fail(e, kMove, errno);
  close(rootfs);
  if (chdir(p->mnt) != 0) child_fail(e, kChdir, errno);
  if (setresgid(0, 0, 0) != 0 || setresuid(0, 0, 0) != 0) child_fail(e, kSetid, errno);
  if (p->full) {
    mkdir("proc", 0755);
    mkdir("dev", 0755);
    if (mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0) child_fail(e, kProc, errno);
    if (mount("tmpfs", "dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=256,mode=755") != 0)
      child_fail(e, kDev, errno);
    static const char* const nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
    for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; ++i) {
      char path[32] = "dev/", src[32] = "/dev/";
      strcat(path, nodes[i]);
      strcat(src, nodes[i]);
      int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
      if (fd < 0) child_fail(e, kDevNode, errno);
      close(fd);
      if (mount(src, path, NULL, MS_BIND, NULL) != 0) child_fail(e, kDevNode, errno);
    }
    if (mkdir("dev/pts", 0755) != 0 || mkdir("dev/shm", 01777) != 0) child_fail(e, kDev, errno);
    if (mount("devpts", "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620") != 0)
      child_fail(e, kDevpts, errno);
    if (mount("shm", "dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=1777") != 0) child_fail(e, kShm, errno);
  }
  if (syscall(SYS_pivot_root, ".", ".") != 0) child_fail(e, kPivot, errno);
  if (umount2(".", MNT_DETACH) != 0) child_fail(e, kUmount, errno);
  if (chdir("/") != 0) child_fail(e, kChdir, errno);
  char* argv[] = {"true", NULL};
  char* envp[] = {"PATH=/usr/bin:/bin", NULL};
  execve("/bin/true", argv, envp);
  child_fail(e, kExec, errno);
}

static int write_file(const char* path, const char* s) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  ssize_t len = (ssize_t)strlen(s);
  int rc = write(fd, s, (size_t)len) == len ? 0 : -errno;
  close(fd);
  return rc;
}

// Detached overlay: fresh tmpfs upper/work + (optionally idmapped) clone of
// lower. Returns the fsmount fd or -1 with a message on stderr.
static int build_rootfs(const char* lower, int userns_fd, uid_t owner) {
  int tfs = -1, tmnt = -1, upper = -1, work = -1, low = -1, ofs = -1, omnt = -1;
  const char* what = "";
  char uid[16];
  snprintf(uid, sizeof uid, "%u", (unsigned)owner);
#define CHECK(cond, w) \
  if (!(cond)) {       \
    what = (w);        \
    goto fail;         \
  }
  tfs = sys_fsopen("tmpfs", FSOPEN_CLOEXEC);
  CHECK(tfs >= 0, "fsopen(tmpfs)");
  CHECK(sys_fsconfig(tfs, FSCONFIG_SET_STRING, "size", "64m", 0) == 0, "fsconfig(tmpfs, size=64m)");
  CHECK(sys_fsconfig(tfs, FSCONFIG_SET_STRING, "mode", "0755", 0) == 0, "fsconfig(tmpfs, mode)");
  CHECK(sys_fsconfig(tfs, FSCONFIG_SET_STRING, "uid", uid, 0) == 0, "fsconfig(tmpfs, uid)");
  CHECK(sys_fsconfig(tfs, FSCONFIG_SET_STRING, "gid", uid, 0) == 0, "fsconfig(tmpfs, gid)");
  CHECK(sys_fsconfig(tfs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) == 0, "fsconfig(tmpfs, create)");
  tmnt = sys_fsmount(tfs, FSMOUNT_CLOEXEC, 0);
  CHECK(tmnt >= 0, "fsmount(tmpfs)");
  CHECK(mkdirat(tmnt, "upper", 0755) == 0 && mkdirat(tmnt, "work", 0755) == 0, "mkdirat(tmpfs, upper|work)");
  CHECK(fchownat(tmnt, "upper", owner, owner, AT_SYMLINK_NOFOLLOW) == 0 &&
            fchownat(tmnt, "work", owner, owner, AT_SYMLINK_NOFOLLOW) == 0,
        "fchownat(tmpfs, upper|work)");
  upper = openat(tmnt, "upper", O_PATH | O_DIRECTORY | O_CLOEXEC);
  work = openat(tmnt, "work", O_PATH | O_DIRECTORY | O_CLOEXEC);
  CHECK(upper >= 0 && work >= 0, "openat(tmpfs, upper|work)");
  low = sys_open_tree(AT_FDCWD, lower, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
  CHECK(low >= 0, "open_tree(lower, OPEN_TREE_CLONE)");
  struct mount_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.attr_set = MOUNT_ATTR_RDONLY;
  if (userns_fd >= 0) {
    attr.attr_set |= MOUNT_ATTR_IDMAP;
    attr.userns_fd = (uint64_t)userns_fd;
  }
  CHECK(sys_mount_setattr(low, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr) == 0, "mount_setattr(lower, IDMAP|RDONLY)");
  ofs = sys_fsopen("overlay", FSOPEN_CLOEXEC);
  CHECK(ofs >= 0, "fsopen(overlay)");
  CHECK(sys_fsconfig(ofs, FSCONFIG_SET_FD, "lowerdir+", NULL, low) == 0, "fsconfig(overlay, lowerdir+)");
  CHECK(sys_fsconfig(ofs, FSCONFIG_SET_FD, "upperdir", NULL, upper) == 0, "fsconfig(overlay, upperdir)");
  CHECK(sys_fsconfig(ofs, FSCONFIG_SET_FD, "workdir", NULL, work) == 0, "fsconfig(overlay, workdir)");
  CHECK(sys_fsconfig(ofs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) == 0, "fsconfig(overlay, create)");
  omnt = sys_fsmount(ofs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NODEV);
  CHECK(omnt >= 0, "fsmount(overlay)");
#undef CHECK
fail:
  if (omnt < 0) fprintf(stderr, "raw_floor: %s: %s\n", what, strerror(errno));
  int fds[] = {tfs, tmnt, upper, work, low, ofs};
  for (size_t i = 0; i < sizeof fds / sizeof fds[0]; ++i)
    if (fds[i] >= 0) close(fds[i]);
  return omnt;
}

static int send_fd(int sock, int fd) {
  char byte = 'g';
  struct iovec iov = {&byte, 1};
  char cbuf[CMSG_SPACE(sizeof(int))];
  memset(cbuf, 0, sizeof cbuf);
  struct msghdr msg;
  memset(&msg, 0, sizeof msg);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = cbuf;
  msg.msg_controllen = sizeof cbuf;
  struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof fd);
  return sendmsg(sock, &msg, MSG_NOSIGNAL) == 1 ? 0 : -errno;
}

// ---- --cgroup: per-iteration cgroups under our own cgroup.
enum { kMaxCgroupDirs = 8 };
struct cgroups {
  int n;
  int v2;
  char base[kMaxCgroupDirs][512];  // <mount>/<own path>/raw_floor-<pid>
};
static struct cgroups g_cg;

// Fills g_cg from /proc/self/cgroup and creates the per-run parents.
// v1 when a memory hierarchy is mounted, else v2 (unified).
static int cgroups_init(void) {
  static const char* const kWanted[] = {"memory", "pids", "cpu", "freezer"};
  FILE* f = fopen("/proc/self/cgroup", "re");
  if (!f) {
    perror("raw_floor: fopen(/proc/self/cgroup)");
    return -1;
  }
  char line[1024], v2path[512] = "";
  int have_v1 = 0;
  for (int guard = 0; guard < 64 && fgets(line, sizeof line, f); ++guard) {
    line[strcspn(line, "\n")] = 0;
    char* c1 = strchr(line, ':');
    char* c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    *c1 = 0;
    *c2 = 0;
    const char* ctrls = c1 + 1;
    const char* path = c2 + 1;
    if (strcmp(line, "0") == 0 && *ctrls == 0) {
      snprintf(v2path, sizeof v2path, "%s", path);
      continue;
    }
    for (size_t w = 0; w < sizeof kWanted / sizeof kWanted[0]; ++w) {
      // ctrls is a comma list ("cpu,cpuacct"); match whole names.
      char list[256];
      snprintf(list, sizeof list, ",%s,", ctrls);
      char want[32];
      snprintf(want, sizeof want, ",%s,", kWanted[w]);
      if (!strstr(list, want) || g_cg.n >= kMaxCgroupDirs) continue;
      char mount_dir[300];
      snprintf(mount_dir, sizeof mount_dir, "/sys/fs/cgroup/%s", ctrls);
      struct stat st;
      if (stat(mount_dir, &st) != 0) continue;
      snprintf(g_cg.base[g_cg.n++], sizeof g_cg.base[0], "%s%s/raw_floor-%d", mount_dir,
               strcmp(path, "/") == 0 ? "" : path, (int)getpid());
      if (strcmp(kWanted[w], "memory") == 0) have_v1 = 1;
    }
  }
  fclose(f);
  if (!have_v1) {
    g_cg.n = 0;
    g_cg.v2 = 1;
    snprintf(g_cg.base[g_cg.n++], sizeof g_cg.base[0], "/sys/fs/cgroup%s/raw_floor-%d",
             strcmp(v2path, "/") == 0 ? "" : v2path, (int)getpid());
  }
  for (int i = 0; i < g_cg.n; ++i) {
    if (mkdir(g_cg.base[i], 0755) != 0) {
      fprintf(stderr, "raw_floor: mkdir(%s): %s\n", g_cg.base[i], strerror(errno));
      for (int j = 0; j < i; ++j) rmdir(g_cg.base[j]);
      g_cg.n = 0;
      return -1;
    }
  }
  return 0;
}

static void cgroups_fini(void) {
  for (int i = 0; i < g_cg.n; ++i)
    if (rmdir(g_cg.base[i]) != 0) fprintf(stderr, "raw_floor: rmdir(%s): %s\n", g_cg.base[i], strerror(errno));
}

// Writes s to dir/file; a file the hierarchy does not have is skipped.
static int cg_write(const char* dir, const char* file, const char* s) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  int r = write_file(path, s);
  if (r == -ENOENT) return 0;
  if (r != 0) fprintf(stderr, "raw_floor: write(%s, %s): %s\n", path, s, strerror(-r));
  return r;
}

// Creates the iteration's cgroup in every hierarchy, with limits.
static int cgroup_create(int iter) {
  for (int i = 0; i < g_cg.n; ++i) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%d", g_cg.base[i], iter);
    if (mkdir(dir, 0755) != 0) {
      fprintf(stderr, "raw_floor: mkdir(%s): %s\n", dir, strerror(errno));
      return -1;
    }
    int r = g_cg.v2 ? (cg_write(dir, "memory.max", "1073741824") || cg_write(dir, "pids.max", "1024") ||
                       cg_write(dir, "cpu.max", "100000 100000"))
                    : (cg_write(dir, "memory.limit_in_bytes", "1073741824") || cg_write(dir, "pids.max", "1024") ||
                       cg_write(dir, "cpu.cfs_quota_us", "100000"));
    if (r != 0) return -1;
  }
  return 0;
}

static int cgroup_join(int iter, pid_t pid) {
  char pidstr[16];
  snprintf(pidstr, sizeof pidstr, "%d", (int)pid);
  for (int i = 0; i < g_cg.n; ++i) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%d", g_cg.base[i], iter);
    char path[700];
    snprintf(path, sizeof path, "%s/cgroup.procs", dir);
    int r = write_file(path, pidstr);
    if (r != 0) {
      fprintf(stderr, "raw_floor: write(%s, %s): %s\n", path, pidstr, strerror(-r));
      return -1;
    }
  }
  return 0;
}

// Removes the iteration's cgroups (the child is reaped, so they are empty;
// v1 may still report EBUSY for a moment: bounded retry).
static int cgroup_remove(int iter) {
  int rc = 0;
  for (int i = 0; i < g_cg.n; ++i) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%d", g_cg.base[i], iter);
    int r = -1;
    for (int k = 0; k < 1000 && (r = rmdir(dir)) != 0 && (errno == EBUSY || errno == EAGAIN); ++k) usleep(1000);
    if (r != 0 && errno != ENOENT) {
      fprintf(stderr, "raw_floor: rmdir(%s): %s\n", dir, strerror(errno));
      rc = -1;
    }
  }
  return rc;
}

// One sandbox: returns 0 when /bin/true ran and exited 0.
static int one_iteration(const char* lower, const char* mnt, int idmap, int full, int cgroup, int iter) {
  int sp[2] = {-1, -1}, ep[2] = {-1, -1}, rootfs = -1, rc = -1;
  if (cgroup && cgroup_create(iter) != 0) {
    cgroup_remove(iter);
    return -1;
  }
  if (pipe2(ep, O_CLOEXEC) != 0) {
    perror("raw_floor: pipe2");
    return -1;
  }
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) != 0) {
    perror("raw_floor: socketpair");
    goto out;
  }
  if (!idmap) {
    rootfs = build_rootfs(lower, -1, 0);
    if (rootfs < 0) goto out;
  }
  struct plan p = {sp[1], idmap ? -1 : rootfs, ep[1], full, cgroup, mnt};
  struct clone_args args;
  memset(&args, 0, sizeof args);
  args.flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET |
               (cgroup ? 0 : CLONE_NEWCGROUP);
  args.exit_signal = SIGCHLD;
  pid_t pid = (pid_t)syscall(SYS_clone3, &args, sizeof args);
  if (pid < 0) {
    perror("raw_floor: clone3");
    goto out;
  }
  if (pid == 0) child_main(&p);
  close(ep[1]);
  ep[1] = -1;
  if (sp[1] >= 0) {
    close(sp[1]);
    sp[1] = -1;
  }
  int failed = 0;
  {
    char path[64], map[64];
    snprintf(map, sizeof map, idmap ? "0 %d %d\n" : "0 0 1\n", kHostUid, kUidRange);
    snprintf(path, sizeof path, "/proc/%d/uid_map", pid);
    int r = write_file(path, map);
    snprintf(path, sizeof path, "/proc/%d/setgroups", pid);
    if (r == 0) r = write_file(path, "deny");
    snprintf(path, sizeof path, "/proc/%d/gid_map", pid);
    if (r == 0) r = write_file(path, map);
    if (r != 0) {
      fprintf(stderr, "raw_floor: writing id maps of %d: %s\n", pid, strerror(-r));
      failed = 1;
    }
    if (!failed && cgroup && cgroup_join(iter, pid) != 0) failed = 1;
    if (!failed && idmap) {
      snprintf(path, sizeof path, "/proc/%d/ns/user", pid);
      int userns = open(path, O_RDONLY | O_CLOEXEC);
      if (userns < 0) {
        perror("raw_floor: open(ns/user)");
        failed = 1;
      } else {
        rootfs = build_rootfs(lower, userns, kHostUid);
        close(userns);
        if (rootfs < 0) failed = 1;
      }
    }
    if (!failed) {
      if (idmap)
        r = send_fd(sp[0], rootfs);
      else
        r = send(sp[0], "g", 1, MSG_NOSIGNAL) == 1 ? 0 : -errno;
      if (r != 0) {
        fprintf(stderr, "raw_floor: sendmsg(go): %s\n", strerror(-r));
        failed = 1;
      }
    }
  }
  if (failed) kill(pid, SIGKILL);
  if (sp[0] >= 0) {
    close(sp[0]);  // (a child that did not get its go byte was SIGKILLed above)
    sp[0] = -1;
  }
  if (rootfs >= 0) {
    close(rootfs);
    rootfs = -1;
  }
  struct child_err ce;
  ssize_t n;
  do n = read(ep[0], &ce, sizeof ce);
  while (n < 0 && errno == EINTR);
  if (n == (ssize_t)sizeof ce)
    fprintf(stderr, "raw_floor: child: %s: %s\n", ce.step > 0 && ce.step <= kCgroupns ? kSteps[ce.step] : "?",
            strerror(ce.err));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!failed && n == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
    rc = 0;
  else if (!failed && n == 0)
    fprintf(stderr, "raw_floor: /bin/true ended with status 0x%x\n", status);
out:
  for (int i = 0; i < 2; ++i) {
    if (sp[i] >= 0) close(sp[i]);
    if (ep[i] >= 0) close(ep[i]);
  }
  if (rootfs >= 0) close(rootfs);
  if (cgroup && cgroup_remove(iter) != 0) rc = -1;
  return rc;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double pct(const double* sorted, int n, double q) {
  int i = (int)(q * (n - 1) + 0.5);
  return sorted[i < 0 ? 0 : i >= n ? n - 1 : i];
}

int main(int argc, char** argv) {
  int idmap = 1, full = 0, cgroup = 0, a = 1;
  for (; a < argc && argv[a][0] == '-'; ++a) {
    if (strcmp(argv[a], "--no-idmap") == 0)
      idmap = 0;
    else if (strcmp(argv[a], "--full") == 0)
      full = 1;
    else if (strcmp(argv[a], "--cgroup") == 0)
      cgroup = 1;
    else
      break;
  }
  if (argc - a != 3) {
    fprintf(stderr, "usage: %s [--no-idmap] [--full] [--cgroup] LOWERDIR ITERATIONS MAX_SECONDS\n", argv[0]);
    return 2;
  }
  const char* lower = argv[a];
  int iterations = atoi(argv[a + 1]);
  double max_s = atof(argv[a + 2]);
  if (iterations < 1 || iterations > kMaxIterations || max_s <= 0) {
    fprintf(stderr, "raw_floor: ITERATIONS must be 1..%d and MAX_SECONDS > 0\n", kMaxIterations);
    return 2;
  }
  // The overlay's mount point: an empty directory that only ever has a mount
  // on it inside a child's private mount namespace.
  char mnt[] = "/tmp/raw_floor.XXXXXX";
  if (!mkdtemp(mnt)) {
    perror("raw_floor: mkdtemp");
    return 1;
  }
  double* lat = calloc((size_t)iterations, sizeof(double));
  if (!lat) return 1;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop;  // no SA_RESTART: a blocking wait sees EINTR
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  // One untimed warm-up iteration (page cache, dentries of the lower).
  if (cgroup && cgroups_init() != 0) {
    rmdir(mnt);
    free(lat);
    return 1;
  }
  int rc = one_iteration(lower, mnt, idmap, full, cgroup, kWarmupIteration) == 0 ? 0 : 1;
  int done = 0;
  const double start = now_us();
  for (; rc == 0 && done < iterations; ++done) {
    double t0 = now_us();
    if (one_iteration(lower, mnt, idmap, full, cgroup, done) != 0) {
      rc = 1;
      break;
    }
    lat[done] = now_us() - t0;
    if (g_stop) {
      fprintf(stderr, "raw_floor: interrupted\n");
      rc = 1;
      break;
    }
    if (now_us() - start > max_s * 1e6) {
      ++done;
      break;
    }
  }
  const double elapsed = (now_us() - start) / 1e6;
  rmdir(mnt);
  if (cgroup) cgroups_fini();
  if (done == 0 || rc != 0) {
    fprintf(stderr, "raw_floor: failed after %d iterations\n", done);
    printf("{\"name\":\"raw_floor\",\"ok\":false,\"iterations\":%d}\n", done);
    free(lat);
    return 1;
  }
  // $BENCH_SAMPLES: append every latency (µs, one a line) for the driver
  // to merge rounds of the same row.
  const char* samples = getenv("BENCH_SAMPLES");
  if (samples && *samples) {
    FILE* f = fopen(samples, "ae");
    if (!f) {
      fprintf(stderr, "%s: fopen(%s): %s\n", "raw_floor", samples, strerror(errno));
    } else {
      for (int i = 0; i < done; ++i) fprintf(f, "%.0f\n", lat[i]);
      fclose(f);
    }
  }
  qsort(lat, (size_t)done, sizeof(double), cmp_double);
  printf(
      "{\"name\":\"raw_floor%s%s%s\",\"ok\":true,\"iterations\":%d,\"seconds\":%.3f,\"rate\":%.2f,"
      "\"p50_us\":%.0f,\"p90_us\":%.0f,\"p99_us\":%.0f,\"max_us\":%.0f}\n",
      idmap ? "" : "_noidmap", full ? "_full" : "", cgroup ? "_cg" : "", done, elapsed, done / elapsed,
      pct(lat, done, 0.50), pct(lat, done, 0.90), pct(lat, done, 0.99), lat[done - 1]);
  free(lat);
  return 0;
}
