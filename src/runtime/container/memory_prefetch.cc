#include "runtime/container/memory_prefetch.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/unique_fd.h"

namespace warren::runtime {
namespace {

constexpr size_t kIovBatch = 512;  // < IOV_MAX (1024)
constexpr int kMaxDepth = 64;
constexpr uint64_t kMaxEntries = 1000000;

std::string ReadAll(const std::string& path, size_t max) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  std::string out;
  if (!fd.valid()) return out;
  char buf[65536];
  while (out.size() < max) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

ssize_t ProcessMadvise(int pidfd, const iovec* iov, size_t n, int advice) {
  return ::syscall(SYS_process_madvise, pidfd, iov, n, advice, 0u);
}

struct Walk {
  uint64_t budget;
  uint64_t read = 0;
  uint64_t entries = 0;
  std::string buf = std::string(1 << 20, '\0');
};

void ReadTree(int dir_fd, int depth, Walk& w) {
  if (depth > kMaxDepth || w.read >= w.budget) return;
  int dup = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dup < 0) return;
  DIR* d = ::fdopendir(dup);
  if (d == nullptr) {
    ::close(dup);
    return;
  }
  while (w.read < w.budget && w.entries < kMaxEntries) {
    errno = 0;
    dirent* de = ::readdir(d);
    if (de == nullptr) break;
    ++w.entries;
    const std::string name = de->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (::fstatat(dirfd(d), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      UniqueFd sub(::openat(dirfd(d), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (sub.valid()) ReadTree(sub.get(), depth + 1, w);
    } else if (S_ISREG(st.st_mode) && st.st_size > 0) {
      UniqueFd f(::openat(dirfd(d), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
      if (!f.valid() || ::fstat(f.get(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      while (w.read < w.budget) {
        ssize_t n = ::read(f.get(), w.buf.data(), w.buf.size());
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        w.read += static_cast<uint64_t>(n);
      }
    }
  }
  ::closedir(d);
}

}  // namespace

uint64_t PrefetchMappings(pid_t pid) {
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd.valid()) return 0;
  const std::string maps = ReadAll("/proc/" + std::to_string(pid) + "/maps", 16u << 20);
  std::vector<iovec> iov;
  for (absl::string_view line : absl::StrSplit(maps, '\n', absl::SkipEmpty())) {
    // "start-end perms offset dev inode [path]"
    if (line.find("[vsyscall]") != absl::string_view::npos || line.find("[vvar") != absl::string_view::npos ||
        line.find("[vdso]") != absl::string_view::npos) {
      continue;
    }
    size_t dash = line.find('-'), sp = line.find(' ');
    if (dash == absl::string_view::npos || sp == absl::string_view::npos || dash > sp) continue;
    uint64_t start = 0, end = 0;
    if (!absl::SimpleHexAtoi(line.substr(0, dash), &start) ||
        !absl::SimpleHexAtoi(line.substr(dash + 1, sp - dash - 1), &end) || end <= start) {
      continue;
    }
    iov.push_back({reinterpret_cast<void*>(start), static_cast<size_t>(end - start)});
  }
  uint64_t total = 0;
  for (size_t i = 0; i < iov.size(); i += kIovBatch) {
    const size_t n = std::min(kIovBatch, iov.size() - i);
    ssize_t r = ProcessMadvise(pidfd.get(), &iov[i], n, MADV_WILLNEED);
    if (r >= 0) {
      total += static_cast<uint64_t>(r);
      continue;
    }
    if (errno == ESRCH) break;
    // One mapping refused the hint (e.g. VM_PFNMAP): advise one by one.
    for (size_t k = i; k < i + n; ++k) {
      ssize_t r1 = ProcessMadvise(pidfd.get(), &iov[k], 1, MADV_WILLNEED);
      if (r1 > 0) total += static_cast<uint64_t>(r1);
    }
  }
  return total;
}

uint64_t PrefetchFiles(int dir_fd, uint64_t budget) {
  if (budget == 0) return 0;
  Walk w{budget};
  ReadTree(dir_fd, 0, w);
  return w.read;
}

}  // namespace warren::runtime
