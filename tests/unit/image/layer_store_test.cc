#include "image/layer_store.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "gtest/gtest.h"
#include "image/erofs.h"
#include "image/fs_util.h"
#include "image/tree_compare.h"
#include "status_matchers.h"
#include "test_util.h"

namespace warren::image {
namespace {

using ::warren::image::testing::CountMountsUnder;
using ::warren::image::testing::GetXattr;
using ::warren::image::testing::ListDir;
using ::warren::image::testing::MakeTempDir;
using ::warren::image::testing::ReadFile;
using ::warren::image::testing::TarEntry;
using ::warren::image::testing::WriteFile;
using ::warren::image::testing::WriteTar;

// ------------------------------------------------------------- LayerName

TEST(LayerNameTest, ParsesGoodNames) {
  auto n = LayerName::Parse("base/debian-12");
  ASSERT_OK(n);
  EXPECT_EQ(n->kind, LayerKind::kBase);
  EXPECT_EQ(n->name, "debian-12");
  EXPECT_EQ(n->version, "");
  EXPECT_EQ(n->ToString(), "base/debian-12");

  n = LayerName::Parse("workspace/demo@1");
  ASSERT_OK(n);
  EXPECT_EQ(n->kind, LayerKind::kWorkspace);
  EXPECT_EQ(n->version, "1");
  EXPECT_EQ(n->ToString(), "workspace/demo@1");

  n = LayerName::Parse("toolset/a.b_c-9@V1.0+build_2-rc");
  ASSERT_OK(n);
  EXPECT_EQ(n->kind, LayerKind::kToolset);
  EXPECT_EQ(n->name, "a.b_c-9");
  EXPECT_EQ(n->version, "V1.0+build_2-rc");

  std::string long_name = "a" + std::string(127, 'z');
  std::string long_ver = "V" + std::string(63, '9');
  n = LayerName::Parse("base/" + long_name + "@" + long_ver);
  ASSERT_OK(n);
  EXPECT_EQ(n->ToString(), "base/" + long_name + "@" + long_ver);
}

TEST(LayerNameTest, RejectsBadNamesNamingThePart) {
  struct Case {
    std::string in;
    std::string part;
  } cases[] = {
      {"", "kind/name"},
      {"base", "kind/name"},
      {"image/x", "kind \"image\""},
      {"Base/x", "kind \"Base\""},
      {"base/", "name \"\""},
      {"base/Upper", "name \"Upper\""},
      {"base/-lead", "name \"-lead\""},
      {"base/.hidden", "name \".hidden\""},
      {"base/a/b", "name \"a/b\""},
      {"base/a b", "name \"a b\""},
      {"base/" + std::string(129, 'a'), "name \"aaaa"},
      {"base/a@", "version \"\""},
      {"base/a@-1", "version \"-1\""},
      {"base/a@1/2", "version \"1/2\""},
      {"base/a@1@2", "version \"1@2\""},
      {"base/a@1 2", "version \"1 2\""},
      {"base/a@" + std::string(65, '1'), "version \"1111"},
      {"base/\xff", "name \"\\xff\""},
  };
  for (const Case& c : cases) {
    auto n = LayerName::Parse(c.in);
    ASSERT_THAT(n, ::testing::Not(IsOk())) << c.in;
    EXPECT_THAT(n, StatusIs(absl::StatusCode::kInvalidArgument)) << c.in;
    EXPECT_NE(n.status().message().find(c.part), absl::string_view::npos) << c.in << " -> " << n.status();
  }
}

// ------------------------------------------------------------ fixtures

class LayerStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = MakeTempDir();
    auto s = LayerStore::Open(root_ + "/store");
    ASSERT_OK(s);
    store_ = *std::move(s);
    auto c = MountCache::Open(store_.get(), root_ + "/mnt", 0);
    ASSERT_OK(c);
    cache_ = *std::move(c);
  }
  void TearDown() override {
    if (cache_) {
      for (const LayerInfo& l : acquired_) cache_->Release(l.digest);
      cache_->Sweep(true);
      EXPECT_EQ(cache_->MountedCount(), 0u);
    }
    EXPECT_EQ(CountMountsUnder(root_), 0);
    EXPECT_OK(RemoveTree(root_));
  }
  // Mounts a built layer for inspection (released in TearDown).
  std::string Mount(const LayerInfo& l) {
    auto p = cache_->Acquire(l.digest);
    EXPECT_OK(p);
    if (!p.ok()) return "/nonexistent";
    acquired_.push_back(l);
    return *p;
  }
  std::string Src(const std::string& name) {
    std::string d = root_ + "/" + name;
    EXPECT_EQ(mkdir(d.c_str(), 0755), 0);
    return d;
  }
  void ExpectTmpEmpty() { EXPECT_TRUE(ListDir(store_->dir() + "/tmp").empty()); }

  std::string root_;
  std::unique_ptr<LayerStore> store_;
  std::unique_ptr<MountCache> cache_;
  std::vector<LayerInfo> acquired_;
};

// A tree with every kind of thing a layer must carry.
void MakeRichTree(const std::string& d) {
  WriteFile(d + "/empty", "");
  WriteFile(d + "/small", "hello\n", 0640);
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 7919) >> 3);
  WriteFile(d + "/big", big, 0755);
  ASSERT_EQ(mkdir((d + "/private").c_str(), 0700), 0);
  ASSERT_EQ(chmod((d + "/private").c_str(), 0700), 0);
  ASSERT_EQ(mkdir((d + "/tmp").c_str(), 0777), 0);
  ASSERT_EQ(chmod((d + "/tmp").c_str(), 01777), 0);
  ASSERT_EQ(mkdir((d + "/shared").c_str(), 0755), 0);
  ASSERT_EQ(chmod((d + "/shared").c_str(), 02775), 0);
  WriteFile(d + "/private/owned", "mine");
  ASSERT_EQ(chown((d + "/private/owned").c_str(), 1234, 5678), 0);
  WriteFile(d + "/suid", "#!/bin/sh\n", 0755);
  ASSERT_EQ(chmod((d + "/suid").c_str(), 04755), 0);
  ASSERT_EQ(symlink("/etc/passwd", (d + "/abs-link").c_str()), 0);
  ASSERT_EQ(symlink("../no/such/target", (d + "/dangling").c_str()), 0);
  ASSERT_EQ(link((d + "/small").c_str(), (d + "/shared/hard1").c_str()), 0);
  ASSERT_EQ(link((d + "/small").c_str(), (d + "/tmp/hard2").c_str()), 0);
  ASSERT_EQ(setxattr((d + "/small").c_str(), "user.color", "blue", 4, 0), 0);
  ASSERT_EQ(setxattr((d + "/private").c_str(), "trusted.overlay.opaque", "y", 1, 0), 0);
  ASSERT_EQ(setxattr((d + "/big").c_str(), "trusted.warren.big", "\x01\x00\x02", 3, 0), 0);
  WriteFile(d + "/name with spaces", "s");
  WriteFile(d + "/bad-utf8-\xff\xfe", "u");
  ASSERT_EQ(mknod((d + "/fifo").c_str(), S_IFIFO | 0600, 0), 0);
}

TEST_F(LayerStoreTest, BuildFromDirKeepsEverything) {
  std::string src = Src("src");
  ASSERT_NO_FATAL_FAILURE(MakeRichTree(src));
  auto info = store_->BuildFromDir("workspace/rich@1", src);
  ASSERT_OK(info);
  EXPECT_EQ(info->name, "workspace/rich@1");
  ASSERT_EQ(info->digest.size(), 7u + 64u);
  struct stat st;
  ASSERT_EQ(stat(store_->BlobPath(info->digest).c_str(), &st), 0);
  EXPECT_EQ(info->size_bytes, static_cast<uint64_t>(st.st_size));
  EXPECT_GT(info->created_at_ns, 0);
  ExpectTmpEmpty();

  std::string m = Mount(*info);
  // Read-only, nosuid, nodev mount.
  EXPECT_EQ(open((m + "/newfile").c_str(), O_WRONLY | O_CREAT, 0644), -1);
  EXPECT_EQ(errno, EROFS);

  ASSERT_EQ(lstat((m + "/empty").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_size, 0);
  EXPECT_EQ(ReadFile(m + "/big"), ReadFile(src + "/big"));
  EXPECT_EQ(ReadFile(m + "/big").size(), 3u << 20);
  ASSERT_EQ(lstat((m + "/small").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  ASSERT_EQ(lstat((m + "/private").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  ASSERT_EQ(lstat((m + "/tmp").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 01777u);
  ASSERT_EQ(lstat((m + "/shared").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 02775u);
  ASSERT_EQ(lstat((m + "/suid").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 04755u);
  ASSERT_EQ(lstat((m + "/private/owned").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 1234u);
  EXPECT_EQ(st.st_gid, 5678u);
  char buf[256];
  ssize_t n = readlink((m + "/abs-link").c_str(), buf, sizeof(buf));
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), "/etc/passwd");
  n = readlink((m + "/dangling").c_str(), buf, sizeof(buf));
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), "../no/such/target");
  struct stat a, b, c;
  ASSERT_EQ(lstat((m + "/small").c_str(), &a), 0);
  ASSERT_EQ(lstat((m + "/shared/hard1").c_str(), &b), 0);
  ASSERT_EQ(lstat((m + "/tmp/hard2").c_str(), &c), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  EXPECT_EQ(a.st_ino, c.st_ino);
  EXPECT_EQ(a.st_nlink, 3u);
  EXPECT_EQ(GetXattr(m + "/small", "user.color"), "blue");
  EXPECT_EQ(GetXattr(m + "/shared/hard1", "user.color"), "blue");
  EXPECT_EQ(GetXattr(m + "/private", "trusted.overlay.opaque"), "y");
  EXPECT_EQ(GetXattr(m + "/big", "trusted.warren.big"), std::string("\x01\x00\x02", 3));
  EXPECT_EQ(ReadFile(m + "/name with spaces"), "s");
  EXPECT_EQ(ReadFile(m + "/bad-utf8-\xff\xfe"), "u");
  ASSERT_EQ(lstat((m + "/fifo").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  // mtimes are kept too.
  struct stat s_src;
  ASSERT_EQ(lstat((src + "/big").c_str(), &s_src), 0);
  ASSERT_EQ(lstat((m + "/big").c_str(), &st), 0);
  EXPECT_EQ(st.st_mtim.tv_sec, s_src.st_mtim.tv_sec);
}

// mkfs.erofs 1.5 keeps a chunk-based build's data in a tmpfile under /tmp
// and copies it into the image with copy_file_range, failing with EIO when
// the image is on another file system (EXDEV): a store on a tmpfs (or on
// GlusterFS) must still build chunk-based layers.
TEST(LayerStoreOtherFsTest, ChunkBasedLayerBuildsOnAnotherFileSystemThanTmp) {
  const std::string root = MakeTempDir();
  const std::string fs = root + "/fs";
  ASSERT_EQ(mkdir(fs.c_str(), 0755), 0);
  ASSERT_EQ(mount("tmpfs", fs.c_str(), "tmpfs", 0, "size=64m"), 0);
  {
    auto store = LayerStore::Open(fs + "/store");
    ASSERT_OK(store);
    const std::string src = root + "/src";
    ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
    WriteFile(src + "/f", std::string(100000, 'x'));
    auto l = (*store)->BuildFromSandboxDir("workspace/tmpfs@1", src);
    ASSERT_OK(l);
    EXPECT_TRUE(l->from_sandbox);
  }
  EXPECT_EQ(umount2(fs.c_str(), 0), 0);
  EXPECT_OK(RemoveTree(root));
}

TEST_F(LayerStoreTest, SameTreeGivesSameDigest) {
  std::string src = Src("src");
  ASSERT_NO_FATAL_FAILURE(MakeRichTree(src));
  auto a = store_->BuildFromDir("base/same@1", src);
  ASSERT_OK(a);
  // A later wall-clock second must not change the image.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  auto b = store_->BuildFromDir("base/same@2", src);
  ASSERT_OK(b);
  EXPECT_EQ(a->digest, b->digest);
  EXPECT_EQ(ListDir(store_->dir() + "/blobs/sha256").size(), 1u);
  // Same name, same content: idempotent.
  auto c = store_->BuildFromDir("base/same@1", src);
  ASSERT_OK(c);
  EXPECT_EQ(c->digest, a->digest);
  // A change gives another digest.
  WriteFile(src + "/small", "changed\n", 0640);
  auto d = store_->BuildFromDir("base/same@3", src);
  ASSERT_OK(d);
  EXPECT_NE(d->digest, a->digest);
  ExpectTmpEmpty();
}

TEST_F(LayerStoreTest, SandboxBuildsAreMarkedAndKeepHoles) {
  std::string src = Src("src");
  WriteFile(src + "/small", "hi\n");
  {
    int fd = open((src + "/sparse").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, off_t{256} << 20), 0);
    ASSERT_EQ(pwrite(fd, "data", 4, off_t{128} << 20), 4);
    close(fd);
  }
  auto client = store_->BuildFromDir("workspace/client@1", src);
  ASSERT_OK(client);
  EXPECT_FALSE(client->from_sandbox);
  EXPECT_GT(client->size_bytes, uint64_t{256} << 20);  // the plain format is dense
  auto snap = store_->BuildFromSandboxDir("workspace/snap@1", src);
  ASSERT_OK(snap);
  EXPECT_TRUE(snap->from_sandbox);
  EXPECT_NE(snap->digest, client->digest) << "the same tree from a sandbox is another blob (the mark is per blob)";
  EXPECT_LT(snap->size_bytes, uint64_t{1} << 20);  // chunk index + data
  EXPECT_TRUE(store_->Resolve("workspace/snap@1")->from_sandbox);
  EXPECT_TRUE(store_->Resolve(snap->digest)->from_sandbox);
  EXPECT_FALSE(store_->Resolve("workspace/client@1")->from_sandbox);
  const std::string m = Mount(*snap);
  struct stat st;
  ASSERT_EQ(stat((m + "/sparse").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, off_t{256} << 20);
  // the store's blobs are private to root
  ASSERT_EQ(stat((store_->dir() + "/blobs").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 077, 0u);
  // the mark goes with the blob
  std::string other = Src("other");
  WriteFile(other + "/f", "x");
  auto o = store_->BuildFromSandboxDir("workspace/other@1", other);
  ASSERT_OK(o);
  const std::string mark = store_->dir() + "/meta/" + o->digest.substr(7) + ".sandbox";
  EXPECT_EQ(access(mark.c_str(), F_OK), 0);
  ASSERT_OK(store_->Remove("workspace/other@1"));
  EXPECT_NE(access(mark.c_str(), F_OK), 0);
}

// A snapshot of a project's sandbox is that project's (every name of the
// bytes); the same bytes of another project add it as an owner; bytes that
// were every project's stay so; the owners go with the blob.
TEST_F(LayerStoreTest, SandboxLayersRecordTheirProjects) {
  std::string src = Src("owned");
  WriteFile(src + "/f", "team a's\n");
  auto a = store_->BuildFromSandboxDir("workspace/snap-a@1", src, "team/a");
  ASSERT_OK(a);
  EXPECT_EQ(a->projects, std::vector<std::string>{"team/a"});
  EXPECT_EQ(store_->Resolve(a->digest)->projects, std::vector<std::string>{"team/a"});
  auto again = store_->BuildFromSandboxDir("workspace/snap-a2@1", src, "team/a");
  ASSERT_OK(again);
  EXPECT_EQ(again->projects, std::vector<std::string>{"team/a"});  // once
  auto b = store_->BuildFromSandboxDir("workspace/snap-b@1", src, "other");
  ASSERT_OK(b);
  EXPECT_EQ(b->digest, a->digest);
  EXPECT_EQ(store_->Resolve("workspace/snap-a@1")->projects, (std::vector<std::string>{"team/a", "other"}));
  for (const LayerInfo& l : store_->List()) {
    if (l.digest == a->digest) {
      EXPECT_EQ(l.projects.size(), 2u) << l.name;
    }
  }
  std::string pub = Src("public");
  WriteFile(pub + "/f", "everyone's\n");
  auto p = store_->BuildFromSandboxDir("workspace/snap-p@1", pub);
  ASSERT_OK(p);
  EXPECT_TRUE(p->projects.empty());
  auto p2 = store_->BuildFromSandboxDir("workspace/snap-p2@1", pub, "team/a");
  ASSERT_OK(p2);
  EXPECT_TRUE(p2->projects.empty()) << "bytes every project had became one project's";
  const std::string owners = store_->dir() + "/meta/" + a->digest.substr(7) + ".projects";
  EXPECT_EQ(access(owners.c_str(), F_OK), 0);
  for (const char* n : {"workspace/snap-a@1", "workspace/snap-a2@1", "workspace/snap-b@1"})
    ASSERT_OK(store_->Remove(n));
  EXPECT_NE(access(owners.c_str(), F_OK), 0);
}

TEST_F(LayerStoreTest, NameConflictIsAlreadyExists) {
  std::string s1 = Src("s1"), s2 = Src("s2");
  WriteFile(s1 + "/f", "one");
  WriteFile(s2 + "/f", "two");
  auto a = store_->BuildFromDir("toolset/t@1", s1);
  ASSERT_OK(a);
  auto b = store_->BuildFromDir("toolset/t@1", s2);
  ASSERT_THAT(b, ::testing::Not(IsOk()));
  EXPECT_THAT(b, StatusIs(absl::StatusCode::kAlreadyExists));
  // The losing build leaves no blob and no temp file behind.
  EXPECT_EQ(ListDir(store_->dir() + "/blobs/sha256").size(), 1u);
  ExpectTmpEmpty();
  auto r = store_->Resolve("toolset/t@1");
  ASSERT_OK(r);
  EXPECT_EQ(r->digest, a->digest);
  // Building needs a version; bad names are refused before any work.
  EXPECT_THAT(store_->BuildFromDir("toolset/t", s1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(store_->BuildFromDir("tools/t@1", s1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(store_->BuildFromDir("toolset/t@2", root_ + "/missing"), ::testing::Not(IsOk()));
  ExpectTmpEmpty();
}

TEST_F(LayerStoreTest, ResolveListRemove) {
  std::string s1 = Src("s1"), s2 = Src("s2"), s3 = Src("s3");
  WriteFile(s1 + "/f", "one");
  WriteFile(s2 + "/f", "two");
  WriteFile(s3 + "/f", "three");
  auto v9 = store_->BuildFromDir("workspace/w@9", s1);
  ASSERT_OK(v9);
  auto v10 = store_->BuildFromDir("workspace/w@10", s2);
  ASSERT_OK(v10);
  auto alias = store_->BuildFromDir("workspace/alias@1", s2);  // same blob as w@10
  ASSERT_OK(alias);
  auto other = store_->BuildFromDir("base/b@1", s3);
  ASSERT_OK(other);

  auto newest = store_->Resolve("workspace/w");
  ASSERT_OK(newest);
  EXPECT_EQ(newest->name, "workspace/w@10");
  EXPECT_EQ(newest->digest, v10->digest);
  auto by_digest = store_->Resolve(v9->digest);
  ASSERT_OK(by_digest);
  EXPECT_EQ(by_digest->size_bytes, v9->size_bytes);
  EXPECT_THAT(store_->Resolve("workspace/nope"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->Resolve("workspace/w@11"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->Resolve("sha256:" + std::string(64, 'a')), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->Resolve("sha256:xyz"), StatusIs(absl::StatusCode::kInvalidArgument));

  auto list = store_->List();
  ASSERT_EQ(list.size(), 4u);
  EXPECT_EQ(list[0].name, "base/b@1");
  EXPECT_EQ(list[1].name, "workspace/alias@1");

  EXPECT_THAT(store_->Remove("workspace/w"), StatusIs(absl::StatusCode::kInvalidArgument));
  // w@10's blob is still named by alias@1: only the name goes.
  ASSERT_OK(store_->Remove("workspace/w@10"));
  EXPECT_OK(store_->Resolve(v10->digest));
  newest = store_->Resolve("workspace/w");
  ASSERT_OK(newest);
  EXPECT_EQ(newest->name, "workspace/w@9");
  ASSERT_OK(store_->Remove("workspace/alias@1"));
  EXPECT_THAT(store_->Resolve(v10->digest), StatusIs(absl::StatusCode::kNotFound));
  // By digest: every name and the blob.
  ASSERT_OK(store_->Remove(v9->digest));
  EXPECT_THAT(store_->Resolve("workspace/w"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->Remove("workspace/w@9"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(store_->List().size(), 1u);
  EXPECT_EQ(ListDir(store_->dir() + "/blobs/sha256").size(), 1u);
  EXPECT_EQ(ListDir(store_->dir() + "/meta").size(), 1u);
}

TEST_F(LayerStoreTest, ConcurrentBuildsOfOneNameAgree) {
  std::string s1 = Src("s1"), s2 = Src("s2");
  WriteFile(s1 + "/f", "one");
  WriteFile(s2 + "/f", "two");
  // Same name, different trees, at the same time: exactly one wins.
  StatusOr<LayerInfo> r1, r2;
  std::thread t1([&] { r1 = store_->BuildFromDir("workspace/race@1", s1); });
  std::thread t2([&] { r2 = store_->BuildFromDir("workspace/race@1", s2); });
  t1.join();
  t2.join();
  EXPECT_NE(r1.ok(), r2.ok()) << r1.status() << " / " << r2.status();
  const Status& loser = r1.ok() ? r2.status() : r1.status();
  EXPECT_THAT(loser, StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_EQ(ListDir(store_->dir() + "/blobs/sha256").size(), 1u);
  // Same name, same tree: both succeed with one digest.
  std::thread t3([&] { r1 = store_->BuildFromDir("workspace/same@1", s1); });
  std::thread t4([&] { r2 = store_->BuildFromDir("workspace/same@1", s1); });
  t3.join();
  t4.join();
  ASSERT_OK(r1);
  ASSERT_OK(r2);
  EXPECT_EQ(r1->digest, r2->digest);
  ExpectTmpEmpty();
}

TEST_F(LayerStoreTest, MkfsFailureCarriesItsStderr) {
  std::string src = Src("src");
  WriteFile(src + "/f", "x");
  Status s = MkfsErofs(root_ + "/no/such/dir/image", src);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInternal));
  EXPECT_NE(s.message().find("mkfs.erofs"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("exit status"), absl::string_view::npos) << s;
  // mkfs.erofs's own complaint, without its usage text.
  EXPECT_NE(s.message().find("<E>"), absl::string_view::npos) << s;
  EXPECT_EQ(s.message().find("usage:"), absl::string_view::npos) << s;
}

TEST_F(LayerStoreTest, OpenRemovesLeftoversOfDeadLocalBuilds) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  char host[65] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string tmp = store_->dir() + "/tmp/";
  const std::string dead = tmp + "stage-" + host + "-" + std::to_string(child) + "-0-0000abcd";
  const std::string dead_image = tmp + "build-" + host + "-" + std::to_string(child) + "-1-0000abcd.erofs";
  const std::string alive = tmp + "stage-" + host + "-1-2-0000abcd";  // pid 1 lives
  const std::string foreign = tmp + "stage-otherhost-" + std::to_string(child) + "-3-0000abcd";
  for (const std::string& d : {dead, alive, foreign}) {
    ASSERT_EQ(mkdir(d.c_str(), 0755), 0);
    WriteFile(d + "/f", "x");
  }
  WriteFile(dead_image, "img");
  auto reopened = LayerStore::Open(store_->dir());
  ASSERT_OK(reopened);
  struct stat st;
  EXPECT_NE(lstat(dead.c_str(), &st), 0);
  EXPECT_NE(lstat(dead_image.c_str(), &st), 0);
  EXPECT_EQ(lstat(alive.c_str(), &st), 0);
  EXPECT_EQ(lstat(foreign.c_str(), &st), 0);
  ASSERT_EQ(lstat(tmp.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_OK(RemoveTree(alive));
  EXPECT_OK(RemoveTree(foreign));
}

// ------------------------------------------------------------- verify

TEST_F(LayerStoreTest, CompareTreesFindsTheFirstDifference) {
  std::string a = Src("a"), b = Src("b");
  auto reset = [&] {
    ASSERT_OK(RemoveTree(a));
    ASSERT_OK(RemoveTree(b));
    ASSERT_EQ(mkdir(a.c_str(), 0755), 0);
    ASSERT_EQ(mkdir(b.c_str(), 0755), 0);
    for (const std::string& d : {a, b}) {
      WriteFile(d + "/f", "same");
      WriteFile(d + "/g", "same");
      ASSERT_EQ(mkdir((d + "/sub").c_str(), 0755), 0);
    }
  };
  auto compare = [&]() -> Status {
    UniqueFd fa(open(a.c_str(), O_RDONLY | O_DIRECTORY));
    UniqueFd fb(open(b.c_str(), O_RDONLY | O_DIRECTORY));
    return CompareTrees(fa.get(), fb.get());
  };
  auto expect_diff = [&](const std::string& path) {
    Status s = compare();
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInternal));
    EXPECT_NE(s.message().find(path), absl::string_view::npos) << s;
  };
  reset();
  EXPECT_OK(compare());

  WriteFile(b + "/f", "diff");
  expect_diff("f: contents differ");
  reset();
  WriteFile(b + "/sub/extra", "");
  expect_diff("sub/extra: not in the source");
  reset();
  WriteFile(a + "/sub/gone", "");
  expect_diff("sub/gone: missing");
  reset();
  ASSERT_EQ(chmod((b + "/g").c_str(), 0600), 0);
  expect_diff("g: mode");
  reset();
  ASSERT_EQ(chown((b + "/sub").c_str(), 1, 1), 0);
  expect_diff("sub: owner");
  reset();
  ASSERT_EQ(setxattr((a + "/f").c_str(), "user.k", "v", 1, 0), 0);
  expect_diff("f: xattr user.k missing");
  reset();
  ASSERT_EQ(setxattr((b + "/sub").c_str(), "trusted.k", "v", 1, 0), 0);
  expect_diff("sub: extra xattr trusted.k");
  reset();
  ASSERT_EQ(unlink((a + "/g").c_str()), 0);
  ASSERT_EQ(link((a + "/f").c_str(), (a + "/g").c_str()), 0);
  expect_diff("g: hardlinked");
  reset();
  ASSERT_EQ(symlink("x", (a + "/sub/l").c_str()), 0);
  ASSERT_EQ(symlink("y", (b + "/sub/l").c_str()), 0);
  expect_diff("sub/l: symlink target");
  reset();
  ASSERT_EQ(chmod(b.c_str(), 0700), 0);
  expect_diff(".: mode");
}

// ------------------------------------------------------------- tar import

class TarImportTest : public LayerStoreTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(TarImportTest, ImportsWhiteoutsOpaqueDirsAndMetadata) {
  std::string tar = root_ + "/layer.tar";
  std::vector<TarEntry> entries;
  auto add = [&](TarEntry e) { entries.push_back(std::move(e)); };
  add({.path = "./", .type = AE_IFDIR, .perm = 0755});
  add({.path = "etc/", .type = AE_IFDIR, .perm = 0755, .mtime = 1234567890});
  add({.path = "etc/conf",
       .data = "k=v\n",
       .uid = 1000,
       .gid = 1001,
       .mtime = 1500000000,
       .xattrs = {{"user.origin", "tar"}}});
  add({.path = "etc/conf.link", .hardlink = "etc/conf"});
  add({.path = "etc/sym", .type = AE_IFLNK, .perm = 0777, .symlink = "/does/not/exist"});
  add({.path = "bin/su", .perm = 04755, .data = "suid"});  // implicit parent dir
  add({.path = "etc/.wh.removed"});
  add({.path = "opaque/", .type = AE_IFDIR, .perm = 0750});
  add({.path = "opaque/.wh..wh..opq"});
  add({.path = "opaque/kept", .data = "k"});
  add({.path = "run/pipe", .type = AE_IFIFO, .perm = 0620});
  add({.path = "./dup", .data = "first"});
  add({.path = "dup", .data = "second"});  // later entry wins
  ASSERT_NO_FATAL_FAILURE(WriteTar(tar, entries, GetParam()));

  auto info = store_->BuildFromTar("workspace/tar@1", tar);
  ASSERT_OK(info);
  ExpectTmpEmpty();
  std::string m = Mount(*info);
  struct stat st;
  ASSERT_EQ(lstat((m + "/etc/removed").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(st.st_rdev, makedev(0, 0));
  EXPECT_NE(lstat((m + "/etc/.wh.removed").c_str(), &st), 0);
  EXPECT_EQ(GetXattr(m + "/opaque", "trusted.overlay.opaque"), "y");
  EXPECT_NE(lstat((m + "/opaque/.wh..wh..opq").c_str(), &st), 0);
  ASSERT_EQ(lstat((m + "/opaque").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  EXPECT_EQ(ReadFile(m + "/opaque/kept"), "k");
  ASSERT_EQ(lstat((m + "/etc/conf").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 1000u);
  EXPECT_EQ(st.st_gid, 1001u);
  EXPECT_EQ(st.st_mtim.tv_sec, 1500000000);
  EXPECT_EQ(st.st_nlink, 2u);
  EXPECT_EQ(GetXattr(m + "/etc/conf", "user.origin"), "tar");
  struct stat hl;
  ASSERT_EQ(lstat((m + "/etc/conf.link").c_str(), &hl), 0);
  EXPECT_EQ(hl.st_ino, st.st_ino);
  ASSERT_EQ(lstat((m + "/etc").c_str(), &st), 0);
  EXPECT_EQ(st.st_mtim.tv_sec, 1234567890);  // set after its children
  char buf[64];
  ssize_t n = readlink((m + "/etc/sym").c_str(), buf, sizeof(buf));
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), "/does/not/exist");
  ASSERT_EQ(lstat((m + "/bin/su").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 04755u);
  ASSERT_EQ(lstat((m + "/bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  ASSERT_EQ(lstat((m + "/run/pipe").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0620u);
  EXPECT_EQ(ReadFile(m + "/dup"), "second");
}

INSTANTIATE_TEST_SUITE_P(Compression, TarImportTest, ::testing::Values("none", "gzip", "xz", "zstd"));

TEST_F(LayerStoreTest, BadTarsAreRejectedNamingTheEntry) {
  const std::string escape = "warren-image-escape-" + std::to_string(getpid());
  struct Case {
    std::string label;
    std::vector<TarEntry> entries;
    std::string expect;  // in the message
  };
  std::vector<Case> cases = {
      {"absolute", {{.path = "ok"}, {.path = "/etc/evil"}}, "/etc/evil"},
      {"dotdot", {{.path = "../x"}}, "../x"},
      {"inner dotdot", {{.path = "a/", .type = AE_IFDIR}, {.path = "a/../../x"}}, "a/../../x"},
      {"char device", {{.path = "dev/null", .type = AE_IFCHR, .rdev = makedev(1, 3)}}, "dev/null"},
      {"block device", {{.path = "sda", .type = AE_IFBLK, .rdev = makedev(8, 0)}}, "sda"},
      {"through symlink",
       {{.path = "a", .type = AE_IFLNK, .symlink = "/tmp"}, {.path = "a/" + escape, .data = "x"}},
       "a/" + escape},
      {"through relative symlink",
       {{.path = "d/", .type = AE_IFDIR},
        {.path = "d/up", .type = AE_IFLNK, .symlink = "../.."},
        {.path = "d/up/" + escape}},
       "d/up/" + escape},
      {"hardlink outside", {{.path = "h", .hardlink = "../../etc/passwd"}}, "\"h\""},
      {"hardlink absolute", {{.path = "h2", .hardlink = "/etc/passwd"}}, "h2"},
      {"hardlink via symlink",
       {{.path = "s", .type = AE_IFLNK, .symlink = "/etc"}, {.path = "h3", .hardlink = "s/passwd"}},
       "h3"},
      {"hardlink missing", {{.path = "h4", .hardlink = "nope"}}, "h4"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].label);
    std::string tar = root_ + "/bad" + std::to_string(i) + ".tar";
    ASSERT_NO_FATAL_FAILURE(WriteTar(tar, cases[i].entries));
    auto r = store_->BuildFromTar("workspace/bad@" + std::to_string(i), tar);
    ASSERT_THAT(r, ::testing::Not(IsOk()));
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_NE(r.status().message().find(cases[i].expect), absl::string_view::npos) << r.status();
    ExpectTmpEmpty();
    struct stat st;
    EXPECT_NE(lstat(("/tmp/" + escape).c_str(), &st), 0) << "wrote outside the tree";
  }
  EXPECT_TRUE(store_->List().empty());
  EXPECT_TRUE(ListDir(store_->dir() + "/blobs/sha256").empty());
}

TEST_F(LayerStoreTest, CorruptTarsAreRejected) {
  // Truncated in the middle of a file's data.
  std::string good = root_ + "/good.tar";
  std::string data(1 << 20, 'x');
  ASSERT_NO_FATAL_FAILURE(WriteTar(good, {{.path = "a", .data = "a"}, {.path = "big", .data = data}}));
  std::string bytes = ReadFile(good);
  std::string trunc = root_ + "/trunc.tar";
  WriteFile(trunc, bytes.substr(0, bytes.size() / 2));
  auto r = store_->BuildFromTar("workspace/t@1", trunc);
  ASSERT_THAT(r, ::testing::Not(IsOk()));
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(r.status().message().find("big"), absl::string_view::npos) << r.status();
  ExpectTmpEmpty();

  // Garbage.
  std::string junk = root_ + "/junk.tar";
  WriteFile(junk, std::string(10000, '\x5a'));
  r = store_->BuildFromTar("workspace/t@2", junk);
  ASSERT_THAT(r, ::testing::Not(IsOk()));
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument));
  ExpectTmpEmpty();

  // Truncated gzip stream.
  std::string gz = root_ + "/good.tar.gz";
  ASSERT_NO_FATAL_FAILURE(WriteTar(gz, {{.path = "a", .data = "a"}, {.path = "big", .data = data}}, "gzip"));
  std::string gbytes = ReadFile(gz);
  WriteFile(gz, gbytes.substr(0, gbytes.size() / 2));
  r = store_->BuildFromTar("workspace/t@3", gz);
  ASSERT_THAT(r, ::testing::Not(IsOk()));
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument));
  ExpectTmpEmpty();

  r = store_->BuildFromTar("workspace/t@4", root_ + "/missing.tar");
  EXPECT_THAT(r, ::testing::Not(IsOk()));
  ExpectTmpEmpty();
  EXPECT_TRUE(store_->List().empty());
}

TEST_F(LayerStoreTest, TarZeroBlocksStayHolesAndMakeAChunkedLayer) {
  // A 64 MiB file stored densely in the tar (zeros, as Go's archive/tar
  // writes a sparse file), with data at an unaligned offset and at the end.
  std::string data(size_t{64} << 20, '\0');
  data.replace(size_t{5} << 20 | 3, 5, "hello");
  data.replace(data.size() - 4, 4, "tail");
  std::string tar = root_ + "/z.tar.gz";
  ASSERT_NO_FATAL_FAILURE(WriteTar(tar, {{.path = "z", .data = data}, {.path = "a", .data = "abc"}}, "gzip"));
  auto info = store_->BuildFromTar("workspace/z@1", tar);
  ASSERT_OK(info);
  EXPECT_LT(info->size_bytes, uint64_t{1} << 20);  // chunk-based: the zeros cost no blocks
  const std::string m = Mount(*info);
  EXPECT_EQ(ReadFile(m + "/z"), data);
  EXPECT_EQ(ReadFile(m + "/a"), "abc");
  // A tar without a block of zeros keeps the plain format (same bytes as before)...
  std::string plain = root_ + "/p.tar";
  ASSERT_NO_FATAL_FAILURE(WriteTar(plain, {{.path = "a", .data = std::string(3 << 20, 'x') + std::string(100, '\0')}}));
  auto p = store_->BuildFromTar("workspace/zp@1", plain);
  ASSERT_OK(p);
  EXPECT_GT(p->size_bytes, uint64_t{3} << 20);
  // ... unless the store builds every layer chunk-based: identical 4 KiB blocks are stored once.
  store_->set_chunked_layers(true);
  auto pc = store_->BuildFromTar("workspace/zp@2", plain);
  ASSERT_OK(pc);
  EXPECT_LT(pc->size_bytes, uint64_t{1} << 20);
  EXPECT_EQ(ReadFile(Mount(*pc) + "/a"), std::string(3 << 20, 'x') + std::string(100, '\0'));
  store_->set_chunked_layers(false);
  EXPECT_EQ(ReadFile(Mount(*p) + "/a"), std::string(3 << 20, 'x') + std::string(100, '\0'));
  ExpectTmpEmpty();
}

TEST_F(LayerStoreTest, TarProgressReportsBytesReadAndCancels) {
  // 12 MiB of data in 3 files, gzip: reports come per entry and every few
  // MiB of a file's data, counting the compressed bytes read.
  std::string gz = root_ + "/p.tar.gz";
  std::string data(size_t{4} << 20, 'p');
  ASSERT_NO_FATAL_FAILURE(
      WriteTar(gz, {{.path = "a", .data = data}, {.path = "b", .data = data}, {.path = "c", .data = data}}, "gzip"));
  struct stat st;
  ASSERT_EQ(stat(gz.c_str(), &st), 0);
  std::vector<uint64_t> seen;
  auto info = store_->BuildFromTar("workspace/p@1", gz, [&](uint64_t n) {
    seen.push_back(n);
    return true;
  });
  ASSERT_THAT(info, IsOk());
  ASSERT_GE(seen.size(), 3u);
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  EXPECT_GT(seen.front(), 0u);
  EXPECT_LE(seen.back(), static_cast<uint64_t>(st.st_size));

  // Returning false stops the conversion: Cancelled, nothing kept.
  int calls = 0;
  auto r = store_->BuildFromTar("workspace/p@2", gz, [&](uint64_t) { return ++calls < 2; });
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(calls, 2);
  ExpectTmpEmpty();
  EXPECT_THAT(store_->Resolve("workspace/p@2"), ::testing::Not(IsOk()));
}

}  // namespace
}  // namespace warren::image
