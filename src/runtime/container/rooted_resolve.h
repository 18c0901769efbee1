// Path resolution inside a sandbox root for the file API (rooted_files.cc):
// parsing a path as the sandbox sees it, openat2(RESOLVE_IN_ROOT |
// RESOLVE_NO_MAGICLINKS) with a component walk as fallback, and the refusal
// of kernel interface file systems.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/status.h"

namespace warren::runtime {
namespace internal {
// Test hook: resolve with the component walk even where openat2 exists, so
// the fallback runs the same suite. Not thread-safe against running calls.
void SetForceWalkResolverForTest(bool force);
}  // namespace internal

namespace rooted {

constexpr int kMaxSymlinks = 40;  // as the kernel's MAXSYMLINKS

// A path as the sandbox sees it: components without "" and "."; ".." kept
// (resolved by the kernel inside the root, never lexically).
struct SandboxPath {
  std::string asked;  // for error messages and FileInfo.path
  std::vector<std::string> parts;
  bool trailing_slash = false;

  bool is_root() const { return parts.empty(); }
  const std::string& last() const { return parts.back(); }
  bool last_is_dotdot() const { return !parts.empty() && parts.back() == ".."; }
  std::string Join(size_t n) const {
    if (n == 0) return ".";
    std::string out;
    for (size_t i = 0; i < n; ++i) {
      if (i) out += '/';
      out += parts[i];
    }
    return out;
  }
  std::string Rel() const { return Join(parts.size()); }
  std::string ParentRel() const { return Join(parts.size() - 1); }
};

// `s` with NUL bytes shown as "\\0" (for error messages).
std::string Printable(const std::string& s);
// ErrnoToStatus naming the operation and the path.
Status Errno(int err, const std::string& op, const std::string& path);
Status KernelFsDenied(const std::string& op, const std::string& path);
// PermissionDenied when `fd` (any open mode, O_PATH included) lies on a
// kernel interface file system (/proc, /sys, cgroupfs, ...).
Status RefuseKernelFs(int fd, const std::string& op, const std::string& path);
// Kernel interface file systems (by statfs f_type): the daemon is host root,
// through them it would read what the sandbox's root is refused.
bool IsKernelFs(long type);
// Reads the target of the symlink `name` in `dir` (name "" with an O_PATH fd
// of the link itself); 0 or -errno.
int ReadLink(int dir, const char* name, std::string* target);
// "a character device", "a FIFO", ... for errors about a non-regular file.
const char* SpecialKind(mode_t mode);
StatusOr<SandboxPath> Parse(const std::string& path, const std::string& op);
// Opens `rel` inside `root` following symlinks as the sandbox would (inside
// the root); returns an fd or -errno.
int ResolveInRoot(int root, const std::string& rel, int flags);

}  // namespace rooted
}  // namespace warren::runtime
