#include "runtime/container/rooted_resolve.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#if __has_include(<linux/openat2.h>)
#include <linux/openat2.h>
#else
struct open_how {
  uint64_t flags;
  uint64_t mode;
  uint64_t resolve;
};
#define RESOLVE_NO_MAGICLINKS 0x02
#define RESOLVE_IN_ROOT 0x10
#endif
#ifndef SYS_openat2
#define SYS_openat2 437
#endif

#include <atomic>
#include <cerrno>
#include <climits>
#include <deque>
#include <utility>

#include "common/unique_fd.h"

namespace warren::runtime {
namespace rooted {
namespace {

constexpr int kOpenat2Retries = 32;  // EAGAIN: a concurrent rename raced a ".." walk

std::atomic<bool> g_force_walk{false};
// 0: not probed, 1: openat2 works, 2: openat2 is missing (ENOSYS).
std::atomic<int> g_openat2_state{0};

}  // namespace

std::string Printable(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\0') {
      out += "\\0";
    } else {
      out += c;
    }
  }
  return out;
}

Status Errno(int err, const std::string& op, const std::string& path) {
  return ErrnoToStatus(err, op + "(" + Printable(path) + ")");
}

// Kernel interface file systems. The daemon is host root: through them it
// would read what the sandbox's root is refused (the host kernel log from
// /proc/kmsg, destructively; /proc/slabinfo; /proc/iomem; /sys/firmware;
// /proc/1/stack), so the file API never touches an object on one, whatever
// path (or symlink planted by the sandbox) led there.
bool IsKernelFs(long type) {
  switch (static_cast<unsigned long>(type)) {
    case 0x9fa0:      // PROC_SUPER_MAGIC
    case 0x62656572:  // SYSFS_MAGIC
    case 0x64626720:  // DEBUGFS_MAGIC
    case 0x74726163:  // TRACEFS_MAGIC
    case 0x73636673:  // SECURITYFS_MAGIC
    case 0x27e0eb:    // CGROUP_SUPER_MAGIC
    case 0x63677270:  // CGROUP2_SUPER_MAGIC
    case 0xcafe4a11:  // BPF_FS_MAGIC
    case 0x62656570:  // CONFIGFS_MAGIC
    case 0x6165676c:  // PSTOREFS_MAGIC
    case 0xde5e81e4:  // EFIVARFS_MAGIC
    case 0xf97cff8c:  // SELINUX_MAGIC
    case 0x43415d53:  // SMACK_MAGIC
    case 0x42494e4d:  // BINFMTFS_MAGIC
    case 0x6e736673:  // NSFS_MAGIC
    case 0x65735543:  // FUSECTL_SUPER_MAGIC
      return true;
    default: return false;
  }
}

Status KernelFsDenied(const std::string& op, const std::string& path) {
  return absl::PermissionDeniedError(op + "(" + Printable(path) +
                                     "): the file API does not reach /proc, /sys or other kernel file systems");
}

Status RefuseKernelFs(int fd, const std::string& op, const std::string& path) {
  struct statfs sfs;
  if (fstatfs(fd, &sfs) != 0) return Errno(errno, op, path);
  if (IsKernelFs(sfs.f_type)) return KernelFsDenied(op, path);
  return absl::OkStatus();
}

const char* SpecialKind(mode_t mode) {
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symlink";
  return "not a regular file";
}

StatusOr<SandboxPath> Parse(const std::string& path, const std::string& op) {
  if (path.empty()) return absl::InvalidArgumentError(op + "(): empty path");
  if (path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(op + "(" + Printable(path) + "): path contains a NUL byte");
  }
  SandboxPath p;
  p.asked = path;
  p.trailing_slash = path.back() == '/';
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string part = path.substr(start, end - start);
    if (!part.empty() && part != ".") p.parts.push_back(std::move(part));
    start = end + 1;
  }
  return p;
}

// --- resolution inside the root -------------------------------------------

int Openat2InRoot(int root, const std::string& rel, int flags) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  for (int i = 0; i < kOpenat2Retries; ++i) {
    long fd = syscall(SYS_openat2, root, rel.c_str(), &how, sizeof(how));
    if (fd >= 0) return static_cast<int>(fd);
    if (errno != EAGAIN && errno != EINTR) return -errno;
  }
  return -EAGAIN;
}

std::deque<std::string> SplitForWalk(const std::string& s) {
  std::deque<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find('/', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// Reads the target of the symlink `name` in `dir` (name "" with an O_PATH fd
// of the link itself).
int ReadLink(int dir, const char* name, std::string* target) {
  std::string buf(PATH_MAX, '\0');
  ssize_t n = readlinkat(dir, name, buf.data(), buf.size());
  if (n < 0) return -errno;
  buf.resize(static_cast<size_t>(n));
  *target = std::move(buf);
  return 0;
}

// Fallback for kernels without openat2: the RESOLVE_IN_ROOT semantics by hand.
// Every component is opened with O_NOFOLLOW relative to the fd of the
// directory resolved so far; a symlink's target is spliced into the
// remaining components (an absolute one restarts at the root); ".." pops the
// stack of resolved directories and never goes above the root.
int WalkInRoot(int root, const std::string& rel, int flags) {
  if (rel.size() >= PATH_MAX) return -ENAMETOOLONG;
  std::vector<UniqueFd> stack;
  stack.emplace_back(openat(root, ".", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!stack.back().valid()) return -errno;
  std::deque<std::string> todo = SplitForWalk(rel);
  int links = 0;
  auto splice = [&](const std::string& target) -> int {
    if (++links > kMaxSymlinks) return -ELOOP;
    if (target.empty()) return -ENOENT;
    std::deque<std::string> more = SplitForWalk(target);
    todo.insert(todo.begin(), more.begin(), more.end());
    if (target[0] == '/') stack.resize(1);
    return 0;
  };
  // Each iteration consumes a component and splices are limited to
  // kMaxSymlinks targets of < PATH_MAX bytes, so this bound is never reached
  // by a valid walk.
  for (int iteration = 0;; ++iteration) {
    if (iteration > (kMaxSymlinks + 1) * PATH_MAX) return -ELOOP;
    while (!todo.empty() && todo.front() == ".") todo.pop_front();
    if (todo.empty()) {
      // The path named a directory already on the stack ("", ".", "a/..").
      int fd = openat(stack.back().get(), ".", flags | O_CLOEXEC);
      return fd >= 0 ? fd : -errno;
    }
    std::string c = std::move(todo.front());
    todo.pop_front();
    if (c == "..") {
      if (stack.size() > 1) stack.pop_back();
      continue;
    }
    const int dir = stack.back().get();
    if (!todo.empty()) {
      UniqueFd fd(openat(dir, c.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
      if (!fd.valid()) return -errno;
      struct stat st;
      if (fstat(fd.get(), &st) != 0) return -errno;
      if (S_ISLNK(st.st_mode)) {
        std::string target;
        if (int rc = ReadLink(fd.get(), "", &target); rc != 0) return rc;
        if (int rc = splice(target); rc != 0) return rc;
        continue;
      }
      if (!S_ISDIR(st.st_mode)) return -ENOTDIR;
      stack.push_back(std::move(fd));
      continue;
    }
    int fd = openat(dir, c.c_str(), flags | O_NOFOLLOW | O_CLOEXEC);
    int err = errno;
    if (fd >= 0) {
      struct stat st;
      if ((flags & O_PATH) && fstat(fd, &st) == 0 && S_ISLNK(st.st_mode)) {
        close(fd);
      } else {
        return fd;
      }
    }
    std::string target;
    if (ReadLink(dir, c.c_str(), &target) != 0) return -err;  // not a symlink: the real error
    if (int rc = splice(target); rc != 0) return rc;
  }
}

int ResolveInRoot(int root, const std::string& rel, int flags) {
  if (!g_force_walk.load(std::memory_order_relaxed) && g_openat2_state.load(std::memory_order_relaxed) != 2) {
    int fd = Openat2InRoot(root, rel, flags);
    if (fd != -ENOSYS) {
      g_openat2_state.store(1, std::memory_order_relaxed);
      return fd;
    }
    g_openat2_state.store(2, std::memory_order_relaxed);
  }
  return WalkInRoot(root, rel, flags);
}

}  // namespace rooted

namespace internal {
void SetForceWalkResolverForTest(bool force) { rooted::g_force_walk.store(force); }
}  // namespace internal
}  // namespace warren::runtime
