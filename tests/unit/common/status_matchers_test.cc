#include "status_matchers.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace warren {
namespace {

using ::testing::Eq;
using ::testing::HasSubstr;
using ::testing::Not;

// Stands in for grpc::Status (same accessors), without linking grpc.
struct FakeGrpcStatus {
  int code = 0;
  std::string msg;
  bool ok() const { return code == 0; }
  int error_code() const { return code; }
  std::string error_message() const { return msg; }
};

absl::StatusOr<int> Three() { return 3; }
absl::StatusOr<int> Missing() { return absl::NotFoundError("no sandbox sb-1"); }

TEST(StatusMatchersTest, OkPasses) {
  ASSERT_OK(absl::OkStatus());
  EXPECT_OK(absl::OkStatus());
  ASSERT_OK(Three());
  EXPECT_OK(FakeGrpcStatus{});
  EXPECT_THAT(absl::OkStatus(), IsOk());
  EXPECT_THAT(Three(), IsOk());
  EXPECT_THAT(Missing(), Not(IsOk()));
  EXPECT_THAT((FakeGrpcStatus{5, "x"}), Not(IsOk()));
}

TEST(StatusMatchersTest, FailurePrintsTheStatus) {
  EXPECT_NONFATAL_FAILURE(EXPECT_OK(absl::InternalError("boom")), "INTERNAL: boom");
  EXPECT_FATAL_FAILURE(ASSERT_OK(Missing()), "NOT_FOUND: no sandbox sb-1");
  EXPECT_NONFATAL_FAILURE(EXPECT_OK((FakeGrpcStatus{5, "gone"})), "NOT_FOUND: gone");
  EXPECT_NONFATAL_FAILURE(EXPECT_THAT(Missing(), IsOk()), "which has status NOT_FOUND: no sandbox sb-1");
  EXPECT_NONFATAL_FAILURE(EXPECT_OK(absl::InternalError("a")) << "context 42", "context 42");
}

TEST(StatusMatchersTest, StatusIs) {
  EXPECT_THAT(Missing(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(Missing().status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("sb-1")));
  EXPECT_THAT(absl::OkStatus(), StatusIs(absl::StatusCode::kOk));
  EXPECT_THAT((FakeGrpcStatus{3, "bad"}), StatusIs(absl::StatusCode::kInvalidArgument, "bad"));
  EXPECT_THAT(Missing(), Not(StatusIs(absl::StatusCode::kInternal)));
  EXPECT_THAT(Missing(), Not(StatusIs(absl::StatusCode::kNotFound, HasSubstr("sb-2"))));
  EXPECT_NONFATAL_FAILURE(EXPECT_THAT(Missing(), StatusIs(absl::StatusCode::kInternal)),
                          "which has status NOT_FOUND: no sandbox sb-1");
}

TEST(StatusMatchersTest, IsOkAndHolds) {
  EXPECT_THAT(Three(), IsOkAndHolds(3));
  EXPECT_THAT(Three(), IsOkAndHolds(Eq(3)));
  EXPECT_THAT(Three(), Not(IsOkAndHolds(4)));
  EXPECT_THAT(Missing(), Not(IsOkAndHolds(3)));
  EXPECT_NONFATAL_FAILURE(EXPECT_THAT(Missing(), IsOkAndHolds(3)), "NOT_FOUND: no sandbox sb-1");
}

void AssignFromMissing() {
  ASSERT_OK_AND_ASSIGN(int w, Missing());
  ADD_FAILURE() << "not reached " << w;
}

TEST(StatusMatchersTest, AssertOkAndAssign) {
  ASSERT_OK_AND_ASSIGN(int v, Three());
  EXPECT_EQ(v, 3);
  ASSERT_OK_AND_ASSIGN(auto s, absl::StatusOr<std::string>("x"));
  EXPECT_EQ(s, "x");
  EXPECT_FATAL_FAILURE(AssignFromMissing(), "Missing() is not OK: NOT_FOUND: no sandbox sb-1");
}

}  // namespace
}  // namespace warren
