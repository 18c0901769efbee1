// The desktop API (runtime/desktop.h) of a sandbox that carries an X server
// in its own file system (the toolset/desktop layer: Xvfb, xdotool,
// matchbox-window-manager, xterm, dillo; scripts/build-toolset-desktop-
// rootfs.sh), over nothing but the sandbox's exec and file calls, so the
// same code serves the container and microvm backends (E2B's desktop
// sandboxes work this way: X clients run inside the sandbox).
//
//   * Start: the first desktop call starts, as the sandbox's user and inside
//     it, `Xvfb :0 -screen 0 1024x768x24 -fbdir /tmp/.warren-desktop`
//     (the framebuffer memory-mapped to a file in XWD format), then the
//     window manager and an xterm, and waits (30 s each) until the
//     display answers and the xterm is mapped (under TCG a microVM's X
//     clients take seconds each). A later call whose
//     display no longer answers (the X server was killed) starts it again
//     (a screenshot checks at most once per kLivenessInterval).
//     Programs the agent starts reach it with DISPLAY=:0.
//   * Screenshot: the framebuffer file read through the file API (a
//     regular file inside the sandbox's root, header checked as untrusted
//     bytes: desktop/xwd.h), encoded as PNG by the node (desktop/png.h).
//     No process runs for it but the liveness check above.
//   * Input: xdotool (XTEST) inside the sandbox: keys by X keysym
//     (desktop/keys.h), text, pointer moves and buttons, wheel clicks as
//     buttons 4-7. Each call is one exec.
//
// Differences from the vm backend's desktop (QEMU's display and input
// devices): the input comes from XTEST, so a program inside could tell it
// from a keyboard; the screen is what Xvfb draws (no boot, no console); a
// sandbox without Xvfb answers FailedPrecondition naming the layer to
// stack. The X server is the sandbox's own process: the agent may kill or
// replace it (the next call starts it again), and a screenshot trusts
// nothing in the file but its bounded pixels.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/desktop.h"

namespace warren::runtime::desktop {

class X11Desktop : public Desktop {
 public:
  static constexpr const char* kDisplay = ":0";
  static constexpr const char* kFramebuffer = "/tmp/.warren-desktop/Xvfb_screen0";
  static constexpr uint32_t kWidth = 1024, kHeight = 768;
  static constexpr std::chrono::milliseconds kStartTimeout{90000};
  static constexpr std::chrono::milliseconds kCallTimeout{10000};
  static constexpr std::chrono::milliseconds kLivenessInterval{1000};

  // `sandbox` runs the X clients and holds the framebuffer; it must outlive
  // this object (a sandbox owns its X11Desktop).
  explicit X11Desktop(Sandbox& sandbox) : sb_(sandbox) {}

  StatusOr<Screenshot> TakeScreenshot() override;
  Status Key(const std::string& combo) override;
  Status Type(const std::string& text) override;
  Status Mouse(int32_t x, int32_t y, MouseButton button, MouseAction action) override;
  Status Scroll(int32_t dx, int32_t dy) override;

  // The shell script that starts the display unless it answers, then prints
  // "WIDTH HEIGHT" (exit 97: no Xvfb or xdotool in the sandbox; 98: the X
  // server did not come up, its log's tail on stderr).
  static std::string StartScript();

 private:
  // Starts the display unless it answers; the screen's size. Under mu_.
  Status EnsureStarted();
  // xdotool with `args` on the display, started first when it does not
  // answer (once). Under mu_.
  Status Xdotool(const std::vector<std::string>& args);
  Status Named(const Status& s) const;

  Sandbox& sb_;
  std::mutex mu_;  // one desktop call of this sandbox at a time
  bool started_ = false;
  std::chrono::steady_clock::time_point checked_at_{};  // the display last answered
  uint32_t width_ = kWidth, height_ = kHeight;
};

}  // namespace warren::runtime::desktop
