#include "runtime/vm/input.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace warren::runtime::vm {

namespace {

using nlohmann::json;

json KeyEvent(const std::string& code, bool down) {
  return {{"type", "key"}, {"data", {{"down", down}, {"key", {{"type", "qcode"}, {"data", code}}}}}};
}

json BtnEvent(const std::string& button, bool down) {
  return {{"type", "btn"}, {"data", {{"down", down}, {"button", button}}}};
}

// The unshifted key of each character of the US layout, and whether shift
// is needed.
bool CharKey(char c, std::string* code, bool* shift) {
  static const std::map<char, std::pair<const char*, bool>> kPunct = {
      {' ', {"spc", false}},
      {'\n', {"ret", false}},
      {'\t', {"tab", false}},
      {'-', {"minus", false}},
      {'_', {"minus", true}},
      {'=', {"equal", false}},
      {'+', {"equal", true}},
      {'[', {"bracket_left", false}},
      {'{', {"bracket_left", true}},
      {']', {"bracket_right", false}},
      {'}', {"bracket_right", true}},
      {'\\', {"backslash", false}},
      {'|', {"backslash", true}},
      {';', {"semicolon", false}},
      {':', {"semicolon", true}},
      {'\'', {"apostrophe", false}},
      {'"', {"apostrophe", true}},
      {'`', {"grave_accent", false}},
      {'~', {"grave_accent", true}},
      {',', {"comma", false}},
      {'<', {"comma", true}},
      {'.', {"dot", false}},
      {'>', {"dot", true}},
      {'/', {"slash", false}},
      {'?', {"slash", true}},
      {'!', {"1", true}},
      {'@', {"2", true}},
      {'#', {"3", true}},
      {'$', {"4", true}},
      {'%', {"5", true}},
      {'^', {"6", true}},
      {'&', {"7", true}},
      {'*', {"8", true}},
      {'(', {"9", true}},
      {')', {"0", true}},
  };
  if (c >= 'a' && c <= 'z') {
    *code = std::string(1, c);
    *shift = false;
    return true;
  }
  if (c >= 'A' && c <= 'Z') {
    *code = std::string(1, static_cast<char>(c - 'A' + 'a'));
    *shift = true;
    return true;
  }
  if (c >= '0' && c <= '9') {
    *code = std::string(1, c);
    *shift = false;
    return true;
  }
  auto it = kPunct.find(c);
  if (it == kPunct.end()) return false;
  *code = it->second.first;
  *shift = it->second.second;
  return true;
}

}  // namespace

uint32_t ScancodeBytes(const std::string& qcode, bool down) {
  static const std::set<std::string, std::less<>> kExtended = {
      "ctrl_r", "alt_r", "meta_l", "meta_r", "menu", "compose", "kp_enter", "kp_divide", "insert",
      "delete", "home",  "end",    "pgup",   "pgdn", "up",      "down",     "left",      "right"};
  if (qcode == "print") return 4;
  if (qcode == "pause") return down ? 6 : 0;
  return kExtended.count(qcode) != 0 ? 2 : 1;
}

StatusOr<KeyBatch> ComboEvents(const std::string& combo) {
  ASSIGN_OR_RETURN(std::vector<std::string> codes, desktop::ComboKeys(combo));
  json events = json::array();
  KeyBatch b;
  for (const std::string& c : codes) {
    events.push_back(KeyEvent(c, true));
    b.scancode_bytes += ScancodeBytes(c, true);
  }
  for (auto it = codes.rbegin(); it != codes.rend(); ++it) {
    events.push_back(KeyEvent(*it, false));
    b.scancode_bytes += ScancodeBytes(*it, false);
  }
  b.events = events.dump();
  return b;
}

StatusOr<std::vector<KeyBatch>> TextEvents(const std::string& text) {
  std::vector<KeyBatch> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    std::string code;
    bool shift = false;
    if (!CharKey(text[i], &code, &shift)) {
      return absl::InvalidArgumentError("text: byte " + std::to_string(i) + " (0x" +
                                        absl::StrFormat("%02x", static_cast<unsigned char>(text[i])) +
                                        ") is not printable ASCII, \\n or \\t (use key() for other keys)");
    }
    json events = json::array();
    if (shift) events.push_back(KeyEvent("shift", true));
    events.push_back(KeyEvent(code, true));
    events.push_back(KeyEvent(code, false));
    if (shift) events.push_back(KeyEvent("shift", false));
    out.push_back({events.dump(), static_cast<uint32_t>(events.size())});  // all single-byte keys
  }
  return out;
}

StatusOr<uint64_t> I8042KeyboardInterrupts(std::string_view proc_interrupts) {
  const absl::string_view text(proc_interrupts.data(), proc_interrupts.size());
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 3 || f[0] != "1:" || f.back() != "i8042") continue;
    uint64_t sum = 0;
    size_t i = 1;
    for (uint64_t n = 0; i < f.size() && absl::SimpleAtoi(f[i], &n); ++i) sum += n;
    if (i == 1) break;  // no count column
    return sum;
  }
  return absl::NotFoundError("no i8042 keyboard interrupt (IRQ 1) line in /proc/interrupts");
}

StatusOr<std::vector<std::string>> MouseEvents(int32_t x, int32_t y, uint32_t width, uint32_t height,
                                               MouseButton button, MouseAction action) {
  if (width == 0 || height == 0) return absl::FailedPreconditionError("the screen has no size yet (display not up)");
  if (x < 0 || y < 0 || static_cast<uint32_t>(x) >= width || static_cast<uint32_t>(y) >= height) {
    return absl::InvalidArgumentError("mouse: (" + std::to_string(x) + ", " + std::to_string(y) + ") is outside the " +
                                      std::to_string(width) + "x" + std::to_string(height) + " screen");
  }
  if (action != MouseAction::kMove && button == MouseButton::kNone) {
    return absl::InvalidArgumentError("mouse: click, down and up need a button (left, middle or right)");
  }
  // Pixel p maps to the start of its cell of the 0..kAbsRange-1 axis, the
  // way QEMU's console scales absolute coordinates back.
  auto scale = [](int32_t p, uint32_t size) {
    return static_cast<int64_t>(p) * kAbsRange / size + kAbsRange / size / 2;
  };
  json events = json::array();
  events.push_back({{"type", "abs"}, {"data", {{"axis", "x"}, {"value", scale(x, width)}}}});
  events.push_back({{"type", "abs"}, {"data", {{"axis", "y"}, {"value", scale(y, height)}}}});
  const char* b = button == MouseButton::kLeft ? "left" : button == MouseButton::kMiddle ? "middle" : "right";
  // The move first and each button change on its own, as a real pointer
  // reports them: X applications see the press at the new position.
  std::vector<std::string> batches = {events.dump()};
  if (action == MouseAction::kDown || action == MouseAction::kClick) {
    batches.push_back(json::array({BtnEvent(b, true)}).dump());
  }
  if (action == MouseAction::kUp || action == MouseAction::kClick) {
    batches.push_back(json::array({BtnEvent(b, false)}).dump());
  }
  return batches;
}

StatusOr<std::string> ScrollEvents(int32_t dx, int32_t dy) {
  if (dx == 0 && dy == 0) return absl::InvalidArgumentError("scroll: dx and dy are both 0");
  if (std::abs(dx) > 100 || std::abs(dy) > 100) {
    return absl::InvalidArgumentError("scroll: at most 100 wheel clicks per call, not (" + std::to_string(dx) + ", " +
                                      std::to_string(dy) + ")");
  }
  json events = json::array();
  for (int i = 0; i < std::abs(dy); ++i) {
    const char* b = dy > 0 ? "wheel-down" : "wheel-up";
    events.push_back(BtnEvent(b, true));
    events.push_back(BtnEvent(b, false));
  }
  for (int i = 0; i < std::abs(dx); ++i) {
    const char* b = dx > 0 ? "wheel-right" : "wheel-left";
    events.push_back(BtnEvent(b, true));
    events.push_back(BtnEvent(b, false));
  }
  return events.dump();
}

}  // namespace warren::runtime::vm
