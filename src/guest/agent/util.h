// Small helpers of the guest agent shared by its services (no absl).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace warren::guest {

// absl::StatusCode numbers (the agent's exec path does not link absl).
constexpr uint64_t kInvalidArgument = 3;
constexpr uint64_t kNotFound = 5;
constexpr uint64_t kPermissionDenied = 7;
constexpr uint64_t kResourceExhausted = 8;
constexpr uint64_t kFailedPrecondition = 9;
constexpr uint64_t kInternal = 13;

constexpr const char* kCgroupRoot = "/sys/fs/cgroup/warren";

// NotFound for ENOENT/ENOTDIR, PermissionDenied for EACCES/EPERM, else
// FailedPrecondition.
uint64_t CodeOf(int err);
bool WriteFile(const std::string& path, const std::string& data);
std::string ReadFile(const std::string& path, size_t max);
int64_t NowMs();
int64_t NowNs();

// The ids of `user` ("root", a name of /etc/passwd, "uid" or "uid:gid").
bool ResolveUser(const std::string& user, uid_t* uid, gid_t* gid, std::string* why);

// `sig` to every process of the cgroup at `cgroup` (cgroup.kill for SIGKILL).
void SignalCgroup(const std::string& cgroup, int sig);
// True when no process is left in it (or it is gone).
bool CgroupEmpty(const std::string& cgroup);

// How a command starts (Spawn): the child joins `cgroup_procs` (an open
// cgroup.procs), starts a session, takes `in/out/err` as fds 0..2 (and
// `control` as fd 3 when valid), makes fd 0 its controlling terminal when
// `ctty`, changes to `cwd` and to uid/gid, then execs.
struct SpawnArgs {
  char** argv = nullptr;  // argv[0] searched in PATH of envp
  char** envp = nullptr;
  const char* cwd = "/";
  uid_t uid = 0;
  gid_t gid = 0;
  int cgroup_procs = -1;
  int in = -1, out = -1, err = -1, control = -1;
  bool ctty = false;
};
// The started child's pid, or -1 with *code/*err_no/*why set (the child
// could not join its cgroup, chdir or set its user; it was reaped).
pid_t Spawn(const SpawnArgs& a, uint64_t* code, int* err_no, std::string* why);

}  // namespace warren::guest
