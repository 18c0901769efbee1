// Density, step 1: what each kernel object a warren sandbox holds costs.
//
// For each kind, creates N objects of that kind (held open, like a sandbox
// holds them), reads /proc/meminfo before and after, destroys them, waits
// for the kernel to give the memory back, and prints per-object deltas of
// Slab, SUnreclaim, Percpu, KernelStack, PageTables, AnonPages, their sum
// ("kernel+anon") and of MemAvailable. The host's caches are never dropped
// (the machine is shared): MemAvailable moves with other work, the
// Slab/Percpu/stack/page-table sum much less. Each kind runs --repeat times;
// the median of the "kernel+anon" sum is kept (with its row).
//
// Kinds (objects are held by an fd in this process unless a process is
// needed to keep them):
//   proc          fork()ed child that pause()s (this program is static)
//   init          fork()+exec of warren-init (static, the sandbox's pid 1)
//   userns        user namespace (held by an nsfs fd, its creator exits)
//   netns         network namespace with lo up (nsfs fd)
//   netns_nolo    network namespace, lo left down
//   mntns         copy of this mount namespace, made private (nsfs fd)
//   utsns, ipcns, cgroupns   (nsfs fd)
//   pidns_proc    child in new pid+mount namespaces with its own /proc
//                 mounted (the cost includes the child process: subtract proc)
//   tmpfs         detached tmpfs instance (fsopen/fsmount fd)
//   devpts        detached devpts instance
//   cg_memory, cg_cpu, cg_pids, cg_freezer   one v1 cgroup directory under
//                 this process's own cgroup of that hierarchy
//
// Usage: components [-n 500] [--repeat 3] [--init PATH] [kind ...]
// Needs root. Stops early (and says so) if MemAvailable would drop below
// 8 GiB. Destroys everything it creates, also on failure.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_N 5000
static const long long kFloorKiB = 8LL << 20;  // MemAvailable floor: 8 GiB

struct Obj {
  int fd;
  pid_t pid;
  char path[512];
};

struct Mem {
  long long slab, sunreclaim, percpu, kstack, ptables, anon, avail;
};

static struct Mem ReadMem(void) {
  struct Mem m = {0};
  FILE* f = fopen("/proc/meminfo", "r");
  if (!f) return m;
  char k[64];
  long long v;
  while (fscanf(f, "%63[^:]: %lld kB\n", k, &v) == 2) {
    if (!strcmp(k, "Slab"))
      m.slab = v;
    else if (!strcmp(k, "SUnreclaim"))
      m.sunreclaim = v;
    else if (!strcmp(k, "Percpu"))
      m.percpu = v;
    else if (!strcmp(k, "KernelStack"))
      m.kstack = v;
    else if (!strcmp(k, "PageTables"))
      m.ptables = v;
    else if (!strcmp(k, "AnonPages"))
      m.anon = v;
    else if (!strcmp(k, "MemAvailable"))
      m.avail = v;
  }
  fclose(f);
  return m;
}

// Kernel memory: what no memory cgroup of a sandbox is charged for here.
// AnonPages is left out (other work on the shared machine moves it by
// hundreds of MiB); the held processes' own anonymous memory is read from
// their smaps_rollup instead (OwnAnonKiB).
static long long KernelSum(const struct Mem* m) { return m->slab + m->percpu + m->kstack + m->ptables; }

// Sum of "Anonymous:" of /proc/<pid>/smaps_rollup over the held processes, KiB.
static long long OwnAnonKiB(const pid_t* pids, int n) {
  long long total = 0;
  for (int i = 0; i < n; ++i) {
    if (pids[i] <= 0) continue;
    char p[64], line[256];
    snprintf(p, sizeof p, "/proc/%d/smaps_rollup", pids[i]);
    FILE* f = fopen(p, "r");
    if (!f) continue;
    long long v;
    while (fgets(line, sizeof line, f)) {
      if (sscanf(line, "Anonymous: %lld kB", &v) == 1) total += v;
    }
    fclose(f);
  }
  return total;
}

static const char* g_init = NULL;
static int g_orig_net = -1, g_orig_mnt = -1, g_orig_uts = -1, g_orig_ipc = -1, g_orig_cg = -1;
static char g_cg_base[4][512];  // memory, cpu, pids, freezer: <own>/warren-density-<pid>
static const char* const kCgCtl[4] = {"memory", "cpu", "pids", "freezer"};

static int OpenNs(const char* which) {
  char p[64];
  snprintf(p, sizeof p, "/proc/thread-self/ns/%s", which);
  return open(p, O_RDONLY | O_CLOEXEC);
}

static void KillReap(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGKILL);
  while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
  }
}

// ---- kinds
static int MakeProc(struct Obj* o) {
  pid_t p = fork();
  if (p < 0) return -errno;
  if (p == 0) {
    for (;;) pause();
  }
  o->pid = p;
  return 0;
}

static int MakeInit(struct Obj* o) {
  pid_t p = fork();
  if (p < 0) return -errno;
  if (p == 0) {
    char* argv[] = {(char*)"warren-init", NULL};
    char* envp[] = {NULL};
    execve(g_init, argv, envp);
    _exit(127);
  }
  o->pid = p;
  return 0;
}

// Creates a child in new namespaces `flags`, opens its ns `which`, kills it.
static int NsViaChild(struct Obj* o, int flags, const char* which) {
  int sync[2];
  if (pipe2(sync, O_CLOEXEC) != 0) return -errno;
  pid_t p = fork();
  if (p < 0) return -errno;
  if (p == 0) {
    char c = unshare(flags) == 0 ? 'y' : 'n';
    (void)!write(sync[1], &c, 1);
    for (;;) pause();
  }
  close(sync[1]);
  char c = 'n';
  (void)!read(sync[0], &c, 1);
  close(sync[0]);
  int rc = 0;
  if (c == 'y') {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/ns/%s", p, which);
    o->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (o->fd < 0) rc = -errno;
  } else {
    rc = -EPERM;
  }
  KillReap(p);
  return rc;
}

static int MakeUserns(struct Obj* o) { return NsViaChild(o, CLONE_NEWUSER, "user"); }

static int LoUp(void) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -errno;
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  strcpy(ifr.ifr_name, "lo");
  int rc = 0;
  if (ioctl(s, SIOCGIFFLAGS, &ifr) != 0) rc = -errno;
  ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
  if (rc == 0 && ioctl(s, SIOCSIFFLAGS, &ifr) != 0) rc = -errno;
  close(s);
  return rc;
}

// unshare in this (single-threaded) process, keep an fd, go back.
static int NsHere(struct Obj* o, int flag, const char* which, int orig, int lo) {
  if (unshare(flag) != 0) return -errno;
  int rc = 0;
  if (flag == CLONE_NEWNS && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) rc = -errno;
  if (rc == 0 && lo) rc = LoUp();
  o->fd = OpenNs(which);
  if (rc == 0 && o->fd < 0) rc = -errno;
  if (setns(orig, flag) != 0) {
    perror("setns(back)");
    exit(2);
  }
  return rc;
}
static int MakeNetns(struct Obj* o) { return NsHere(o, CLONE_NEWNET, "net", g_orig_net, 1); }
static int MakeNetnsNolo(struct Obj* o) { return NsHere(o, CLONE_NEWNET, "net", g_orig_net, 0); }
static int MakeMntns(struct Obj* o) { return NsHere(o, CLONE_NEWNS, "mnt", g_orig_mnt, 0); }
static int MakeUtsns(struct Obj* o) { return NsHere(o, CLONE_NEWUTS, "uts", g_orig_uts, 0); }
static int MakeIpcns(struct Obj* o) { return NsHere(o, CLONE_NEWIPC, "ipc", g_orig_ipc, 0); }
static int MakeCgns(struct Obj* o) { return NsHere(o, CLONE_NEWCGROUP, "cgroup", g_orig_cg, 0); }

static int MakePidnsProc(struct Obj* o) {
  int sync[2];
  if (pipe2(sync, O_CLOEXEC) != 0) return -errno;
  pid_t p = (pid_t)syscall(SYS_clone, CLONE_NEWPID | CLONE_NEWNS | SIGCHLD, 0, 0, 0, 0);
  if (p < 0) return -errno;
  if (p == 0) {
    char c = 'y';
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
      c = 'n';
    (void)!write(sync[1], &c, 1);
    for (;;) pause();
  }
  close(sync[1]);
  char c = 'n';
  (void)!read(sync[0], &c, 1);
  close(sync[0]);
  o->pid = p;
  return c == 'y' ? 0 : -EPERM;
}

static int MakeFs(struct Obj* o, const char* type) {
  int fs = (int)syscall(SYS_fsopen, type, FSOPEN_CLOEXEC);
  if (fs < 0) return -errno;
  int rc = 0;
  if (!strcmp(type, "tmpfs")) syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "size", "1m", 0);
  if (syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) != 0) rc = -errno;
  if (rc == 0) {
    o->fd = (int)syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC, 0);
    if (o->fd < 0) rc = -errno;
  }
  close(fs);
  return rc;
}
static int MakeTmpfs(struct Obj* o) { return MakeFs(o, "tmpfs"); }
static int MakeDevpts(struct Obj* o) { return MakeFs(o, "devpts"); }

static int g_seq = 0;
static int MakeCg(struct Obj* o, int ctl) {
  if (!g_cg_base[ctl][0]) return -ENOENT;
  snprintf(o->path, sizeof o->path, "%s/c%d", g_cg_base[ctl], g_seq++);
  if (mkdir(o->path, 0755) != 0) {
    int e = errno;
    o->path[0] = 0;
    return -e;
  }
  return 0;
}
static int MakeCgMemory(struct Obj* o) { return MakeCg(o, 0); }
static int MakeCgCpu(struct Obj* o) { return MakeCg(o, 1); }
static int MakeCgPids(struct Obj* o) { return MakeCg(o, 2); }
static int MakeCgFreezer(struct Obj* o) { return MakeCg(o, 3); }

static void Drop(struct Obj* o) {
  if (o->fd >= 0) close(o->fd);
  KillReap(o->pid);
  if (o->path[0]) {
    for (int i = 0; i < 100 && rmdir(o->path) != 0 && errno == EBUSY; ++i) usleep(10000);
  }
  o->fd = -1;
  o->pid = 0;
  o->path[0] = 0;
}

struct Kind {
  const char* name;
  int (*make)(struct Obj*);
};
static const struct Kind kKinds[] = {
    {"proc", MakeProc},
    {"init", MakeInit},
    {"userns", MakeUserns},
    {"netns", MakeNetns},
    {"netns_nolo", MakeNetnsNolo},
    {"mntns", MakeMntns},
    {"utsns", MakeUtsns},
    {"ipcns", MakeIpcns},
    {"cgroupns", MakeCgns},
    {"pidns_proc", MakePidnsProc},
    {"tmpfs", MakeTmpfs},
    {"devpts", MakeDevpts},
    {"cg_memory", MakeCgMemory},
    {"cg_cpu", MakeCgCpu},
    {"cg_pids", MakeCgPids},
    {"cg_freezer", MakeCgFreezer},
};

static void SetupCgroups(void) {
  FILE* f = fopen("/proc/self/cgroup", "r");
  if (!f) return;
  char line[1024];
  while (fgets(line, sizeof line, f)) {
    char* a = strchr(line, ':');
    char* b = a ? strchr(a + 1, ':') : NULL;
    if (!b) continue;
    *b = 0;
    char* path = b + 1;
    path[strcspn(path, "\n")] = 0;
    for (int c = 0; c < 4; ++c) {
      // the controller list may be "cpu,cpuacct"
      char ctls[256];
      snprintf(ctls, sizeof ctls, ",%s,", a + 1);
      char needle[32];
      snprintf(needle, sizeof needle, ",%s,", kCgCtl[c]);
      if (!strstr(ctls, needle)) continue;
      char mp[256];
      snprintf(mp, sizeof mp, "/sys/fs/cgroup/%s", kCgCtl[c]);
      struct stat st;
      if (stat(mp, &st) != 0) continue;
      snprintf(g_cg_base[c], sizeof g_cg_base[c], "%s%s/warren-density-%d", mp, strcmp(path, "/") ? path : "",
               getpid());
      if (mkdir(g_cg_base[c], 0755) != 0) g_cg_base[c][0] = 0;
    }
  }
  fclose(f);
}

static void TeardownCgroups(void) {
  for (int c = 0; c < 4; ++c)
    if (g_cg_base[c][0]) rmdir(g_cg_base[c]);
}

static double Now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

// Waits (<= 30 s) until the kernel sum stops falling (deferred frees: netns
// cleanup work, RCU).
static void Settle(void) {
  long long prev = -1;
  for (int i = 0; i < 60; ++i) {
    usleep(500000);
    struct Mem m = ReadMem();
    long long s = KernelSum(&m);
    if (prev >= 0 && s >= prev - 64) return;
    prev = s;
  }
}

static struct Obj g_objs[MAX_N];

struct Row {
  int n;
  struct Mem d;
  long long own_anon;
  double secs;
  int err;
};

static struct Row RunOnce(const struct Kind* k, int n) {
  struct Row r = {0};
  Settle();
  struct Mem m0 = ReadMem();
  double t0 = Now();
  int made = 0;
  for (int i = 0; i < n; ++i) {
    g_objs[i].fd = -1;
    g_objs[i].pid = 0;
    g_objs[i].path[0] = 0;
    if (i % 50 == 0) {
      struct Mem m = ReadMem();
      if (m.avail < kFloorKiB) {
        fprintf(stderr, "%s: MemAvailable below 8 GiB after %d objects: stopping\n", k->name, i);
        break;
      }
    }
    int rc = k->make(&g_objs[i]);
    if (rc != 0) {
      r.err = -rc;
      Drop(&g_objs[i]);
      fprintf(stderr, "%s: object %d: %s\n", k->name, i, strerror(-rc));
      break;
    }
    made = i + 1;
  }
  r.secs = Now() - t0;
  usleep(1000000);
  struct Mem m1 = ReadMem();
  static pid_t pids[MAX_N];
  for (int i = 0; i < made; ++i) pids[i] = g_objs[i].pid;
  r.own_anon = OwnAnonKiB(pids, made);
  for (int i = 0; i < made; ++i) Drop(&g_objs[i]);
  r.n = made;
  r.d.slab = m1.slab - m0.slab;
  r.d.sunreclaim = m1.sunreclaim - m0.sunreclaim;
  r.d.percpu = m1.percpu - m0.percpu;
  r.d.kstack = m1.kstack - m0.kstack;
  r.d.ptables = m1.ptables - m0.ptables;
  r.d.anon = m1.anon - m0.anon;
  r.d.avail = m0.avail - m1.avail;
  return r;
}

static int CmpRow(const void* a, const void* b) {
  const struct Row* x = a;
  const struct Row* y = b;
  double px = x->n ? (double)(KernelSum(&x->d) + x->own_anon) / x->n : 0,
         py = y->n ? (double)(KernelSum(&y->d) + y->own_anon) / y->n : 0;
  return px < py ? -1 : px > py;
}

int main(int argc, char** argv) {
  int n = 500, repeat = 3;
  const char* only[64];
  int nonly = 0;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "-n") && i + 1 < argc)
      n = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
      repeat = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--init") && i + 1 < argc)
      g_init = argv[++i];
    else if (nonly < 64)
      only[nonly++] = argv[i];
  }
  if (n < 1 || n > MAX_N || repeat < 1 || repeat > 9) {
    fprintf(stderr, "usage: components [-n 1..%d] [--repeat 1..9] [--init PATH] [kind ...]\n", MAX_N);
    return 2;
  }
  g_orig_net = OpenNs("net");
  g_orig_mnt = OpenNs("mnt");
  g_orig_uts = OpenNs("uts");
  g_orig_ipc = OpenNs("ipc");
  g_orig_cg = OpenNs("cgroup");
  SetupCgroups();
  signal(SIGPIPE, SIG_IGN);
  printf(
      "| kind | n | Slab | (SUnreclaim) | Percpu | KernelStack | PageTables | own anon | **sum** | (AnonPages) |"
      " (MemAvailable drop) | create s |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
      "| ---: |\n");
  fflush(stdout);
  for (size_t k = 0; k < sizeof kKinds / sizeof kKinds[0]; ++k) {
    int want = nonly == 0;
    for (int j = 0; j < nonly; ++j) want |= !strcmp(only[j], kKinds[k].name);
    if (!want) continue;
    if (!strcmp(kKinds[k].name, "init") && !g_init) continue;
    struct Row rows[9];
    for (int r = 0; r < repeat; ++r) rows[r] = RunOnce(&kKinds[k], n);
    qsort(rows, repeat, sizeof rows[0], CmpRow);
    const struct Row* m = &rows[repeat / 2];
    if (m->n == 0) {
      printf("| %s | 0 | failed: %s |\n", kKinds[k].name, strerror(m->err));
      continue;
    }
    double d = m->n;
    printf("| %s | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | **%.1f** | %.1f | %.1f | %.2f |\n", kKinds[k].name,
           m->n, m->d.slab / d, m->d.sunreclaim / d, m->d.percpu / d, m->d.kstack / d, m->d.ptables / d,
           m->own_anon / d, (KernelSum(&m->d) + m->own_anon) / d, m->d.anon / d, m->d.avail / d, m->secs);
    fflush(stdout);
  }
  TeardownCgroups();
  return 0;
}
