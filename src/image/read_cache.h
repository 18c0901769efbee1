// Node-local read cache of layer blobs (DESIGN.md §4): the bytes of the
// store's EROFS images that this node read, kept in fixed-size chunks on a
// local disk under a byte cap, evicted least recently used first. Reads of
// a chunk the node does not hold go to the shared store (one pread of the
// chunk), are counted per layer, and are kept for the next reader.
//
// Granularity: chunks (--layer-cache-chunk-kb, 64 KiB by default), not whole
// blobs: a sandbox touches a few percent of its image (bench/RESULTS.md
// "read cache"), so a whole-blob cache would copy the rest for nothing, and
// a chunk is the unit the store is read in. Chunks of one layer live in one
// sparse file <dir>/<hex>; eviction punches the chunk's hole
// (FALLOC_FL_PUNCH_HOLE), so the cache's disk use is the chunks it holds.
//
// Eviction never breaks a reader: the store stays the source of every byte,
// so an evicted chunk is read from it again; a chunk being copied out to a
// reader (pinned) or being fetched is never evicted. The cache is cold after
// a restart (Open empties <dir>): what survived a crash cannot be trusted to
// be whole.
//
// Bookkeeping per layer (its store and local fds, chunk map, hot-list
// bitmap) lives while the layer is open (OpenLayer .. CloseLayer: the FUSE
// files' OPEN/RELEASE, i.e. while an EROFS mount holds it) or holds chunks:
// a layer closed with no chunk left, or whose last chunk is evicted after
// it was closed, is dropped with its local file. What stays per layer ever
// read is its store-read counter (Stats::layers).
//
// Metadata local (keep_metadata): a layer's first open queues a walk of its
// EROFS image (erofs_layout.h) on the prefetch thread; the image's metadata
// prefix [0, metadata_end) (superblock, inodes, directories, chunk
// indexes: ~0.5 % of a chunk-based layer, which is how warren builds them)
// is read whole and kept, never evicted, while the layer is open, so path
// lookups, stat and readdir never wait on the store again; only file data
// is read on demand. At the last close its chunks become evictable like
// any other (least recently used first). A layer whose prefix would take
// the pinned total past half the cap, or that is not a readable EROFS
// image, is served as before, its metadata evictable (logged).
//
// Thread-safe; store and local I/O run outside the lock, a chunk fetched
// once even when several readers miss it together.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace warren::image {

class LayerStore;

class ReadCache {
 public:
  struct Options {
    std::string dir;               // local directory, created 0700; emptied at Open
    uint64_t cap_bytes = 0;        // > 0: the most the chunks may occupy (bytes)
    uint32_t chunk_bytes = 65536;  // power of two, 4 KiB .. 4 MiB
    bool keep_metadata = true;     // keep each open layer's metadata prefix local (see above)
  };
  // InvalidArgument for a zero cap or a bad chunk size; FailedPrecondition
  // naming `dir` when it cannot be made, is not a directory, is not
  // writable, or its file system cannot punch holes; nothing is left
  // behind on error (a directory Open made is removed again).
  static StatusOr<std::unique_ptr<ReadCache>> Open(const LayerStore* store, Options opt);
  ~ReadCache();

  // Copies [off, off + len) of the layer blob `hex` (64 lower-case hex) into
  // `buf`; returns the bytes copied (short at the blob's end, 0 past it).
  // NotFound if the store has no such blob; the store's or the local disk's
  // errno otherwise. A local write error (ENOSPC, EIO) does not fail the
  // read: the chunk is served from memory and not kept (counted in
  // Stats::write_errors; the first is logged with the path).
  StatusOr<size_t> Read(const std::string& hex, uint64_t off, size_t len, char* buf);
  // Size of the blob (bytes); NotFound as Read's. Keeps no state for a
  // layer it does not hold.
  StatusOr<uint64_t> Size(const std::string& hex);
  // A reader opened / closed the layer's blob (counted; a Close without an
  // Open, e.g. of a file opened under a previous daemon, is ignored). Open
  // sets up nothing yet (the first Read does); Close drops the layer's state
  // when nothing holds it any more (see the header).
  void OpenLayer(const std::string& hex);
  void CloseLayer(const std::string& hex);

  // Hot list (prefetch): the byte ranges of a layer's blob this node read
  // from the store since it opened the layer, written once per layer to the
  // store (<store>/meta/<hex>.hot, text "offset length\n" per range; the
  // first node to write it wins, across nodes) so that any node mounting
  // the layer later reads them ahead. RecordHot: OK when written or already
  // there (or nothing read yet); the error of the write otherwise.
  Status RecordHot(const std::string& hex);
  // Queues a read-ahead of the layer's hot list (if the store has one) on
  // the cache's prefetch thread: missing chunks are fetched in ranges of up
  // to 1 MiB (one pread each) and kept as any chunk; a reader that needs a
  // chunk being prefetched waits for it. Returns at once; a layer already
  // prefetched since Open is not queued again.
  void Prefetch(const std::string& hex);

  struct LayerStats {
    uint64_t store_read_bytes = 0;  // read from the store for this layer since Open
    uint64_t cached_bytes = 0;      // its chunks held now
    uint64_t metadata_bytes = 0;    // of them, its metadata prefix kept local (0: not kept)
  };
  struct Stats {
    uint64_t cap_bytes = 0, cached_bytes = 0;
    uint64_t hits = 0, misses = 0;  // chunks found / fetched from the store, per chunk a read touched
    uint64_t evictions = 0, write_errors = 0;
    uint64_t store_read_bytes = 0;             // all layers
    uint64_t prefetched_bytes = 0;             // of it, read by Prefetch
    uint64_t metadata_bytes = 0;               // held now as open layers' metadata (never evicted)
    std::map<std::string, LayerStats> layers;  // key: hex, every layer read since Open
    uint64_t layers_held = 0;                  // layers with state now (open or holding chunks)
  };
  Stats stats() const;
  const Options& options() const { return opt_; }

 private:
  enum class ChunkState { kFetching, kPresent };
  struct Chunk {
    ChunkState state = ChunkState::kFetching;
    uint32_t readers = 0;                                       // copying out of the local file now: not evictable
    bool kept = false;                                          // metadata of an open layer: not in lru_
    uint64_t bytes = 0;                                         // held on disk (the blob's tail chunk is short)
    std::list<std::pair<std::string, uint64_t>>::iterator lru;  // valid when kPresent
  };
  struct Layer {
    UniqueFd store_fd, local_fd;
    uint64_t size = 0;
    std::unordered_map<uint64_t, Chunk> chunks;  // key: chunk index
    std::vector<bool> fetched;                   // chunk indexes read from the store since Open (hot list)
    bool prefetch_queued = false;
    bool metadata_queued = false;  // its metadata walk was queued since the state was made
    uint64_t kept_chunks = 0;      // chunks [0, kept_chunks) are its metadata, kept while it is open
    uint64_t kept_bytes = 0;       // of its chunks held now, those kept
    bool hot_recorded = false;     // RecordHot wrote the list or found one
    uint32_t opens = 0;            // OpenLayer - CloseLayer
    uint64_t cached_bytes = 0;     // its chunks held now
  };
  ReadCache(const LayerStore* store, Options opt) : store_(store), opt_(std::move(opt)) {}
  // Opens the layer's store blob and local file (mu_ held: the opens are
  // local and the blob's open a metadata call).
  StatusOr<Layer*> LayerLocked(const std::string& hex);
  // Copies one chunk's part [off, off + len) (within chunk `idx`) into buf.
  Status ReadChunk(const std::string& hex, uint64_t idx, uint64_t off, size_t len, char* buf);
  // Punches out least recently used unpinned chunks until cached <= cap.
  void EvictLocked();
  // Keeps a fetched chunk (mu_ held): present, most recently used, counted.
  void AdmitLocked(Layer& l, const std::string& hex, uint64_t idx, uint64_t bytes);
  // Drops the layer's state if it is closed and holds no chunk (mu_ held).
  void MaybeDropLocked(const std::string& hex);
  // Counts bytes read from the store for the layer (mu_ held).
  void CountStoreReadLocked(const std::string& hex, uint64_t bytes, bool prefetch);
  void PrefetchLoop();
  void PrefetchOne(const std::string& hex);
  // Fetches the chunks of [off, off + len) the node lacks, in runs of up to
  // 1 MiB (one pread each); false when a read failed or the cache stops.
  bool FetchRange(const std::string& hex, uint64_t off, uint64_t len, bool prefetch);
  // Walks the layer's image, then fetches and keeps its metadata prefix.
  void KeepMetadata(const std::string& hex);
  // The layer's kept chunks become ordinary (evictable) ones (mu_ held).
  void ReleaseKeptLocked(Layer& l, const std::string& hex);

  const LayerStore* store_;
  const Options opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // a fetch finished
  std::map<std::string, Layer> layers_;
  std::map<std::string, uint64_t> layer_reads_;      // hex -> bytes read from the store since Open
  std::list<std::pair<std::string, uint64_t>> lru_;  // (hex, chunk index); front = most recent
  uint64_t cached_ = 0, hits_ = 0, misses_ = 0, evictions_ = 0, write_errors_ = 0, store_read_ = 0;
  uint64_t prefetched_ = 0;
  std::vector<std::string> prefetch_queue_;  // hex; guarded by mu_, drained by prefetch_thread_
  std::vector<std::string> metadata_queue_;  // hex: metadata walks, before any prefetch
  uint64_t kept_bytes_ = 0;                  // chunks kept as metadata now
  bool stopping_ = false;
  std::thread prefetch_thread_;
};

}  // namespace warren::image
