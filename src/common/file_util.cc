#include "common/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/unique_fd.h"

namespace warren {

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

}  // namespace warren
