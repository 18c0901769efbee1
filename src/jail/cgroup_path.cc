#include "jail/cgroup_path.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <vector>

#include "absl/strings/str_split.h"
#include "jail/cgroup.h"

namespace warren::jail {

CgPath RouteCgroupPath(const std::string& path) {
  struct Root {
    std::string mount;
    int fd;
  };
  static const std::vector<Root> roots = [] {
    std::vector<Root> r;
    std::ifstream in("/proc/self/mountinfo");
    for (std::string line; std::getline(in, line);) {
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      auto sep = std::find(f.begin(), f.end(), "-");
      if (f.size() < 5 || sep == f.end() || sep + 1 == f.end()) continue;
      if (*(sep + 1) != "cgroup" && *(sep + 1) != "cgroup2") continue;
      if (f[4].find('\\') != std::string::npos) continue;  // octal escapes: left to the plain walk
      const int fd = ::open(f[4].c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
      if (fd >= 0) r.push_back({f[4], fd});
    }
    // The longest mount point first: /sys/fs/cgroup/unified before /sys/fs/cgroup.
    std::sort(r.begin(), r.end(), [](const Root& a, const Root& b) { return a.mount.size() > b.mount.size(); });
    return r;
  }();
  const std::string& p = path;
  for (const Root& r : roots) {
    if (p.compare(0, r.mount.size(), r.mount) != 0) continue;
    if (p.size() == r.mount.size()) return {r.fd, "."};
    if (p[r.mount.size()] == '/') return {r.fd, p.substr(r.mount.size() + 1)};
  }
  return {AT_FDCWD, p};
}

int CgOpen(const char* path, int flags) {
  CgPath r = RouteCgroupPath(path);
  return ::openat(r.dirfd, r.rel.c_str(), flags);
}
int CgAccess(const char* path) {
  CgPath r = RouteCgroupPath(path);
  return ::faccessat(r.dirfd, r.rel.c_str(), F_OK, 0);
}
int CgMkdir(const char* path, mode_t mode) {
  CgPath r = RouteCgroupPath(path);
  return ::mkdirat(r.dirfd, r.rel.c_str(), mode);
}
int CgRmdir(const char* path) {
  CgPath r = RouteCgroupPath(path);
  return ::unlinkat(r.dirfd, r.rel.c_str(), AT_REMOVEDIR);
}
int CgRename(const char* from, const char* to) {
  CgPath a = RouteCgroupPath(from), b = RouteCgroupPath(to);
  return ::renameat(a.dirfd, a.rel.c_str(), b.dirfd, b.rel.c_str());
}
DIR* CgOpendir(const char* path) {
  const int fd = CgOpen(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) ::close(fd);
  return d;
}

int OpenCgroupFile(const std::string& path, int flags) { return CgOpen(path.c_str(), flags); }

}  // namespace warren::jail
