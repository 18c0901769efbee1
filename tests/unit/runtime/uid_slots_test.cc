#include "runtime/container/uid_slots.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "status_matchers.h"

namespace warren::runtime {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kBase = 1000000;
constexpr uint32_t kRange = 65536;

class UidSlotsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/warren-uid-slots-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    locks_ = dir_ + "/locks";
    owner_a_ = dir_ + "/state-a";
    owner_b_ = dir_ + "/state-b";
    fs::create_directories(owner_a_);
    fs::create_directories(owner_b_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<UidSlots> Open(const std::string& owner, uint32_t count = 8) {
    auto s = UidSlots::Open(locks_, owner, count, kBase, kRange);
    EXPECT_OK(s);
    return s.ok() ? std::move(*s) : nullptr;
  }
  std::string LockContent(uint32_t k) {
    std::ifstream in(locks_ + "/" + std::to_string(kBase + k * kRange));
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }

  std::string dir_, locks_, owner_a_, owner_b_;
};

// Two daemons (two owners) never hand out the same range.
TEST_F(UidSlotsTest, TwoOwnersGetDisjointSlots) {
  auto a = Open(owner_a_);
  auto b = Open(owner_b_);
  std::set<uint32_t> seen;
  for (int i = 0; i < 4; ++i) {
    StatusOr<uint32_t> ka = a->Take();
    StatusOr<uint32_t> kb = b->Take();
    ASSERT_OK(ka);
    ASSERT_OK(kb);
    EXPECT_TRUE(seen.insert(*ka).second) << *ka;
    EXPECT_TRUE(seen.insert(*kb).second) << *kb;
  }
  // All 8 taken between them: both are full.
  EXPECT_THAT(a->Take(), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(b->Take(), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(LockContent(0), owner_a_ + "\n");
}

// A dead daemon's sandboxes keep their ranges: nobody else takes them, and
// the same owner (a restart) re-takes them.
TEST_F(UidSlotsTest, ClaimsOutliveTheDaemonUntilItsOwnerComesBack) {
  auto a = Open(owner_a_);
  ASSERT_EQ(*a->Take(), 0u);
  ASSERT_EQ(*a->Take(), 1u);
  a->Release(1);
  a.reset();  // the daemon dies: its locks go, slot 0's claim stays
  auto b = Open(owner_b_);
  EXPECT_FALSE(b->TakeSpecific(0));
  EXPECT_EQ(*b->Take(), 1u);  // released by a: free for anybody
  auto a2 = Open(owner_a_);
  EXPECT_TRUE(a2->TakeSpecific(0));   // the restart re-adopts it
  EXPECT_FALSE(a2->TakeSpecific(0));  // once
  EXPECT_FALSE(a2->TakeSpecific(1));  // b's, live
  EXPECT_EQ(*a2->Take(), 2u);
  // A slot released while nobody held it (its sandbox died meanwhile).
  a2.reset();
  auto a3 = Open(owner_a_);
  a3->Release(2);
  EXPECT_EQ(LockContent(2), "");
  EXPECT_EQ(*b->Take(), 2u);
}

// A claim whose owner's state dir is gone can never be re-adopted: it is free.
TEST_F(UidSlotsTest, ClaimOfAVanishedOwnerIsFree) {
  auto a = Open(owner_a_);
  ASSERT_EQ(*a->Take(), 0u);
  a.reset();
  fs::remove_all(owner_a_);
  auto b = Open(owner_b_);
  EXPECT_EQ(*b->Take(), 0u);
  EXPECT_EQ(LockContent(0), owner_b_ + "\n");
}

TEST_F(UidSlotsTest, ProcessLocalWithoutALockDir) {
  auto s = UidSlots::Open("", "", 2, kBase, kRange);
  ASSERT_OK(s);
  EXPECT_EQ(*(*s)->Take(), 0u);
  EXPECT_EQ(*(*s)->Take(), 1u);
  EXPECT_THAT((*s)->Take(), StatusIs(absl::StatusCode::kResourceExhausted));
  (*s)->Release(0);
  EXPECT_EQ(*(*s)->Take(), 0u);
  EXPECT_EQ((*s)->HostUid(1), kBase + kRange);
  EXPECT_FALSE(fs::exists(locks_));
}

TEST_F(UidSlotsTest, BadOptions) {
  EXPECT_THAT(UidSlots::Open(locks_, "relative", 4, kBase, kRange), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(UidSlots::Open(locks_, owner_a_, 70000, kBase, kRange), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(UidSlots::Open(locks_, owner_a_, 0, kBase, kRange), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace warren::runtime
