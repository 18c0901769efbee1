// QMP input-send-event batches (QEMU's "InputEvent" list) for the desktop
// API (runtime/desktop.h): key combinations and text on a US layout as
// QKeyCode names, pointer moves as absolute tablet coordinates. Pure
// functions: no QEMU involved.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/desktop.h"
#include "runtime/desktop/keys.h"

namespace warren::runtime::vm {

// QEMU's absolute axis range (INPUT_EVENT_ABS_MAX + 1).
constexpr int32_t kAbsRange = 0x8000;

// Key names (desktop/keys.h): QEMU's QKeyCode names are the canonical ones.
using desktop::KeyCode;

// The events of a combination "ctrl+shift+t": every key down in order, then
// up in reverse. InvalidArgument naming an unknown or empty key.
StatusOr<std::string> ComboEvents(const std::string& combo);

// The events that type `text`, one JSON array per character (shift held
// where the US layout needs it). InvalidArgument naming the first byte
// outside printable ASCII, '\n' and '\t'.
StatusOr<std::vector<std::string>> TextEvents(const std::string& text);

// The event batches that move the pointer to (x, y) of a width x height
// screen and do `action` with `button`: the move, then each button change,
// every batch to be sent (and synced) on its own (a USB tablet reports one
// state per sync, so a press and its release in one batch would cancel out). InvalidArgument for a point
// outside the screen or a click/down/up without a button.
StatusOr<std::vector<std::string>> MouseEvents(int32_t x, int32_t y, uint32_t width, uint32_t height,
                                               MouseButton button, MouseAction action);

// Wheel clicks (press and release of wheel-up/down/left/right): |dy| then
// |dx| of them. InvalidArgument when both are 0 or either exceeds 100.
StatusOr<std::string> ScrollEvents(int32_t dx, int32_t dy);

}  // namespace warren::runtime::vm
