#include "runtime/microvm/microvm_backend.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>

#include "common/file_util.h"
#include "common/log.h"
#include "common/rollback.h"
#include "jail/cgroup.h"
#include "net/sandbox_network.h"
#include "runtime/container/uid_slots.h"
#include "runtime/microvm/channel.h"
#include "runtime/microvm/kvm_probe.h"
#include "runtime/microvm/qemu.h"
#include "runtime/microvm/sandbox.h"
#include "runtime/microvm/template.h"

namespace warren::runtime {

namespace {

using microvm::AgentChannel;
using microvm::kAgentFd;
using microvm::kQmpFd;
using microvm::kRamFd;
using microvm::MicrovmSandbox;

// Below this the guest kernel and the agent do not fit (the kernel alone
// reserves ~50 MiB, the initramfs unpacks into RAM).
constexpr uint32_t kMinMemoryMb = 128;
// QEMU's threads (vCPUs, RCU, I/O workers) with room.
constexpr uint32_t kQemuPids = 64;
constexpr std::chrono::milliseconds kAdoptTimeout{10000};

bool PidfdAlive(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

Status CheckFile(const std::string& path, const std::string& what) {
  struct stat st;
  if (path.empty()) return absl::FailedPreconditionError("microvm: no " + what + " configured");
  if (::stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, "microvm: " + what + " " + path);
  if (!S_ISREG(st.st_mode)) return absl::FailedPreconditionError("microvm: " + what + " " + path + " is not a file");
  return absl::OkStatus();
}

class MicrovmBackend : public Backend {
 public:
  MicrovmBackend(MicrovmOptions o, std::unique_ptr<jail::CgroupManager> cgroups, std::unique_ptr<UidSlots> uids)
      : o_(std::move(o)), cgroups_(std::move(cgroups)), uids_(std::move(uids)) {
    if (!o_.template_dir.empty()) {
      microvm::TemplateOptions t;
      t.qemu = o_.qemu;
      t.kernel = o_.kernel;
      t.initrd = o_.initrd;
      t.dir = o_.template_dir;
      t.boot_timeout = o_.boot_timeout;
      t.identity = {o_.uid_base + o_.max_vms, o_.uid_base + o_.max_vms};
      templates_ = std::make_unique<microvm::TemplateCache>(std::move(t));
    }
  }

  std::string name() const override { return "microvm"; }
  Capabilities capabilities() const override {
    if (o_.network != nullptr)
      return {Capability::kProcesses, Capability::kPause, Capability::kSuspend, Capability::kExportChanges,
              Capability::kNetwork};
    return {Capability::kProcesses, Capability::kPause, Capability::kSuspend, Capability::kExportChanges};
  }

  StatusOr<std::unique_ptr<Sandbox>> Create(const SandboxSpec& spec) override {
    RETURN_IF_ERROR(Validate(spec));
    // The policy first: one the node refuses fails the create before
    // anything is made.
    std::optional<net::NetworkPolicy> policy;
    if (spec.network.enabled) {
      if (o_.network == nullptr)
        return absl::FailedPreconditionError("sandbox " + spec.id +
                                             ": this node has no sandbox network (warrend --sandbox-net)");
      ASSIGN_OR_RETURN(policy, o_.network->Parse(spec.network.allow, spec.network.deny));
    }
    if (templates_ && microvm::FitsTemplate(spec.layer_files, spec.resources.disk_mb)) {
      microvm::VmConfig shape = BaseConfig(spec);
      shape.nic = true;  // every template has one (microvm_backend.h)
      StatusOr<std::shared_ptr<const microvm::Template>> t = templates_->Get(shape);
      if (t.ok()) {
        bool guest_answered = false;
        StatusOr<std::unique_ptr<Sandbox>> sb = CreateVm(spec, policy, t->get(), &guest_answered);
        // A guest that answered (e.g. with a bad layer) would fail a cold
        // boot the same way.
        if (sb.ok() || guest_answered) return sb;
        Log(spdlog::level::warn, "microvm clone failed; booting cold",
            {{"sandbox", spec.id}, {"error", sb.status().ToString()}});
      } else {
        LogNoTemplateOnce(t.status());
      }
    }
    return CreateVm(spec, policy, nullptr, nullptr);
  }

 private:
  // The VM of `spec` (disk paths, console and sockets aside).
  microvm::VmConfig BaseConfig(const SandboxSpec& spec) const {
    microvm::VmConfig vm;
    vm.kernel = o_.kernel;
    vm.initrd = o_.initrd;
    vm.accel = Accel();
    vm.tsc_khz = vm.accel == "tcg" ? microvm::HostTscKhz() : 0;  // measured once, at the first create
    vm.memory_mb = spec.resources.memory_mb;
    vm.cpus = o_.cpus;
    vm.layer_files = spec.layer_files;
    vm.hostname = spec.hostname.empty() ? spec.id.substr(0, 63) : spec.hostname;
    vm.shm_mb = spec.resources.tmpfs_mb;
    vm.pids = spec.resources.pids;
    return vm;
  }

  void LogNoTemplateOnce(const Status& why) {
    std::lock_guard<std::mutex> l(log_mu_);
    if (why.ToString() == last_template_error_) return;
    last_template_error_ = why.ToString();
    Log(spdlog::level::warn, "no microvm template; creates boot cold", {{"reason", last_template_error_}});
  }

  // A cold boot, or (`tmpl` set) a clone of `tmpl`. `guest_answered`: set
  // when the guest's agent replied to the hello.
  // With `policy`: a network link (tap) with that policy.
  StatusOr<std::unique_ptr<Sandbox>> CreateVm(const SandboxSpec& spec, const std::optional<net::NetworkPolicy>& policy,
                                              const microvm::Template* tmpl, bool* guest_answered) {
    // Declared before the rollback guard: its undos use them.
    microvm::record::Microvm rec;
    std::unique_ptr<jail::Cgroup> cgroup;
    microvm::LaunchedQemu q;
    Rollback rb;
    // Where a create's time goes (logged once it succeeded): ms since t0.
    const auto t0 = std::chrono::steady_clock::now();
    auto ms = [&t0] {
      return std::to_string(
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count());
    };
    std::string disk_ms, net_ms = "-", launch_ms, restore_ms = "-";
    rec.set_accel(Accel());
    rec.set_cgroup(spec.id);
    rec.set_disk(o_.disk_dir + "/" + spec.id + ".img");

    RETURN_IF_ERROR(microvm::MakeDisk(rec.disk(), spec.resources.disk_mb));
    rb.Add([&] { ::unlink(rec.disk().c_str()); });
    ASSIGN_OR_RETURN(uint32_t slot, uids_->Take());
    rec.set_uid_slot(slot);
    rb.Add([this, slot] { uids_->Release(slot); });
    disk_ms = ms();

    jail::CgroupLimits limits;
    limits.cpu_millis = spec.resources.cpu_millis;
    limits.memory_bytes = (uint64_t{spec.resources.memory_mb} + microvm::kQemuOverheadMb) << 20;
    limits.pids = kQemuPids;
    ASSIGN_OR_RETURN(cgroup, cgroups_->Create(rec.cgroup(), limits));
    rb.Add([&] {
      Status s = cgroup->Destroy(std::chrono::seconds(5));
      if (!s.ok()) Log(spdlog::level::err, "rollback: removing the VM's cgroup failed", {{"error", s.ToString()}});
    });
    ASSIGN_OR_RETURN(std::vector<UniqueFd> procs, cgroup->OpenProcsFds());

    UniqueFd dir(::open(spec.dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!dir.valid()) return ErrnoToStatus(errno, "open(" + spec.dir + ")");
    rb.Add([&spec] {
      for (const char* f : {"/agent.sock", "/qmp.sock", "/console.log", "/qemu.log"}) ::unlink((spec.dir + f).c_str());
    });
    std::string sock_path = microvm::SocketPath(spec.dir, dir.get(), "agent.sock");
    UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!listener.valid()) return ErrnoToStatus(errno, "socket(AF_UNIX)");
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path, sock_path.c_str(), sock_path.size() + 1);
    if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
      return ErrnoToStatus(errno, "bind(" + spec.dir + "/agent.sock)");
    }
    if (::listen(listener.get(), 1) != 0) return ErrnoToStatus(errno, "listen(" + spec.dir + "/agent.sock)");

    microvm::VmConfig vm = BaseConfig(spec);
    vm.disk = rec.disk();
    vm.console_log = spec.dir + "/console.log";
    vm.name = "warren:" + spec.id;
    vm.agent_listen_fd = kAgentFd;
    std::vector<std::pair<int, int>> fds = {{listener.get(), kAgentFd}};
    std::vector<UniqueFd> files;
    RETURN_IF_ERROR(microvm::OpenVmFiles(&vm, microvm::kFirstFileFd, &files, &fds));
    // Every VM has its monitor (pause, suspend; a clone's restore).
    const std::string qmp_path = microvm::SocketPath(spec.dir, dir.get(), "qmp.sock");
    ASSIGN_OR_RETURN(UniqueFd qmp_listener, microvm::ListenUnix(qmp_path));
    vm.qmp_listen_fd = kQmpFd;
    fds.push_back({qmp_listener.get(), kQmpFd});
    // The network: tap and chain before QEMU (its first packet is filtered).
    std::optional<net::NetworkLease> lease;
    UniqueFd tap;
    if (policy) {
      ASSIGN_OR_RETURN(lease, o_.network->Attach(spec.id, net::SandboxNetwork::kTapLink, *policy));
      rb.Add([this, index = lease->index] { (void)o_.network->Release(index); });
      ASSIGN_OR_RETURN(tap, o_.network->OpenTapQueue(*lease));
      fds.push_back({tap.get(), microvm::kTapFd});
      rec.set_network(true);
      rec.set_network_index(lease->index);
      for (const std::string& a : policy->AllowText()) rec.add_network_allow(a);
      for (const std::string& d : policy->DenyText()) rec.add_network_deny(d);
      net_ms = ms();
    }
    vm.nic = tmpl != nullptr || lease.has_value();
    vm.tap_fd = lease ? microvm::kTapFd : -1;
    rec.set_nic(vm.nic);
    if (tmpl != nullptr) {
      vm.ram_fd = kRamFd;
      vm.ram_shared = false;  // MAP_PRIVATE: the template's pages, copied on write
      vm.restore = true;
      fds.push_back({tmpl->ram.get(), kRamFd});
    }
    for (const std::string& f : vm.layer_files) rec.add_layer_files(f);
    rec.set_ram_named(tmpl != nullptr);
    std::vector<int> procs_fds;
    procs_fds.reserve(procs.size());
    for (const UniqueFd& fd : procs) procs_fds.push_back(fd.get());
    ASSIGN_OR_RETURN(
        q, microvm::LaunchQemu(microvm::QemuArgv(o_.qemu, vm), fds, spec.dir + "/qemu.log", procs_fds, Identity(slot)));
    listener.reset();  // QEMU holds it now
    files.clear();
    tap.reset();
    qmp_listener.reset();
    rec.set_qemu_pid(q.pid);
    rec.set_qemu_start_time(q.start_time);
    launch_ms = ms();
    // Runs before the cgroup's removal (reverse order of registration).
    rb.Add([&] { microvm::KillQemu(std::move(q.pidfd)); });

    const auto deadline = AgentChannel::Clock::now() + o_.boot_timeout;
    microvm::proto::Hello setup;
    if (tmpl != nullptr) {
      Status s = microvm::RestoreClone(qmp_path, *tmpl, deadline);
      if (!s.ok()) return Status(s.code(), std::string(s.message()) + microvm::LogTails(spec.dir));
      restore_ms = ms();
      setup.setup_root = true;
      setup.layers = vm.layer_files.size();
      setup.hostname = vm.hostname;
      setup.shm_mb = vm.shm_mb;
      setup.pids = vm.pids;
    }
    if (lease) {
      setup.net_addr = lease->sandbox_addr;
      setup.net_prefix = 30;
      setup.net_gateway = lease->host_addr;
      const uint32_t a = lease->sandbox_addr;
      setup.net_mac = {'\x02',
                       '\x57',
                       static_cast<char>(a >> 24),
                       static_cast<char>(a >> 16),
                       static_cast<char>(a >> 8),
                       static_cast<char>(a)};
      // Any server it names is redirected to the forwarder; this one is for
      // an image that names none.
      if (o_.network->has_dns()) setup.nameserver = lease->host_addr;
    }
    microvm::proto::HelloReply hello;
    int pidfd = q.pidfd.get();
    StatusOr<std::unique_ptr<AgentChannel>> ch = AgentChannel::Connect(
        spec.id, sock_path, deadline, [pidfd] { return PidfdAlive(pidfd); }, &hello, setup);
    if (!ch.ok()) {
      std::string extra = ch.status().code() == absl::StatusCode::kDeadlineExceeded
                              ? " (" + std::to_string(o_.boot_timeout.count()) + " ms)"
                              : "";
      return Status(ch.status().code(), std::string(ch.status().message()) + extra + microvm::LogTails(spec.dir));
    }
    if (guest_answered != nullptr) *guest_answered = true;
    if (!hello.error.empty()) {
      return absl::FailedPreconditionError("sandbox " + spec.id +
                                           ": the guest could not set up its root: " + hello.error);
    }
    if (lease && !hello.nic) {
      // An agent of an older initramfs ignores the NIC fields: the VM
      // would look networked and reach nothing.
      return absl::FailedPreconditionError("sandbox " + spec.id +
                                           ": the guest agent did not configure its NIC (an initramfs older than "
                                           "the network: rebuild it with scripts/microvm/build-guest.sh)");
    }
    rec.set_kernel_release(hello.kernel_release);
    rec.set_boot_id(hello.boot_id);
    Log(spdlog::level::info, "microvm started (ms since the create began)",
        {{"sandbox", spec.id},
         {"clone", tmpl != nullptr ? "true" : "false"},
         {"disk", disk_ms},
         {"network", net_ms},
         {"launched", launch_ms},
         {"restored", restore_ms},
         {"answered", ms()}});

    MicrovmSandbox::Parts parts;
    parts.spec = spec;
    parts.record = rec;
    parts.pidfd = std::move(q.pidfd);
    parts.cgroup = std::move(cgroup);
    parts.channel = std::move(*ch);
    FillRestore(&parts);
    rb.Commit();
    return std::unique_ptr<Sandbox>(new MicrovmSandbox(std::move(parts)));
  }

  // A recorded network: its index re-taken and its policy re-applied
  // (the tap outlived the daemon with the VM's QEMU). Undone by `rb`.
  Status AdoptNetwork(const std::string& id, const microvm::record::Microvm& rec, Rollback* rb) {
    if (!rec.network()) return absl::OkStatus();
    if (o_.network == nullptr)
      return absl::FailedPreconditionError("sandbox " + id +
                                           " has a network but this daemon has none (warrend --sandbox-net)");
    std::vector<std::string> allow(rec.network_allow().begin(), rec.network_allow().end());
    std::vector<std::string> deny(rec.network_deny().begin(), rec.network_deny().end());
    ASSIGN_OR_RETURN(net::NetworkPolicy policy, o_.network->Parse(allow, deny, /*recorded=*/true));
    ASSIGN_OR_RETURN(net::NetworkLease lease,
                     o_.network->Adopt(id, rec.network_index(), net::SandboxNetwork::kTapLink, policy));
    rb->Add([this, index = lease.index] { (void)o_.network->Release(index); });
    return absl::OkStatus();
  }

 public:
  StatusOr<std::unique_ptr<Sandbox>> Adopt(const SandboxSpec& spec, const std::string& backend_record) override {
    microvm::record::Microvm rec;
    // qemu_pid is 0 in the record of a suspended VM.
    if (backend_record.empty() || !rec.ParseFromString(backend_record) || rec.disk().empty() || rec.qemu_pid() < 0) {
      return absl::InvalidArgumentError("sandbox " + spec.id + ": not a microvm record");
    }
    StatusOr<std::unique_ptr<jail::Cgroup>> cgroup = cgroups_->Open(rec.cgroup());
    MicrovmSandbox::Parts parts;
    parts.spec = spec;
    if (rec.has_uid_slot() && !uids_->TakeSpecific(rec.uid_slot())) {
      return absl::FailedPreconditionError("sandbox " + spec.id + ": its uid slot " + std::to_string(rec.uid_slot()) +
                                           " is held by another sandbox or daemon");
    }
    Rollback rb;
    if (rec.has_uid_slot()) rb.Add([this, &rec] { uids_->Release(rec.uid_slot()); });
    // A saved state file is the VM (suspended): a QEMU in its cgroup is one
    // whose restore a crash cut short (the file goes only once a restore
    // finished), killed here.
    const std::string state = microvm::StateFilePath(rec.disk());
    if (::access(state.c_str(), F_OK) == 0) {
      if (!cgroup.ok()) return cgroup.status();
      if (!(*cgroup)->Empty()) {
        RETURN_IF_ERROR((*cgroup)->SignalAll(SIGKILL));
        for (int i = 0; i < 500 && !(*cgroup)->Empty(); ++i) ::usleep(10000);
        if (!(*cgroup)->Empty()) return absl::InternalError("sandbox " + spec.id + ": its cgroup did not empty");
      }
      rec.set_qemu_pid(0);
      rec.set_qemu_start_time(0);
      RETURN_IF_ERROR(AdoptNetwork(spec.id, rec, &rb));
      parts.record = rec;
      parts.cgroup = std::move(*cgroup);
      parts.suspended = true;
      parts.paused = true;
      FillRestore(&parts);
      rb.Commit();
      auto sb = std::make_unique<MicrovmSandbox>(std::move(parts));
      sb->RestoreExposures(rec);
      return std::unique_ptr<Sandbox>(std::move(sb));
    }
    ASSIGN_OR_RETURN(UniqueFd pidfd, FindQemu(spec.id, &rec, cgroup.ok() ? cgroup->get() : nullptr));
    UniqueFd dir(::open(spec.dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!dir.valid()) return ErrnoToStatus(errno, "open(" + spec.dir + ")");
    // A VM stopped by Pause is let run for the hello (its agent answers
    // only then); the node pauses it again after Adopt if its record says
    // so.
    {
      StatusOr<microvm::Qmp> qmp = microvm::Qmp::Connect(microvm::SocketPath(spec.dir, dir.get(), "qmp.sock"),
                                                         microvm::Qmp::Clock::now() + std::chrono::seconds(10));
      if (qmp.ok()) {
        StatusOr<std::string> st = qmp->Command(R"({"execute":"query-status"})");
        if (st.ok() && st->find("\"running\": true") == std::string::npos) {
          (void)qmp->Command(R"({"execute":"cont"})");  // the hello needs the guest running
        }
      }
    }
    microvm::proto::HelloReply hello;
    int fd = pidfd.get();
    ASSIGN_OR_RETURN(std::unique_ptr<AgentChannel> ch,
                     AgentChannel::Connect(
                         spec.id, microvm::SocketPath(spec.dir, dir.get(), "agent.sock"),
                         AgentChannel::Clock::now() + kAdoptTimeout, [fd] { return PidfdAlive(fd); }, &hello));
    if (hello.boot_id != rec.boot_id()) {
      return absl::FailedPreconditionError("sandbox " + spec.id + ": its guest rebooted (boot id " + hello.boot_id +
                                           ", recorded " + rec.boot_id() + ")");
    }
    RETURN_IF_ERROR(AdoptNetwork(spec.id, rec, &rb));
    parts.record = rec;
    parts.pidfd = std::move(pidfd);
    if (cgroup.ok()) parts.cgroup = std::move(*cgroup);
    parts.channel = std::move(ch);
    FillRestore(&parts);
    rb.Commit();
    auto sb = std::make_unique<MicrovmSandbox>(std::move(parts));
    sb->RestoreExposures(rec);
    return std::unique_ptr<Sandbox>(std::move(sb));
  }

  Status Cleanup(const SandboxSpec& spec, const std::string& backend_record) override {
    microvm::record::Microvm rec;
    std::string disk = o_.disk_dir + "/" + spec.id + ".img";
    std::string cgroup_rel = spec.id;
    if (!backend_record.empty() && rec.ParseFromString(backend_record)) {
      if (!rec.disk().empty()) disk = rec.disk();
      if (!rec.cgroup().empty()) cgroup_rel = rec.cgroup();
      pid_t pid = rec.qemu_pid();
      if (pid > 0 && microvm::ProcessStartTime(pid) == rec.qemu_start_time()) {
        UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
        if (pidfd.valid() && microvm::ProcessStartTime(pid) == rec.qemu_start_time()) {
          microvm::KillQemu(std::move(pidfd));
        }
      }
    }
    // Whatever is left in the VM's cgroup (a QEMU of a create a crash cut
    // short has no record yet).
    Status first;
    StatusOr<std::unique_ptr<jail::Cgroup>> cg = cgroups_->Open(cgroup_rel);
    if (cg.ok()) {
      Status s = (*cg)->Destroy(std::chrono::seconds(5));
      if (!s.ok()) first = s;
    }
    Status s = microvm::RemoveVmFiles(spec.dir, disk);
    if (rec.has_uid_slot()) uids_->Release(rec.uid_slot());
    // Its tap and chains (QEMU is gone), unless a live sandbox holds that index.
    if (rec.network() && o_.network != nullptr && !o_.network->InUse(rec.network_index())) {
      Status ns = o_.network->Release(rec.network_index());
      if (s.ok()) s = ns;
    }
    return first.ok() ? s : first;
  }

 private:
  // What a sandbox needs to restore itself after a suspend.
  void FillRestore(MicrovmSandbox::Parts* parts) const {
    const SandboxSpec& spec = parts->spec;
    const microvm::record::Microvm& rec = parts->record;
    microvm::VmConfig vm;
    vm.accel = rec.accel().empty() ? Accel() : rec.accel();
    vm.memory_mb = spec.resources.memory_mb;
    vm.cpus = o_.cpus;
    vm.layer_files.assign(rec.layer_files().begin(), rec.layer_files().end());
    vm.disk = rec.disk();
    vm.console_log = spec.dir + "/console.log";
    vm.hostname = spec.hostname.empty() ? spec.id.substr(0, 63) : spec.hostname;
    vm.ram_named = rec.ram_named();
    vm.nic = rec.nic();  // its tap queue: opened at the restore
    vm.name = "warren:" + spec.id;
    vm.restore = true;
    parts->restore_vm = std::move(vm);
    parts->qemu = o_.qemu;
    if (rec.has_uid_slot()) {
      const uint32_t slot = rec.uid_slot();
      parts->identity = Identity(slot);
      parts->release_uid = [this, slot] { uids_->Release(slot); };
    }
    parts->network = o_.network;
    parts->exec_slack = o_.exec_slack;
    parts->boot_timeout = o_.boot_timeout;
  }

  // The VM's QEMU: the recorded pid when it is still that process, else
  // the one process in the VM's cgroup (a QEMU restored after a suspend has
  // another pid than the node's record of the create). *rec gets its pid.
  StatusOr<UniqueFd> FindQemu(const std::string& id, microvm::record::Microvm* rec, jail::Cgroup* cgroup) {
    pid_t pid = rec->qemu_pid();
    if (pid > 0 && microvm::ProcessStartTime(pid) == rec->qemu_start_time()) {
      UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
      // Checked again with the pidfd held: the pid cannot be reused now.
      if (pidfd.valid() && microvm::ProcessStartTime(pid) == rec->qemu_start_time()) return pidfd;
    }
    if (cgroup != nullptr) {
      std::vector<pid_t> pids = cgroup->Pids(false);
      if (pids.size() == 1) {
        UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pids[0], 0)));
        std::vector<pid_t> again = cgroup->Pids(false);
        if (pidfd.valid() && again.size() == 1 && again[0] == pids[0]) {
          rec->set_qemu_pid(pids[0]);
          rec->set_qemu_start_time(microvm::ProcessStartTime(pids[0]));
          return pidfd;
        }
      }
    }
    return absl::NotFoundError("sandbox " + id + ": its QEMU (pid " + std::to_string(pid) + ") is gone");
  }

  microvm::QemuIdentity Identity(uint32_t slot) const {
    const uid_t id = uids_->HostUid(slot);
    return {id, id};
  }

  // The configured accelerator, or the probe's answer for "auto".
  std::string Accel() const { return o_.accel == "auto" ? o_.accel_choice.get().accel : o_.accel; }

  Status Validate(const SandboxSpec& spec) const {
    RETURN_IF_ERROR(CheckFile(o_.kernel, "guest kernel"));
    RETURN_IF_ERROR(CheckFile(o_.initrd, "guest initramfs"));
    if (spec.layer_files.empty()) {
      return absl::InvalidArgumentError("sandbox " + spec.id + ": the microvm backend needs the layers as image files");
    }
    for (size_t i = 0; i < spec.layer_files.size(); ++i) {
      Status s = CheckFile(spec.layer_files[i], "layer[" + std::to_string(i) + "] image");
      if (!s.ok()) return Status(absl::StatusCode::kNotFound, s.message());
    }
    if (spec.layer_files.size() > 64) return absl::InvalidArgumentError("microvm: at most 64 layers");
    if (spec.resources.memory_mb < kMinMemoryMb) {
      return absl::InvalidArgumentError("memory_mb=" + std::to_string(spec.resources.memory_mb) + " is below the " +
                                        std::to_string(kMinMemoryMb) + " MiB a microvm guest kernel needs");
    }
    for (char c : spec.hostname) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.') {
        return absl::InvalidArgumentError("microvm: hostname \"" + spec.hostname + "\" may only hold [A-Za-z0-9.-]");
      }
    }
    return absl::OkStatus();
  }

  const MicrovmOptions o_;
  std::unique_ptr<jail::CgroupManager> cgroups_;
  std::unique_ptr<UidSlots> uids_;
  std::unique_ptr<microvm::TemplateCache> templates_;  // warm starts; null: every create boots cold
  std::mutex log_mu_;
  std::string last_template_error_;
};

}  // namespace

Status CheckMicrovmHost(const MicrovmOptions& o) {
  RETURN_IF_ERROR(CheckFile(o.qemu, "QEMU"));
  RETURN_IF_ERROR(CheckFile(o.kernel, "guest kernel"));
  RETURN_IF_ERROR(CheckFile(o.initrd, "guest initramfs"));
  // QEMU runs as an unprivileged uid of its own and opens them itself.
  for (const auto& [path, what] : {std::pair{o.kernel, "guest kernel"}, std::pair{o.initrd, "guest initramfs"}}) {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && (st.st_mode & S_IROTH) == 0) {
      return absl::FailedPreconditionError(std::string("microvm: ") + what + " " + path +
                                           " must be readable by all (QEMU runs as an unprivileged uid): chmod o+r");
    }
  }
  if (o.accel != "tcg" && o.accel != "kvm" && o.accel != "auto") {
    return absl::InvalidArgumentError("microvm: accel must be tcg, kvm or auto, not \"" + o.accel + "\"");
  }
  if (o.accel == "auto" && !o.accel_choice.valid()) {
    return absl::InvalidArgumentError("microvm: accel=auto needs the probe's answer (ChooseAccel)");
  }
  return absl::OkStatus();
}

StatusOr<std::shared_future<AccelChoice>> ChooseAccel(const std::string& accel) {
  if (accel == "tcg" || accel == "kvm") {
    std::promise<AccelChoice> p;
    p.set_value({accel, "set by configuration (accel=" + accel + ")"});
    return p.get_future().share();
  }
  if (accel != "auto") {
    return absl::InvalidArgumentError("microvm: accel must be tcg, kvm or auto, not \"" + accel + "\"");
  }
  // std::async's shared state joins the thread when the last future goes:
  // bounded by the probe's deadline.
  return std::async(std::launch::async,
                    [] {
                      StatusOr<::warren::microvm::KvmProbeResult> r = ::warren::microvm::ProbeKvm();
                      if (!r.ok()) return AccelChoice{"tcg", "the KVM probe could not run: " + r.status().ToString()};
                      return AccelChoice{::warren::microvm::AccelName(r->accel), "KVM probe: " + r->reason};
                    })
      .share();
}

StatusOr<std::unique_ptr<Backend>> NewMicrovmBackend(const MicrovmOptions& options) {
  RETURN_IF_ERROR(CheckMicrovmHost(options));
  if (options.disk_dir.empty()) return absl::InvalidArgumentError("microvm: disk_dir is required");
  RETURN_IF_ERROR(MkdirAll(options.disk_dir, 0700));
  // Templates of an earlier daemon: their RAM (a memfd) died with it; a
  // build it was doing when killed left its QEMU.
  if (!options.template_dir.empty() && ::access(options.template_dir.c_str(), F_OK) == 0) {
    microvm::KillTemplateQemus(options.qemu, options.template_dir);
    RETURN_IF_ERROR(RemoveTree(options.template_dir));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<jail::CgroupManager> cgroups,
                   jail::CgroupManager::Detect(options.cgroup_name, /*view_hierarchies=*/false));
  if (options.max_vms == 0 || uint64_t{options.uid_base} + options.max_vms >= 0xfffffffeu) {
    return absl::InvalidArgumentError("microvm: uid_base + max_vms must stay below 4294967294");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<UidSlots> uids,
                   UidSlots::Open(options.uid_lock_dir, options.disk_dir, options.max_vms, options.uid_base, 1));
  return std::unique_ptr<Backend>(new MicrovmBackend(options, std::move(cgroups), std::move(uids)));
}

}  // namespace warren::runtime
