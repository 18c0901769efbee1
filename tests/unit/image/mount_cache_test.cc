#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "gtest/gtest.h"
#include "image/erofs.h"
#include "image/fs_util.h"
#include "image/layer_store.h"
#include "status_matchers.h"
#include "test_util.h"

namespace warren::image {
namespace {

using ::warren::image::testing::CountMounts;
using ::warren::image::testing::CountMountsUnder;
using ::warren::image::testing::ListDir;
using ::warren::image::testing::MakeTempDir;
using ::warren::image::testing::ReadFile;
using ::warren::image::testing::WriteFile;

class MountCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = MakeTempDir();
    auto s = LayerStore::Open(root_ + "/store");
    ASSERT_OK(s);
    store_ = *std::move(s);
    mnt_ = root_ + "/mnt";
    std::string src = root_ + "/src";
    ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
    WriteFile(src + "/hello", "world");
    auto l = store_->BuildFromDir("base/m@1", src);
    ASSERT_OK(l);
    layer_ = *l;
    hex_ = layer_.digest.substr(7);
  }
  void TearDown() override {
    // Whatever a test left: unmount everything below root_ (plain umount: a
    // busy mount here is a bug the test should show).
    for (int i = 0; i < 64 && CountMountsUnder(root_) > 0; ++i) {
      for (const std::string& n : ListDir(mnt_)) umount2((mnt_ + "/" + n).c_str(), 0);
    }
    EXPECT_EQ(CountMountsUnder(root_), 0);
    EXPECT_OK(RemoveTree(root_));
  }
  std::unique_ptr<MountCache> OpenCache(int64_t grace_ms = 0) {
    auto c = MountCache::Open(store_.get(), mnt_, grace_ms);
    EXPECT_OK(c);
    return c.ok() ? *std::move(c) : nullptr;
  }

  std::string root_, mnt_, hex_;
  std::unique_ptr<LayerStore> store_;
  LayerInfo layer_;
};

TEST_F(MountCacheTest, FileBackedErofsProbe) {
  bool a = MountCache::FileBackedErofsSupported();
  EXPECT_EQ(a, MountCache::FileBackedErofsSupported());
  utsname u;
  ASSERT_EQ(uname(&u), 0);
  int major = 0, minor = 0;
  ASSERT_EQ(sscanf(u.release, "%d.%d", &major, &minor), 2);
  if (major * 100 + minor < 612) {
    GTEST_SKIP() << "kernel " << u.release << " predates file-backed EROFS (6.12)";
  }
  // Distribution kernels >= 6.12 enable CONFIG_EROFS_FS_BACKED_BY_FILE.
  EXPECT_TRUE(a) << "file-backed EROFS expected on kernel " << u.release;
  auto m = MountErofs(store_->BlobPath(layer_.digest), ErofsSource::kFile);
  ASSERT_OK(m);
  UniqueFd f(openat(m->get(), "hello", O_RDONLY | O_CLOEXEC));
  EXPECT_TRUE(f.valid());
}

TEST_F(MountCacheTest, AcquireMountsOnceAndSweepUnmounts) {
  auto cache = OpenCache(/*grace_ms=*/60'000);
  ASSERT_NE(cache, nullptr);
  auto p1 = cache->Acquire(layer_.digest);
  ASSERT_OK(p1);
  auto p2 = cache->Acquire(layer_.digest);
  ASSERT_OK(p2);
  EXPECT_EQ(*p1, *p2);
  EXPECT_EQ(*p1, mnt_ + "/" + hex_);
  EXPECT_EQ(CountMounts(*p1), 1);
  EXPECT_EQ(cache->RefCount(layer_.digest), 2u);
  EXPECT_TRUE(cache->IsMounted(layer_.digest));
  EXPECT_EQ(ReadFile(*p1 + "/hello"), "world");

  // In use: even Sweep(all) leaves it.
  cache->Sweep(true);
  EXPECT_EQ(CountMounts(*p1), 1);
  cache->Release(layer_.digest);
  cache->Release(layer_.digest);
  EXPECT_EQ(cache->RefCount(layer_.digest), 0u);
  // Within the grace period: kept.
  cache->Sweep(false);
  EXPECT_EQ(CountMounts(*p1), 1);
  EXPECT_TRUE(cache->IsMounted(layer_.digest));
  // Re-acquiring a mounted, unreferenced layer reuses the mount.
  ASSERT_OK(cache->Acquire(layer_.digest));
  EXPECT_EQ(CountMounts(*p1), 1);
  MountCache::Stats s = cache->stats();
  EXPECT_EQ(s.misses, 1u);  // the first Acquire mounted
  EXPECT_EQ(s.hits, 2u);    // the other two found it mounted
  EXPECT_EQ(s.failures, 0u);
  EXPECT_EQ(s.evictions, 0u);
  EXPECT_EQ(s.mounted, 1u);
  EXPECT_EQ(s.mounted_bytes, static_cast<uint64_t>(ReadFile(store_->BlobPath(layer_.digest)).size()));
  cache->Release(layer_.digest);
  cache->Sweep(true);
  EXPECT_EQ(CountMounts(*p1), 0);
  EXPECT_FALSE(cache->IsMounted(layer_.digest));
  EXPECT_EQ(cache->MountedCount(), 0u);
  s = cache->stats();
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_EQ(s.mounted, 0u);
  EXPECT_EQ(s.mounted_bytes, 0u);
  struct stat st;
  EXPECT_NE(lstat(p1->c_str(), &st), 0) << "mount point dir left behind";
}

TEST_F(MountCacheTest, GraceExpiryUnmounts) {
  auto cache = OpenCache(/*grace_ms=*/100);
  ASSERT_NE(cache, nullptr);
  auto p = cache->Acquire(layer_.digest);
  ASSERT_OK(p);
  cache->Release(layer_.digest);
  cache->Sweep();
  EXPECT_EQ(CountMounts(*p), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  cache->Sweep();
  EXPECT_EQ(CountMounts(*p), 0);
}

TEST_F(MountCacheTest, BusyMountIsNotUnmounted) {
  auto cache = OpenCache();
  ASSERT_NE(cache, nullptr);
  auto p = cache->Acquire(layer_.digest);
  ASSERT_OK(p);
  cache->Release(layer_.digest);
  {
    // Something outside the refcount (e.g. a sandbox not re-adopted yet)
    // still uses the mount: plain umount fails and the entry stays.
    UniqueFd f(open((*p + "/hello").c_str(), O_RDONLY));
    ASSERT_TRUE(f.valid());
    cache->Sweep(true);
    EXPECT_EQ(CountMounts(*p), 1);
    EXPECT_TRUE(cache->IsMounted(layer_.digest));
  }
  cache->Sweep(true);
  EXPECT_EQ(CountMounts(*p), 0);
}

TEST_F(MountCacheTest, ConcurrentAcquireMountsOnce) {
  auto cache = OpenCache();
  ASSERT_NE(cache, nullptr);
  constexpr int kThreads = 8;
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  std::atomic<int> ok{0};
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      if (cache->Acquire(layer_.digest).ok()) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kThreads);
  EXPECT_EQ(CountMounts(mnt_ + "/" + hex_), 1);
  EXPECT_EQ(cache->RefCount(layer_.digest), static_cast<uint32_t>(kThreads));
  for (int i = 0; i < kThreads; ++i) cache->Release(layer_.digest);
  cache->Sweep(true);
  EXPECT_EQ(CountMountsUnder(mnt_), 0);
}

TEST_F(MountCacheTest, ReopenAdoptsMountsAndRemovesStaleDirs) {
  std::string path;
  {
    auto cache = OpenCache();
    ASSERT_NE(cache, nullptr);
    auto p = cache->Acquire(layer_.digest);
    ASSERT_OK(p);
    path = *p;
    // The cache goes away (daemon restart) with the layer still mounted.
  }
  EXPECT_EQ(CountMounts(path), 1);
  std::string stale = mnt_ + "/" + std::string(64, 'e');
  ASSERT_EQ(mkdir(stale.c_str(), 0755), 0);
  auto cache = OpenCache();
  ASSERT_NE(cache, nullptr);
  EXPECT_TRUE(cache->IsMounted(layer_.digest));
  EXPECT_EQ(cache->RefCount(layer_.digest), 0u);
  EXPECT_EQ(cache->MountedCount(), 1u);
  struct stat st;
  EXPECT_NE(lstat(stale.c_str(), &st), 0) << "stale mount dir kept";
  // A re-adopted sandbox acquires it again: no second mount.
  auto p = cache->Acquire(layer_.digest);
  ASSERT_OK(p);
  EXPECT_EQ(*p, path);
  EXPECT_EQ(CountMounts(path), 1);
  cache->Release(layer_.digest);
  cache->Sweep(true);
  EXPECT_EQ(CountMounts(path), 0);
}

TEST_F(MountCacheTest, CorruptBlobFailsCleanly) {
  auto cache = OpenCache();
  ASSERT_NE(cache, nullptr);
  std::string good = ReadFile(store_->BlobPath(layer_.digest));
  ASSERT_GT(good.size(), 2048u);
  struct Case {
    std::string label, bytes;
  } cases[] = {
      {"garbage", std::string(8192, '\x42')},
      {"truncated", good.substr(0, 1000)},
      {"empty", ""},
      {"bad superblock", good.substr(0, 1024) + std::string(64, '\xff') + good.substr(1088)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    std::string digest = "sha256:" + std::string(63, 'c') + std::to_string(&c - cases);
    WriteFile(store_->BlobPath(digest), c.bytes);
    auto p = cache->Acquire(digest);
    EXPECT_THAT(p, ::testing::Not(IsOk()));
    EXPECT_FALSE(cache->IsMounted(digest));
    EXPECT_EQ(cache->RefCount(digest), 0u);
    EXPECT_EQ(CountMountsUnder(mnt_), 0);
    EXPECT_TRUE(ListDir(mnt_).empty());
  }
  EXPECT_EQ(cache->stats().failures, std::size(cases));  // a refused digest is not a lookup
  EXPECT_EQ(cache->stats().misses, 0u);
  EXPECT_THAT(cache->Acquire("sha256:" + std::string(64, 'd')), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(cache->Acquire("sha256:nothex"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(cache->Acquire(hex_), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(ListDir(mnt_).empty());
}

// The loop-device fallback path (used on kernels without file-backed EROFS)
// works and frees its device when the mount goes away.
TEST_F(MountCacheTest, LoopFallbackMountsAndFreesTheDevice) {
  std::string blob = store_->BlobPath(layer_.digest);
  auto loops_on_blob = [&] {
    int n = 0;
    for (const std::string& dev : ListDir("/sys/block")) {
      if (dev.rfind("loop", 0) != 0) continue;
      std::string backing = ReadFile("/sys/block/" + dev + "/loop/backing_file");
      if (backing.find(hex_) != std::string::npos) ++n;
    }
    return n;
  };
  {
    auto m = MountErofs(blob, ErofsSource::kLoop);
    ASSERT_OK(m);
    EXPECT_EQ(loops_on_blob(), 1);
    UniqueFd f(openat(m->get(), "hello", O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(f.valid());
    char buf[16];
    EXPECT_EQ(read(f.get(), buf, sizeof(buf)), 5);
  }
  // Autoclear runs when the last user (the mount) is gone; that is
  // asynchronous after close, so poll briefly.
  for (int i = 0; i < 100 && loops_on_blob() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(loops_on_blob(), 0);
  // A corrupt image through a loop device fails and frees the device too.
  std::string bad = root_ + "/bad-" + hex_;
  WriteFile(bad, std::string(8192, '\x42'));
  EXPECT_THAT(MountErofs(bad, ErofsSource::kLoop), ::testing::Not(IsOk()));
  for (int i = 0; i < 100 && loops_on_blob() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(loops_on_blob(), 0);
}

// Two nodes sharing one store: a reference on one (a sandbox using the
// layer, or a create that is about to mount it) holds the blob against a
// remove on the other; released, the remove goes through, and a later
// Acquire, even with the mount still cached, finds the layer gone.
TEST_F(MountCacheTest, AReferenceHoldsTheBlobAgainstARemoveOnAnotherNode) {
  auto cache = OpenCache(60000);  // the mount stays cached after Release
  ASSERT_NE(cache, nullptr);
  auto other = LayerStore::Open(root_ + "/store");
  ASSERT_OK(other);
  ASSERT_OK(cache->Acquire(layer_.digest));
  ASSERT_OK(cache->Acquire(layer_.digest));
  Status refused = (*other)->Remove("base/m@1");
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(refused.message().find("is held"), std::string::npos) << refused;
  EXPECT_OK((*other)->Resolve("base/m@1"));  // nothing removed
  cache->Release(layer_.digest);
  EXPECT_THAT((*other)->Remove(layer_.digest), StatusIs(absl::StatusCode::kFailedPrecondition));  // one still holds
  cache->Release(layer_.digest);
  ASSERT_OK((*other)->Remove("base/m@1"));
  EXPECT_TRUE(cache->IsMounted(layer_.digest));
  EXPECT_THAT(cache->Acquire(layer_.digest), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(cache->RefCount(layer_.digest), 0u);
  cache->Sweep(true);
  EXPECT_FALSE(cache->IsMounted(layer_.digest));
}

// A remove holding the blob's write lock (between its lock and its unlink):
// an Acquire then answers Unavailable (retryable) and mounts nothing.
TEST_F(MountCacheTest, AcquireRefusedWhileARemoveHoldsTheBlob) {
  auto cache = OpenCache();
  ASSERT_NE(cache, nullptr);
  UniqueFd w(open(store_->BlobPath(layer_.digest).c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(w.valid());
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  ASSERT_EQ(fcntl(w.get(), F_OFD_SETLK, &fl), 0) << strerror(errno);
  EXPECT_THAT(cache->Acquire(layer_.digest), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_FALSE(cache->IsMounted(layer_.digest));
  EXPECT_EQ(CountMountsUnder(root_), 0);
  w.reset();
  ASSERT_OK(cache->Acquire(layer_.digest));
  cache->Release(layer_.digest);
  cache->Sweep(true);
}

// A held blob leaves the bytes QEMU's image locking tests free (it
// test-locks 100.. and 200.. of every drive it opens, layers included): a
// whole-file hold made every microVM cold boot fail ('Failed to get
// "consistent read" lock'). The hold still refuses a remove (above).
TEST_F(MountCacheTest, AHeldBlobLeavesQemusLockBytesFree) {
  auto cache = OpenCache();
  ASSERT_NE(cache, nullptr);
  ASSERT_OK(cache->Acquire(layer_.digest));
  UniqueFd q(open(store_->BlobPath(layer_.digest).c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(q.valid());
  for (off_t base : {off_t{100}, off_t{200}}) {
    struct flock fl {};
    fl.l_type = F_WRLCK;  // what QEMU's raw_check_lock_bytes asks
    fl.l_whence = SEEK_SET;
    fl.l_start = base;
    fl.l_len = 8;
    ASSERT_EQ(fcntl(q.get(), F_OFD_GETLK, &fl), 0) << strerror(errno);
    EXPECT_EQ(fl.l_type, F_UNLCK) << "bytes " << base << "..: held";
  }
  struct flock whole {};
  whole.l_type = F_WRLCK;
  whole.l_whence = SEEK_SET;
  ASSERT_EQ(fcntl(q.get(), F_OFD_GETLK, &whole), 0) << strerror(errno);
  EXPECT_EQ(whole.l_type, F_RDLCK);  // the hold itself is there
  cache->Release(layer_.digest);
  cache->Sweep(true);
}

}  // namespace
}  // namespace warren::image
