// peer_loop: times a peer sandbox tool (bwrap, crun, runc) doing the raw
// floor's work, one sandbox at a time. Per iteration, all of it timed:
//
//   mount a fresh tmpfs on WORK/t (upper/, work/)
//   mount overlay(lowerdir=LOWER, upperdir=WORK/t/upper, workdir=WORK/t/work)
//     on WORK/rootfs
//   fork + exec the peer command, wait, require exit status 0; in its
//     arguments "{ROOTFS}" becomes WORK/rootfs, "{BUNDLE}" WORK (an OCI
//     bundle: config.json + rootfs/) and "{ID}" a container id unique to
//     this process
//   unmount WORK/rootfs and WORK/t
//
// The loop runs in its own private mount namespace (unshare(CLONE_NEWNS) +
// MS_REC|MS_PRIVATE on /), so none of its mounts is ever visible in, or can
// leak into, the caller's mount namespace; they all die with this process.
//
// Usage: peer_loop [--config FILE] [--mask-cgroup2] NAME LOWERDIR ITERATIONS MAX_SECONDS -- COMMAND ARGS...
//   --config FILE   copied to WORK/config.json (OCI runtimes)
//   --mask-cgroup2  mount an empty tmpfs over /sys/fs/cgroup/unified in the
//                   private mount namespace: crun 1.8 refuses a hybrid host
//                   whose cgroup2 hierarchy lists any controller (here
//                   "hugetlb") even with --cgroup-manager=disabled; masked,
//                   it sees a cgroup v1 host.
// Output: one JSON object on the last stdout line (same fields as raw_floor);
// with $BENCH_SAMPLES set, every iteration's latency (µs) appended to it.
// The peer's own stdout/stderr go to /dev/null except on a failed iteration,
// which is re-run with them visible to show the error, then the loop stops.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { kMaxIterations = 1000000 };

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

struct paths {
  char t[256], upper[300], work[300], rootfs[256], opts[1200];
};

static int mount_overlay(const char* lower, const struct paths* p) {
  if (mount("tmpfs", p->t, "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=0755") != 0) {
    fprintf(stderr, "peer_loop: mount(tmpfs, %s): %s\n", p->t, strerror(errno));
    return -1;
  }
  if (mkdir(p->upper, 0755) != 0 || mkdir(p->work, 0755) != 0) {
    fprintf(stderr, "peer_loop: mkdir(%s|%s): %s\n", p->upper, p->work, strerror(errno));
    umount2(p->t, MNT_DETACH);
    return -1;
  }
  if (mount("overlay", p->rootfs, "overlay", MS_NODEV, p->opts) != 0) {
    fprintf(stderr, "peer_loop: mount(overlay, %s, %s): %s\n", p->rootfs, p->opts, strerror(errno));
    (void)lower;
    umount2(p->t, MNT_DETACH);
    return -1;
  }
  return 0;
}

static int unmount_overlay(const struct paths* p) {
  int rc = 0;
  if (umount2(p->rootfs, 0) != 0) {
    fprintf(stderr, "peer_loop: umount(%s): %s\n", p->rootfs, strerror(errno));
    umount2(p->rootfs, MNT_DETACH);
    rc = -1;
  }
  if (umount2(p->t, 0) != 0) {
    fprintf(stderr, "peer_loop: umount(%s): %s\n", p->t, strerror(errno));
    umount2(p->t, MNT_DETACH);
    rc = -1;
  }
  return rc;
}

// Runs argv; 0 when it exited 0. quiet: stdout/stderr to /dev/null.
static int run(char** argv, int quiet) {
  pid_t pid = fork();
  if (pid < 0) {
    perror("peer_loop: fork");
    return -1;
  }
  if (pid == 0) {
    int nul = open("/dev/null", O_RDWR);
    if (nul >= 0) {
      dup2(nul, 0);
      if (quiet) {
        dup2(nul, 1);
        dup2(nul, 2);
      }
    }
    execvp(argv[0], argv);
    fprintf(stderr, "peer_loop: execvp(%s): %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      perror("peer_loop: waitpid");
      return -1;
    }
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
  if (!quiet) fprintf(stderr, "peer_loop: %s ended with status 0x%x\n", argv[0], status);
  return -1;
}

static int iteration(const char* lower, const struct paths* p, char** argv, int quiet) {
  if (mount_overlay(lower, p) != 0) return -1;
  int rc = run(argv, quiet);
  if (unmount_overlay(p) != 0) rc = -1;
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

static int copy_file(const char* from, const char* to) {
  char buf[65536];
  int in = open(from, O_RDONLY | O_CLOEXEC);
  if (in < 0) return -1;
  ssize_t n = read(in, buf, sizeof buf);
  close(in);
  if (n < 0 || n == (ssize_t)sizeof buf) return -1;  // configs are small
  int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) return -1;
  int rc = write(out, buf, (size_t)n) == n ? 0 : -1;
  close(out);
  return rc;
}

int main(int argc, char** argv) {
  const char* config = NULL;
  int mask_cgroup2 = 0;
  const char* prog = argv[0];
  while (argc > 1 && argv[1][0] == '-' && argv[1][1] == '-' && argv[1][2] != 0) {
    if (strcmp(argv[1], "--config") == 0 && argc > 2) {
      config = argv[2];
      argv += 2;
      argc -= 2;
    } else if (strcmp(argv[1], "--mask-cgroup2") == 0) {
      mask_cgroup2 = 1;
      argv += 1;
      argc -= 1;
    } else {
      break;
    }
  }
  if (argc < 7 || strcmp(argv[5], "--") != 0) {
    fprintf(stderr,
            "usage: %s [--config FILE] [--mask-cgroup2] NAME LOWERDIR ITERATIONS MAX_SECONDS -- COMMAND ARGS...\n",
            prog);
    return 2;
  }
  const char* name = argv[1];
  const char* lower = argv[2];
  int iterations = atoi(argv[3]);
  double max_s = atof(argv[4]);
  if (iterations < 1 || iterations > kMaxIterations || max_s <= 0) {
    fprintf(stderr, "peer_loop: ITERATIONS must be 1..%d and MAX_SECONDS > 0\n", kMaxIterations);
    return 2;
  }
  if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
    perror("peer_loop: unshare(CLONE_NEWNS) / make-rprivate");
    return 1;
  }
  if (mask_cgroup2 &&
      mount("none", "/sys/fs/cgroup/unified", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k,mode=0755") != 0) {
    perror("peer_loop: mount(tmpfs, /sys/fs/cgroup/unified)");
    return 1;
  }
  char work[] = "/tmp/peer_loop.XXXXXX";
  if (!mkdtemp(work)) {
    perror("peer_loop: mkdtemp");
    return 1;
  }
  // mkdtemp makes it 0700: a runtime whose container root is an unprivileged
  // host uid (user namespace) must be able to reach WORK/rootfs.
  if (chmod(work, 0755) != 0) {
    perror("peer_loop: chmod(work)");
    rmdir(work);
    return 1;
  }
  struct paths p;
  snprintf(p.t, sizeof p.t, "%s/t", work);
  snprintf(p.upper, sizeof p.upper, "%s/upper", p.t);
  snprintf(p.work, sizeof p.work, "%s/work", p.t);
  snprintf(p.rootfs, sizeof p.rootfs, "%s/rootfs", work);
  snprintf(p.opts, sizeof p.opts, "lowerdir=%s,upperdir=%s,workdir=%s", lower, p.upper, p.work);
  int rc = 0;
  char config_path[300], id[64];
  snprintf(config_path, sizeof config_path, "%s/config.json", work);
  snprintf(id, sizeof id, "bench-%d", (int)getpid());
  if (mkdir(p.t, 0755) != 0 || mkdir(p.rootfs, 0755) != 0) {
    perror("peer_loop: mkdir");
    rc = 1;
  }
  if (config && copy_file(config, config_path) != 0) {
    fprintf(stderr, "peer_loop: copying %s to %s failed\n", config, config_path);
    rc = 1;
  }
  // argv after "--", with placeholders substituted.
  char** cmd = &argv[6];
  for (char** a = cmd; *a; ++a) {
    if (strcmp(*a, "{ROOTFS}") == 0)
      *a = p.rootfs;
    else if (strcmp(*a, "{BUNDLE}") == 0)
      *a = work;
    else if (strcmp(*a, "{ID}") == 0)
      *a = id;
  }
  double* lat = calloc((size_t)iterations, sizeof(double));
  if (!lat) return 1;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop;  // no SA_RESTART: a blocking wait sees EINTR
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  // One untimed warm-up iteration; shows the peer's errors if it fails.
  if (rc == 0 && iteration(lower, &p, cmd, 0) != 0) rc = 1;
  int done = 0;
  const double start = now_us();
  for (; rc == 0 && done < iterations; ++done) {
    double t0 = now_us();
    if (iteration(lower, &p, cmd, 1) != 0) {
      (void)iteration(lower, &p, cmd, 0);  // once more, loudly, for the error text
      rc = 1;
      break;
    }
    lat[done] = now_us() - t0;
    if (g_stop) {
      fprintf(stderr, "peer_loop: interrupted\n");
      rc = 1;
      break;
    }
    if (now_us() - start > max_s * 1e6) {
      ++done;
      break;
    }
  }
  const double elapsed = (now_us() - start) / 1e6;
  rmdir(p.t);
  rmdir(p.rootfs);
  if (config) unlink(config_path);
  rmdir(work);
  if (rc != 0 || done == 0) {
    fprintf(stderr, "peer_loop: %s failed after %d iterations\n", name, done);
    printf("{\"name\":\"%s\",\"ok\":false,\"iterations\":%d}\n", name, done);
    free(lat);
    return 1;
  }
  // $BENCH_SAMPLES: append every latency (µs, one a line) for the driver
  // to merge rounds of the same row.
  const char* samples = getenv("BENCH_SAMPLES");
  if (samples && *samples) {
    FILE* f = fopen(samples, "ae");
    if (!f) {
      fprintf(stderr, "%s: fopen(%s): %s\n", "peer_loop", samples, strerror(errno));
    } else {
      for (int i = 0; i < done; ++i) fprintf(f, "%.0f\n", lat[i]);
      fclose(f);
    }
  }
  qsort(lat, (size_t)done, sizeof(double), cmp_double);
  printf(
      "{\"name\":\"%s\",\"ok\":true,\"iterations\":%d,\"seconds\":%.3f,\"rate\":%.2f,"
      "\"p50_us\":%.0f,\"p90_us\":%.0f,\"p99_us\":%.0f,\"max_us\":%.0f}\n",
      name, done, elapsed, done / elapsed, pct(lat, done, 0.50), pct(lat, done, 0.90), pct(lat, done, 0.99),
      lat[done - 1]);
  free(lat);
  return 0;
}
