#include "image/blob_fs.h"

#include <fcntl.h>
#include <linux/fuse.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "image/fs_util.h"

namespace warren::image {
namespace {

constexpr uint64_t kRootId = FUSE_ROOT_ID;  // 1
constexpr uint32_t kMaxPages = 256;         // 1 MiB per READ
constexpr size_t kBufBytes = (size_t{kMaxPages} + 1) * 4096;

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

}  // namespace

StatusOr<std::unique_ptr<BlobFs>> BlobFs::Mount(ReadCache* cache, const std::string& mountpoint, int threads) {
  if (cache == nullptr) return absl::InvalidArgumentError("BlobFs: no read cache");
  umount2(mountpoint.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW);  // a previous daemon's, if any
  RETURN_IF_ERROR(MakeDirs(mountpoint));
  if (chmod(mountpoint.c_str(), 0700) != 0) return ErrnoToStatus(errno, "chmod(" + mountpoint + ", 0700)");
  std::unique_ptr<BlobFs> fs(new BlobFs(cache, mountpoint));
  fs->dev_.reset(open("/dev/fuse", O_RDWR | O_NONBLOCK | O_CLOEXEC));
  if (!fs->dev_.valid()) return ErrnoToStatus(errno, "open(/dev/fuse)");
  fs->ids_ = {"", ""};  // 0 unused, 1 the root
  const std::string opts =
      "fd=" + std::to_string(fs->dev_.get()) +
      ",rootmode=40000,user_id=0,group_id=0,allow_other,max_read=" + std::to_string(kMaxPages * 4096);
  if (mount("warren-blobs", mountpoint.c_str(), "fuse", MS_NODEV | MS_NOSUID | MS_NOEXEC | MS_RDONLY, opts.c_str()) !=
      0) {
    return ErrnoToStatus(errno, "mount(fuse, " + mountpoint + ")");
  }
  fs->wake_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!fs->wake_.valid()) {
    int err = errno;
    umount2(mountpoint.c_str(), MNT_DETACH);
    return ErrnoToStatus(err, "eventfd");
  }
  for (int i = 0; i < std::max(1, threads); ++i) fs->threads_.emplace_back([p = fs.get()] { p->Serve(); });
  return fs;
}

BlobFs::~BlobFs() { Shutdown(); }

void BlobFs::Shutdown() {
  if (stopping_.exchange(true)) return;
  umount2(mountpoint_.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW);
  uint64_t one = 1;
  if (write(wake_.get(), &one, sizeof one) < 0) Log(spdlog::level::warn, "BlobFs: eventfd write failed");
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  dev_.reset();  // the last fd of the connection: the kernel aborts it
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
  auto hex_of = [&](uint64_t id) -> std::string {
    std::lock_guard<std::mutex> lock(ids_mu_);
    return id >= 2 && id < ids_.size() ? ids_[id] : std::string();
  };
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
      uint64_t id = 0;
      {
        std::lock_guard<std::mutex> lock(ids_mu_);
        auto it = std::find(ids_.begin() + 2, ids_.end(), hex);
        id = static_cast<uint64_t>(it - ids_.begin());
        if (it == ids_.end()) ids_.push_back(hex);
      }
      fuse_entry_out e{};
      e.nodeid = id;
      e.entry_valid = 3600;  // blobs are immutable
      e.attr_valid = 3600;
      FillAttr(&e.attr, id, *size, false);
      std::memcpy(payload, &e, sizeof e);
      return send(0, sizeof e);
    }
    case FUSE_FORGET:
    case FUSE_BATCH_FORGET:
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
    case FUSE_READDIR:  // names are looked up, not listed: an empty listing
    case FUSE_RELEASE:
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
