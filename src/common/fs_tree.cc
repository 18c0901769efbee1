#include "common/fs_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "common/unique_fd.h"

namespace warren {
namespace {

Status RemoveTreeAt(int parent_fd, const std::string& name, const std::string& path, dev_t dev, int depth) {
  // Staging trees are bounded by PATH_MAX (at most 2048 levels).
  if (depth > 4096) return absl::FailedPreconditionError("RemoveTree(" + path + "): too deep");
  struct stat st;
  if (::fstatat(parent_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoToStatus(errno, "fstatat(" + path + ")");
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlinkat(parent_fd, name.c_str(), 0) != 0 && errno != ENOENT) {
      return ErrnoToStatus(errno, "unlinkat(" + path + ")");
    }
    return absl::OkStatus();
  }
  if (st.st_dev != dev) {
    return absl::FailedPreconditionError("RemoveTree(" + path + "): is on another file system (a leftover mount?)");
  }
  UniqueFd fd(::openat(parent_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, "openat(" + path + ")");
  int dup_fd = ::dup(fd.get());
  if (dup_fd < 0) return ErrnoToStatus(errno, "dup(" + path + ")");
  DIR* d = ::fdopendir(dup_fd);
  if (d == nullptr) {
    int err = errno;
    ::close(dup_fd);
    return ErrnoToStatus(err, "fdopendir(" + path + ")");
  }
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(std::move(n));
  }
  ::closedir(d);
  for (const std::string& n : names) {
    RETURN_IF_ERROR(RemoveTreeAt(fd.get(), n, path + "/" + n, dev, depth + 1));
  }
  if (::unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, "rmdir(" + path + ")");
  }
  return absl::OkStatus();
}

}  // namespace

Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoToStatus(errno, "lstat(" + path + ")");
  }
  return RemoveTreeAt(AT_FDCWD, path, path, st.st_dev, 0);
}

}  // namespace warren
