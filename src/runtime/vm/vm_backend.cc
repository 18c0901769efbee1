#include "runtime/vm/vm_backend.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>

#include "common/file_util.h"
#include "common/fnv.h"
#include "common/log.h"
#include "common/rollback.h"
#include "jail/cgroup.h"
#include "net/sandbox_network.h"
#include "runtime/container/uid_slots.h"
#include "runtime/microvm/channel.h"
#include "runtime/microvm/qemu.h"
#include "runtime/microvm/sandbox.h"
#include "runtime/microvm/template.h"
#include "runtime/vm/qmp.h"
#include "runtime/vm/vm_sandbox.h"
#include "runtime/vm/vm_template.h"

extern char** environ;

namespace warren::runtime {

namespace {

using microvm::AgentChannel;
using microvm::kAgentFd;
using microvm::kQmpFd;

// systemd, udev and Xorg need this much; below it the guest swaps itself to
// death under TCG rather than failing clearly.
constexpr uint32_t kMinMemoryMb = 384;
// QEMU's memory beyond the guest RAM: microvm's (TCG cache, heap, threads)
// plus the VGA's 16 MiB of video RAM and the USB and PCI devices.
constexpr uint32_t kVmOverheadMb = microvm::kQemuOverheadMb + 64;
constexpr uint32_t kQemuPids = 64;
// Disks of a VM's root at most (its layers and the writable one: the
// guest's boot script reads wl0..wl99).
constexpr size_t kMaxLayers = 64;
constexpr std::chrono::milliseconds kAdoptTimeout{10000};
// The monitor of a QEMU whose guest answered: it is up, the connect is quick.
constexpr std::chrono::milliseconds kQmpConnectTimeout{10000};

bool PidfdAlive(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

// A file the backend needs: FailedPrecondition naming it (and errno's
// reason) when it is missing or not a regular file: the host is not set up,
// nothing the client can change.
Status CheckFile(const std::string& path, const std::string& what) {
  struct stat st;
  if (path.empty()) return absl::FailedPreconditionError("vm: no " + what + " configured");
  if (::stat(path.c_str(), &st) != 0) {
    return absl::FailedPreconditionError("vm: " + what + " " + path + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return absl::FailedPreconditionError("vm: " + what + " " + path + " is not a file");
  return absl::OkStatus();
}

// The fd numbers in QEMU of the files a VM's QEMU gets (microvm::QemuFiles,
// from microvm::kFirstFileFd on).
struct VmFileFds {
  std::vector<int> layers;  // the root's layers, bottom first, read-only (virtio serials wl<i>)
  int base = -1;            // upper.img (an empty ext4), read-only: the writable overlay's backing node
  int disk_rw = -1;         // the qcow2 overlay; one fd set with disk_ro
  int disk_ro = -1;
  int console = -1;  // appended to
  int kernel = -1;   // read as /proc/self/fd/<n>
  int initrd = -1;
};

// Runs argv (stdio on /dev/null) and waits; an error names the tool and its
// exit status.
Status RunTool(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& s : argv) args.push_back(const_cast<char*>(s.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  int rc = ::posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return ErrnoToStatus(rc, "posix_spawn(" + argv[0] + ")");
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0) {
    if (errno != EINTR) return ErrnoToStatus(errno, "waitpid(" + argv[0] + ")");
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    return absl::InternalError(argv[0] + " failed (wait status " + std::to_string(st) + ")");
  }
  return absl::OkStatus();
}

// How the guest's RAM is backed (the migration stream names RAM blocks:
// a clone and its template, a suspended VM and its restore must agree).
enum class Ram {
  kAnonymous,  // -m alone: a cold boot without templates
  kTemplate,   // memory-backend-file "ram0" on the template's memfd, share=on
  kClone,      // the same memfd, share=off: copy-on-write over the template
  // A restore after a suspend (-incoming defer, the RAM whole from the
  // saved state): plain RAM, named "ram0" as the saved VM's was when it was
  // a clone (the stream names the RAM blocks).
  kRestorePlain,
  kRestoreNamed,
};

class VmBackend : public Backend {
 public:
  VmBackend(VmOptions o, std::unique_ptr<jail::CgroupManager> cgroups, std::unique_ptr<UidSlots> uids)
      : o_(std::move(o)), cgroups_(std::move(cgroups)), uids_(std::move(uids)) {
    if (!o_.template_dir.empty()) {
      templates_ = std::make_unique<vm::TemplateCache>(
          o_.template_dir, std::vector<std::string>{o_.guest_dir + "/system.erofs", o_.guest_dir + "/upper.img",
                                                    o_.guest_dir + "/vmlinuz", o_.guest_dir + "/initrd.img", o_.qemu});
    }
  }

  std::string name() const override { return "vm"; }
  Capabilities capabilities() const override {
    if (o_.network != nullptr)
      return {Capability::kPause, Capability::kSuspend, Capability::kProcesses, Capability::kExportChanges,
              Capability::kNetwork};
    return {Capability::kPause, Capability::kSuspend, Capability::kProcesses, Capability::kExportChanges};
  }

  StatusOr<std::unique_ptr<Sandbox>> Create(const SandboxSpec& spec) override {
    RETURN_IF_ERROR(CheckVmHost(o_));
    if (spec.resources.memory_mb < kMinMemoryMb) {
      return absl::InvalidArgumentError("memory_mb=" + std::to_string(spec.resources.memory_mb) + " is below the " +
                                        std::to_string(kMinMemoryMb) + " MiB a vm guest (systemd and X) needs");
    }
    ASSIGN_OR_RETURN(const std::optional<net::NetworkPolicy> policy, microvm::CreatePolicy(o_.network, spec));
    ASSIGN_OR_RETURN(const std::vector<std::string> layers, RootLayers(spec));
    if (templates_) {
      const uint32_t memory_mb = spec.resources.memory_mb;
      // A template per layer set too: the booted system's root is mounted.
      uint64_t h = kFnv1a64Offset;  // of the layer files' paths (content-addressed in the store)
      for (const std::string& l : layers) h = Fnv1a64(l + '\n', h);
      const std::string shape = "m" + std::to_string(memory_mb) + "-s" + std::to_string(o_.screen_width) + "x" +
                                std::to_string(o_.screen_height) + "-c" + std::to_string(o_.cpus) + "-" + Accel() +
                                "-l" + Hex16(h);
      StatusOr<std::shared_ptr<const vm::Template>> t = templates_->Get(
          shape, [this, memory_mb, &layers](const std::string& dir) { return BuildTemplate(dir, memory_mb, layers); });
      if (t.ok()) {
        bool guest_answered = false;
        StatusOr<std::unique_ptr<Sandbox>> sb = CreateVm(spec, layers, policy, t->get(), &guest_answered);
        if (sb.ok() || guest_answered) return sb;
        Log(spdlog::level::warn, "vm clone failed; booting cold",
            {{"sandbox", spec.id}, {"error", sb.status().ToString()}});
      } else if (absl::IsDeadlineExceeded(t.status())) {
        // The guest did not answer, or its desktop did not come up, in time.
        return Status(t.status().code(), "sandbox " + spec.id + ": " + std::string(t.status().message()));
      } else {
        LogNoTemplateOnce(t.status());
      }
    }
    return CreateVm(spec, layers, policy, nullptr, nullptr);
  }

 private:
  // The VM's root layers, bottom first: the sandbox's base (its first
  // layer), the guest's system layer (system.erofs: built over the base
  // rootfs, build-guest.sh), then the sandbox's other layers. The upper
  // layers of the sandbox win over the system's files, as a toolset's over
  // a base's. InvalidArgument without layers; NotFound naming a missing one.
  StatusOr<std::vector<std::string>> RootLayers(const SandboxSpec& spec) const {
    if (spec.layer_files.empty()) {
      return absl::InvalidArgumentError("sandbox " + spec.id +
                                        ": the vm backend needs the layers as image files (a base layer at least)");
    }
    if (spec.layer_files.size() + 1 > kMaxLayers) {
      return absl::InvalidArgumentError("sandbox " + spec.id + ": at most " + std::to_string(kMaxLayers - 1) +
                                        " layers on the vm backend");
    }
    for (size_t i = 0; i < spec.layer_files.size(); ++i) {
      Status s = CheckFile(spec.layer_files[i], "layer[" + std::to_string(i) + "] image");
      if (!s.ok()) return Status(absl::StatusCode::kNotFound, s.message());
    }
    std::vector<std::string> layers = {spec.layer_files[0], o_.guest_dir + "/system.erofs"};
    layers.insert(layers.end(), spec.layer_files.begin() + 1, spec.layer_files.end());
    return layers;
  }

  void LogNoTemplateOnce(const Status& why) {
    std::lock_guard<std::mutex> l(log_mu_);
    if (why.ToString() == last_template_error_) return;
    last_template_error_ = why.ToString();
    Log(spdlog::level::warn, "no vm template; creates boot cold", {{"reason", last_template_error_}});
  }

  // The template of `memory_mb` into `dir`: a cold boot (its own uid, no
  // cgroup of a sandbox: its memory is the daemon's) of an overlay in `dir`
  // with its RAM in a memfd, left until the desktop takes input, then saved
  // (x-ignore-shared: the RAM stays in the memfd) and its QEMU ended.
  StatusOr<std::shared_ptr<vm::Template>> BuildTemplate(const std::string& dir, uint32_t memory_mb,
                                                        const std::vector<std::string>& layers) {
    const auto t0 = std::chrono::steady_clock::now();
    auto t = std::make_shared<vm::Template>();
    t->state_file = dir + "/state";
    t->disk = dir + "/disk.qcow2";
    t->memory_mb = memory_mb;
    RETURN_IF_ERROR(
        RunTool({o_.qemu_img, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", o_.guest_dir + "/upper.img", t->disk}));
    t->ram.reset(static_cast<int>(::memfd_create("warren-vm-template-ram", MFD_CLOEXEC | MFD_ALLOW_SEALING)));
    if (!t->ram.valid()) return ErrnoToStatus(errno, "memfd_create(warren-vm-template-ram)");
    const auto bytes = static_cast<off_t>(uint64_t{memory_mb} << 20);
    // Allocated now, charged to the daemon (microvm/template.cc's reason: a
    // clone's fault on a page the template never touched would otherwise
    // allocate it in the memfd, charged to that clone).
    if (::ftruncate(t->ram.get(), bytes) != 0) return ErrnoToStatus(errno, "ftruncate(template memfd)");
    if (::fallocate(t->ram.get(), 0, 0, bytes) != 0) return ErrnoToStatus(errno, "fallocate(template memfd)");
    // Declared before the rollback guard: its undos use it (a QEMU object
    // gone before the guard ran would leave the template's QEMU running).
    microvm::LaunchedQemu q;
    ASSIGN_OR_RETURN(uint32_t slot, uids_->Take());
    Rollback rb;
    rb.Add([this, slot] { uids_->Release(slot); });
    UniqueFd dir_fd(::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!dir_fd.valid()) return ErrnoToStatus(errno, "open(" + dir + ")");
    const std::string agent_path = microvm::SocketPath(dir, dir_fd.get(), "agent.sock");
    const std::string qmp_path = microvm::SocketPath(dir, dir_fd.get(), "qmp.sock");
    ASSIGN_OR_RETURN(UniqueFd agent_listener, microvm::ListenUnix(agent_path));
    ASSIGN_OR_RETURN(UniqueFd qmp_listener, microvm::ListenUnix(qmp_path));
    {
      microvm::QemuFiles files(microvm::kFirstFileFd);
      ASSIGN_OR_RETURN(VmFileFds f, OpenFiles(&files, layers, t->disk, dir));
      std::vector<std::pair<int, int>> fds = {
          {agent_listener.get(), kAgentFd}, {qmp_listener.get(), kQmpFd}, {t->ram.get(), microvm::kRamFd}};
      fds.insert(fds.end(), files.fds().begin(), files.fds().end());
      // Its NIC without a backend: each clone plugs its own tap in.
      ASSIGN_OR_RETURN(q, microvm::LaunchQemu(Argv("warren-vm-template:" + dir, memory_mb, Accel(), f, Ram::kTemplate,
                                                   /*nic=*/true, /*tap=*/false),
                                              fds, dir + "/qemu.log", {}, Identity(slot)));
    }
    agent_listener.reset();
    qmp_listener.reset();
    rb.Add([&] { microvm::KillQemu(std::move(q.pidfd)); });
    auto fail = [&dir](const Status& s) { return Status(s.code(), std::string(s.message()) + microvm::LogTails(dir)); };
    // The monitor first, while QEMU is surely quick to answer it; held for
    // the desktop's input and the save. Its deadline bounds the save's
    // commands too (With: microvm::Qmp's default deadline is Connect's).
    StatusOr<std::unique_ptr<vm::QmpClient>> qmp =
        vm::QmpClient::Connect(qmp_path, AgentChannel::Clock::now() + 2 * o_.boot_timeout + o_.desktop_timeout);
    if (!qmp.ok()) return fail(qmp.status());
    int pidfd = q.pidfd.get();
    microvm::proto::HelloReply hello;
    StatusOr<std::unique_ptr<AgentChannel>> ch = AgentChannel::Connect(
        "vm template " + dir, agent_path, AgentChannel::Clock::now() + o_.boot_timeout,
        [pidfd] { return PidfdAlive(pidfd); }, &hello);
    if (!ch.ok()) {
      std::string extra = absl::IsDeadlineExceeded(ch.status()) ? " (the desktop template's boot; boot timeout " +
                                                                      std::to_string(o_.boot_timeout.count()) + " ms)"
                                                                : "";
      return fail(Status(ch.status().code(), std::string(ch.status().message()) + extra));
    }
    if (!hello.error.empty())
      return absl::FailedPreconditionError("the template guest's agent reports: " + hello.error);
    const auto booted = std::chrono::steady_clock::now();
    Status s = vm::WaitForDesktop(**ch, **qmp, AgentChannel::Clock::now() + o_.desktop_timeout);
    if (absl::IsDeadlineExceeded(s)) {
      s = Status(s.code(), std::string(s.message()) + " (desktop timeout " +
                               std::to_string(o_.desktop_timeout.count()) + " ms after the guest answered)");
    }
    if (!s.ok()) return fail(s);
    (*ch)->Close();  // the agent waits for the next host: a clone's
    ch->reset();
    s = (*qmp)->With([&](microvm::Qmp& m) -> Status {
      RETURN_IF_ERROR(microvm::SetIgnoreShared(m, true));
      UniqueFd state(::open(t->state_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
      if (!state.valid()) return ErrnoToStatus(errno, "open(" + t->state_file + ")");
      // Not `stop` first: the stream records the run state (clones of a
      // stopped template would stay paused). The migration's end flushes
      // the overlay's qcow2 metadata and stops the guest.
      return microvm::MigrateToFd(m, state.get(), microvm::Qmp::Clock::now() + o_.boot_timeout);
    });
    if (!s.ok()) return fail(s);
    qmp->reset();
    rb.Commit();
    microvm::KillQemu(std::move(q.pidfd));  // no shared writable mapping is left: sealing works
    uids_->Release(slot);
    if (::fcntl(t->ram.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
      return ErrnoToStatus(errno, "fcntl(template memfd, F_ADD_SEALS)");
    }
    for (const char* f : {"/agent.sock", "/qmp.sock", "/console.log", "/qemu.log"}) ::unlink((dir + f).c_str());
    t->dir = dir;  // removed with the template from here on
    auto ms = [](auto d) { return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()); };
    Log(spdlog::level::info, "vm template saved",
        {{"template", dir}, {"booted_ms", ms(booted - t0)}, {"saved_ms", ms(std::chrono::steady_clock::now() - t0)}});
    return t;
  }

  // A cold boot, or (`tmpl` set) a clone of `tmpl`. `guest_answered`: set
  // when the guest's agent replied to the hello.
  StatusOr<std::unique_ptr<Sandbox>> CreateVm(const SandboxSpec& spec, const std::vector<std::string>& layers,
                                              const std::optional<net::NetworkPolicy>& policy, const vm::Template* tmpl,
                                              bool* guest_answered) {
    microvm::record::Microvm rec;
    std::unique_ptr<jail::Cgroup> cgroup;
    microvm::LaunchedQemu q;
    Rollback rb;
    const auto t0 = std::chrono::steady_clock::now();
    auto ms = [&t0] {
      return std::to_string(
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count());
    };
    std::string disk_ms, net_ms = "-", launch_ms, restore_ms = "-";
    rec.set_accel(Accel());
    rec.set_cgroup(spec.id);
    rec.set_disk(o_.disk_dir + "/" + spec.id + ".qcow2");
    for (const std::string& l : layers) rec.add_layer_files(l);

    if (tmpl != nullptr) {
      // The template's overlay as its save left it: the guest's page cache
      // and mounted file system match it.
      RETURN_IF_ERROR(vm::CopyDisk(tmpl->disk, rec.disk()));
    } else {
      // Copy-on-write over the shared base; QEMU opens the base read-only.
      RETURN_IF_ERROR(RunTool(
          {o_.qemu_img, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", o_.guest_dir + "/upper.img", rec.disk()}));
    }
    rb.Add([&] { ::unlink(rec.disk().c_str()); });
    ASSIGN_OR_RETURN(uint32_t slot, uids_->Take());
    rec.set_uid_slot(slot);
    rb.Add([this, slot] { uids_->Release(slot); });
    disk_ms = ms();

    jail::CgroupLimits limits;
    limits.cpu_millis = spec.resources.cpu_millis;
    limits.memory_bytes = (uint64_t{spec.resources.memory_mb} + kVmOverheadMb) << 20;
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
      for (const char* f : {"/agent.sock", "/qmp.sock", "/console.log", "/qemu.log"}) {
        ::unlink((spec.dir + f).c_str());
      }
    });
    const std::string agent_path = microvm::SocketPath(spec.dir, dir.get(), "agent.sock");
    const std::string qmp_path = microvm::SocketPath(spec.dir, dir.get(), "qmp.sock");
    ASSIGN_OR_RETURN(UniqueFd agent_listener, microvm::ListenUnix(agent_path));
    ASSIGN_OR_RETURN(UniqueFd qmp_listener, microvm::ListenUnix(qmp_path));
    // The network: tap and chain before QEMU (its first packet is filtered).
    std::optional<net::NetworkLease> lease;
    UniqueFd tap;
    if (policy) {
      ASSIGN_OR_RETURN(tap, microvm::AttachTap(o_.network, spec.id, *policy, &rec, &rb, &lease));
      net_ms = ms();
    }
    // A clone has its template's NIC (restores must declare it).
    rec.set_nic(tmpl != nullptr || lease.has_value());

    {
      // Every file QEMU uses, as an open fd: its uid reaches none of them.
      microvm::QemuFiles files(microvm::kFirstFileFd);
      ASSIGN_OR_RETURN(VmFileFds f, OpenFiles(&files, layers, rec.disk(), spec.dir));
      std::vector<std::pair<int, int>> fds = {{agent_listener.get(), kAgentFd}, {qmp_listener.get(), kQmpFd}};
      if (tmpl != nullptr) fds.push_back({tmpl->ram.get(), microvm::kRamFd});
      if (tap.valid()) fds.push_back({tap.get(), microvm::kTapFd});
      fds.insert(fds.end(), files.fds().begin(), files.fds().end());
      std::vector<int> procs_fds;
      procs_fds.reserve(procs.size());
      for (const UniqueFd& fd : procs) procs_fds.push_back(fd.get());
      ASSIGN_OR_RETURN(
          q, microvm::LaunchQemu(Argv("warren:" + spec.id, spec.resources.memory_mb, rec.accel(), f,
                                      tmpl != nullptr ? Ram::kClone : Ram::kAnonymous, rec.nic(), tap.valid()),
                                 fds, spec.dir + "/qemu.log", procs_fds, Identity(slot)));
    }  // QEMU holds the files, the tap and the sockets now
    tap.reset();
    agent_listener.reset();
    qmp_listener.reset();
    rec.set_qemu_pid(q.pid);
    rec.set_qemu_start_time(q.start_time);
    rec.set_ram_named(tmpl != nullptr);
    launch_ms = ms();
    rb.Add([&] { microvm::KillQemu(std::move(q.pidfd)); });

    const auto deadline = AgentChannel::Clock::now() + o_.boot_timeout;
    std::unique_ptr<vm::QmpClient> qmp;
    if (tmpl != nullptr) {
      // The saved state goes in over the monitor; the agent is spoken to
      // once the guest runs.
      // `deadline` bounds the restore's commands too (With).
      ASSIGN_OR_RETURN(qmp, vm::QmpClient::Connect(qmp_path, deadline));
      Status s = qmp->With([&](microvm::Qmp& m) -> Status {
        RETURN_IF_ERROR(microvm::SetIgnoreShared(m, true));
        UniqueFd state(::open(tmpl->state_file.c_str(), O_RDONLY | O_CLOEXEC));
        if (!state.valid()) return ErrnoToStatus(errno, "open(" + tmpl->state_file + ")");
        bool running = false;
        RETURN_IF_ERROR(microvm::MigrateFromFd(m, state.get(), deadline, &running));
        if (!running) return absl::InternalError("the restored clone is not running");
        return absl::OkStatus();
      });
      if (!s.ok()) return Status(s.code(), std::string(s.message()) + microvm::LogTails(spec.dir));
      restore_ms = ms();
    }
    // The agent's hello first on a boot: its wait notices a QEMU that
    // exited (the monitor's connect alone would retry until the deadline).
    // A clone's hello sets its clock and reseeds its RNG.
    // The NIC is configured by the agent (service mode: at its first hello).
    microvm::proto::Hello setup;
    if (lease) microvm::FillNetworkHello(*lease, o_.network->has_dns(), &setup);
    microvm::proto::HelloReply hello;
    int pidfd = q.pidfd.get();
    StatusOr<std::unique_ptr<AgentChannel>> ch = AgentChannel::Connect(
        spec.id, agent_path, deadline, [pidfd] { return PidfdAlive(pidfd); }, &hello, setup);
    if (!ch.ok()) {
      std::string extra = ch.status().code() == absl::StatusCode::kDeadlineExceeded
                              ? " (boot timeout " + std::to_string(o_.boot_timeout.count()) + " ms)"
                              : "";
      return Status(ch.status().code(), std::string(ch.status().message()) + extra + microvm::LogTails(spec.dir));
    }
    if (guest_answered != nullptr) *guest_answered = true;
    if (!hello.error.empty()) {
      return absl::FailedPreconditionError("sandbox " + spec.id + ": the guest agent reports: " + hello.error);
    }
    if (lease && !hello.nic) {
      return absl::FailedPreconditionError("sandbox " + spec.id +
                                           ": the guest agent did not configure its NIC (a guest older than the "
                                           "network: rebuild it with scripts/vm/build-guest.sh)");
    }
    if (!qmp) {
      ASSIGN_OR_RETURN(qmp, vm::QmpClient::Connect(qmp_path, AgentChannel::Clock::now() + kQmpConnectTimeout));
    }
    rec.set_kernel_release(hello.kernel_release);
    rec.set_boot_id(hello.boot_id);
    Log(spdlog::level::info, "vm started (ms since the create began)",
        {{"sandbox", spec.id},
         {"clone", tmpl != nullptr ? "true" : "false"},
         {"disk", disk_ms},
         {"network", net_ms},
         {"launched", launch_ms},
         {"restored", restore_ms},
         {"answered", ms()}});
    microvm::MicrovmSandbox::Parts parts;
    parts.spec = spec;
    parts.record = rec;
    parts.pidfd = std::move(q.pidfd);
    parts.cgroup = std::move(cgroup);
    parts.channel = std::move(*ch);
    parts.exec_slack = o_.exec_slack;
    parts.identity = Identity(slot);
    parts.release_uid = [this, slot] { uids_->Release(slot); };
    parts.network = o_.network;
    FillRelaunch(&parts);
    rb.Commit();
    return std::unique_ptr<Sandbox>(
        new vm::VmSandbox(std::make_unique<microvm::MicrovmSandbox>(std::move(parts)), std::move(qmp)));
  }

 public:
  StatusOr<std::unique_ptr<Sandbox>> Adopt(const SandboxSpec& spec, const std::string& backend_record) override {
    microvm::record::Microvm rec;
    if (backend_record.empty() || !rec.ParseFromString(backend_record) || rec.disk().empty()) {
      return absl::InvalidArgumentError("sandbox " + spec.id + ": not a vm record");
    }
    // A saved state file is the VM (suspended): a QEMU in its cgroup is one
    // whose restore a crash cut short (the file goes only once a restore
    // finished), killed here.
    if (::access(microvm::StateFilePath(rec.disk()).c_str(), F_OK) == 0) return AdoptSuspended(spec, rec);
    if (rec.qemu_pid() <= 0) return absl::InvalidArgumentError("sandbox " + spec.id + ": not a vm record");
    pid_t pid = rec.qemu_pid();
    auto gone = [&] {
      return absl::NotFoundError("sandbox " + spec.id + ": its QEMU (pid " + std::to_string(pid) + ") is gone");
    };
    if (microvm::ProcessStartTime(pid) != rec.qemu_start_time()) return gone();
    UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    if (!pidfd.valid() || microvm::ProcessStartTime(pid) != rec.qemu_start_time()) return gone();
    // Its uid is this daemon's again (and no other VM's: the slot's claim
    // names this daemon's disk dir, which the create wrote).
    if (rec.has_uid_slot() && !uids_->TakeSpecific(rec.uid_slot())) {
      return absl::FailedPreconditionError("sandbox " + spec.id + ": its uid slot " + std::to_string(rec.uid_slot()) +
                                           " is held by another sandbox or daemon");
    }
    Rollback rb;
    if (rec.has_uid_slot()) rb.Add([this, &rec] { uids_->Release(rec.uid_slot()); });
    StatusOr<std::unique_ptr<jail::Cgroup>> cgroup = cgroups_->Open(rec.cgroup());
    UniqueFd dir(::open(spec.dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!dir.valid()) return ErrnoToStatus(errno, "open(" + spec.dir + ")");
    const auto deadline = AgentChannel::Clock::now() + kAdoptTimeout;
    ASSIGN_OR_RETURN(std::unique_ptr<vm::QmpClient> qmp,
                     vm::QmpClient::Connect(microvm::SocketPath(spec.dir, dir.get(), "qmp.sock"), deadline));
    // A VM stopped by Pause runs for the hello (its agent answers only
    // then); the node pauses it again after Adopt when its record says so.
    StatusOr<std::string> st = qmp->Execute("query-status", "", kQmpConnectTimeout);
    if (st.ok() && st->find("\"running\": true") == std::string::npos &&
        st->find("\"running\":true") == std::string::npos) {
      RETURN_IF_ERROR(qmp->Execute("cont", "", kQmpConnectTimeout).status());
    }
    microvm::proto::HelloReply hello;
    int fd = pidfd.get();
    ASSIGN_OR_RETURN(std::unique_ptr<AgentChannel> ch,
                     AgentChannel::Connect(
                         spec.id, microvm::SocketPath(spec.dir, dir.get(), "agent.sock"), deadline,
                         [fd] { return PidfdAlive(fd); }, &hello));
    if (hello.boot_id != rec.boot_id()) {
      return absl::FailedPreconditionError("sandbox " + spec.id + ": its guest rebooted (boot id " + hello.boot_id +
                                           ", recorded " + rec.boot_id() + ")");
    }
    RETURN_IF_ERROR(microvm::AdoptRecordedNetwork(o_.network, spec.id, rec, &rb));
    microvm::MicrovmSandbox::Parts parts;
    FillAdopted(&parts, spec, rec);
    parts.pidfd = std::move(pidfd);
    if (cgroup.ok()) parts.cgroup = std::move(*cgroup);
    parts.channel = std::move(ch);
    rb.Commit();
    auto inner = std::make_unique<microvm::MicrovmSandbox>(std::move(parts));
    inner->RestoreExposures(rec);
    return std::unique_ptr<Sandbox>(new vm::VmSandbox(std::move(inner), std::move(qmp)));
  }

  StatusOr<std::unique_ptr<Sandbox>> AdoptSuspended(const SandboxSpec& spec, microvm::record::Microvm rec) {
    if (rec.has_uid_slot() && !uids_->TakeSpecific(rec.uid_slot())) {
      return absl::FailedPreconditionError("sandbox " + spec.id + ": its uid slot " + std::to_string(rec.uid_slot()) +
                                           " is held by another sandbox or daemon");
    }
    Rollback rb;
    if (rec.has_uid_slot()) rb.Add([this, &rec] { uids_->Release(rec.uid_slot()); });
    ASSIGN_OR_RETURN(std::unique_ptr<jail::Cgroup> cgroup, cgroups_->Open(rec.cgroup()));
    if (!cgroup->Empty()) {
      RETURN_IF_ERROR(cgroup->SignalAll(SIGKILL));
      for (int i = 0; i < 500 && !cgroup->Empty(); ++i) ::usleep(10000);
      if (!cgroup->Empty()) return absl::InternalError("sandbox " + spec.id + ": its cgroup did not empty");
    }
    rec.set_qemu_pid(0);
    rec.set_qemu_start_time(0);
    RETURN_IF_ERROR(microvm::AdoptRecordedNetwork(o_.network, spec.id, rec, &rb));
    microvm::MicrovmSandbox::Parts parts;
    FillAdopted(&parts, spec, rec);
    parts.cgroup = std::move(cgroup);
    parts.suspended = true;
    parts.paused = true;
    rb.Commit();
    auto inner = std::make_unique<microvm::MicrovmSandbox>(std::move(parts));
    inner->RestoreExposures(rec);
    return std::unique_ptr<Sandbox>(new vm::VmSandbox(std::move(inner), nullptr));
  }

  Status Cleanup(const SandboxSpec& spec, const std::string& backend_record) override {
    microvm::record::Microvm rec;
    std::string disk = o_.disk_dir + "/" + spec.id + ".qcow2";
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
    // Whatever is left in the VM's cgroup (a QEMU of a create that a crash
    // cut short has no record yet).
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
  microvm::QemuIdentity Identity(uint32_t slot) const {
    const uid_t id = uids_->HostUid(slot);
    return {id, id};
  }

  std::string Accel() const { return o_.accel == "auto" ? o_.accel_choice.get().accel : o_.accel; }

  // Every file a VM's QEMU uses, opened into `files` (QEMU's uid reaches
  // none of them by path): the root's `layers` (RootLayers), the guest's
  // empty upper.img, kernel and initramfs, the VM's overlay `disk` and its
  // console log in `dir`.
  StatusOr<VmFileFds> OpenFiles(microvm::QemuFiles* files, const std::vector<std::string>& layers,
                                const std::string& disk, const std::string& dir) const {
    VmFileFds f;
    for (const std::string& l : layers) {
      ASSIGN_OR_RETURN(int fd, files->Open(l, O_RDONLY));
      f.layers.push_back(fd);
    }
    ASSIGN_OR_RETURN(f.base, files->Open(o_.guest_dir + "/upper.img", O_RDONLY));
    ASSIGN_OR_RETURN(f.disk_rw, files->Open(disk, O_RDWR));
    ASSIGN_OR_RETURN(f.disk_ro, files->Open(disk, O_RDONLY));
    ASSIGN_OR_RETURN(f.console, files->Open(dir + "/console.log", O_WRONLY | O_CREAT | O_APPEND));
    ASSIGN_OR_RETURN(f.kernel, files->Open(o_.guest_dir + "/vmlinuz", O_RDONLY));
    ASSIGN_OR_RETURN(f.initrd, files->Open(o_.guest_dir + "/initrd.img", O_RDONLY));
    return f;
  }

  // An adopted VM's parts from its record: its uid slot's identity (taken
  // by the caller), the restore after a suspend.
  void FillAdopted(microvm::MicrovmSandbox::Parts* parts, const SandboxSpec& spec,
                   const microvm::record::Microvm& rec) {
    parts->spec = spec;
    parts->record = rec;
    parts->exec_slack = o_.exec_slack;
    parts->network = o_.network;
    if (rec.has_uid_slot()) {
      const uint32_t slot = rec.uid_slot();
      parts->identity = Identity(slot);
      parts->release_uid = [this, slot] { uids_->Release(slot); };
    }
    FillRelaunch(parts);
  }

  // The restore of a suspended VM (MicrovmSandbox::Parts::relaunch): this
  // backend's QEMU with the recorded disk, jailed as at the create (its
  // uid, every file an open fd), loading the state (-incoming defer).
  void FillRelaunch(microvm::MicrovmSandbox::Parts* parts) const {
    const SandboxSpec spec = parts->spec;
    const microvm::record::Microvm rec = parts->record;
    const microvm::QemuIdentity identity = parts->identity;
    parts->boot_timeout = o_.boot_timeout;
    parts->relaunch = [this, spec, rec, identity](
                          const microvm::MicrovmSandbox::Parts::RelaunchFds& in) -> StatusOr<microvm::LaunchedQemu> {
      microvm::QemuFiles files(microvm::kFirstFileFd);
      const std::vector<std::string> layers(rec.layer_files().begin(), rec.layer_files().end());
      ASSIGN_OR_RETURN(VmFileFds f, OpenFiles(&files, layers, rec.disk(), spec.dir));
      std::vector<std::pair<int, int>> fds = {{in.agent_listener, kAgentFd}, {in.qmp_listener, kQmpFd}};
      if (in.tap >= 0) fds.push_back({in.tap, microvm::kTapFd});
      fds.insert(fds.end(), files.fds().begin(), files.fds().end());
      return microvm::LaunchQemu(
          Argv("warren:" + spec.id, spec.resources.memory_mb, rec.accel(), f,
               rec.ram_named() ? Ram::kRestoreNamed : Ram::kRestorePlain, rec.nic(), in.tap >= 0),
          fds, spec.dir + "/qemu.log", in.procs_fds, identity);
    };
  }

  // QEMU's command line for a VM named `name` (-name: what `ps` shows and
  // KillTemplateQemus looks for). A clone's must equal its template's in
  // every device and RAM block (the migration stream names them); it adds
  // -incoming defer. `nic`: a virtio-net NIC, on the tap at microvm::kTapFd
  // when `tap` (a template's has none: each clone plugs its own in).
  std::vector<std::string> Argv(const std::string& name, uint32_t memory_mb, const std::string& accel,
                                const VmFileFds& f, Ram ram, bool nic, bool tap) const {
    using microvm::FdSetPath;
    // warren.screen: the size the guest's X session sets (xrandr); systemd's
    // status on the console for the boot's log.
    // boot=warren: the initramfs's boot script mounts the root, an overlay
    // of the layer disks under the writable disk (build-guest.sh).
    // net.ifnames=0: the NIC is eth0, the name the agent configures.
    std::string append = "boot=warren warren.layers=" + std::to_string(f.layers.size()) +
                         " net.ifnames=0 rw console=ttyS0 quiet systemd.show_status=1 panic=-1 mitigations=off " +
                         std::string("warren.screen=") + std::to_string(o_.screen_width) + "x" +
                         std::to_string(o_.screen_height);
    std::vector<std::string> a = {
        o_.qemu,
        "-M",
        ram == Ram::kAnonymous || ram == Ram::kRestorePlain ? "q35,vmport=off,smbus=off"
                                                            : "q35,vmport=off,smbus=off,memory-backend=ram0",
        "-accel",
        accel == "tcg" ? "tcg,tb-size=" + std::to_string(microvm::kTcgCacheMb) : accel,
        "-cpu",
        accel == "kvm" ? "host" : "max",
        "-m",
        std::to_string(memory_mb) + "M",
        "-smp",
        std::to_string(o_.cpus),
        "-name",
        // Threads named "CPU n/TCG|KVM", "worker", ... (top -H, the tests'
        // freezing of the vCPUs alone).
        microvm::QemuOptValue(name) + ",debug-threads=on",
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
        "-sandbox",
        microvm::kQemuSandbox,
        "-vga",
        "std",
        "-device",
        "qemu-xhci,id=xhci",
        "-device",
        "usb-tablet,bus=xhci.0",
        "-kernel",
        microvm::ProcFdPath(f.kernel),
        "-initrd",
        microvm::ProcFdPath(f.initrd),
        "-append",
        append,
        // The writable disk: a qcow2 overlay of the empty upper.img, its
        // backing given as a node (not the path in the qcow2 header, which
        // QEMU's uid cannot open).
        "-blockdev",
        "driver=file,node-name=base-file,filename=" + FdSetPath(f.base) + ",read-only=on",
        "-blockdev",
        "driver=raw,node-name=base,file=base-file,read-only=on",
        "-blockdev",
        "driver=file,node-name=root-file,filename=" + FdSetPath(f.disk_rw) + ",cache.no-flush=on,discard=unmap",
        "-blockdev",
        "driver=qcow2,node-name=root,file=root-file,backing=base,cache.no-flush=on,discard=unmap",
        "-device",
        "virtio-blk-pci,drive=root,serial=wdisk",
        "-chardev",
        "file,id=console,path=" + FdSetPath(f.console),
        "-serial",
        "chardev:console",
        "-device",
        "virtio-serial-pci",
        "-chardev",
        "socket,id=agent,fd=" + std::to_string(kAgentFd) + ",server=on,wait=off",
        "-device",
        "virtserialport,chardev=agent,name=warren.agent",
        "-chardev",
        "socket,id=qmp,fd=" + std::to_string(kQmpFd) + ",server=on,wait=off",
        "-mon",
        "chardev=qmp,mode=control",
        "-device",
        "virtio-rng-pci",
    };
    if (nic) {
      if (tap) a.insert(a.end(), {"-netdev", "tap,id=net0,fd=" + std::to_string(microvm::kTapFd)});
      a.insert(a.end(), {"-device", std::string("virtio-net-pci,id=nic0") + (tap ? ",netdev=net0" : "")});
    }
    if (ram == Ram::kTemplate || ram == Ram::kClone) {
      a.insert(a.end(), {"-object", "memory-backend-file,id=ram0,size=" + std::to_string(memory_mb) +
                                        "M,mem-path=" + microvm::ProcFdPath(microvm::kRamFd) +
                                        ",share=" + (ram == Ram::kTemplate ? "on" : "off")});
    }
    if (ram == Ram::kRestoreNamed) {
      a.insert(a.end(), {"-object", "memory-backend-ram,id=ram0,size=" + std::to_string(memory_mb) + "M"});
    }
    if (ram == Ram::kClone || ram == Ram::kRestorePlain || ram == Ram::kRestoreNamed) {
      a.insert(a.end(), {"-incoming", "defer"});
    }
    // The layers: read-only raw disks, bottom first (serial wl<i>).
    for (size_t i = 0; i < f.layers.size(); ++i) {
      const std::string n = "l" + std::to_string(i);
      a.insert(a.end(), {"-blockdev",
                         "driver=file,node-name=" + n + "-file,filename=" + FdSetPath(f.layers[i]) + ",read-only=on",
                         "-blockdev", "driver=raw,node-name=" + n + ",file=" + n + "-file,read-only=on", "-device",
                         "virtio-blk-pci,drive=" + n + ",serial=wl" + std::to_string(i)});
      for (std::string& arg : microvm::AddFdArgs(f.layers[i], f.layers[i])) a.push_back(std::move(arg));
    }
    for (int fd : {f.base, f.disk_rw, f.console}) {
      for (std::string& arg : microvm::AddFdArgs(fd, fd)) a.push_back(std::move(arg));
    }
    // The overlay's read-only fd in its set too: QEMU may open a writable
    // image read-only first (probing, reopens).
    for (std::string& arg : microvm::AddFdArgs(f.disk_ro, f.disk_rw)) a.push_back(std::move(arg));
    return a;
  }

  const VmOptions o_;
  std::unique_ptr<jail::CgroupManager> cgroups_;
  std::unique_ptr<UidSlots> uids_;
  std::unique_ptr<vm::TemplateCache> templates_;  // warm starts; null: every create boots cold
  std::mutex log_mu_;
  std::string last_template_error_;
};

}  // namespace

Status CheckVmHost(const VmOptions& o) {
  RETURN_IF_ERROR(CheckFile(o.qemu, "QEMU"));
  RETURN_IF_ERROR(CheckFile(o.qemu_img, "qemu-img"));
  for (const char* f : {"system.erofs", "upper.img", "vmlinuz", "initrd.img"}) {
    RETURN_IF_ERROR(CheckFile(o.guest_dir + "/" + f, std::string("guest ") + f + " (scripts/vm/build-guest.sh)"));
  }
  // QEMU's uid reads them itself (by /proc/self/fd: the file's own mode
  // counts, not its dirs').
  for (const char* f : {"vmlinuz", "initrd.img"}) {
    struct stat st;
    const std::string path = o.guest_dir + "/" + f;
    if (::stat(path.c_str(), &st) == 0 && (st.st_mode & S_IROTH) == 0) {
      return absl::FailedPreconditionError(std::string("vm: guest ") + f + " " + path +
                                           " must be readable by all (QEMU runs as an unprivileged uid): chmod o+r");
    }
  }
  if (o.accel != "tcg" && o.accel != "kvm" && o.accel != "auto") {
    return absl::InvalidArgumentError("vm: accel must be tcg, kvm or auto, not \"" + o.accel + "\"");
  }
  if (o.accel == "auto" && !o.accel_choice.valid()) {
    return absl::InvalidArgumentError("vm: accel=auto needs the probe's answer (ChooseAccel)");
  }
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<Backend>> NewVmBackend(const VmOptions& options) {
  RETURN_IF_ERROR(CheckVmHost(options));
  if (options.disk_dir.empty()) return absl::InvalidArgumentError("vm: disk_dir is required");
  RETURN_IF_ERROR(MkdirAll(options.disk_dir, 0700));
  // Templates of an earlier daemon: their RAM (a memfd) died with it; a
  // build it was doing when killed left its QEMU. Its clones do not need
  // them (each runs on its own copy of the disk and its mapping of the RAM).
  if (!options.template_dir.empty() && ::access(options.template_dir.c_str(), F_OK) == 0) {
    microvm::KillTemplateQemus(options.qemu, "warren-vm-template:" + options.template_dir + "/");
    RETURN_IF_ERROR(RemoveTree(options.template_dir));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<jail::CgroupManager> cgroups,
                   jail::CgroupManager::Detect(options.cgroup_name, /*view_hierarchies=*/false));
  if (options.max_vms == 0 || uint64_t{options.uid_base} + options.max_vms >= 0xfffffffeu) {
    return absl::InvalidArgumentError("vm: uid_base + max_vms must stay below 4294967294");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<UidSlots> uids,
                   UidSlots::Open(options.uid_lock_dir, options.disk_dir, options.max_vms, options.uid_base, 1));
  return std::unique_ptr<Backend>(new VmBackend(options, std::move(cgroups), std::move(uids)));
}

}  // namespace warren::runtime
