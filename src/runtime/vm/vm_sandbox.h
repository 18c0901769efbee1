// A running vm sandbox (vm_backend.h): the microvm sandbox that carries its
// QEMU, cgroup, disk and agent channel (exec and destroy), plus the QMP
// monitor that serves the desktop (runtime/desktop.h).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "runtime/desktop.h"
#include "runtime/microvm/sandbox.h"
#include "runtime/vm/key_pacer.h"
#include "runtime/vm/qmp.h"

namespace warren::runtime::vm {

// Width and height from a PNG's IHDR; InvalidArgument when `png` is not one.
Status PngSize(const std::string& png, uint32_t* width, uint32_t* height);

// The screen of the QEMU behind `qmp` as PNG (QMP screendump into a memfd
// passed with add-fd), each QMP call bounded by `timeout`.
StatusOr<Screenshot> Screendump(QmpClient& qmp, std::chrono::milliseconds timeout);

// The monitor (QMP) serves one client at a time: the desktop's calls share
// one connection (made on demand), and every lifecycle call drops it first
// and goes through the microvm sandbox, which connects anew:
//
// Pause/Resume: QMP stop/cont. Every other call of the node resumes first.
//
// Suspend (ReclaimMemory of a paused VM) and EndSuspend: the microvm
// mechanism (sandbox.h): the stopped VM's devices, video RAM and all of its
// RAM into a file beside its disk, QEMU killed (nothing runs, its cgroup
// empty); the restore launches this backend's q35 QEMU again, jailed as at
// the create, with -incoming defer (a template clone's RAM comes back
// whole from the file: it no longer shares the template's pages), and
// Resume `cont`s it and says hello to the agent again (the guest's clock
// set). The desktop is as it was: same boot, same screen.
//
// Processes (exec streams, background processes, PTYs, sessions): the
// guest agent's, through the microvm sandbox.
//
// Network (a create with network on a node with --sandbox-net): the
// microvm sandbox's, on a tap plugged into the NIC every template has.
//
// Changes (snapshot, fork, isolated grading): the root is an overlay of the
// sandbox's layers (vm_backend.h); the guest agent streams its upper dir
// from the writable disk, as a microVM's (microvm/sandbox.h ExportChanges).
// What the running system wrote there (its logs, X's and the session's
// files) is part of the changes, as a container's /var/log would be.
class VmSandbox : public Sandbox,
                  public Desktop,
                  public Pausable,
                  public Suspendable,
                  public ProcessStarter,
                  public ChangeExporter,
                  public NetworkConfigurable {
 public:
  // `qmp` may be null (a suspended VM adopted after a restart).
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

  // NetworkConfigurable: the microvm sandbox's (its tap on the node's
  // network, exposed ports dialed over it; the agent configures eth0).
  Status SetNetwork(const NetworkSpec& network) override { return inner_->SetNetwork(network); }
  NetworkSpec Network() const override { return inner_->Network(); }
  StatusOr<ExposedPort> Expose(uint16_t port) override { return inner_->Expose(port); }
  Status Unexpose(uint16_t port) override { return inner_->Unexpose(port); }
  std::vector<ExposedPort> Exposed() const override { return inner_->Exposed(); }
  StatusOr<NetworkTraffic> Traffic() const override { return inner_->Traffic(); }

  // ChangeExporter.
  Status ExportChanges(const std::string& dst_dir, const ExportOptions& options) override {
    return inner_->ExportChanges(dst_dir, options);
  }
  StatusOr<ChangeView> OpenChanges() override { return inner_->OpenChanges(); }

  // Pausable.
  Status Pause() override;
  Status Resume() override;

  // Suspendable.
  StatusOr<uint64_t> MemoryUsage() const override { return inner_->MemoryUsage(); }
  uint64_t SwapUsage() const override { return inner_->SwapUsage(); }
  Status ReclaimMemory() override;
  StatusOr<uint64_t> EndSuspend(bool prefetch) override;

  static constexpr std::chrono::milliseconds kQmpTimeout{10000};

 private:
  Status Send(const std::string& events_json);
  // Keys, paced to the guest's keyboard queue (key_pacer.h).
  Status SendKeys(const std::vector<KeyBatch>& batches);
  // The guest's i8042 keyboard interrupts (its /proc/interrupts, read
  // through the agent).
  StatusOr<uint64_t> KeyboardInterrupts();
  // The error of a QMP call, named for the sandbox.
  Status Named(const Status& s) const;
  // The desktop's monitor connection, made when there is none. Call with
  // monitor_mu_ held shared.
  StatusOr<std::shared_ptr<QmpClient>> Monitor();
  // Drops the desktop's connection (with monitor_mu_ held exclusively):
  // QEMU takes the microvm sandbox's next.
  void DropMonitor();

  std::unique_ptr<microvm::MicrovmSandbox> inner_;
  // Shared: desktop calls; exclusive: lifecycle calls (pause, resume,
  // suspend, restore, destroy), which need the monitor to themselves.
  std::shared_mutex monitor_mu_;
  std::mutex qmp_mu_;  // qmp_
  std::shared_ptr<QmpClient> qmp_;
  std::mutex keys_mu_;  // one Key/Type at a time; pacer_, pacer_epoch_
  KeyPacer pacer_;
  uint64_t pacer_epoch_ = 0;
  // Bumped by every lifecycle call (DropMonitor): the pacer starts afresh
  // on a guest that may have been restored.
  std::atomic<uint64_t> guest_epoch_{0};
  std::mutex mu_;  // the screen size; one screendump at a time
  uint32_t width_ = 0, height_ = 0;
  std::chrono::steady_clock::time_point size_at_{};
};

}  // namespace warren::runtime::vm
