// The desktop of a sandbox with a virtual display (computer use): what a
// screen shows and the keyboard and pointer that drive it. Implemented by
// the sandboxes of the `vm` backend through QEMU's monitor (screendump and
// input-send-event: the guest sees a real display adapter, a PS/2 keyboard
// and a USB tablet, so it works for any guest OS), and by the container and
// microvm backends' sandboxes through an X server inside the sandbox
// (desktop/x11_desktop.h: Xvfb and xdotool from the toolset/desktop layer).
// The node asks with dynamic_cast<Desktop*>(sandbox); a sandbox without one
// answers Unimplemented (DesktopUnsupported).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "runtime/backend.h"

namespace warren::runtime {

struct Screenshot {
  std::string png;  // the whole screen, PNG
  uint32_t width = 0, height = 0;
};

enum class MouseButton { kNone, kLeft, kMiddle, kRight };
enum class MouseAction { kMove, kClick, kDown, kUp };

class Desktop {
 public:
  virtual ~Desktop() = default;
  virtual StatusOr<Screenshot> TakeScreenshot() = 0;
  // Presses a combination such as "ctrl+l", "Return", "shift+Tab", "a"
  // (keys joined by '+', pressed in order and released in reverse).
  // InvalidArgument naming the key for an unknown one.
  virtual Status Key(const std::string& combo) = 0;
  // Types `text` (printable ASCII, '\n' and '\t') on a US keyboard layout.
  virtual Status Type(const std::string& text) = 0;
  // Moves the pointer to (x, y) in screen pixels, then does `action` with
  // `button`. InvalidArgument for a point outside the screen.
  virtual Status Mouse(int32_t x, int32_t y, MouseButton button, MouseAction action) = 0;
  // Wheel clicks: dy > 0 down, dx > 0 right.
  virtual Status Scroll(int32_t dx, int32_t dy) = 0;
};

// Unimplemented: "sandbox <id>: the desktop (screenshots and input) needs a
// virtual display, which the <backend> backend has not: create the sandbox
// with backend=vm".
inline Status DesktopUnsupported(const Sandbox& sb) {
  return absl::UnimplementedError("sandbox " + sb.id() +
                                  ": the desktop (screenshots and input) needs a virtual display, which the " +
                                  std::string(sb.backend_name()) + " backend has not: create it with backend=vm");
}

}  // namespace warren::runtime
