#include "runtime/vm/vm_backend.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/file_util.h"
#include "common/log.h"
#include "common/rollback.h"
#include "jail/cgroup.h"
#include "runtime/container/uid_slots.h"
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
using microvm::kAgentFd;
using microvm::kQmpFd;

// systemd, udev and Xorg need this much; below it the guest swaps itself to
// death under TCG rather than failing clearly.
constexpr uint32_t kMinMemoryMb = 384;
// QEMU's memory beyond the guest RAM: microvm's (TCG cache, heap, threads)
// plus the VGA's 16 MiB of video RAM and the USB and PCI devices.
constexpr uint32_t kVmOverheadMb = microvm::kQemuOverheadMb + 64;
constexpr uint32_t kQemuPids = 64;
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
  int base = -1;     // disk.img, read-only: the overlay's backing node
  int disk_rw = -1;  // the qcow2 overlay; one fd set with disk_ro
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

class VmBackend : public Backend {
 public:
  VmBackend(VmOptions o, std::unique_ptr<jail::CgroupManager> cgroups, std::unique_ptr<UidSlots> uids)
      : o_(std::move(o)), cgroups_(std::move(cgroups)), uids_(std::move(uids)) {}

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
    ASSIGN_OR_RETURN(uint32_t slot, uids_->Take());
    rec.set_uid_slot(slot);
    rb.Add([this, slot] { uids_->Release(slot); });

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

    {
      // Every file QEMU uses, as an open fd: its uid reaches none of them.
      microvm::QemuFiles files(microvm::kFirstFileFd);
      VmFileFds f;
      ASSIGN_OR_RETURN(f.base, files.Open(o_.guest_dir + "/disk.img", O_RDONLY));
      ASSIGN_OR_RETURN(f.disk_rw, files.Open(rec.disk(), O_RDWR));
      ASSIGN_OR_RETURN(f.disk_ro, files.Open(rec.disk(), O_RDONLY));
      ASSIGN_OR_RETURN(f.console, files.Open(spec.dir + "/console.log", O_WRONLY | O_CREAT | O_APPEND));
      ASSIGN_OR_RETURN(f.kernel, files.Open(o_.guest_dir + "/vmlinuz", O_RDONLY));
      ASSIGN_OR_RETURN(f.initrd, files.Open(o_.guest_dir + "/initrd.img", O_RDONLY));
      std::vector<std::pair<int, int>> fds = {{agent_listener.get(), kAgentFd}, {qmp_listener.get(), kQmpFd}};
      fds.insert(fds.end(), files.fds().begin(), files.fds().end());
      std::vector<int> procs_fds;
      procs_fds.reserve(procs.size());
      for (const UniqueFd& fd : procs) procs_fds.push_back(fd.get());
      ASSIGN_OR_RETURN(q,
                       microvm::LaunchQemu(Argv(spec, rec, f), fds, spec.dir + "/qemu.log", procs_fds, Identity(slot)));
    }  // QEMU holds the files and the sockets now
    agent_listener.reset();
    qmp_listener.reset();
    rec.set_qemu_pid(q.pid);
    rec.set_qemu_start_time(q.start_time);
    rb.Add([&] { microvm::KillQemu(std::move(q.pidfd)); });

    // The agent's hello first: its wait notices a QEMU that exited (the
    // monitor's connect alone would retry until the deadline).
    const auto deadline = AgentChannel::Clock::now() + o_.boot_timeout;
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
    ASSIGN_OR_RETURN(std::unique_ptr<vm::QmpClient> qmp,
                     vm::QmpClient::Connect(qmp_path, AgentChannel::Clock::now() + kQmpConnectTimeout));
    rec.set_kernel_release(hello.kernel_release);
    rec.set_boot_id(hello.boot_id);
    microvm::MicrovmSandbox::Parts parts;
    parts.spec = spec;
    parts.record = rec;
    parts.pidfd = std::move(q.pidfd);
    parts.cgroup = std::move(cgroup);
    parts.channel = std::move(*ch);
    parts.exec_slack = o_.exec_slack;
    parts.identity = Identity(slot);
    parts.release_uid = [this, slot] { uids_->Release(slot); };
    rb.Commit();
    return std::unique_ptr<Sandbox>(
        new vm::VmSandbox(std::make_unique<microvm::MicrovmSandbox>(std::move(parts)), std::move(qmp)));
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
    if (rec.has_uid_slot()) {
      const uint32_t slot = rec.uid_slot();
      parts.identity = Identity(slot);
      parts.release_uid = [this, slot] { uids_->Release(slot); };
    }
    rb.Commit();
    return std::unique_ptr<Sandbox>(
        new vm::VmSandbox(std::make_unique<microvm::MicrovmSandbox>(std::move(parts)), std::move(qmp)));
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
    return first.ok() ? s : first;
  }

 private:
  microvm::QemuIdentity Identity(uint32_t slot) const {
    const uid_t id = uids_->HostUid(slot);
    return {id, id};
  }

  std::string Accel() const { return o_.accel == "auto" ? o_.accel_choice.get().accel : o_.accel; }

  std::vector<std::string> Argv(const SandboxSpec& spec, const microvm::record::Microvm& rec,
                                const VmFileFds& f) const {
    using microvm::FdSetPath;
    const std::string& accel = rec.accel();
    // warren.screen: the size the guest's X session sets (xrandr); systemd's
    // status on the console for the boot's log.
    std::string append = "root=/dev/vda rw console=ttyS0 quiet systemd.show_status=1 panic=-1 mitigations=off " +
                         std::string("warren.screen=") + std::to_string(o_.screen_width) + "x" +
                         std::to_string(o_.screen_height);
    std::vector<std::string> a = {
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
        "-name",
        microvm::QemuOptValue("warren:" + spec.id),
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
        // The overlay over the guest's disk, its backing given as a node
        // (not the path in the qcow2 header, which QEMU's uid cannot open).
        "-blockdev",
        "driver=file,node-name=base-file,filename=" + FdSetPath(f.base) + ",read-only=on",
        "-blockdev",
        "driver=raw,node-name=base,file=base-file,read-only=on",
        "-blockdev",
        "driver=file,node-name=root-file,filename=" + FdSetPath(f.disk_rw) + ",cache.no-flush=on,discard=unmap",
        "-blockdev",
        "driver=qcow2,node-name=root,file=root-file,backing=base,cache.no-flush=on,discard=unmap",
        "-device",
        "virtio-blk-pci,drive=root",
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
};

}  // namespace

Status CheckVmHost(const VmOptions& o) {
  RETURN_IF_ERROR(CheckFile(o.qemu, "QEMU"));
  RETURN_IF_ERROR(CheckFile(o.qemu_img, "qemu-img"));
  for (const char* f : {"disk.img", "vmlinuz", "initrd.img"}) {
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
