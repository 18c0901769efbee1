#include "runtime/vm/vm_sandbox.h"

#include <unistd.h>

#include <cstring>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "runtime/vm/input.h"

namespace warren::runtime::vm {

namespace {
// Screenshots are read back from the file QEMU writes; the screen of a
// 4K display in PNG stays well below.
constexpr uint64_t kMaxPngBytes = 64u << 20;
// The screen size the pointer is scaled by is re-read after this (the guest
// may change its mode).
constexpr std::chrono::seconds kSizeTtl{2};
// Between typed characters (QEMU's PS/2 queue holds 256 bytes and the
// guest drains it at its own pace) and between a pointer's move and its
// button changes (a USB tablet's reports are polled by the guest).
constexpr std::chrono::milliseconds kTypeGap{8};
}  // namespace

Status PngSize(const std::string& png, uint32_t* width, uint32_t* height) {
  static const unsigned char kSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (png.size() < 24 || std::memcmp(png.data(), kSig, 8) != 0 || png.compare(12, 4, "IHDR") != 0) {
    return absl::InvalidArgumentError("not a PNG image (" + std::to_string(png.size()) + " bytes)");
  }
  auto be32 = [&](size_t off) {
    const auto* p = reinterpret_cast<const unsigned char*>(png.data() + off);
    return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
  };
  *width = be32(16);
  *height = be32(20);
  return absl::OkStatus();
}

VmSandbox::VmSandbox(std::unique_ptr<microvm::MicrovmSandbox> inner, std::unique_ptr<QmpClient> qmp, std::string dir)
    : inner_(std::move(inner)), qmp_(std::move(qmp)), dir_(std::move(dir)) {}

Status VmSandbox::Destroy() { return inner_->Destroy(); }

Status VmSandbox::Named(const Status& s) const {
  if (s.ok()) return s;
  return Status(s.code(), "sandbox " + id() + ": " + std::string(s.message()));
}

StatusOr<Screenshot> VmSandbox::TakeScreenshot() {
  std::lock_guard<std::mutex> l(mu_);
  const std::string path = dir_ + "/screen.png";
  nlohmann::json args = {{"filename", path}, {"format", "png"}};
  StatusOr<std::string> r = qmp_->Execute("screendump", args.dump(), kQmpTimeout);
  if (!r.ok()) {
    ::unlink(path.c_str());
    return Named(r.status());
  }
  StatusOr<std::string> png = ReadSmallFile(path, kMaxPngBytes);
  ::unlink(path.c_str());
  if (!png.ok()) return Named(png.status());
  Screenshot shot;
  RETURN_IF_ERROR(Named(PngSize(*png, &shot.width, &shot.height)));
  shot.png = std::move(*png);
  width_ = shot.width;
  height_ = shot.height;
  size_at_ = std::chrono::steady_clock::now();
  return shot;
}

Status VmSandbox::Send(const std::string& events_json) {
  StatusOr<std::string> r = qmp_->Execute("input-send-event", R"({"events":)" + events_json + "}", kQmpTimeout);
  return Named(r.status());
}

Status VmSandbox::Key(const std::string& combo) {
  ASSIGN_OR_RETURN(std::string events, ComboEvents(combo));
  return Send(events);
}

Status VmSandbox::Type(const std::string& text) {
  ASSIGN_OR_RETURN(std::vector<std::string> chars, TextEvents(text));
  for (size_t i = 0; i < chars.size(); ++i) {
    if (i > 0) std::this_thread::sleep_for(kTypeGap);
    RETURN_IF_ERROR(Send(chars[i]));
  }
  return absl::OkStatus();
}

Status VmSandbox::Mouse(int32_t x, int32_t y, MouseButton button, MouseAction action) {
  uint32_t w, h;
  {
    std::lock_guard<std::mutex> l(mu_);
    w = width_;
    h = height_;
    if (w != 0 && std::chrono::steady_clock::now() - size_at_ > kSizeTtl) w = 0;
  }
  if (w == 0) {
    ASSIGN_OR_RETURN(Screenshot s, TakeScreenshot());
    w = s.width;
    h = s.height;
  }
  ASSIGN_OR_RETURN(std::vector<std::string> batches, MouseEvents(x, y, w, h, button, action));
  for (size_t i = 0; i < batches.size(); ++i) {
    if (i > 0) std::this_thread::sleep_for(kTypeGap);
    RETURN_IF_ERROR(Send(batches[i]));
  }
  return absl::OkStatus();
}

Status VmSandbox::Scroll(int32_t dx, int32_t dy) {
  ASSIGN_OR_RETURN(std::string events, ScrollEvents(dx, dy));
  return Send(events);
}

}  // namespace warren::runtime::vm
