#include "runtime/container/rooted_files.h"

#include "runtime/container/rooted_resolve.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#if __has_include(<linux/openat2.h>)
#include <linux/openat2.h>
#else
struct open_how {
  uint64_t flags;
  uint64_t mode;
  uint64_t resolve;
};
#define RESOLVE_NO_MAGICLINKS 0x02
#define RESOLVE_IN_ROOT 0x10
#endif
#ifndef SYS_openat2
#define SYS_openat2 437
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <utility>
#include <vector>

namespace warren::runtime {
namespace {

using namespace rooted;  // NOLINT(google-build-using-namespace): the resolver's room

constexpr uint32_t kOverflowId = 65534;
constexpr int kMaxRemoveDepth = 256;         // one fd per level while removing a tree
constexpr int kMaxAncestors = PATH_MAX / 3;  // "../" steps from a directory up to the root
constexpr size_t kMaxReadChunk = 64u << 20;
constexpr mode_t kParentDirMode = 0755;  // directories created by make_parents / parents
// mode 0 means the API's default (warren.proto: WriteFileRequest.mode, MkdirRequest.mode).
constexpr mode_t kDefaultFileMode = 0644;
constexpr char kTempPrefix[] = ".warren-tmp-";

// --- helpers ---------------------------------------------------------------

struct DirEntry {
  std::string name;
  unsigned char type;
};

// All entries of an open directory except "." and "..", byte-exact names.
StatusOr<std::vector<DirEntry>> ReadDir(int fd, const std::string& op, const std::string& path) {
  struct Dirent64 {
    ino64_t d_ino;
    off64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
  };
  std::vector<DirEntry> out;
  alignas(8) char buf[64 * 1024];
  while (true) {
    long n = syscall(SYS_getdents64, fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno(errno, op, path);
    if (n == 0) break;
    for (long off = 0; off < n;) {
      auto* d = reinterpret_cast<Dirent64*>(buf + off);
      off += d->d_reclen;
      if (strcmp(d->d_name, ".") == 0 || strcmp(d->d_name, "..") == 0) continue;
      out.push_back(DirEntry{d->d_name, d->d_type});
    }
  }
  return out;
}

std::string JoinShown(const std::string& dir, const std::string& name) {
  if (!dir.empty() && dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

StatusOr<std::string> RandomSuffix() {
  unsigned char bytes[8];
  size_t got = 0;
  for (int i = 0; i < 8 && got < sizeof(bytes); ++i) {
    ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "getrandom()");
    got += static_cast<size_t>(n);
  }
  if (got < sizeof(bytes)) return absl::InternalError("getrandom(): short read");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

// This thread's file-system ids set to the sandbox's root for a scope
// (setfsuid/setfsgid as raw syscalls change the calling thread only; the
// previous ids come back at the end, and with them the daemon's fs
// capabilities).
class ScopedFsIds {
 public:
  ScopedFsIds(uid_t uid, gid_t gid) {
    old_gid_ = static_cast<gid_t>(syscall(SYS_setfsgid, gid));
    old_uid_ = static_cast<uid_t>(syscall(SYS_setfsuid, uid));
  }
  ~ScopedFsIds() {
    const int err = errno;
    syscall(SYS_setfsuid, old_uid_);
    syscall(SYS_setfsgid, old_gid_);
    errno = err;
  }
  ScopedFsIds(const ScopedFsIds&) = delete;
  ScopedFsIds& operator=(const ScopedFsIds&) = delete;

 private:
  uid_t old_uid_;
  gid_t old_gid_;
};

// Runs `op` (a modifying *at() call: returns < 0 / != 0 with errno on
// failure) with the daemon's ids, and on EOVERFLOW once more as the sandbox's
// root (uid/gid on the host). A file system owned by the sandbox's user
// namespace (its /dev/shm, /dev/mqueue, a tmpfs it mounted) refuses to
// create, rename or remove entries for a caller whose fsuid/fsgid it does not
// map, and it does not map host root.
template <typename F>
int MappedRetry(uid_t uid, gid_t gid, F op) {
  int r = op();
  if (r < 0 && errno == EOVERFLOW) {
    ScopedFsIds ids(uid, gid);
    r = op();
  }
  return r;
}

class RootedWriter : public FileWriter {
 public:
  RootedWriter(UniqueFd parent, UniqueFd fd, std::string tmp_name, std::string name, std::string shown, uid_t uid,
               gid_t gid)
      : uid_(uid),
        gid_(gid),
        parent_(std::move(parent)),
        fd_(std::move(fd)),
        tmp_name_(std::move(tmp_name)),
        name_(std::move(name)),
        shown_(std::move(shown)) {}

  ~RootedWriter() override {
    if (!committed_) MappedRetry(uid_, gid_, [&] { return unlinkat(parent_.get(), tmp_name_.c_str(), 0); });
  }

  Status Write(std::string_view data) override {
    if (committed_) return absl::FailedPreconditionError("write(" + shown_ + "): already committed");
    RETURN_IF_ERROR(failed_);
    while (!data.empty()) {
      ssize_t n = write(fd_.get(), data.data(), data.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        failed_ = Errno(errno, "write", shown_);
        return failed_;
      }
      data.remove_prefix(static_cast<size_t>(n));
      written_ += static_cast<uint64_t>(n);
    }
    return absl::OkStatus();
  }

  StatusOr<uint64_t> Commit() override {
    if (committed_) return absl::FailedPreconditionError("write(" + shown_ + "): already committed");
    RETURN_IF_ERROR(failed_);
    // close() reports delayed write errors of some file systems (NFS, FUSE).
    if (close(fd_.release()) != 0 && errno != EINTR) {
      failed_ = Errno(errno, "write", shown_);
      return failed_;
    }
    if (MappedRetry(uid_, gid_,
                    [&] { return renameat(parent_.get(), tmp_name_.c_str(), parent_.get(), name_.c_str()); }) != 0) {
      failed_ = Errno(errno, "write", shown_);
      return failed_;
    }
    committed_ = true;
    return written_;
  }

 private:
  uid_t uid_;
  gid_t gid_;
  UniqueFd parent_;
  UniqueFd fd_;
  std::string tmp_name_;
  std::string name_;
  std::string shown_;
  uint64_t written_ = 0;
  bool committed_ = false;
  Status failed_;
};

class RootedReader : public FileReader {
 public:
  RootedReader(UniqueFd fd, uint64_t offset, uint64_t remaining, std::string shown)
      : fd_(std::move(fd)), offset_(offset), remaining_(remaining), shown_(std::move(shown)) {}

  StatusOr<std::string> Read(size_t max) override {
    size_t want = static_cast<size_t>(std::min<uint64_t>({max, remaining_, kMaxReadChunk}));
    std::string out(want, '\0');
    size_t got = 0;
    while (got < want) {
      ssize_t n = pread(fd_.get(), out.data() + got, want - got, static_cast<off_t>(offset_));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Errno(errno, "read", shown_);
      if (n == 0) break;
      got += static_cast<size_t>(n);
      offset_ += static_cast<uint64_t>(n);
    }
    out.resize(got);
    remaining_ -= got;
    return out;
  }

 private:
  UniqueFd fd_;
  uint64_t offset_;
  uint64_t remaining_;
  std::string shown_;
};

class RootedFiles : public SandboxFiles {
 public:
  explicit RootedFiles(RootedFilesOptions options) : opt_(std::move(options)) {}

  // Modifying calls on the sandbox's file systems (see MappedRetry).
  template <typename F>
  int AsMappedOwner(F op) {
    return MappedRetry(opt_.host_root_uid, opt_.host_root_gid, op);
  }

  StatusOr<std::unique_ptr<FileWriter>> OpenWrite(const std::string& path, uint32_t mode, bool make_parents) override {
    ASSIGN_OR_RETURN(SandboxPath p, Parse(path, "write"));
    if (mode == 0) mode = kDefaultFileMode;
    RETURN_IF_ERROR(NeedsEntry(p, "write"));
    if (p.trailing_slash) return Errno(EISDIR, "write", p.asked);
    ASSIGN_OR_RETURN(UniqueFd root, OpenRoot());
    if (make_parents) RETURN_IF_ERROR(MakeDirs(root.get(), p, p.parts.size() - 1, "write"));
    ASSIGN_OR_RETURN(UniqueFd parent, OpenParent(root.get(), p, "write", W_OK | X_OK));
    struct stat st;
    if (fstatat(parent.get(), p.last().c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode) &&
        !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) {
      return absl::InvalidArgumentError("write(" + Printable(p.asked) + "): " + SpecialKind(st.st_mode) +
                                        ", not a regular file");
    }
    if (fstatat(parent.get(), p.last().c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
      return Errno(EISDIR, "write", p.asked);
    }
    ASSIGN_OR_RETURN(std::string suffix, RandomSuffix());
    std::string tmp = kTempPrefix + suffix;
    UniqueFd fd(AsMappedOwner(
        [&] { return openat(parent.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600); }));
    if (!fd.valid()) return Errno(errno, "write", p.asked);
    // fchmod after fchown: chown clears set-id bits.
    if (fchown(fd.get(), opt_.host_root_uid, opt_.host_root_gid) != 0 || fchmod(fd.get(), mode & 07777) != 0) {
      int err = errno;
      AsMappedOwner([&] { return unlinkat(parent.get(), tmp.c_str(), 0); });
      return Errno(err, "write", p.asked);
    }
    // From here the writer owns the temporary file (unlinked unless committed).
    return std::unique_ptr<FileWriter>(std::make_unique<RootedWriter>(std::move(parent), std::move(fd), tmp, p.last(),
                                                                      p.asked, opt_.host_root_uid, opt_.host_root_gid));
  }

  StatusOr<std::unique_ptr<FileReader>> OpenRead(const std::string& path, uint64_t offset, uint64_t length) override {
    ASSIGN_OR_RETURN(SandboxPath p, Parse(path, "read"));
    ASSIGN_OR_RETURN(UniqueFd root, OpenRoot());
    // O_PATH first: an open is itself an action on anything but a regular
    // file (a device's open runs its driver, a FIFO's blocks, /proc/kmsg's
    // is a syslog call), so only an object checked to be a regular file of
    // the sandbox's own file systems is opened for reading.
    ASSIGN_OR_RETURN(UniqueFd path_fd, OpenFinal(root.get(), p, "read"));
    RETURN_IF_ERROR(RefuseKernelFs(path_fd.get(), "read", p.asked));
    struct stat st;
    if (fstat(path_fd.get(), &st) != 0) return Errno(errno, "read", p.asked);
    if (S_ISDIR(st.st_mode)) return Errno(EISDIR, "read", p.asked);
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError("read(" + Printable(p.asked) + "): " + SpecialKind(st.st_mode) +
                                        ", not a regular file");
    }
    RETURN_IF_ERROR(SandboxRootMay(st, R_OK, "read", p.asked));
    // The same inode reopened through the daemon's own /proc (no second
    // resolution a rename could race); O_NONBLOCK and O_NOCTTY as a
    // belt for the type check above.
    const std::string self_fd = "/proc/self/fd/" + std::to_string(path_fd.get());
    UniqueFd file(open(self_fd.c_str(), O_RDONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC));
    if (!file.valid()) return Errno(errno, "read", p.asked);
    uint64_t remaining = length == 0 ? UINT64_MAX : length;
    return std::unique_ptr<FileReader>(std::make_unique<RootedReader>(std::move(file), offset, remaining, p.asked));
  }

  StatusOr<FileInfo> Stat(const std::string& path) override {
    ASSIGN_OR_RETURN(SandboxPath p, Parse(path, "stat"));
    ASSIGN_OR_RETURN(UniqueFd root, OpenRoot());
    struct stat st;
    FileInfo info;
    info.path = p.asked;
    if (p.is_root() || p.last_is_dotdot()) {
      int fd = ResolveInRoot(root.get(), p.Rel(), O_PATH);
      if (fd < 0) return Errno(-fd, "stat", p.asked);
      UniqueFd dir(fd);
      RETURN_IF_ERROR(RefuseKernelFs(dir.get(), "stat", p.asked));
      if (fstat(dir.get(), &st) != 0) return Errno(errno, "stat", p.asked);
      info.name = p.is_root() ? "/" : "..";
      Fill(st, &info);
      return info;
    }
    ASSIGN_OR_RETURN(UniqueFd parent, OpenParent(root.get(), p, "stat", X_OK));
    // The entry itself, not followed; a mount point opens as the root of
    // what is mounted there (/proc, /sys).
    UniqueFd entry(openat(parent.get(), p.last().c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (!entry.valid()) return Errno(errno, "stat", p.asked);
    RETURN_IF_ERROR(RefuseKernelFs(entry.get(), "stat", p.asked));
    if (fstat(entry.get(), &st) != 0) return Errno(errno, "stat", p.asked);
    info.name = p.last();
    Fill(st, &info);
    if (S_ISLNK(st.st_mode)) {
      if (int rc = ReadLink(parent.get(), p.last().c_str(), &info.symlink_target); rc != 0) {
        return Errno(-rc, "stat", p.asked);
      }
    }
    return info;
  }

  StatusOr<std::vector<FileInfo>> List(const std::string& path) override {
    ASSIGN_OR_RETURN(SandboxPath p, Parse(path, "list"));
    ASSIGN_OR_RETURN(UniqueFd root, OpenRoot());
    int fd = ResolveInRoot(root.get(), p.Rel(), O_RDONLY | O_DIRECTORY);
    if (fd < 0) return Errno(-fd, "list", p.asked);
    UniqueFd dir(fd);
    RETURN_IF_ERROR(RefuseKernelFs(dir.get(), "list", p.asked));
    {
      struct stat st;
      if (fstat(dir.get(), &st) != 0) return Errno(errno, "list", p.asked);
      RETURN_IF_ERROR(SandboxRootMay(st, R_OK | X_OK, "list", p.asked));
      RETURN_IF_ERROR(SearchableFromRoot(root.get(), dir.get(), st, "list", p.asked));
    }
    ASSIGN_OR_RETURN(std::vector<DirEntry> entries, ReadDir(dir.get(), "list", p.asked));
    std::sort(entries.begin(), entries.end(), [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
    std::vector<FileInfo> out;
    out.reserve(entries.size());
    for (const DirEntry& e : entries) {
      struct stat st;
      if (fstatat(dir.get(), e.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) continue;  // removed by the sandbox meanwhile
        return Errno(errno, "list", JoinShown(p.asked, e.name));
      }
      FileInfo info;
      info.name = e.name;
      info.path = JoinShown(p.asked, e.name);
      Fill(st, &info);
      if (S_ISLNK(st.st_mode)) ReadLink(dir.get(), e.name.c_str(), &info.symlink_target);
      out.push_back(std::move(info));
    }
    return out;
  }

  Status Mkdir(const std::string& path, uint32_t mode, bool parents) override {
    ASSIGN_OR_RETURN(SandboxPath p, Parse(path, "mkdir"));
    if (mode == 0) mode = kParentDirMode;
    ASSIGN_OR_RETURN(UniqueFd root, OpenRoot());
    if (p.is_root() || p.last_is_dotdot()) {
      // Names an existing directory.
      if (!parents) return Errno(EEXIST, "mkdir", p.asked);
      int fd = ResolveInRoot(root.get(), p.Rel(), O_PATH | O_DIRECTORY);
      if (fd < 0) return Errno(-fd, "mkdir", p.asked);
      close(fd);
      return absl::OkStatus();
    }
    if (parents) RETURN_IF_ERROR(MakeDirs(root.get(), p, p.parts.size() - 1, "mkdir"));
    ASSIGN_OR_RETURN(UniqueFd parent, OpenParent(root.get(), p, "mkdir", W_OK | X_OK));
    if (AsMappedOwner([&] { return mkdirat(parent.get(), p.last().c_str(), 0700); }) != 0) {
      int err = errno;
      if (err == EEXIST && parents) {
        // mkdir -p: an existing directory (or a symlink to one, inside the root) is success.
        int fd = ResolveInRoot(root.get(), p.Rel(), O_PATH | O_DIRECTORY);
        if (fd >= 0) {
          close(fd);
          return absl::OkStatus();
        }
      }
      return Errno(err, "mkdir", p.asked);
    }
    return OwnNewDir(parent.get(), p.last(), mode, p.asked, "mkdir");
  }

  Status Remove(const std::string& path, bool recursive) override {
    ASSIGN_OR_RETURN(SandboxPath p, Parse(path, "remove"));
    if (p.is_root()) return absl::InvalidArgumentError("remove(" + Printable(path) + "): cannot remove /");
    RETURN_IF_ERROR(NeedsEntry(p, "remove"));
    ASSIGN_OR_RETURN(UniqueFd root, OpenRoot());
    ASSIGN_OR_RETURN(UniqueFd parent, OpenParent(root.get(), p, "remove", W_OK | X_OK));
    struct stat st;
    if (fstatat(parent.get(), p.last().c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      return Errno(errno, "remove", p.asked);
    }
    if (!S_ISDIR(st.st_mode)) {
      if (AsMappedOwner([&] { return unlinkat(parent.get(), p.last().c_str(), 0); }) != 0) {
        return Errno(errno, "remove", p.asked);
      }
      return absl::OkStatus();
    }
    if (!recursive) {
      if (AsMappedOwner([&] { return unlinkat(parent.get(), p.last().c_str(), AT_REMOVEDIR); }) != 0) {
        return Errno(errno, "remove", p.asked);
      }
      return absl::OkStatus();
    }
    return RemoveTree(parent.get(), p.last(), p.asked, 0);
  }

  Status Rename(const std::string& from, const std::string& to) override {
    ASSIGN_OR_RETURN(SandboxPath f, Parse(from, "rename"));
    ASSIGN_OR_RETURN(SandboxPath t, Parse(to, "rename"));
    const std::string shown = Printable(from) + " -> " + Printable(to);
    if (f.is_root() || t.is_root() || f.last_is_dotdot() || t.last_is_dotdot()) {
      return absl::InvalidArgumentError("rename(" + shown + "): both paths must name an entry");
    }
    ASSIGN_OR_RETURN(UniqueFd root, OpenRoot());
    ASSIGN_OR_RETURN(UniqueFd fparent, OpenParent(root.get(), f, "rename", W_OK | X_OK));
    ASSIGN_OR_RETURN(UniqueFd tparent, OpenParent(root.get(), t, "rename", W_OK | X_OK));
    if (AsMappedOwner([&] { return renameat(fparent.get(), f.last().c_str(), tparent.get(), t.last().c_str()); }) !=
        0) {
      return ErrnoToStatus(errno, "rename(" + shown + ")");
    }
    return absl::OkStatus();
  }

 private:
  StatusOr<UniqueFd> OpenRoot() {
    if (!opt_.open_root) return absl::FailedPreconditionError("sandbox files: no root");
    return opt_.open_root();
  }

  static Status NeedsEntry(const SandboxPath& p, const std::string& op) {
    if (p.is_root() || p.last_is_dotdot()) {
      return absl::InvalidArgumentError(op + "(" + Printable(p.asked) + "): the path must name an entry, not / or ..");
    }
    return absl::OkStatus();
  }

  // The directory `rel`, resolved inside the root, checked to be on the
  // sandbox's own file systems and to grant the sandbox's root `want`
  // (R_OK/W_OK/X_OK bits).
  StatusOr<UniqueFd> OpenDir(int root, const std::string& rel, int want, const std::string& op,
                             const std::string& shown) const {
    int fd = ResolveInRoot(root, rel, O_PATH | O_DIRECTORY);
    if (fd < 0) return Errno(-fd, op, shown);
    UniqueFd dir(fd);
    RETURN_IF_ERROR(RefuseKernelFs(dir.get(), op, shown));
    struct stat st;
    if (fstat(dir.get(), &st) != 0) return Errno(errno, op, shown);
    RETURN_IF_ERROR(SandboxRootMay(st, want, op, shown));
    RETURN_IF_ERROR(SearchableFromRoot(root, dir.get(), st, op, shown));
    return dir;
  }

  // An O_PATH fd of what `p` names, symlinks followed inside the root as
  // the sandbox's own walk would, with its root's search rights checked on
  // every directory on the way (OpenDir): a final symlink's target is looked
  // up from the link's directory, component by component.
  StatusOr<UniqueFd> OpenFinal(int root, const SandboxPath& p, const std::string& op) const {
    if (p.is_root() || p.last_is_dotdot()) {
      int fd = ResolveInRoot(root, p.Rel(), O_PATH | O_DIRECTORY);
      if (fd < 0) return Errno(-fd, op, p.asked);
      UniqueFd dir(fd);
      struct stat st;
      if (fstat(dir.get(), &st) != 0) return Errno(errno, op, p.asked);
      RETURN_IF_ERROR(SearchableFromRoot(root, dir.get(), st, op, p.asked));
      return dir;
    }
    std::string dir = p.ParentRel();
    std::string name = p.last();
    for (int links = 0;; ++links) {
      ASSIGN_OR_RETURN(UniqueFd parent, OpenDir(root, dir, X_OK, op, p.asked));
      UniqueFd entry(openat(parent.get(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
      if (!entry.valid()) return Errno(errno, op, p.asked);
      struct stat st;
      if (fstat(entry.get(), &st) != 0) return Errno(errno, op, p.asked);
      if (!S_ISLNK(st.st_mode)) {
        if (p.trailing_slash && !S_ISDIR(st.st_mode)) return Errno(ENOTDIR, op, p.asked);
        return entry;
      }
      if (links >= kMaxSymlinks) return Errno(ELOOP, op, p.asked);
      std::string target;
      if (int rc = ReadLink(entry.get(), "", &target); rc != 0) return Errno(-rc, op, p.asked);
      if (target.empty()) return Errno(ENOENT, op, p.asked);
      ASSIGN_OR_RETURN(SandboxPath t, Parse(target[0] == '/' || dir == "." ? target : dir + "/" + target, op));
      if (t.is_root() || t.last_is_dotdot()) {
        int fd = ResolveInRoot(root, t.Rel(), O_PATH | O_DIRECTORY);
        if (fd < 0) return Errno(-fd, op, p.asked);
        UniqueFd d(fd);
        struct stat dst;
        if (fstat(d.get(), &dst) != 0) return Errno(errno, op, p.asked);
        RETURN_IF_ERROR(SearchableFromRoot(root, d.get(), dst, op, p.asked));
        return d;
      }
      dir = t.ParentRel();
      name = t.last();
    }
  }

  // PermissionDenied unless the sandbox's root may search every directory
  // above the directory `fd` (whose stat is `fd_st`) up to `root` (the kernel's walk needs X on
  // each; the daemon's resolution, as host root, skipped those checks).
  // Stats "..", "../..", ... relative to `fd` (no fd per level; ".." crosses
  // mount points as a path walk does); a chain that ends elsewhere than at
  // `root` is refused.
  Status SearchableFromRoot(int root, int fd, const struct stat& fd_st, const std::string& op,
                            const std::string& shown) const {
    struct stat root_st, cur = fd_st;
    if (fstat(root, &root_st) != 0) return Errno(errno, op, shown);
    std::string up = "..";
    for (int depth = 0; depth < kMaxAncestors; ++depth, up += "/..") {
      if (cur.st_dev == root_st.st_dev && cur.st_ino == root_st.st_ino) return absl::OkStatus();
      struct stat parent;
      if (fstatat(fd, up.c_str(), &parent, 0) != 0) return Errno(errno, op, shown);
      if (parent.st_dev == cur.st_dev && parent.st_ino == cur.st_ino) break;  // a root that is not ours
      RETURN_IF_ERROR(SandboxRootMay(parent, X_OK, op, shown));
      if (parent.st_dev != cur.st_dev) {
        // A mount point crossed: what is mounted below /proc or /sys (the
        // masks' tmpfs over /proc/acpi, ...) is as far out of reach.
        struct statfs sfs;
        const std::string via = "/proc/self/fd/" + std::to_string(fd) + "/" + up;
        if (statfs(via.c_str(), &sfs) != 0) return Errno(errno, op, shown);
        if (IsKernelFs(sfs.f_type)) return KernelFsDenied(op, shown);
      }
      cur = parent;
    }
    return Errno(EXDEV, op, shown);
  }

  // The directory holding the path's last component (see OpenDir).
  StatusOr<UniqueFd> OpenParent(int root, const SandboxPath& p, const std::string& op, int want) const {
    return OpenDir(root, p.ParentRel(), want, op, p.asked);
  }

  // PermissionDenied (EACCES) unless the sandbox's root could access `st`
  // for `want`. Root inside holds CAP_DAC_OVERRIDE in its user namespace,
  // which the kernel honours only for an inode whose owner uid and gid are
  // both mapped there (capable_wrt_inode_uidgid); any other inode grants it
  // just its mode bits: owner's if the uid is its own, group's if the gid
  // is, else other's. The daemon checks this because it opens as host root,
  // which would override them all.
  Status SandboxRootMay(const struct stat& st, int want, const std::string& op, const std::string& shown) const {
    const bool uid_mapped = Mapped(st.st_uid, opt_.host_root_uid);
    const bool gid_mapped = Mapped(st.st_gid, opt_.host_root_gid);
    bool ok;
    if (uid_mapped && gid_mapped) {
      // DAC_OVERRIDE: everything but executing a non-directory without any x bit.
      ok = !(want & X_OK) || S_ISDIR(st.st_mode) || (st.st_mode & 0111) != 0;
    } else {
      unsigned bits = st.st_mode & 7;
      if (st.st_uid == opt_.host_root_uid) {
        bits = (st.st_mode >> 6) & 7;
      } else if (st.st_gid == opt_.host_root_gid) {
        bits = (st.st_mode >> 3) & 7;
      }
      ok = (bits & static_cast<unsigned>(want)) == static_cast<unsigned>(want);
    }
    if (ok) return absl::OkStatus();
    char mode[8];
    snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
    return ErrnoToStatus(EACCES, op + "(" + Printable(shown) + "): not for the sandbox's root (owner " +
                                     std::to_string(SandboxId(st.st_uid, opt_.host_root_uid)) + ":" +
                                     std::to_string(SandboxId(st.st_gid, opt_.host_root_gid)) + ", mode " + mode + ")");
  }

  // mkdir -p of the first `count` components (symlinks followed inside the root).
  Status MakeDirs(int root, const SandboxPath& p, size_t count, const std::string& op) {
    for (size_t i = 0; i < count; ++i) {
      int fd = ResolveInRoot(root, p.Join(i + 1), O_PATH | O_DIRECTORY);
      if (fd >= 0) {
        close(fd);
        continue;
      }
      if (fd != -ENOENT || p.parts[i] == "..") return Errno(-fd, op, p.asked);
      ASSIGN_OR_RETURN(UniqueFd parent_fd, OpenDir(root, p.Join(i), W_OK | X_OK, op, p.asked));
      const int parent = parent_fd.get();
      if (AsMappedOwner([&] { return mkdirat(parent, p.parts[i].c_str(), 0700); }) != 0) {
        if (errno != EEXIST) return Errno(errno, op, p.asked);
        // Created concurrently, or a dangling symlink: resolve again.
        fd = ResolveInRoot(root, p.Join(i + 1), O_PATH | O_DIRECTORY);
        if (fd < 0) return Errno(-fd, op, p.asked);
        close(fd);
        continue;
      }
      RETURN_IF_ERROR(OwnNewDir(parent, p.parts[i], kParentDirMode, p.asked, op));
    }
    return absl::OkStatus();
  }

  // Gives a directory we just created to the sandbox's root with `mode`;
  // removes it again if that fails.
  Status OwnNewDir(int parent, const std::string& name, uint32_t mode, const std::string& shown,
                   const std::string& op) {
    UniqueFd dir(openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dir.valid() || fchown(dir.get(), opt_.host_root_uid, opt_.host_root_gid) != 0 ||
        fchmod(dir.get(), mode & 07777) != 0) {
      int err = errno;
      AsMappedOwner([&] { return unlinkat(parent, name.c_str(), AT_REMOVEDIR); });
      return Errno(err, op, shown);
    }
    return absl::OkStatus();
  }

  // rm -r of `name` in `dirfd`, never following symlinks and never entering
  // another mount (a mount point inside the tree is an error, as EBUSY).
  Status RemoveTree(int dirfd, const std::string& name, const std::string& shown, int depth) {
    if (depth > kMaxRemoveDepth) {
      return absl::FailedPreconditionError("remove(" + Printable(shown) + "): deeper than " +
                                           std::to_string(kMaxRemoveDepth) + " levels");
    }
    UniqueFd dir(openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dir.valid()) {
      if (errno == ENOTDIR || errno == ELOOP) {  // replaced by a file or symlink meanwhile
        if (AsMappedOwner([&] { return unlinkat(dirfd, name.c_str(), 0); }) != 0 && errno != ENOENT) {
          return Errno(errno, "remove", shown);
        }
        return absl::OkStatus();
      }
      if (errno == ENOENT) return absl::OkStatus();
      return Errno(errno, "remove", shown);
    }
    struct statx stx;
    if (statx(dir.get(), "", AT_EMPTY_PATH, STATX_BASIC_STATS, &stx) == 0 &&
        (stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) && (stx.stx_attributes & STATX_ATTR_MOUNT_ROOT)) {
      return Errno(EBUSY, "remove", shown);
    }
    // A sandbox process may keep creating entries; retry a bounded number of times.
    for (int attempt = 0; attempt < 3; ++attempt) {
      ASSIGN_OR_RETURN(std::vector<DirEntry> entries, ReadDir(dir.get(), "remove", shown));
      for (const DirEntry& e : entries) {
        const std::string child = JoinShown(shown, e.name);
        bool is_dir = e.type == DT_DIR;
        if (e.type == DT_UNKNOWN) {
          struct stat st;
          if (fstatat(dir.get(), e.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno == ENOENT) continue;
            return Errno(errno, "remove", child);
          }
          is_dir = S_ISDIR(st.st_mode);
        }
        if (is_dir) {
          RETURN_IF_ERROR(RemoveTree(dir.get(), e.name, child, depth + 1));
        } else if (AsMappedOwner([&] { return unlinkat(dir.get(), e.name.c_str(), 0); }) != 0 && errno != ENOENT) {
          return Errno(errno, "remove", child);
        }
      }
      if (AsMappedOwner([&] { return unlinkat(dirfd, name.c_str(), AT_REMOVEDIR); }) == 0 || errno == ENOENT) {
        return absl::OkStatus();
      }
      if (errno != ENOTEMPTY) return Errno(errno, "remove", shown);
      lseek(dir.get(), 0, SEEK_SET);
    }
    return Errno(ENOTEMPTY, "remove", shown);
  }

  bool Mapped(uint32_t host, uint32_t base) const {
    return host >= base && static_cast<uint64_t>(host) < static_cast<uint64_t>(base) + opt_.id_range;
  }

  uint32_t SandboxId(uint32_t host, uint32_t base) const { return Mapped(host, base) ? host - base : kOverflowId; }

  void Fill(const struct stat& st, FileInfo* info) const {
    if (S_ISREG(st.st_mode)) {
      info->type = FileType::kRegular;
    } else if (S_ISDIR(st.st_mode)) {
      info->type = FileType::kDirectory;
    } else if (S_ISLNK(st.st_mode)) {
      info->type = FileType::kSymlink;
    } else {
      info->type = FileType::kOther;
    }
    info->size = static_cast<uint64_t>(st.st_size);
    info->mode = st.st_mode & 07777;
    info->uid = SandboxId(st.st_uid, opt_.host_root_uid);
    info->gid = SandboxId(st.st_gid, opt_.host_root_gid);
    info->mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  }

  RootedFilesOptions opt_;
};

}  // namespace

std::unique_ptr<SandboxFiles> NewRootedFiles(RootedFilesOptions options) {
  return std::make_unique<RootedFiles>(std::move(options));
}

}  // namespace warren::runtime
