#include "node/upper_copy.h"

#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <map>

#include "common/unique_fd.h"
#include "node/record_store.h"

namespace warren::node {
namespace {

constexpr int kMaxDepth = 256;
constexpr uint32_t kOverflowId = 65534;

Status Errno(const std::string& what) { return ErrnoToStatus(errno, what); }

bool KeepXattr(const std::string& name) {
  if (name.rfind("trusted.overlay.", 0) != 0) return true;
  return name == "trusted.overlay.opaque" || name == "trusted.overlay.whiteout" ||
         name == "trusted.overlay.whiteouts";
}

// Copies the xattrs of src_fd (a regular file or a directory opened for
// reading) to dst_fd.
Status CopyXattrs(int src_fd, int dst_fd, const std::string& where) {
  std::string names(4096, '\0');
  ssize_t n = ::flistxattr(src_fd, names.data(), names.size());
  if (n < 0 && errno == ERANGE) {
    names.resize(65536);
    n = ::flistxattr(src_fd, names.data(), names.size());
  }
  if (n < 0) {
    if (errno == ENOTSUP) return absl::OkStatus();
    return Errno("flistxattr(" + where + ")");
  }
  size_t off = 0;
  std::string value(65536, '\0');
  while (off < static_cast<size_t>(n)) {
    std::string name(names.data() + off);
    off += name.size() + 1;
    if (name.empty() || !KeepXattr(name)) continue;
    ssize_t v = ::fgetxattr(src_fd, name.c_str(), value.data(), value.size());
    if (v < 0) {
      if (errno == ENODATA) continue;
      return Errno("fgetxattr(" + where + ", " + name + ")");
    }
    if (::fsetxattr(dst_fd, name.c_str(), value.data(), static_cast<size_t>(v), 0) != 0)
      return Errno("fsetxattr(" + where + ", " + name + ")");
  }
  return absl::OkStatus();
}

class Copier {
 public:
  Copier(const UpperCopyOptions& o, bool shift) : o_(o), shift_(shift) {}

  uint32_t Map(uint32_t id) const {
    if (!shift_ || o_.id_range == 0) return id;
    if (id >= o_.host_root_id && id - o_.host_root_id < o_.id_range) return id - o_.host_root_id;
    return kOverflowId;
  }

  // Copies the entries of directory src_fd into dst_fd (both directories).
  Status CopyDir(int src_fd, int dst_fd, const std::string& inside, const std::string& dst_path,
                 int depth) {
    if (depth > kMaxDepth) return absl::InvalidArgumentError("upper tree deeper than 256 at " + inside);
    int dup_fd = ::openat(src_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dup_fd < 0) return Errno("openat(" + inside + ")");
    DIR* d = ::fdopendir(dup_fd);
    if (d == nullptr) {
      ::close(dup_fd);
      return Errno("fdopendir(" + inside + ")");
    }
    std::vector<std::string> names;
    errno = 0;
    while (dirent* de = ::readdir(d)) {
      std::string n = de->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    int rerr = errno;
    ::closedir(d);
    if (rerr != 0) return ErrnoToStatus(rerr, "readdir(" + inside + ")");
    for (const std::string& name : names) {
      std::string child = (inside == "/" ? "" : inside) + "/" + name;
      if (PathExcluded(child, o_.exclude)) continue;
      RETURN_IF_ERROR(CopyEntry(src_fd, dst_fd, name, child, dst_path + "/" + name, depth));
    }
    return absl::OkStatus();
  }

  Status CopyEntry(int src_dir, int dst_dir, const std::string& name, const std::string& inside,
                   const std::string& dst_path, int depth) {
    struct stat st;
    if (::fstatat(src_dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return Errno("fstatat(" + inside + ")");
    const uid_t uid = Map(st.st_uid);
    const gid_t gid = Map(st.st_gid);
    const timespec times[2] = {st.st_atim, st.st_mtim};
    if (S_ISDIR(st.st_mode)) {
      if (::mkdirat(dst_dir, name.c_str(), 0700) != 0) return Errno("mkdirat(" + dst_path + ")");
      UniqueFd s(::openat(src_dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!s.valid()) return Errno("openat(" + inside + ")");
      UniqueFd t(::openat(dst_dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!t.valid()) return Errno("openat(" + dst_path + ")");
      RETURN_IF_ERROR(CopyXattrs(s.get(), t.get(), inside));
      RETURN_IF_ERROR(CopyDir(s.get(), t.get(), inside, dst_path, depth + 1));
      if (::fchown(t.get(), uid, gid) != 0) return Errno("fchown(" + dst_path + ")");
      if (::fchmod(t.get(), st.st_mode & 07777) != 0) return Errno("fchmod(" + dst_path + ")");
      if (::futimens(t.get(), times) != 0) return Errno("futimens(" + dst_path + ")");
      return absl::OkStatus();
    }
    if (S_ISREG(st.st_mode)) {
      if (st.st_nlink > 1) {
        auto it = links_.find(st.st_ino);
        if (it != links_.end()) {
          if (::linkat(AT_FDCWD, it->second.c_str(), dst_dir, name.c_str(), 0) != 0)
            return Errno("linkat(" + it->second + ", " + dst_path + ")");
          return absl::OkStatus();
        }
        links_[st.st_ino] = dst_path;
      }
      UniqueFd s(::openat(src_dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
      if (!s.valid()) return Errno("openat(" + inside + ")");
      UniqueFd t(::openat(dst_dir, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
      if (!t.valid()) return Errno("openat(" + dst_path + ", O_CREAT)");
      off_t left = st.st_size;
      int rounds = 0;
      while (left > 0) {
        ssize_t n = ::copy_file_range(s.get(), nullptr, t.get(), nullptr, static_cast<size_t>(left), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP) && rounds == 0) {
          RETURN_IF_ERROR(ReadWriteCopy(s.get(), t.get(), inside));
          left = 0;
          break;
        }
        if (n < 0) return Errno("copy_file_range(" + inside + ")");
        if (n == 0) break;  // file shrank while copied
        left -= n;
        ++rounds;
      }
      RETURN_IF_ERROR(CopyXattrs(s.get(), t.get(), inside));
      if (::fchown(t.get(), uid, gid) != 0) return Errno("fchown(" + dst_path + ")");
      if (::fchmod(t.get(), st.st_mode & 07777) != 0) return Errno("fchmod(" + dst_path + ")");
      if (::futimens(t.get(), times) != 0) return Errno("futimens(" + dst_path + ")");
      return absl::OkStatus();
    }
    if (S_ISLNK(st.st_mode)) {
      std::string target(4096, '\0');
      ssize_t n = ::readlinkat(src_dir, name.c_str(), target.data(), target.size());
      if (n < 0) return Errno("readlinkat(" + inside + ")");
      target.resize(static_cast<size_t>(n));
      if (::symlinkat(target.c_str(), dst_dir, name.c_str()) != 0) return Errno("symlinkat(" + dst_path + ")");
    } else {
      // Whiteouts (char 0:0), fifos, sockets, device nodes: recreated as is.
      if (::mknodat(dst_dir, name.c_str(), st.st_mode, st.st_rdev) != 0) return Errno("mknodat(" + dst_path + ")");
      if (::fchmodat(dst_dir, name.c_str(), st.st_mode & 07777, 0) != 0) return Errno("fchmodat(" + dst_path + ")");
    }
    if (::fchownat(dst_dir, name.c_str(), uid, gid, AT_SYMLINK_NOFOLLOW) != 0) return Errno("fchownat(" + dst_path + ")");
    if (::utimensat(dst_dir, name.c_str(), times, AT_SYMLINK_NOFOLLOW) != 0) return Errno("utimensat(" + dst_path + ")");
    return absl::OkStatus();
  }

  static Status ReadWriteCopy(int s, int t, const std::string& inside) {
    std::string buf(1 << 20, '\0');
    for (;;) {
      ssize_t n = ::read(s, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Errno("read(" + inside + ")");
      if (n == 0) return absl::OkStatus();
      ssize_t off = 0;
      while (off < n) {
        ssize_t w = ::write(t, buf.data() + off, static_cast<size_t>(n - off));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return Errno("write(copy of " + inside + ")");
        off += w;
      }
    }
  }

 private:
  const UpperCopyOptions& o_;
  const bool shift_;
  std::map<ino_t, std::string> links_;  // first dst path of each multiply-linked inode
};

std::vector<std::string> Components(const std::string& path) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < path.size()) {
    while (i < path.size() && path[i] == '/') ++i;
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    if (j > i) out.push_back(path.substr(i, j - i));
    i = j;
  }
  return out;
}

bool IsWhiteout(const struct stat& st) { return S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0); }

bool IsOpaque(int dir_fd) {
  char v[4];
  ssize_t n = ::fgetxattr(dir_fd, "trusted.overlay.opaque", v, sizeof v);
  return n > 0 && v[0] == 'y';
}

}  // namespace

bool PathExcluded(const std::string& inside_path, const std::vector<std::string>& patterns) {
  for (std::string p : patterns) {
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    if (p.empty()) continue;
    if (p[0] != '/' && p[0] != '*') p = "/" + p;
    if (p == inside_path || ::fnmatch(p.c_str(), inside_path.c_str(), 0) == 0) return true;
  }
  return false;
}

Status CopyUpperTree(int src_dir_fd, const std::string& dst, const UpperCopyOptions& options) {
  if (::mkdir(dst.c_str(), 0755) != 0) return Errno("mkdir(" + dst + ")");
  UniqueFd t(::open(dst.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  Status s = t.valid() ? absl::OkStatus() : Errno("open(" + dst + ")");
  Copier c(options, true);
  if (s.ok()) s = CopyXattrs(src_dir_fd, t.get(), "/");
  if (s.ok()) s = c.CopyDir(src_dir_fd, t.get(), "/", dst, 0);
  if (!s.ok()) {
    (void)RemoveTree(dst);
    return s;
  }
  return absl::OkStatus();
}

bool UpperTouches(int upper_dir_fd, const std::string& path) {
  std::vector<std::string> comps = Components(path);
  if (comps.empty()) return true;
  UniqueFd cur(::openat(upper_dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  for (size_t i = 0; i < comps.size() && cur.valid(); ++i) {
    struct stat st;
    if (::fstatat(cur.get(), comps[i].c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return false;
    if (i + 1 == comps.size()) return true;   // the path itself is in the upper
    if (!S_ISDIR(st.st_mode)) return true;    // an ancestor replaced or deleted
    UniqueFd next(::openat(cur.get(), comps[i].c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next.valid()) return true;
    if (IsOpaque(next.get())) return true;    // ancestor deleted and recreated
    cur = std::move(next);
  }
  return false;
}

Status RestoreFromLowers(const std::string& dst, const std::string& path,
                         const std::vector<std::string>& lower_dirs) {
  std::vector<std::string> comps = Components(path);
  if (comps.empty()) return absl::InvalidArgumentError("cannot restore \"/\"");
  // The pristine entry: in the topmost lower that has it.
  std::string full_rel;
  for (const std::string& c : comps) full_rel += "/" + c;
  std::string src;
  for (auto it = lower_dirs.rbegin(); it != lower_dirs.rend(); ++it) {
    struct stat st;
    if (::lstat((*it + full_rel).c_str(), &st) != 0) continue;
    if (!IsWhiteout(st)) src = *it + full_rel;
    break;
  }
  const std::string target = dst + full_rel;
  if (src.empty()) {  // absent when pristine (the caller excluded it from dst)
    struct stat st;
    if (::lstat(target.c_str(), &st) != 0) {
      return errno == ENOENT || errno == ENOTDIR ? absl::OkStatus() : Errno("lstat(" + target + ")");
    }
    return RemoveTree(target);
  }
  // Ensure every ancestor is a directory in dst that shows the entry.
  std::string rel;
  for (size_t i = 0; i + 1 < comps.size(); ++i) {
    rel += "/" + comps[i];
    std::string d = dst + rel;
    struct stat st;
    if (::lstat(d.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) continue;
      // Replaced by the agent (whiteout, file, symlink): an opaque dir
      // holding only the restored entry.
      if (::unlink(d.c_str()) != 0) return Errno("unlink(" + d + ")");
      if (::mkdir(d.c_str(), 0755) != 0) return Errno("mkdir(" + d + ")");
      if (::lsetxattr(d.c_str(), "trusted.overlay.opaque", "y", 1, 0) != 0)
        return Errno("lsetxattr(" + d + ", trusted.overlay.opaque)");
      continue;
    }
    if (errno != ENOENT) return Errno("lstat(" + d + ")");
    // Missing in the upper: a plain (merging) dir with the pristine owner/mode.
    struct stat lst {};
    bool found = false;
    for (auto it = lower_dirs.rbegin(); it != lower_dirs.rend() && !found; ++it) {
      found = ::lstat((*it + rel).c_str(), &lst) == 0 && S_ISDIR(lst.st_mode);
    }
    if (!found) return absl::OkStatus();  // cannot happen: the pristine entry has ancestors
    if (::mkdir(d.c_str(), lst.st_mode & 07777) != 0) return Errno("mkdir(" + d + ")");
    if (::chown(d.c_str(), lst.st_uid, lst.st_gid) != 0) return Errno("chown(" + d + ")");
  }
  RETURN_IF_ERROR(RemoveTree(target));
  const size_t slash = src.rfind('/');
  UniqueFd sdir(::open(src.substr(0, slash).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!sdir.valid()) return Errno("open(" + src.substr(0, slash) + ")");
  UniqueFd tdir(::open((dst + rel).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!tdir.valid()) return Errno("open(parent of " + target + ")");
  UpperCopyOptions none;
  Copier c(none, false);
  return c.CopyEntry(sdir.get(), tdir.get(), comps.back(), path, target, 0);
}

}  // namespace warren::node
