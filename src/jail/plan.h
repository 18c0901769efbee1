/* The containment plan: what confines a process started in a sandbox
 * (mounts, /proc masks, /dev, hostname, rlimits, ids, capabilities,
 * no_new_privs, seccomp), as plain data, and the one executor that applies
 * it in the child between clone and exec.
 *
 * Who uses it: every spawn path. The container's first process (sandbox
 * init), warren-spawn (execs and background processes, PTY or not), the
 * fncall worker and its zygote's call processes. The daemon builds plans
 * (jail/plan_builder.h: the one list of /proc masks, the one list of /dev
 * nodes, the default capability set); the children only execute them.
 *
 * C and C++, no libc: plain data with fixed-size arrays, no pointers but
 * the seccomp program's (and fds by slot number), so a plan can be copied
 * into a child, sent over a socket or put in a memfd as bytes. plan.c is
 * compiled into the daemon (warren_jail), into the freestanding warren-spawn
 * and into the freestanding fncall zygote helper: every function there is
 * async-signal-safe (raw system calls on the plan's memory, no allocation,
 * no locks, errno never touched). Each returns 0 or -errno and stores the
 * failing step in *failed_step (WARREN_JAIL_STEP_*, or
 * WARREN_JAIL_STEP_MOUNT0 + i for the plan's mount i, which
 * warren_jail_step_name / the C++ StepDescription name).
 *
 * The ladder (CONVENTIONS.md: namespaces -> mounts/pivot_root -> rlimits ->
 * capabilities/no_new_privs -> close fds -> seccomp -> exec):
 *   warren_jail_enter_root  hostname, mount propagation private, the root
 *                           attached at `root` and made the cwd, the ids
 *                           mounts are made as (mount_uid/mount_gid)
 *   warren_jail_mount       the mount list, in order, then pivot_root
 *   warren_jail_rlimits     rlimits (before the ids change: raising a hard
 *                           limit needs CAP_SYS_RESOURCE), then the
 *                           best-effort class's policy and oom_score_adj
 *   warren_jail_identity    gid, supplementary groups, bounding set, uid,
 *                           effective/permitted/inheritable, ambient;
 *                           checked afterwards
 *   warren_jail_seal        no_new_privs, then seccomp (last)
 * A path does its own fd work (stdio, close-on-exec, the cwd) between them.
 */
#ifndef WARREN_JAIL_PLAN_H_
#define WARREN_JAIL_PLAN_H_

#include <linux/filter.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WARREN_JAIL_MAX_MOUNTS 96
#define WARREN_JAIL_MAX_RLIMITS 16
#define WARREN_JAIL_MAX_FD_SLOTS 5
#define WARREN_JAIL_ROOT_MAX 1024

/* Mount operations; paths are relative to the new root (the cwd after
 * warren_jail_enter_root) unless absolute. */
enum WarrenJailMountOp {
  WARREN_JAIL_MKDIR = 1, /* mkdir(target, mode); an existing one is fine */
  WARREN_JAIL_MOUNT,     /* mount(source, target, fstype, flags, data) */
  WARREN_JAIL_BIND,      /* mount(source, target, NULL, MS_BIND | flags) */
  WARREN_JAIL_MOVE_FD,   /* move_mount(fds[fd_slot], "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH) */
  WARREN_JAIL_REMOUNT,   /* mount(NULL, target, NULL, MS_REMOUNT | flags, data) */
  WARREN_JAIL_READ_ONLY, /* target bound onto itself (recursive), remounted MS_RDONLY | flags */
  WARREN_JAIL_MASK_FILE, /* source (/dev/null) bound over target */
  WARREN_JAIL_MASK_DIR,  /* an empty read-only tmpfs over target: the fd slot's shared one (first
                            mask dir; fd_slot < 0: none), then bound from the first masked dir */
  WARREN_JAIL_DEV_NODE,  /* an empty file at target with the host node `source` bound over it */
  WARREN_JAIL_SYMLINK,   /* symlink(source, target); failures ignored (the link is a convenience) */
};

/* WarrenJailMount.opts */
#define WARREN_JAIL_IF_EXISTS 0x1u   /* the target missing (ENOENT) skips the op: a kernel without the file */
#define WARREN_JAIL_OR_NEXT 0x2u     /* on failure run the next op instead; on success skip it */
#define WARREN_JAIL_BEST_EFFORT 0x4u /* a failure is ignored (a convenience the kernel may lack: mqueue) */
/* WARREN_JAIL_MASK_DIR: the fd slot's empty tmpfs is cloned (open_tree
 * OPEN_TREE_CLONE of the detached mount, then move_mount of the clone), not
 * moved, so one fd serves every process that applies the plan and none
 * makes a tmpfs superblock of its own (a superblock made and torn down per
 * fncall call costs more than the clone). A kernel that refuses the clone
 * (before Linux 6.15: a detached mount could not be cloned) gets a fresh
 * tmpfs instead. */
#define WARREN_JAIL_CLONE_FD 0x8u

struct WarrenJailMount {
  uint32_t op;      /* WarrenJailMountOp */
  uint32_t opts;    /* WARREN_JAIL_IF_EXISTS, WARREN_JAIL_OR_NEXT */
  uint64_t flags;   /* MS_* */
  int32_t fd_slot;  /* WARREN_JAIL_MOVE_FD, WARREN_JAIL_MASK_DIR: index into the fds passed in, or -1 */
  uint32_t mode;    /* WARREN_JAIL_MKDIR */
  char source[256]; /* host paths (a sandbox's cgroup dir) can be long */
  char target[96];
  char fstype[16];
  char data[96];
};

struct WarrenJailRlimit {
  int32_t resource;
  uint32_t pad;
  uint64_t cur, max;
};

/* WarrenJailCreds.flags */
#define WARREN_JAIL_SET_IDS 0x1u      /* setgroups(0), setresgid(gid), setresuid(uid) */
#define WARREN_JAIL_SET_CAPS 0x2u     /* the five capability sets below */
#define WARREN_JAIL_NO_NEW_PRIVS 0x4u /* prctl(PR_SET_NO_NEW_PRIVS) */
#define WARREN_JAIL_SETGROUPS 0x8u    /* with SET_IDS: also setgroups(0) (needs setgroups allowed) */
/* The best-effort QoS class: sched_setscheduler(SCHED_IDLE) with the rlimits
 * (so every spawn path does it, and children inherit it; leaving SCHED_IDLE
 * needs CAP_SYS_NICE in the initial user namespace or an RLIMIT_NICE the
 * sandbox does not have), and oom_score_adj
 * WARREN_JAIL_QOS_BEST_EFFORT_OOM_SCORE_ADJ (warren_jail_qos_oom_score). */
#define WARREN_JAIL_QOS_BEST_EFFORT 0x10u
#define WARREN_JAIL_QOS_BEST_EFFORT_OOM_SCORE_ADJ 500

struct WarrenJailCreds {
  uint32_t flags;
  uint32_t uid, gid;
  int32_t last_cap; /* highest capability of the running kernel */
  uint64_t cap_effective, cap_permitted, cap_inheritable, cap_bounding, cap_ambient;
  uint32_t n_rlimits;
  uint32_t n_filters; /* seccomp program length (0: none) */
  struct WarrenJailRlimit rlimits[WARREN_JAIL_MAX_RLIMITS];
  /* The seccomp program. In a plan sent as bytes it follows the plan and
   * the receiver points this at it (warren_jail_plan_attach_filter). */
  const struct sock_filter* filter;
};

/* WarrenJailPlan.steps: the phases of warren_jail_enter_root / _mount that run. */
#define WARREN_JAIL_HOSTNAME 0x1u    /* sethostname(hostname) */
#define WARREN_JAIL_PRIVATE 0x2u     /* mount("/", MS_REC | MS_PRIVATE) */
#define WARREN_JAIL_ATTACH_ROOT 0x4u /* move_mount(fds[root_fd_slot], root), chdir(root) */
#define WARREN_JAIL_MOUNT_IDS 0x8u   /* setresgid/setresuid(mount_gid/uid) before the mounts */
#define WARREN_JAIL_PIVOT 0x10u      /* pivot_root(".", "."), detach the old root, chdir("/") */

struct WarrenJailPlan {
  uint32_t magic;    /* WARREN_JAIL_PLAN_MAGIC */
  uint32_t size;     /* sizeof(struct WarrenJailPlan) */
  uint32_t ns_flags; /* CLONE_NEW* the process is cloned with / joins (informative for the child) */
  uint32_t steps;
  int32_t root_fd_slot;
  uint32_t mount_uid, mount_gid;
  uint32_t n_mounts;
  char hostname[64];
  char root[WARREN_JAIL_ROOT_MAX];
  struct WarrenJailMount mounts[WARREN_JAIL_MAX_MOUNTS];
  struct WarrenJailCreds creds;
};

#define WARREN_JAIL_PLAN_MAGIC 0x574a504cu /* "WJPL" */

enum WarrenJailStep {
  WARREN_JAIL_STEP_NONE = 0,
  WARREN_JAIL_STEP_PLAN, /* a malformed plan */
  WARREN_JAIL_STEP_HOSTNAME,
  WARREN_JAIL_STEP_PRIVATE,
  WARREN_JAIL_STEP_ATTACH_ROOT,
  WARREN_JAIL_STEP_CHDIR_ROOT,
  WARREN_JAIL_STEP_MOUNT_IDS,
  WARREN_JAIL_STEP_PIVOT,
  WARREN_JAIL_STEP_RLIMITS,
  WARREN_JAIL_STEP_SETGROUPS,
  WARREN_JAIL_STEP_SETGID,
  WARREN_JAIL_STEP_BOUNDING,
  WARREN_JAIL_STEP_SETUID,
  WARREN_JAIL_STEP_CAPSET,
  WARREN_JAIL_STEP_AMBIENT,
  WARREN_JAIL_STEP_CAPS_CHECK,
  WARREN_JAIL_STEP_NO_NEW_PRIVS,
  WARREN_JAIL_STEP_SECCOMP,
  WARREN_JAIL_STEP_SCHED,
  WARREN_JAIL_STEP_OOM_SCORE,
  WARREN_JAIL_STEP_COUNT,
  WARREN_JAIL_STEP_MOUNT0 = 64 /* + index of the failing mount op */
};

/* The name of a step ("pivot_root", "capset", ...); "mount" for a mount op
 * (the C++ side names it with its source and target from the plan). */
const char* warren_jail_step_name(int step);

/* Checks magic, size and counts. 0 or -EPROTO. */
int warren_jail_plan_check(const struct WarrenJailPlan* plan);

/* 1 if a mount op of the plan takes the fd of `slot` (so the sender sends
 * it), else 0. */
int warren_jail_plan_uses_slot(const struct WarrenJailPlan* plan, int slot);

/* A plan received as bytes (struct, then creds.n_filters sock_filters):
 * checks it and points creds.filter at the program. `len` is the whole
 * message. 0 or -EPROTO. */
int warren_jail_plan_attach_filter(struct WarrenJailPlan* plan, unsigned long len);

/* fds: the plan's fd slots (WARREN_JAIL_MAX_FD_SLOTS entries, -1 unused). */
int warren_jail_enter_root(const struct WarrenJailPlan* plan, const int* fds, int* failed_step);
int warren_jail_mount(const struct WarrenJailPlan* plan, const int* fds, int* failed_step);
int warren_jail_rlimits(const struct WarrenJailCreds* creds, int* failed_step);
int warren_jail_identity(const struct WarrenJailCreds* creds, int* failed_step);
int warren_jail_seal(const struct WarrenJailCreds* creds, int* failed_step);
/* oom_score_adj of the best-effort class (inherited by children): written
 * to /proc/self/oom_score_adj, so it must run while the caller still owns
 * that file: before it changes user namespace or ids (a non-dumpable
 * process's /proc files belong to the root of the user namespace its mm was
 * made in, the host's). warren-spawn's helper calls it before setns; a
 * sandbox's init gets it from the daemon (its shell's /proc/PID file). */
int warren_jail_qos_oom_score(const struct WarrenJailCreds* creds, int* failed_step);
/* rlimits, identity, seal, in that order. */
int warren_jail_lockdown(const struct WarrenJailCreds* creds, int* failed_step);

#ifdef __cplusplus
}
#endif

#endif /* WARREN_JAIL_PLAN_H_ */
