// The layer format's tree code (image/layer_tree.h): copies of diffs with
// ids shifted, whiteouts/opaque dirs/hardlinks/sparse files kept, the
// solution copy and change listing of grading.
#include "image/layer_tree.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "common/unique_fd.h"
#include "status_matchers.h"

namespace warren::image {
namespace {

namespace fs = std::filesystem;

class UpperCopyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/warren-upper-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    up_ = root_ + "/upper";
    ASSERT_EQ(::mkdir(up_.c_str(), 0755), 0);
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const std::string& rel, const std::string& data, mode_t mode = 0644) {
    std::ofstream(up_ + rel) << data;
    ASSERT_EQ(::chmod((up_ + rel).c_str(), mode), 0);
  }
  struct stat Lstat(const std::string& p) {
    struct stat st {};
    EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
    return st;
  }
  std::string root_, up_;
};

TEST_F(UpperCopyTest, KeepsWhiteoutsOpaqueHardlinksSymlinksAndShiftsIds) {
  const uint32_t base = 1000000;
  ASSERT_EQ(::mkdir((up_ + "/d").c_str(), 0750), 0);
  ASSERT_EQ(::lsetxattr((up_ + "/d").c_str(), "trusted.overlay.opaque", "y", 1, 0), 0);
  ASSERT_EQ(::lsetxattr((up_ + "/d").c_str(), "trusted.overlay.impure", "y", 1, 0), 0);
  Write("/d/f", "hello", 0640);
  ASSERT_EQ(::lsetxattr((up_ + "/d/f").c_str(), "user.tag", "v", 1, 0), 0);
  ASSERT_EQ(::link((up_ + "/d/f").c_str(), (up_ + "/d/hard").c_str()), 0);
  ASSERT_EQ(::symlink("../etc/passwd", (up_ + "/d/sym").c_str()), 0);
  ASSERT_EQ(::mknod((up_ + "/gone").c_str(), S_IFCHR | 0, makedev(0, 0)), 0);
  ASSERT_EQ(::lchown((up_ + "/d/f").c_str(), base + 1000, base + 1000), 0);
  ASSERT_EQ(::lchown((up_ + "/d").c_str(), base, base), 0);
  ASSERT_EQ(::lchown((up_ + "/gone").c_str(), 5, 5), 0);  // outside the range
  Write("/answer.txt", "42");
  ASSERT_EQ(::mkdir((up_ + "/cache").c_str(), 0755), 0);
  Write("/cache/x", "x");

  UniqueFd src(::open(up_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(src.valid());
  DiffCopyOptions o;
  o.host_root_id = base;
  o.id_range = 65536;
  o.exclude = {"/answer.txt", "/cache/"};
  const std::string dst = root_ + "/out";
  ASSERT_OK(CopyDiffTree(src.get(), dst, o));

  struct stat d = Lstat(dst + "/d");
  EXPECT_TRUE(S_ISDIR(d.st_mode));
  EXPECT_EQ(d.st_mode & 07777, 0750u);
  EXPECT_EQ(d.st_uid, 0u);
  char v[8];
  EXPECT_EQ(::lgetxattr((dst + "/d").c_str(), "trusted.overlay.opaque", v, sizeof v), 1);
  EXPECT_EQ(::lgetxattr((dst + "/d").c_str(), "trusted.overlay.impure", v, sizeof v), -1);
  struct stat f = Lstat(dst + "/d/f");
  struct stat h = Lstat(dst + "/d/hard");
  EXPECT_EQ(f.st_ino, h.st_ino);
  EXPECT_EQ(f.st_mode & 07777, 0640u);
  EXPECT_EQ(f.st_uid, 1000u);
  EXPECT_EQ(f.st_gid, 1000u);
  EXPECT_EQ(::lgetxattr((dst + "/d/f").c_str(), "user.tag", v, sizeof v), 1);
  EXPECT_EQ(fs::read_symlink(dst + "/d/sym"), "../etc/passwd");
  struct stat w = Lstat(dst + "/gone");
  EXPECT_TRUE(S_ISCHR(w.st_mode));
  EXPECT_EQ(w.st_rdev, makedev(0, 0));
  EXPECT_EQ(w.st_uid, 65534u);
  EXPECT_FALSE(fs::exists(dst + "/answer.txt"));
  EXPECT_FALSE(fs::exists(dst + "/cache"));
  std::ifstream in(dst + "/d/f");
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(data, "hello");

  // An existing destination is refused and left alone.
  EXPECT_THAT(CopyDiffTree(src.get(), dst, o), ::testing::Not(IsOk()));
  EXPECT_TRUE(fs::exists(dst + "/d/f"));
}

TEST_F(UpperCopyTest, DiffTouchesAndExcludes) {
  // upper: /t opaque with /t/new, /x whiteout, /u/file
  ASSERT_EQ(::mkdir((up_ + "/t").c_str(), 0755), 0);
  ASSERT_EQ(::lsetxattr((up_ + "/t").c_str(), "trusted.overlay.opaque", "y", 1, 0), 0);
  Write("/t/new", "n");
  ASSERT_EQ(::mknod((up_ + "/x").c_str(), S_IFCHR | 0, makedev(0, 0)), 0);
  ASSERT_EQ(::mkdir((up_ + "/u").c_str(), 0755), 0);
  Write("/u/file", "f");
  UniqueFd src(::open(up_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  EXPECT_TRUE(DiffTouches(src.get(), "/t/tests/a"));  // ancestor opaque
  EXPECT_TRUE(DiffTouches(src.get(), "/x/y"));        // ancestor whiteout
  EXPECT_TRUE(DiffTouches(src.get(), "/u"));          // something below
  EXPECT_TRUE(DiffTouches(src.get(), "/u/file"));
  EXPECT_FALSE(DiffTouches(src.get(), "/u/other"));
  EXPECT_FALSE(DiffTouches(src.get(), "/v"));
  EXPECT_TRUE(PathExcluded("/a/b/__pycache__", {"*/__pycache__"}));
  EXPECT_TRUE(PathExcluded("/a/b.pyc", {"*.pyc"}));
  EXPECT_FALSE(PathExcluded("/a/bc", {"/a/b"}));
  EXPECT_TRUE(PathWithin("/a/b/c", "/a/b"));
  EXPECT_TRUE(PathWithin("/a/b", "/a/b"));
  EXPECT_FALSE(PathWithin("/a/bc", "/a/b"));
}

// The diff of a task sandbox over a pristine lower:
//   lower: /t/tests/a, /t/keep, /t/pkg/x, /x/, /etc/
//   upper: /t opaque with /t/new and /t/pkg/x, /x whiteout, /u/file
class SolutionCopyTest : public UpperCopyTest {
 protected:
  void SetUp() override {
    UpperCopyTest::SetUp();
    lower_ = root_ + "/lower";
    fs::create_directories(lower_ + "/t/tests");
    fs::create_directories(lower_ + "/t/pkg");
    fs::create_directories(lower_ + "/x");
    fs::create_directories(lower_ + "/etc");
    ASSERT_EQ(::chmod((lower_ + "/t").c_str(), 0751), 0);
    std::ofstream(lower_ + "/t/tests/a") << "pristine";
    std::ofstream(lower_ + "/t/keep") << "k";
    std::ofstream(lower_ + "/t/pkg/x") << "old";
    ASSERT_EQ(::mkdir((up_ + "/t").c_str(), 0751), 0);
    ASSERT_EQ(::lsetxattr((up_ + "/t").c_str(), "trusted.overlay.opaque", "y", 1, 0), 0);
    Write("/t/new", "n");
    ASSERT_EQ(::mkdir((up_ + "/t/pkg").c_str(), 0755), 0);
    Write("/t/pkg/x", "new");
    ASSERT_EQ(::mknod((up_ + "/x").c_str(), S_IFCHR | 0, makedev(0, 0)), 0);
    ASSERT_EQ(::mkdir((up_ + "/u").c_str(), 0755), 0);
    Write("/u/file", "f");
    src_.reset(::open(up_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    lower_fd_.reset(::open(lower_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(src_.valid() && lower_fd_.valid());
  }
  std::string Read(const std::string& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  bool Opaque(const std::string& p) {
    char v[4];
    return ::lgetxattr(p.c_str(), "trusted.overlay.opaque", v, sizeof v) == 1;
  }
  std::string lower_;
  UniqueFd src_, lower_fd_;
};

TEST_F(SolutionCopyTest, CopiesOnlyTheSolutionWithPristineAncestors) {
  const std::string dst = root_ + "/out";
  ASSERT_OK(CopySolution(src_.get(), dst, {"/t/pkg", "/x/y", "/v/w"}, {}, {lower_fd_.get()}, {}));
  // the ancestor is a plain merging dir with the pristine mode
  struct stat t = Lstat(dst + "/t");
  EXPECT_TRUE(S_ISDIR(t.st_mode));
  EXPECT_EQ(t.st_mode & 07777, 0751u);
  EXPECT_FALSE(Opaque(dst + "/t"));
  // below a replaced ancestor the solution path is opaque: only the agent's
  // view of it shows
  EXPECT_TRUE(Opaque(dst + "/t/pkg"));
  EXPECT_EQ(Read(dst + "/t/pkg/x"), "new");
  EXPECT_FALSE(fs::exists(dst + "/t/new"));
  EXPECT_FALSE(fs::exists(dst + "/t/keep"));
  EXPECT_FALSE(fs::exists(dst + "/u"));
  // a solution path under a deleted ancestor is deleted
  struct stat w = Lstat(dst + "/x/y");
  EXPECT_TRUE(S_ISCHR(w.st_mode) && w.st_rdev == makedev(0, 0));
  EXPECT_FALSE(Opaque(dst + "/x"));
  // one the diff does not touch is not in the copy at all
  EXPECT_FALSE(fs::exists(dst + "/v"));
}

TEST_F(SolutionCopyTest, ProtectedPathsInsideTheSolutionShowThePristineLayers) {
  const std::string dst = root_ + "/out";
  ASSERT_OK(CopySolution(src_.get(), dst, {"/t"}, {"/t/tests/a"}, {lower_fd_.get()}, {}));
  EXPECT_FALSE(Opaque(dst + "/t"));  // not opaque: /t/tests/a comes from below
  EXPECT_FALSE(fs::exists(dst + "/t/tests"));
  EXPECT_EQ(Read(dst + "/t/new"), "n");
}

TEST_F(SolutionCopyTest, ListChangesReportsEverythingOutsideTheSolution) {
  std::vector<std::string> out;
  bool truncated = false;
  ASSERT_OK(ListChanges(src_.get(), {"/t/pkg"}, {lower_fd_.get()}, {}, 100, &out, &truncated));
  EXPECT_EQ(out, (std::vector<std::string>{"/t", "/t/new", "/u", "/x"}));
  EXPECT_FALSE(truncated);
  out.clear();
  ASSERT_OK(ListChanges(src_.get(), {"/t/pkg"}, {lower_fd_.get()}, {}, 2, &out, &truncated));
  EXPECT_EQ(out.size(), 2u);
  EXPECT_TRUE(truncated);
  // a chmod of a pristine dir is a change; a copied-up dir is not
  ASSERT_EQ(::mkdir((up_ + "/etc").c_str(), 0700), 0);
  out.clear();
  truncated = false;
  ASSERT_OK(ListChanges(src_.get(), {"/t", "/u", "/x"}, {lower_fd_.get()}, {}, 100, &out, &truncated));
  EXPECT_EQ(out, (std::vector<std::string>{"/etc"}));
  ASSERT_EQ(::chmod((up_ + "/etc").c_str(), 0755), 0);
  out.clear();
  ASSERT_OK(ListChanges(src_.get(), {"/t", "/u", "/x"}, {lower_fd_.get()}, {}, 100, &out, &truncated));
  EXPECT_TRUE(out.empty()) << out[0];
}

TEST_F(SolutionCopyTest, SymlinksInDiffsAndLayersAreNeverFollowedOnTheHost) {
  // host dir with a secret; the diff has /s -> host dir, the pristine layer
  // has /p -> host dir
  const std::string host = root_ + "/host";
  fs::create_directories(host + "/pkg");
  std::ofstream(host + "/pkg/secret") << "host secret";
  ASSERT_EQ(::symlink(host.c_str(), (up_ + "/s").c_str()), 0);
  ASSERT_EQ(::symlink(host.c_str(), (lower_ + "/p").c_str()), 0);
  // the agent replaced the pristine symlink /p by a directory
  fs::create_directories(up_ + "/p/pkg");
  Write("/p/pkg/q", "agent");
  const std::string dst = root_ + "/out";
  ASSERT_OK(CopySolution(src_.get(), dst, {"/s/pkg", "/p/pkg/q"}, {}, {lower_fd_.get()}, {}));
  // /s/pkg: its ancestor is a symlink in the diff: deleted, nothing copied
  struct stat w = Lstat(dst + "/s/pkg");
  EXPECT_TRUE(S_ISCHR(w.st_mode));
  EXPECT_FALSE(fs::exists(dst + "/s/pkg/secret"));
  // /p/pkg/q: a directory /p in the grade layer would hide the pristine
  // symlink: the solution path cannot enter
  EXPECT_FALSE(fs::exists(dst + "/p"));
  std::vector<std::string> out;
  bool truncated = false;
  ASSERT_OK(ListChanges(src_.get(), {"/t", "/u", "/x"}, {lower_fd_.get()}, {}, 100, &out, &truncated));
  EXPECT_EQ(out, (std::vector<std::string>{"/p", "/s"}));
}

TEST_F(UpperCopyTest, SparseFilesStaySparseAndCopiesAreBounded) {
  Write("/sparse", "");
  {
    UniqueFd f(::open((up_ + "/sparse").c_str(), O_WRONLY | O_CLOEXEC));
    ASSERT_EQ(::ftruncate(f.get(), off_t{1} << 30), 0);
    ASSERT_EQ(::pwrite(f.get(), "data", 4, off_t{1} << 29), 4);
  }
  UniqueFd src(::open(up_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  CopyBudget budget("sandbox n0-test", 128 << 20);
  DiffCopyOptions o;
  o.budget = &budget;
  const std::string dst = root_ + "/out";
  ASSERT_OK(CopyDiffTree(src.get(), dst, o));
  struct stat st = Lstat(dst + "/sparse");
  EXPECT_EQ(st.st_size, off_t{1} << 30);
  EXPECT_LT(st.st_blocks * 512, 1 << 20);        // holes kept
  EXPECT_LT(budget.used(), uint64_t{65} << 20);  // data + 1/16 of the size
  char buf[4];
  UniqueFd f(::open((dst + "/sparse").c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_EQ(::pread(f.get(), buf, 4, off_t{1} << 29), 4);
  EXPECT_EQ(std::string(buf, 4), "data");
  // over the limit: ResourceExhausted naming the sandbox and the limit, nothing left
  std::atomic<uint64_t> node_used{0};
  CopyBudget small("sandbox n0-test", 32 << 20, &node_used, 0);
  o.budget = &small;
  Status s = CopyDiffTree(src.get(), root_ + "/out2", o);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_NE(s.message().find("sandbox n0-test"), std::string::npos) << s;
  EXPECT_NE(s.message().find(std::to_string(32 << 20)), std::string::npos) << s;
  EXPECT_FALSE(fs::exists(root_ + "/out2"));
  small.ReleaseNode();
  EXPECT_EQ(node_used.load(), 0u);
  // the node-wide cap
  CopyBudget capped("sandbox n0-test", 0, &node_used, 1000);
  o.budget = &capped;
  s = CopyDiffTree(src.get(), root_ + "/out3", o);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_TRUE(capped.node_cap_hit());
}

TEST_F(UpperCopyTest, DeepTreesCopyWithoutARecursionLimitUpToPathMax) {
  std::string p = up_;
  for (int i = 0; i < 600; ++i) {
    p += "/d";
    ASSERT_EQ(::mkdir(p.c_str(), 0755), 0);
  }
  std::ofstream(p + "/f") << "deep";
  UniqueFd src(::open(up_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  const std::string dst = root_ + "/out";
  ASSERT_OK(CopyDiffTree(src.get(), dst, {}));
  EXPECT_TRUE(fs::exists(dst + p.substr(up_.size()) + "/f"));
  // longer than PATH_MAX: a clear FailedPrecondition, nothing left behind
  UniqueFd cur(::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  for (int i = 0; i < 1500; ++i) {
    ASSERT_EQ(::mkdirat(cur.get(), "d", 0755), 0);
    cur.reset(::openat(cur.get(), "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(cur.valid());
  }
  Status s = CopyDiffTree(src.get(), root_ + "/out2", {});
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(s.message().find("longer than a layer"), std::string::npos) << s;
  EXPECT_FALSE(fs::exists(root_ + "/out2"));
  std::vector<std::string> out;
  bool truncated = false;
  ASSERT_OK(ListChanges(src.get(), {"/other"}, {}, {}, 100, &out, &truncated));
  EXPECT_EQ(out, (std::vector<std::string>{"/d"}));
}

TEST_F(UpperCopyTest, SecurityXattrsAreDropped) {
  Write("/bin-with-cap", "x", 0755);
  const unsigned char cap[20] = {0x01, 0, 0, 0x02, 0, 0x20, 0, 0};  // v2, effective, CAP_NET_RAW
  ASSERT_EQ(::lsetxattr((up_ + "/bin-with-cap").c_str(), "security.capability", cap, sizeof cap, 0), 0);
  ASSERT_EQ(::lsetxattr((up_ + "/bin-with-cap").c_str(), "user.keep", "v", 1, 0), 0);
  UniqueFd src(::open(up_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  const std::string dst = root_ + "/out";
  ASSERT_OK(CopyDiffTree(src.get(), dst, {}));
  char v[32];
  EXPECT_EQ(::lgetxattr((dst + "/bin-with-cap").c_str(), "security.capability", v, sizeof v), -1);
  EXPECT_EQ(errno, ENODATA);
  EXPECT_EQ(::lgetxattr((dst + "/bin-with-cap").c_str(), "user.keep", v, sizeof v), 1);
}

}  // namespace
}  // namespace warren::image
