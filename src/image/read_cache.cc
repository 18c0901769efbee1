#include "image/read_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "common/log.h"
#include "image/erofs_layout.h"
#include "image/fs_util.h"
#include "image/layer_store.h"

namespace warren::image {
namespace {

bool IsHex64(const std::string& s) {
  return s.size() == 64 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

Status Precondition(const std::string& dir, const std::string& what, int err) {
  return absl::FailedPreconditionError("layer read cache dir " + dir + ": " + what + ": " + std::strerror(err));
}

// Reads exactly len bytes at off unless the file ends first.
StatusOr<size_t> PreadFull(int fd, char* buf, size_t len, uint64_t off, const std::string& what) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = pread(fd, buf + done, len - done, static_cast<off_t>(off + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "pread(" + what + ")");
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

// A buffer for O_DIRECT reads of the store: 4 KiB aligned, its size rounded
// up to 4 KiB (a read of the blob's tail asks for the rounded length and
// gets the rest of the file).
class IoBuf {
 public:
  explicit IoBuf(size_t n)
      : size_(std::max<size_t>(4096, (n + 4095) & ~size_t{4095})),
        p_(static_cast<char*>(std::aligned_alloc(4096, size_))) {
    if (p_ == nullptr) throw std::bad_alloc();
  }
  ~IoBuf() { std::free(p_); }
  IoBuf(const IoBuf&) = delete;
  IoBuf& operator=(const IoBuf&) = delete;
  char* data() { return p_; }
  size_t size() const { return size_; }

 private:
  size_t size_;
  char* p_;
};

int PwriteFull(int fd, const char* buf, size_t len, uint64_t off) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = pwrite(fd, buf + done, len - done, static_cast<off_t>(off + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    done += static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

StatusOr<std::unique_ptr<ReadCache>> ReadCache::Open(const LayerStore* store, Options opt) {
  if (store == nullptr) return absl::InvalidArgumentError("ReadCache: no layer store");
  if (opt.cap_bytes == 0) return absl::InvalidArgumentError("layer read cache: the size cap must be > 0 bytes");
  const uint32_t c = opt.chunk_bytes;
  if (c < 4096 || c > (4u << 20) || (c & (c - 1)) != 0) {
    return absl::InvalidArgumentError("layer read cache: chunk size " + std::to_string(c) +
                                      " bytes is not a power of two in 4 KiB .. 4 MiB");
  }
  const std::string& dir = opt.dir;
  struct stat st {};
  const bool existed = ::stat(dir.c_str(), &st) == 0;
  if (existed && !S_ISDIR(st.st_mode)) return Precondition(dir, "not a directory", ENOTDIR);
  if (!existed) {
    Status made = MakeDirs(dir);
    if (!made.ok()) return absl::FailedPreconditionError("layer read cache dir " + dir + ": " + made.ToString());
  }
  auto undo = [&] {
    if (!existed) rmdir(dir.c_str());
  };
  if (chmod(dir.c_str(), 0700) != 0) {
    int err = errno;
    undo();
    return Precondition(dir, "chmod 0700", err);
  }
  // Cold start: chunks a previous daemon left may be torn by a crash.
  if (DIR* d = opendir(dir.c_str())) {
    std::vector<std::string> old;
    while (dirent* de = readdir(d)) {
      std::string n = de->d_name;
      if (IsHex64(n) || n.rfind(".probe-", 0) == 0) old.push_back(n);
    }
    closedir(d);
    for (const std::string& n : old) unlink((dir + "/" + n).c_str());
  } else {
    int err = errno;
    undo();
    return Precondition(dir, "opendir", err);
  }
  // The file system must take writes and punch holes (eviction).
  const std::string probe = dir + "/.probe-" + UniqueSuffix();
  UniqueFd pf(open(probe.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  int err = pf.valid() ? 0 : errno;
  if (err == 0) {
    char block[4096] = {1};
    err = PwriteFull(pf.get(), block, sizeof block, 0);
    if (err == 0 && fallocate(pf.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, sizeof block) != 0) {
      err = errno;
    }
    unlink(probe.c_str());
  }
  if (err != 0) {
    undo();
    return Precondition(dir, "cannot write and punch holes in a file there", err);
  }
  std::unique_ptr<ReadCache> cache(new ReadCache(store, std::move(opt)));
  cache->prefetch_thread_ = std::thread([p = cache.get()] { p->PrefetchLoop(); });
  return cache;
}

ReadCache::~ReadCache() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (prefetch_thread_.joinable()) prefetch_thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [hex, l] : layers_) unlink((opt_.dir + "/" + hex).c_str());
}

StatusOr<ReadCache::Layer*> ReadCache::LayerLocked(const std::string& hex) {
  auto it = layers_.find(hex);
  if (it != layers_.end()) return &it->second;
  if (!IsHex64(hex)) return absl::InvalidArgumentError("layer \"" + hex + "\" is not 64 lower-case hex");
  Layer l;
  const std::string blob = store_->BlobPath("sha256:" + hex);
  // O_DIRECT where the file system takes it: no page cache of the store's
  // file beside the cache's chunks, and no read-ahead by its client (the
  // kernel's, GlusterFS's read-ahead and io-cache translators).
  l.store_fd.reset(open(blob.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT));
  if (!l.store_fd.valid() && errno == EINVAL) l.store_fd.reset(open(blob.c_str(), O_RDONLY | O_CLOEXEC));
  if (!l.store_fd.valid()) {
    if (errno == ENOENT) return absl::NotFoundError("layer sha256:" + hex + " not in the store");
    return ErrnoToStatus(errno, "open(" + blob + ")");
  }
  // The cache decides what is read: no read-ahead of the store's file.
  posix_fadvise(l.store_fd.get(), 0, 0, POSIX_FADV_RANDOM);
  struct stat st {};
  if (fstat(l.store_fd.get(), &st) != 0) return ErrnoToStatus(errno, "fstat(" + blob + ")");
  l.size = static_cast<uint64_t>(st.st_size);
  const std::string local = opt_.dir + "/" + hex;
  l.local_fd.reset(open(local.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!l.local_fd.valid()) return ErrnoToStatus(errno, "open(" + local + ")");
  return &layers_.emplace(hex, std::move(l)).first->second;
}

StatusOr<uint64_t> ReadCache::Size(const std::string& hex) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = layers_.find(hex);
    if (it != layers_.end()) return it->second.size;
  }
  if (!IsHex64(hex)) return absl::InvalidArgumentError("layer \"" + hex + "\" is not 64 lower-case hex");
  const std::string blob = store_->BlobPath("sha256:" + hex);
  struct stat st {};
  if (::stat(blob.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::NotFoundError("layer sha256:" + hex + " not in the store");
    return ErrnoToStatus(errno, "stat(" + blob + ")");
  }
  return static_cast<uint64_t>(st.st_size);
}

void ReadCache::OpenLayer(const std::string& hex) {
  std::lock_guard<std::mutex> lock(mu_);
  StatusOr<Layer*> l = LayerLocked(hex);
  if (!l.ok()) return;  // a layer that cannot be opened fails its reads, counted or not
  ++(*l)->opens;
  if (opt_.keep_metadata && !(*l)->metadata_queued) {
    (*l)->metadata_queued = true;
    metadata_queue_.push_back(hex);
    cv_.notify_all();
  }
}

void ReadCache::CloseLayer(const std::string& hex) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = layers_.find(hex);
  if (it == layers_.end()) return;
  if (it->second.opens > 0) --it->second.opens;
  if (it->second.opens == 0) ReleaseKeptLocked(it->second, hex);
  MaybeDropLocked(hex);
}

void ReadCache::ReleaseKeptLocked(Layer& l, const std::string& hex) {
  for (uint64_t idx = 0; idx < l.kept_chunks; ++idx) {
    auto it = l.chunks.find(idx);
    if (it == l.chunks.end() || !it->second.kept) continue;
    Chunk& c = it->second;
    c.kept = false;
    lru_.emplace_back(hex, idx);  // no longer mounted: the first to go
    c.lru = std::prev(lru_.end());
    kept_bytes_ -= c.bytes;
    l.kept_bytes -= c.bytes;
  }
  l.kept_chunks = 0;
  l.metadata_queued = false;  // the next open keeps it again
  EvictLocked();
}

void ReadCache::MaybeDropLocked(const std::string& hex) {
  auto it = layers_.find(hex);
  if (it == layers_.end() || it->second.opens > 0 || !it->second.chunks.empty()) return;
  unlink((opt_.dir + "/" + hex).c_str());
  layers_.erase(it);  // its fds close
}

void ReadCache::CountStoreReadLocked(const std::string& hex, uint64_t bytes, bool prefetch) {
  layer_reads_[hex] += bytes;
  store_read_ += bytes;
  if (prefetch) prefetched_ += bytes;
}

StatusOr<size_t> ReadCache::Read(const std::string& hex, uint64_t off, size_t len, char* buf) {
  uint64_t size = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSIGN_OR_RETURN(Layer * l, LayerLocked(hex));
    size = l->size;
  }
  if (off >= size) return 0;
  len = static_cast<size_t>(std::min<uint64_t>(len, size - off));
  const uint64_t cb = opt_.chunk_bytes;
  size_t done = 0;
  while (done < len) {
    const uint64_t pos = off + done;
    const uint64_t idx = pos / cb;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(len - done, (idx + 1) * cb - pos));
    RETURN_IF_ERROR(ReadChunk(hex, idx, pos - idx * cb, n, buf + done));
    done += n;
  }
  return done;
}

Status ReadCache::ReadChunk(const std::string& hex, uint64_t idx, uint64_t off, size_t len, char* buf) {
  const uint64_t cb = opt_.chunk_bytes;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    ASSIGN_OR_RETURN(Layer * l, LayerLocked(hex));
    auto it = l->chunks.find(idx);
    if (it != l->chunks.end() && it->second.state == ChunkState::kFetching) {
      cv_.wait(lock);
      continue;  // the fetch may have failed: look again
    }
    if (it != l->chunks.end()) {  // present: pin, copy out of the local file, unpin
      Chunk& ch = it->second;
      ++hits_;
      if (!ch.kept) lru_.splice(lru_.begin(), lru_, ch.lru);
      ++ch.readers;
      const int fd = l->local_fd.get();
      lock.unlock();
      StatusOr<size_t> got = PreadFull(fd, buf, len, idx * cb + off, opt_.dir + "/" + hex);
      lock.lock();
      --layers_.at(hex).chunks.at(idx).readers;  // pinned: neither the layer nor the chunk went away
      if (!got.ok()) return got.status();
      if (*got != len) return absl::DataLossError("layer read cache: " + opt_.dir + "/" + hex + " is short");
      return absl::OkStatus();
    }
    // Missing: this reader fetches the whole chunk; others wait on cv_.
    Chunk& ch = l->chunks[idx];
    ch.state = ChunkState::kFetching;
    ++misses_;
    const int store_fd = l->store_fd.get(), local_fd = l->local_fd.get();
    const uint64_t want = std::min<uint64_t>(cb, l->size - idx * cb);
    lock.unlock();
    IoBuf data(want);
    StatusOr<size_t> got = PreadFull(store_fd, data.data(), data.size(), idx * cb, store_->BlobPath("sha256:" + hex));
    int werr = 0;
    if (got.ok() && *got == want) werr = PwriteFull(local_fd, data.data(), want, idx * cb);
    lock.lock();
    Layer& lay = layers_.at(hex);
    if (got.ok()) CountStoreReadLocked(hex, *got, false);
    const bool keep = got.ok() && *got == want && werr == 0;
    if (keep) {
      AdmitLocked(lay, hex, idx, want);
    } else {
      lay.chunks.erase(idx);
      if (werr != 0) {
        // The store's bytes are good: serve them, keep nothing (a torn
        // chunk must not be read back).
        fallocate(local_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(idx * cb),
                  static_cast<off_t>(want));
        if (write_errors_++ == 0) {
          Log(spdlog::level::warn, "layer read cache: cannot keep a chunk, serving it from the store",
              {{"path", opt_.dir + "/" + hex}, {"error", std::strerror(werr)}});
        }
      }
    }
    if (!keep) MaybeDropLocked(hex);
    cv_.notify_all();
    if (!got.ok()) return got.status();
    if (*got != want) {
      return absl::DataLossError("layer sha256:" + hex + " in the store is shorter than when it was opened");
    }
    std::memcpy(buf, data.data() + off, len);
    return absl::OkStatus();
  }
}

void ReadCache::AdmitLocked(Layer& l, const std::string& hex, uint64_t idx, uint64_t bytes) {
  Chunk& c = l.chunks.at(idx);
  c.state = ChunkState::kPresent;
  c.bytes = bytes;
  if (idx < l.kept_chunks) {  // metadata of an open layer: kept, outside the LRU order
    c.kept = true;
    kept_bytes_ += bytes;
    l.kept_bytes += bytes;
  } else {
    lru_.emplace_front(hex, idx);
    c.lru = lru_.begin();
  }
  cached_ += bytes;
  l.cached_bytes += bytes;
  if (l.fetched.size() <= idx) l.fetched.resize(idx + 1);
  l.fetched[idx] = true;
  EvictLocked();
}

Status ReadCache::RecordHot(const std::string& hex) {
  std::string text;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = layers_.find(hex);
    if (it == layers_.end()) return absl::OkStatus();
    const Layer& l = it->second;
    if (l.hot_recorded) return absl::OkStatus();
    const uint64_t cb = opt_.chunk_bytes;
    for (uint64_t i = 0; i < l.fetched.size();) {
      if (!l.fetched[i]) {
        ++i;
        continue;
      }
      uint64_t j = i;
      while (j < l.fetched.size() && l.fetched[j]) ++j;
      text += std::to_string(i * cb) + " " + std::to_string(std::min(j * cb, l.size) - i * cb) + "\n";
      i = j;
    }
  }
  if (text.empty()) return absl::OkStatus();
  const std::string path = store_->dir() + "/meta/" + hex + ".hot";
  Status st = CreateFileExclusive(path, text);
  if (absl::IsAlreadyExists(st)) st = absl::OkStatus();
  if (st.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = layers_.find(hex);
    if (it != layers_.end()) it->second.hot_recorded = true;  // (a dropped layer records again: AlreadyExists)
  }
  return st;
}

void ReadCache::Prefetch(const std::string& hex) {
  std::lock_guard<std::mutex> lock(mu_);
  StatusOr<Layer*> l = LayerLocked(hex);
  if (!l.ok() || (*l)->prefetch_queued) return;
  (*l)->prefetch_queued = true;
  prefetch_queue_.push_back(hex);
  cv_.notify_all();
}

void ReadCache::PrefetchLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !prefetch_queue_.empty() || !metadata_queue_.empty(); });
    if (stopping_) return;
    if (!metadata_queue_.empty()) {  // metadata first: every reader of the layer needs it
      std::string hex = metadata_queue_.front();
      metadata_queue_.erase(metadata_queue_.begin());
      lock.unlock();
      KeepMetadata(hex);
      lock.lock();
      continue;
    }
    std::string hex = prefetch_queue_.front();
    prefetch_queue_.erase(prefetch_queue_.begin());
    lock.unlock();
    PrefetchOne(hex);
    lock.lock();
  }
}

void ReadCache::PrefetchOne(const std::string& hex) {
  StatusOr<std::string> text = ReadSmallFile(store_->dir() + "/meta/" + hex + ".hot", 16 << 20);
  if (!text.ok()) return;  // no hot list yet: nothing to read ahead
  size_t pos = 0;
  while (pos < text->size()) {
    size_t eol = text->find('\n', pos);
    if (eol == std::string::npos) eol = text->size();
    unsigned long long off = 0, len = 0;  // NOLINT(google-runtime-int): sscanf's %llu
    if (std::sscanf(text->substr(pos, eol - pos).c_str(), "%llu %llu", &off, &len) != 2) return;
    pos = eol + 1;
    if (!FetchRange(hex, off, len, /*prefetch=*/true)) return;
  }
}

bool ReadCache::FetchRange(const std::string& hex, uint64_t off, uint64_t len, bool prefetch) {
  const uint64_t cb = opt_.chunk_bytes;
  constexpr uint64_t kMaxRange = 1 << 20;
  IoBuf data(std::max<uint64_t>(kMaxRange, cb));
  // The chunks of [off, off + len) this node lacks, in runs of <= kMaxRange.
  for (uint64_t idx = off / cb; idx * cb < off + len;) {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) return false;
    StatusOr<Layer*> lp = LayerLocked(hex);
    if (!lp.ok()) return false;
    Layer& l = **lp;
    if (idx * cb >= l.size) break;
    if (l.chunks.contains(idx)) {
      ++idx;
      continue;
    }
    const uint64_t first = idx, end = std::min<uint64_t>(off + len, l.size);
    uint64_t n = 0;
    while ((first + n) * cb < end && n * cb < kMaxRange && !l.chunks.contains(first + n)) {
      l.chunks[first + n].state = ChunkState::kFetching;
      ++n;
    }
    const uint64_t bytes = std::min((first + n) * cb, l.size) - first * cb;
    const int store_fd = l.store_fd.get(), local_fd = l.local_fd.get();
    lock.unlock();
    StatusOr<size_t> got =
        PreadFull(store_fd, data.data(), std::min<size_t>(data.size(), (bytes + 4095) & ~uint64_t{4095}), first * cb,
                  store_->BlobPath("sha256:" + hex));
    const bool ok = got.ok() && *got == bytes && PwriteFull(local_fd, data.data(), bytes, first * cb) == 0;
    lock.lock();
    Layer& lay = layers_.at(hex);
    if (got.ok()) CountStoreReadLocked(hex, *got, prefetch);
    for (uint64_t i = first; i < first + n; ++i) {
      if (ok) {
        AdmitLocked(lay, hex, i, std::min(cb, lay.size - i * cb));
      } else {
        lay.chunks.erase(i);
      }
    }
    if (!ok) MaybeDropLocked(hex);
    cv_.notify_all();
    if (!ok) return false;
    idx = first + n;
  }
  return true;
}

void ReadCache::KeepMetadata(const std::string& hex) {
  uint64_t size = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = layers_.find(hex);
    if (it == layers_.end() || it->second.opens == 0) return;  // closed meanwhile
    size = it->second.size;
  }
  // The walk reads through the cache: the metadata it touches is fetched
  // (and counted) as any read's.
  StatusOr<ErofsLayout> layout =
      ReadErofsLayout([this, &hex](uint64_t off, size_t len, char* buf) { return Read(hex, off, len, buf); }, size);
  if (!layout.ok()) {
    Log(spdlog::level::info, "layer read cache: metadata not kept local",
        {{"layer", hex}, {"error", layout.status().ToString()}});
    return;
  }
  if (layout->stray_metadata_bytes > 0) {  // a plain-format layer (built before layers were chunk-based)
    Log(spdlog::level::info, "layer read cache: part of a layer's metadata lies among its data and is not kept",
        {{"layer", hex},
         {"kept_prefix_bytes", std::to_string(layout->metadata_end)},
         {"stray_metadata_bytes", std::to_string(layout->stray_metadata_bytes)}});
  }
  const uint64_t cb = opt_.chunk_bytes;
  const uint64_t n = (layout->metadata_end + cb - 1) / cb;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = layers_.find(hex);
    if (it == layers_.end() || it->second.opens == 0 || n == 0) return;
    Layer& l = it->second;
    const uint64_t want = std::min(n * cb, l.size);
    if (kept_bytes_ + want > opt_.cap_bytes / 2) {
      Log(spdlog::level::warn, "layer read cache: metadata not kept local (kept metadata would pass half the cap)",
          {{"layer", hex},
           {"metadata_bytes", std::to_string(want)},
           {"kept_bytes", std::to_string(kept_bytes_)},
           {"cap_bytes", std::to_string(opt_.cap_bytes)}});
      return;
    }
    l.kept_chunks = n;
    for (uint64_t idx = 0; idx < n; ++idx) {  // what the walk (or a reader) already fetched
      auto c = l.chunks.find(idx);
      if (c == l.chunks.end() || c->second.state != ChunkState::kPresent || c->second.kept) continue;
      lru_.erase(c->second.lru);
      c->second.kept = true;
      kept_bytes_ += c->second.bytes;
      l.kept_bytes += c->second.bytes;
    }
  }
  (void)FetchRange(hex, 0, layout->metadata_end, /*prefetch=*/false);  // the rest of the prefix
}

void ReadCache::EvictLocked() {
  auto it = lru_.end();
  while (cached_ > opt_.cap_bytes && it != lru_.begin()) {
    --it;
    Layer& l = layers_.at(it->first);
    Chunk& c = l.chunks.at(it->second);
    if (c.readers > 0) continue;  // pinned: the next one up
    const uint64_t at = it->second * opt_.chunk_bytes;
    fallocate(l.local_fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(at),
              static_cast<off_t>(c.bytes));
    cached_ -= c.bytes;
    l.cached_bytes -= c.bytes;
    ++evictions_;
    l.chunks.erase(it->second);
    const std::string hex = it->first;
    it = lru_.erase(it);
    MaybeDropLocked(hex);  // a closed layer's last chunk: its state goes too
  }
}

ReadCache::Stats ReadCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  s.cap_bytes = opt_.cap_bytes;
  s.cached_bytes = cached_;
  s.hits = hits_;
  s.misses = misses_;
  s.evictions = evictions_;
  s.write_errors = write_errors_;
  s.store_read_bytes = store_read_;
  s.prefetched_bytes = prefetched_;
  for (const auto& [hex, bytes] : layer_reads_) s.layers[hex].store_read_bytes = bytes;
  for (const auto& [hex, l] : layers_) {
    s.layers[hex].cached_bytes = l.cached_bytes;
    s.layers[hex].metadata_bytes = l.kept_bytes;
  }
  s.metadata_bytes = kept_bytes_;
  s.layers_held = layers_.size();
  return s;
}

}  // namespace warren::image
