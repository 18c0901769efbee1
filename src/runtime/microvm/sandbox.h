// A running microvm sandbox (microvm_backend.h): its QEMU process, cgroup,
// disk and agent channel.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "jail/cgroup.h"
#include "net/policy.h"
#include "runtime/backend.h"
#include "runtime/desktop.h"
#include "runtime/desktop/x11_desktop.h"
#include "runtime/microvm/channel.h"
#include "runtime/microvm/qemu.h"
#include "runtime/microvm/record.pb.h"

namespace warren {
class Rollback;  // common/rollback.h
}  // namespace warren

namespace warren::net {
class SandboxNetwork;  // net/sandbox_network.h
class Exposure;        // net/expose.h
struct NetworkLease;   // net/sandbox_network.h
}  // namespace warren::net

namespace warren::runtime::microvm {

// "/proc/self/fd/<fd>/<name>" when "<dir>/<name>" does not fit a unix
// socket address (108 bytes), else the plain path. `dir_fd` must stay open
// while the returned path is used.
std::string SocketPath(const std::string& dir, int dir_fd, const std::string& name);

// The tail of the VM's console and QEMU logs, for errors ("" when empty).
std::string LogTails(const std::string& dir);

// Where a suspended VM's state lives, beside its writable disk `disk`
// ("<dir>/<id>.img" -> "<dir>/<id>.vmstate"; ".part" while being written).
std::string StateFilePath(const std::string& disk);

// Where OpenChanges exports a VM's changes, beside its writable disk
// ("<dir>/<id>.img" -> "<dir>/<id>.changes"; ".changes.tar" and
// ".changes.x" while being made).
std::string ChangesDirPath(const std::string& disk);

// The network part of the host's first hello to a VM on `lease` (network.cc):
// its address in the lease's /30 (the host end the gateway), a MAC made of
// it (02:57:<address>), and the node's DNS forwarder (`has_dns`) as its
// nameserver.
void FillNetworkHello(const net::NetworkLease& lease, bool has_dns, proto::Hello* setup);

// The policy of a create asking for a network (network.cc), parsed before
// anything is made (one the node refuses fails the create first); nullopt
// when the create asks for none. FailedPrecondition when the node has no
// network (`network` null).
StatusOr<std::optional<net::NetworkPolicy>> CreatePolicy(const std::shared_ptr<net::SandboxNetwork>& network,
                                                         const SandboxSpec& spec);

// A VM's link at its create (network.cc): a tap on `network` with `policy`
// and its chain, made before QEMU starts (its first packet is filtered),
// recorded in `rec` (index, policy); `*lease` set. Returns a queue of the
// tap for QEMU. Undone by `rb`.
StatusOr<UniqueFd> AttachTap(const std::shared_ptr<net::SandboxNetwork>& network, const std::string& id,
                             const net::NetworkPolicy& policy, record::Microvm* rec, Rollback* rb,
                             std::optional<net::NetworkLease>* lease);

// An adopted VM's recorded network (network.cc): its index taken again and
// its recorded policy re-applied on `network` (its tap outlived the daemon
// with the VM's QEMU); nothing without one. Undone by `rb`.
// FailedPrecondition when the VM has a network and the node none.
Status AdoptRecordedNetwork(const std::shared_ptr<net::SandboxNetwork>& network, const std::string& id,
                            const record::Microvm& rec, Rollback* rb);

// Removes what a VM leaves on the host besides its process and cgroup: the
// disk image, a suspended VM's state file, its exported changes and the
// runtime dir. Idempotent (gone is fine).
Status RemoveVmFiles(const std::string& dir, const std::string& disk);

// Kills the QEMU behind `pidfd` and waits (bounded by 5 s) until it
// exited; reaps it when it is a child of this process.
void KillQemu(UniqueFd pidfd);

// Pause: QMP `stop`/`cont` on the VM's monitor (<spec.dir>/qmp.sock); the
// vCPUs stop, QEMU's memory stays.
//
// Suspend (ReclaimMemory of a paused VM): QMP `migrate` of the stopped VM
// (device state and all of its RAM; zero pages cost a few bytes) into
// StateFilePath(disk), then QEMU is killed: nothing of the VM runs and its
// cgroup is empty, its memory charge 0. EndSuspend (or Resume) restores it
// on this node: a new QEMU with the same devices (the record's layer files,
// the same disk) and `-incoming defer` loads the file and stays stopped;
// Resume `cont`s it and reconnects the agent (a fresh hello: the guest's
// clock is set to the host's). The state file is removed once the restored
// QEMU runs, so a crash at any point leaves either a live QEMU or the file
// (Adopt tells which).
//
// Files and processes go over the current agent channel: a call while the
// VM is suspended fails FailedPrecondition (the node resumes first); a
// process started before a suspend ends with its channel.
//
// ChangeExporter (changes.h): the agent streams its overlay upper; a VM
// whose vCPUs are stopped (paused, e.g. by the node's freeze for a
// snapshot) runs again for the export, its commands held by the guest's
// cgroup freezer instead (from the agent's first step; they may run for
// the moment between QMP `cont` and that step), and is stopped again
// after. A suspended VM answers FailedPrecondition (resume it first).
// OpenChanges exports into <disk>.changes (replaced by the next call,
// removed with the VM) and returns it with id_base 0 (guest ids as they
// are).
//
// Network (network.cc; the record's network fields): a sandbox created with
// one has a tap "wn<T>-<i>" on the node (SandboxNetwork::kTapLink) behind
// its NIC; set_network replaces its policy like a container's. Exposed
// ports are served by dialing the guest's address over that link (a
// listener cannot join a VM's network namespace): the guest's server must
// listen on its eth0 address or 0.0.0.0, and a VM without a network cannot
// expose ports (FailedPrecondition). Destroy removes the tap, chains and
// listeners after QEMU is gone; a restore after a suspend opens a new queue
// of the same tap.
class MicrovmSandbox : public Sandbox,
                       public ProcessStarter,
                       public Pausable,
                       public Suspendable,
                       public ChangeExporter,
                       public NetworkConfigurable,
                       public Desktop {
 public:
  struct Parts {
    SandboxSpec spec;
    record::Microvm record;
    UniqueFd pidfd;  // invalid when suspended
    std::unique_ptr<jail::Cgroup> cgroup;
    std::unique_ptr<AgentChannel> channel;  // null when suspended
    std::chrono::milliseconds exec_slack{30000};
    std::chrono::milliseconds boot_timeout{60000};  // bounds a save and a restore
    std::string qemu;                               // the binary
    VmConfig restore_vm;                            // the VM as QemuArgv starts it for a restore (restore = true)
    // Another machine's restore (the vm backend's q35): when set, launches
    // the QEMU that loads the saved state (-incoming defer, jailed as at
    // the create) instead of QemuArgv(qemu, restore_vm). Its argument: the
    // listening agent and monitor sockets (as kAgentFd, kQmpFd in QEMU) and
    // the cgroup's procs files to join.
    struct RelaunchFds {
      int agent_listener = -1, qmp_listener = -1;
      std::vector<int> procs_fds;
      int tap = -1;  // a new queue of the sandbox's tap (-1: no network)
    };
    std::function<StatusOr<LaunchedQemu>(const RelaunchFds&)> relaunch;
    QemuIdentity identity;              // QEMU's uid/gid
    std::function<void()> release_uid;  // gives QEMU's uid back (Destroy)
    bool suspended = false;
    bool paused = false;
    // The node's network (null: none); the record says whether this VM has
    // a link on it.
    std::shared_ptr<net::SandboxNetwork> network;
  };
  explicit MicrovmSandbox(Parts parts);
  ~MicrovmSandbox() override;  // closes the channel; the VM keeps running

  const std::string& id() const override { return p_.spec.id; }
  // The monitor's socket (a /proc/self/fd path where the plain one is too
  // long: valid while this sandbox lives); FailedPrecondition without a dir.
  StatusOr<std::string> QmpSocketPath() const;
  StatusOr<ExecOutcome> Exec(const ExecSpec& spec) override;
  // The text of the guest's /proc/interrupts (kInterrupts), within
  // `timeout`; FailedPrecondition while suspended.
  StatusOr<std::string> GuestInterrupts(std::chrono::milliseconds timeout) const;
  SandboxFiles& files() override;
  Status Destroy() override;
  std::string Record() const override;
  pid_t init_pid() const override;
  std::string_view backend_name() const override { return "microvm"; }

  Status Pause() override;
  Status Resume() override;
  StatusOr<uint64_t> MemoryUsage() const override;
  uint64_t SwapUsage() const override;
  Status ReclaimMemory() override;
  StatusOr<uint64_t> EndSuspend(bool prefetch) override;

  // ProcessStarter (process.h).
  StatusOr<std::unique_ptr<Process>> Start(const ExecSpec& spec, const StartOptions& options) override;

  Status ExportChanges(const std::string& dst_dir, const ExportOptions& options) override;
  StatusOr<ChangeView> OpenChanges() override;

  // NetworkConfigurable (network.cc).
  Status SetNetwork(const NetworkSpec& network) override;
  NetworkSpec Network() const override;
  StatusOr<ExposedPort> Expose(uint16_t port) override;
  Status Unexpose(uint16_t port) override;
  std::vector<ExposedPort> Exposed() const override;
  StatusOr<NetworkTraffic> Traffic() const override;
  // After an adopt: the record's exposed ports listen again (same node port
  // when free, same token); one that cannot is dropped (logged).
  void RestoreExposures(const record::Microvm& rec);

  // Desktop: the X server inside the sandbox (desktop/x11_desktop.h).
  StatusOr<Screenshot> TakeScreenshot() override { return x11_.TakeScreenshot(); }
  Status Key(const std::string& combo) override { return x11_.Key(combo); }
  Status Type(const std::string& text) override { return x11_.Type(text); }
  Status Mouse(int32_t x, int32_t y, MouseButton button, MouseAction action) override {
    return x11_.Mouse(x, y, button, action);
  }
  Status Scroll(int32_t dx, int32_t dy) override { return x11_.Scroll(dx, dy); }

 private:
  // The guest's request for `es`, with the sandbox's env, cwd and user.
  proto::ExecRequest Request(const ExecSpec& es) const;
  // The live channel, or FailedPrecondition while suspended / once destroyed.
  StatusOr<std::shared_ptr<AgentChannel>> Channel() const;
  // Both with life_mu_ held.
  StatusOr<uint64_t> RestoreLocked();
  StatusOr<Qmp> ConnectQmp(std::chrono::milliseconds timeout) const;

  // network.cc: the record's network fields from the state below; the
  // tap, chains and listeners removed (Destroy, after QEMU is gone); a
  // queue of the tap for a restored QEMU (-1 without a network).
  void RecordNetwork(record::Microvm* r) const;
  Status ReleaseNetwork();
  StatusOr<UniqueFd> OpenTapQueue() const;
  StatusOr<std::unique_ptr<net::Exposure>> OpenExposure(uint16_t port, uint16_t listen_port, std::string token);

  Parts p_;
  mutable std::mutex net_mu_;  // the four below
  bool has_network_ = false;
  uint32_t net_index_ = 0;
  NetworkSpec network_;
  std::map<uint16_t, std::unique_ptr<net::Exposure>> exposed_;
  std::unique_ptr<SandboxFiles> files_;
  UniqueFd dir_fd_;                        // O_PATH of spec.dir: socket paths longer than sun_path go through it
  std::mutex life_mu_;                     // serializes pause/resume/suspend/restore/destroy
  mutable std::mutex mu_;                  // destroyed_, channel_, p_.pidfd, p_.record
  std::shared_ptr<AgentChannel> channel_;  // null while suspended
  bool destroyed_ = false;
  desktop::X11Desktop x11_{*this};  // last: it only holds a reference to *this
};

}  // namespace warren::runtime::microvm
