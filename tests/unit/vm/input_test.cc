#include "runtime/vm/input.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "runtime/vm/vm_sandbox.h"

namespace warren::runtime::vm {
namespace {

using nlohmann::json;

// "down:code" / "up:code" / "btn-down:left" / "abs:x=N" of each event.
std::vector<std::string> Summary(const std::string& events) {
  std::vector<std::string> out;
  for (const json& e : json::parse(events)) {
    const json& d = e["data"];
    if (e["type"] == "key") {
      out.push_back(std::string(d["down"].get<bool>() ? "down:" : "up:") + d["key"]["data"].get<std::string>());
    } else if (e["type"] == "btn") {
      out.push_back(std::string(d["down"].get<bool>() ? "btn-down:" : "btn-up:") + d["button"].get<std::string>());
    } else {
      out.push_back("abs:" + d["axis"].get<std::string>() + "=" + std::to_string(d["value"].get<int64_t>()));
    }
  }
  return out;
}

TEST(KeyCode, NamesAndAliases) {
  EXPECT_EQ(KeyCode("a"), "a");
  EXPECT_EQ(KeyCode("L"), "l");
  EXPECT_EQ(KeyCode("Return"), "ret");
  EXPECT_EQ(KeyCode("enter"), "ret");
  EXPECT_EQ(KeyCode("Page_Down"), "pgdn");
  EXPECT_EQ(KeyCode("F12"), "f12");
  EXPECT_EQ(KeyCode("super"), "meta_l");
  EXPECT_EQ(KeyCode("f13"), "");
  EXPECT_EQ(KeyCode("hyper"), "");
}

TEST(ComboEvents, PressInOrderReleaseInReverse) {
  auto ev = ComboEvents("ctrl+shift+t");
  ASSERT_TRUE(ev.ok()) << ev.status();
  EXPECT_THAT(Summary(ev->events),
              testing::ElementsAre("down:ctrl", "down:shift", "down:t", "up:t", "up:shift", "up:ctrl"));
  auto plus = ComboEvents("ctrl++");
  ASSERT_TRUE(plus.ok()) << plus.status();
  EXPECT_THAT(Summary(plus->events), testing::ElementsAre("down:ctrl", "down:equal", "up:equal", "up:ctrl"));
}

TEST(ComboEvents, UnknownOrEmptyKeyNamed) {
  auto bad = ComboEvents("ctrl+hyper");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), testing::HasSubstr("\"hyper\""));
  EXPECT_EQ(ComboEvents("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ComboEvents("+a").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TextEvents, ShiftWhereTheLayoutNeedsIt) {
  auto ev = TextEvents("hI!\n");
  ASSERT_TRUE(ev.ok()) << ev.status();
  ASSERT_EQ(ev->size(), 4u);
  EXPECT_THAT(Summary((*ev)[0].events), testing::ElementsAre("down:h", "up:h"));
  EXPECT_THAT(Summary((*ev)[1].events), testing::ElementsAre("down:shift", "down:i", "up:i", "up:shift"));
  EXPECT_THAT(Summary((*ev)[2].events), testing::ElementsAre("down:shift", "down:1", "up:1", "up:shift"));
  EXPECT_THAT(Summary((*ev)[3].events), testing::ElementsAre("down:ret", "up:ret"));
}

TEST(TextEvents, NonAsciiRejectedWithItsOffset) {
  auto ev = TextEvents("ab\xc3\xa9");
  EXPECT_EQ(ev.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ev.status().message()), testing::HasSubstr("byte 2 (0xc3)"));
}

TEST(MouseEvents, ScalesToTheAbsoluteAxisAndSplitsTheClick) {
  auto ev = MouseEvents(0, 767, 1024, 768, MouseButton::kLeft, MouseAction::kClick);
  ASSERT_TRUE(ev.ok()) << ev.status();
  ASSERT_EQ(ev->size(), 3u);
  // Each pixel maps inside its own cell of the 0..0x7fff axis.
  EXPECT_THAT(Summary((*ev)[0]), testing::ElementsAre("abs:x=16", "abs:y=32746"));
  EXPECT_THAT(Summary((*ev)[1]), testing::ElementsAre("btn-down:left"));
  EXPECT_THAT(Summary((*ev)[2]), testing::ElementsAre("btn-up:left"));
  auto up = MouseEvents(5, 5, 1024, 768, MouseButton::kRight, MouseAction::kUp);
  ASSERT_TRUE(up.ok());
  ASSERT_EQ(up->size(), 2u);
  EXPECT_THAT(Summary(up->at(1)), testing::ElementsAre("btn-up:right"));
  auto move = MouseEvents(512, 384, 1024, 768, MouseButton::kNone, MouseAction::kMove);
  ASSERT_TRUE(move.ok());
  EXPECT_THAT(Summary(move->at(0)), testing::ElementsAre("abs:x=16400", "abs:y=16405"));
}

TEST(MouseEvents, OutsideTheScreenOrNoButton) {
  auto out = MouseEvents(1024, 0, 1024, 768, MouseButton::kLeft, MouseAction::kClick);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(out.status().message()), testing::HasSubstr("outside the 1024x768 screen"));
  EXPECT_EQ(MouseEvents(-1, 0, 1024, 768, MouseButton::kNone, MouseAction::kMove).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MouseEvents(1, 1, 1024, 768, MouseButton::kNone, MouseAction::kClick).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ScrollEvents, WheelClicks) {
  auto ev = ScrollEvents(-1, 2);
  ASSERT_TRUE(ev.ok()) << ev.status();
  EXPECT_THAT(Summary(*ev), testing::ElementsAre("btn-down:wheel-down", "btn-up:wheel-down", "btn-down:wheel-down",
                                                 "btn-up:wheel-down", "btn-down:wheel-left", "btn-up:wheel-left"));
  EXPECT_EQ(ScrollEvents(0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ScrollEvents(0, 101).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PngSize, ReadsTheHeaderRejectsOthers) {
  std::string png("\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\0\0\x04\0\0\0\x03\0", 24);
  uint32_t w = 0, h = 0;
  ASSERT_TRUE(PngSize(png, &w, &h).ok());
  EXPECT_EQ(w, 1024u);
  EXPECT_EQ(h, 768u);
  EXPECT_EQ(PngSize("P6\n1024 768\n255\n", &w, &h).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace warren::runtime::vm
