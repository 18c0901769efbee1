// What every jailed QEMU is given (runtime/microvm/qemu.h, shared with the
// vm backend): files as numbered fds, fd sets naming them, the seccomp
// filter, option values escaped.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/microvm/qemu.h"
#include "runtime/microvm/template.h"
#include "status_matchers.h"

namespace warren::runtime::microvm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

// The value after `flag`s n-th occurrence ("" if none).
std::string After(const std::vector<std::string>& a, const std::string& flag, int n = 0) {
  for (size_t i = 0; i + 1 < a.size(); ++i) {
    if (a[i] == flag && n-- == 0) return a[i + 1];
  }
  return "";
}

TEST(QemuFilesTest, NumbersFilesFromTheFirstTargetOn) {
  QemuFiles files(kFirstFileFd);
  ASSERT_OK_AND_ASSIGN(int a, files.Open("/dev/null", O_RDONLY));
  ASSERT_OK_AND_ASSIGN(int b, files.Open("/dev/null", O_WRONLY));
  EXPECT_EQ(a, kFirstFileFd);
  EXPECT_EQ(b, kFirstFileFd + 1);
  ASSERT_EQ(files.fds().size(), 2u);
  EXPECT_EQ(files.fds()[1].second, b);
  // The fds are open, close-on-exec, with the asked access mode.
  EXPECT_EQ(::fcntl(files.fds()[1].first, F_GETFL) & O_ACCMODE, O_WRONLY);
  EXPECT_NE(::fcntl(files.fds()[1].first, F_GETFD) & FD_CLOEXEC, 0);
  std::vector<UniqueFd> owned;
  std::vector<std::pair<int, int>> fds;
  const int first = files.fds()[0].first;
  files.MoveTo(&owned, &fds);
  EXPECT_TRUE(files.fds().empty());
  ASSERT_EQ(owned.size(), 2u);
  EXPECT_THAT(fds, ElementsAre(Pair(first, a), Pair(owned[1].get(), b)));
}

TEST(QemuFilesTest, AMissingFileIsNamed) {
  QemuFiles files(kFirstFileFd);
  EXPECT_THAT(files.Open("/nonexistent/disk.img", O_RDONLY),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/disk.img")));
  EXPECT_TRUE(files.fds().empty());
}

TEST(QemuArgvTest, FilesAsFdSetsAndTheSeccompFilter) {
  VmConfig c;
  c.kernel = "/g/vmlinuz";
  c.initrd = "/g/initramfs.cpio";
  c.layer_files = {"/l/a,b.erofs"};
  c.disk = "/d/x.img";
  c.console_log = "/r/console.log";
  c.name = "warren:a,b";
  c.layer_fds = {10};
  c.disk_fd = 11;
  c.disk_ro_fd = 12;
  c.console_fd = 13;
  c.kernel_fd = 14;
  c.initrd_fd = 15;
  std::vector<std::string> a = QemuArgv("/usr/bin/qemu-system-x86_64", c);
  EXPECT_EQ(After(a, "-sandbox"), kQemuSandbox);
  EXPECT_EQ(After(a, "-kernel"), "/proc/self/fd/14");
  EXPECT_EQ(After(a, "-initrd"), "/proc/self/fd/15");
  EXPECT_EQ(After(a, "-name"), "warren:a,,b,debug-threads=on");
  EXPECT_THAT(After(a, "-drive", 0), HasSubstr("file=/dev/fdset/10,"));
  EXPECT_THAT(After(a, "-drive", 1), HasSubstr("file=/dev/fdset/11,"));
  EXPECT_EQ(After(a, "-chardev"), "file,id=console,path=/dev/fdset/13");
  std::vector<std::string> sets;
  for (size_t i = 0; i + 1 < a.size(); ++i) {
    if (a[i] == "-add-fd") sets.push_back(a[i + 1]);
  }
  // The disk's read-only fd joins the disk's set.
  EXPECT_THAT(sets, ElementsAre("fd=13,set=13", "fd=10,set=10", "fd=11,set=11", "fd=12,set=11"));
  // No host path QEMU's uid would have to open.
  for (const std::string& arg : a) {
    EXPECT_EQ(arg.find("/d/x.img"), std::string::npos) << arg;
    EXPECT_EQ(arg.find("/l/a"), std::string::npos) << arg;
  }
}

// An idle TCG guest leaves the periodic tick only on a clocksource valid
// for high-resolution timers (the TSC, kept by tsc=reliable from the
// watchdog) with a LAPIC timer that runs in idle (ARAT: -cpu max has it,
// qemu64 does not). bench/microvm/README.md, "Idle CPU".
TEST(QemuArgvTest, TcgGuestKeepsItsTscAndAnAlwaysRunningApicTimer) {
  VmConfig c;
  c.kernel = "/g/vmlinux";
  c.initrd = "/g/initramfs.cpio";
  c.layer_files = {"/l/a.erofs"};
  c.disk = "/d/x.img";
  c.console_log = "/r/console.log";
  c.tsc_khz = 2596140;
  std::vector<std::string> a = QemuArgv("/usr/bin/qemu-system-x86_64", c);
  EXPECT_THAT(After(a, "-append"), HasSubstr(" tsc_early_khz=2596140 tsc=reliable"));
  EXPECT_EQ(After(a, "-cpu"), "max");
  c.restore = true;  // a clone: no kernel boot, no command line
  EXPECT_EQ(After(QemuArgv("/usr/bin/qemu-system-x86_64", c), "-append"), "");
}

TEST(TemplateTest, ClonesMayNotOutgrowThePlaceholders) {
  char path[] = "/tmp/fits-template-XXXXXX";
  int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 1 << 20), 0);
  ::close(fd);
  EXPECT_TRUE(FitsTemplate({path}, 1024));
  EXPECT_TRUE(FitsTemplate({path}, kTemplateDiskBytes >> 20));
  EXPECT_FALSE(FitsTemplate({path}, (kTemplateDiskBytes >> 20) + 1));
  EXPECT_FALSE(FitsTemplate({path, "/nonexistent/layer.erofs"}, 1024));
  ::unlink(path);
}

TEST(QemuArgvTest, OptionValuesDoubleCommas) {
  EXPECT_EQ(QemuOptValue("/a,b,,c"), "/a,,b,,,,c");
  EXPECT_EQ(QemuOptValue("plain"), "plain");
  EXPECT_THAT(AddFdArgs(12, 11), ElementsAre("-add-fd", "fd=12,set=11"));
  EXPECT_EQ(FdSetPath(11), "/dev/fdset/11");
}

}  // namespace
}  // namespace warren::runtime::microvm
