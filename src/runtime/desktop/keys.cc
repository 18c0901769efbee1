#include "runtime/desktop/keys.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>

namespace warren::runtime::desktop {

namespace {

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

std::string KeyCode(const std::string& name) {
  static const std::map<std::string, std::string> kAlias = {
      {"return", "ret"},          {"enter", "ret"},     {"space", "spc"},      {"escape", "esc"},
      {"backspace", "backspace"}, {"control", "ctrl"},  {"control_l", "ctrl"}, {"control_r", "ctrl_r"},
      {"ctrl_l", "ctrl"},         {"shift_l", "shift"}, {"alt_l", "alt"},      {"super", "meta_l"},
      {"super_l", "meta_l"},      {"meta", "meta_l"},   {"win", "meta_l"},     {"cmd", "meta_l"},
      {"page_up", "pgup"},        {"pageup", "pgup"},   {"prior", "pgup"},     {"page_down", "pgdn"},
      {"pagedown", "pgdn"},       {"next", "pgdn"},     {"del", "delete"},     {"ins", "insert"},
      {"minus", "minus"},         {"plus", "equal"},    {"period", "dot"},     {"print", "print"},
  };
  static const char* const kQcodes[] = {
      "shift",     "shift_r",    "alt",          "alt_r",     "ctrl",  "ctrl_r",       "menu",      "esc",
      "minus",     "equal",      "backspace",    "tab",       "ret",   "spc",          "caps_lock", "bracket_left",
      "semicolon", "apostrophe", "grave_accent", "backslash", "comma", "dot",          "slash",     "home",
      "end",       "pgup",       "pgdn",         "up",        "down",  "left",         "right",     "insert",
      "delete",    "meta_l",     "meta_r",       "print",     "pause", "bracket_right"};
  std::string n = Lower(name);
  if (n.size() == 1 && (std::isalnum(static_cast<unsigned char>(n[0])) != 0)) return n;
  if (n.size() >= 2 && n.size() <= 3 && n[0] == 'f') {
    int f = std::atoi(n.c_str() + 1);
    if (f >= 1 && f <= 12 && std::to_string(f) == n.substr(1)) return n;
  }
  if (auto it = kAlias.find(n); it != kAlias.end()) return it->second;
  for (const char* q : kQcodes) {
    if (n == q) return n;
  }
  return "";
}

StatusOr<std::vector<std::string>> ComboKeys(const std::string& combo) {
  std::vector<std::string> codes;
  size_t start = 0;
  while (true) {
    size_t plus = combo.find('+', start);
    std::string name = combo.substr(start, plus == std::string::npos ? std::string::npos : plus - start);
    // "ctrl++" presses ctrl and '+' (the last part is the key itself).
    if (name.empty() && plus != std::string::npos && plus + 1 == combo.size()) name = "plus";
    if (name.empty()) return absl::InvalidArgumentError("key combination \"" + combo + "\" has an empty key");
    std::string code = KeyCode(name);
    if (code.empty()) return absl::InvalidArgumentError("unknown key \"" + name + "\" in \"" + combo + "\"");
    codes.push_back(code);
    if (plus == std::string::npos || plus + 1 == combo.size()) break;
    start = plus + 1;
  }
  if (codes.size() > 8) return absl::InvalidArgumentError("key combination \"" + combo + "\" has over 8 keys");
  return codes;
}

std::string X11Keysym(const std::string& qcode) {
  static const std::map<std::string, std::string> kSyms = {
      {"shift", "Shift_L"},
      {"shift_r", "Shift_R"},
      {"alt", "Alt_L"},
      {"alt_r", "Alt_R"},
      {"ctrl", "Control_L"},
      {"ctrl_r", "Control_R"},
      {"menu", "Menu"},
      {"esc", "Escape"},
      {"minus", "minus"},
      {"equal", "equal"},
      {"backspace", "BackSpace"},
      {"tab", "Tab"},
      {"ret", "Return"},
      {"spc", "space"},
      {"caps_lock", "Caps_Lock"},
      {"bracket_left", "bracketleft"},
      {"bracket_right", "bracketright"},
      {"semicolon", "semicolon"},
      {"apostrophe", "apostrophe"},
      {"grave_accent", "grave"},
      {"backslash", "backslash"},
      {"comma", "comma"},
      {"dot", "period"},
      {"slash", "slash"},
      {"home", "Home"},
      {"end", "End"},
      {"pgup", "Prior"},
      {"pgdn", "Next"},
      {"up", "Up"},
      {"down", "Down"},
      {"left", "Left"},
      {"right", "Right"},
      {"insert", "Insert"},
      {"delete", "Delete"},
      {"meta_l", "Super_L"},
      {"meta_r", "Super_R"},
      {"print", "Print"},
      {"pause", "Pause"},
  };
  if (qcode.size() == 1 && (std::isalnum(static_cast<unsigned char>(qcode[0])) != 0)) return qcode;
  if (qcode.size() >= 2 && qcode.size() <= 3 && qcode[0] == 'f') return "F" + qcode.substr(1);
  auto it = kSyms.find(qcode);
  return it == kSyms.end() ? "" : it->second;
}

}  // namespace warren::runtime::desktop
