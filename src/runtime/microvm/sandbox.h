// A running microvm sandbox (microvm_backend.h): its QEMU process, cgroup,
// disk and agent channel.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "jail/cgroup.h"
#include "runtime/backend.h"
#include "runtime/microvm/channel.h"
#include "runtime/microvm/record.pb.h"

namespace warren::runtime::microvm {

// "/proc/self/fd/<fd>/<name>" when "<dir>/<name>" does not fit a unix
// socket address (108 bytes), else the plain path. `dir_fd` must stay open
// while the returned path is used.
std::string SocketPath(const std::string& dir, int dir_fd, const std::string& name);

// The tail of the VM's console and QEMU logs, for errors ("" when empty).
std::string LogTails(const std::string& dir);

// Removes what a VM leaves on the host besides its process and cgroup: the
// disk image and the runtime dir. Idempotent (gone is fine).
Status RemoveVmFiles(const std::string& dir, const std::string& disk);

// Kills the QEMU behind `pidfd` and waits (bounded by 5 s) until it
// exited; reaps it when it is a child of this process.
void KillQemu(UniqueFd pidfd);

class MicrovmSandbox : public Sandbox, public ProcessStarter {
 public:
  struct Parts {
    SandboxSpec spec;
    record::Microvm record;
    UniqueFd pidfd;
    std::unique_ptr<jail::Cgroup> cgroup;
    std::unique_ptr<AgentChannel> channel;
    std::chrono::milliseconds exec_slack{30000};
  };
  explicit MicrovmSandbox(Parts parts);
  ~MicrovmSandbox() override;  // closes the channel; the VM keeps running

  const std::string& id() const override { return p_.spec.id; }
  StatusOr<ExecOutcome> Exec(const ExecSpec& spec) override;
  SandboxFiles& files() override;
  Status Destroy() override;
  std::string Record() const override { return p_.record.SerializeAsString(); }
  pid_t init_pid() const override { return p_.record.qemu_pid(); }
  std::string_view backend_name() const override { return "microvm"; }
  // ProcessStarter (process.h).
  StatusOr<std::unique_ptr<Process>> Start(const ExecSpec& spec, const StartOptions& options) override;

 private:
  // The guest's request for `es`, with the sandbox's env, cwd and user.
  proto::ExecRequest Request(const ExecSpec& es) const;

  Parts p_;
  std::unique_ptr<SandboxFiles> files_;
  std::mutex mu_;  // destroyed_ and the channel's and pidfd's release
  bool destroyed_ = false;
};

}  // namespace warren::runtime::microvm
