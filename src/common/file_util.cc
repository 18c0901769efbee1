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

StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, "open(" + path + ")");
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "read(" + path + ")");
    if (n == 0) return out;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes)
      return absl::FailedPreconditionError(path + " is larger than " + std::to_string(max_bytes) + " bytes");
  }
}

Status WriteAll(int fd, std::string_view data, const std::string& what) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "write(" + what + ")");
    off += static_cast<size_t>(n);
  }
  return absl::OkStatus();
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

StatusOr<std::string> ReadAll(int fd, const std::string& what, size_t max_bytes) {
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "read(" + what + ")");
    }
    if (n == 0) return out;
    if (static_cast<size_t>(n) > max_bytes - out.size()) {
      return absl::FailedPreconditionError(what + " is larger than " + std::to_string(max_bytes) + " bytes");
    }
    out.append(buf, static_cast<size_t>(n));
  }
}

StatusOr<size_t> ReadFull(int fd, char* buf, size_t len, const std::string& what) {
  size_t filled = 0;
  while (filled < len) {
    ssize_t n = ::read(fd, buf + filled, len - filled);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "read(" + what + ")");
    }
    if (n == 0) break;
    filled += static_cast<size_t>(n);
  }
  return filled;
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

}  // namespace warren
