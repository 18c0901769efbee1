#include "runtime/vm/vm_sandbox.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include <nlohmann/json.hpp>

#include "runtime/vm/input.h"

namespace warren::runtime::vm {

namespace {
// Screenshots are read back from the memfd QEMU writes; the screen of a
// 4K display in PNG stays well below.
constexpr uint64_t kMaxPngBytes = 64u << 20;
// The screen size the pointer is scaled by is re-read after this (the guest
// may change its mode).
constexpr std::chrono::seconds kSizeTtl{2};
// Between a pointer's move and its button changes (a USB tablet's reports
// are polled by the guest).
constexpr std::chrono::milliseconds kPointerGap{8};
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

VmSandbox::VmSandbox(std::unique_ptr<microvm::MicrovmSandbox> inner, std::unique_ptr<QmpClient> qmp)
    : inner_(std::move(inner)), qmp_(std::move(qmp)) {}

// Without monitor_mu_: a desktop call in flight ends when QEMU does.
Status VmSandbox::Destroy() {
  Status s = inner_->Destroy();
  DropMonitor();
  return s;
}

StatusOr<std::shared_ptr<QmpClient>> VmSandbox::Monitor() {
  std::lock_guard<std::mutex> l(qmp_mu_);
  if (!qmp_) {
    ASSIGN_OR_RETURN(std::string path, inner_->QmpSocketPath());
    StatusOr<std::unique_ptr<QmpClient>> c = QmpClient::Connect(path, QmpClient::Clock::now() + kQmpTimeout);
    if (!c.ok()) return Named(c.status());
    qmp_ = std::move(*c);
  }
  return qmp_;
}

// Closed when the last desktop call using it is done.
void VmSandbox::DropMonitor() {
  guest_epoch_.fetch_add(1);
  std::lock_guard<std::mutex> l(qmp_mu_);
  qmp_.reset();
}

Status VmSandbox::Named(const Status& s) const {
  if (s.ok()) return s;
  return Status(s.code(), "sandbox " + id() + ": " + std::string(s.message()));
}

StatusOr<Screenshot> Screendump(QmpClient& qmp, std::chrono::milliseconds timeout) {
  // QEMU's uid cannot create files here: it writes into a memfd of ours,
  // passed write-only into a fresh fd set (QMP add-fd) that screendump
  // opens as /dev/fdset/<id> (QEMU dups the set's fd whose access mode
  // matches its O_WRONLY), removed again after.
  UniqueFd mem(static_cast<int>(::memfd_create("warren-screen", MFD_CLOEXEC)));
  if (!mem.valid()) return ErrnoToStatus(errno, "memfd_create");
  UniqueFd wr(::open(("/proc/self/fd/" + std::to_string(mem.get())).c_str(), O_WRONLY | O_CLOEXEC));
  if (!wr.valid()) return ErrnoToStatus(errno, "open(memfd, O_WRONLY)");
  ASSIGN_OR_RETURN(std::string added, qmp.Execute("add-fd", "", timeout, wr.get()));
  wr.reset();
  nlohmann::json a = nlohmann::json::parse(added, nullptr, /*allow_exceptions=*/false);
  if (!a.is_object() || !a.contains("fdset-id") || !a["fdset-id"].is_number_integer()) {
    return absl::InternalError("QMP add-fd: no fdset-id in " + added);
  }
  const int64_t set = a["fdset-id"].get<int64_t>();
  nlohmann::json args = {{"filename", "/dev/fdset/" + std::to_string(set)}, {"format", "png"}};
  StatusOr<std::string> r = qmp.Execute("screendump", args.dump(), timeout);
  StatusOr<std::string> removed = qmp.Execute("remove-fd", nlohmann::json{{"fdset-id", set}}.dump(), timeout);
  if (!r.ok()) return r.status();
  if (!removed.ok()) return removed.status();
  struct stat st;
  if (::fstat(mem.get(), &st) != 0) return ErrnoToStatus(errno, "fstat(memfd)");
  if (static_cast<uint64_t>(st.st_size) > kMaxPngBytes) {
    return absl::InternalError("screendump wrote " + std::to_string(st.st_size) + " bytes (limit " +
                               std::to_string(kMaxPngBytes) + ")");
  }
  std::string png(static_cast<size_t>(st.st_size), '\0');
  size_t off = 0;
  while (off < png.size()) {
    ssize_t n = ::pread(mem.get(), png.data() + off, png.size() - off, static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "pread(memfd)");
    if (n == 0) break;
    off += static_cast<size_t>(n);
  }
  png.resize(off);
  Screenshot shot;
  RETURN_IF_ERROR(PngSize(png, &shot.width, &shot.height));
  shot.png = std::move(png);
  return shot;
}

StatusOr<Screenshot> VmSandbox::TakeScreenshot() {
  std::shared_lock<std::shared_mutex> monitor(monitor_mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<QmpClient> qmp, Monitor());
  std::lock_guard<std::mutex> l(mu_);
  StatusOr<Screenshot> shot = Screendump(*qmp, kQmpTimeout);
  if (!shot.ok()) return Named(shot.status());
  width_ = shot->width;
  height_ = shot->height;
  size_at_ = std::chrono::steady_clock::now();
  return shot;
}

Status VmSandbox::Pause() {
  std::unique_lock<std::shared_mutex> monitor(monitor_mu_);
  DropMonitor();
  return inner_->Pause();
}

Status VmSandbox::Resume() {
  std::unique_lock<std::shared_mutex> monitor(monitor_mu_);
  DropMonitor();
  return inner_->Resume();  // restores first when suspended
}

Status VmSandbox::ReclaimMemory() {
  std::unique_lock<std::shared_mutex> monitor(monitor_mu_);
  DropMonitor();
  return inner_->ReclaimMemory();
}

StatusOr<uint64_t> VmSandbox::EndSuspend(bool prefetch) {
  std::unique_lock<std::shared_mutex> monitor(monitor_mu_);
  DropMonitor();
  return inner_->EndSuspend(prefetch);
}

Status VmSandbox::Send(const std::string& events_json) {
  std::shared_lock<std::shared_mutex> monitor(monitor_mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<QmpClient> qmp, Monitor());
  StatusOr<std::string> r = qmp->Execute("input-send-event", R"({"events":)" + events_json + "}", kQmpTimeout);
  return Named(r.status());
}

Status VmSandbox::Key(const std::string& combo) {
  ASSIGN_OR_RETURN(KeyBatch events, ComboEvents(combo));
  return SendKeys({events});
}

Status VmSandbox::Type(const std::string& text) {
  ASSIGN_OR_RETURN(std::vector<KeyBatch> chars, TextEvents(text));
  return SendKeys(chars);
}

Status VmSandbox::SendKeys(const std::vector<KeyBatch>& batches) {
  std::lock_guard<std::mutex> l(keys_mu_);
  if (const uint64_t e = guest_epoch_.load(); e != pacer_epoch_) {
    pacer_.Reset();
    pacer_epoch_ = e;
  }
  return pacer_.Send(
      batches, [this] { return KeyboardInterrupts(); }, [this](const std::string& events) { return Send(events); });
}

StatusOr<uint64_t> VmSandbox::KeyboardInterrupts() {
  ASSIGN_OR_RETURN(std::string text, inner_->GuestInterrupts(kQmpTimeout));
  return I8042KeyboardInterrupts(text);
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
    if (i > 0) std::this_thread::sleep_for(kPointerGap);
    RETURN_IF_ERROR(Send(batches[i]));
  }
  return absl::OkStatus();
}

Status VmSandbox::Scroll(int32_t dx, int32_t dy) {
  ASSIGN_OR_RETURN(std::string events, ScrollEvents(dx, dy));
  return Send(events);
}

}  // namespace warren::runtime::vm
