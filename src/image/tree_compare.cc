#include "image/tree_compare.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "common/unique_fd.h"

namespace warren::image {
namespace {

constexpr int kMaxDepth = 4096;

std::string Show(const std::string& path) { return absl::CHexEscape(path); }

Status Mismatch(const std::string& path, const std::string& what) {
  return absl::InternalError("layer verify: " + Show(path) + ": " + what);
}

StatusOr<std::vector<std::string>> ListDir(int dfd, const std::string& path) {
  int dup_fd = fcntl(dfd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return ErrnoToStatus(errno, "dup(" + path + ")");
  DIR* d = fdopendir(dup_fd);
  if (d == nullptr) {
    close(dup_fd);
    return ErrnoToStatus(errno, "fdopendir(" + path + ")");
  }
  rewinddir(d);
  std::vector<std::string> names;
  errno = 0;
  while (dirent* e = readdir(d)) {
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
      names.emplace_back(e->d_name);
    }
  }
  int err = errno;
  closedir(d);
  if (err != 0) return ErrnoToStatus(err, "readdir(" + path + ")");
  std::sort(names.begin(), names.end());
  return names;
}

// The xattrs we carry: user.*, trusted.*, security.* (name -> value).
StatusOr<std::map<std::string, std::string>> Xattrs(const std::string& proc_path, const std::string& path) {
  std::map<std::string, std::string> out;
  std::vector<char> names(4096);
  ssize_t n = -1;
  for (int i = 0; i < 8; ++i) {
    n = llistxattr(proc_path.c_str(), names.data(), names.size());
    if (n >= 0 || errno != ERANGE) break;
    names.resize(names.size() * 4);
  }
  if (n < 0) {
    if (errno == ENOTSUP) return out;
    return ErrnoToStatus(errno, "llistxattr(" + path + ")");
  }
  for (ssize_t off = 0; off < n;) {
    std::string name(names.data() + off);
    off += static_cast<ssize_t>(name.size()) + 1;
    if (name.rfind("user.", 0) != 0 && name.rfind("trusted.", 0) != 0 && name.rfind("security.", 0) != 0) {
      continue;
    }
    std::vector<char> val(256);
    ssize_t m = -1;
    for (int i = 0; i < 12; ++i) {
      m = lgetxattr(proc_path.c_str(), name.c_str(), val.data(), val.size());
      if (m >= 0 || errno != ERANGE) break;
      val.resize(val.size() * 4);
    }
    if (m < 0) return ErrnoToStatus(errno, "lgetxattr(" + path + ", " + name + ")");
    out[name] = std::string(val.data(), static_cast<size_t>(m));
  }
  return out;
}

class Comparer {
 public:
  Status CompareDir(int src, int img, const std::string& path, int depth);
  Status CompareEntry(int src_parent, int img_parent, const std::string& name, const std::string& path, int depth);

 private:
  Status CompareMeta(const struct stat& a, const struct stat& b, const std::string& path);
  Status CompareXattrs(int src_parent, int img_parent, const std::string& name, const std::string& path);
  Status CompareContents(int src_parent, int img_parent, const std::string& name, const std::string& path, off_t size);
  // First path seen for each inode, per tree (hardlink groups).
  std::map<std::pair<dev_t, ino_t>, std::string> src_first_, img_first_;
};

Status Comparer::CompareMeta(const struct stat& a, const struct stat& b, const std::string& path) {
  if ((a.st_mode & S_IFMT) != (b.st_mode & S_IFMT)) {
    return Mismatch(path, absl::StrFormat("type %o != %o", a.st_mode & S_IFMT, b.st_mode & S_IFMT));
  }
  if (!S_ISLNK(a.st_mode) && (a.st_mode & 07777) != (b.st_mode & 07777)) {
    return Mismatch(path, absl::StrFormat("mode %04o != %04o", a.st_mode & 07777, b.st_mode & 07777));
  }
  if (a.st_uid != b.st_uid || a.st_gid != b.st_gid) {
    return Mismatch(path, absl::StrFormat("owner %d:%d != %d:%d", a.st_uid, a.st_gid, b.st_uid, b.st_gid));
  }
  if ((S_ISREG(a.st_mode) || S_ISLNK(a.st_mode)) && a.st_size != b.st_size) {
    return Mismatch(path, absl::StrFormat("size %d != %d", a.st_size, b.st_size));
  }
  if ((S_ISCHR(a.st_mode) || S_ISBLK(a.st_mode)) && a.st_rdev != b.st_rdev) {
    return Mismatch(path, absl::StrFormat("device %d:%d != %d:%d", major(a.st_rdev), minor(a.st_rdev), major(b.st_rdev),
                                          minor(b.st_rdev)));
  }
  return absl::OkStatus();
}

Status Comparer::CompareXattrs(int src_parent, int img_parent, const std::string& name, const std::string& path) {
  // l*xattr through /proc/self/fd/<parent>/<name>: the parent is pinned by
  // its fd and the last component is not followed.
  auto proc = [&](int fd) { return "/proc/self/fd/" + std::to_string(fd) + "/" + name; };
  ASSIGN_OR_RETURN(auto a, Xattrs(proc(src_parent), path));
  ASSIGN_OR_RETURN(auto b, Xattrs(proc(img_parent), path));
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end()) return Mismatch(path, "xattr " + k + " missing");
    if (it->second != v) return Mismatch(path, "xattr " + k + " differs");
  }
  for (const auto& [k, v] : b) {
    if (!a.contains(k)) return Mismatch(path, "extra xattr " + k);
  }
  return absl::OkStatus();
}

Status Comparer::CompareContents(int src_parent, int img_parent, const std::string& name, const std::string& path,
                                 off_t size) {
  UniqueFd a(openat(src_parent, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!a.valid()) return ErrnoToStatus(errno, "openat(" + path + ")");
  UniqueFd b(openat(img_parent, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!b.valid()) return ErrnoToStatus(errno, "openat(image " + path + ")");
  std::vector<char> ba(1 << 20), bb(1 << 20);
  off_t off = 0;
  while (off < size) {
    size_t want = static_cast<size_t>(std::min<off_t>(size - off, ba.size()));
    ssize_t na = pread(a.get(), ba.data(), want, off);
    if (na < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "pread(" + path + ")");
    }
    if (na == 0) return Mismatch(path, "source shrank while building");
    size_t got = 0;
    while (got < static_cast<size_t>(na)) {
      ssize_t nb = pread(b.get(), bb.data() + got, static_cast<size_t>(na) - got, off + got);
      if (nb < 0) {
        if (errno == EINTR) continue;
        return ErrnoToStatus(errno, "pread(image " + path + ")");
      }
      if (nb == 0) return Mismatch(path, "image file shorter");
      got += static_cast<size_t>(nb);
    }
    if (memcmp(ba.data(), bb.data(), static_cast<size_t>(na)) != 0) {
      return Mismatch(path, absl::StrFormat("contents differ near offset %d", off));
    }
    off += na;
  }
  return absl::OkStatus();
}

Status Comparer::CompareEntry(int src_parent, int img_parent, const std::string& name, const std::string& path,
                              int depth) {
  struct stat a, b;
  if (fstatat(src_parent, name.c_str(), &a, AT_SYMLINK_NOFOLLOW) != 0) {
    return ErrnoToStatus(errno, "fstatat(" + Show(path) + ")");
  }
  if (fstatat(img_parent, name.c_str(), &b, AT_SYMLINK_NOFOLLOW) != 0) {
    return ErrnoToStatus(errno, "fstatat(image " + Show(path) + ")");
  }
  RETURN_IF_ERROR(CompareMeta(a, b, path));
  RETURN_IF_ERROR(CompareXattrs(src_parent, img_parent, name, path));
  if (!S_ISDIR(a.st_mode) && (a.st_nlink > 1 || b.st_nlink > 1)) {
    // Hardlink groups: the first path seen for each inode must agree. Only
    // multiply-linked inodes are recorded (a merge or split of links shows
    // as nlink > 1 on at least one side for every path involved).
    auto [ia, new_a] = src_first_.try_emplace({a.st_dev, a.st_ino}, path);
    auto [ib, new_b] = img_first_.try_emplace({b.st_dev, b.st_ino}, path);
    if (ia->second != ib->second) {
      return Mismatch(
          path, "hardlinked to " + Show(ia->second) + " in the source but to " + Show(ib->second) + " in the image");
    }
    if (!new_a) return absl::OkStatus();  // contents compared at the first link
  }
  if (S_ISREG(a.st_mode)) return CompareContents(src_parent, img_parent, name, path, a.st_size);
  if (S_ISLNK(a.st_mode)) {
    std::vector<char> ta(static_cast<size_t>(a.st_size) + 2), tb(ta.size());
    ssize_t na = readlinkat(src_parent, name.c_str(), ta.data(), ta.size());
    ssize_t nb = readlinkat(img_parent, name.c_str(), tb.data(), tb.size());
    if (na < 0) return ErrnoToStatus(errno, "readlinkat(" + Show(path) + ")");
    if (nb < 0) return ErrnoToStatus(errno, "readlinkat(image " + Show(path) + ")");
    if (std::string(ta.data(), na) != std::string(tb.data(), nb)) {
      return Mismatch(path, "symlink target differs");
    }
    return absl::OkStatus();
  }
  if (S_ISDIR(a.st_mode)) {
    UniqueFd da(openat(src_parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!da.valid()) return ErrnoToStatus(errno, "openat(" + Show(path) + ")");
    UniqueFd db(openat(img_parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!db.valid()) return ErrnoToStatus(errno, "openat(image " + Show(path) + ")");
    return CompareDir(da.get(), db.get(), path, depth + 1);
  }
  return absl::OkStatus();
}

Status Comparer::CompareDir(int src, int img, const std::string& path, int depth) {
  if (depth > kMaxDepth) return Mismatch(path, "tree deeper than 4096");
  ASSIGN_OR_RETURN(auto a, ListDir(src, path));
  ASSIGN_OR_RETURN(auto b, ListDir(img, path));
  auto child = [&](const std::string& n) { return path == "." ? n : path + "/" + n; };
  size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    if (j >= b.size() || (i < a.size() && a[i] < b[j])) {
      return Mismatch(child(a[i]), "missing from the image");
    }
    if (i >= a.size() || b[j] < a[i]) return Mismatch(child(b[j]), "not in the source");
    RETURN_IF_ERROR(CompareEntry(src, img, a[i], child(a[i]), depth));
    ++i;
    ++j;
  }
  return absl::OkStatus();
}

}  // namespace

Status CompareTrees(int src, int img) {
  Comparer c;
  // The roots: compare through "." of each.
  return c.CompareEntry(src, img, ".", ".", 0);
}

}  // namespace warren::image
