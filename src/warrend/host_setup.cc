#include "warrend/host_setup.h"

#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common/file_util.h"
#include "common/fnv.h"
#include "common/log.h"
#include "jail/lxcfs.h"
#include "node/run_dir.h"
#include "node/suspend_swap.h"
#include "runtime/microvm/template.h"

namespace warren::warrend {

StatusOr<std::string> FindInit(const std::string& flag) {
  if (!flag.empty()) {
    char real[PATH_MAX];
    if (::access(flag.c_str(), X_OK) != 0 || ::realpath(flag.c_str(), real) == nullptr) {
      return ErrnoToStatus(errno, "--init-path " + flag);
    }
    return std::string(real);
  }
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n < 0) return ErrnoToStatus(errno, "readlink(/proc/self/exe)");
  std::string dir = Dirname(std::string(buf, static_cast<size_t>(n)));
  std::vector<std::string> candidates = {dir + "/warren-init", dir + "/../init/warren-init",
                                         "/usr/lib/warren/warren-init"};
  for (const std::string& c : candidates) {
    if (::access(c.c_str(), X_OK) == 0) {
      char real[PATH_MAX];
      if (::realpath(c.c_str(), real) != nullptr) return std::string(real);
      return c;
    }
  }
  return absl::NotFoundError("warren-init not found (looked at " + candidates[0] + ", " + candidates[1] + ", " +
                             candidates[2] + "); pass --init-path");
}

StatusOr<UniqueFd> LockStateDir(const std::string& state_dir) {
  std::string path = state_dir + "/warrend.lock";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoToStatus(errno, "open(" + path + ")");
  struct flock lk {};
  lk.l_type = F_WRLCK;
  lk.l_whence = SEEK_SET;
  if (::fcntl(fd.get(), F_SETLK, &lk) != 0) {
    int err = errno;
    if (err == EAGAIN || err == EACCES) {
      struct flock who {};
      who.l_type = F_WRLCK;
      who.l_whence = SEEK_SET;
      std::string pid = "?";
      if (::fcntl(fd.get(), F_GETLK, &who) == 0 && who.l_type != F_UNLCK) {
        pid = std::to_string(who.l_pid);
      }
      return absl::FailedPreconditionError("another warrend (pid " + pid + ") is running on state dir " + state_dir);
    }
    return ErrnoToStatus(err, "fcntl(F_SETLK, " + path + ")");
  }
  std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), pid.data(), pid.size(), 0) < 0) {
    return ErrnoToStatus(errno, "write(" + path + ")");
  }
  return fd;
}

Status PrepareSocket(const std::string& path) {
  RETURN_IF_ERROR(MkdirAll(Dirname(path), 0755));
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoToStatus(errno, "lstat(" + path + ")");
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError("--socket " + path + " exists and is not a socket");
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError("--socket " + path + " is too long for a unix socket");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  // A daemon killed a moment ago may still have children between fork and
  // exec (they die with it, PR_SET_PDEATHSIG) holding its listening socket:
  // give them up to 2 s before calling the socket served.
  for (int attempt = 0;; ++attempt) {
    UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) return ErrnoToStatus(errno, "socket(AF_UNIX)");
    if (::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) break;
    if (attempt >= 40) {
      return absl::FailedPreconditionError("--socket " + path + " is served by another live process");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, "unlink(" + path + ")");
  }
  warren::Log(spdlog::level::info, "removed stale socket", {{"socket", path}});
  return absl::OkStatus();
}

StatusOr<std::string> ReadToken(const std::string& path) {
  ASSIGN_OR_RETURN(std::string contents, ReadSmallFile(path, 64 << 10));
  std::string token = contents.substr(0, contents.find('\n'));
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ' || token.back() == '\t')) {
    token.pop_back();
  }
  if (token.size() < 16) {
    return absl::InvalidArgumentError("--token-file " + path + ": the token must be at least 16 characters");
  }
  return token;
}

std::pair<uint64_t, uint64_t> RaiseNofileLimit() {
  struct rlimit rl;
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return {0, 0};
  const uint64_t before = rl.rlim_cur;
  if (rl.rlim_cur != rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) return {before, before};
  }
  return {before, rl.rlim_cur};
}

void BoundHeap() {
  (void)::mallopt(M_MMAP_THRESHOLD, 1 << 20);
  (void)::mallopt(M_ARENA_MAX, 4);
  std::thread([] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      (void)::malloc_trim(0);
    }
  }).detach();
}

void SetUpSuspendSwap(const std::string& mode, uint64_t zram_size_mb) {
  node::SuspendSwapOptions so;
  so.mode = mode;
  so.zram_size_mb = zram_size_mb;
  StatusOr<node::SuspendSwap> sw = node::EnsureSuspendSwap(so);
  if (!sw.ok()) {
    warren::Log(spdlog::level::warn, "no swap for suspend: suspended sandboxes give back only page cache",
                {{"error", sw.status().ToString()}});
  } else if (sw->how == "disabled") {
    warren::Log(spdlog::level::info, "suspend swap disabled (--suspend-swap=none)");
  } else {
    warren::Log(spdlog::level::info,
                sw->how == "created"   ? "suspend swap: set up zram swap"
                : sw->how == "adopted" ? "suspend swap: adopted the zram swap set up earlier"
                                       : "suspend swap: using the host's swap",
                {{"device", sw->device}, {"size_mb", std::to_string(sw->size_bytes >> 20)}});
  }
}

std::string LxcfsDir(const std::string& run_dir) { return "/run/warren/lxcfs/" + Hex16(Fnv1a64(run_dir)); }

int RemoveOrphanRunDirs(const std::string& run_root, const std::string& own_run_dir, const std::string& qemu) {
  int removed = 0;
  for (const std::string& dir : node::FindOrphanRunDirs(run_root, own_run_dir)) {
    const int qemus = runtime::microvm::KillTemplateQemus(qemu, dir + "/");
    jail::Lxcfs::StopAt(LxcfsDir(dir));
    const Status s = RemoveTree(dir);
    Log(s.ok() ? spdlog::level::warn : spdlog::level::err,
        s.ok() ? "removed a run dir no state dir uses (its daemon was killed, its state dir removed)"
               : "could not remove a run dir no state dir uses",
        {{"run_dir", dir}, {"qemus_killed", std::to_string(qemus)}, {"error", s.ok() ? "" : s.ToString()}});
    if (s.ok()) ++removed;
  }
  return removed;
}

}  // namespace warren::warrend
