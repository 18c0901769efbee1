#include <dirent.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/unique_fd.h"
#include "image/erofs.h"
#include "image/fs_util.h"
#include "image/layer_store.h"

namespace warren::image {
namespace {

bool IsHex64(const std::string& s) {
  return s.size() == 64 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

StatusOr<std::string> HexOf(std::string_view digest) {
  constexpr std::string_view kPrefix = "sha256:";
  std::string hex(digest.substr(0, kPrefix.size()) == kPrefix ? digest.substr(kPrefix.size()) : std::string_view());
  if (!IsHex64(hex)) {
    return absl::InvalidArgumentError("digest \"" + std::string(digest) + "\" is not sha256:<64 lower-case hex>");
  }
  return hex;
}

// Undoes mountinfo's octal escapes ("\040" for a space).
std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      std::string oct = s.substr(i + 1, 3);
      if (oct.size() == 3 && std::all_of(oct.begin(), oct.end(), [](char c) { return c >= '0' && c <= '7'; })) {
        out += static_cast<char>(std::strtol(oct.c_str(), nullptr, 8));
        i += 3;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

}  // namespace

bool MountCache::FileBackedErofsSupported() { return ErofsFileBackedSupported(); }

MountCache::~MountCache() = default;

StatusOr<std::unique_ptr<MountCache>> MountCache::Open(const LayerStore* store, const std::string& mount_root,
                                                       int64_t grace_ms, std::string source_root) {
  if (store == nullptr) return absl::InvalidArgumentError("MountCache: no layer store");
  RETURN_IF_ERROR(MakeDirs(mount_root));
  // Private to root: the mounts hold sandboxes' snapshots. Nothing but the
  // daemon reaches them by path (sandboxes get their lowers as fds).
  if (chmod(mount_root.c_str(), 0700) != 0) return ErrnoToStatus(errno, "chmod(" + mount_root + ", 0700)");
  char* real = realpath(mount_root.c_str(), nullptr);
  if (real == nullptr) return ErrnoToStatus(errno, "realpath(" + mount_root + ")");
  std::string root(real);
  free(real);
  std::unique_ptr<MountCache> c(new MountCache(store, root, grace_ms, std::move(source_root)));
  RETURN_IF_ERROR(c->Adopt());
  return c;
}

std::string MountCache::MountPath(const std::string& hex) const { return mount_root_ + "/" + hex; }

Status MountCache::Adopt() {
  std::ifstream in("/proc/self/mountinfo");
  if (!in) return ErrnoToStatus(errno, "open(/proc/self/mountinfo)");
  const std::string prefix = mount_root_ + "/";
  std::string line;
  const int64_t now = NowMonotonicMs();
  for (int n = 0; n < 1'000'000 && std::getline(in, line); ++n) {
    // id parent maj:min root mountpoint opts [optional...] - fstype source superopts
    std::istringstream ls(line);
    std::string id, parent, devno, root, mnt;
    if (!(ls >> id >> parent >> devno >> root >> mnt)) continue;
    mnt = Unescape(mnt);
    if (mnt.rfind(prefix, 0) != 0) continue;
    std::string hex = mnt.substr(prefix.size());
    if (!IsHex64(hex)) continue;
    size_t dash = line.find(" - ");
    if (dash == std::string::npos || line.compare(dash + 3, 6, "erofs ") != 0) continue;
    Entry& e = entries_[hex];
    e.state = State::kMounted;
    e.refs = 0;
    e.released_at_ms = now;
    struct stat sb {};
    e.bytes = ::stat(store_->BlobPath(hex).c_str(), &sb) == 0 ? static_cast<uint64_t>(sb.st_size) : 0;
  }
  // Stale mount points of a previous daemon that were never (or no longer)
  // mounted: rmdir only removes empty directories.
  UniqueFd dfd(open(mount_root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dfd.valid()) return ErrnoToStatus(errno, "open(" + mount_root_ + ")");
  DIR* d = fdopendir(dfd.release());
  if (d == nullptr) return ErrnoToStatus(errno, "fdopendir(" + mount_root_ + ")");
  std::vector<std::string> stale;
  while (dirent* de = readdir(d)) {
    std::string name = de->d_name;
    if (IsHex64(name) && !entries_.contains(name)) stale.push_back(name);
  }
  closedir(d);
  for (const std::string& hex : stale) rmdir(MountPath(hex).c_str());
  return absl::OkStatus();
}

StatusOr<std::string> MountCache::Acquire(std::string_view digest) {
  ASSIGN_OR_RETURN(std::string hex, HexOf(digest));
  const std::string path = MountPath(hex);
  // Before the mount: a remove on any node sharing the store now refuses.
  ASSIGN_OR_RETURN(UniqueFd hold, store_->HoldBlob(hex));
  std::unique_lock<std::mutex> lock(mu_);
  Entry& e = entries_[hex];  // std::map: stable while the entry exists
  ++e.refs;                  // holds the entry (and blocks Sweep) while we wait
  for (;;) {
    if (e.state == State::kMounted) {
      ++hits_;
      e.holds.push_back(std::move(hold));
      return path;
    }
    if (e.state == State::kMounting || e.state == State::kUnmounting) {
      cv_.wait(lock);
      continue;
    }
    // kUnmounted: this thread mounts; others wait for it on cv_.
    e.state = State::kMounting;
    lock.unlock();
    uint64_t bytes = 0;
    Status st = [&]() -> Status {
      const std::string blob = store_->BlobPath(hex);
      struct stat sb {};
      if (::stat(blob.c_str(), &sb) != 0) {
        return absl::NotFoundError("layer " + std::string(digest) + " not in the store");
      }
      bytes = static_cast<uint64_t>(sb.st_size);
      if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
        return ErrnoToStatus(errno, "mkdir(" + path + ")");
      }
      const std::string source = source_root_.empty() ? blob : source_root_ + "/" + hex;
      StatusOr<UniqueFd> mnt = MountErofs(source);
      Status s = mnt.status();
      if (s.ok() && move_mount(mnt->get(), "", AT_FDCWD, path.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0) {
        s = ErrnoToStatus(errno, "move_mount(" + source + ", " + path + ")");
      }
      if (!s.ok()) rmdir(path.c_str());
      return s;
    }();
    lock.lock();
    e.state = st.ok() ? State::kMounted : State::kUnmounted;
    e.bytes = st.ok() ? bytes : 0;
    ++(st.ok() ? misses_ : failures_);
    cv_.notify_all();
    if (!st.ok()) {
      if (--e.refs == 0) entries_.erase(hex);
      return st;
    }
    e.holds.push_back(std::move(hold));
    return path;
  }
}

void MountCache::Release(std::string_view digest) {
  auto hex = HexOf(digest);
  if (!hex.ok()) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(*hex);
  if (it == entries_.end() || it->second.refs == 0) return;
  if (!it->second.holds.empty()) it->second.holds.pop_back();  // its blob lock goes with its reference
  if (--it->second.refs == 0) it->second.released_at_ms = NowMonotonicMs();
}

std::vector<std::string> MountCache::Sweep(bool all) {
  std::vector<std::string> victims, unmounted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t now = NowMonotonicMs();
    for (auto& [hex, e] : entries_) {
      if (e.refs == 0 && e.state == State::kMounted && (all || now - e.released_at_ms >= grace_ms_)) {
        e.state = State::kUnmounting;
        victims.push_back(hex);
      }
    }
  }
  for (const std::string& hex : victims) {
    const std::string path = MountPath(hex);
    // Plain umount: fails with EBUSY if anything still uses the mount (e.g.
    // a sandbox not re-adopted yet); never detach lazily.
    bool gone = umount2(path.c_str(), UMOUNT_NOFOLLOW) == 0 || errno == EINVAL;
    if (gone) rmdir(path.c_str());
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = entries_[hex];
    if (gone) {
      unmounted.push_back(hex);
      e.state = State::kUnmounted;
      ++evictions_;
      if (e.refs == 0) entries_.erase(hex);
    } else {
      e.state = State::kMounted;
      e.released_at_ms = NowMonotonicMs();  // retry after another grace period
    }
  }
  if (!victims.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  return unmounted;
}

bool MountCache::IsMounted(std::string_view digest) const {
  auto hex = HexOf(digest);
  if (!hex.ok()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(*hex);
  return it != entries_.end() && it->second.state == State::kMounted;
}

uint32_t MountCache::RefCount(std::string_view digest) const {
  auto hex = HexOf(digest);
  if (!hex.ok()) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(*hex);
  return it == entries_.end() ? 0 : it->second.refs;
}

size_t MountCache::MountedCount() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::count_if(entries_.begin(), entries_.end(),
                       [](const auto& kv) { return kv.second.state == State::kMounted; });
}

MountCache::Stats MountCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats out;
  out.hits = hits_;
  out.misses = misses_;
  out.failures = failures_;
  out.evictions = evictions_;
  for (const auto& [hex, e] : entries_) {
    if (e.state != State::kMounted) continue;
    ++out.mounted;
    out.mounted_bytes += e.bytes;
  }
  return out;
}

}  // namespace warren::image
