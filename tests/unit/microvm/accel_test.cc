#include <chrono>
#include <future>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/microvm/microvm_backend.h"
#include "status_matchers.h"

namespace warren::runtime {
namespace {

using ::testing::HasSubstr;

TEST(ChooseAccelTest, ConfiguredAcceleratorIsReadyAtOnce) {
  for (const char* a : {"tcg", "kvm"}) {
    ASSERT_OK_AND_ASSIGN(std::shared_future<AccelChoice> f, ChooseAccel(a));
    ASSERT_EQ(f.wait_for(std::chrono::seconds(0)), std::future_status::ready);
    EXPECT_EQ(f.get().accel, a);
    EXPECT_THAT(f.get().reason, HasSubstr(std::string("accel=") + a));
  }
}

TEST(ChooseAccelTest, UnknownAcceleratorIsRefusedByName) {
  StatusOr<std::shared_future<AccelChoice>> f = ChooseAccel("hvf");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(f.status().message(), HasSubstr("\"hvf\""));
}

TEST(ChooseAccelTest, AutoReturnsBeforeTheProbeEndsAndAnswersWithinItsDeadline) {
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(std::shared_future<AccelChoice> f, ChooseAccel("auto"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(200));
  ASSERT_EQ(f.wait_for(std::chrono::seconds(3)), std::future_status::ready);
  EXPECT_TRUE(f.get().accel == "kvm" || f.get().accel == "tcg") << f.get().accel;
  EXPECT_THAT(f.get().reason, HasSubstr("KVM probe: "));
}

}  // namespace
}  // namespace warren::runtime
