// What starting a command in a sandbox needs before the spawn, shared by
// Exec and Start: argv/envp and PATH candidates, the user's ids, the cgroup
// fds to join, rlimits, pipes.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "jail/cgroup.h"
#include "jail/contain.h"
#include "runtime/backend.h"
#include "runtime/container/spawn.h"

namespace warren::runtime::container {

// The cgroup.procs a process spawned by the daemon writes to join the
// sandbox `sb` through its child cgroup `child` (an exec's or a background
// process's): the child's, plus the sandbox's own in the hierarchies where
// the child has no directory (v1: children live in the freezer hierarchy
// only). One write per hierarchy: each takes the global cgroup mutex.
StatusOr<std::vector<UniqueFd>> JoinFds(jail::Cgroup& sb, jail::Cgroup& child);

// argv and envp of an exec or a background process, exact: the sandbox's
// env, then the command's over it, PATH defaulted (TERM too for a PTY); the
// paths to try for argv[0] (PATH search done by the daemon: the grandchild
// only execs). HOME defaults to `home` (the user's, as a login sets it).
// `op` names the call in errors ("exec", "start").
Status FillCommand(const ExecSpec& es, const std::map<std::string, std::string>& sandbox_env, const char* op,
                   bool default_term, const std::string& home, SpawnRequest* req);

std::vector<jail::RlimitSetting> SandboxRlimits(const Resources& r);

struct UserIds {
  uid_t uid = 0;
  gid_t gid = 0;
  std::string home = "/";  // HOME a login would set: the passwd entry's, "/root" for root
};

// "root", a name from the sandbox's /etc/passwd (read through `root_fd`, the
// sandbox's root), or "uid[:gid]"; ids must be below `range`. home: root's is
// "/root" (passwd not read); a uid's is its passwd entry's if it has one, else "/".
StatusOr<UserIds> ResolveUser(const std::string& user, int root_fd, uint32_t range);

// Makes a pipe; `big`: with a 1 MiB buffer (throughput of huge outputs;
// only output pipes: each resize allocates a ring and counts against the
// user's pipe-user-pages-soft, past which the kernel refuses it anyway).
Status MakePipe(UniqueFd& r, UniqueFd& w, bool big = false);

}  // namespace warren::runtime::container
