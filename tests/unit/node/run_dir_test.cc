// node/run_dir: where per-sandbox runtime state goes, the state dir's links
// to it, and its removal when unused. Real file systems: the state dir on
// the test's temp dir, a tmpfs mounted for the "/run" side.
#include "node/run_dir.h"

#include <linux/magic.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "status_matchers.h"

namespace warren::node {
namespace {

namespace fs = std::filesystem;

class RunDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/var/tmp/warren-rundir-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    state_ = root_ + "/state";
    ASSERT_EQ(mkdir(state_.c_str(), 0700), 0);
    struct statfs sf;
    ASSERT_EQ(statfs(state_.c_str(), &sf), 0);
    state_on_tmpfs_ = sf.f_type == TMPFS_MAGIC;
    run_parent_ = root_ + "/run";
    ASSERT_EQ(mkdir(run_parent_.c_str(), 0755), 0);
    if (mount("tmpfs", run_parent_.c_str(), "tmpfs", 0, "size=1m") == 0) {
      mounted_ = true;
    }
  }
  void TearDown() override {
    if (mounted_) umount2(run_parent_.c_str(), MNT_DETACH);
    fs::remove_all(root_);
  }
  std::string root_, state_, run_parent_;
  bool mounted_ = false, state_on_tmpfs_ = false;
};

TEST_F(RunDirTest, ExplicitMustBeAbsolute) {
  auto r = ResolveRunDir(state_, "relative/run");
  ASSERT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(r.status().message().find("relative/run"), absl::string_view::npos);
  EXPECT_THAT(ResolveRunDir("state", ""), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(*ResolveRunDir(state_, root_ + "/x"), root_ + "/x");
}

TEST_F(RunDirTest, AutomaticIsOnTmpfsLinkedFromTheStateDirAndStable) {
  if (!mounted_) GTEST_SKIP() << "cannot mount a tmpfs here (not root?)";
  if (state_on_tmpfs_) GTEST_SKIP() << "the temp dir is a tmpfs: the state dir itself is used";
  const std::string run_root = run_parent_ + "/warren";
  auto r = ResolveRunDir(state_, "", run_root);
  ASSERT_OK(r);
  ASSERT_EQ(r->rfind(run_root + "/", 0), 0u) << *r;
  EXPECT_EQ(r->size(), run_root.size() + 1 + 16) << *r;
  ASSERT_OK(LinkRunDir(state_, *r));
  for (const char* sub : {"sandboxes", "run", "audit"}) {
    EXPECT_TRUE(fs::is_symlink(state_ + "/" + sub)) << sub;
    EXPECT_EQ(fs::read_symlink(state_ + "/" + sub).string(), *r + "/" + sub);
    EXPECT_TRUE(fs::is_directory(*r + "/" + sub)) << sub;
  }
  struct statfs sf;
  ASSERT_EQ(statfs((state_ + "/sandboxes/").c_str(), &sf), 0);
  EXPECT_EQ(sf.f_type, static_cast<decltype(sf.f_type)>(TMPFS_MAGIC));
  // A later daemon follows the links, whatever its run root.
  EXPECT_EQ(*ResolveRunDir(state_, "", "/elsewhere/warren"), *r);
  ASSERT_OK(LinkRunDir(state_, *r));  // idempotent

  // A record keeps everything in place at shutdown; without it all goes.
  std::ofstream(*r + "/sandboxes/n0-a.json") << "{}";
  RemoveRunDirIfUnused(state_, *r);
  EXPECT_TRUE(fs::exists(*r + "/sandboxes/n0-a.json"));
  EXPECT_TRUE(fs::is_symlink(state_ + "/run"));
  // Another run dir while this one holds records: refused, naming the fix.
  Status moved = LinkRunDir(state_, root_ + "/other");
  ASSERT_THAT(moved, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(moved.message().find("--run-dir " + *r), absl::string_view::npos) << moved;
  fs::remove(*r + "/sandboxes/n0-a.json");
  RemoveRunDirIfUnused(state_, *r);
  EXPECT_FALSE(fs::exists(*r));
  for (const char* sub : {"sandboxes", "run", "audit"})
    EXPECT_FALSE(fs::exists(fs::symlink_status(state_ + "/" + sub))) << sub;
}

TEST_F(RunDirTest, ExistingRecordDirectoryKeepsTheOldLayout) {
  ASSERT_EQ(mkdir((state_ + "/sandboxes").c_str(), 0700), 0);
  std::ofstream(state_ + "/sandboxes/n0-live.json") << "{}";
  EXPECT_EQ(*ResolveRunDir(state_, "", run_parent_ + "/warren"), state_);
  ASSERT_OK(LinkRunDir(state_, state_));
  EXPECT_TRUE(fs::is_directory(state_ + "/run"));
  EXPECT_FALSE(fs::is_symlink(state_ + "/run"));
  RemoveRunDirIfUnused(state_, state_);  // never touches the state dir's own layout
  EXPECT_TRUE(fs::exists(state_ + "/sandboxes/n0-live.json"));
}

TEST_F(RunDirTest, EmptyOldLayoutMovesToTheRunDir) {
  if (!mounted_ || state_on_tmpfs_) GTEST_SKIP() << "needs a tmpfs run root and a non-tmpfs state dir";
  for (const char* sub : {"sandboxes", "run", "audit"}) ASSERT_EQ(mkdir((state_ + "/" + sub).c_str(), 0700), 0);
  auto r = ResolveRunDir(state_, "", run_parent_ + "/warren");
  ASSERT_OK(r);
  ASSERT_NE(*r, state_);
  ASSERT_OK(LinkRunDir(state_, *r));
  for (const char* sub : {"sandboxes", "run", "audit"}) EXPECT_TRUE(fs::is_symlink(state_ + "/" + sub)) << sub;
}

TEST_F(RunDirTest, NoTmpfsRunRootMeansTheStateDir) {
  // run_root's parent is the (non-tmpfs) temp dir itself.
  if (state_on_tmpfs_) GTEST_SKIP() << "the temp dir is a tmpfs";
  EXPECT_EQ(*ResolveRunDir(state_, "", root_ + "/plain/warren"), state_);
}

TEST_F(RunDirTest, MountsATmpfsWhenTheRunRootIsNotOne) {
  if (state_on_tmpfs_) GTEST_SKIP() << "the temp dir is a tmpfs";
  const std::string run_root = root_ + "/plain/warren/runtime";
  auto r = ResolveRunDir(state_, "", run_root, /*mount_tmpfs=*/true);
  ASSERT_OK(r);
  struct statfs sf;
  if (statfs(run_root.c_str(), &sf) != 0 || sf.f_type != TMPFS_MAGIC) {
    EXPECT_EQ(*r, state_);  // could not mount (not root): falls back
    GTEST_SKIP() << "cannot mount a tmpfs here";
  }
  EXPECT_EQ(r->rfind(run_root + "/", 0), 0u) << *r;
  // A second daemon finds the mount and does not stack another one.
  auto again = ResolveRunDir(state_, "", run_root, true);
  EXPECT_EQ(*again, *r);
  EXPECT_EQ(umount2(run_root.c_str(), 0), 0);
  EXPECT_NE(umount2(run_root.c_str(), 0), 0) << "two tmpfs were stacked on " << run_root;
}

TEST_F(RunDirTest, AfterARebootTheLinkedRunDirGetsItsTmpfsBack) {
  if (state_on_tmpfs_) GTEST_SKIP() << "the temp dir is a tmpfs";
  // The links of a run dir under a run root whose tmpfs is gone (a reboot of
  // a host whose /run is a plain directory): the tmpfs is mounted again.
  const std::string run_root = root_ + "/plain/warren/runtime";
  const std::string rd = run_root + "/0123456789abcdef";
  ASSERT_EQ(symlink((rd + "/sandboxes").c_str(), (state_ + "/sandboxes").c_str()), 0);
  auto r = ResolveRunDir(state_, "", run_root, /*mount_tmpfs=*/true);
  ASSERT_OK(r);
  EXPECT_EQ(*r, rd);
  struct statfs sf;
  if (statfs(run_root.c_str(), &sf) != 0 || sf.f_type != TMPFS_MAGIC) GTEST_SKIP() << "cannot mount a tmpfs here";
  ASSERT_OK(LinkRunDir(state_, *r));
  EXPECT_TRUE(fs::is_directory(rd + "/sandboxes"));
  RemoveRunDirIfUnused(state_, *r);
  // The last one out takes down the tmpfs it mounted (nothing else uses it).
  const bool still_tmpfs = statfs(run_root.c_str(), &sf) == 0 && sf.f_type == TMPFS_MAGIC;
  if (still_tmpfs) (void)umount2(run_root.c_str(), 0);
  EXPECT_FALSE(still_tmpfs) << "the tmpfs on " << run_root << " stayed after its last run dir went";
}

TEST_F(RunDirTest, NonEmptyDirectoryInTheWayIsRefused) {
  ASSERT_EQ(mkdir((state_ + "/audit").c_str(), 0700), 0);
  std::ofstream(state_ + "/audit/n0-x.jsonl") << "{}\n";
  EXPECT_EQ(*ResolveRunDir(state_, "", run_parent_ + "/warren"), state_);  // automatic: keeps the old layout
  Status s = LinkRunDir(state_, root_ + "/rd");                            // explicit: refused, nothing lost
  ASSERT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(s.message().find(state_ + "/audit"), absl::string_view::npos) << s;
  EXPECT_TRUE(fs::exists(state_ + "/audit/n0-x.jsonl"));
}

// A daemon killed before its state dir was removed leaves its run dir (and
// what its backends kept there) where no daemon will look again: the next
// daemon on any state dir finds it; a run dir in use, holding sandboxes,
// without a state-dir file or with a mount below is never taken.
TEST_F(RunDirTest, OrphanRunDirsAreThoseNoStateDirUses) {
  if (!mounted_) GTEST_SKIP() << "cannot mount a tmpfs here (not root?)";
  if (state_on_tmpfs_) GTEST_SKIP() << "the temp dir is a tmpfs: the state dir itself is used";
  const std::string run_root = run_parent_ + "/warren";
  auto own = ResolveRunDir(state_, "", run_root);
  ASSERT_OK(own);
  ASSERT_OK(LinkRunDir(state_, *own));
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(*own + "/" + kStateDirFile)));
  {
    std::ifstream f(*own + "/" + kStateDirFile);
    std::string line;
    std::getline(f, line);
    EXPECT_EQ(line, state_);
  }
  // Four more daemons' state dirs: gone, in use, holding a record, with a mount below.
  auto make = [&](const std::string& name) {
    const std::string st = root_ + "/" + name;
    EXPECT_EQ(mkdir(st.c_str(), 0700), 0);
    auto rd = ResolveRunDir(st, "", run_root);
    EXPECT_TRUE(rd.ok());
    EXPECT_TRUE(LinkRunDir(st, *rd).ok());
    return std::make_pair(st, *rd);
  };
  auto [gone_state, gone] = make("gone");
  auto [used_state, used] = make("used");
  auto [rec_state, rec] = make("rec");
  auto [mnt_state, mnt] = make("mnt");
  fs::create_directories(gone + "/microvm-templates/pool-1");
  std::ofstream(gone + "/microvm-templates/pool-1/qemu.log") << "x";
  fs::remove_all(gone_state);
  std::ofstream(rec + "/sandboxes/n0-a.json") << "{}";
  fs::remove_all(rec_state);
  fs::create_directories(mnt + "/microvm-templates/m");
  ASSERT_EQ(mount("tmpfs", (mnt + "/microvm-templates/m").c_str(), "tmpfs", 0, "size=1m"), 0);
  fs::remove_all(mnt_state);
  // An older warren's run dir (no state-dir file) whose state dir is gone.
  const std::string old = run_root + "/0123456789abcdef";
  fs::create_directories(old + "/sandboxes");

  const std::vector<std::string> orphans = FindOrphanRunDirs(run_root, *own);
  EXPECT_EQ(orphans, std::vector<std::string>{gone});
  // The own run dir is never one, even when its state dir is gone.
  fs::remove_all(state_);
  EXPECT_EQ(FindOrphanRunDirs(run_root, *own), std::vector<std::string>{gone});
  // A state dir that moved to another run dir leaves its old one orphaned.
  ASSERT_OK(LinkRunDir(used_state, root_ + "/explicit-run"));
  std::vector<std::string> after = FindOrphanRunDirs(run_root, *own);
  std::sort(after.begin(), after.end());
  std::vector<std::string> want{gone, used};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(after, want);
  umount2((mnt + "/microvm-templates/m").c_str(), MNT_DETACH);
  EXPECT_EQ(FindOrphanRunDirs(run_root + "-missing", *own), std::vector<std::string>{});
}

}  // namespace
}  // namespace warren::node
