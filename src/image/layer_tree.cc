#include "image/layer_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>
#include <set>

#include "common/file_util.h"
#include "common/unique_fd.h"

namespace warren::image {
namespace {

constexpr uint32_t kOverflowId = 65534;
// ListChanges: levels walked (one fd each) before a directory stands for its
// subtree.
constexpr size_t kMaxListDepth = 4096;

Status Errno(const std::string& what) { return ErrnoToStatus(errno, what); }

std::string Join(const std::string& dir, const std::string& name) { return (dir == "/" ? "" : dir) + "/" + name; }

// Which xattrs of a diff go into a layer. Of trusted.overlay.* only the
// opaque/whiteout markers (the others describe the upper's own file system).
// security.* never: security.capability set inside a sandbox is a file
// capability that would be honoured wherever the layer is mounted next (the
// v3 form names the sandbox's root uid, which another sandbox may share),
// and security.selinux/ima/evm are host policy labels a sandbox must not
// choose. No allow-list entry is worth that: a tool that needs a capability
// comes from a pristine layer.
bool KeepXattr(const std::string& name) {
  if (name.rfind("security.", 0) == 0) return false;
  if (name.rfind("trusted.overlay.", 0) != 0) return true;
  return name == "trusted.overlay.opaque" || name == "trusted.overlay.whiteout" || name == "trusted.overlay.whiteouts";
}

// Copies the kept xattrs of src_fd (a regular file or a directory opened for
// reading) to dst_fd, charging their size.
Status CopyXattrs(int src_fd, int dst_fd, const std::string& where, CopyBudget* budget, bool drop_opaque = false) {
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
    if (drop_opaque && name == "trusted.overlay.opaque") continue;
    ssize_t v = ::fgetxattr(src_fd, name.c_str(), value.data(), value.size());
    if (v < 0) {
      if (errno == ENODATA) continue;
      return Errno("fgetxattr(" + where + ", " + name + ")");
    }
    if (budget != nullptr) RETURN_IF_ERROR(budget->Charge(name.size() + static_cast<uint64_t>(v)));
    if (::fsetxattr(dst_fd, name.c_str(), value.data(), static_cast<size_t>(v), 0) != 0)
      return Errno("fsetxattr(" + where + ", " + name + ")");
  }
  return absl::OkStatus();
}

// Names of the entries of directory `fd` (without "." and "..").
StatusOr<std::vector<std::string>> ReadNames(int fd, const std::string& where) {
  int dup_fd = ::openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dup_fd < 0) return Errno("openat(" + where + ")");
  DIR* d = ::fdopendir(dup_fd);
  if (d == nullptr) {
    int err = errno;
    ::close(dup_fd);
    return ErrnoToStatus(err, "fdopendir(" + where + ")");
  }
  std::vector<std::string> names;
  errno = 0;
  while (dirent* de = ::readdir(d)) {
    std::string n = de->d_name;
    if (n != "." && n != "..") names.push_back(std::move(n));
    errno = 0;
  }
  int rerr = errno;
  ::closedir(d);
  if (rerr != 0) return ErrnoToStatus(rerr, "readdir(" + where + ")");
  std::sort(names.begin(), names.end());
  return names;
}

UniqueFd OpenDirAt(int dir_fd, const std::string& name) {
  return UniqueFd(::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
}

bool IsOpaque(int dir_fd) {
  char v[4];
  ssize_t n = ::fgetxattr(dir_fd, "trusted.overlay.opaque", v, sizeof v);
  return n > 0 && v[0] == 'y';
}

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

// The entry at `path` (inside) in the merged view of the pristine layers
// (bottom first), looked up one component at a time through fds with
// O_NOFOLLOW: a symlink on the way, a whiteout or a missing entry in the
// topmost layer that has the path means "not there". Only directories are
// asked for (ancestor metadata), so an opaque dir stops the search below it.
// *other (optional) is set when the path resolves to something that is not
// a directory (a symlink, a file; whiteouts excluded).
bool PristineDir(const std::vector<int>& roots, const std::string& path, struct stat* st, bool* other = nullptr) {
  const std::vector<std::string> comps = Components(path);
  if (other != nullptr) *other = false;
  for (auto it = roots.rbegin(); it != roots.rend(); ++it) {
    UniqueFd cur(::openat(*it, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    bool stop = false;  // this layer decides: hidden below
    size_t i = 0;
    for (; i < comps.size() && cur.valid(); ++i) {
      struct stat s;
      if (::fstatat(cur.get(), comps[i].c_str(), &s, AT_SYMLINK_NOFOLLOW) != 0) break;
      if (!S_ISDIR(s.st_mode)) {
        stop = true;  // whiteout or a non-directory hides every lower layer
        if (other != nullptr && !(S_ISCHR(s.st_mode) && s.st_rdev == makedev(0, 0))) *other = true;
        break;
      }
      UniqueFd next = OpenDirAt(cur.get(), comps[i]);
      if (!next.valid()) break;
      if (i + 1 == comps.size()) {
        if (::fstat(next.get(), st) != 0) return false;
        return true;
      }
      if (IsOpaque(next.get())) stop = true;  // below here only this layer counts
      cur = std::move(next);
    }
    if (comps.empty() && cur.valid()) return ::fstat(cur.get(), st) == 0;
    if (stop) return false;
  }
  return false;
}

// Iterative copier of diff subtrees into a staging tree. Holds two fds per
// level of the subtree being copied (no recursion).
class Copier {
 public:
  Copier(const DiffCopyOptions& o, bool shift, int dst_root_fd, std::string dst_root)
      : o_(o), shift_(shift), dst_root_fd_(dst_root_fd), dst_root_(std::move(dst_root)) {}

  uint32_t Map(uint32_t id) const {
    if (!shift_ || o_.id_range == 0) return id;
    if (id >= o_.host_root_id && id - o_.host_root_id < o_.id_range) return id - o_.host_root_id;
    return kOverflowId;
  }

  // Paths under which a directory must not be copied opaque and whose
  // non-directory replacements are skipped (protected paths inside a
  // solution: the layers below must show through).
  void SetKeepMerging(std::vector<std::string> paths) { keep_merging_ = std::move(paths); }

  // Copies entry `name` of src_dir into dst_dir; `inside` is its path in the
  // sandbox, `rel` its path below the staging root. A directory is copied
  // with its whole subtree.
  Status CopyEntry(int src_dir, int dst_dir, const std::string& name, const std::string& inside, const std::string& rel,
                   bool make_opaque = false) {
    RETURN_IF_ERROR(CheckLength(rel));
    struct stat st;
    if (::fstatat(src_dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return Errno("fstatat(" + inside + ")");
    if (!S_ISDIR(st.st_mode)) return CopyLeaf(src_dir, dst_dir, name, inside, rel, st);
    struct Frame {
      UniqueFd src, dst;
      std::string inside, rel;
      struct stat st;
      std::vector<std::string> names;
      size_t next = 0;
    };
    std::vector<Frame> stack;
    auto open_dir = [&](int sdir, int ddir, const std::string& n, const std::string& in, const std::string& r,
                        const struct stat& s, bool opaque) -> Status {
      RETURN_IF_ERROR(Charge(CopyBudget::kEntryCost + n.size()));
      if (::mkdirat(ddir, n.c_str(), 0700) != 0) return Errno("mkdirat(" + Show(r) + ")");
      Frame f;
      f.src = OpenDirAt(sdir, n);
      if (!f.src.valid()) return Errno("openat(" + in + ")");
      f.dst = OpenDirAt(ddir, n);
      if (!f.dst.valid()) return Errno("openat(" + Show(r) + ")");
      RETURN_IF_ERROR(CopyXattrs(f.src.get(), f.dst.get(), in, o_.budget, KeepMerging(in)));
      if (opaque && !KeepMerging(in) && ::fsetxattr(f.dst.get(), "trusted.overlay.opaque", "y", 1, 0) != 0)
        return Errno("fsetxattr(" + Show(r) + ", trusted.overlay.opaque)");
      ASSIGN_OR_RETURN(f.names, ReadNames(f.src.get(), in));
      f.inside = in;
      f.rel = r;
      f.st = s;
      stack.push_back(std::move(f));
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(open_dir(src_dir, dst_dir, name, inside, rel, st, make_opaque));
    while (!stack.empty()) {
      Frame& top = stack.back();
      if (top.next < top.names.size()) {
        const std::string n = top.names[top.next++];
        const std::string in = Join(top.inside, n);
        const std::string r = top.rel + "/" + n;
        if (PathExcluded(in, o_.exclude)) continue;
        RETURN_IF_ERROR(CheckLength(r));
        struct stat cst;
        if (::fstatat(top.src.get(), n.c_str(), &cst, AT_SYMLINK_NOFOLLOW) != 0) return Errno("fstatat(" + in + ")");
        if (S_ISDIR(cst.st_mode)) {
          const int s = top.src.get(), d = top.dst.get();  // `top` dangles after push_back
          RETURN_IF_ERROR(open_dir(s, d, n, in, r, cst, false));
        } else {
          if (KeepMerging(in)) continue;  // a replaced ancestor of a protected path
          RETURN_IF_ERROR(CopyLeaf(top.src.get(), top.dst.get(), n, in, r, cst));
        }
        continue;
      }
      const timespec times[2] = {top.st.st_atim, top.st.st_mtim};
      if (::fchown(top.dst.get(), Map(top.st.st_uid), Map(top.st.st_gid)) != 0)
        return Errno("fchown(" + Show(top.rel) + ")");
      if (::fchmod(top.dst.get(), top.st.st_mode & 07777) != 0) return Errno("fchmod(" + Show(top.rel) + ")");
      if (::futimens(top.dst.get(), times) != 0) return Errno("futimens(" + Show(top.rel) + ")");
      stack.pop_back();
    }
    return absl::OkStatus();
  }

  // Copies every entry of directory src_fd (the diff root) into the staging root.
  Status CopyRoot(int src_fd) {
    RETURN_IF_ERROR(CopyXattrs(src_fd, dst_root_fd_, "/", o_.budget));
    ASSIGN_OR_RETURN(std::vector<std::string> names, ReadNames(src_fd, "/"));
    for (const std::string& n : names) {
      const std::string in = "/" + n;
      if (PathExcluded(in, o_.exclude)) continue;
      RETURN_IF_ERROR(CopyEntry(src_fd, dst_root_fd_, n, in, n));
    }
    return absl::OkStatus();
  }

  Status Charge(uint64_t bytes) { return o_.budget != nullptr ? o_.budget->Charge(bytes) : absl::OkStatus(); }

 private:
  std::string Show(const std::string& rel) const { return dst_root_ + "/" + rel; }

  // mkfs.erofs (1.5) builds host paths of at most PATH_MAX bytes.
  Status CheckLength(const std::string& rel) const {
    if (dst_root_.size() + 1 + rel.size() >= PATH_MAX) {
      return absl::FailedPreconditionError("path /" + rel.substr(0, 64) + "... (" + std::to_string(rel.size()) +
                                           " bytes) is longer than a layer can hold (" + std::to_string(PATH_MAX) +
                                           " bytes with the staging dir)");
    }
    return absl::OkStatus();
  }

  bool KeepMerging(const std::string& inside) const {
    for (const std::string& p : keep_merging_) {
      if (inside != p && PathWithin(p, inside)) return true;
    }
    return false;
  }

  Status CopyLeaf(int src_dir, int dst_dir, const std::string& name, const std::string& inside, const std::string& rel,
                  const struct stat& st) {
    RETURN_IF_ERROR(Charge(CopyBudget::kEntryCost + name.size()));
    const uid_t uid = Map(st.st_uid);
    const gid_t gid = Map(st.st_gid);
    const timespec times[2] = {st.st_atim, st.st_mtim};
    if (S_ISREG(st.st_mode)) {
      if (st.st_nlink > 1) {
        auto it = links_.find(st.st_ino);
        if (it != links_.end()) return LinkTo(it->second, dst_dir, name, rel);
        links_[st.st_ino] = rel;
      }
      UniqueFd s(::openat(src_dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
      if (!s.valid()) return Errno("openat(" + inside + ")");
      struct stat sst;
      if (::fstat(s.get(), &sst) != 0) return Errno("fstat(" + inside + ")");
      if (!S_ISREG(sst.st_mode)) return absl::FailedPreconditionError(inside + " changed while it was copied");
      UniqueFd t(::openat(dst_dir, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
      if (!t.valid()) return Errno("openat(" + Show(rel) + ", O_CREAT)");
      RETURN_IF_ERROR(Charge(static_cast<uint64_t>(sst.st_size) / CopyBudget::kHoleDivisor));
      RETURN_IF_ERROR(CopySparse(s.get(), t.get(), sst.st_size, inside));
      RETURN_IF_ERROR(CopyXattrs(s.get(), t.get(), inside, o_.budget));
      if (::fchown(t.get(), uid, gid) != 0) return Errno("fchown(" + Show(rel) + ")");
      if (::fchmod(t.get(), st.st_mode & 07777) != 0) return Errno("fchmod(" + Show(rel) + ")");
      if (::futimens(t.get(), times) != 0) return Errno("futimens(" + Show(rel) + ")");
      return absl::OkStatus();
    }
    if (S_ISLNK(st.st_mode)) {
      std::string target(PATH_MAX, '\0');
      ssize_t n = ::readlinkat(src_dir, name.c_str(), target.data(), target.size());
      if (n < 0) return Errno("readlinkat(" + inside + ")");
      target.resize(static_cast<size_t>(n));
      RETURN_IF_ERROR(Charge(target.size()));
      if (::symlinkat(target.c_str(), dst_dir, name.c_str()) != 0) return Errno("symlinkat(" + Show(rel) + ")");
    } else {
      // Whiteouts (char 0:0), fifos, sockets, device nodes: recreated as is.
      if (::mknodat(dst_dir, name.c_str(), st.st_mode, st.st_rdev) != 0) return Errno("mknodat(" + Show(rel) + ")");
      if (::fchmodat(dst_dir, name.c_str(), st.st_mode & 07777, 0) != 0) return Errno("fchmodat(" + Show(rel) + ")");
    }
    if (::fchownat(dst_dir, name.c_str(), uid, gid, AT_SYMLINK_NOFOLLOW) != 0)
      return Errno("fchownat(" + Show(rel) + ")");
    if (::utimensat(dst_dir, name.c_str(), times, AT_SYMLINK_NOFOLLOW) != 0)
      return Errno("utimensat(" + Show(rel) + ")");
    return absl::OkStatus();
  }

  // Hardlinks `name` in dst_dir to the staging entry at `first_rel`, whose
  // parent is found from the staging root one component at a time (the
  // staging tree is ours, but its names came from the sandbox).
  Status LinkTo(const std::string& first_rel, int dst_dir, const std::string& name, const std::string& rel) {
    std::vector<std::string> comps = Components(first_rel);
    UniqueFd cur(::openat(dst_root_fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    for (size_t i = 0; i + 1 < comps.size() && cur.valid(); ++i) cur = OpenDirAt(cur.get(), comps[i]);
    if (!cur.valid()) return Errno("openat(parent of " + Show(first_rel) + ")");
    if (::linkat(cur.get(), comps.back().c_str(), dst_dir, name.c_str(), 0) != 0)
      return Errno("linkat(" + Show(first_rel) + ", " + Show(rel) + ")");
    return absl::OkStatus();
  }

  // Copies the data segments of s (SEEK_DATA/SEEK_HOLE) into t and sets its
  // size: holes stay holes, and only data is charged.
  Status CopySparse(int s, int t, off_t size, const std::string& inside) {
    off_t off = 0;
    while (off < size) {
      off_t data = ::lseek(s, off, SEEK_DATA);
      if (data < 0 && errno == ENXIO) break;  // only a hole is left
      if (data < 0 && errno == EINVAL)
        data = off;  // no SEEK_DATA: all data
      else if (data < 0)
        return Errno("lseek(" + inside + ", SEEK_DATA)");
      if (data >= size) break;
      off_t hole = ::lseek(s, data, SEEK_HOLE);
      if (hole < 0) hole = size;
      hole = std::min(hole, size);
      RETURN_IF_ERROR(Charge((static_cast<uint64_t>(hole - data) + 4095) & ~uint64_t{4095}));
      RETURN_IF_ERROR(CopyRange(s, t, data, hole - data, inside));
      off = hole;
    }
    if (::ftruncate(t, size) != 0) return Errno("ftruncate(copy of " + inside + ")");
    return absl::OkStatus();
  }

  Status CopyRange(int s, int t, off_t off, off_t len, const std::string& inside) {
    loff_t in = off, out = off;
    while (len > 0) {
      ssize_t n = use_cfr_ ? ::copy_file_range(s, &in, t, &out, static_cast<size_t>(len), 0) : -1;
      if (n < 0 && use_cfr_ && errno == EINTR) continue;
      if (n < 0 && (!use_cfr_ || errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP || errno == ENOSYS)) {
        use_cfr_ = false;
        std::string buf(static_cast<size_t>(std::min<off_t>(len, 1 << 20)), '\0');
        n = ::pread(s, buf.data(), buf.size(), in);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return Errno("pread(" + inside + ")");
        if (n == 0) return absl::OkStatus();  // file shrank while copied
        ssize_t w = 0;
        while (w < n) {
          ssize_t k = ::pwrite(t, buf.data() + w, static_cast<size_t>(n - w), out + w);
          if (k < 0 && errno == EINTR) continue;
          if (k < 0) return Errno("pwrite(copy of " + inside + ")");
          w += k;
        }
        in += n;
        out += n;
        len -= n;
        continue;
      }
      if (n < 0) return Errno("copy_file_range(" + inside + ")");
      if (n == 0) return absl::OkStatus();  // file shrank while copied
      len -= n;
    }
    return absl::OkStatus();
  }

  const DiffCopyOptions& o_;
  const bool shift_;
  const int dst_root_fd_;
  const std::string dst_root_;
  bool use_cfr_ = true;
  std::vector<std::string> keep_merging_;
  std::map<ino_t, std::string> links_;  // first staging path (rel) of each multiply-linked inode
};

Status MakeStaging(const std::string& dst, UniqueFd* fd) {
  if (::mkdir(dst.c_str(), 0755) != 0) return Errno("mkdir(" + dst + ")");
  // mkdir applied the umask; a layer's root is 0755.
  fd->reset(::open(dst.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd->valid() || ::fchmod(fd->get(), 0755) != 0) {
    Status s = Errno("open/fchmod(" + dst + ")");
    fd->reset();
    (void)::rmdir(dst.c_str());
    return s;
  }
  return absl::OkStatus();
}

}  // namespace

Status CopyBudget::Charge(uint64_t bytes) {
  used_ += bytes;
  if (limit_ != 0 && used_ > limit_) {
    node_cap_hit_ = false;
    return absl::ResourceExhaustedError(what_ + ": its changes take more than " + std::to_string(limit_) +
                                        " bytes (its disk limit + 1/4), at least " + std::to_string(used_));
  }
  if (node_used_ != nullptr) {
    const uint64_t now = node_used_->fetch_add(bytes) + bytes;
    node_charged_ += bytes;
    if (node_limit_ != 0 && now > node_limit_) {
      node_cap_hit_ = true;
      return absl::ResourceExhaustedError(what_ + ": the node's snapshot/grade staging would take " +
                                          std::to_string(now) + " bytes, more than its cap of " +
                                          std::to_string(node_limit_) + " (warrend --max-staging-mb)");
    }
  }
  return absl::OkStatus();
}

void CopyBudget::ReleaseNode() {
  if (node_used_ != nullptr && node_charged_ > 0) node_used_->fetch_sub(node_charged_);
  node_charged_ = 0;
}

bool PathExcluded(const std::string& inside_path, const std::vector<std::string>& patterns) {
  for (std::string p : patterns) {
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    if (p.empty()) continue;
    if (p[0] != '/' && p[0] != '*') p = "/" + p;
    if (p == inside_path || ::fnmatch(p.c_str(), inside_path.c_str(), 0) == 0) return true;
  }
  return false;
}

bool PathWithin(const std::string& path, const std::string& prefix) {
  if (prefix == "/") return true;
  return path == prefix ||
         (path.size() > prefix.size() && path.compare(0, prefix.size(), prefix) == 0 && path[prefix.size()] == '/');
}

Status CopyDiffTree(int src_dir_fd, const std::string& dst, const DiffCopyOptions& options) {
  UniqueFd t;
  RETURN_IF_ERROR(MakeStaging(dst, &t));  // an existing dst is left alone
  Status s = Copier(options, true, t.get(), dst).CopyRoot(src_dir_fd);
  if (!s.ok()) (void)RemoveTree(dst);
  return s;
}

Status CopySolution(int src_dir_fd, const std::string& dst, const std::vector<std::string>& solution,
                    const std::vector<std::string>& protected_paths, const std::vector<int>& pristine_fds,
                    const DiffCopyOptions& options) {
  UniqueFd root;
  RETURN_IF_ERROR(MakeStaging(dst, &root));
  auto body = [&]() -> Status {
    // A solution path inside another one is copied with it.
    std::vector<std::string> roots;
    for (const std::string& a : solution) {
      bool inner = false;
      for (const std::string& b : solution) inner = inner || (a != b && PathWithin(a, b));
      if (!inner && std::find(roots.begin(), roots.end(), a) == roots.end()) roots.push_back(a);
    }
    std::vector<std::string> keep;
    for (const std::string& p : protected_paths) {
      for (const std::string& s : solution) {
        if (PathWithin(p, s)) keep.push_back(p);
      }
    }
    DiffCopyOptions with_protected = options;
    for (const std::string& p : keep) with_protected.exclude.push_back(p);
    Copier cp(with_protected, true, root.get(), dst);
    cp.SetKeepMerging(keep);
    for (const std::string& sol : roots) {
      const std::vector<std::string> comps = Components(sol);
      if (comps.empty()) return absl::InvalidArgumentError("solution path \"/\"");
      // Walk the diff to the solution path's parent: was an ancestor replaced?
      UniqueFd cur(::openat(src_dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (!cur.valid()) return Errno("openat(diff root)");
      bool replaced = false, present = true;
      for (size_t i = 0; i + 1 < comps.size(); ++i) {
        struct stat st;
        if (::fstatat(cur.get(), comps[i].c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
          present = false;  // the diff has nothing at or below here
          break;
        }
        if (!S_ISDIR(st.st_mode)) {  // whiteout, file, symlink: the solution path is gone
          present = false;
          replaced = true;
          break;
        }
        UniqueFd next = OpenDirAt(cur.get(), comps[i]);
        if (!next.valid()) return Errno("openat(" + sol + " ancestor " + comps[i] + ")");
        if (IsOpaque(next.get())) replaced = true;
        cur = std::move(next);
      }
      struct stat st;
      if (present && ::fstatat(cur.get(), comps.back().c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) present = false;
      if (!present && !replaced) continue;  // the diff does not change the solution path
      // Ancestors in staging: plain merging dirs with pristine metadata.
      UniqueFd d(::openat(root.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      std::string rel, inside;
      bool skip = false;
      for (size_t i = 0; i + 1 < comps.size(); ++i) {
        rel += (rel.empty() ? "" : "/") + comps[i];
        inside += "/" + comps[i];
        struct stat pst {};
        bool pristine_other = false;
        const bool in_pristine = PristineDir(pristine_fds, inside, &pst, &pristine_other);
        if (pristine_other) {
          // A directory here would hide a pristine symlink or file (e.g.
          // the grader's /bin -> usr/bin): the solution cannot enter here.
          skip = true;
          break;
        }
        if (::mkdirat(d.get(), comps[i].c_str(), 0755) == 0) {
          RETURN_IF_ERROR(cp.Charge(CopyBudget::kEntryCost + comps[i].size()));
          UniqueFd n = OpenDirAt(d.get(), comps[i]);
          if (!n.valid()) return Errno("openat(" + dst + "/" + rel + ")");
          if (::fchown(n.get(), in_pristine ? pst.st_uid : 0, in_pristine ? pst.st_gid : 0) != 0)
            return Errno("fchown(" + dst + "/" + rel + ")");
          if (::fchmod(n.get(), in_pristine ? pst.st_mode & 07777 : 0755) != 0)
            return Errno("fchmod(" + dst + "/" + rel + ")");
          if (in_pristine) {
            const timespec times[2] = {pst.st_atim, pst.st_mtim};
            (void)::futimens(n.get(), times);
          }
          d = std::move(n);
        } else if (errno == EEXIST) {
          d = OpenDirAt(d.get(), comps[i]);  // made for another solution path
          if (!d.valid()) return Errno("openat(" + dst + "/" + rel + ")");
        } else {
          return Errno("mkdirat(" + dst + "/" + rel + ")");
        }
      }
      if (skip) continue;
      const std::string srel = rel.empty() ? comps.back() : rel + "/" + comps.back();
      if (!present) {
        // An ancestor was deleted or replaced and nothing took the
        // solution path's place: it is deleted (unless protected).
        bool prot = false;
        for (const std::string& p : keep) prot = prot || PathWithin(p, sol);
        if (prot) continue;
        if (::mknodat(d.get(), comps.back().c_str(), S_IFCHR | 0, makedev(0, 0)) != 0 && errno != EEXIST)
          return Errno("mknodat(whiteout " + dst + "/" + srel + ")");
        continue;
      }
      RETURN_IF_ERROR(cp.CopyEntry(cur.get(), d.get(), comps.back(), sol, srel, replaced));
    }
    return absl::OkStatus();
  };
  Status s = body();
  if (!s.ok()) (void)RemoveTree(dst);
  return s;
}

Status ListChanges(int src_dir_fd, const std::vector<std::string>& solution, const std::vector<int>& pristine_fds,
                   const DiffCopyOptions& options, size_t max, std::vector<std::string>* out, bool* truncated) {
  Copier ids(options, true, -1, "");
  auto add = [&](const std::string& p) {
    if (out->size() >= max) {
      *truncated = true;
      return;
    }
    out->push_back(p);
  };
  auto in_solution = [&](const std::string& p) {
    for (const std::string& s : solution) {
      if (PathWithin(p, s)) return true;
    }
    return false;
  };
  struct Frame {
    UniqueFd fd;
    std::string inside;
    std::vector<std::string> names;
    size_t next = 0;
  };
  std::vector<Frame> stack;
  {
    Frame f;
    f.fd.reset(::openat(src_dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!f.fd.valid()) return Errno("openat(diff root)");
    f.inside = "/";
    ASSIGN_OR_RETURN(f.names, ReadNames(f.fd.get(), "/"));
    stack.push_back(std::move(f));
  }
  while (!stack.empty() && !*truncated) {
    Frame& top = stack.back();
    if (top.next >= top.names.size()) {
      stack.pop_back();
      continue;
    }
    const std::string n = top.names[top.next++];
    const std::string in = Join(top.inside, n);
    if (in_solution(in)) continue;
    struct stat st;
    if (::fstatat(top.fd.get(), n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return Errno("fstatat(" + in + ")");
    if (!S_ISDIR(st.st_mode)) {
      add(in);
      continue;
    }
    Frame f;
    f.fd = OpenDirAt(top.fd.get(), n);
    if (!f.fd.valid()) return Errno("openat(" + in + ")");
    struct stat pst;
    const bool opaque = IsOpaque(f.fd.get());
    const bool is_new = !PristineDir(pristine_fds, in, &pst);
    if (opaque || is_new || (pst.st_mode & 07777) != (st.st_mode & 07777) || pst.st_uid != ids.Map(st.st_uid) ||
        pst.st_gid != ids.Map(st.st_gid)) {
      add(in);
    }
    // A new or replaced directory is one change, listed once, unless a
    // solution path lies below it. Past kMaxListDepth levels the directory
    // stands for its subtree (bounded fds, never an error).
    bool above_solution = false;
    for (const std::string& s : solution) above_solution = above_solution || PathWithin(s, in);
    if ((opaque || is_new) && !above_solution) continue;
    if (stack.size() >= kMaxListDepth) {
      if (!opaque && !is_new) add(in);
      continue;
    }
    ASSIGN_OR_RETURN(f.names, ReadNames(f.fd.get(), in));
    f.inside = in;
    stack.push_back(std::move(f));
  }
  std::sort(out->begin(), out->end());
  return absl::OkStatus();
}

bool DiffTouches(int upper_dir_fd, const std::string& path) {
  std::vector<std::string> comps = Components(path);
  if (comps.empty()) return true;
  UniqueFd cur(::openat(upper_dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  for (size_t i = 0; i < comps.size() && cur.valid(); ++i) {
    struct stat st;
    if (::fstatat(cur.get(), comps[i].c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return false;
    if (i + 1 == comps.size()) return true;  // the path itself is in the upper
    if (!S_ISDIR(st.st_mode)) return true;   // an ancestor replaced or deleted
    UniqueFd next = OpenDirAt(cur.get(), comps[i]);
    if (!next.valid()) return true;
    if (IsOpaque(next.get())) return true;  // ancestor deleted and recreated
    cur = std::move(next);
  }
  return false;
}

}  // namespace warren::image
