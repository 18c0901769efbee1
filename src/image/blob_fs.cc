#include "image/blob_fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/file_util.h"
#include "common/log.h"
#include "image/fs_util.h"

namespace warren::image {
namespace {

constexpr uint64_t kRootId = FUSE_ROOT_ID;  // 1
constexpr uint32_t kMaxPages = 256;         // 1 MiB per READ
constexpr size_t kBufBytes = (size_t{kMaxPages} + 1) * 4096;
constexpr char kHolderName[] = "warren-fuse-fd";
constexpr int kHolderFd = 3;  // the connection's fd in the holder
// Linux 6.9's notification (not in older <linux/fuse.h>): every request a
// server read and did not answer goes back to the queue.
constexpr int32_t kNotifyResend = 7;
constexpr int32_t kNotifyInvalEntry = 3;  // FUSE_NOTIFY_INVAL_ENTRY

bool IsHex64(std::string_view s) {
  return s.size() == 64 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

void FillAttr(fuse_attr* a, uint64_t ino, uint64_t size, bool dir) {
  std::memset(a, 0, sizeof *a);
  a->ino = ino;
  a->size = size;
  a->blocks = (size + 511) / 512;
  a->mode = dir ? (S_IFDIR | 0500) : (S_IFREG | 0400);
  a->nlink = dir ? 2 : 1;
  a->blksize = 4096;
}

// A blob's node id: the first 63 bits of its name, never 0 or the root's.
uint64_t IdOf(const std::string& hex) {
  uint64_t v = std::strtoull(hex.substr(0, 16).c_str(), nullptr, 16) >> 1;
  return v < 2 ? v + 2 : v;
}

// Undoes mountinfo's octal escapes ("\040" for a space).
std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '3') {
      out += static_cast<char>(std::strtol(s.substr(i + 1, 3).c_str(), nullptr, 8));
      i += 3;
      continue;
    }
    out += s[i];
  }
  return out;
}

struct MountLine {
  std::string mountpoint, fstype, source;
};

std::vector<MountLine> ReadMountInfo() {
  std::vector<MountLine> out;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  for (int n = 0; n < 1'000'000 && std::getline(in, line); ++n) {
    // id parent maj:min root mountpoint opts [optional...] - fstype source superopts
    std::istringstream ls(line);
    std::string id, parent, devno, root, mnt;
    if (!(ls >> id >> parent >> devno >> root >> mnt)) continue;
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream rest(line.substr(dash + 3));
    MountLine m;
    if (!(rest >> m.fstype >> m.source)) continue;
    m.mountpoint = Unescape(mnt);
    m.source = Unescape(m.source);
    out.push_back(std::move(m));
  }
  return out;
}

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }
int PidfdSignal(int pidfd, int sig) { return static_cast<int>(syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0)); }

// The argv a holder of `mountpoint` runs with, as /proc/<pid>/cmdline shows it.
std::string HolderCmdline(const std::string& mountpoint) { return std::string(kHolderName) + '\0' + mountpoint + '\0'; }

// Pidfds of the processes running as the holder of `mountpoint` (checked
// after the pidfd was opened, so a reused pid is not taken for one).
std::vector<UniqueFd> FindHolders(const std::string& mountpoint) {
  std::vector<UniqueFd> out;
  const std::string want = HolderCmdline(mountpoint);
  DIR* d = opendir("/proc");
  if (d == nullptr) return out;
  std::vector<pid_t> pids;
  while (dirent* de = readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(de->d_name, &end, 10);  // NOLINT(google-runtime-int): strtol
    if (end != de->d_name && *end == '\0' && pid > 0) pids.push_back(static_cast<pid_t>(pid));
  }
  closedir(d);
  for (pid_t pid : pids) {
    const std::string cmdline = "/proc/" + std::to_string(pid) + "/cmdline";
    StatusOr<std::string> got = ReadSmallFile(cmdline, 8192);
    if (!got.ok() || *got != want) continue;
    UniqueFd pidfd(PidfdOpen(pid));
    if (!pidfd.valid()) continue;
    got = ReadSmallFile(cmdline, 8192);
    if (got.ok() && *got == want) out.push_back(std::move(pidfd));
  }
  return out;
}

}  // namespace

StatusOr<std::unique_ptr<BlobFs>> BlobFs::Mount(ReadCache* cache, const std::string& mountpoint, int threads,
                                                const std::string& holder_path) {
  if (cache == nullptr) return absl::InvalidArgumentError("BlobFs: no read cache");
  // The canonical path, found without touching the mount point itself: a
  // FUSE mount there whose server is gone answers ENOTCONN.
  const std::string parent = Dirname(mountpoint);
  RETURN_IF_ERROR(MakeDirs(parent));
  char* real = realpath(parent.c_str(), nullptr);
  if (real == nullptr) return ErrnoToStatus(errno, "realpath(" + parent + ")");
  std::string mp = std::string(real) + "/" + mountpoint.substr(mountpoint.find_last_of('/') + 1);
  free(real);  // NOLINT(cppcoreguidelines-no-malloc): realpath's
  std::unique_ptr<BlobFs> fs(new BlobFs(cache, mp));
  fs->wake_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!fs->wake_.valid()) return ErrnoToStatus(errno, "eventfd");

  bool mounted = false;
  for (const MountLine& m : ReadMountInfo()) {
    mounted = mounted || (m.mountpoint == mp && m.fstype == "fuse" && m.source == "warren-blobs");
  }
  std::vector<UniqueFd> holders = FindHolders(mp);
  if (mounted && holders.size() == 1) {
    // A previous daemon's connection: take its fd from the holder.
    UniqueFd dev(static_cast<int>(syscall(SYS_pidfd_getfd, holders[0].get(), kHolderFd, 0)));
    char link[64] = {};
    const std::string self = "/proc/self/fd/" + std::to_string(dev.get());
    if (!dev.valid()) {
      Log(spdlog::level::warn, "layer files: cannot take the FUSE fd from its holder, mounting anew",
          {{"mountpoint", mp}, {"error", std::strerror(errno)}});
    } else if (readlink(self.c_str(), link, sizeof link - 1) <= 0 || std::string(link) != "/dev/fuse") {
      Log(spdlog::level::warn, "layer files: the holder's fd 3 is not /dev/fuse, mounting anew", {{"mountpoint", mp}});
    } else {
      fcntl(dev.get(), F_SETFD, FD_CLOEXEC);
      int fl = fcntl(dev.get(), F_GETFL);
      if (fl >= 0) fcntl(dev.get(), F_SETFL, fl | O_NONBLOCK);  // the same open file: already so
      fs->dev_ = std::move(dev);
      fs->holder_pidfd_ = std::move(holders[0]);
      fs->holder_pid_ = -1;
      holders.clear();
      fs->adopted_ = true;
      fs->own_mount_ = true;
    }
  }
  // Holders of a mount that is gone (or not adoptable): their connection
  // serves nothing any more.
  for (UniqueFd& h : holders) PidfdSignal(h.get(), SIGKILL);
  if (fs->adopted_) {
    fs->AdoptMountedNodes(/*open_layers=*/true);
    // Requests the dead server had read but not answered go back to the
    // queue (their readers would wait for ever otherwise).
    fuse_out_header n{};
    n.len = sizeof n;
    n.error = kNotifyResend;
    if (write(fs->dev_.get(), &n, sizeof n) < 0) {
      Log(spdlog::level::warn, "layer files: FUSE_NOTIFY_RESEND failed (kernel < 6.9?)",
          {{"error", std::strerror(errno)}});
    }
    Log(spdlog::level::info, "layer files: took over the FUSE connection of the previous daemon",
        {{"mountpoint", mp}, {"layers", std::to_string(fs->node_count())}});
  } else {
    RETURN_IF_ERROR(fs->MountFresh(holder_path));
  }
  for (int i = 0; i < std::max(1, threads); ++i) fs->threads_.emplace_back([p = fs.get()] { p->Serve(); });
  return fs;
}

void BlobFs::Abandon(const std::string& mountpoint) {
  const std::string parent = Dirname(mountpoint);
  char* real = realpath(parent.c_str(), nullptr);
  if (real == nullptr) return;  // no state dir yet: nothing of a previous daemon
  const std::string mp = std::string(real) + "/" + mountpoint.substr(mountpoint.find_last_of('/') + 1);
  free(real);  // NOLINT(cppcoreguidelines-no-malloc): realpath's
  struct stat st {};
  if (lstat(mp.c_str(), &st) != 0 && errno == ENOENT) return;  // never used: no /proc scan
  bool mounted = false;
  for (const MountLine& m : ReadMountInfo()) mounted = mounted || (m.mountpoint == mp && m.fstype == "fuse");
  std::vector<UniqueFd> holders = FindHolders(mp);
  if (!mounted && holders.empty()) return;
  Log(spdlog::level::warn,
      "layer read cache off: ending a previous daemon's layer files (layers mounted from them fail)",
      {{"mountpoint", mp}});
  if (mounted) umount2(mp.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW);
  for (UniqueFd& h : holders) PidfdSignal(h.get(), SIGKILL);
}

Status BlobFs::MountFresh(const std::string& holder_path) {
  const std::string& mp = mountpoint_;
  umount2(mp.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW);  // a previous daemon's, if any
  RETURN_IF_ERROR(MakeDirs(mp));
  if (chmod(mp.c_str(), 0700) != 0) return ErrnoToStatus(errno, "chmod(" + mp + ", 0700)");
  dev_.reset(open("/dev/fuse", O_RDWR | O_NONBLOCK | O_CLOEXEC));
  if (!dev_.valid()) return ErrnoToStatus(errno, "open(/dev/fuse)");
  const std::string opts =
      "fd=" + std::to_string(dev_.get()) +
      ",rootmode=40000,user_id=0,group_id=0,allow_other,max_read=" + std::to_string(kMaxPages * 4096);
  if (mount("warren-blobs", mp.c_str(), "fuse", MS_NODEV | MS_NOSUID | MS_NOEXEC | MS_RDONLY, opts.c_str()) != 0) {
    return ErrnoToStatus(errno, "mount(fuse, " + mp + ")");
  }
  own_mount_ = true;  // from here on, Shutdown (the destructor on error) undoes it
  if (!holder_path.empty()) RETURN_IF_ERROR(StartHolder(holder_path));
  return absl::OkStatus();
}

Status BlobFs::StartHolder(const std::string& holder_path) {
  // fd 3 of the holder; first moved above the low fds so dup2 clears CLOEXEC.
  UniqueFd high(fcntl(dev_.get(), F_DUPFD_CLOEXEC, 10));
  if (!high.valid()) return ErrnoToStatus(errno, "fcntl(F_DUPFD_CLOEXEC)");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDWR, 0);
  posix_spawn_file_actions_adddup2(&fa, 0, 1);
  posix_spawn_file_actions_adddup2(&fa, 0, 2);
  posix_spawn_file_actions_adddup2(&fa, high.get(), kHolderFd);
  posix_spawn_file_actions_addclosefrom_np(&fa, kHolderFd + 1);
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  std::string arg0 = kHolderName, arg1 = mountpoint_;
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  char* envp[] = {nullptr};
  pid_t pid = -1;
  int rc = posix_spawn(&pid, holder_path.c_str(), &fa, &attr, argv, envp);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return ErrnoToStatus(rc, "posix_spawn(" + holder_path + ")");
  holder_pid_ = pid;
  holder_is_child_ = true;
  holder_pidfd_.reset(PidfdOpen(pid));  // our un-reaped child: no reuse race
  if (!holder_pidfd_.valid()) {
    Status st = ErrnoToStatus(errno, "pidfd_open(" + std::string(kHolderName) + " " + std::to_string(pid) + ")");
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    holder_is_child_ = false;
    return st;
  }
  return absl::OkStatus();
}

void BlobFs::KillHolder() {
  if (!holder_pidfd_.valid()) return;
  PidfdSignal(holder_pidfd_.get(), SIGKILL);
  if (holder_is_child_) {
    while (waitpid(holder_pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
    holder_is_child_ = false;
  }
  holder_pidfd_.reset();
}

std::vector<std::string> BlobFs::MountedHexes() const {
  std::vector<std::string> out;
  const std::string prefix = mountpoint_ + "/";
  for (const MountLine& m : ReadMountInfo()) {
    if (m.fstype != "erofs" || m.source.rfind(prefix, 0) != 0) continue;
    std::string hex = m.source.substr(prefix.size());
    if (IsHex64(hex)) out.push_back(std::move(hex));
  }
  return out;
}

void BlobFs::AdoptMountedNodes(bool open_layers) {
  for (const std::string& hex : MountedHexes()) {
    bool added = false;
    {
      std::lock_guard<std::mutex> lock(ids_mu_);
      added = nodes_.try_emplace(IdOf(hex), Node{hex, 0}).second;
    }
    // Each EROFS mount holds its file open: the RELEASE of that open reaches
    // this server when the layer is unmounted.
    if (open_layers) cache_->OpenLayer(hex);
    (void)added;
  }
}

std::string BlobFs::HexOf(uint64_t id) {
  for (int pass = 0; pass < 2; ++pass) {
    {
      std::lock_guard<std::mutex> lock(ids_mu_);
      auto it = nodes_.find(id);
      if (it != nodes_.end()) return it->second.hex;
    }
    // Unknown: a file the kernel looked up under a previous server.
    if (pass == 0) AdoptMountedNodes(/*open_layers=*/false);
  }
  return {};
}

size_t BlobFs::node_count() const {
  std::lock_guard<std::mutex> lock(ids_mu_);
  return nodes_.size();
}

void BlobFs::Forget(const std::string& hex) {
  if (!IsHex64(hex) || !dev_.valid() || stopping_.load()) return;
  struct {
    fuse_out_header h;
    fuse_notify_inval_entry_out e;
    char name[65];
  } __attribute__((packed)) n{};
  n.h.len = sizeof n;
  n.h.error = kNotifyInvalEntry;
  n.e.parent = kRootId;
  n.e.namelen = 64;
  std::memcpy(n.name, hex.data(), 64);
  if (write(dev_.get(), &n, sizeof n) < 0 && errno != ENOENT) {
    Log(spdlog::level::warn, "layer files: FUSE_NOTIFY_INVAL_ENTRY failed",
        {{"layer", hex}, {"error", std::strerror(errno)}});
  }
}

void BlobFs::Forgotten(uint64_t id, uint64_t nlookup) {
  std::lock_guard<std::mutex> lock(ids_mu_);
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  // The kernel forgets an inode with its whole count: a name adopted after
  // a restart (count unknown, 0 here) goes with its first FORGET.
  if (it->second.nlookup <= nlookup) {
    nodes_.erase(it);
  } else {
    it->second.nlookup -= nlookup;
  }
}

BlobFs::~BlobFs() { Shutdown(); }

void BlobFs::Shutdown() {
  if (stopping_.exchange(true)) return;
  uint64_t one = 1;
  if (wake_.valid() && write(wake_.get(), &one, sizeof one) < 0)
    Log(spdlog::level::warn, "BlobFs: eventfd write failed");
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  if (own_mount_ && holder_pidfd_.valid() && !MountedHexes().empty()) {
    // Layers of live sandboxes are mounted from here: the holder keeps the
    // connection (their reads wait) for the next daemon.
    Log(spdlog::level::info, "layer files: left mounted, held for the next daemon", {{"mountpoint", mountpoint_}});
    dev_.reset();
    holder_pidfd_.reset();
    if (holder_is_child_) holder_is_child_ = false;  // reparented when this process exits
    return;
  }
  if (own_mount_) umount2(mountpoint_.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW);
  own_mount_ = false;
  dev_.reset();  // the last fd of the connection but the holder's
  KillHolder();  // ... and the holder's: the kernel aborts it
}

void BlobFs::Serve() {
  std::vector<char> in(kBufBytes + sizeof(fuse_in_header) + 4096);
  std::vector<char> out(kBufBytes + sizeof(fuse_out_header));
  for (;;) {
    pollfd p[2] = {{dev_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      Log(spdlog::level::err, "BlobFs: poll failed", {{"error", std::strerror(errno)}});
      return;
    }
    if (p[1].revents != 0 || stopping_.load()) return;
    if ((p[0].revents & (POLLERR | POLLHUP)) != 0) return;  // unmounted: the connection is gone
    ssize_t n = read(dev_.get(), in.data(), in.size());
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ENOENT) continue;  // another thread took it / interrupted
      if (errno != ENODEV) Log(spdlog::level::err, "BlobFs: read(/dev/fuse)", {{"error", std::strerror(errno)}});
      return;
    }
    if (static_cast<size_t>(n) < sizeof(fuse_in_header)) continue;
    Handle(in.data(), static_cast<size_t>(n), out);
  }
}

void BlobFs::Handle(const char* req, size_t len, std::vector<char>& reply_buf) {
  fuse_in_header h;
  std::memcpy(&h, req, sizeof h);
  const char* arg = req + sizeof h;
  const size_t arg_len = len - sizeof h;
  auto* oh = reinterpret_cast<fuse_out_header*>(reply_buf.data());
  char* payload = reply_buf.data() + sizeof(fuse_out_header);
  auto send = [&](int err, size_t n) {
    oh->unique = h.unique;
    oh->error = -err;
    oh->len = static_cast<uint32_t>(sizeof(fuse_out_header) + (err == 0 ? n : 0));
    // ENOENT from the device: the request was interrupted and is gone.
    if (write(dev_.get(), reply_buf.data(), oh->len) < 0 && errno != ENOENT) {
      Log(spdlog::level::warn, "BlobFs: reply failed", {{"error", std::strerror(errno)}});
    }
  };
  auto hex_of = [&](uint64_t id) { return id == kRootId ? std::string() : HexOf(id); };
  switch (h.opcode) {
    case FUSE_INIT: {
      fuse_init_in in{};
      std::memcpy(&in, arg, std::min(arg_len, sizeof in));
      fuse_init_out o{};
      o.major = FUSE_KERNEL_VERSION;
      o.minor = std::min<uint32_t>(in.minor, FUSE_KERNEL_MINOR_VERSION);
      o.max_readahead = in.max_readahead;
      o.flags = in.flags & (FUSE_ASYNC_READ | FUSE_MAX_PAGES | FUSE_ASYNC_DIO);
      o.max_background = 64;
      o.congestion_threshold = 48;
      o.max_write = 4096;
      o.time_gran = 1;
      o.max_pages = kMaxPages;
      std::memcpy(payload, &o, sizeof o);
      return send(in.major == FUSE_KERNEL_VERSION ? 0 : EPROTO, sizeof o);
    }
    case FUSE_LOOKUP: {
      std::string_view name(arg, strnlen(arg, arg_len));
      if (h.nodeid != kRootId || !IsHex64(name)) return send(ENOENT, 0);
      const std::string hex(name);
      StatusOr<uint64_t> size = cache_->Size(hex);
      if (!size.ok()) return send(absl::IsNotFound(size.status()) ? ENOENT : EIO, 0);
      const uint64_t id = IdOf(hex);
      {
        std::lock_guard<std::mutex> lock(ids_mu_);
        auto [it, added] = nodes_.try_emplace(id, Node{hex, 0});
        if (it->second.hex != hex) {
          Log(spdlog::level::err, "layer files: two blobs share a node id", {{"a", it->second.hex}, {"b", hex}});
          return send(EIO, 0);
        }
        ++it->second.nlookup;
      }
      fuse_entry_out e{};
      e.nodeid = id;
      e.entry_valid = 3600;  // blobs are immutable
      e.attr_valid = 3600;
      FillAttr(&e.attr, id, *size, false);
      std::memcpy(payload, &e, sizeof e);
      return send(0, sizeof e);
    }
    case FUSE_FORGET: {  // no reply
      fuse_forget_in in{};
      std::memcpy(&in, arg, std::min(arg_len, sizeof in));
      Forgotten(h.nodeid, in.nlookup);
      return;
    }
    case FUSE_BATCH_FORGET: {  // no reply
      fuse_batch_forget_in in{};
      std::memcpy(&in, arg, std::min(arg_len, sizeof in));
      const size_t room = arg_len > sizeof in ? (arg_len - sizeof in) / sizeof(fuse_forget_one) : 0;
      for (size_t i = 0; i < std::min<size_t>(in.count, room); ++i) {
        fuse_forget_one one{};
        std::memcpy(&one, arg + sizeof in + i * sizeof one, sizeof one);
        Forgotten(one.nodeid, one.nlookup);
      }
      return;
    }
    case FUSE_INTERRUPT: return;  // no reply
    case FUSE_GETATTR: {
      fuse_attr_out a{};
      a.attr_valid = 3600;
      if (h.nodeid == kRootId) {
        FillAttr(&a.attr, kRootId, 0, true);
      } else {
        std::string hex = hex_of(h.nodeid);
        StatusOr<uint64_t> size = hex.empty() ? StatusOr<uint64_t>(absl::NotFoundError("")) : cache_->Size(hex);
        if (!size.ok()) return send(ENOENT, 0);
        FillAttr(&a.attr, h.nodeid, *size, false);
      }
      std::memcpy(payload, &a, sizeof a);
      return send(0, sizeof a);
    }
    case FUSE_OPEN:
    case FUSE_OPENDIR: {
      fuse_open_in in{};
      std::memcpy(&in, arg, std::min(arg_len, sizeof in));
      if ((in.flags & O_ACCMODE) != O_RDONLY) return send(EROFS, 0);
      if (h.opcode == FUSE_OPEN) {
        std::string hex = hex_of(h.nodeid);
        if (hex.empty()) return send(ENOENT, 0);
        cache_->OpenLayer(hex);
      }
      fuse_open_out o{};
      o.open_flags = h.opcode == FUSE_OPEN ? FOPEN_DIRECT_IO : 0;
      std::memcpy(payload, &o, sizeof o);
      return send(0, sizeof o);
    }
    case FUSE_READ: {
      fuse_read_in in{};
      std::memcpy(&in, arg, std::min(arg_len, sizeof in));
      std::string hex = hex_of(h.nodeid);
      if (hex.empty()) return send(EBADF, 0);
      const size_t want = std::min<size_t>(in.size, kBufBytes);
      StatusOr<size_t> got = cache_->Read(hex, in.offset, want, payload);
      if (!got.ok()) {
        Log(spdlog::level::warn, "BlobFs: read failed",
            {{"layer", hex}, {"offset", std::to_string(in.offset)}, {"error", got.status().ToString()}});
        int err = StatusErrno(got.status());
        return send(err > 0 ? err : EIO, 0);
      }
      return send(0, *got);
    }
    case FUSE_RELEASE: {
      std::string hex = hex_of(h.nodeid);
      if (!hex.empty()) cache_->CloseLayer(hex);
      return send(0, 0);
    }
    case FUSE_READDIR:  // names are looked up, not listed: an empty listing
    case FUSE_RELEASEDIR:
    case FUSE_FLUSH:
    case FUSE_DESTROY: return send(0, 0);
    case FUSE_STATFS: {
      fuse_statfs_out o{};
      o.st.bsize = 4096;
      o.st.frsize = 4096;
      o.st.namelen = 255;
      std::memcpy(payload, &o, sizeof o);
      return send(0, sizeof o);
    }
    default: return send(ENOSYS, 0);
  }
}

}  // namespace warren::image
