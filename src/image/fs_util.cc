#include "image/fs_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <ctime>
#include <memory>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "common/unique_fd.h"

namespace warren::image {

StatusOr<std::string> Sha256File(const std::string& path) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, "open(" + path + ")");
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return absl::InternalError("EVP_DigestInit_ex(sha256) failed");
  }
  std::vector<char> buf(1 << 20);
  for (;;) {
    ssize_t n = read(fd.get(), buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "read(" + path + ")");
    }
    if (n == 0) break;
    if (EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(n)) != 1) {
      return absl::InternalError("EVP_DigestUpdate failed");
    }
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx.get(), md, &len) != 1) {
    return absl::InternalError("EVP_DigestFinal_ex failed");
  }
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) hex += absl::StrFormat("%02x", md[i]);
  return hex;
}

namespace {
Status WriteAll(int fd, const std::string& data, const std::string& path) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "write(" + path + ")");
    }
    off += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) return ErrnoToStatus(errno, "fsync(" + path + ")");
  return absl::OkStatus();
}

StatusOr<std::string> WriteTemp(const std::string& path, const std::string& data) {
  std::string tmp = path + ".tmp-" + UniqueSuffix();
  UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoToStatus(errno, "open(" + tmp + ")");
  Status st = WriteAll(fd.get(), data, tmp);
  if (!st.ok()) {
    unlink(tmp.c_str());
    return st;
  }
  return tmp;
}
}  // namespace

Status WriteFileAtomic(const std::string& path, const std::string& data) {
  ASSIGN_OR_RETURN(std::string tmp, WriteTemp(path, data));
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    return ErrnoToStatus(err, "rename(" + tmp + ", " + path + ")");
  }
  return absl::OkStatus();
}

Status CreateFileExclusive(const std::string& path, const std::string& data) {
  ASSIGN_OR_RETURN(std::string tmp, WriteTemp(path, data));
  int rc = link(tmp.c_str(), path.c_str());
  int err = errno;
  unlink(tmp.c_str());
  if (rc != 0) return ErrnoToStatus(err, "link(" + tmp + ", " + path + ")");
  return absl::OkStatus();
}

StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return ErrnoToStatus(errno, "open(" + path + ")");
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "read(" + path + ")");
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {
      return absl::FailedPreconditionError(path + ": larger than expected");
    }
  }
  return out;
}

Status MakeDirs(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("MakeDirs: empty path");
  RETURN_IF_ERROR(MkdirAll(path, 0755));
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, "stat(" + path + ")");
  if (!S_ISDIR(st.st_mode)) return ErrnoToStatus(ENOTDIR, "mkdir(" + path + ")");
  return absl::OkStatus();
}

namespace {
// Empties the directory `dfd` (on device `dev`); `path` is for messages.
Status EmptyDir(int dfd, dev_t dev, const std::string& path, int depth) {
  if (depth > 4096) return ErrnoToStatus(ELOOP, "RemoveTree(" + path + ")");
  int dup_fd = fcntl(dfd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return ErrnoToStatus(errno, "dup(" + path + ")");
  DIR* d = fdopendir(dup_fd);
  if (d == nullptr) {
    close(dup_fd);
    return ErrnoToStatus(errno, "fdopendir(" + path + ")");
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    names.emplace_back(e->d_name);
  }
  closedir(d);
  for (const std::string& name : names) {
    std::string child = path + "/" + name;
    struct stat st;
    if (fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;
      return ErrnoToStatus(errno, "fstatat(" + child + ")");
    }
    if (S_ISDIR(st.st_mode)) {
      if (st.st_dev != dev) return ErrnoToStatus(EXDEV, "RemoveTree(" + child + ")");
      UniqueFd cfd(openat(dfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!cfd.valid()) return ErrnoToStatus(errno, "openat(" + child + ")");
      RETURN_IF_ERROR(EmptyDir(cfd.get(), dev, child, depth + 1));
      if (unlinkat(dfd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
        return ErrnoToStatus(errno, "rmdir(" + child + ")");
      }
    } else if (unlinkat(dfd, name.c_str(), 0) != 0 && errno != ENOENT) {
      return ErrnoToStatus(errno, "unlink(" + child + ")");
    }
  }
  return absl::OkStatus();
}
}  // namespace

Status RemoveTree(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoToStatus(errno, "lstat(" + path + ")");
  }
  if (!S_ISDIR(st.st_mode)) {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return ErrnoToStatus(errno, "unlink(" + path + ")");
    }
    return absl::OkStatus();
  }
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, "open(" + path + ")");
  RETURN_IF_ERROR(EmptyDir(fd.get(), st.st_dev, path, 0));
  if (rmdir(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, "rmdir(" + path + ")");
  }
  return absl::OkStatus();
}

namespace {
std::string HostName() {
  char host[65] = {};
  gethostname(host, sizeof(host) - 1);
  for (char* p = host; *p; ++p) {
    if (*p == '/') *p = '_';
  }
  return host;
}
}  // namespace

std::string UniqueSuffix() {
  static std::atomic<uint64_t> counter{0};
  uint32_t rnd = 0;
  if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != sizeof(rnd)) rnd = 0;
  return absl::StrFormat("%s-%d-%d-%08x", HostName(), getpid(), counter.fetch_add(1), rnd);
}

bool MadeByDeadLocalProcess(const std::string& name) {
  // Drop an extension (".erofs"); host names may contain dots themselves.
  std::string n = name;
  size_t dot = n.rfind('.');
  if (dot != std::string::npos && (n.rfind('-') == std::string::npos || dot > n.rfind('-'))) {
    n.resize(dot);
  }
  // ...-<host>-<pid>-<counter>-<rand>: peel off rand and counter.
  for (int i = 0; i < 2; ++i) {
    size_t dash = n.rfind('-');
    if (dash == std::string::npos) return false;
    n.resize(dash);
  }
  size_t dash = n.rfind('-');
  if (dash == std::string::npos) return false;
  std::string pid_str = n.substr(dash + 1);
  n.resize(dash);
  const std::string host = "-" + HostName();
  if (n.size() < host.size() || n.compare(n.size() - host.size(), host.size(), host) != 0) {
    return false;
  }
  if (pid_str.empty() || pid_str.size() > 9 || pid_str.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  pid_t pid = static_cast<pid_t>(std::stol(pid_str));
  if (pid <= 0 || pid == getpid()) return false;
  return kill(pid, 0) != 0 && errno == ESRCH;
}

int64_t NowRealtimeNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

int64_t NowMonotonicMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

}  // namespace warren::image
