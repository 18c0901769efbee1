#include "net/policy.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "status_matchers.h"

namespace warren::net {
namespace {

using ::testing::HasSubstr;

TEST(PolicyTest, HostNamesAreEntries) {
  ASSERT_OK_AND_ASSIGN(Rule r, ParseRule("tcp:PyPI.org:443"));
  EXPECT_EQ(r.host, "pypi.org");
  EXPECT_EQ(r.text, "tcp:pypi.org:443");
  ASSERT_OK_AND_ASSIGN(Rule w, ParseRule("*.pythonhosted.org"));
  EXPECT_EQ(w.host, "*.pythonhosted.org");
  for (const char* bad : {"bad_name.org", "-a.org", "a..org", "*.org.", "1.2.3.4x/8"}) {
    EXPECT_THAT(ParseRule(bad).status().message(), HasSubstr("host name")) << bad;
  }
}

TEST(PolicyTest, NameMatching) {
  EXPECT_TRUE(NameMatches("pypi.org", "pypi.org"));
  EXPECT_FALSE(NameMatches("pypi.org", "evilpypi.org"));
  EXPECT_TRUE(NameMatches("*.example.com", "a.b.example.com"));
  EXPECT_FALSE(NameMatches("*.example.com", "example.com"));
  EXPECT_FALSE(NameMatches("*.example.com", "badexample.com"));
}

TEST(PolicyTest, DenyWinsForNames) {
  ASSERT_OK_AND_ASSIGN(NetworkPolicy p, ParsePolicy({"*.test", "10.0.0.0/8"}, {"npm.test"}));
  EXPECT_TRUE(p.AllowsName("pypi.test"));
  EXPECT_FALSE(p.AllowsName("npm.test"));
  EXPECT_FALSE(p.AllowsName("pypi.org"));
  EXPECT_TRUE(p.HasNames());
}

TEST(PolicyTest, PresetsExpandAndKeepTheirName) {
  Presets presets;
  ASSERT_OK(ParsePreset("pypi=tcp:203.0.113.10:443,tcp:pypi.test:443", &presets));
  EXPECT_THAT(ParsePreset("pypi=203.0.113.11", &presets).message(), HasSubstr("twice"));
  EXPECT_THAT(ParsePreset("Bad=203.0.113.11", &presets).message(), HasSubstr("NAME=ENTRY"));
  EXPECT_THAT(ParsePreset("npm=", &presets).message(), HasSubstr("no entries"));
  EXPECT_THAT(ParsePreset("npm=300.1.1.1", &presets).message(), HasSubstr("npm"));
  ASSERT_OK_AND_ASSIGN(NetworkPolicy p, ParsePolicy({"pypi", "198.51.100.0/24"}, {}, presets));
  EXPECT_EQ(p.AllowText(), (std::vector<std::string>{"pypi", "198.51.100.0/24"}));
  ASSERT_EQ(p.allow.size(), 3u);
  EXPECT_EQ(p.allow[1].host, "pypi.test");
  EXPECT_THAT(ParsePolicy({"npm"}, {}, presets).status().message(),
              HasSubstr("'npm' is no preset of this node (its presets: pypi)"));
}

TEST(PolicyTest, ChainOrder) {
  ASSERT_OK_AND_ASSIGN(NetworkPolicy p, ParsePolicy({"tcp:pypi.test:443", "169.254.169.254/32", "0.0.0.0/0"},
                                                    {"bad.test", "203.0.113.66"}));
  Cidr range{0x0ad50000, 24};  // 10.213.0.0/24
  const std::vector<std::string> rules = CompileChain(p, 0x0ad50002, range, "protected", "rf_0", "conn_0", "names_0");
  const std::vector<std::string> want = {
      "ip saddr != 10.213.0.2 drop",
      "ct state new counter name \"conn_0\"",
      "fib daddr type local goto rf_0",
      "meta nfproto ipv6 goto rf_0",
      "ip daddr 203.0.113.66/32 goto rf_0",  // the denied name has no rule: it never resolves
      "ip daddr 169.254.169.254/32 accept",  // explicit, inside a protected range
      "ip daddr @protected goto rf_0",       // before any name or wide allow
      "ip daddr @names_0 tcp dport 443 accept",
      "ip daddr 0.0.0.0/0 accept",
      "goto rf_0",
  };
  EXPECT_EQ(rules, want);
}

}  // namespace
}  // namespace warren::net
