// A running vm sandbox (vm_backend.h): the microvm sandbox that carries its
// QEMU, cgroup, disk and agent channel (exec and destroy), plus the QMP
// monitor that serves the desktop (runtime/desktop.h).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "runtime/desktop.h"
#include "runtime/microvm/sandbox.h"
#include "runtime/vm/qmp.h"

namespace warren::runtime::vm {

// Width and height from a PNG's IHDR; InvalidArgument when `png` is not one.
Status PngSize(const std::string& png, uint32_t* width, uint32_t* height);

// The screen of the QEMU behind `qmp` as PNG (QMP screendump into a memfd
// passed with add-fd), each QMP call bounded by `timeout`.
StatusOr<Screenshot> Screendump(QmpClient& qmp, std::chrono::milliseconds timeout);

// Pause/Resume: QMP stop/cont on the sandbox's own monitor connection (QEMU
// serves one QMP client at a time, so not the microvm sandbox's, which
// would connect anew). Every other call of the node resumes first.
//
// Processes (exec streams, background processes, PTYs, sessions): the
// guest agent's, through the microvm sandbox.
class VmSandbox : public Sandbox, public Desktop, public Pausable, public ProcessStarter {
 public:
  VmSandbox(std::unique_ptr<microvm::MicrovmSandbox> inner, std::unique_ptr<QmpClient> qmp);

  const std::string& id() const override { return inner_->id(); }
  StatusOr<ExecOutcome> Exec(const ExecSpec& spec) override { return inner_->Exec(spec); }
  SandboxFiles& files() override { return inner_->files(); }
  Status Destroy() override;
  std::string Record() const override { return inner_->Record(); }
  pid_t init_pid() const override { return inner_->init_pid(); }
  std::string_view backend_name() const override { return "vm"; }

  // Desktop. QMP calls are bounded by kQmpTimeout.
  StatusOr<Screenshot> TakeScreenshot() override;
  Status Key(const std::string& combo) override;
  Status Type(const std::string& text) override;
  Status Mouse(int32_t x, int32_t y, MouseButton button, MouseAction action) override;
  Status Scroll(int32_t dx, int32_t dy) override;

  StatusOr<std::unique_ptr<Process>> Start(const ExecSpec& spec, const StartOptions& options) override {
    return inner_->Start(spec, options);
  }

  // Pausable.
  Status Pause() override;
  Status Resume() override;

  static constexpr std::chrono::milliseconds kQmpTimeout{10000};

 private:
  Status Send(const std::string& events_json);
  // The error of a QMP call, named for the sandbox.
  Status Named(const Status& s) const;

  std::unique_ptr<microvm::MicrovmSandbox> inner_;
  std::unique_ptr<QmpClient> qmp_;
  std::mutex life_mu_;  // pause/resume
  bool paused_ = false;
  std::mutex mu_;  // the screen size; one screendump at a time
  uint32_t width_ = 0, height_ = 0;
  std::chrono::steady_clock::time_point size_at_{};
};

}  // namespace warren::runtime::vm
