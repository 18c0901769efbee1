#include "common/file_util.h"

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

Status WriteAll(int fd, std::string_view data, std::string_view what) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "write(" + std::string(what) + ")");
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

StatusOr<std::string> ReadAll(int fd, std::string_view what, size_t max_bytes) {
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "read(" + std::string(what) + ")");
    }
    if (n == 0) return out;
    if (static_cast<size_t>(n) > max_bytes - out.size()) {
      return absl::OutOfRangeError(std::string(what) + " is longer than " + std::to_string(max_bytes) + " bytes");
    }
    out.append(buf, static_cast<size_t>(n));
  }
}

StatusOr<size_t> ReadFull(int fd, char* buf, size_t len, std::string_view what) {
  size_t filled = 0;
  while (filled < len) {
    ssize_t n = ::read(fd, buf + filled, len - filled);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "read(" + std::string(what) + ")");
    }
    if (n == 0) break;
    filled += static_cast<size_t>(n);
  }
  return filled;
}

StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, "open(" + path + ")");
  return ReadAll(fd.get(), path, max_bytes);
}

Status MkdirAll(const std::string& path, mode_t mode) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i != path.size() && path[i] != '/') continue;
    if (path[i - 1] == '/') continue;  // "//" or a trailing '/'
    const std::string cur = path.substr(0, i);
    if (::mkdir(cur.c_str(), mode) != 0 && errno != EEXIST) return ErrnoToStatus(errno, "mkdir(" + cur + ")");
  }
  return absl::OkStatus();
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status WriteFile(const std::string& path, std::string_view data) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, "open(" + path + ")");
  if (::write(fd.get(), data.data(), data.size()) != static_cast<ssize_t>(data.size()))
    return ErrnoToStatus(errno, "write(" + path + ", " + std::string(data) + ")");
  return absl::OkStatus();
}

Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoToStatus(errno, "lstat(" + path + ")");
  }
  return RemoveTreeAt(AT_FDCWD, path, path, st.st_dev, 0);
}

}  // namespace warren
