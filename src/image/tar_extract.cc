#include "image/tar_extract.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/escaping.h"
#include "common/unique_fd.h"

namespace warren::image {
namespace {

constexpr size_t kMaxEntries = 10'000'000;
constexpr size_t kMaxDepth = 1024;
constexpr char kWhiteoutPrefix[] = ".wh.";
constexpr char kOpaqueMarker[] = ".wh..wh..opq";
// Progress is reported at least every this many bytes of one file's data.
constexpr size_t kProgressEvery = size_t{4} << 20;
// Blocks of zeros this large (aligned in the file) are left as holes.
constexpr size_t kHoleBlock = 4096;

bool AllZero(const char* p, size_t n) {
  static const char kZeros[kHoleBlock] = {};
  for (; n >= kHoleBlock; p += kHoleBlock, n -= kHoleBlock) {
    if (memcmp(p, kZeros, kHoleBlock) != 0) return false;
  }
  return memcmp(p, kZeros, n) == 0;
}

Status PwriteAll(int fd, const char* p, size_t n, off_t off, const std::string& entry) {
  while (n > 0) {
    ssize_t w = pwrite(fd, p, n, off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "pwrite(" + absl::CHexEscape(entry) + ")");
    }
    p += w;
    n -= static_cast<size_t>(w);
    off += w;
  }
  return absl::OkStatus();
}

std::string ErrStr(archive* a) {
  const char* s = archive_error_string(a);
  return s != nullptr ? s : "unknown libarchive error";
}

Status Bad(const std::string& entry, const std::string& why) {
  return absl::InvalidArgumentError("tar entry \"" + absl::CHexEscape(entry) + "\": " + why);
}

// Splits an archive path into components; rejects absolute paths and "..".
// "." and empty components are dropped ("./a//b" -> {a, b}; "./" -> {}).
StatusOr<std::vector<std::string>> SplitPath(const std::string& entry, const std::string& path) {
  if (!path.empty() && path[0] == '/') return Bad(entry, "absolute path");
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string part = path.substr(start, end - start);
    if (part == "..") return Bad(entry, "'..' component");
    if (!part.empty() && part != ".") parts.push_back(std::move(part));
    start = end + 1;
  }
  if (parts.size() > kMaxDepth) return Bad(entry, "path too deep");
  return parts;
}

struct DirMeta {
  mode_t mode;
  uid_t uid;
  gid_t gid;
  timespec mtime;
};

class Extractor {
 public:
  Extractor(std::string dest, int root, const TarProgressFn& progress)
      : dest_(std::move(dest)), root_(root), progress_(progress) {}
  Status Run(archive* a, const std::string& tar_path);
  bool sparse() const { return sparse_; }

 private:
  // Opens the directory holding the last component of `parts`, creating
  // missing intermediate directories (0755 root). Fails if a component is a
  // symlink or not a directory.
  StatusOr<UniqueFd> OpenParent(const std::string& entry, const std::vector<std::string>& parts, size_t n);
  Status Extract(archive* a, archive_entry* e);
  Status ApplyXattrs(archive_entry* e, int parent, const std::string& name, const std::string& entry);
  // Removes an existing non-directory `name` so the entry can replace it
  // (later tar entries win). A directory stays only if the new entry is one.
  Status MakeRoom(int parent, const std::string& name, bool new_is_dir, const std::string& entry, bool* is_dir);
  Status WriteData(archive* a, int fd, const std::string& entry, int64_t size);
  Status FinishDirs();
  // Reports the archive's bytes read so far to progress_ (if any).
  Status Report(archive* a) const;

  std::string dest_;
  int root_;
  const TarProgressFn& progress_;
  // Directory metadata applied last (children change mtimes), keyed by path
  // components so deeper ones are applied first.
  std::map<std::vector<std::string>, DirMeta> dirs_;
  bool sparse_ = false;  // some file got a hole
};

StatusOr<UniqueFd> Extractor::OpenParent(const std::string& entry, const std::vector<std::string>& parts, size_t n) {
  UniqueFd cur(fcntl(root_, F_DUPFD_CLOEXEC, 0));
  if (!cur.valid()) return ErrnoToStatus(errno, "dup(" + dest_ + ")");
  for (size_t i = 0; i < n; ++i) {
    const char* p = parts[i].c_str();
    int fd = openat(cur.get(), p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
      if (mkdirat(cur.get(), p, 0755) != 0 && errno != EEXIST) {
        return ErrnoToStatus(errno, "mkdirat(" + absl::CHexEscape(entry) + ")");
      }
      // A directory the tar does not list: fixed metadata (mtime 0), so
      // that the same tar converts to the same bytes on every node.
      dirs_.try_emplace(std::vector<std::string>(parts.begin(), parts.begin() + static_cast<ptrdiff_t>(i) + 1),
                        DirMeta{0755, 0, 0, timespec{0, 0}});
      fd = openat(cur.get(), p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (fd < 0) {
      if (errno == ELOOP || errno == ENOTDIR) {
        return Bad(entry, "path goes through a symlink or a non-directory (" + absl::CHexEscape(parts[i]) + ")");
      }
      return ErrnoToStatus(errno, "openat(" + absl::CHexEscape(entry) + ")");
    }
    cur.reset(fd);
  }
  return cur;
}

Status Extractor::ApplyXattrs(archive_entry* e, int parent, const std::string& name, const std::string& entry) {
  if (archive_entry_xattr_reset(e) == 0) return absl::OkStatus();
  // The parent is pinned by its fd; the last component is not followed.
  std::string proc = "/proc/self/fd/" + std::to_string(parent) + "/" + name;
  const char* xname;
  const void* value;
  size_t size;
  while (archive_entry_xattr_next(e, &xname, &value, &size) == ARCHIVE_OK) {
    if (lsetxattr(proc.c_str(), xname, value, size, 0) != 0) {
      return ErrnoToStatus(errno, "lsetxattr(" + absl::CHexEscape(entry) + ", " + xname + ")");
    }
  }
  return absl::OkStatus();
}

Status Extractor::MakeRoom(int parent, const std::string& name, bool new_is_dir, const std::string& entry,
                           bool* is_dir) {
  *is_dir = false;
  struct stat st;
  if (fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoToStatus(errno, "fstatat(" + absl::CHexEscape(entry) + ")");
  }
  if (S_ISDIR(st.st_mode)) {
    if (new_is_dir) {
      *is_dir = true;
      return absl::OkStatus();
    }
    if (unlinkat(parent, name.c_str(), AT_REMOVEDIR) != 0) {
      return Bad(entry, "replaces a non-empty directory");
    }
    return absl::OkStatus();
  }
  if (unlinkat(parent, name.c_str(), 0) != 0) {
    return ErrnoToStatus(errno, "unlinkat(" + absl::CHexEscape(entry) + ")");
  }
  return absl::OkStatus();
}

Status Extractor::WriteData(archive* a, int fd, const std::string& entry, int64_t size) {
  const void* buf;
  size_t len;
  la_int64_t off;
  size_t since_report = 0;
  off_t written_end = 0;  // end of the data seen so far
  for (;;) {
    int r = archive_read_data_block(a, &buf, &len, &off);
    if (r == ARCHIVE_EOF) break;
    if (r < ARCHIVE_WARN) {
      return Bad(entry, std::string("reading data: ") + ErrStr(a));
    }
    since_report += len;
    if (since_report >= kProgressEvery) {
      since_report = 0;
      RETURN_IF_ERROR(Report(a));
    }
    // The data in pieces up to each kHoleBlock boundary of the file: runs of
    // pieces with data are written with one pwrite, all-zero pieces skipped
    // (the file is new: what is not written reads as zeros, and ftruncate
    // below sets its size).
    const char* data = static_cast<const char*>(buf);
    const off_t base = static_cast<off_t>(off);
    if (base > written_end) sparse_ = true;  // a hole of a sparse entry
    size_t run = 0, pos = 0;                 // [run, pos): data not written yet
    while (pos < len) {
      const size_t in_block = static_cast<size_t>(base + static_cast<off_t>(pos)) % kHoleBlock;
      const size_t piece = std::min(len - pos, kHoleBlock - in_block);
      // Zeros are skipped in any piece (libarchive's blocks need not be
      // aligned: a block of zeros may come in two parts); a whole block of
      // them makes the file sparse.
      if (AllZero(data + pos, piece)) {
        RETURN_IF_ERROR(PwriteAll(fd, data + run, pos - run, base + static_cast<off_t>(run), entry));
        run = pos + piece;
        if (piece == kHoleBlock) sparse_ = true;
      }
      pos += piece;
    }
    RETURN_IF_ERROR(PwriteAll(fd, data + run, len - run, base + static_cast<off_t>(run), entry));
    written_end = std::max(written_end, base + static_cast<off_t>(len));
  }
  // Holes at the end are not written.
  if (written_end < size) sparse_ = true;
  if (ftruncate(fd, size) != 0) {
    return ErrnoToStatus(errno, "ftruncate(" + absl::CHexEscape(entry) + ")");
  }
  return absl::OkStatus();
}

Status Extractor::Extract(archive* a, archive_entry* e) {
  const char* raw = archive_entry_pathname(e);
  if (raw == nullptr) return Bad("?", "entry without a path");
  const std::string entry = raw;
  ASSIGN_OR_RETURN(std::vector<std::string> parts, SplitPath(entry, entry));
  const mode_t type = archive_entry_filetype(e);
  const mode_t perm = archive_entry_perm(e) & 07777;
  const uid_t uid = static_cast<uid_t>(archive_entry_uid(e));
  const gid_t gid = static_cast<gid_t>(archive_entry_gid(e));
  timespec mtime = {static_cast<time_t>(archive_entry_mtime(e)), archive_entry_mtime_nsec(e)};
  const char* hardlink = archive_entry_hardlink(e);

  if (parts.empty()) {  // "./": the layer root
    if (hardlink != nullptr || type != AE_IFDIR) return Bad(entry, "root is not a directory");
    dirs_[parts] = DirMeta{perm, uid, gid, mtime};
    return ApplyXattrs(e, root_, ".", entry);
  }
  ASSIGN_OR_RETURN(UniqueFd parent, OpenParent(entry, parts, parts.size() - 1));
  const std::string& name = parts.back();
  const int pfd = parent.get();

  // OCI whiteouts.
  if (name == kOpaqueMarker) {
    if (fsetxattr(pfd, "trusted.overlay.opaque", "y", 1, 0) != 0) {
      return ErrnoToStatus(errno, "fsetxattr(" + absl::CHexEscape(entry) + ", trusted.overlay.opaque)");
    }
    return absl::OkStatus();
  }
  if (name.rfind(kWhiteoutPrefix, 0) == 0) {
    std::string target = name.substr(sizeof(kWhiteoutPrefix) - 1);
    if (target.empty() || target == "." || target == "..") return Bad(entry, "bad whiteout");
    bool is_dir;
    RETURN_IF_ERROR(MakeRoom(pfd, target, false, entry, &is_dir));
    if (mknodat(pfd, target.c_str(), S_IFCHR | 0, makedev(0, 0)) != 0) {
      return ErrnoToStatus(errno, "mknodat(" + absl::CHexEscape(entry) + ", whiteout)");
    }
    if (fchownat(pfd, target.c_str(), uid, gid, AT_SYMLINK_NOFOLLOW) != 0) {
      return ErrnoToStatus(errno, "fchownat(" + absl::CHexEscape(entry) + ")");
    }
    return absl::OkStatus();
  }

  if (hardlink != nullptr) {
    ASSIGN_OR_RETURN(std::vector<std::string> tparts, SplitPath(entry, hardlink));
    if (tparts.empty()) return Bad(entry, "hardlink to the root");
    ASSIGN_OR_RETURN(UniqueFd tparent, OpenParent(entry, tparts, tparts.size() - 1));
    struct stat st;
    if (fstatat(tparent.get(), tparts.back().c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      return Bad(entry, "hardlink target " + absl::CHexEscape(hardlink) + " missing");
    }
    if (S_ISDIR(st.st_mode)) return Bad(entry, "hardlink to a directory");
    if (tparts == parts) return absl::OkStatus();
    bool is_dir;
    RETURN_IF_ERROR(MakeRoom(pfd, name, false, entry, &is_dir));
    // No AT_SYMLINK_FOLLOW: a link to a symlink links the symlink itself.
    if (linkat(tparent.get(), tparts.back().c_str(), pfd, name.c_str(), 0) != 0) {
      return ErrnoToStatus(errno, "linkat(" + absl::CHexEscape(entry) + ")");
    }
    // pax may carry data for a hardlink (rare); ignore it.
    return absl::OkStatus();
  }

  bool is_dir = false;
  RETURN_IF_ERROR(MakeRoom(pfd, name, type == AE_IFDIR, entry, &is_dir));
  const char* n = name.c_str();
  switch (type) {
    case AE_IFDIR:
      if (!is_dir && mkdirat(pfd, n, 0700) != 0) {
        return ErrnoToStatus(errno, "mkdirat(" + absl::CHexEscape(entry) + ")");
      }
      dirs_[parts] = DirMeta{perm, uid, gid, mtime};
      return ApplyXattrs(e, pfd, name, entry);
    case AE_IFREG: {
      UniqueFd fd(openat(pfd, n, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
      if (!fd.valid()) return ErrnoToStatus(errno, "openat(" + absl::CHexEscape(entry) + ")");
      RETURN_IF_ERROR(WriteData(a, fd.get(), entry, archive_entry_size(e)));
      break;
    }
    case AE_IFLNK: {
      const char* target = archive_entry_symlink(e);
      if (target == nullptr) return Bad(entry, "symlink without a target");
      if (symlinkat(target, pfd, n) != 0) {
        return ErrnoToStatus(errno, "symlinkat(" + absl::CHexEscape(entry) + ")");
      }
      break;
    }
    case AE_IFIFO:
      if (mknodat(pfd, n, S_IFIFO | 0600, 0) != 0) {
        return ErrnoToStatus(errno, "mknodat(" + absl::CHexEscape(entry) + ", fifo)");
      }
      break;
    case AE_IFCHR:
    case AE_IFBLK: return Bad(entry, "device nodes are not allowed in a layer");
    default: return Bad(entry, "unsupported entry type");
  }
  if (fchownat(pfd, n, uid, gid, AT_SYMLINK_NOFOLLOW) != 0) {
    return ErrnoToStatus(errno, "fchownat(" + absl::CHexEscape(entry) + ")");
  }
  // chmod after chown: chown clears setuid/setgid. Not for symlinks (their
  // mode is meaningless and chmod would follow them).
  if (type != AE_IFLNK && fchmodat(pfd, n, perm, 0) != 0) {
    return ErrnoToStatus(errno, "fchmodat(" + absl::CHexEscape(entry) + ")");
  }
  RETURN_IF_ERROR(ApplyXattrs(e, pfd, name, entry));
  timespec times[2] = {mtime, mtime};
  if (utimensat(pfd, n, times, AT_SYMLINK_NOFOLLOW) != 0) {
    return ErrnoToStatus(errno, "utimensat(" + absl::CHexEscape(entry) + ")");
  }
  return absl::OkStatus();
}

Status Extractor::FinishDirs() {
  // Deepest first, so setting a child's metadata does not touch a parent's
  // mtime after it was set.
  std::vector<std::pair<std::vector<std::string>, DirMeta>> order(dirs_.begin(), dirs_.end());
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
  for (const auto& [parts, meta] : order) {
    std::string shown = parts.empty() ? "." : parts.back();
    UniqueFd fd;
    if (parts.empty()) {
      fd.reset(fcntl(root_, F_DUPFD_CLOEXEC, 0));
    } else {
      ASSIGN_OR_RETURN(UniqueFd parent, OpenParent(shown, parts, parts.size() - 1));
      fd.reset(openat(parent.get(), parts.back().c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    }
    // Replaced by a later non-directory entry: nothing to apply.
    if (!fd.valid()) continue;
    if (fchown(fd.get(), meta.uid, meta.gid) != 0) {
      return ErrnoToStatus(errno, "fchown(" + absl::CHexEscape(shown) + ")");
    }
    if (fchmod(fd.get(), meta.mode) != 0) {
      return ErrnoToStatus(errno, "fchmod(" + absl::CHexEscape(shown) + ")");
    }
    timespec times[2] = {meta.mtime, meta.mtime};
    if (futimens(fd.get(), times) != 0) {
      return ErrnoToStatus(errno, "futimens(" + absl::CHexEscape(shown) + ")");
    }
  }
  return absl::OkStatus();
}

Status Extractor::Report(archive* a) const {
  if (!progress_) return absl::OkStatus();
  const la_int64_t n = archive_filter_bytes(a, -1);
  if (!progress_(n > 0 ? static_cast<uint64_t>(n) : 0)) return absl::CancelledError("tar extraction cancelled");
  return absl::OkStatus();
}

Status Extractor::Run(archive* a, const std::string& tar_path) {
  archive_entry* e = nullptr;
  std::string last = "(start of archive)";
  // The root unless the tar has a "./" entry: 0755 root:root, mtime 0
  // (deterministic conversion, as for the dirs OpenParent makes).
  dirs_.try_emplace(std::vector<std::string>{}, DirMeta{0755, 0, 0, timespec{0, 0}});
  for (size_t count = 0;; ++count) {
    if (count >= kMaxEntries) return Bad(last, "too many entries");
    int r = archive_read_next_header(a, &e);
    if (r == ARCHIVE_EOF) break;
    if (r < ARCHIVE_WARN) {
      return absl::InvalidArgumentError("tar " + tar_path + ": bad header after entry " + absl::CHexEscape(last) +
                                        ": " + ErrStr(a));
    }
    const char* p = archive_entry_pathname(e);
    last = p ? p : "?";
    RETURN_IF_ERROR(Extract(a, e));
    RETURN_IF_ERROR(Report(a));
  }
  return FinishDirs();
}

}  // namespace

Status ExtractTar(const std::string& tar_path, const std::string& dest, const TarProgressFn& progress, bool* sparse) {
  UniqueFd root(open(dest.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!root.valid()) return ErrnoToStatus(errno, "open(" + dest + ")");
  std::unique_ptr<archive, decltype(&archive_read_free)> a(archive_read_new(), &archive_read_free);
  if (!a) return absl::ResourceExhaustedError("archive_read_new failed");
  archive_read_support_filter_all(a.get());
  archive_read_support_format_tar(a.get());
  archive_read_support_format_gnutar(a.get());
  if (archive_read_open_filename(a.get(), tar_path.c_str(), 1 << 16) != ARCHIVE_OK) {
    return absl::InvalidArgumentError("tar " + tar_path + ": " + ErrStr(a.get()));
  }
  Extractor x(dest, root.get(), progress);
  Status st = x.Run(a.get(), tar_path);
  if (sparse != nullptr) *sparse = x.sparse();
  return st;
}

}  // namespace warren::image
