// CheckVmHost: what the vm backend needs on the host, each missing piece
// named (the daemon logs it when the backend is not offered; Create answers
// it when a guest file went away after the daemon started).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/vm/vm_backend.h"
#include "status_matchers.h"

namespace warren::runtime {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class VmHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vm_host_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    for (const char* f : {"qemu", "qemu-img", "system.erofs", "upper.img", "vmlinuz", "initrd.img"}) Touch(f, 0644);
    o_.qemu = dir_ + "/qemu";
    o_.qemu_img = dir_ + "/qemu-img";
    o_.guest_dir = dir_;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Touch(const std::string& name, mode_t mode) {
    const std::string p = dir_ + "/" + name;
    int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, mode);
    ASSERT_GE(fd, 0) << p;
    ::close(fd);
    ASSERT_EQ(::chmod(p.c_str(), mode), 0);
  }

  std::string dir_;
  VmOptions o_;
};

TEST_F(VmHostTest, AllThereIsOk) { EXPECT_OK(CheckVmHost(o_)); }

TEST_F(VmHostTest, MissingGuestFileIsAFailedPreconditionNamingIt) {
  for (const char* f : {"system.erofs", "upper.img", "vmlinuz", "initrd.img"}) {
    SCOPED_TRACE(f);
    const std::string p = dir_ + "/" + f;
    ASSERT_EQ(::unlink(p.c_str()), 0);
    EXPECT_THAT(CheckVmHost(o_), StatusIs(absl::StatusCode::kFailedPrecondition,
                                          AllOf(HasSubstr(std::string("guest ") + f), HasSubstr(p),
                                                HasSubstr("No such file"), HasSubstr("build-guest.sh"))));
    Touch(f, 0644);
  }
}

TEST_F(VmHostTest, MissingQemuIsNamed) {
  ASSERT_EQ(::unlink(o_.qemu_img.c_str()), 0);
  EXPECT_THAT(CheckVmHost(o_), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("qemu-img")));
}

TEST_F(VmHostTest, KernelAndInitrdMustBeReadableByQemusUid) {
  for (const char* f : {"vmlinuz", "initrd.img"}) {
    SCOPED_TRACE(f);
    Touch(f, 0600);
    EXPECT_THAT(CheckVmHost(o_),
                StatusIs(absl::StatusCode::kFailedPrecondition, AllOf(HasSubstr(f), HasSubstr("readable by all"))));
    Touch(f, 0644);
  }
  // The disks are passed to QEMU as open fds: their modes do not matter.
  Touch("system.erofs", 0600);
  Touch("upper.img", 0600);
  EXPECT_OK(CheckVmHost(o_));
}

TEST_F(VmHostTest, UnknownAcceleratorIsRefusedByName) {
  o_.accel = "hvf";
  EXPECT_THAT(CheckVmHost(o_), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"hvf\"")));
}

}  // namespace
}  // namespace warren::runtime
