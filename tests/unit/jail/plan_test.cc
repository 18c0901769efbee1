// The plan executor's masked dirs (jail/plan.c WARREN_JAIL_MASK_DIR): with
// WARREN_JAIL_CLONE_FD one detached empty tmpfs serves every process the
// plan is applied in (each gets a clone, none a superblock of its own).
#include <fcntl.h>
#include <linux/mount.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "jail/plan.h"
#include "jail/plan_builder.h"
#include "jail/syscalls.h"

namespace warren::jail {
namespace {

// An empty read-only tmpfs, detached (what the fncall zygote makes once).
int DetachedEmptyTmpfs() {
  const int fs = FsOpen("tmpfs", FSOPEN_CLOEXEC);
  if (fs < 0) return -1;
  int m = -1;
  if (FsConfig(fs, FSCONFIG_SET_STRING, "size", "0", 0) == 0 &&
      FsConfig(fs, FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) == 0)
    m = FsMount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC);
  ::close(fs);
  return m;
}

// Applies `plan` in a child in a new mount namespace and reports what the
// plan's first target shows: 0 if it is on the superblock of `mask_fd`,
// 1 if on another (a tmpfs of its own), 2 + step if the plan failed.
int ApplyInChild(const WarrenJailPlan& plan, int mask_fd, const std::string& target) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) ::_exit(100);
    const int fds[WARREN_JAIL_MAX_FD_SLOTS] = {mask_fd, -1, -1, -1, -1};
    int step = 0;
    if (warren_jail_mount(&plan, fds, &step) != 0) ::_exit(2 + (step & 0x7f));
    struct stat a, b;
    if (::stat(target.c_str(), &a) != 0 || ::fstat(mask_fd, &b) != 0) ::_exit(101);
    ::_exit(a.st_dev == b.st_dev ? 0 : 1);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 200;
}

class PlanMaskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root";
    char tmpl[] = "/tmp/warren-plan-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ASSERT_EQ(::mkdir((dir_ + "/a").c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((dir_ + "/b").c_str(), 0755), 0);
    ASSERT_EQ(::close(::open((dir_ + "/a/secret").c_str(), O_CREAT | O_WRONLY, 0600)), 0);
    mask_ = DetachedEmptyTmpfs();
    if (mask_ < 0) GTEST_SKIP() << "fsmount(tmpfs) unavailable";
  }
  void TearDown() override {
    if (mask_ >= 0) ::close(mask_);
    if (!dir_.empty()) {
      ::unlink((dir_ + "/a/secret").c_str());
      ::rmdir((dir_ + "/a").c_str());
      ::rmdir((dir_ + "/b").c_str());
      ::rmdir(dir_.c_str());
    }
  }
  std::string dir_;
  int mask_ = -1;
};

TEST_F(PlanMaskTest, CloneFdServesEveryProcessFromOneTmpfs) {
  PlanBuilder b;
  b.MaskDir(dir_ + "/a", 0, /*clone_fd=*/true).MaskDir(dir_ + "/b", 0, /*clone_fd=*/true);
  ASSERT_TRUE(b.Finish().ok());
  // Twice with the same fd: each process gets a clone of the one tmpfs.
  EXPECT_EQ(ApplyInChild(b.plan(), mask_, dir_ + "/a"), 0);
  EXPECT_EQ(ApplyInChild(b.plan(), mask_, dir_ + "/a"), 0);
  EXPECT_EQ(ApplyInChild(b.plan(), mask_, dir_ + "/b"), 0);
  // The fd's own mount is still detached and usable here.
  struct stat st;
  EXPECT_EQ(::fstat(mask_, &st), 0);
  // The mask hides the dir's files in the child only.
  EXPECT_EQ(::access((dir_ + "/a/secret").c_str(), F_OK), 0);
}

TEST_F(PlanMaskTest, MovedFdServesOneProcessOnly) {
  // Without WARREN_JAIL_CLONE_FD the detached mount is moved: the first
  // process gets it, a later one cannot (the fd's mount is no longer
  // detached), which is why fncall's call plan clones it.
  PlanBuilder b;
  b.MaskDir(dir_ + "/a", 0);
  ASSERT_TRUE(b.Finish().ok());
  EXPECT_EQ(ApplyInChild(b.plan(), mask_, dir_ + "/a"), 0);
  EXPECT_GE(ApplyInChild(b.plan(), mask_, dir_ + "/a"), 2);
}

}  // namespace
}  // namespace warren::jail
