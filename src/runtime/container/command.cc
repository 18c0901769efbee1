#include "runtime/container/command.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "runtime/container/state.h"

namespace warren::runtime::container {

namespace {
constexpr const char* kDefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
}  // namespace

StatusOr<std::vector<UniqueFd>> JoinFds(jail::Cgroup& sb, jail::Cgroup& child) {
  std::vector<UniqueFd> out;
  if (!sb.ChildrenCoverAllControllers()) {
    const std::vector<std::string> sub = child.dirs();
    for (const std::string& d : sb.dirs()) {
      const std::string prefix = d + "/";
      if (std::any_of(sub.begin(), sub.end(), [&](const std::string& c) { return c.rfind(prefix, 0) == 0; })) continue;
      const std::string p = prefix + "cgroup.procs";
      UniqueFd fd(jail::OpenCgroupFile(p, O_WRONLY | O_CLOEXEC));
      if (!fd.valid()) return Errno("open(" + p + ")");
      out.push_back(std::move(fd));
    }
  }
  ASSIGN_OR_RETURN(std::vector<UniqueFd> own, child.OpenProcsFds());
  for (auto& f : own) out.push_back(std::move(f));
  return out;
}

Status FillCommand(const ExecSpec& es, const std::map<std::string, std::string>& sandbox_env, const char* op,
                   bool default_term, const std::string& home, SpawnRequest* req) {
  SpawnRequest& plan = *req;
  if (es.shell) {
    plan.argv = {"/bin/sh", "-c", *es.shell};
  } else {
    plan.argv = es.argv;
  }
  for (const auto& a : plan.argv) {
    if (a.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(std::string(op) + ": argv contains a NUL byte");
    }
  }
  std::map<std::string, std::string> env = sandbox_env;
  for (const auto& [k, v] : es.env) env[k] = v;
  if (!env.count("PATH")) env["PATH"] = kDefaultPath;
  if (!env.count("HOME") && !home.empty()) env["HOME"] = home;
  if (default_term && !env.count("TERM")) env["TERM"] = "xterm";
  for (const auto& [k, v] : env) {
    if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos ||
        v.find('\0') != std::string::npos)
      return absl::InvalidArgumentError(std::string(op) + ": bad environment variable name or value for '" + k + "'");
    plan.envp.push_back(k + "=" + v);
  }
  const std::string& a0 = plan.argv[0];
  if (a0.find('/') != std::string::npos) {
    plan.candidates.push_back(a0);
  } else {
    for (absl::string_view d : absl::StrSplit(env["PATH"], ':', absl::SkipEmpty()))
      plan.candidates.push_back(std::string(d) + "/" + a0);
  }
  plan.not_found_msg = "warren: " + a0 + ": not found\n";
  return absl::OkStatus();
}

std::vector<jail::RlimitSetting> SandboxRlimits(const Resources& r) {
  rlim_t nofile = r.open_files;
  return {{RLIMIT_NOFILE, {nofile, nofile}}, {RLIMIT_CORE, {0, 0}}};
}

namespace {

// Reads a file of the sandbox (resolved inside its root) that sandbox code
// controls: only a regular file, opened non-blocking (a FIFO or device put
// there by the sandbox must never hold a daemon thread), at most
// kMaxSandboxFileBytes. nullopt if it is absent, not regular or too big.
constexpr size_t kMaxSandboxFileBytes = 4 << 20;
std::optional<std::string> ReadInRoot(int root_fd, const char* rel) {
  struct open_how how;
  memset(&how, 0, sizeof how);
  how.flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
  UniqueFd fd(static_cast<int>(syscall(SYS_openat2, root_fd, rel, &how, sizeof how)));
  if (!fd.valid()) return std::nullopt;
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) > kMaxSandboxFileBytes)
    return std::nullopt;
  std::string out;
  char buf[8192];
  while (out.size() < kMaxSandboxFileBytes) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace

StatusOr<UserIds> ResolveUser(const std::string& user, int root_fd, uint32_t range) {
  UserIds ids;
  if (user.empty() || user == "root") {
    ids.home = "/root";
    return ids;
  }
  std::vector<std::string> parts = absl::StrSplit(user, absl::MaxSplits(':', 1));
  const bool numeric = absl::SimpleAtoi(parts[0], &ids.uid);
  // passwd fields: name:password:uid:gid:gecos:home:shell
  bool found = false;
  if (auto passwd = ReadInRoot(root_fd, "/etc/passwd")) {
    for (absl::string_view line : absl::StrSplit(*passwd, '\n')) {
      std::vector<std::string> f = absl::StrSplit(line, ':');
      uint32_t u, g;
      if (f.size() < 4 || !absl::SimpleAtoi(f[2], &u) || !absl::SimpleAtoi(f[3], &g)) continue;
      if (numeric ? u != ids.uid : f[0] != parts[0]) continue;
      ids.uid = u;
      ids.gid = g;
      if (f.size() >= 6 && !f[5].empty()) ids.home = f[5];
      found = true;
      break;
    }
  }
  if (!numeric && !found) return absl::NotFoundError("user '" + parts[0] + "' not found in the sandbox's /etc/passwd");
  if (numeric) ids.gid = ids.uid;  // "uid" alone: gid = uid
  if (parts.size() == 2) {
    uint32_t g;
    if (!absl::SimpleAtoi(parts[1], &g)) return absl::InvalidArgumentError("bad gid in user '" + user + "'");
    ids.gid = g;
  }
  if (ids.uid >= range || ids.gid >= range)
    return absl::InvalidArgumentError("user '" + user + "' is outside the sandbox's id range");
  return ids;
}

Status MakePipe(UniqueFd& r, UniqueFd& w, bool big) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return Errno("pipe2");
  r.reset(p[0]);
  w.reset(p[1]);
  if (big) (void)::fcntl(p[0], F_SETPIPE_SZ, 1 << 20);
  return absl::OkStatus();
}

}  // namespace warren::runtime::container
