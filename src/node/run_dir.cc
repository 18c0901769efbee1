#include "node/run_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/magic.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string_view>

#include "common/file_util.h"
#include "common/fnv.h"

namespace warren::node {
namespace {

constexpr const char* kSubdirs[] = {"sandboxes", "run", "audit"};

bool OnTmpfs(const std::string& path) {
  struct statfs sf;
  return ::statfs(path.c_str(), &sf) == 0 && sf.f_type == TMPFS_MAGIC;
}

std::string ReadLink(const std::string& path) {
  char buf[PATH_MAX];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  if (n <= 0) return "";
  return std::string(buf, static_cast<size_t>(n));
}

std::string Dirname(const std::string& p) {
  size_t i = p.find_last_of('/');
  if (i == std::string::npos) return ".";
  return i == 0 ? "/" : p.substr(0, i);
}

// Entries other than "." and ".."; -1 when the directory cannot be read.
long CountEntries(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return -1;
  long n = 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.' && (e->d_name[1] == '\0' || (e->d_name[1] == '.' && e->d_name[2] == '\0'))) continue;
    ++n;
  }
  ::closedir(d);
  return n;
}

Status MkdirOne(const std::string& d, mode_t mode) {
  if (::mkdir(d.c_str(), mode) != 0 && errno != EEXIST) return ErrnoToStatus(errno, "mkdir(" + d + ")");
  return absl::OkStatus();
}

// run_root on a tmpfs: already, or mounted now (root only). Under a lock in
// its parent so that two daemons starting at once do not stack two mounts
// (the second would hide the first one's files).
bool EnsureTmpfs(const std::string& run_root) {
  const std::string parent = Dirname(run_root);
  if (!MkdirAll(parent, 0755).ok() || !MkdirOne(run_root, 0755).ok()) return false;
  const std::string lock_path = parent + "/.runtime.lock";
  int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock < 0) return false;
  bool ok = false;
  if (::flock(lock, LOCK_EX) == 0) {
    ok = OnTmpfs(run_root) ||
         (::mount("tmpfs", run_root.c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755") == 0 &&
          OnTmpfs(run_root));
  }
  ::close(lock);
  return ok;
}

}  // namespace

StatusOr<std::string> ResolveRunDir(const std::string& state_dir, const std::string& requested,
                                    const std::string& run_root, bool mount_tmpfs) {
  if (state_dir.empty() || state_dir[0] != '/')
    return absl::InvalidArgumentError("state dir \"" + state_dir + "\" must be an absolute path");
  if (!requested.empty()) {
    if (requested[0] != '/')
      return absl::InvalidArgumentError("--run-dir \"" + requested + "\" must be an absolute path");
    return requested;
  }
  const std::string records = state_dir + "/sandboxes";
  struct stat st;
  if (::lstat(records.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    std::string target = ReadLink(records);
    if (!target.empty() && target[0] == '/') {
      const std::string dir = Dirname(target);
      // A run dir this function chose under run_root: after a reboot of a
      // host whose /run is not a tmpfs, our tmpfs mount is gone; mount it
      // again (before another daemon does and hides this one's files).
      if (mount_tmpfs && Dirname(dir) == run_root && !OnTmpfs(dir)) (void)EnsureTmpfs(run_root);
      return dir;
    }
  }
  for (const char* sub : kSubdirs) {
    // The layout before the run dir, with something in it (live sandboxes'
    // records or dirs): keep it. Empty directories are replaced by links.
    const std::string d = state_dir + "/" + sub;
    if (::lstat(d.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && CountEntries(d) != 0) return state_dir;
  }
  if (OnTmpfs(state_dir)) return state_dir;
  if (!OnTmpfs(Dirname(run_root)) && !(mount_tmpfs && EnsureTmpfs(run_root))) return state_dir;
  char real[PATH_MAX];
  const std::string key = ::realpath(state_dir.c_str(), real) != nullptr ? std::string(real) : state_dir;
  return run_root + "/" + Hex16(Fnv1a64(key));  // a stable name per state dir
}

Status LinkRunDir(const std::string& state_dir, const std::string& run_dir) {
  if (run_dir != state_dir) {
    RETURN_IF_ERROR(MkdirAll(Dirname(run_dir), 0755));
    RETURN_IF_ERROR(MkdirOne(run_dir, 0700));
  }
  for (const char* sub : kSubdirs) {
    const std::string target = run_dir + "/" + sub;
    RETURN_IF_ERROR(MkdirOne(target, 0700));
    if (run_dir == state_dir) continue;
    const std::string link = state_dir + "/" + sub;
    struct stat st;
    if (::lstat(link.c_str(), &st) == 0) {
      if (S_ISLNK(st.st_mode)) {
        const std::string had = ReadLink(link);
        if (had == target) continue;
        if (!had.empty() && CountEntries(had) > 0)
          return absl::FailedPreconditionError(link + " points to " + had +
                                               ", which is not empty (sandboxes of an earlier daemon?): "
                                               "start warrend with --run-dir " +
                                               Dirname(had));
        if (::unlink(link.c_str()) != 0) return ErrnoToStatus(errno, "unlink(" + link + ")");
      } else if (S_ISDIR(st.st_mode)) {
        if (::rmdir(link.c_str()) != 0)
          return absl::FailedPreconditionError(link + " is a directory that is not empty (" +
                                               ErrnoToStatus(errno, "rmdir").ToString() +
                                               "): start warrend with --run-dir " + state_dir);
      } else {
        return absl::FailedPreconditionError(link + " exists and is neither a directory nor a symlink");
      }
    }
    if (::symlink(target.c_str(), link.c_str()) != 0)
      return ErrnoToStatus(errno, "symlink(" + target + ", " + link + ")");
  }
  // Last: a run dir with this file and without the links would look orphaned.
  if (run_dir != state_dir) {
    const std::string path = run_dir + "/" + kStateDirFile, tmp = path + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return ErrnoToStatus(errno, "open(" + tmp + ")");
    Status w = WriteAll(fd, state_dir + "\n", tmp);
    ::close(fd);
    if (w.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) w = ErrnoToStatus(errno, "rename(" + tmp + ")");
    if (!w.ok()) {
      (void)::unlink(tmp.c_str());
      return w;
    }
  }
  return absl::OkStatus();
}

void RemoveRunDirIfUnused(const std::string& state_dir, const std::string& run_dir) {
  if (run_dir == state_dir) return;
  if (CountEntries(run_dir + "/sandboxes") != 0) return;  // live sandboxes (or unreadable): keep
  for (const char* sub : kSubdirs) {
    const std::string link = state_dir + "/" + sub, target = run_dir + "/" + sub;
    if (ReadLink(link) == target) (void)::unlink(link.c_str());
    (void)::rmdir(target.c_str());  // only when empty
  }
  (void)::unlink((run_dir + "/" + kStateDirFile).c_str());
  (void)::rmdir(run_dir.c_str());
  // The last daemon out takes down the tmpfs EnsureTmpfs mounted on the run
  // root (a mount of its own, not /run's): under the same lock, only when
  // empty, and never lazily (busy = someone uses it = it stays).
  const std::string root = Dirname(run_dir), parent = Dirname(root);
  struct stat rs {
  }, ps{};
  if (::stat(root.c_str(), &rs) != 0 || ::stat(parent.c_str(), &ps) != 0 || rs.st_dev == ps.st_dev || !OnTmpfs(root) ||
      OnTmpfs(parent)) {
    return;
  }
  const std::string lock_path = parent + "/.runtime.lock";
  int lock = ::open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
  if (lock < 0) return;
  if (::flock(lock, LOCK_EX) == 0 && CountEntries(root) == 0) (void)::umount2(root.c_str(), UMOUNT_NOFOLLOW);
  ::close(lock);
}

std::vector<std::string> FindOrphanRunDirs(const std::string& run_root, const std::string& own) {
  std::vector<std::string> out;
  DIR* d = ::opendir(run_root.c_str());
  if (d == nullptr) return out;
  std::vector<std::string> candidates;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() != 16 || name.find_first_not_of("0123456789abcdef") != std::string::npos) continue;
    const std::string dir = run_root + "/" + name;
    if (dir != own) candidates.push_back(dir);
  }
  ::closedir(d);
  if (candidates.empty()) return out;
  StatusOr<std::string> mountinfo = ReadSmallFile("/proc/self/mountinfo", 64 << 20);
  if (!mountinfo.ok()) return out;  // cannot tell what is mounted: take nothing
  for (const std::string& dir : candidates) {
    StatusOr<std::string> state = ReadSmallFile(dir + "/" + kStateDirFile, PATH_MAX + 1);
    if (!state.ok()) continue;
    std::string s = *state;
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    if (s.empty() || s[0] != '/') continue;
    if (ReadLink(s + "/sandboxes") == dir + "/sandboxes") continue;  // its state dir still uses it
    if (CountEntries(dir + "/sandboxes") > 0 || CountEntries(dir + "/run") > 0) continue;
    // A mount point at or below it (mountinfo's 5th field, octal-escaped:
    // our paths have no characters that need it).
    bool mounted = false;
    for (size_t at = 0; at < mountinfo->size() && !mounted;) {
      size_t end = mountinfo->find('\n', at);
      if (end == std::string::npos) end = mountinfo->size();
      const std::string_view line(mountinfo->data() + at, end - at);
      size_t f = 0;
      for (int field = 0; field < 4 && f != std::string_view::npos; ++field) {
        f = line.find(' ', f);
        if (f != std::string_view::npos) ++f;
      }
      if (f != std::string_view::npos) {
        const std::string_view point = line.substr(f, line.find(' ', f) - f);
        mounted = point == dir ||
                  (point.size() > dir.size() && point.substr(0, dir.size()) == dir && point[dir.size()] == '/');
      }
      at = end + 1;
    }
    if (!mounted) out.push_back(dir);
  }
  return out;
}

}  // namespace warren::node
