#include "runtime/microvm/kvm_probe.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <iostream>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "status_matchers.h"

namespace warren::microvm {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

bool KvmOpens() {
  int fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;
  close(fd);
  return true;
}

bool HasModule(const char* name) { return access((std::string("/sys/module/") + name).c_str(), F_OK) == 0; }

// No child of the test is left running or unreaped.
void ExpectNoChildren() {
  errno = 0;
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

TEST(KvmProbeTest, AccelNames) {
  EXPECT_STREQ(AccelName(Accel::kKvm), "kvm");
  EXPECT_STREQ(AccelName(Accel::kTcg), "tcg");
}

TEST(KvmProbeTest, MissingDeviceAnswersTcgNamingThePath) {
  KvmProbeOptions o;
  o.device = "/nonexistent-dir/kvm";
  ASSERT_OK_AND_ASSIGN(KvmProbeResult r, ProbeKvm(o));
  EXPECT_EQ(r.accel, Accel::kTcg);
  EXPECT_FALSE(r.timed_out);
  EXPECT_THAT(r.reason, HasSubstr("open(/nonexistent-dir/kvm)"));
  EXPECT_THAT(r.reason, HasSubstr("No such file"));
  ExpectNoChildren();
}

TEST(KvmProbeTest, DeviceThatIsNotKvmAnswersTcgNamingTheIoctl) {
  KvmProbeOptions o;
  o.device = "/dev/null";
  ASSERT_OK_AND_ASSIGN(KvmProbeResult r, ProbeKvm(o));
  EXPECT_EQ(r.accel, Accel::kTcg);
  EXPECT_THAT(r.reason, HasSubstr("KVM_GET_API_VERSION"));
  ExpectNoChildren();
}

TEST(KvmProbeTest, BadOptionsAreInvalidArgument) {
  KvmProbeOptions o;
  o.loop_iterations = 0;
  EXPECT_THAT(ProbeKvm(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("loop_iterations")));
  o.loop_iterations = 1u << 31;
  EXPECT_THAT(ProbeKvm(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("loop_iterations")));
  o = KvmProbeOptions();
  o.deadline = milliseconds(0);
  EXPECT_THAT(ProbeKvm(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("deadline")));
}

// A short guest runs to its port write and HLT: the ioctl path is real.
TEST(KvmProbeTest, ShortGuestRunsToHalt) {
  if (!KvmOpens()) GTEST_SKIP() << "/dev/kvm cannot be opened here";
  KvmProbeOptions o;
  o.loop_iterations = 1000;
  o.deadline = milliseconds(10000);
  o.max_guest_time = milliseconds(10000);
  ASSERT_OK_AND_ASSIGN(KvmProbeResult r, ProbeKvm(o));
  EXPECT_EQ(r.accel, Accel::kKvm) << r.reason;
  EXPECT_GT(r.guest_time.count(), 0);
  EXPECT_THAT(r.reason, HasSubstr("ran 1000 loop iterations"));
  ExpectNoChildren();
}

// A guest too long for the deadline is killed at it, and the call returns
// soon after (never hangs), leaving no child behind.
TEST(KvmProbeTest, DeadlineKillsTheGuest) {
  if (!KvmOpens()) GTEST_SKIP() << "/dev/kvm cannot be opened here";
  KvmProbeOptions o;
  o.loop_iterations = (1u << 31) - 1;  // seconds even on hardware KVM
  o.deadline = milliseconds(100);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(KvmProbeResult r, ProbeKvm(o));
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, milliseconds(1500));
  EXPECT_EQ(r.accel, Accel::kTcg);
  EXPECT_TRUE(r.timed_out);
  EXPECT_THAT(r.reason, HasSubstr("within 100 ms (killed)"));
  ExpectNoChildren();
}

// The probe's child does not keep the caller's fds open: a pipe whose write
// end the caller closes reads EOF while the child still runs its guest.
TEST(KvmProbeTest, ChildHoldsNoCallerFds) {
  if (!KvmOpens()) GTEST_SKIP() << "/dev/kvm cannot be opened here";
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  KvmProbeOptions o;
  o.loop_iterations = (1u << 31) - 1;
  o.deadline = milliseconds(1500);
  std::thread probe([&] { EXPECT_TRUE(ProbeKvm(o).ok()); });
  std::this_thread::sleep_for(milliseconds(300));  // the child is in its guest now
  close(p[1]);
  pollfd pfd = {p[0], POLLIN, 0};
  const int n = poll(&pfd, 1, 500);
  const bool eof = n == 1 && (pfd.revents & POLLHUP) != 0;
  probe.join();
  close(p[0]);
  EXPECT_TRUE(eof) << "the write end stayed open in the probe's child";
  ExpectNoChildren();
}

// The default probe answers within its deadline (plus the reap bound).
TEST(KvmProbeTest, DefaultProbeIsBounded) {
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(KvmProbeResult r, ProbeKvm());
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, KvmProbeOptions().deadline + milliseconds(2500));
  EXPECT_FALSE(r.reason.empty());
  RecordProperty("accel", AccelName(r.accel));
  RecordProperty("reason", r.reason);
  std::cout << "kvm probe on this host: " << AccelName(r.accel) << ": " << r.reason << "\n";
  ExpectNoChildren();
}

// On a PVM host (kvm_pvm is the only KVM vendor module), a stock guest runs in
// emulation: QEMU -accel kvm never gets the Debian kernel out of its
// decompressor there. The probe must say tcg and name the cause.
TEST(KvmProbeTest, PvmHostAnswersTcg) {
  if (!HasModule("kvm_pvm") || HasModule("kvm_intel") || HasModule("kvm_amd") || !KvmOpens())
    GTEST_SKIP() << "not a PVM-only KVM host";
  ASSERT_OK_AND_ASSIGN(KvmProbeResult r, ProbeKvm());
  EXPECT_EQ(r.accel, Accel::kTcg) << r.reason;
  EXPECT_THAT(r.reason, HasSubstr("kvm_pvm is loaded"));
  ExpectNoChildren();
}

}  // namespace
}  // namespace warren::microvm
