#include "net/policy.h"

#include <algorithm>
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
  ASSERT_OK_AND_ASSIGN(NetworkPolicy p, ParsePolicy({"*.test", "203.0.113.0/24"}, {"npm.test"}));
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

PolicyChecks In(const Cidr& sandbox_range) {
  PolicyChecks c;
  c.sandbox_range = sandbox_range;
  return c;
}

TEST(PolicyTest, CallersEntryInsideAProtectedRangeIsRefused) {
  const Cidr range{0xcb007100, 24};  // 203.0.113.0/24: a sandbox range outside the fixed ones
  for (auto [entry, prot] :
       {std::pair{"169.254.169.254", "169.254.0.0/16 (link-local, incl. the cloud metadata"},
        std::pair{"tcp:10.1.2.0/24:443", "10.0.0.0/8 (private)"},
        std::pair{"192.168.0.0/16", "192.168.0.0/16 (private)"}, std::pair{"127.0.0.1", "127.0.0.0/8 (loopback)"},
        std::pair{"203.0.113.6/31", "203.0.113.0/24 (this node's sandboxes)"}}) {
    const Status s = ParsePolicy({"198.51.100.0/24", entry}, {}, {}, In(range)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << entry;
    EXPECT_THAT(s.message(),
                HasSubstr(std::string("network.allow[1]: '") + entry + "' lies inside the protected range " + prot))
        << entry;
    EXPECT_THAT(s.message(), HasSubstr("--net-preset")) << entry;
  }
  // Wider than a protected range: accepted, the protected parts stay closed.
  ASSERT_OK(ParsePolicy({"0.0.0.0/0", "128.0.0.0/1"}, {}, {}, In(range)).status());
  // Denying a protected range is always fine.
  ASSERT_OK(ParsePolicy({}, {"169.254.169.254"}, {}, In(range)).status());
  // A preset the operator defined opens one.
  Presets presets;
  ASSERT_OK(ParsePreset("meta=tcp:169.254.169.254:80", &presets));
  ASSERT_OK_AND_ASSIGN(NetworkPolicy p, ParsePolicy({"meta"}, {}, presets, In(range)));
  ASSERT_EQ(p.allow.size(), 1u);
  EXPECT_TRUE(p.allow[0].preset);
  // A policy a sandbox already holds is re-read as it is (its protected
  // entries then open nothing: OnlyAPresetsRuleIsCompiledIntoAProtectedRange).
  PolicyChecks recorded = In(range);
  recorded.refuse = false;
  ASSERT_OK_AND_ASSIGN(NetworkPolicy old, ParsePolicy({"169.254.169.254"}, {}, {}, recorded));
  EXPECT_FALSE(old.allow[0].preset);
}

TEST(PolicyTest, CallersEntryNamingTheNodeIsRefused) {
  PolicyChecks checks;
  checks.node_addrs = {0xcb0071fa};  // 203.0.113.250
  EXPECT_THAT(ParsePolicy({"tcp:203.0.113.250:22"}, {}, {}, checks).status().message(),
              HasSubstr("network.allow[0]: 'tcp:203.0.113.250:22' is an address of this node"));
  // A range around it is fine: the node's part stays closed.
  ASSERT_OK(ParsePolicy({"203.0.113.0/24"}, {}, {}, checks).status());
  ASSERT_OK(ParsePolicy({}, {"203.0.113.250"}, {}, checks).status());
}

TEST(PolicyTest, OnlyAPresetsRuleIsCompiledIntoAProtectedRange) {
  // A protected rule not from a preset (as an older record could hold) is
  // shadowed by the protected set: it gets no accept of its own.
  ASSERT_OK_AND_ASSIGN(Rule r, ParseRule("169.254.169.254"));
  NetworkPolicy p;
  p.allow.push_back(r);
  const Cidr range{0x0ad50000, 24};
  std::vector<std::string> rules = CompileChain(p, 0x0ad50002, range, "protected", "rf_0", "conn_0", "names_0");
  for (const std::string& rule : rules) EXPECT_THAT(rule, ::testing::Not(HasSubstr("169.254"))) << rule;
  p.allow[0].preset = true;
  rules = CompileChain(p, 0x0ad50002, range, "protected", "rf_0", "conn_0", "names_0");
  EXPECT_NE(std::find(rules.begin(), rules.end(), "ip daddr 169.254.169.254/32 accept"), rules.end());
}

TEST(PolicyTest, ChainOrder) {
  Presets presets;
  ASSERT_OK(ParsePreset("meta=169.254.169.254", &presets));
  ASSERT_OK_AND_ASSIGN(NetworkPolicy p,
                       ParsePolicy({"tcp:pypi.test:443", "meta", "0.0.0.0/0"}, {"bad.test", "203.0.113.66"}, presets));
  Cidr range{0x0ad50000, 24};  // 10.213.0.0/24
  const std::vector<std::string> rules = CompileChain(p, 0x0ad50002, range, "protected", "rf_0", "conn_0", "names_0");
  const std::vector<std::string> want = {
      "ip saddr != 10.213.0.2 drop",
      "ct state new counter name \"conn_0\"",
      "fib daddr type local goto rf_0",
      "meta nfproto ipv6 goto rf_0",
      "ip daddr 203.0.113.66/32 goto rf_0",  // the denied name has no rule: it never resolves
      "ip daddr 169.254.169.254/32 accept",  // a preset's, inside a protected range
      "ip daddr @protected goto rf_0",       // before any name or wide allow
      "ip daddr @names_0 tcp dport 443 accept",
      "ip daddr 0.0.0.0/0 accept",
      "goto rf_0",
  };
  EXPECT_EQ(rules, want);
}

}  // namespace
}  // namespace warren::net
