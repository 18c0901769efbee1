#include "runtime/desktop/x11_desktop.h"

#include <cstdio>

#include "absl/strings/str_replace.h"
#include "runtime/desktop/keys.h"
#include "runtime/desktop/png.h"
#include "runtime/desktop/xwd.h"

namespace warren::runtime::desktop {

namespace {

constexpr int kExitNoTools = 97;
constexpr int kExitNoDisplay = 98;
// Each of the start script's waits (the display, then xterm's window); the
// exec's own timeout (kStartTimeout) covers both with room to spare.
constexpr std::chrono::seconds kXTimeout{30};

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'')
      q += "'\\''";
    else
      q += c;
  }
  return q + "'";
}

std::string Tail(const std::string& s, size_t n = 400) { return s.size() <= n ? s : s.substr(s.size() - n); }

// Reads [offset, offset + n) of `path` whole.
StatusOr<std::string> ReadRange(SandboxFiles& files, const std::string& path, uint64_t offset, uint64_t n) {
  ASSIGN_OR_RETURN(std::unique_ptr<FileReader> r, files.OpenRead(path, offset, n));
  std::string out;
  out.reserve(static_cast<size_t>(n));
  while (out.size() < n) {
    ASSIGN_OR_RETURN(std::string chunk, r->Read(static_cast<size_t>(std::min<uint64_t>(n - out.size(), 4u << 20))));
    if (chunk.empty()) break;
    out += chunk;
  }
  if (out.size() < n) {
    return absl::InvalidArgumentError("framebuffer (XWD): " + path + " ended after " + std::to_string(out.size()) +
                                      " of " + std::to_string(n) + " bytes");
  }
  return out;
}

int Button(MouseButton b) {
  switch (b) {
    case MouseButton::kLeft: return 1;
    case MouseButton::kMiddle: return 2;
    case MouseButton::kRight: return 3;
    default: return 0;
  }
}

}  // namespace

std::string X11Desktop::StartScript() {
  // Waits are bounded by time, not tries: under TCG each X client takes a
  // second or more. A stale lock or socket (a fork or snapshot of a sandbox
  // that ran X) would stop the new server; nothing answers on the display
  // when they are removed. xterm's wait is best effort (the display serves
  // without it).
  static constexpr const char* kScript = R"(export DISPLAY=$DISPLAY
for t in Xvfb xdotool; do
  command -v $t >/dev/null 2>&1 || { echo "$t is not in this sandbox: stack the toolset/desktop layer" >&2; exit $NOTOOLS; }
done
if ! xdotool getdisplaygeometry >/dev/null 2>&1; then
  rm -f /tmp/.X0-lock /tmp/.X11-unix/X0; mkdir -p $DIR
  setsid Xvfb $DISPLAY -screen 0 $SIZEx24 -fbdir $DIR -nolisten tcp -noreset </dev/null >$DIR/xvfb.log 2>&1 &
  end=$(($(date +%s) + $WAIT))
  until xdotool getdisplaygeometry >/dev/null 2>&1; do
    if [ $(date +%s) -ge $end ]; then
      echo "the X server did not answer in $WAIT s:" >&2; tail -n 5 $DIR/xvfb.log >&2; exit $NODISPLAY
    fi
    sleep 0.05
  done
  if command -v matchbox-window-manager >/dev/null 2>&1; then
    setsid matchbox-window-manager -use_titlebar no -use_cursor yes </dev/null >/dev/null 2>&1 &
  fi
  if command -v xterm >/dev/null 2>&1; then
    setsid xterm -bg white -fg black -fn 10x20 </dev/null >/dev/null 2>&1 &
    end=$(($(date +%s) + $WAIT))
    until xdotool search --onlyvisible --class xterm >/dev/null 2>&1; do
      [ $(date +%s) -ge $end ] && break; sleep 0.1
    done
  fi
fi
xdotool getdisplaygeometry
)";
  return absl::StrReplaceAll(kScript, {{"$DISPLAY", kDisplay},
                                       {"$DIR", "/tmp/.warren-desktop"},
                                       {"$SIZE", std::to_string(kWidth) + "x" + std::to_string(kHeight)},
                                       {"$WAIT", std::to_string(kXTimeout.count())},
                                       {"$NOTOOLS", std::to_string(kExitNoTools)},
                                       {"$NODISPLAY", std::to_string(kExitNoDisplay)}});
}

Status X11Desktop::Named(const Status& s) const {
  if (s.ok()) return s;
  return Status(s.code(), "sandbox " + sb_.id() + ": desktop: " + std::string(s.message()));
}

Status X11Desktop::EnsureStarted() {
  ExecSpec spec;
  spec.shell = StartScript();
  spec.timeout = kStartTimeout;
  spec.output_cap_bytes = 64 << 10;
  ASSIGN_OR_RETURN(ExecOutcome out, sb_.Exec(spec));
  if (out.exit_code == kExitNoTools) return Named(absl::FailedPreconditionError(Tail(out.stderr_data)));
  if (out.timed_out) {
    return Named(
        absl::DeadlineExceededError("the X server did not start in " + std::to_string(kStartTimeout.count()) + " ms"));
  }
  if (out.exit_code == kExitNoDisplay) return Named(absl::DeadlineExceededError(Tail(out.stderr_data)));
  unsigned w = 0, h = 0;
  if (out.exit_code != 0 || std::sscanf(out.stdout_data.c_str(), "%u %u", &w, &h) != 2 || w == 0 || h == 0 ||
      w > 4096 || h > 4096) {
    return Named(absl::UnavailableError("starting the display failed (exit " + std::to_string(out.exit_code) +
                                        "): " + Tail(out.stderr_data + out.stdout_data)));
  }
  width_ = w;
  height_ = h;
  started_ = true;
  checked_at_ = std::chrono::steady_clock::now();
  return absl::OkStatus();
}

Status X11Desktop::Xdotool(const std::vector<std::string>& args) {
  if (!started_) RETURN_IF_ERROR(EnsureStarted());
  std::string cmd =
      "xdotool getdisplaygeometry >/dev/null 2>&1 || exit " + std::to_string(kExitNoDisplay) + "\nexec xdotool";
  for (const std::string& a : args) cmd += " " + Quote(a);
  ExecSpec spec;
  spec.shell = cmd;
  spec.env = {{"DISPLAY", kDisplay}};
  spec.timeout = kCallTimeout;
  spec.output_cap_bytes = 64 << 10;
  for (int attempt = 0;; ++attempt) {
    ASSIGN_OR_RETURN(ExecOutcome out, sb_.Exec(spec));
    if (out.exit_code == 0 && !out.timed_out) {
      checked_at_ = std::chrono::steady_clock::now();  // the display answered
      return absl::OkStatus();
    }
    if (out.exit_code == kExitNoDisplay && attempt == 0) {
      RETURN_IF_ERROR(EnsureStarted());
      continue;
    }
    if (out.timed_out) return Named(absl::DeadlineExceededError("xdotool did not finish in 10 s"));
    return Named(absl::UnavailableError("xdotool failed (exit " + std::to_string(out.exit_code) +
                                        "): " + Tail(out.stderr_data)));
  }
}

StatusOr<Screenshot> X11Desktop::TakeScreenshot() {
  std::lock_guard<std::mutex> lock(mu_);
  // A screenshot runs no process, but the X server may have died leaving
  // its file (SIGKILL): at most once per kLivenessInterval the display is
  // checked (and started again when it does not answer).
  if (!started_ || std::chrono::steady_clock::now() - checked_at_ > kLivenessInterval) {
    RETURN_IF_ERROR(EnsureStarted());
  }
  StatusOr<FileInfo> st = sb_.files().Stat(kFramebuffer);
  if (!st.ok() && absl::IsNotFound(st.status())) {
    // The X server was killed (its file goes with a restart) or another
    // one holds the display: start ours if nothing answers, then look again.
    RETURN_IF_ERROR(EnsureStarted());
    st = sb_.files().Stat(kFramebuffer);
    if (!st.ok() && absl::IsNotFound(st.status())) {
      return Named(absl::FailedPreconditionError(std::string("no framebuffer at ") + kFramebuffer + ": the display " +
                                                 kDisplay + " is served by an X server warren did not start"));
    }
  }
  if (!st.ok()) return Named(st.status());
  ASSIGN_OR_RETURN(std::string head,
                   ReadRange(sb_.files(), kFramebuffer, 0, std::min<uint64_t>(st->size, kXwdHeadBytes)));
  StatusOr<XwdImage> img = ParseXwdHeader(head, st->size);
  if (!img.ok()) return Named(img.status());
  ASSIGN_OR_RETURN(std::string pixels,
                   ReadRange(sb_.files(), kFramebuffer, img->pixel_offset, img->end() - img->pixel_offset));
  StatusOr<std::string> png = EncodePngRgb(XwdToRgb(*img, pixels), img->width, img->height);
  if (!png.ok()) return Named(png.status());
  width_ = img->width;
  height_ = img->height;
  return Screenshot{std::move(*png), img->width, img->height};
}

Status X11Desktop::Key(const std::string& combo) {
  StatusOr<std::vector<std::string>> codes = ComboKeys(combo);
  if (!codes.ok()) return Named(codes.status());
  std::string syms;
  for (const std::string& c : *codes) {
    std::string sym = X11Keysym(c);
    if (sym.empty()) return Named(absl::InvalidArgumentError("key \"" + c + "\" has no X11 keysym"));
    syms += (syms.empty() ? "" : "+") + sym;
  }
  std::lock_guard<std::mutex> lock(mu_);
  return Xdotool({"key", "--clearmodifiers", syms});
}

Status X11Desktop::Type(const std::string& text) {
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if ((c < 0x20 || c > 0x7e) && c != '\n' && c != '\t') {
      return Named(absl::InvalidArgumentError("type: byte " + std::to_string(c) + " at offset " + std::to_string(i) +
                                              " is not printable ASCII, newline or tab"));
    }
  }
  if (text.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  return Xdotool({"type", "--delay", "8", "--", text});
}

Status X11Desktop::Mouse(int32_t x, int32_t y, MouseButton button, MouseAction action) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!started_) RETURN_IF_ERROR(EnsureStarted());
  if (x < 0 || y < 0 || static_cast<uint32_t>(x) >= width_ || static_cast<uint32_t>(y) >= height_) {
    return Named(absl::InvalidArgumentError("mouse: (" + std::to_string(x) + ", " + std::to_string(y) +
                                            ") is outside the " + std::to_string(width_) + "x" +
                                            std::to_string(height_) + " screen"));
  }
  const int b = Button(button);
  if (action != MouseAction::kMove && b == 0) {
    return Named(absl::InvalidArgumentError("mouse: a click, down or up needs a button"));
  }
  std::vector<std::string> args = {"mousemove", std::to_string(x), std::to_string(y)};
  if (action == MouseAction::kClick) args.insert(args.end(), {"click", std::to_string(b)});
  if (action == MouseAction::kDown) args.insert(args.end(), {"mousedown", std::to_string(b)});
  if (action == MouseAction::kUp) args.insert(args.end(), {"mouseup", std::to_string(b)});
  return Xdotool(args);
}

Status X11Desktop::Scroll(int32_t dx, int32_t dy) {
  if (dx == 0 && dy == 0) return Named(absl::InvalidArgumentError("scroll: dx and dy are both 0"));
  if (dx > 100 || dx < -100 || dy > 100 || dy < -100) {
    return Named(absl::InvalidArgumentError("scroll: at most 100 wheel clicks per call, not (" + std::to_string(dx) +
                                            ", " + std::to_string(dy) + ")"));
  }
  std::vector<std::string> args;
  // X's wheel buttons: 4 up, 5 down, 6 left, 7 right.
  if (dy != 0) args.insert(args.end(), {"click", "--repeat", std::to_string(dy < 0 ? -dy : dy), dy < 0 ? "4" : "5"});
  if (dx != 0) args.insert(args.end(), {"click", "--repeat", std::to_string(dx < 0 ? -dx : dx), dx < 0 ? "6" : "7"});
  std::lock_guard<std::mutex> lock(mu_);
  return Xdotool(args);
}

}  // namespace warren::runtime::desktop
