// Escape probe: run INSIDE a sandbox by tests/security (compiled on the host
// with `gcc -static -O1`, and with -m32 where gcc-multilib is installed).
// One subcommand per case; every attempt prints one line
//
//   case=<name> result=blocked|ALLOWED|skip errno=<ENAME|0> [key=value ...]
//
// "blocked" means the attempt failed (or its effect did not happen); ALLOWED
// means it succeeded, i.e. an escape or a policy violation. The tests parse
// these lines (tests/security/probe.py) and assert on them. The probe never
// does damage on success: a write that is let through is not carried out
// (opening the file for writing is the evidence), a sysrq trigger is never
// written, a reboot is only ever the harmless "CAD off" command.
//
// Syscalls of the `abi` subcommand are issued raw on each ABI (x86_64
// `syscall`, i386 `int $0x80`, x32 `syscall` with __X32_SYSCALL_BIT), each in
// a forked child, so that a seccomp kill_process (SIGSYS) is observed as a
// signal rather than ending the probe. Pointers given to i386 syscalls live in
// static storage: the binary is static and not PIE, so they are below 4 GiB.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif
#ifndef AF_VSOCK
#define AF_VSOCK 40
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

// clang-format off
static const char* ErrName(int e) {
  switch (e) {
    case 0: return "0";
#define E(x) case x: return #x;
    E(EPERM) E(ENOENT) E(ESRCH) E(EINTR) E(EIO) E(ENXIO) E(E2BIG) E(ENOEXEC) E(EBADF) E(ECHILD) E(EAGAIN)
    E(ENOMEM) E(EACCES) E(EFAULT) E(ENOTBLK) E(EBUSY) E(EEXIST) E(EXDEV) E(ENODEV) E(ENOTDIR) E(EISDIR)
    E(EINVAL) E(ENFILE) E(EMFILE) E(ENOTTY) E(ETXTBSY) E(EFBIG) E(ENOSPC) E(ESPIPE) E(EROFS) E(EMLINK)
    E(EPIPE) E(ERANGE) E(ENOSYS) E(ENOTEMPTY) E(ELOOP) E(ENODATA) E(ENOKEY) E(EOPNOTSUPP) E(EAFNOSUPPORT)
    E(EPROTONOSUPPORT) E(ESOCKTNOSUPPORT) E(ECONNREFUSED) E(ENETUNREACH) E(EHOSTUNREACH) E(EADDRNOTAVAIL)
    E(ETIMEDOUT) E(ENOTSOCK) E(EPROTOTYPE) E(ENOTCONN) E(ENAMETOOLONG) E(EDQUOT) E(EOVERFLOW)
#undef E
    default: {
      static char buf[16];
      snprintf(buf, sizeof buf, "E%d", e);
      return buf;
    }
  }
}
// clang-format on

static void Report(const char* name, int allowed, int err, const char* extra) {
  printf("case=%s result=%s errno=%s%s%s\n", name, allowed ? "ALLOWED" : "blocked", ErrName(err),
         extra && *extra ? " " : "", extra ? extra : "");
  fflush(stdout);
}

static void Skip(const char* name, const char* reason) {
  printf("case=%s result=skip errno=0 reason=%s\n", name, reason);
  fflush(stdout);
}

// ---------------------------------------------------------------- raw syscalls per ABI

enum Abi { kNative, kI386, kX32 };

#if defined(__x86_64__)
static long Raw64(long n, long a, long b, long c, long d, long e, long f) {
  register long r10 __asm__("r10") = d;
  register long r8 __asm__("r8") = e;
  register long r9 __asm__("r9") = f;
  long ret;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                   : "rcx", "r11", "memory");
  return ret;
}

// i386 syscall from 64-bit code. The kernel takes 32-bit arguments in
// ebx, ecx, edx, esi, edi (and ebp: no case here uses a sixth argument); it
// clears r8-r11 on return.
static long Raw32(long n, long a, long b, long c, long d, long e, long f) {
  (void)f;
  long ret;
  __asm__ volatile("int $0x80"
                   : "=a"(ret)
                   : "a"(n), "b"(a), "c"(b), "d"(c), "S"(d), "D"(e)
                   : "r8", "r9", "r10", "r11", "memory");
  return (int)ret;  // eax, sign-extended
}
#define HAVE_I386_FROM_64 1
#define HAVE_X32 1
#elif defined(__i386__)
static long Raw32(long n, long a, long b, long c, long d, long e, long f) {
  long r = syscall(n, a, b, c, d, e, f);
  return r < 0 ? -errno : r;
}
#endif

// Syscall numbers on each ABI (asm/unistd_64.h, unistd_32.h, unistd_x32.h
// without the X32 bit); -1: not on that ABI.
struct Nr {
  const char* name;
  int x64, nr32, x32;
};
static const struct Nr kNrs[] = {
    {"mount", 165, 21, 165},
    {"umount", -1, 22, -1},
    {"umount2", 166, 52, 166},
    {"pivot_root", 155, 217, 155},
    {"move_mount", 429, 429, 429},
    {"open_tree", 428, 428, 428},
    {"fsopen", 430, 430, 430},
    {"fsconfig", 431, 431, 431},
    {"fsmount", 432, 432, 432},
    {"fspick", 433, 433, 433},
    {"mount_setattr", 442, 442, 442},
    {"unshare", 272, 310, 272},
    {"setns", 308, 346, 308},
    {"clone", 56, 120, 56},
    {"clone3", 435, 435, 435},
    {"add_key", 248, 286, 248},
    {"request_key", 249, 287, 249},
    {"keyctl", 250, 288, 250},
    {"bpf", 321, 357, 321},
    {"perf_event_open", 298, 336, 298},
    {"userfaultfd", 323, 374, 323},
    {"io_uring_setup", 425, 425, 425},
    {"io_uring_enter", 426, 426, 426},
    {"io_uring_register", 427, 427, 427},
    {"init_module", 175, 128, 175},
    {"finit_module", 313, 350, 313},
    {"delete_module", 176, 129, 176},
    {"kexec_load", 246, 283, 528},
    {"kexec_file_load", 320, -1, 320},
    {"reboot", 169, 88, 169},
    {"syslog", 103, 103, 103},
    {"open_by_handle_at", 304, 342, 304},
    {"iopl", 172, 110, 172},
    {"ioperm", 173, 101, 173},
    {"swapon", 167, 87, 167},
    {"ioctl", 16, 54, 514},
    {"socket", 41, 359, 41},
    {"socketcall", -1, 102, -1},
    {"ptrace", 101, 26, 521},
    {"acct", 163, 51, 163},
    {"settimeofday", 164, 79, 164},
    {"clock_settime", 227, 264, 227},
};

static int NrOf(const char* name, enum Abi abi) {
  for (size_t i = 0; i < sizeof kNrs / sizeof kNrs[0]; ++i) {
    if (strcmp(kNrs[i].name, name) == 0) {
#if defined(__i386__)
      (void)abi;
      return kNrs[i].nr32;
#else
      return abi == kNative ? kNrs[i].x64 : abi == kI386 ? kNrs[i].nr32 : kNrs[i].x32;
#endif
    }
  }
  fprintf(stderr, "probe: no syscall number for %s\n", name);
  exit(2);
}

static long RawAbi(enum Abi abi, int nr, long a, long b, long c, long d, long e, long f) {
#if defined(__x86_64__)
  if (abi == kNative) return Raw64(nr, a, b, c, d, e, f);
  if (abi == kI386) return Raw32(nr, a, b, c, d, e, f);
  return Raw64(nr | 0x40000000, a, b, c, d, e, f);
#else
  (void)abi;
  return Raw32(nr, a, b, c, d, e, f);
#endif
}

// Static storage for i386 pointer arguments.
static char s_none[] = "none", s_tmp[] = "/tmp", s_tmpfs[] = "tmpfs", s_root[] = "/", s_shm[] = "/dev/shm";
static char s_user[] = "user", s_key[] = "warren-probe-key", s_val[] = "v", s_empty[] = "", s_mnt[] = "/mnt";
static char s_mod[] = "warren_probe";
static char s_swap[] = "/tmp/.warren-probe-swap";
static unsigned char s_buf[256];
static uint64_t s_clone3_args[11];
struct UringParams {
  uint32_t sq_entries, cq_entries, flags, sq_thread_cpu, sq_thread_idle, features, wq_fd, resv[3];
  uint64_t sq_off[5], cq_off[5];
};
static struct UringParams s_uring;
struct PerfAttr {
  uint32_t type, size;
  uint64_t config, sample_period, sample_type, read_format, flags;
  uint32_t wakeup, bp_type;
  uint64_t bp_addr, bp_len, branch_sample_type, sample_regs_user;
  uint32_t sample_stack_user;
  int32_t clockid;
  uint64_t sample_regs_intr;
  uint32_t aux_watermark;
  uint16_t sample_max_stack, reserved2;
  uint32_t aux_sample_size, reserved3;
  uint64_t sig_data, config3;
};
static struct PerfAttr s_perf;
static uint32_t s_bpf_attr[32];
static struct {
  uint32_t handle_bytes;
  int handle_type;
  unsigned char f_handle[128];
} s_handle;
static uint32_t s_sockcall_args[3];

// One attempt, run in a forked child: the syscall's result (-errno on
// failure), or the signal that killed the child (a seccomp kill_process).
typedef long (*AttemptFn)(enum Abi abi, long arg);
struct Outcome {
  long ret;
  int signal;
};

static struct Outcome InChild(AttemptFn fn, enum Abi abi, long arg) {
  struct Outcome o = {0, 0};
  int p[2];
  if (pipe(p) != 0) {
    o.ret = -errno;
    return o;
  }
  pid_t pid = fork();
  if (pid < 0) {
    o.ret = -errno;
    return o;
  }
  if (pid == 0) {
    close(p[0]);
    long r = fn(abi, arg);
    if (write(p[1], &r, sizeof r) != sizeof r) _exit(3);
    _exit(0);
  }
  close(p[1]);
  ssize_t n = read(p[0], &o.ret, sizeof o.ret);
  close(p[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(st))
    o.signal = WTERMSIG(st);
  else if (n != sizeof o.ret)
    o.ret = -EIO;
  return o;
}

// A clone that succeeded in making a namespace: the new child (running on a
// copy of our memory, like fork) exits at once, the parent reaps it.
static long ReapIfChild(long r) {
  if (r == 0) {
#if defined(__x86_64__)
    Raw64(SYS_exit_group, 0, 0, 0, 0, 0, 0);
#endif
    syscall(SYS_exit_group, 0);
  }
  if (r > 0) waitpid((pid_t)r, NULL, __WALL);
  return r;
}

#define NR(n) NrOf(n, abi)

static long AttemptMount(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("mount"), (long)s_none, (long)s_tmp, (long)s_tmpfs, 0, 0, 0);
}
static long AttemptUmount(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("umount"), (long)s_shm, 0, 0, 0, 0, 0);
}
static long AttemptUmount2(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("umount2"), (long)s_shm, 2 /* MNT_DETACH */, 0, 0, 0, 0);
}
static long AttemptPivotRoot(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("pivot_root"), (long)s_tmp, (long)s_tmp, 0, 0, 0, 0);
}
static long AttemptMoveMount(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("move_mount"), AT_FDCWD, (long)s_tmp, AT_FDCWD, (long)s_mnt, 0, 0);
}
static long AttemptOpenTree(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("open_tree"), AT_FDCWD, (long)s_root, 1 /* OPEN_TREE_CLONE */, 0, 0, 0);
}
static long AttemptFsopen(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("fsopen"), (long)s_tmpfs, 0, 0, 0, 0, 0);
}
static long AttemptFsconfig(enum Abi abi, long a) {
  (void)a;  // an invalid fd: the kernel answers EBADF, the filter EPERM
  return RawAbi(abi, NR("fsconfig"), 9999, 0, 0, 0, 0, 0);
}
static long AttemptFsmount(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("fsmount"), 9999, 0, 0, 0, 0, 0);
}
static long AttemptFspick(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("fspick"), AT_FDCWD, (long)s_root, 0, 0, 0, 0);
}
static long AttemptMountSetattr(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("mount_setattr"), AT_FDCWD, (long)s_root, 0, 0, 0, 0);
}
static long AttemptUnshare(enum Abi abi, long flags) {
  long r = RawAbi(abi, NR("unshare"), flags, 0, 0, 0, 0, 0);
  return r;
}
static long AttemptClone(enum Abi abi, long flags) {
  // i386 and x86_64 both take flags first; newsp 0 = run on a copy of our stack.
  return ReapIfChild(RawAbi(abi, NR("clone"), flags | SIGCHLD, 0, 0, 0, 0, 0));
}
static long AttemptClone3(enum Abi abi, long flags) {
  memset(s_clone3_args, 0, sizeof s_clone3_args);
  s_clone3_args[0] = (uint64_t)flags;
  s_clone3_args[4] = SIGCHLD;  // exit_signal
  return ReapIfChild(RawAbi(abi, NR("clone3"), (long)s_clone3_args, 88, 0, 0, 0, 0));
}
static long AttemptSetns(enum Abi abi, long a) {
  (void)a;  // our own user namespace: the kernel answers EINVAL, the filter EPERM
  int fd = open("/proc/self/ns/user", O_RDONLY);
  if (fd < 0) return -errno;
  return RawAbi(abi, NR("setns"), fd, 0, 0, 0, 0, 0);
}
static long AttemptAddKey(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("add_key"), (long)s_user, (long)s_key, (long)s_val, 1, -2 /* process keyring */, 0);
}
static long AttemptRequestKey(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("request_key"), (long)s_user, (long)s_key, 0, 0, 0, 0);
}
static long AttemptKeyctl(enum Abi abi, long a) {
  (void)a;  // KEYCTL_GET_KEYRING_ID of the session keyring, create=1
  return RawAbi(abi, NR("keyctl"), 0, -3, 1, 0, 0, 0);
}
static long AttemptBpf(enum Abi abi, long a) {
  (void)a;  // BPF_MAP_CREATE of a 1-entry array
  memset(s_bpf_attr, 0, sizeof s_bpf_attr);
  s_bpf_attr[0] = 2;
  s_bpf_attr[1] = 4;
  s_bpf_attr[2] = 4;
  s_bpf_attr[3] = 1;
  return RawAbi(abi, NR("bpf"), 0, (long)s_bpf_attr, 72, 0, 0, 0);
}
static long AttemptPerf(enum Abi abi, long a) {
  (void)a;  // a software cpu-clock counter on ourselves, user space only
  memset(&s_perf, 0, sizeof s_perf);
  s_perf.type = 1;
  s_perf.size = 128;
  s_perf.flags = 1 | (1 << 5) | (1 << 6);  // disabled, exclude_kernel, exclude_hv
  return RawAbi(abi, NR("perf_event_open"), (long)&s_perf, 0, -1, -1, 0, 0);
}
static long AttemptUserfaultfd(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("userfaultfd"), 1 /* UFFD_USER_MODE_ONLY */, 0, 0, 0, 0, 0);
}
static long AttemptIoUringSetup(enum Abi abi, long a) {
  (void)a;
  memset(&s_uring, 0, sizeof s_uring);
  return RawAbi(abi, NR("io_uring_setup"), 1, (long)&s_uring, 0, 0, 0, 0);
}
static long AttemptIoUringEnter(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("io_uring_enter"), 9999, 0, 0, 0, 0, 0);
}
static long AttemptIoUringRegister(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("io_uring_register"), 9999, 0, 0, 0, 0, 0);
}
static long AttemptInitModule(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("init_module"), (long)s_buf, sizeof s_buf, (long)s_empty, 0, 0, 0);
}
static long AttemptFinitModule(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("finit_module"), 9999, (long)s_empty, 0, 0, 0, 0);
}
static long AttemptDeleteModule(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("delete_module"), (long)s_mod, 0x800 /* O_NONBLOCK */, 0, 0, 0, 0);
}
static long AttemptKexecLoad(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("kexec_load"), 0, 0, 0, 0, 0, 0);
}
static long AttemptKexecFileLoad(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("kexec_file_load"), 9999, 9999, 1, (long)s_empty, 0, 0);
}
static long AttemptReboot(enum Abi abi, long a) {
  (void)a;  // LINUX_REBOOT_CMD_CAD_OFF: harmless even where it is allowed
  return RawAbi(abi, NR("reboot"), 0xfee1dead, 672274793, 0, 0, 0, 0);
}
static long AttemptSyslog(enum Abi abi, long a) {
  (void)a;  // SYSLOG_ACTION_SIZE_BUFFER
  return RawAbi(abi, NR("syslog"), 10, 0, 0, 0, 0, 0);
}
static long AttemptOpenByHandle(enum Abi abi, long a) {
  (void)a;
  // A real handle where the file system makes one (tmpfs does, overlayfs
  // without nfs_export does not); else the "shocker" guess: inode 2, the
  // root of most file systems.
  int mount_id = 0;
  s_handle.handle_bytes = sizeof s_handle.f_handle;
  if (name_to_handle_at(AT_FDCWD, "/dev/shm", (struct file_handle*)&s_handle, &mount_id, 0) != 0) {
    memset(&s_handle, 0, sizeof s_handle);
    s_handle.handle_bytes = 8;
    s_handle.handle_type = 1;  // FILEID_INO32_GEN
    s_handle.f_handle[0] = 2;
  }
  int root = open("/dev/shm", O_RDONLY | O_DIRECTORY);
  return RawAbi(abi, NR("open_by_handle_at"), root, (long)&s_handle, O_RDONLY, 0, 0, 0);
}
static long AttemptIopl(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("iopl"), 3, 0, 0, 0, 0, 0);
}
static long AttemptIoperm(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("ioperm"), 0x80, 1, 1, 0, 0, 0);
}
static long AttemptSwapon(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("swapon"), (long)s_swap, 0, 0, 0, 0, 0);
}
static long AttemptAcct(enum Abi abi, long a) {
  (void)a;
  return RawAbi(abi, NR("acct"), 0, 0, 0, 0, 0, 0);
}
static long AttemptSettimeofday(enum Abi abi, long a) {
  (void)a;  // a NULL time and NULL zone: a no-op where allowed
  return RawAbi(abi, NR("settimeofday"), 0, 0, 0, 0, 0, 0);
}
// ioctl on stdin (a pipe): the kernel answers ENOTTY, the filter EPERM.
static long AttemptIoctl(enum Abi abi, long cmd) { return RawAbi(abi, NR("ioctl"), 0, cmd, 0, 0, 0, 0); }
static long AttemptSocket(enum Abi abi, long family) {
  return RawAbi(abi, NR("socket"), family, SOCK_STREAM, 0, 0, 0, 0);
}
static long AttemptSocketcallVsock(enum Abi abi, long a) {
  (void)a;
  s_sockcall_args[0] = AF_VSOCK;
  s_sockcall_args[1] = SOCK_STREAM;
  s_sockcall_args[2] = 0;
  return RawAbi(abi, NR("socketcall"), 1 /* SYS_SOCKET */, (long)s_sockcall_args, 0, 0, 0, 0);
}

struct AbiCase {
  const char* name;  // printed as abi-<abi>:<name>
  const char* sys;   // syscall (to tell whether the ABI has it)
  AttemptFn fn;
  long arg;
  const char* expect;  // what the seccomp profile answers (errno name), or "kernel" (no rule: caps/kernel deny)
};

static const struct AbiCase kAbiCases[] = {
    {"mount", "mount", AttemptMount, 0, "EPERM"},
    {"umount", "umount", AttemptUmount, 0, "EPERM"},
    {"umount2", "umount2", AttemptUmount2, 0, "EPERM"},
    {"pivot_root", "pivot_root", AttemptPivotRoot, 0, "EPERM"},
    {"move_mount", "move_mount", AttemptMoveMount, 0, "EPERM"},
    {"open_tree", "open_tree", AttemptOpenTree, 0, "EPERM"},
    {"fsopen", "fsopen", AttemptFsopen, 0, "EPERM"},
    {"fsconfig", "fsconfig", AttemptFsconfig, 0, "EPERM"},
    {"fsmount", "fsmount", AttemptFsmount, 0, "EPERM"},
    {"fspick", "fspick", AttemptFspick, 0, "EPERM"},
    {"mount_setattr", "mount_setattr", AttemptMountSetattr, 0, "EPERM"},
    {"unshare-newuser", "unshare", AttemptUnshare, CLONE_NEWUSER, "EPERM"},
    {"unshare-newuser-newns", "unshare", AttemptUnshare, CLONE_NEWUSER | CLONE_NEWNS, "EPERM"},
    {"unshare-newns", "unshare", AttemptUnshare, CLONE_NEWNS, "kernel"},
    {"unshare-newnet", "unshare", AttemptUnshare, CLONE_NEWNET, "kernel"},
    {"unshare-newpid", "unshare", AttemptUnshare, CLONE_NEWPID, "kernel"},
    {"unshare-newuts", "unshare", AttemptUnshare, CLONE_NEWUTS, "kernel"},
    {"unshare-newipc", "unshare", AttemptUnshare, CLONE_NEWIPC, "kernel"},
    {"unshare-newcgroup", "unshare", AttemptUnshare, CLONE_NEWCGROUP, "kernel"},
    {"unshare-newtime", "unshare", AttemptUnshare, CLONE_NEWTIME, "kernel"},
    {"clone-newuser", "clone", AttemptClone, CLONE_NEWUSER, "EPERM"},
    {"clone-newns", "clone", AttemptClone, CLONE_NEWNS, "kernel"},
    {"clone-newnet", "clone", AttemptClone, CLONE_NEWNET, "kernel"},
    {"clone-newpid", "clone", AttemptClone, CLONE_NEWPID, "kernel"},
    {"clone3-newuser", "clone3", AttemptClone3, CLONE_NEWUSER, "ENOSYS"},
    {"clone3-newns", "clone3", AttemptClone3, CLONE_NEWNS, "ENOSYS"},
    {"setns", "setns", AttemptSetns, 0, "EPERM"},
    {"add_key", "add_key", AttemptAddKey, 0, "EPERM"},
    {"request_key", "request_key", AttemptRequestKey, 0, "EPERM"},
    {"keyctl", "keyctl", AttemptKeyctl, 0, "EPERM"},
    {"bpf", "bpf", AttemptBpf, 0, "EPERM"},
    {"perf_event_open", "perf_event_open", AttemptPerf, 0, "EPERM"},
    {"userfaultfd", "userfaultfd", AttemptUserfaultfd, 0, "EPERM"},
    {"io_uring_setup", "io_uring_setup", AttemptIoUringSetup, 0, "ENOSYS"},
    {"io_uring_enter", "io_uring_enter", AttemptIoUringEnter, 0, "ENOSYS"},
    {"io_uring_register", "io_uring_register", AttemptIoUringRegister, 0, "ENOSYS"},
    {"init_module", "init_module", AttemptInitModule, 0, "EPERM"},
    {"finit_module", "finit_module", AttemptFinitModule, 0, "EPERM"},
    {"delete_module", "delete_module", AttemptDeleteModule, 0, "EPERM"},
    {"kexec_load", "kexec_load", AttemptKexecLoad, 0, "EPERM"},
    {"kexec_file_load", "kexec_file_load", AttemptKexecFileLoad, 0, "EPERM"},
    {"reboot", "reboot", AttemptReboot, 0, "EPERM"},
    {"syslog", "syslog", AttemptSyslog, 0, "EPERM"},
    {"open_by_handle_at", "open_by_handle_at", AttemptOpenByHandle, 0, "EPERM"},
    {"iopl", "iopl", AttemptIopl, 0, "EPERM"},
    {"ioperm", "ioperm", AttemptIoperm, 0, "EPERM"},
    {"swapon", "swapon", AttemptSwapon, 0, "EPERM"},
    {"acct", "acct", AttemptAcct, 0, "EPERM"},
    {"settimeofday", "settimeofday", AttemptSettimeofday, 0, "EPERM"},
    {"ioctl-ext4-move-ext", "ioctl", AttemptIoctl, 0xc028660f, "EPERM"},
    {"ioctl-xfs-swapext", "ioctl", AttemptIoctl, 0xc0c0586d, "EPERM"},
    {"ioctl-xfs-exchange-range", "ioctl", AttemptIoctl, 0x40285881, "EPERM"},
    {"ioctl-tiocsti", "ioctl", AttemptIoctl, 0x5412, "EPERM"},
    {"ioctl-tioclinux", "ioctl", AttemptIoctl, 0x541c, "EPERM"},
#if defined(__x86_64__)
    // The kernel truncates ioctl's cmd to 32 bits: a sign-extended cmd must not slip past.
    {"ioctl-ext4-move-ext-highbits", "ioctl", AttemptIoctl, (long)0xffffffffc028660fUL, "EPERM"},
    {"ioctl-tiocsti-highbits", "ioctl", AttemptIoctl, (long)0xffffffff00005412UL, "EPERM"},
#endif
    {"socket-vsock", "socket", AttemptSocket, AF_VSOCK, "EAFNOSUPPORT"},
    {"socketcall-vsock", "socketcall", AttemptSocketcallVsock, 0, "EAFNOSUPPORT"},
};

static const char* AbiName(enum Abi abi) {
#if defined(__i386__)
  (void)abi;
  return "m32";
#else
  return abi == kNative ? "x86_64" : abi == kI386 ? "i386" : "x32";
#endif
}

// Blocked: failed with an errno, or killed (SIGSYS). The expected errno is
// printed for the test to compare (expect=).
static int CmdAbi(const char* which) {
  enum Abi abi = kNative;
#if defined(__x86_64__)
  if (strcmp(which, "i386") == 0)
    abi = kI386;
  else if (strcmp(which, "x32") == 0)
    abi = kX32;
  else if (strcmp(which, "x86_64") != 0) {
    fprintf(stderr, "probe abi: unknown ABI %s\n", which);
    return 2;
  }
#else
  (void)which;
#endif
  for (size_t i = 0; i < sizeof kAbiCases / sizeof kAbiCases[0]; ++i) {
    const struct AbiCase* c = &kAbiCases[i];
    char name[128], extra[160];
    snprintf(name, sizeof name, "abi-%s:%s", AbiName(abi), c->name);
    if (NrOf(c->sys, abi) < 0) {
      Skip(name, "no-such-syscall-on-this-abi");
      continue;
    }
    struct Outcome o = InChild(c->fn, abi, c->arg);
    if (o.signal != 0) {
      snprintf(extra, sizeof extra, "expect=%s signal=%d", c->expect, o.signal);
      Report(name, 0, 0, extra);
    } else {
      snprintf(extra, sizeof extra, "expect=%s ret=%ld", c->expect, o.ret);
      Report(name, o.ret >= 0, o.ret < 0 ? (int)-o.ret : 0, extra);
    }
  }
  return 0;
}

// ---------------------------------------------------------------- files under /proc and /sys

// Opens path for writing; never writes. A masked path (bind of /dev/null) or
// a failed open is blocked.
static void TryWriteOpen(const char* name, const char* path) {
  int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    Report(name, 0, errno, "");
    return;
  }
  struct stat st;
  fstat(fd, &st);
  close(fd);
  if (S_ISCHR(st.st_mode) && major(st.st_rdev) == 1 && minor(st.st_rdev) == 3) {
    Report(name, 0, 0, "masked=/dev/null");
    return;
  }
  char extra[64];
  snprintf(extra, sizeof extra, "opened_for_write=1 mode=%o", st.st_mode);
  Report(name, 1, 0, extra);
}

static int CmdWrite(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    char name[512];
    snprintf(name, sizeof name, "write:%s", argv[i]);
    TryWriteOpen(name, argv[i]);
  }
  return 0;
}

// Reads up to 4 KiB of path. Blocked if the open/read fails or reads nothing
// (a masked file reads as /dev/null or an empty dir).
static int CmdRead(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    char name[512], extra[128];
    snprintf(name, sizeof name, "read:%s", argv[i]);
    int fd = open(argv[i], O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      Report(name, 0, errno, "");
      continue;
    }
    struct stat st;
    fstat(fd, &st);
    if (S_ISDIR(st.st_mode)) {
      DIR* d = fdopendir(fd);
      int n = 0;
      errno = 0;
      struct dirent* e;
      while (d && (e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) ++n;
      int err = errno;
      if (d) closedir(d);
      snprintf(extra, sizeof extra, "entries=%d", n);
      Report(name, n > 0, err, extra);
      continue;
    }
    char buf[4096];
    ssize_t n = pread(fd, buf, sizeof buf, 0);
    int err = n < 0 ? errno : 0;
    close(fd);
    snprintf(extra, sizeof extra, "bytes=%zd", n);
    Report(name, n > 0, err, extra);
  }
  return 0;
}

// readlink: blocked if it fails.
static int CmdReadlink(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    char name[512], buf[512], extra[600];
    snprintf(name, sizeof name, "readlink:%s", argv[i]);
    ssize_t n = readlink(argv[i], buf, sizeof buf - 1);
    if (n < 0) {
      Report(name, 0, errno, "");
      continue;
    }
    buf[n] = '\0';
    snprintf(extra, sizeof extra, "target=%s", buf);
    Report(name, 1, 0, extra);
  }
  return 0;
}

// ---------------------------------------------------------------- pid 1 and the pids we can see

static int CmdPtracePid1(void) {
  long r = syscall(SYS_ptrace, 16 /* PTRACE_ATTACH */, 1, 0, 0);
  Report("ptrace-attach-pid1", r == 0, r == 0 ? 0 : errno, "");
  if (r == 0) syscall(SYS_ptrace, 17 /* PTRACE_DETACH */, 1, 0, 0);
  r = syscall(SYS_ptrace, 0x4206 /* PTRACE_SEIZE */, 1, 0, 0);
  Report("ptrace-seize-pid1", r == 0, r == 0 ? 0 : errno, "");
  if (r == 0) syscall(SYS_ptrace, 17, 1, 0, 0);
  char buf[64];
  struct iovec local = {buf, sizeof buf}, remote = {(void*)0x400000, sizeof buf};
  ssize_t n = process_vm_readv(1, &local, 1, &remote, 1, 0);
  Report("process_vm_readv-pid1", n >= 0, n >= 0 ? 0 : errno, "");
  int pfd = (int)syscall(SYS_pidfd_open, 1, 0);
  if (pfd < 0) {
    Report("pidfd_getfd-pid1", 0, errno, "step=pidfd_open");
  } else {
    long fd = syscall(438 /* pidfd_getfd */, pfd, 0, 0);
    Report("pidfd_getfd-pid1", fd >= 0, fd >= 0 ? 0 : errno, "");
  }
  return 0;
}

static char ProcState(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return '?';
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return '?';
  buf[n] = '\0';
  char* p = strrchr(buf, ')');
  return p && p[1] && p[2] ? p[2] : '?';
}

// PID 1's fds: listing /proc/1/fd shows only numbers (the directory belongs
// to the sandbox's root); opening or resolving an entry, or reading its
// fdinfo, needs ptrace access to the non-dumpable init and must fail.
static int CmdPid1Fds(void) {
  int listed = 0, opened = 0, last = 0;
  DIR* d = opendir("/proc/1/fd");
  struct dirent* e;
  while (d && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    ++listed;
    char path[300], buf[300];
    snprintf(path, sizeof path, "/proc/1/fd/%s", e->d_name);
    static const int kFlags[] = {O_RDONLY, O_WRONLY, O_PATH, O_RDONLY | O_DIRECTORY};
    for (size_t i = 0; i < sizeof kFlags / sizeof kFlags[0]; ++i) {
      int fd = open(path, kFlags[i] | O_CLOEXEC | O_NONBLOCK);
      if (fd >= 0) {
        ++opened;
        printf("opened=%s flags=%o\n", path, kFlags[i]);
        close(fd);
      } else {
        last = errno;
      }
    }
    ssize_t n = readlink(path, buf, sizeof buf - 1);
    if (n >= 0) {
      buf[n] = '\0';
      ++opened;
      printf("readlink=%s target=%s\n", path, buf);
    }
    snprintf(path, sizeof path, "/proc/1/fdinfo/%s", e->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      n = read(fd, buf, sizeof buf);
      if (n > 0) {
        ++opened;
        printf("read=%s\n", path);
      }
      close(fd);
    }
  }
  if (d) closedir(d);
  char extra[64];
  snprintf(extra, sizeof extra, "listed=%d opened=%d", listed, opened);
  Report("pid1-fds", opened > 0, last, extra);
  return 0;
}

// Every signal 1..31 (SIGKILL and SIGSTOP included) to PID 1, three times;
// PID 1 must still run (not stopped, not gone).
static int CmdSignalPid1(void) {
  int sent = 0, refused = 0;
  for (int round = 0; round < 3; ++round) {
    for (int sig = 1; sig <= 31; ++sig) {
      if (kill(1, sig) == 0)
        ++sent;
      else
        ++refused;
    }
  }
  struct timespec ts = {0, 300 * 1000 * 1000};
  nanosleep(&ts, NULL);
  char st = ProcState(1);
  int alive = kill(1, 0) == 0;
  char extra[96];
  snprintf(extra, sizeof extra, "sent=%d refused=%d pid1_state=%c", sent, refused, st);
  // "ALLOWED" means a signal took effect: PID 1 is gone or stopped.
  Report("signal-pid1", !alive || st == 'T' || st == 't' || st == 'Z' || st == 'X', 0, extra);
  return 0;
}

// Every process we can see, with its uid and comm (diagnostics).
static int CmdPs(void) {
  DIR* d = opendir("/proc");
  struct dirent* e;
  while (d && (e = readdir(d)) != NULL) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char path[300], comm[64] = "?";
    snprintf(path, sizeof path, "/proc/%s/comm", e->d_name);
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
      ssize_t n = read(fd, comm, sizeof comm - 1);
      comm[n > 0 ? n : 0] = '\0';
      if (n > 0 && comm[n - 1] == '\n') comm[n - 1] = '\0';
      close(fd);
    }
    snprintf(path, sizeof path, "/proc/%s", e->d_name);
    struct stat st;
    if (stat(path, &st) != 0) continue;
    printf("pid=%s uid=%u comm=%s\n", e->d_name, st.st_uid, comm);
  }
  if (d) closedir(d);
  return 0;
}

// setns into the namespaces of every process we can see, through
// /proc/<pid>/ns/*. Blocked if every setns fails.
static int CmdSetnsProc(void) {
  const char* kinds[] = {"user", "mnt", "net", "pid", "uts", "ipc", "cgroup", "time"};
  int tried = 0, ok = 0, last = 0;
  DIR* d = opendir("/proc");
  struct dirent* e;
  while (d && (e = readdir(d)) != NULL) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; ++k) {
      char path[300];
      snprintf(path, sizeof path, "/proc/%s/ns/%s", e->d_name, kinds[k]);
      int fd = open(path, O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      ++tried;
      if (setns(fd, 0) == 0)
        ++ok;
      else
        last = errno;
      close(fd);
    }
  }
  if (d) closedir(d);
  char extra[64];
  snprintf(extra, sizeof extra, "tried=%d succeeded=%d", tried, ok);
  Report("setns-proc-ns", ok > 0, last, extra);
  return 0;
}

// The host marker (a file the test made on the host) through /proc/<pid>/root
// and /proc/<pid>/cwd of every process we can see.
static int CmdProcRoot(const char* marker) {
  int tried = 0, seen = 0, last = 0;
  DIR* d = opendir("/proc");
  struct dirent* e;
  while (d && (e = readdir(d)) != NULL) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    for (int w = 0; w < 2; ++w) {
      char path[1200];
      snprintf(path, sizeof path, "/proc/%s/%s%s", e->d_name, w ? "cwd/../../../../../../../../.." : "root", marker);
      ++tried;
      if (access(path, F_OK) == 0)
        ++seen;
      else
        last = errno;
    }
  }
  if (d) closedir(d);
  char extra[64];
  snprintf(extra, sizeof extra, "tried=%d seen=%d", tried, seen);
  Report("proc-root-marker", seen > 0, last, extra);
  return 0;
}

// ---------------------------------------------------------------- devices

static int CmdDevices(void) {
  struct {
    const char* name;
    mode_t type;
    int maj, min;
  } nodes[] = {{"mknod-blk-sda", S_IFBLK, 8, 0},     {"mknod-blk-vda", S_IFBLK, 254, 0},
               {"mknod-blk-loop0", S_IFBLK, 7, 0},   {"mknod-chr-mem", S_IFCHR, 1, 1},
               {"mknod-chr-kmem", S_IFCHR, 1, 2},    {"mknod-chr-port", S_IFCHR, 1, 4},
               {"mknod-chr-kmsg", S_IFCHR, 1, 11},   {"mknod-chr-kvm", S_IFCHR, 10, 232},
               {"mknod-chr-fuse", S_IFCHR, 10, 229}, {"mknod-chr-tun", S_IFCHR, 10, 200}};
  for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; ++i) {
    char path[128];
    snprintf(path, sizeof path, "/tmp/.probe-%s", nodes[i].name);
    unlink(path);
    if (mknod(path, nodes[i].type | 0600, makedev(nodes[i].maj, nodes[i].min)) != 0) {
      Report(nodes[i].name, 0, errno, "");
      continue;
    }
    // Made: can it be opened (a nodev mount would still refuse)?
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    char extra[64];
    snprintf(extra, sizeof extra, "created=1 opened=%d", fd >= 0);
    Report(nodes[i].name, 1, fd >= 0 ? 0 : errno, extra);
    if (fd >= 0) close(fd);
    unlink(path);
  }
  const char* devs[] = {"/dev/mem",     "/dev/kmem", "/dev/port",           "/dev/kmsg",          "/dev/sda",
                        "/dev/vda",     "/dev/xvda", "/dev/nvme0n1",        "/dev/loop0",         "/dev/loop-control",
                        "/dev/kvm",     "/dev/fuse", "/dev/net/tun",        "/dev/vsock",         "/dev/vhost-vsock",
                        "/dev/console", "/dev/tty0", "/dev/mapper/control", "/dev/btrfs-control", "/dev/cpu/0/msr",
                        "/dev/watchdog"};
  for (size_t i = 0; i < sizeof devs / sizeof devs[0]; ++i) {
    char name[128];
    snprintf(name, sizeof name, "open:%s", devs[i]);
    int fd = open(devs[i], O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    Report(name, fd >= 0, fd >= 0 ? 0 : errno, "");
    if (fd >= 0) close(fd);
  }
  return 0;
}

// ---------------------------------------------------------------- sockets

static int CmdSockets(void) {
  struct {
    const char* name;
    int family, type, proto;
  } socks[] = {
      {"socket-packet-raw", AF_PACKET, SOCK_RAW, 0x0300 /* htons(ETH_P_ALL) */},
      {"socket-packet-dgram", AF_PACKET, SOCK_DGRAM, 0x0300},
      {"socket-inet-raw", AF_INET, SOCK_RAW, IPPROTO_ICMP},
      {"socket-inet-raw-tcp", AF_INET, SOCK_RAW, IPPROTO_TCP},
      {"socket-inet6-raw", AF_INET6, SOCK_RAW, IPPROTO_ICMPV6},
      {"socket-vsock-stream", AF_VSOCK, SOCK_STREAM, 0},
      {"socket-vsock-dgram", AF_VSOCK, SOCK_DGRAM, 0},
  };
  for (size_t i = 0; i < sizeof socks / sizeof socks[0]; ++i) {
    int fd = socket(socks[i].family, socks[i].type | SOCK_CLOEXEC, socks[i].proto);
    Report(socks[i].name, fd >= 0, fd >= 0 ? 0 : errno, "");
    if (fd >= 0) close(fd);
  }
  // Netlink audit: the socket may exist (audit is per netns), but the kernel
  // must refuse every request from a non-initial user/pid namespace.
  int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_AUDIT);
  if (fd < 0) {
    Report("netlink-audit-get", 0, errno, "step=socket");
    Report("netlink-audit-user-msg", 0, errno, "step=socket");
  } else {
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    for (int which = 0; which < 2; ++which) {
      struct {
        struct nlmsghdr h;
        char body[64];
      } req;
      memset(&req, 0, sizeof req);
      req.h.nlmsg_type = which == 0 ? AUDIT_GET : AUDIT_USER;
      req.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
      req.h.nlmsg_seq = 1 + which;
      if (which == 1) strcpy(req.body, "warren-probe forged audit record");
      req.h.nlmsg_len = NLMSG_LENGTH(which == 1 ? strlen(req.body) + 1 : 0);
      const char* name = which == 0 ? "netlink-audit-get" : "netlink-audit-user-msg";
      if (sendto(fd, &req, req.h.nlmsg_len, 0, (struct sockaddr*)&kernel, sizeof kernel) < 0) {
        Report(name, 0, errno, "step=sendto");
        continue;
      }
      char buf[8192];
      ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n < 0) {
        Report(name, 0, errno, "step=recv");
        continue;
      }
      struct nlmsghdr* h = (struct nlmsghdr*)buf;
      if (h->nlmsg_type == NLMSG_ERROR) {
        int err = -((struct nlmsgerr*)NLMSG_DATA(h))->error;
        Report(name, err == 0, err, "step=ack");
      } else {
        Report(name, 1, 0, "step=reply");
      }
    }
    close(fd);
  }
  return 0;
}

static int CmdUnixConnect(const char* name, const char* path, int abstract) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  socklen_t len;
  if (abstract) {
    a.sun_path[0] = '\0';
    strncpy(a.sun_path + 1, path, sizeof a.sun_path - 2);
    len = offsetof(struct sockaddr_un, sun_path) + 1 + strlen(path);
  } else {
    strncpy(a.sun_path, path, sizeof a.sun_path - 1);
    len = sizeof a;
  }
  int r = connect(fd, (struct sockaddr*)&a, len);
  Report(name, r == 0, r == 0 ? 0 : errno, "");
  close(fd);
  return 0;
}

static int CmdTcpConnect(const char* ip, int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, ip, &a.sin_addr);
  struct timeval tv = {3, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int r = connect(fd, (struct sockaddr*)&a, sizeof a);
  char name[128];
  snprintf(name, sizeof name, "tcp-connect:%s:%d", ip, port);
  Report(name, r == 0, r == 0 ? 0 : errno, "");
  close(fd);
  return 0;
}

// ---------------------------------------------------------------- cgroups

static int s_cg_tried, s_cg_writable;
static void CgWalk(const char* dir, int depth) {
  if (depth > 6) return;
  DIR* d = opendir(dir);
  if (!d) return;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat st;
    if (lstat(path, &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      CgWalk(path, depth + 1);
      continue;
    }
    static const char* kFiles[] = {"cgroup.procs",
                                   "tasks",
                                   "release_agent",
                                   "notify_on_release",
                                   "memory.max",
                                   "memory.limit_in_bytes",
                                   "memory.memsw.limit_in_bytes",
                                   "pids.max",
                                   "cpu.max",
                                   "cpu.cfs_quota_us",
                                   "cgroup.subtree_control",
                                   "freezer.state",
                                   "cgroup.freeze",
                                   "cgroup.kill",
                                   "devices.allow",
                                   "cgroup.clone_children"};
    for (size_t i = 0; i < sizeof kFiles / sizeof kFiles[0]; ++i) {
      if (strcmp(e->d_name, kFiles[i]) != 0) continue;
      ++s_cg_tried;
      int fd = open(path, O_WRONLY | O_CLOEXEC);
      if (fd >= 0) {
        ++s_cg_writable;
        printf("cgroup-writable=%s\n", path);
        close(fd);
      }
    }
  }
  closedir(d);
}

static int CmdCgroup(void) {
  // Every cgroup file system mounted in our view, and /sys/fs/cgroup.
  int mounts = 0;
  FILE* mi = fopen("/proc/self/mountinfo", "r");
  char l[2048];
  while (mi && fgets(l, sizeof l, mi)) {
    char* sep = strstr(l, " - ");
    if (!sep || (strncmp(sep + 3, "cgroup ", 7) != 0 && strncmp(sep + 3, "cgroup2 ", 8) != 0)) continue;
    ++mounts;
    char mp[1024];
    if (sscanf(l, "%*s %*s %*s %*s %1023s", mp) == 1) CgWalk(mp, 0);
  }
  if (mi) fclose(mi);
  CgWalk("/sys/fs/cgroup", 0);
  char extra[96];
  snprintf(extra, sizeof extra, "cgroup_mounts=%d files_tried=%d writable=%d", mounts, s_cg_tried, s_cg_writable);
  Report("cgroup-files-write", s_cg_writable > 0, 0, extra);
  // Mounting a cgroup hierarchy of our own (v1 with a release_agent, v2).
  mkdir("/tmp/.probe-cg", 0755);
  int r = mount("cgroup", "/tmp/.probe-cg", "cgroup", 0, "memory,release_agent=/tmp/x");
  Report("cgroup-v1-mount-release-agent", r == 0, r == 0 ? 0 : errno, "");
  if (r == 0) umount2("/tmp/.probe-cg", MNT_DETACH);
  r = mount("cgroup2", "/tmp/.probe-cg", "cgroup2", 0, NULL);
  Report("cgroup-v2-mount", r == 0, r == 0 ? 0 : errno, "");
  if (r == 0) umount2("/tmp/.probe-cg", MNT_DETACH);
  // Our own cgroup, as /proc/self/cgroup names it, through /sys/fs/cgroup.
  FILE* f = fopen("/proc/self/cgroup", "r");
  char line[1024];
  while (f && fgets(line, sizeof line, f)) {
    char* p = strrchr(line, ':');
    if (!p) continue;
    p[strcspn(p, "\n")] = '\0';
    printf("own-cgroup=%s\n", line);
  }
  if (f) fclose(f);
  return 0;
}

// ---------------------------------------------------------------- file-clone ioctls

// As a non-root user: FICLONE/FICLONERANGE from a file we may not read (opened
// O_PATH) into one we own; EXT4_IOC_SWAP_BOOT on our own file.
static int CmdClone(const char* secret) {
  int dst = open("/tmp/.probe-clone-dst", O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0600);
  if (dst < 0) {
    Report("ficlone-unreadable", 0, errno, "step=open-dst");
    return 0;
  }
  int rd = open(secret, O_RDONLY | O_CLOEXEC);
  printf("secret-readable=%d\n", rd >= 0);
  int src = open(secret, O_PATH | O_CLOEXEC);
  if (src < 0) {
    Report("ficlone-unreadable", 0, errno, "step=open-src-opath");
  } else {
    int r = ioctl(dst, 0x40049409 /* FICLONE */, src);
    Report("ficlone-unreadable", r == 0, r == 0 ? 0 : errno, "");
    struct {
      int64_t src_fd;
      uint64_t src_offset, src_length, dest_offset;
    } range = {src, 0, 0, 0};
    r = ioctl(dst, 0x4020940d /* FICLONERANGE */, &range);
    Report("ficlonerange-unreadable", r == 0, r == 0 ? 0 : errno, "");
  }
  char buf[64];
  ssize_t n = pread(dst, buf, sizeof buf, 0);
  printf("dst-bytes=%zd\n", n);
  int r = ioctl(dst, 0x6611 /* EXT4_IOC_SWAP_BOOT */, 0);
  Report("ioctl-ext4-swap-boot", r == 0, r == 0 ? 0 : errno, "");
  unlink("/tmp/.probe-clone-dst");
  return 0;
}

// ---------------------------------------------------------------- chroot

// The classic chroot escape: chroot into a subdir while holding a directory
// fd outside it, fchdir out, climb "..", chroot("."). It may only ever reach
// the sandbox's own root: the host marker must stay invisible.
static int CmdChroot(const char* marker) {
  struct stat root0;
  stat("/", &root0);
  int outside = open("/", O_RDONLY | O_DIRECTORY);
  mkdir("/tmp/.probe-chroot", 0755);
  if (chroot("/tmp/.probe-chroot") != 0) {
    Report("chroot-escape", 0, errno, "step=chroot");
    return 0;
  }
  if (fchdir(outside) != 0) {
    Report("chroot-escape", 0, errno, "step=fchdir");
    return 0;
  }
  for (int i = 0; i < 256; ++i) (void)chdir("..");
  if (chroot(".") != 0) {
    Report("chroot-escape", 0, errno, "step=chroot-dot");
    return 0;
  }
  (void)chdir("/");
  struct stat root1;
  stat("/", &root1);
  int seen = access(marker, F_OK) == 0;
  char extra[160];
  snprintf(extra, sizeof extra, "marker_seen=%d same_root=%d", seen,
           root0.st_dev == root1.st_dev && root0.st_ino == root1.st_ino);
  Report("chroot-escape", seen, seen ? 0 : errno, extra);
  return 0;
}

// ---------------------------------------------------------------- capabilities

// Prints case=caps CapInh=.. CapPrm=.. CapEff=.. CapBnd=.. CapAmb=.. Uid=..
// NoNewPrivs=.. from /proc/self/status.
static int CmdCaps(void) {
  FILE* f = fopen("/proc/self/status", "r");
  char line[256], out[512] = "";
  while (f && fgets(line, sizeof line, f)) {
    if (strncmp(line, "Cap", 3) != 0 && strncmp(line, "Uid:", 4) != 0 && strncmp(line, "NoNewPrivs:", 11) != 0)
      continue;
    line[strcspn(line, "\n")] = '\0';
    char* colon = strchr(line, ':');
    char* v = colon + 1;
    while (*v == '\t' || *v == ' ') ++v;
    *colon = '\0';
    for (char* p = v; *p; ++p)
      if (*p == '\t' || *p == ' ') *p = ',';
    char kv[300];
    snprintf(kv, sizeof kv, " %s=%s", line, v);
    strncat(out, kv, sizeof out - strlen(out) - 1);
  }
  if (f) fclose(f);
  printf("case=caps%s\n", out);
  return 0;
}

// Gives path the file capability cap_dac_override+ep (a v2
// security.capability xattr; the kernel stores it as v3 rooted in our user
// namespace), as `setcap cap_dac_override+ep` would. (A capability outside the
// bounding set, such as cap_net_raw, would make execve fail with EPERM.)
static int CmdSetcap(const char* path) {
  struct {
    uint32_t magic_etc;
    struct {
      uint32_t permitted, inheritable;
    } data[2];
  } cap = {0x02000000 | 1 /* VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE */,
           {{1u << 1, 0}, {0, 0}}};  // CAP_DAC_OVERRIDE
  int r = setxattr(path, "security.capability", &cap, sizeof cap, 0);
  Report("setcap", r == 0, r == 0 ? 0 : errno, "");  // (success is what the caller wants here)
  return r == 0 ? 0 : 1;
}

// ---------------------------------------------------------------- signals to everything we can see

// Signals 1..31 but SIGKILL, the ones a daemon catches (TERM, INT) first:
// several signals pending at once are delivered lowest number first.
static const int kStormSignals[] = {SIGTERM, SIGINT,    SIGSTOP, SIGTSTP,  SIGHUP,  SIGQUIT,  SIGUSR1, SIGUSR2,
                                    SIGPIPE, SIGALRM,   SIGCHLD, SIGCONT,  SIGTTIN, SIGTTOU,  SIGURG,  SIGXCPU,
                                    SIGXFSZ, SIGVTALRM, SIGPROF, SIGWINCH, SIGIO,   SIGPWR,   SIGSYS,  SIGILL,
                                    SIGTRAP, SIGABRT,   SIGBUS,  SIGFPE,   SIGSEGV, SIGSTKFLT};

static long SignalAll(pid_t pid) {
  long sent = 0;
  for (size_t i = 0; i < sizeof kStormSignals / sizeof kStormSignals[0]; ++i)
    if (kill(pid, kStormSignals[i]) == 0) ++sent;
  return sent;
}

static pid_t LastPid(int fd) {
  char buf[32];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return 0;
  buf[n] = '\0';
  return (pid_t)atoi(buf);
}

// For `seconds`, every process the sandbox can see gets every signal 1..31
// but SIGKILL (SIGSTOP, SIGTSTP, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1...
// included), except the probe's own processes. Worker 0 walks /proc in a
// tight loop; the others spray the newest pid of the namespace and the next
// one (/proc/sys/kernel/ns_last_pid + 0..1), which catches processes that
// live only microseconds: SIGTERM, SIGINT and SIGSTOP on most passes, every
// signal on every 16th.
static int CmdSignalStorm(double seconds, int workers) {
  pid_t ours[17];
  int nours = 0;
  ours[nours++] = getpid();
  int go[16][2];
  if (workers > 16) workers = 16;
  for (int w = 0; w < workers; ++w) {
    if (pipe(go[w]) != 0) return 1;
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
      for (int s = 1; s <= 31; ++s)
        if (s != SIGKILL && s != SIGSTOP) signal(s, SIG_IGN);
      // The pids of every worker, from the parent, before the first signal.
      close(go[w][1]);
      int n = (int)read(go[w][0], ours, sizeof ours);
      nours = n > 0 ? n / (int)sizeof(pid_t) : 0;
      struct timespec t0, t;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      long sent = 0, passes = 0, foreign = 0;
      int dfd = open("/proc", O_RDONLY | O_DIRECTORY);
      int lastfd = open("/proc/sys/kernel/ns_last_pid", O_RDONLY);
      char buf[16384];
      for (;;) {
        if ((passes & 63) == 0) {
          clock_gettime(CLOCK_MONOTONIC, &t);
          if ((double)(t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 > seconds) break;
        }
        ++passes;
        if (w > 0 && lastfd >= 0) {
          pid_t last = LastPid(lastfd);
          // The newest pids get the signals a daemon catches first, at the
          // highest rate; every 16th pass all of them.
          for (pid_t pid = last; pid <= last + 1; ++pid) {
            int mine = 0;
            for (int k = 0; k < nours; ++k) mine |= ours[k] == pid;
            if (mine) continue;
            long n = 0;
            if ((passes & 15) == 0) {
              n = SignalAll(pid);
            } else {
              n += kill(pid, SIGTERM) == 0;
              n += kill(pid, SIGINT) == 0;
              n += kill(pid, SIGSTOP) == 0;
            }
            sent += n;
            if (n > 0) ++foreign;
          }
          continue;
        }
        lseek(dfd, 0, SEEK_SET);
        long nb;
        while ((nb = syscall(SYS_getdents64, dfd, buf, sizeof buf)) > 0) {
          for (long off = 0; off < nb;) {
            struct Dirent64 {
              uint64_t ino;
              int64_t off;
              unsigned short reclen;
              unsigned char type;
              char name[];
            }* de = (struct Dirent64*)(buf + off);
            off += de->reclen;
            if (de->name[0] < '1' || de->name[0] > '9') continue;
            pid_t pid = (pid_t)atoi(de->name);
            int mine = 0;
            for (int k = 0; k < nours; ++k) mine |= ours[k] == pid;
            if (mine) continue;
            sent += SignalAll(pid);
            if (pid != 1) ++foreign;
          }
        }
      }
      printf("worker=%d passes=%ld signals_sent=%ld signalled_other_than_pid1=%ld\n", w, passes, sent, foreign);
      fflush(stdout);
      _exit(0);
    }
    close(go[w][0]);
    ours[nours++] = pid;
  }
  for (int s = 1; s <= 31; ++s)
    if (s != SIGKILL && s != SIGSTOP && s != SIGCHLD) signal(s, SIG_IGN);
  for (int w = 0; w < workers; ++w) {
    (void)!write(go[w][1], ours, nours * sizeof(pid_t));
    close(go[w][1]);
  }
  for (int w = 1; w <= workers; ++w) waitpid(ours[w], NULL, 0);
  printf("case=signal-storm result=done\n");
  return 0;
}

// ---------------------------------------------------------------- file API races

// Swaps dir/a (a directory) and dir/b (a symlink to `target`) with
// renameat2(RENAME_EXCHANGE) in a tight loop for `seconds`.
static int CmdRaceSwap(const char* dir, const char* target, double seconds) {
  char a[512], b[512];
  snprintf(a, sizeof a, "%s/a", dir);
  snprintf(b, sizeof b, "%s/b", dir);
  unlink(b);
  if (symlink(target, b) != 0) {
    perror("symlink");
    return 1;
  }
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  long swaps = 0;
  for (;;) {
    for (int i = 0; i < 256; ++i)
      if (syscall(SYS_renameat2, AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) == 0) ++swaps;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if ((double)(t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 > seconds) break;
  }
  printf("case=race-swap result=done swaps=%ld\n", swaps);
  return 0;
}

// ---------------------------------------------------------------- overlay metadata forgery

// In dir: tries overlayfs's private xattrs (trusted.overlay.*, user.overlay.*)
// on files and dirs, makes a whiteout (char 0:0) and a symlink to the host
// marker. Prints what the kernel let through; the test then snapshots and
// checks what a sandbox made from the snapshot sees.
static int CmdForge(const char* dir, const char* redirect_to) {
  char f[512], d[512], w[512], l[512];
  snprintf(f, sizeof f, "%s/file", dir);
  snprintf(d, sizeof d, "%s/subdir", dir);
  snprintf(w, sizeof w, "%s/whiteout", dir);
  snprintf(l, sizeof l, "%s/hostlink", dir);
  mkdir(dir, 0755);
  mkdir(d, 0755);
  int fd = open(f, O_CREAT | O_WRONLY | O_TRUNC, 0644);
  if (fd >= 0) {
    (void)!write(fd, "sandbox content\n", 16);
    close(fd);
  }
  struct {
    const char* target;
    const char* name;
    const char* value;
  } xs[] = {
      {d, "trusted.overlay.redirect", redirect_to},
      {d, "trusted.overlay.opaque", "y"},
      {f, "trusted.overlay.metacopy", ""},
      {f, "trusted.overlay.redirect", redirect_to},
      {f, "trusted.overlay.origin", "\x00\xfb\x15\x01"},
      {d, "user.overlay.redirect", redirect_to},
      {d, "user.overlay.opaque", "y"},
      {f, "user.overlay.metacopy", ""},
      {f, "user.overlay.redirect", redirect_to},
      {d, "trusted.overlay.upper", "x"},
  };
  for (size_t i = 0; i < sizeof xs / sizeof xs[0]; ++i) {
    char name[300];
    snprintf(name, sizeof name, "setxattr:%s:%s", xs[i].target == d ? "dir" : "file", xs[i].name);
    int r = setxattr(xs[i].target, xs[i].name, xs[i].value, strlen(xs[i].value), 0);
    Report(name, r == 0, r == 0 ? 0 : errno, "");
  }
  int r = mknod(w, S_IFCHR | 0644, makedev(0, 0));
  Report("mknod-whiteout", r == 0, r == 0 ? 0 : errno, "");
  r = symlink(redirect_to, l);
  printf("symlink-to-host=%d\n", r == 0);
  return 0;
}

// ---------------------------------------------------------------- floods

static int CmdFloodOutput(long long bytes) {
  static char buf[1 << 16];
  memset(buf, 'x', sizeof buf);
  long long done = 0;
  while (done < bytes) {
    ssize_t n = write(1, buf, sizeof buf);
    if (n <= 0) break;
    done += n;
    (void)!write(2, buf, 4096);
  }
  return 0;
}

// Creates up to n empty files in dir (until an error: ENOSPC is the cap).
static int CmdFloodFiles(const char* dir, long n) {
  long made = 0;
  int err = 0;
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
    printf("case=flood-files made=0 errno=%s step=mkdir\n", ErrName(errno));
    return 0;
  }
  for (long i = 0; i < n; ++i) {
    char p[512];
    snprintf(p, sizeof p, "%s/f%ld", dir, i);
    int fd = open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) {
      err = errno;
      break;
    }
    close(fd);
    ++made;
  }
  printf("case=flood-files made=%ld errno=%s\n", made, ErrName(err));
  return 0;
}

// Forks until refused, every child spinning, for `seconds` (then they exit).
static int CmdForkBomb(double seconds) {
  pid_t leader = getpid();
  long made = 0;
  int err = 0;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    clock_gettime(CLOCK_MONOTONIC, &t);
    double el = (double)(t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9;
    if (el > seconds) break;
    pid_t p = fork();
    if (p == 0) {
      for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 > seconds) _exit(0);
        if (getppid() != leader) _exit(0);
      }
    }
    if (p < 0) {
      err = errno;
      struct timespec ts = {0, 10 * 1000 * 1000};
      nanosleep(&ts, NULL);
    } else {
      ++made;
    }
  }
  while (wait(NULL) > 0) {
  }
  printf("case=fork-bomb forks=%ld last_errno=%s\n", made, ErrName(err));
  return 0;
}

// ---------------------------------------------------------------- main

static void Usage(void) {
  fprintf(stderr,
          "usage: probe abi x86_64|i386|x32 | write PATH... | read PATH... | readlink PATH... | ptrace-pid1 |\n"
          "  signal-pid1 | pid1-fds | ps | setns-proc | proc-root MARKER | devices | sockets | unix-abstract NAME |\n"
          "  unix-path PATH | tcp IP PORT | cgroup | clone SECRET | chroot MARKER | caps | setcap PATH |\n"
          "  signal-storm SECONDS WORKERS | race-swap DIR TARGET SECONDS | forge DIR REDIRECT |\n"
          "  flood-output BYTES | flood-files DIR N | fork-bomb SECONDS\n");
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2) {
    Usage();
    return 2;
  }
  const char* c = argv[1];
#define ARGS(n)         \
  if (argc < 2 + (n)) { \
    Usage();            \
    return 2;           \
  }
  if (!strcmp(c, "abi")) {
    ARGS(1);
    return CmdAbi(argv[2]);
  }
  if (!strcmp(c, "write")) return CmdWrite(argc - 2, argv + 2);
  if (!strcmp(c, "read")) return CmdRead(argc - 2, argv + 2);
  if (!strcmp(c, "readlink")) return CmdReadlink(argc - 2, argv + 2);
  if (!strcmp(c, "ptrace-pid1")) return CmdPtracePid1();
  if (!strcmp(c, "signal-pid1")) return CmdSignalPid1();
  if (!strcmp(c, "pid1-fds")) return CmdPid1Fds();
  if (!strcmp(c, "ps")) return CmdPs();
  if (!strcmp(c, "setns-proc")) return CmdSetnsProc();
  if (!strcmp(c, "proc-root")) {
    ARGS(1);
    return CmdProcRoot(argv[2]);
  }
  if (!strcmp(c, "devices")) return CmdDevices();
  if (!strcmp(c, "sockets")) return CmdSockets();
  if (!strcmp(c, "unix-abstract")) {
    ARGS(1);
    return CmdUnixConnect("unix-abstract", argv[2], 1);
  }
  if (!strcmp(c, "unix-path")) {
    ARGS(1);
    return CmdUnixConnect("unix-path", argv[2], 0);
  }
  if (!strcmp(c, "tcp")) {
    ARGS(2);
    return CmdTcpConnect(argv[2], atoi(argv[3]));
  }
  if (!strcmp(c, "cgroup")) return CmdCgroup();
  if (!strcmp(c, "clone")) {
    ARGS(1);
    return CmdClone(argv[2]);
  }
  if (!strcmp(c, "chroot")) {
    ARGS(1);
    return CmdChroot(argv[2]);
  }
  if (!strcmp(c, "caps")) return CmdCaps();
  if (!strcmp(c, "setcap")) {
    ARGS(1);
    return CmdSetcap(argv[2]);
  }
  if (!strcmp(c, "signal-storm")) {
    ARGS(2);
    return CmdSignalStorm(atof(argv[2]), atoi(argv[3]));
  }
  if (!strcmp(c, "race-swap")) {
    ARGS(3);
    return CmdRaceSwap(argv[2], argv[3], atof(argv[4]));
  }
  if (!strcmp(c, "forge")) {
    ARGS(2);
    return CmdForge(argv[2], argv[3]);
  }
  if (!strcmp(c, "flood-output")) {
    ARGS(1);
    return CmdFloodOutput(atoll(argv[2]));
  }
  if (!strcmp(c, "flood-files")) {
    ARGS(2);
    return CmdFloodFiles(argv[2], atol(argv[3]));
  }
  if (!strcmp(c, "fork-bomb")) {
    ARGS(1);
    return CmdForkBomb(atof(argv[2]));
  }
  Usage();
  return 2;
}
