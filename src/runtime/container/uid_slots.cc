#include "runtime/container/uid_slots.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "common/file_util.h"

namespace warren::runtime {
namespace {

// How long Take skips a slot found held by another daemon.
constexpr std::chrono::seconds kForeignRecheck{10};
constexpr size_t kMaxOwnerBytes = 4096;

}  // namespace

StatusOr<std::unique_ptr<UidSlots>> UidSlots::Open(std::string lock_dir, std::string owner, uint32_t count,
                                                   uint32_t uid_base, uint32_t uid_range) {
  if (count == 0 || uid_range == 0) return absl::InvalidArgumentError("uid slots: count and range must be > 0");
  if (uint64_t{uid_base} + uint64_t{uid_range} * count > 0xFFFFFFFEull)
    return absl::InvalidArgumentError("uid_base + uid_range*max_sandboxes overflows the uid space");
  if (!lock_dir.empty()) {
    if (owner.empty() || owner[0] != '/' || owner.size() > kMaxOwnerBytes || owner.find('\n') != std::string::npos)
      return absl::InvalidArgumentError("uid slots: owner must be an absolute path (the state dir), got \"" + owner +
                                        "\"");
    RETURN_IF_ERROR(MkdirAll(lock_dir, 0700));
  }
  return std::unique_ptr<UidSlots>(new UidSlots(std::move(lock_dir), std::move(owner), count, uid_base, uid_range));
}

UniqueFd UidSlots::Claim(uint32_t k) {
  const std::string path = lock_dir_ + "/" + std::to_string(HostUid(k));
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return UniqueFd();
  // Non-blocking: a live daemon holds it for as long as it uses the slot.
  while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EINTR) return UniqueFd();
  }
  char buf[kMaxOwnerBytes + 2];
  ssize_t n;
  while ((n = ::pread(fd.get(), buf, sizeof buf, 0)) < 0 && errno == EINTR) {
  }
  if (n < 0) return UniqueFd();
  std::string prev(buf, static_cast<size_t>(n));
  while (!prev.empty() && prev.back() == '\n') prev.pop_back();
  if (!prev.empty() && prev != owner_) {
    // A dead daemon's: its sandboxes may still run with these ids, and it
    // re-adopts them when it comes back. Free only once its state dir is gone.
    struct stat st;
    if (::stat(prev.c_str(), &st) == 0 || errno != ENOENT) return UniqueFd();
  }
  const std::string content = owner_ + "\n";
  if (::ftruncate(fd.get(), 0) != 0 ||
      ::pwrite(fd.get(), content.data(), content.size(), 0) != static_cast<ssize_t>(content.size())) {
    return UniqueFd();
  }
  return fd;
}

StatusOr<uint32_t> UidSlots::Take() {
  std::lock_guard<std::mutex> l(mu_);
  const auto now = std::chrono::steady_clock::now();
  for (uint32_t k = 0; k < count_; ++k) {
    if (held_.count(k) != 0) continue;
    if (!lock_dir_.empty()) {
      auto f = foreign_.find(k);
      if (f != foreign_.end()) {
        if (now < f->second) continue;
        foreign_.erase(f);
      }
      UniqueFd claim = Claim(k);
      if (!claim.valid()) {
        foreign_[k] = now + kForeignRecheck;
        continue;
      }
      locks_[k] = std::move(claim);
    }
    held_.insert(k);
    return k;
  }
  return absl::ResourceExhaustedError("all " + std::to_string(count_) +
                                      " uid slots in use (by this daemon and others on the host); retry after a "
                                      "destroy");
}

bool UidSlots::TakeSpecific(uint32_t k) {
  std::lock_guard<std::mutex> l(mu_);
  if (held_.count(k) != 0) return false;
  if (!lock_dir_.empty()) {
    UniqueFd claim = Claim(k);
    if (!claim.valid()) return false;
    foreign_.erase(k);
    locks_[k] = std::move(claim);
  }
  held_.insert(k);
  return true;
}

void UidSlots::Release(uint32_t k) {
  std::lock_guard<std::mutex> l(mu_);
  held_.erase(k);
  auto it = locks_.find(k);
  if (it == locks_.end()) {
    // A recorded sandbox's slot never re-taken (it died while no daemon
    // ran): still claimed in our name on the host; free it too.
    if (!lock_dir_.empty()) {
      UniqueFd claim = Claim(k);
      if (claim.valid()) (void)::ftruncate(claim.get(), 0);
    }
    return;
  }
  // Emptied while still locked: free for every daemon from the unlock on.
  (void)::ftruncate(it->second.get(), 0);
  locks_.erase(it);  // closes: unlocks
}

}  // namespace warren::runtime
