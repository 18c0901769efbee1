// The E2B front end's protocol pieces that stand without a daemon: the
// messages of a Connect client stream (process.StreamInput) split as their
// bytes arrive, template references (`name`, `name:tag`,
// `namespace/name:tag`) resolved against the --e2b-templates mapping, and
// that file read, written and read again when it changes.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "e2b/connect.h"
#include "e2b/templates.h"
#include "status_matchers.h"

namespace warren::e2b {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

TEST(MessageReaderTest, HandsOverEachMessageOnceItIsWhole) {
  std::vector<json> got;
  MessageReader r([&](json m) {
    got.push_back(std::move(m));
    return absl::OkStatus();
  });
  const std::string stream = Envelope(json{{"start", {{"process", {{"pid", 3}}}}}}) +
                             Envelope(json{{"data", {{"input", {{"stdin", "aGk="}}}}}}) +
                             Envelope(json{{"keepalive", json::object()}});
  // One byte at a time: nothing is handed over before its last byte.
  for (size_t i = 0; i < stream.size(); ++i) {
    ASSERT_OK(r.Feed(stream.substr(i, 1)));
    if (i + 1 < Envelope(json{{"start", {{"process", {{"pid", 3}}}}}}).size()) {
      EXPECT_TRUE(got.empty());
    }
  }
  ASSERT_OK(r.Finish());
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0]["start"]["process"]["pid"], 3);
  EXPECT_EQ(got[1]["data"]["input"]["stdin"], "aGk=");
  EXPECT_TRUE(got[2].contains("keepalive"));
  EXPECT_EQ(r.messages(), 3u);
}

TEST(MessageReaderTest, NamesBrokenEnvelopesAndStopsAtTheFirstError) {
  int calls = 0;
  auto count = [&](const json&) {
    ++calls;
    return calls == 2 ? absl::NotFoundError("process with pid 9 not found") : absl::OkStatus();
  };
  {
    MessageReader r(count);
    EXPECT_THAT(r.Feed(Envelope(json::object(), 0x01)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("compressed")));
  }
  {
    MessageReader r(count);
    EXPECT_THAT(r.Feed(Envelope(json::object(), kEndStreamFlag)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("end-of-stream flag")));
  }
  {
    MessageReader r(count);
    std::string bad = Envelope(json::object());
    bad.replace(5, 2, "[1");
    EXPECT_THAT(r.Feed(bad), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a JSON object")));
  }
  {
    MessageReader r(count);
    ASSERT_OK(r.Feed(Envelope(json{{"a", 1}}).substr(0, 7)));
    EXPECT_THAT(r.Finish(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ends inside a message")));
  }
  // The callback's error ends the feed: the third message is not handed over.
  calls = 0;
  MessageReader r(count);
  EXPECT_THAT(r.Feed(Envelope(json{{"a", 1}}) + Envelope(json{{"a", 2}}) + Envelope(json{{"a", 3}})),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("pid 9")));
  EXPECT_EQ(calls, 2);
}

const TemplateMap kTemplates = {
    {"base", {"base/debian-12@1"}},
    {"py:v1", {"base/debian-12@1", "toolset/python@1"}},
    {"py:v2", {"base/debian-12@1", "toolset/python@2"}},
    {"acme/tool:default", {"toolset/acme@1"}},
};

TEST(ResolveTemplateTest, ReadsE2bReferences) {
  EXPECT_THAT(ResolveTemplate(kTemplates, "base"), IsOkAndHolds(std::string("base")));
  // `name` is `name:default`, and the reverse.
  EXPECT_THAT(ResolveTemplate(kTemplates, "base:default"), IsOkAndHolds(std::string("base")));
  EXPECT_THAT(ResolveTemplate(kTemplates, "acme/tool"), IsOkAndHolds(std::string("acme/tool:default")));
  EXPECT_THAT(ResolveTemplate(kTemplates, "py:v2"), IsOkAndHolds(std::string("py:v2")));
  // A key without a namespace answers every namespace; one with a namespace only its own.
  EXPECT_THAT(ResolveTemplate(kTemplates, "team-x/py:v1"), IsOkAndHolds(std::string("py:v1")));
  EXPECT_THAT(ResolveTemplate(kTemplates, "team-x/base"), IsOkAndHolds(std::string("base")));
  EXPECT_THAT(ResolveTemplate(kTemplates, "other/tool"), StatusIs(absl::StatusCode::kNotFound));
}

TEST(ResolveTemplateTest, NamesWhatIsMissing) {
  EXPECT_THAT(ResolveTemplate(kTemplates, "py"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("tag \"default\" does not exist for template \"py\" (its tags on this node: v1, v2")));
  EXPECT_THAT(ResolveTemplate(kTemplates, "py:v3"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("tag \"v3\" does not exist for template \"py\"")));
  EXPECT_THAT(ResolveTemplate(kTemplates, "nope:v1"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("template \"nope:v1\" not found on this node (known: acme/tool:default, base, "
                                 "py:v1, py:v2; warrend --e2b-templates)")));
  for (const char* bad : {":v1", "py:", "py:a:b", "/py", "team/"}) {
    EXPECT_THAT(ResolveTemplate(kTemplates, bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
}

TEST(TemplatesFileTest, ParseNamesBadEntries) {
  EXPECT_THAT(ParseTemplates("[1]", "--e2b-templates f"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--e2b-templates f: not a JSON object")));
  EXPECT_THAT(ParseTemplates(R"({"py:": ["a"]})", "f"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("py:")));
  EXPECT_THAT(ParseTemplates(R"({"py": []})", "f"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"py\" must map to a non-empty list")));
  EXPECT_THAT(ParseTemplates(R"({"py": ["a", 3]})", "f"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a non-empty string")));
}

TEST(TemplatesFileTest, WrittenFileReadsBackAndSourceFollowsChanges) {
  char dir[] = "/tmp/e2b-templates-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/t.json";
  ASSERT_OK(WriteTemplates(path, {{"py:v1", {"base/debian-12@1", "toolset/python@1"}}}));
  ASSERT_OK_AND_ASSIGN(TemplateMap read, ReadTemplates(path, {"base/debian-12@1"}));
  EXPECT_EQ(read, (TemplateMap{{"base", {"base/debian-12@1"}}, {"py:v1", {"base/debian-12@1", "toolset/python@1"}}}));

  TemplateSource source(path, {"base/debian-12@1"}, read);
  ASSERT_OK_AND_ASSIGN(auto got, source.Resolve("py:v1"));
  EXPECT_EQ(got.first, "py:v1");
  EXPECT_THAT(source.Resolve("py:v2"), StatusIs(absl::StatusCode::kNotFound));
  // A changed file applies to the next Resolve (its size differs, whatever
  // the clock's granularity).
  ASSERT_OK(WriteTemplates(path, {{"py:v1", {"a@1"}}, {"py:v2", {"base/debian-12@1", "toolset/python@2"}}}));
  ASSERT_OK_AND_ASSIGN(got, source.Resolve("team/py:v2"));
  EXPECT_EQ(got.first, "py:v2");
  EXPECT_THAT(got.second, ElementsAre("base/debian-12@1", "toolset/python@2"));
  // A broken file keeps the last good mapping.
  { std::ofstream(path, std::ios::trunc) << "{not json"; }
  ASSERT_OK_AND_ASSIGN(got, source.Resolve("py:v2"));
  EXPECT_EQ(got.first, "py:v2");
  ASSERT_EQ(::unlink(path.c_str()), 0);
  EXPECT_OK(source.Resolve("base").status());
  ASSERT_EQ(::rmdir(dir), 0);
}

}  // namespace
}  // namespace warren::e2b
