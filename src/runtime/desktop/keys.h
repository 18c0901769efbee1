// Key names of the desktop API (runtime/desktop.h), shared by every
// Desktop: QEMU's QKeyCode names (qapi/ui.json) are the canonical ones, the
// usual X11 keysym spellings and aliases map onto them. Pure functions.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace warren::runtime::desktop {

// The QKeyCode of one key name: letters and digits as themselves, QEMU's
// own names ("ret", "spc", "bracket_left", "f5", ...) and the usual aliases
// ("Return"/"enter", "space", "Escape"/"esc", "BackSpace", "Tab", "ctrl",
// "control", "alt", "shift", "super"/"meta"/"win", "Up", "Page_Up", ...),
// case-insensitive. "" for an unknown name.
std::string KeyCode(const std::string& name);

// The QKeyCodes of a combination "ctrl+shift+t", in the order pressed
// ("ctrl++" is ctrl and '+'). InvalidArgument naming an unknown or empty key,
// or for over 8 keys.
StatusOr<std::vector<std::string>> ComboKeys(const std::string& combo);

// The X11 keysym name (X11/keysymdef.h without "XK_") of a QKeyCode that
// KeyCode returns: "ret" -> "Return", "pgup" -> "Prior", "f5" -> "F5",
// "meta_l" -> "Super_L"; "" for anything else.
std::string X11Keysym(const std::string& qcode);

}  // namespace warren::runtime::desktop
