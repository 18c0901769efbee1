// ReadCache (chunks of store blobs on local disk, LRU under a cap) and
// BlobFs (the cache as FUSE files) with real files, a real tmpfs for the
// full-disk case and a real EROFS mount through the FUSE files.
#include "image/read_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "image/blob_fs.h"
#include "image/erofs_layout.h"
#include "image/fs_util.h"
#include "image/layer_store.h"
#include "status_matchers.h"
#include "test_util.h"

namespace warren::image {
namespace {

using ::warren::image::testing::CountMountsUnder;
using ::warren::image::testing::MakeTempDir;
using ::warren::image::testing::RandomBytes;
using ::warren::image::testing::ReadFile;
using ::warren::image::testing::WriteFile;

constexpr uint32_t kChunk = 4096;
const std::string kHex(64, 'a');

class ReadCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = MakeTempDir();
    auto s = LayerStore::Open(root_ + "/store");
    ASSERT_OK(s);
    store_ = *std::move(s);
    blob_ = RandomBytes(10 * kChunk + 123, 1);
    WriteFile(store_->BlobPath("sha256:" + kHex), blob_);
  }
  void TearDown() override {
    umount2((root_ + "/small").c_str(), MNT_DETACH);
    EXPECT_EQ(CountMountsUnder(root_), 0);
    EXPECT_OK(RemoveTree(root_));
  }
  // keep_metadata off unless asked: these blobs are mostly not EROFS images.
  std::unique_ptr<ReadCache> Open(uint64_t cap, const std::string& dir = "", bool keep_metadata = false) {
    auto c = ReadCache::Open(store_.get(), {dir.empty() ? root_ + "/cache" : dir, cap, kChunk, keep_metadata});
    EXPECT_OK(c);
    return c.ok() ? *std::move(c) : nullptr;
  }
  // Reads chunk `i` whole and checks it against the blob.
  void ReadChunk(ReadCache* c, uint64_t i) {
    std::string buf(kChunk, '\0');
    auto n = c->Read(kHex, i * kChunk, kChunk, buf.data());
    ASSERT_OK(n);
    ASSERT_EQ(*n, std::min<size_t>(kChunk, blob_.size() - i * kChunk));
    buf.resize(*n);
    EXPECT_EQ(buf, blob_.substr(i * kChunk, *n)) << "chunk " << i;
  }
  uint64_t StoreRead(ReadCache* c) { return c->stats().store_read_bytes; }

  std::string root_, blob_;
  std::unique_ptr<LayerStore> store_;
};

TEST_F(ReadCacheTest, ReadsWhatTheStoreHoldsAndCountsWhatItFetched) {
  auto c = Open(1 << 20);
  ASSERT_NE(c, nullptr);
  std::string buf(5000, '\0');
  auto n = c->Read(kHex, 4000, 5000, buf.data());  // spans chunks 0, 1 and 2
  ASSERT_OK(n);
  EXPECT_EQ(*n, 5000u);
  EXPECT_EQ(buf, blob_.substr(4000, 5000));
  EXPECT_EQ(StoreRead(c.get()), 3u * kChunk);       // whole chunks, nothing more
  ASSERT_OK(c->Read(kHex, 4100, 100, buf.data()));  // held: no store read
  EXPECT_EQ(StoreRead(c.get()), 3u * kChunk);
  // The tail chunk is short; past the end reads nothing.
  ReadChunk(c.get(), 10);
  EXPECT_EQ(StoreRead(c.get()), 3u * kChunk + 123);
  auto past = c->Read(kHex, blob_.size() + 1, 10, buf.data());
  ASSERT_OK(past);
  EXPECT_EQ(*past, 0u);
  const ReadCache::Stats s = c->stats();
  EXPECT_EQ(s.misses, 4u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.layers.at(kHex).store_read_bytes, s.store_read_bytes);
  EXPECT_EQ(s.cached_bytes, 3u * kChunk + 123);
  EXPECT_TRUE(absl::IsNotFound(c->Read(std::string(64, 'b'), 0, 1, buf.data()).status()));
}

TEST_F(ReadCacheTest, CapIsRespectedAndTheLeastRecentlyUsedChunkGoes) {
  auto c = Open(uint64_t{3} * kChunk);
  ASSERT_NE(c, nullptr);
  for (uint64_t i : {0, 1, 2}) ReadChunk(c.get(), i);
  ReadChunk(c.get(), 0);  // 1 is now the least recently used
  const uint64_t before = StoreRead(c.get());
  ReadChunk(c.get(), 3);  // over the cap: 1 goes
  EXPECT_EQ(c->stats().evictions, 1u);
  EXPECT_LE(c->stats().cached_bytes, 3u * kChunk);
  ReadChunk(c.get(), 0);
  ReadChunk(c.get(), 2);
  EXPECT_EQ(StoreRead(c.get()), before + kChunk) << "0 and 2 were kept";
  ReadChunk(c.get(), 1);
  EXPECT_EQ(StoreRead(c.get()), before + uint64_t{2} * kChunk) << "1 was evicted: read from the store again";
  // The local file holds no more than the cap (evicted chunks are holes).
  for (uint64_t i = 0; i < 11; ++i) ReadChunk(c.get(), i);
  struct stat st {};
  ASSERT_EQ(stat((root_ + "/cache/" + kHex).c_str(), &st), 0);
  EXPECT_LE(static_cast<uint64_t>(st.st_blocks) * 512, 3u * kChunk);
  EXPECT_LE(c->stats().cached_bytes, 3u * kChunk);
}

TEST_F(ReadCacheTest, BadOptionsAndBadDirsAreClearErrorsAndLeaveNothing) {
  auto cap0 = ReadCache::Open(store_.get(), {root_ + "/c0", 0, kChunk});
  EXPECT_TRUE(absl::IsInvalidArgument(cap0.status())) << cap0.status();
  auto odd = ReadCache::Open(store_.get(), {root_ + "/c1", 1 << 20, 3000});
  EXPECT_TRUE(absl::IsInvalidArgument(odd.status())) << odd.status();
  EXPECT_NE(odd.status().message().find("3000"), std::string::npos);
  WriteFile(root_ + "/file", "x");
  auto notdir = ReadCache::Open(store_.get(), {root_ + "/file", 1 << 20, kChunk});
  EXPECT_TRUE(absl::IsFailedPrecondition(notdir.status())) << notdir.status();
  EXPECT_NE(notdir.status().message().find(root_ + "/file"), std::string::npos) << notdir.status();
  auto under = ReadCache::Open(store_.get(), {root_ + "/file/sub", 1 << 20, kChunk});
  EXPECT_TRUE(absl::IsFailedPrecondition(under.status())) << under.status();
  // A read-only file system: the dir exists but takes no writes.
  const std::string ro = root_ + "/ro";
  ASSERT_EQ(mkdir(ro.c_str(), 0755), 0);
  ASSERT_EQ(mount("tmpfs", ro.c_str(), "tmpfs", MS_RDONLY, "size=64k"), 0);
  auto rofs = ReadCache::Open(store_.get(), {ro + "/cache", 1 << 20, kChunk});
  EXPECT_TRUE(absl::IsFailedPrecondition(rofs.status())) << rofs.status();
  EXPECT_NE(rofs.status().message().find(ro + "/cache"), std::string::npos) << rofs.status();
  ASSERT_EQ(umount2(ro.c_str(), 0), 0);
  struct stat st {};
  EXPECT_NE(stat((root_ + "/c0").c_str(), &st), 0) << "nothing made for a refused cache";
}

TEST_F(ReadCacheTest, AFullDiskServesFromTheStoreAndKeepsWhatFits) {
  const std::string small = root_ + "/small";
  ASSERT_EQ(mkdir(small.c_str(), 0755), 0);
  ASSERT_EQ(mount("tmpfs", small.c_str(), "tmpfs", 0, "size=16k"), 0);  // 4 chunks
  auto c = Open(1 << 20, small + "/cache");
  ASSERT_NE(c, nullptr);
  for (uint64_t i = 0; i < 11; ++i) ReadChunk(c.get(), i);  // every read right
  const ReadCache::Stats s = c->stats();
  EXPECT_GT(s.write_errors, 0u);
  EXPECT_LE(s.cached_bytes, 4u * kChunk);
  for (uint64_t i = 0; i < 11; ++i) ReadChunk(c.get(), i);  // kept chunks read back right
  c.reset();
  EXPECT_EQ(umount2(small.c_str(), 0), 0);
}

TEST_F(ReadCacheTest, WhatAFirstNodeReadIsReadAheadByTheNext) {
  auto first = Open(1 << 20, root_ + "/cache1");
  ASSERT_NE(first, nullptr);
  for (uint64_t i : {2, 3, 10}) ReadChunk(first.get(), i);
  ASSERT_OK(first->RecordHot(kHex));
  const std::string hot = store_->dir() + "/meta/" + kHex + ".hot";
  EXPECT_EQ(ReadFile(hot), "8192 8192\n40960 123\n");
  ReadChunk(first.get(), 5);
  ASSERT_OK(first->RecordHot(kHex));
  EXPECT_EQ(ReadFile(hot), "8192 8192\n40960 123\n") << "written once: the first runs' list";

  auto next = Open(1 << 20, root_ + "/cache2");
  ASSERT_NE(next, nullptr);
  next->Prefetch(kHex);
  for (int i = 0; i < 500 && next->stats().prefetched_bytes < 2 * kChunk + 123; ++i) usleep(10'000);
  EXPECT_EQ(next->stats().prefetched_bytes, 2 * kChunk + 123);
  EXPECT_EQ(next->stats().misses, 0u);
  for (uint64_t i : {2, 3, 10}) ReadChunk(next.get(), i);
  EXPECT_EQ(next->stats().misses, 0u) << "the hot chunks were read ahead";
  EXPECT_EQ(next->stats().hits, 3u);
  ReadChunk(next.get(), 4);
  EXPECT_EQ(next->stats().misses, 1u);
}

size_t OpenFds() {
  size_t n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n;
}

// Bounded bookkeeping: a layer's state (fds, chunk map, local file) lives
// while it is open or holds chunks; only its store-read counter stays.
TEST_F(ReadCacheTest, ALayerClosedWithNoChunkLeftIsDropped) {
  const std::string hex2(64, 'b');
  WriteFile(store_->BlobPath("sha256:" + hex2), RandomBytes(size_t{4} * kChunk, 2));
  auto c = Open(uint64_t{2} * kChunk);
  ASSERT_NE(c, nullptr);
  const size_t fds0 = OpenFds();
  const std::string local = root_ + "/cache/" + kHex;

  c->OpenLayer(kHex);  // opened and closed, never read: nothing stays
  EXPECT_EQ(c->stats().layers_held, 1u);
  c->CloseLayer(kHex);
  EXPECT_EQ(c->stats().layers_held, 0u);
  EXPECT_EQ(OpenFds(), fds0);
  EXPECT_NE(access(local.c_str(), F_OK), 0);

  c->OpenLayer(kHex);
  c->OpenLayer(kHex);  // two readers (two mounts of one layer: counted)
  for (uint64_t i : {0, 1, 2}) ReadChunk(c.get(), i);
  c->CloseLayer(kHex);
  c->CloseLayer(kHex);
  EXPECT_EQ(c->stats().layers_held, 1u) << "closed, but it holds chunks another mount may read";
  EXPECT_EQ(access(local.c_str(), F_OK), 0);
  c->CloseLayer(kHex);  // a close without an open (a file opened under a previous daemon): ignored

  // Another layer's reads evict the closed layer's last chunks: it goes.
  std::string buf(kChunk, '\0');
  for (uint64_t i = 0; i < 2; ++i) ASSERT_OK(c->Read(hex2, i * kChunk, kChunk, buf.data()));
  const ReadCache::Stats s = c->stats();
  EXPECT_EQ(s.layers_held, 1u);
  EXPECT_EQ(s.layers.at(kHex).cached_bytes, 0u);
  EXPECT_EQ(s.layers.at(kHex).store_read_bytes, 3u * kChunk) << "the counter outlives the state";
  EXPECT_NE(access(local.c_str(), F_OK), 0) << "its local file went with it";
  EXPECT_EQ(OpenFds(), fds0 + 2) << "only the other layer's store and local fds";
  ReadChunk(c.get(), 1);  // read again: the state comes back
  EXPECT_EQ(c->stats().layers.at(kHex).store_read_bytes, 4u * kChunk);
}

// The cache as files under an EROFS mount: what a sandbox reads.
TEST_F(ReadCacheTest, ALayerMountedThroughTheCacheReadsRightUnderEvictionPressure) {
  const std::string src = root_ + "/src";
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  const std::string big = RandomBytes(size_t{300} * 1024, 7);
  WriteFile(src + "/big", big);
  WriteFile(src + "/small", "hello");
  auto layer = store_->BuildFromDir("base/rc@1", src);
  ASSERT_OK(layer);
  const std::string hex = layer->digest.substr(7);
  auto c = Open(uint64_t{2} * kChunk);  // far below the layer: every pass evicts
  ASSERT_NE(c, nullptr);
  auto fs = BlobFs::Mount(c.get(), root_ + "/files");
  ASSERT_OK(fs);
  {
    auto mc = MountCache::Open(store_.get(), root_ + "/mnt", 0, (*fs)->mountpoint());
    ASSERT_OK(mc);
    auto path = (*mc)->Acquire(layer->digest);
    ASSERT_OK(path);
    EXPECT_GT(c->stats().layers.at(hex).store_read_bytes, 0u) << "the superblock came through the cache";
    for (int pass = 0; pass < 3; ++pass) {
      EXPECT_EQ(ReadFile(*path + "/small"), "hello");
      EXPECT_EQ(ReadFile(*path + "/big"), big) << "pass " << pass;
      // Drop the EROFS page cache so the next pass reads through again.
      int fd = open((*path + "/big").c_str(), O_RDONLY | O_CLOEXEC);
      ASSERT_GE(fd, 0);
      posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      close(fd);
    }
    const ReadCache::Stats s = c->stats();
    EXPECT_GT(s.evictions, 0u);
    EXPECT_LE(s.cached_bytes, 2u * kChunk);
    EXPECT_GE(s.layers.at(hex).store_read_bytes, big.size());
    EXPECT_EQ((*fs)->node_count(), 1u);
    (*mc)->Release(layer->digest);
    std::vector<std::string> gone = (*mc)->Sweep(/*all=*/true);
    EXPECT_EQ(gone, std::vector<std::string>{hex});
    // Unmounted: the kernel forgets the file when asked, and the server its
    // node id; the file's RELEASE closed the layer in the cache, whose
    // chunks go at the next eviction.
    (*fs)->Forget(hex);
    for (int i = 0; i < 500 && (*fs)->node_count() > 0; ++i) usleep(10'000);
    EXPECT_EQ((*fs)->node_count(), 0u);
    const std::string other(64, 'c');
    WriteFile(store_->BlobPath("sha256:" + other), RandomBytes(size_t{3} * kChunk, 3));
    std::string buf(kChunk, '\0');
    for (int i = 0; i < 500 && c->stats().layers.contains(hex) && c->stats().layers.at(hex).cached_bytes > 0; ++i) {
      for (uint64_t j = 0; j < 3; ++j) ASSERT_OK(c->Read(other, j * kChunk, kChunk, buf.data()));
      usleep(10'000);
    }
    EXPECT_EQ(c->stats().layers_held, 1u) << "only the other layer: the unmounted one was dropped";
  }
  (*fs)->Shutdown();
  EXPECT_EQ(CountMountsUnder(root_), 0);
}

// Metadata local: while a layer is mounted, its image's metadata prefix
// stays on the node however hard its data is evicted; once unmounted it is
// evictable like any chunk. Without keep_metadata the same reads evict it.
TEST_F(ReadCacheTest, AMountedLayersMetadataStaysLocalUnderEvictionPressure) {
  const std::string src = root_ + "/src";
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  for (int d = 0; d < 4; ++d) {
    const std::string dir = src + "/dir" + std::to_string(d);
    ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
    for (int i = 0; i < 100; ++i) WriteFile(dir + "/file-" + std::to_string(i), RandomBytes(100 + i * 50, i));
  }
  const std::string big = RandomBytes(size_t{2} << 20, 7);
  WriteFile(src + "/big", big);
  store_->set_chunked_layers(true);  // metadata first (warrend --chunked-layers)
  auto layer = store_->BuildFromDir("base/meta@1", src);
  ASSERT_OK(layer);
  const std::string hex = layer->digest.substr(7);
  uint64_t metadata_end = 0;
  {
    const int fd = open(store_->BlobPath(layer->digest).c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    struct stat st {};
    ASSERT_EQ(fstat(fd, &st), 0);
    auto layout = ReadErofsLayout(testing::PreadFn(fd), static_cast<uint64_t>(st.st_size));
    close(fd);
    ASSERT_OK(layout);
    metadata_end = layout->metadata_end;
  }
  const uint64_t cap = 256 << 10;  // 2 MiB of data through it: every pass evicts
  ASSERT_LT(metadata_end * 2, cap) << "the test's metadata fits half the cap";
  for (const bool keep : {true, false}) {
    SCOPED_TRACE(keep ? "keep_metadata" : "without keep_metadata");
    auto c = Open(cap, root_ + (keep ? "/cache-keep" : "/cache-plain"), keep);
    ASSERT_NE(c, nullptr);
    auto fs = BlobFs::Mount(c.get(), root_ + (keep ? "/files-keep" : "/files-plain"));
    ASSERT_OK(fs);
    auto mc = MountCache::Open(store_.get(), root_ + (keep ? "/mnt-keep" : "/mnt-plain"), 0, (*fs)->mountpoint());
    ASSERT_OK(mc);
    auto path = (*mc)->Acquire(layer->digest);
    ASSERT_OK(path);
    if (keep) {
      for (int i = 0; i < 500 && c->stats().metadata_bytes < metadata_end; ++i) usleep(10'000);
      EXPECT_EQ(c->stats().metadata_bytes, metadata_end);
      EXPECT_EQ(c->stats().layers.at(hex).metadata_bytes, metadata_end);
    }
    for (int pass = 0; pass < 2; ++pass) {
      EXPECT_EQ(ReadFile(*path + "/big"), big);
      const int fd = open((*path + "/big").c_str(), O_RDONLY | O_CLOEXEC);
      ASSERT_GE(fd, 0);
      posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      close(fd);
    }
    EXPECT_GT(c->stats().evictions, 0u);
    EXPECT_LE(c->stats().cached_bytes, cap);
    // The metadata prefix read again: from the node when kept, from the
    // store otherwise.
    const uint64_t before = c->stats().store_read_bytes;
    std::string buf(metadata_end, '\0');
    ASSERT_OK(c->Read(hex, 0, buf.size(), buf.data()));
    if (keep) {
      EXPECT_EQ(c->stats().store_read_bytes, before) << "no metadata byte was evicted";
    } else {
      EXPECT_GT(c->stats().store_read_bytes, before) << "the data evicted the metadata";
    }
    (*mc)->Release(layer->digest);
    (*mc)->Sweep(/*all=*/true);
    (*fs)->Forget(hex);
    // Unmounted: kept no more.
    for (int i = 0; i < 500 && c->stats().metadata_bytes > 0; ++i) usleep(10'000);
    EXPECT_EQ(c->stats().metadata_bytes, 0u);
    (*fs)->Shutdown();
  }
  EXPECT_EQ(CountMountsUnder(root_), 0);
}

}  // namespace
}  // namespace warren::image
