// QMP input-send-event batches (QEMU's "InputEvent" list) for the desktop
// API (runtime/desktop.h): key combinations and text on a US layout as
// QKeyCode names, pointer moves as absolute tablet coordinates. Pure
// functions: no QEMU involved.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "runtime/desktop.h"
#include "runtime/desktop/keys.h"

namespace warren::runtime::vm {

// QEMU's absolute axis range (INPUT_EVENT_ABS_MAX + 1).
constexpr int32_t kAbsRange = 0x8000;

// Key names (desktop/keys.h): QEMU's QKeyCode names are the canonical ones.
using desktop::KeyCode;

// One input-send-event call's key events and the bytes they put in the
// guest's PS/2 keyboard queue (ScancodeBytes of each event).
struct KeyBatch {
  std::string events;  // a JSON array of QEMU InputEvents
  uint32_t scancode_bytes = 0;
};

// The bytes one key event becomes in QEMU's PS/2 keyboard queue, scancode
// set 1 (what QEMU's i8042 translation hands the guest): 1, 2 for the
// E0-prefixed keys (right ctrl/alt, the Windows and menu keys, arrows,
// insert/delete/home/end/page keys), print 4, pause 6 down and 0 up.
uint32_t ScancodeBytes(const std::string& qcode, bool down);

// The events of a combination "ctrl+shift+t": every key down in order, then
// up in reverse, as one batch. InvalidArgument naming an unknown or empty key.
StatusOr<KeyBatch> ComboEvents(const std::string& combo);

// The events that type `text`, one batch per character (shift held where
// the US layout needs it). InvalidArgument naming the first byte outside
// printable ASCII, '\n' and '\t'.
StatusOr<std::vector<KeyBatch>> TextEvents(const std::string& text);

// The interrupts a Linux guest took from its i8042 keyboard port (IRQ 1,
// summed over CPUs) in the text of its /proc/interrupts: one per byte it
// read from the keyboard queue. NotFound when no such line (no i8042, or
// not Linux's format).
StatusOr<uint64_t> I8042KeyboardInterrupts(std::string_view proc_interrupts);

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
