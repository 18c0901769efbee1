// gtest assertions and gmock matchers for absl::Status and absl::StatusOr<T>
// (Debian 12's absl predates absl/status/status_matchers.h; the names and
// behaviour follow it):
//
//   ASSERT_OK(expr);  EXPECT_OK(expr);        expr is OK, else the status is printed
//   ASSERT_OK_AND_ASSIGN(auto x, expr);      asserts OK, then moves the value into x
//   EXPECT_THAT(expr, IsOk());
//   EXPECT_THAT(expr, StatusIs(absl::StatusCode::kNotFound));
//   EXPECT_THAT(expr, StatusIs(absl::StatusCode::kNotFound, HasSubstr("no sandbox")));
//   EXPECT_THAT(expr, IsOkAndHolds(Eq(3)));
//
// `expr` may be an absl::Status, an absl::StatusOr<T>, or any status type with
// ok()/error_code()/error_message() (grpc::Status; its codes are absl's).
// The matchers are declared in namespace warren::status_testing and made
// visible in namespace warren, so tests inside warren::* use them unqualified.
#pragma once

#include <concepts>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace warren::status_testing {
namespace internal {

inline const absl::Status& ToStatus(const absl::Status& s) { return s; }

template <typename T>
const absl::Status& ToStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

// grpc::Status and the like, without including grpc here.
template <typename T>
  requires requires(const T& s) {
             { s.ok() } -> std::convertible_to<bool>;
             s.error_code();
             s.error_message();
           }
absl::Status ToStatus(const T& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

template <typename T>
::testing::AssertionResult AssertOk(const char* text, const T& value) {
  const absl::Status& s = ToStatus(value);
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << text << " is not OK: " << s;
}

template <typename T>
class IsOkImpl : public ::testing::MatcherInterface<T> {
 public:
  void DescribeTo(std::ostream* os) const override { *os << "is OK"; }
  void DescribeNegationTo(std::ostream* os) const override { *os << "is not OK"; }
  bool MatchAndExplain(T actual, ::testing::MatchResultListener* listener) const override {
    const absl::Status& s = ToStatus(actual);
    if (!s.ok()) *listener << "which has status " << s;
    return s.ok();
  }
};

class IsOkMatcher {
 public:
  template <typename T>
  operator ::testing::Matcher<T>() const {  // NOLINT(google-explicit-constructor)
    return ::testing::Matcher<T>(new IsOkImpl<const T&>());
  }
};

template <typename T>
class StatusIsImpl : public ::testing::MatcherInterface<T> {
 public:
  StatusIsImpl(::testing::Matcher<absl::StatusCode> code, ::testing::Matcher<const std::string&> message)
      : code_(std::move(code)), message_(std::move(message)) {}

  void DescribeTo(std::ostream* os) const override {
    *os << "has a status code that ";
    code_.DescribeTo(os);
    *os << ", and has a message that ";
    message_.DescribeTo(os);
  }
  void DescribeNegationTo(std::ostream* os) const override {
    *os << "has a status code that ";
    code_.DescribeNegationTo(os);
    *os << ", or has a message that ";
    message_.DescribeNegationTo(os);
  }
  bool MatchAndExplain(T actual, ::testing::MatchResultListener* listener) const override {
    const absl::Status& s = ToStatus(actual);
    *listener << "which has status " << s;
    ::testing::StringMatchResultListener inner;
    if (!code_.MatchAndExplain(s.code(), &inner)) {
      if (!inner.str().empty()) *listener << ", whose code " << inner.str();
      return false;
    }
    const std::string message(s.message());
    if (!message_.MatchAndExplain(message, &inner)) {
      if (!inner.str().empty()) *listener << ", whose message " << inner.str();
      return false;
    }
    return true;
  }

 private:
  ::testing::Matcher<absl::StatusCode> code_;
  ::testing::Matcher<const std::string&> message_;
};

class StatusIsMatcher {
 public:
  StatusIsMatcher(::testing::Matcher<absl::StatusCode> code, ::testing::Matcher<const std::string&> message)
      : code_(std::move(code)), message_(std::move(message)) {}

  template <typename T>
  operator ::testing::Matcher<T>() const {  // NOLINT(google-explicit-constructor)
    return ::testing::Matcher<T>(new StatusIsImpl<const T&>(code_, message_));
  }

 private:
  ::testing::Matcher<absl::StatusCode> code_;
  ::testing::Matcher<const std::string&> message_;
};

template <typename StatusOrT>
class IsOkAndHoldsImpl : public ::testing::MatcherInterface<StatusOrT> {
 public:
  using Value = typename std::remove_cvref_t<StatusOrT>::value_type;

  template <typename InnerMatcher>
  explicit IsOkAndHoldsImpl(const InnerMatcher& inner) : inner_(::testing::SafeMatcherCast<const Value&>(inner)) {}

  void DescribeTo(std::ostream* os) const override {
    *os << "is OK and has a value that ";
    inner_.DescribeTo(os);
  }
  void DescribeNegationTo(std::ostream* os) const override {
    *os << "is not OK, or has a value that ";
    inner_.DescribeNegationTo(os);
  }
  bool MatchAndExplain(StatusOrT actual, ::testing::MatchResultListener* listener) const override {
    if (!actual.ok()) {
      *listener << "which has status " << actual.status();
      return false;
    }
    ::testing::StringMatchResultListener inner;
    const bool matches = inner_.MatchAndExplain(*actual, &inner);
    if (!inner.str().empty()) *listener << "which contains a value " << inner.str();
    return matches;
  }

 private:
  ::testing::Matcher<const Value&> inner_;
};

template <typename InnerMatcher>
class IsOkAndHoldsMatcher {
 public:
  explicit IsOkAndHoldsMatcher(InnerMatcher inner) : inner_(std::move(inner)) {}

  template <typename StatusOrT>
  operator ::testing::Matcher<StatusOrT>() const {  // NOLINT(google-explicit-constructor)
    return ::testing::Matcher<StatusOrT>(new IsOkAndHoldsImpl<const StatusOrT&>(inner_));
  }

 private:
  InnerMatcher inner_;
};

}  // namespace internal

// Matches an OK absl::Status, an OK absl::StatusOr<T> or an OK grpc::Status.
inline internal::IsOkMatcher IsOk() { return {}; }

// Matches a status (or a StatusOr's status) whose code matches `code` and
// whose message matches `message` (anything when omitted).
template <typename CodeMatcher, typename MessageMatcher>
internal::StatusIsMatcher StatusIs(CodeMatcher&& code, MessageMatcher&& message) {
  return internal::StatusIsMatcher(::testing::MatcherCast<absl::StatusCode>(std::forward<CodeMatcher>(code)),
                                   ::testing::MatcherCast<const std::string&>(std::forward<MessageMatcher>(message)));
}
template <typename CodeMatcher>
internal::StatusIsMatcher StatusIs(CodeMatcher&& code) {
  return StatusIs(std::forward<CodeMatcher>(code), ::testing::_);
}

// Matches an OK absl::StatusOr<T> whose value matches `inner`.
template <typename InnerMatcher>
internal::IsOkAndHoldsMatcher<std::decay_t<InnerMatcher>> IsOkAndHolds(InnerMatcher&& inner) {
  return internal::IsOkAndHoldsMatcher<std::decay_t<InnerMatcher>>(std::forward<InnerMatcher>(inner));
}

}  // namespace warren::status_testing

namespace warren {
using ::warren::status_testing::IsOk;
using ::warren::status_testing::IsOkAndHolds;
using ::warren::status_testing::StatusIs;
}  // namespace warren

#define WARREN_STATUS_MATCHERS_CONCAT_INNER_(a, b) a##b
#define WARREN_STATUS_MATCHERS_CONCAT_(a, b) WARREN_STATUS_MATCHERS_CONCAT_INNER_(a, b)

// Fails the test (fatally / not) unless `expr` is OK; prints the status.
// Further context may be streamed: ASSERT_OK(s) << "while creating " << id;
#define ASSERT_OK(expr) ASSERT_PRED_FORMAT1(::warren::status_testing::internal::AssertOk, expr)
#define EXPECT_OK(expr) EXPECT_PRED_FORMAT1(::warren::status_testing::internal::AssertOk, expr)

// ASSERT_OK_AND_ASSIGN(lhs, rexpr): evaluates rexpr (an absl::StatusOr<T>),
// fails the test fatally with its status unless OK, else moves the value into
// lhs, which may be a declaration (`auto x`, `const auto& [a, b]`).
#define ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  WARREN_ASSERT_OK_AND_ASSIGN_IMPL_(WARREN_STATUS_MATCHERS_CONCAT_(warren_statusor_, __LINE__), lhs, rexpr)
// statusor is a name and lhs may be a declaration: neither can be parenthesized.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define WARREN_ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, rexpr)                                               \
  auto statusor = (rexpr);                                                                                    \
  if (::testing::AssertionResult warren_ok_ = ::warren::status_testing::internal::AssertOk(#rexpr, statusor); \
      !warren_ok_)                                                                                            \
    GTEST_FATAL_FAILURE_(warren_ok_.message());                                                               \
  lhs = std::move(statusor).value()
// NOLINTEND(bugprone-macro-parentheses)
