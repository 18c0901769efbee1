/* The executor of a containment plan (plan.h). Freestanding: raw system
 * calls only (common/raw_syscall.h), no libc, no allocation, no locks, errno
 * never touched; compiled into warrend, warren-spawn and the fncall zygote
 * helper alike. */
#include "jail/plan.h"

#include <asm/unistd.h>
#include <linux/capability.h>
#include <linux/fcntl.h>
#include <linux/mount.h>
#include <linux/prctl.h>
#include <linux/seccomp.h>
#include <stddef.h>

#include "common/raw_syscall.h"

#ifndef WARREN_HAVE_RAW_SYSCALL
#error "jail/plan.c: x86_64 or aarch64 only"
#endif

#define J_ENOENT 2
#define J_EEXIST 17
#define J_EINVAL 22
#define J_EPERM 1
#define J_EPROTO 71
#define J_MNT_DETACH 2

static long Sys(long n, long a, long b, long c, long d, long e) { return warren_raw_syscall6(n, a, b, c, d, e, 0); }

static unsigned long Strlen(const char* s) {
  unsigned long n = 0;
  while (s[n]) ++n;
  return n;
}

const char* warren_jail_step_name(int step) {
  static const char* const kNames[WARREN_JAIL_STEP_COUNT] = {"?",
                                                             "plan",
                                                             "sethostname",
                                                             "mount(/, MS_REC | MS_PRIVATE)",
                                                             "move_mount(rootfs)",
                                                             "chdir(rootfs)",
                                                             "setresuid/setresgid(mount ids)",
                                                             "pivot_root",
                                                             "prlimit64",
                                                             "setgroups",
                                                             "setresgid",
                                                             "prctl(PR_CAPBSET_DROP)",
                                                             "setresuid",
                                                             "capset",
                                                             "prctl(PR_CAP_AMBIENT)",
                                                             "capability check",
                                                             "prctl(PR_SET_NO_NEW_PRIVS)",
                                                             "seccomp(SECCOMP_SET_MODE_FILTER)",
                                                             "sched_setscheduler(SCHED_IDLE)",
                                                             "write(/proc/self/oom_score_adj)"};
  if (step >= WARREN_JAIL_STEP_MOUNT0) return "mount";
  return step > 0 && step < WARREN_JAIL_STEP_COUNT ? kNames[step] : "?";
}

int warren_jail_plan_uses_slot(const struct WarrenJailPlan* p, int slot) {
  for (uint32_t i = 0; i < p->n_mounts && i < WARREN_JAIL_MAX_MOUNTS; ++i) {
    const struct WarrenJailMount* m = &p->mounts[i];
    if ((m->op == WARREN_JAIL_MOVE_FD || m->op == WARREN_JAIL_MASK_DIR) && m->fd_slot == slot) return 1;
  }
  return 0;
}

int warren_jail_plan_check(const struct WarrenJailPlan* p) {
  if (p->magic != WARREN_JAIL_PLAN_MAGIC || p->size != sizeof *p || p->n_mounts > WARREN_JAIL_MAX_MOUNTS ||
      p->creds.n_rlimits > WARREN_JAIL_MAX_RLIMITS || p->creds.n_filters > BPF_MAXINSNS ||
      p->root_fd_slot >= WARREN_JAIL_MAX_FD_SLOTS)
    return -J_EPROTO;
  return 0;
}

int warren_jail_plan_attach_filter(struct WarrenJailPlan* p, unsigned long len) {
  if (len < sizeof *p || warren_jail_plan_check(p) != 0) return -J_EPROTO;
  if (len != sizeof *p + (unsigned long)p->creds.n_filters * sizeof(struct sock_filter)) return -J_EPROTO;
  p->creds.filter = p->creds.n_filters ? (const struct sock_filter*)(p + 1) : NULL;
  return 0;
}

static int Fail(int* failed_step, int step, long rc) {
  *failed_step = step;
  return (int)(rc < 0 ? rc : -J_EINVAL);
}

int warren_jail_enter_root(const struct WarrenJailPlan* p, const int* fds, int* failed_step) {
  long rc;
  if (warren_jail_plan_check(p) != 0) return Fail(failed_step, WARREN_JAIL_STEP_PLAN, -J_EPROTO);
  if (p->steps & WARREN_JAIL_HOSTNAME) {
    if ((rc = Sys(__NR_sethostname, (long)p->hostname, (long)Strlen(p->hostname), 0, 0, 0)) != 0)
      return Fail(failed_step, WARREN_JAIL_STEP_HOSTNAME, rc);
  }
  if (p->steps & WARREN_JAIL_PRIVATE) {
    if ((rc = Sys(__NR_mount, 0, (long)"/", 0, MS_REC | MS_PRIVATE, 0)) != 0)
      return Fail(failed_step, WARREN_JAIL_STEP_PRIVATE, rc);
  }
  if (p->steps & WARREN_JAIL_ATTACH_ROOT) {
    if (p->root_fd_slot < 0) return Fail(failed_step, WARREN_JAIL_STEP_PLAN, -J_EPROTO);
    const int fd = fds[p->root_fd_slot];
    if ((rc = Sys(__NR_move_mount, fd, (long)"", AT_FDCWD, (long)p->root, MOVE_MOUNT_F_EMPTY_PATH)) != 0)
      return Fail(failed_step, WARREN_JAIL_STEP_ATTACH_ROOT, rc);
    Sys(__NR_close, fd, 0, 0, 0, 0);
    if ((rc = Sys(__NR_chdir, (long)p->root, 0, 0, 0, 0)) != 0)
      return Fail(failed_step, WARREN_JAIL_STEP_CHDIR_ROOT, rc);
  }
  if (p->steps & WARREN_JAIL_MOUNT_IDS) {
    if ((rc = Sys(__NR_setresgid, p->mount_gid, p->mount_gid, p->mount_gid, 0, 0)) != 0 ||
        (rc = Sys(__NR_setresuid, p->mount_uid, p->mount_uid, p->mount_uid, 0, 0)) != 0)
      return Fail(failed_step, WARREN_JAIL_STEP_MOUNT_IDS, rc);
  }
  return 0;
}

/* An empty read-only tmpfs of its own at `target`. */
static long FreshMaskTmpfs(const char* target) {
  return Sys(__NR_mount, (long)"tmpfs", (long)target, (long)"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
             (long)"size=0,mode=555");
}

/* One mount op; `first_mask` is the target of the first masked dir (or NULL). */
static long MountOp(const struct WarrenJailMount* m, const int* fds, const char** first_mask) {
  long rc;
  switch (m->op) {
    case WARREN_JAIL_MKDIR:
      rc = Sys(__NR_mkdirat, AT_FDCWD, (long)m->target, m->mode, 0, 0);
      return rc == -J_EEXIST ? 0 : rc;
    case WARREN_JAIL_MOUNT:
      return Sys(__NR_mount, (long)m->source, (long)m->target, (long)m->fstype, (long)m->flags,
                 m->data[0] ? (long)m->data : 0);
    case WARREN_JAIL_BIND:
    case WARREN_JAIL_MASK_FILE:
      return Sys(__NR_mount, (long)m->source, (long)m->target, 0, MS_BIND | (long)m->flags, 0);
    case WARREN_JAIL_MOVE_FD:
      if (m->fd_slot < 0 || m->fd_slot >= WARREN_JAIL_MAX_FD_SLOTS) return -J_EPROTO;
      rc = Sys(__NR_move_mount, fds[m->fd_slot], (long)"", AT_FDCWD, (long)m->target, MOVE_MOUNT_F_EMPTY_PATH);
      if (rc == 0) Sys(__NR_close, fds[m->fd_slot], 0, 0, 0, 0);
      return rc;
    case WARREN_JAIL_REMOUNT:
      return Sys(__NR_mount, 0, (long)m->target, 0, MS_REMOUNT | (long)m->flags, m->data[0] ? (long)m->data : 0);
    case WARREN_JAIL_READ_ONLY:
      if ((rc = Sys(__NR_mount, (long)m->target, (long)m->target, 0, MS_BIND | MS_REC, 0)) != 0) return rc;
      return Sys(__NR_mount, 0, (long)m->target, 0, MS_BIND | MS_REMOUNT | MS_RDONLY | (long)m->flags, 0);
    case WARREN_JAIL_MASK_DIR:
      /* One superblock for every masked dir: the shared empty tmpfs (fd
       * slot) or one made here, attached at the first, bound from there. */
      if (*first_mask != NULL) {
        rc = Sys(__NR_mount, (long)*first_mask, (long)m->target, 0, MS_BIND, 0);
      } else if (m->fd_slot >= 0 && m->fd_slot < WARREN_JAIL_MAX_FD_SLOTS && fds[m->fd_slot] >= 0) {
        if (m->opts & WARREN_JAIL_CLONE_FD) {
          const long c =
              Sys(__NR_open_tree, fds[m->fd_slot], (long)"", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH, 0, 0);
          rc = c < 0 ? c : Sys(__NR_move_mount, c, (long)"", AT_FDCWD, (long)m->target, MOVE_MOUNT_F_EMPTY_PATH);
          if (c >= 0) Sys(__NR_close, c, 0, 0, 0, 0);
          if (rc != 0 && rc != -J_ENOENT) rc = FreshMaskTmpfs(m->target);
        } else {
          rc = Sys(__NR_move_mount, fds[m->fd_slot], (long)"", AT_FDCWD, (long)m->target, MOVE_MOUNT_F_EMPTY_PATH);
        }
      } else {
        rc = FreshMaskTmpfs(m->target);
      }
      if (rc == 0 && *first_mask == NULL) *first_mask = m->target;
      return rc;
    case WARREN_JAIL_DEV_NODE:
      rc = Sys(__NR_openat, AT_FDCWD, (long)m->target, O_CREAT | O_WRONLY | O_CLOEXEC, 0666, 0);
      if (rc < 0) return rc;
      Sys(__NR_close, rc, 0, 0, 0, 0);
      return Sys(__NR_mount, (long)m->source, (long)m->target, 0, MS_BIND, 0);
    case WARREN_JAIL_SYMLINK: (void)Sys(__NR_symlinkat, (long)m->source, AT_FDCWD, (long)m->target, 0, 0); return 0;
    default: return -J_EPROTO;
  }
}

int warren_jail_mount(const struct WarrenJailPlan* p, const int* fds, int* failed_step) {
  const char* first_mask = NULL;
  for (uint32_t i = 0; i < p->n_mounts && i < WARREN_JAIL_MAX_MOUNTS; ++i) {
    const struct WarrenJailMount* m = &p->mounts[i];
    long rc = MountOp(m, fds, &first_mask);
    if (rc == -J_ENOENT && (m->opts & WARREN_JAIL_IF_EXISTS)) rc = 0;
    if (m->opts & WARREN_JAIL_BEST_EFFORT) rc = 0;
    if (m->opts & WARREN_JAIL_OR_NEXT) {
      if (rc == 0) ++i; /* skip the fallback */
      continue;
    }
    if (rc != 0) return Fail(failed_step, WARREN_JAIL_STEP_MOUNT0 + (int)i, rc);
  }
  if (p->steps & WARREN_JAIL_PIVOT) {
    long rc = Sys(__NR_pivot_root, (long)".", (long)".", 0, 0, 0);
    if (rc == 0) rc = Sys(__NR_umount2, (long)".", J_MNT_DETACH, 0, 0, 0);
    if (rc == 0) rc = Sys(__NR_chdir, (long)"/", 0, 0, 0, 0);
    if (rc != 0) return Fail(failed_step, WARREN_JAIL_STEP_PIVOT, rc);
  }
  return 0;
}

int warren_jail_rlimits(const struct WarrenJailCreds* c, int* failed_step) {
  for (uint32_t i = 0; i < c->n_rlimits && i < WARREN_JAIL_MAX_RLIMITS; ++i) {
    uint64_t rl[2] = {c->rlimits[i].cur, c->rlimits[i].max};
    long rc = Sys(__NR_prlimit64, 0, c->rlimits[i].resource, (long)rl, 0, 0);
    if (rc != 0) return Fail(failed_step, WARREN_JAIL_STEP_RLIMITS, rc);
  }
  if (c->flags & WARREN_JAIL_QOS_BEST_EFFORT) {
    /* SCHED_IDLE (linux/sched.h 5): the task runs only when no normal task
     * of its CPU is runnable, kept at the minimum weight by CFS. */
    const int param[1] = {0};
    long rc = Sys(__NR_sched_setscheduler, 0, 5, (long)param, 0, 0);
    if (rc != 0) return Fail(failed_step, WARREN_JAIL_STEP_SCHED, rc);
  }
  return 0;
}

int warren_jail_qos_oom_score(const struct WarrenJailCreds* c, int* failed_step) {
  if (!(c->flags & WARREN_JAIL_QOS_BEST_EFFORT)) return 0;
  static const char kPath[] = "/proc/self/oom_score_adj";
  static const char kValue[] = "500";
  _Static_assert(WARREN_JAIL_QOS_BEST_EFFORT_OOM_SCORE_ADJ == 500, "kValue");
  long fd = Sys(__NR_openat, AT_FDCWD, (long)kPath, O_WRONLY | O_CLOEXEC, 0, 0);
  if (fd < 0) return Fail(failed_step, WARREN_JAIL_STEP_OOM_SCORE, fd);
  long rc = Sys(__NR_write, fd, (long)kValue, sizeof kValue - 1, 0, 0);
  Sys(__NR_close, fd, 0, 0, 0, 0);
  return rc < 0 ? Fail(failed_step, WARREN_JAIL_STEP_OOM_SCORE, rc) : 0;
}

int warren_jail_identity(const struct WarrenJailCreds* c, int* failed_step) {
  long rc;
  if (c->flags & WARREN_JAIL_SET_IDS) {
    if ((c->flags & WARREN_JAIL_SETGROUPS) && (rc = Sys(__NR_setgroups, 0, 0, 0, 0, 0)) != 0)
      return Fail(failed_step, WARREN_JAIL_STEP_SETGROUPS, rc);
    if ((rc = Sys(__NR_setresgid, c->gid, c->gid, c->gid, 0, 0)) != 0)
      return Fail(failed_step, WARREN_JAIL_STEP_SETGID, rc);
  }
  if (c->flags & WARREN_JAIL_SET_CAPS) {
    /* The bounding set first: dropping needs CAP_SETPCAP, which the uid change may take. */
    for (int cap = 0; cap <= c->last_cap && cap < 64; ++cap) {
      if (c->cap_bounding & ((uint64_t)1 << cap)) continue;
      if (Sys(__NR_prctl, PR_CAPBSET_READ, cap, 0, 0, 0) == 0) continue; /* gone already */
      rc = Sys(__NR_prctl, PR_CAPBSET_DROP, cap, 0, 0, 0);
      if (rc != 0 && rc != -J_EINVAL) return Fail(failed_step, WARREN_JAIL_STEP_BOUNDING, rc);
    }
  }
  if (c->flags & WARREN_JAIL_SET_IDS) {
    if ((rc = Sys(__NR_setresuid, c->uid, c->uid, c->uid, 0, 0)) != 0)
      return Fail(failed_step, WARREN_JAIL_STEP_SETUID, rc);
  }
  if (c->flags & WARREN_JAIL_SET_CAPS) {
    /* Set explicitly after the uid change: the kernel clears permitted and
     * effective only on a change away from the namespace's root, and a
     * process that entered the namespace as (unmapped) host root was not
     * its root. */
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    d[0].effective = (uint32_t)c->cap_effective;
    d[1].effective = (uint32_t)(c->cap_effective >> 32);
    d[0].permitted = (uint32_t)c->cap_permitted;
    d[1].permitted = (uint32_t)(c->cap_permitted >> 32);
    d[0].inheritable = (uint32_t)c->cap_inheritable;
    d[1].inheritable = (uint32_t)(c->cap_inheritable >> 32);
    if ((rc = Sys(__NR_capset, (long)&hdr, (long)d, 0, 0, 0)) != 0)
      return Fail(failed_step, WARREN_JAIL_STEP_CAPSET, rc);
    rc = Sys(__NR_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    if (rc != 0 && rc != -J_EINVAL) return Fail(failed_step, WARREN_JAIL_STEP_AMBIENT, rc);
    for (int cap = 0; cap <= c->last_cap && cap < 64; ++cap) {
      if (!(c->cap_ambient & ((uint64_t)1 << cap))) continue;
      if ((rc = Sys(__NR_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0)) != 0)
        return Fail(failed_step, WARREN_JAIL_STEP_AMBIENT, rc);
    }
    /* What the process holds now is what the plan says. */
    struct __user_cap_data_struct got[2];
    got[0].effective = got[1].effective = got[0].permitted = got[1].permitted = 0;
    got[0].inheritable = got[1].inheritable = 0;
    if ((rc = Sys(__NR_capget, (long)&hdr, (long)got, 0, 0, 0)) != 0)
      return Fail(failed_step, WARREN_JAIL_STEP_CAPS_CHECK, rc);
    for (int i = 0; i < 2; ++i) {
      if (got[i].effective != d[i].effective || got[i].permitted != d[i].permitted ||
          got[i].inheritable != d[i].inheritable)
        return Fail(failed_step, WARREN_JAIL_STEP_CAPS_CHECK, -J_EPERM);
    }
  }
  return 0;
}

int warren_jail_seal(const struct WarrenJailCreds* c, int* failed_step) {
  long rc;
  if ((c->flags & WARREN_JAIL_NO_NEW_PRIVS) && (rc = Sys(__NR_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) != 0)
    return Fail(failed_step, WARREN_JAIL_STEP_NO_NEW_PRIVS, rc);
  if (c->n_filters > 0 && c->filter != NULL) {
    struct sock_fprog prog = {(unsigned short)c->n_filters, (struct sock_filter*)c->filter};
    if ((rc = Sys(__NR_seccomp, SECCOMP_SET_MODE_FILTER, 0, (long)&prog, 0, 0)) != 0)
      return Fail(failed_step, WARREN_JAIL_STEP_SECCOMP, rc);
  }
  return 0;
}

int warren_jail_lockdown(const struct WarrenJailCreds* c, int* failed_step) {
  int rc = warren_jail_rlimits(c, failed_step);
  if (rc == 0) rc = warren_jail_identity(c, failed_step);
  if (rc == 0) rc = warren_jail_seal(c, failed_step);
  return rc;
}
