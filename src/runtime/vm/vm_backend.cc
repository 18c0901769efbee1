#include "runtime/vm/vm_backend.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "common/file_util.h"
#include "common/log.h"
#include "common/rollback.h"
#include "jail/cgroup.h"
#include "runtime/microvm/channel.h"
#include "runtime/microvm/qemu.h"
#include "runtime/microvm/sandbox.h"
#include "runtime/microvm/template.h"
#include "runtime/vm/qmp.h"
#include "runtime/vm/vm_sandbox.h"

extern char** environ;

namespace warren::runtime {

namespace {

using microvm::AgentChannel;

// systemd, udev and Xorg need this much; below it the guest swaps itself to
// death under TCG rather than failing clearly.
constexpr uint32_t kMinMemoryMb = 384;
// QEMU's memory beyond the guest RAM: microvm's (TCG cache, heap, threads)
// plus the VGA's 16 MiB of video RAM and the USB and PCI devices.
constexpr uint32_t kVmOverheadMb = microvm::kQemuOverheadMb + 64;
constexpr uint32_t kQemuPids = 64;
constexpr int kAgentFd = 3, kQmpFd = 4;
constexpr std::chrono::milliseconds kAdoptTimeout{10000};

bool PidfdAlive(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

Status CheckFile(const std::string& path, const std::string& what) {
  struct stat st;
  if (path.empty()) return absl::FailedPreconditionError("vm: no " + what + " configured");
  if (::stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, "vm: " + what + " " + path);
  if (!S_ISREG(st.st_mode)) return absl::FailedPreconditionError("vm: " + what + " " + path + " is not a file");
  return absl::OkStatus();
}

// QEMU's option parser splits at ','; a path with one is doubled.
std::string QemuPath(const std::string& p) {
  std::string out;
  for (char c : p) out += c == ',' ? std::string(",,") : std::string(1, c);
  return out;
}

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

class VmBackend : public Backend {
 public:
  VmBackend(VmOptions o, std::unique_ptr<jail::CgroupManager> cgroups)
      : o_(std::move(o)), cgroups_(std::move(cgroups)) {}

  std::string name() const override { return "vm"; }
  Capabilities capabilities() const override { return {}; }

  StatusOr<std::unique_ptr<Sandbox>> Create(const SandboxSpec& spec) override {
    RETURN_IF_ERROR(CheckVmHost(o_));
    if (spec.resources.memory_mb < kMinMemoryMb) {
      return absl::InvalidArgumentError("memory_mb=" + std::to_string(spec.resources.memory_mb) + " is below the " +
                                        std::to_string(kMinMemoryMb) + " MiB a vm guest (systemd and X) needs");
    }
    microvm::record::Microvm rec;
    std::unique_ptr<jail::Cgroup> cgroup;
    microvm::LaunchedQemu q;
    Rollback rb;
    rec.set_accel(Accel());
    rec.set_cgroup(spec.id);
    rec.set_disk(o_.disk_dir + "/" + spec.id + ".qcow2");

    // Copy-on-write over the shared base; QEMU opens the base read-only.
    RETURN_IF_ERROR(RunTool(
        {o_.qemu_img, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", o_.guest_dir + "/disk.img", rec.disk()}));
    rb.Add([&] { ::unlink(rec.disk().c_str()); });

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
      for (const char* f : {"/agent.sock", "/qmp.sock", "/console.log", "/qemu.log", "/screen.png"}) {
        ::unlink((spec.dir + f).c_str());
      }
    });
    const std::string agent_path = microvm::SocketPath(spec.dir, dir.get(), "agent.sock");
    const std::string qmp_path = microvm::SocketPath(spec.dir, dir.get(), "qmp.sock");
    ASSIGN_OR_RETURN(UniqueFd agent_listener, microvm::ListenUnix(agent_path));
    ASSIGN_OR_RETURN(UniqueFd qmp_listener, microvm::ListenUnix(qmp_path));

    std::vector<int> procs_fds;
    procs_fds.reserve(procs.size());
    for (const UniqueFd& fd : procs) procs_fds.push_back(fd.get());
    ASSIGN_OR_RETURN(
        q, microvm::LaunchQemu(Argv(spec, rec), {{agent_listener.get(), kAgentFd}, {qmp_listener.get(), kQmpFd}},
                               spec.dir + "/qemu.log", procs_fds));
    agent_listener.reset();  // QEMU holds them now
    qmp_listener.reset();
    rec.set_qemu_pid(q.pid);
    rec.set_qemu_start_time(q.start_time);
    rb.Add([&] { microvm::KillQemu(std::move(q.pidfd)); });

    const auto deadline = AgentChannel::Clock::now() + o_.boot_timeout;
    ASSIGN_OR_RETURN(std::unique_ptr<vm::QmpClient> qmp, vm::QmpClient::Connect(qmp_path, deadline));
    microvm::proto::HelloReply hello;
    int pidfd = q.pidfd.get();
    StatusOr<std::unique_ptr<AgentChannel>> ch = AgentChannel::Connect(
        spec.id, agent_path, deadline, [pidfd] { return PidfdAlive(pidfd); }, &hello);
    if (!ch.ok()) {
      std::string extra = ch.status().code() == absl::StatusCode::kDeadlineExceeded
                              ? " (boot timeout " + std::to_string(o_.boot_timeout.count()) + " ms)"
                              : "";
      return Status(ch.status().code(), std::string(ch.status().message()) + extra + microvm::LogTails(spec.dir));
    }
    if (!hello.error.empty()) {
      return absl::FailedPreconditionError("sandbox " + spec.id + ": the guest agent reports: " + hello.error);
    }
    rec.set_kernel_release(hello.kernel_release);
    rec.set_boot_id(hello.boot_id);
    microvm::MicrovmSandbox::Parts parts;
    parts.spec = spec;
    parts.record = rec;
    parts.pidfd = std::move(q.pidfd);
    parts.cgroup = std::move(cgroup);
    parts.channel = std::move(*ch);
    parts.exec_slack = o_.exec_slack;
    rb.Commit();
    return std::unique_ptr<Sandbox>(
        new vm::VmSandbox(std::make_unique<microvm::MicrovmSandbox>(std::move(parts)), std::move(qmp), spec.dir));
  }

  StatusOr<std::unique_ptr<Sandbox>> Adopt(const SandboxSpec& spec, const std::string& backend_record) override {
    microvm::record::Microvm rec;
    if (backend_record.empty() || !rec.ParseFromString(backend_record) || rec.qemu_pid() <= 0) {
      return absl::InvalidArgumentError("sandbox " + spec.id + ": not a vm record");
    }
    pid_t pid = rec.qemu_pid();
    auto gone = [&] {
      return absl::NotFoundError("sandbox " + spec.id + ": its QEMU (pid " + std::to_string(pid) + ") is gone");
    };
    if (microvm::ProcessStartTime(pid) != rec.qemu_start_time()) return gone();
    UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    if (!pidfd.valid() || microvm::ProcessStartTime(pid) != rec.qemu_start_time()) return gone();
    StatusOr<std::unique_ptr<jail::Cgroup>> cgroup = cgroups_->Open(rec.cgroup());
    UniqueFd dir(::open(spec.dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!dir.valid()) return ErrnoToStatus(errno, "open(" + spec.dir + ")");
    const auto deadline = AgentChannel::Clock::now() + kAdoptTimeout;
    ASSIGN_OR_RETURN(std::unique_ptr<vm::QmpClient> qmp,
                     vm::QmpClient::Connect(microvm::SocketPath(spec.dir, dir.get(), "qmp.sock"), deadline));
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
    microvm::MicrovmSandbox::Parts parts;
    parts.spec = spec;
    parts.record = rec;
    parts.pidfd = std::move(pidfd);
    if (cgroup.ok()) parts.cgroup = std::move(*cgroup);
    parts.channel = std::move(ch);
    parts.exec_slack = o_.exec_slack;
    return std::unique_ptr<Sandbox>(
        new vm::VmSandbox(std::make_unique<microvm::MicrovmSandbox>(std::move(parts)), std::move(qmp), spec.dir));
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
    return first.ok() ? s : first;
  }

 private:
  std::string Accel() const { return o_.accel == "auto" ? o_.accel_choice.get().accel : o_.accel; }

  std::vector<std::string> Argv(const SandboxSpec& spec, const microvm::record::Microvm& rec) const {
    const std::string& accel = rec.accel();
    // warren.screen: the size the guest's X session sets (xrandr); systemd's
    // status on the console for the boot's log.
    std::string append = "root=/dev/vda rw console=ttyS0 quiet systemd.show_status=1 panic=-1 mitigations=off " +
                         std::string("warren.screen=") + std::to_string(o_.screen_width) + "x" +
                         std::to_string(o_.screen_height);
    return {
        o_.qemu,
        "-M",
        "q35,vmport=off,smbus=off",
        "-accel",
        accel == "tcg" ? "tcg,tb-size=" + std::to_string(microvm::kTcgCacheMb) : accel,
        "-cpu",
        accel == "kvm" ? "host" : "max",
        "-m",
        std::to_string(spec.resources.memory_mb) + "M",
        "-smp",
        std::to_string(o_.cpus),
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
        "-sandbox",
        "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
        "-vga",
        "std",
        "-device",
        "qemu-xhci,id=xhci",
        "-device",
        "usb-tablet,bus=xhci.0",
        "-kernel",
        o_.guest_dir + "/vmlinuz",
        "-initrd",
        o_.guest_dir + "/initrd.img",
        "-append",
        append,
        "-drive",
        "file=" + QemuPath(rec.disk()) + ",if=none,id=root,format=qcow2,cache=unsafe,discard=unmap",
        "-device",
        "virtio-blk-pci,drive=root",
        "-chardev",
        "file,id=console,path=" + QemuPath(spec.dir + "/console.log"),
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
  }

  const VmOptions o_;
  std::unique_ptr<jail::CgroupManager> cgroups_;
};

}  // namespace

Status CheckVmHost(const VmOptions& o) {
  RETURN_IF_ERROR(CheckFile(o.qemu, "QEMU"));
  RETURN_IF_ERROR(CheckFile(o.qemu_img, "qemu-img"));
  for (const char* f : {"disk.img", "vmlinuz", "initrd.img"}) {
    RETURN_IF_ERROR(CheckFile(o.guest_dir + "/" + f, std::string("guest ") + f + " (scripts/vm/build-guest.sh)"));
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
  ASSIGN_OR_RETURN(std::unique_ptr<jail::CgroupManager> cgroups,
                   jail::CgroupManager::Detect(options.cgroup_name, /*view_hierarchies=*/false));
  return std::unique_ptr<Backend>(new VmBackend(options, std::move(cgroups)));
}

}  // namespace warren::runtime
