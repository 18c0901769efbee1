#include "runtime/microvm/microvm_backend.h"

#include <dirent.h>
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
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

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
// Pool VMs are pool-0 .. pool-<kMaxPool - 1> (their disks and dirs).
constexpr uint32_t kMaxPool = 16;
constexpr char kPoolPrefix[] = "pool-";

// The cgroup of pool VM `k` of the daemon whose disks are in `disk_dir`:
// pool-<FNV-1a 32 of disk_dir, hex>-<k>. Daemons started in one cgroup (the
// tests', a host running several nodes) share the backend's cgroup dir; with
// a bare pool-<k> one daemon's start removed another's pool VMs and two
// fillers shared a cgroup (a create then took both QEMUs).
std::string PoolCgroup(const std::string& disk_dir, uint32_t k) {
  uint32_t h = 2166136261u;
  for (unsigned char c : disk_dir) h = (h ^ c) * 16777619u;
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", h);
  return kPoolPrefix + std::string(hex) + "-" + std::to_string(k);
}

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
      if (o_.pool_size > 0) filler_ = std::thread([this] { FillPool(); });
    }
  }

  ~MicrovmBackend() override {
    {
      std::lock_guard<std::mutex> l(pool_mu_);
      pool_stop_ = true;
    }
    pool_cv_.notify_all();
    if (filler_.joinable()) filler_.join();
    for (std::unique_ptr<PoolVm>& v : pool_) DestroyPoolVm(*v);
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
    ASSIGN_OR_RETURN(const std::optional<net::NetworkPolicy> policy, microvm::CreatePolicy(o_.network, spec));
    if (templates_ && microvm::FitsTemplate(spec.layer_files, spec.resources.disk_mb)) {
      microvm::VmConfig shape = BaseConfig(spec);
      shape.nic = true;  // every template has one (microvm_backend.h)
      // First a clone of the template with this layer set's root mounted
      // (from the pool when the sandbox has no network: a pooled clone's
      // QEMU runs without a tap), then one of the bare template (mounts
      // its root after the restore), then a cold boot.
      StatusOr<std::shared_ptr<const microvm::Template>> rooted = templates_->GetRooted(shape, spec.resources.disk_mb);
      if (rooted.ok()) {
        bool guest_answered = false;
        if (std::unique_ptr<PoolVm> v = policy ? nullptr : TakePoolVm(*rooted, shape)) {
          StatusOr<std::unique_ptr<Sandbox>> sb = CreateFromPool(spec, std::move(v), &guest_answered);
          if (sb.ok() || guest_answered) return sb;
          Log(spdlog::level::warn, "microvm pool clone failed; restoring a clone",
              {{"sandbox", spec.id}, {"error", sb.status().ToString()}});
        }
        StatusOr<std::unique_ptr<Sandbox>> sb = CreateVm(spec, policy, rooted->get(), &guest_answered);
        if (sb.ok() || guest_answered) return sb;
        Log(spdlog::level::warn, "microvm clone of a root template failed; cloning the bare template",
            {{"sandbox", spec.id}, {"error", sb.status().ToString()}});
      } else {
        LogNoTemplateOnce(rooted.status(), "no microvm root template; clones mount their root");
      }
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
        LogNoTemplateOnce(t.status(), "no microvm template; creates boot cold");
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

  // `what` with `why`, unless the last such line said the same.
  void LogNoTemplateOnce(const Status& why, const char* what) {
    std::lock_guard<std::mutex> l(log_mu_);
    std::string key = std::string(what) + why.ToString();
    if (key == last_template_error_) return;
    last_template_error_ = key;
    Log(spdlog::level::warn, what, {{"reason", why.ToString()}});
  }

  // ---- the pool of restored, warmed-up clones (microvm_backend.h)

  struct PoolVm {
    uint32_t k = 0;     // its cgroup is pool-<k>
    uint32_t slot = 0;  // its QEMU's uid slot (when has_slot)
    bool has_slot = false;
    std::shared_ptr<const microvm::Template> tmpl;
    microvm::VmConfig vm;  // layer files, memory, vCPUs (BaseConfig of the create that asked)
    std::string dir, disk;
    std::unique_ptr<jail::Cgroup> cgroup;
    microvm::LaunchedQemu q;
  };

  // Kills its QEMU, removes its cgroup, disk and dir, gives its slot back.
  void DestroyPoolVm(PoolVm& v) {
    if (v.q.pidfd.valid()) microvm::KillQemu(std::move(v.q.pidfd));
    if (v.cgroup) {
      Status s = v.cgroup->Destroy(std::chrono::seconds(5));
      if (!s.ok()) Log(spdlog::level::err, "removing a microvm pool VM's cgroup failed", {{"error", s.ToString()}});
    }
    if (!v.disk.empty()) ::unlink(v.disk.c_str());
    if (!v.dir.empty()) (void)RemoveTree(v.dir);
    if (v.has_slot) uids_->Release(v.slot);
    std::lock_guard<std::mutex> l(pool_mu_);
    pool_k_.erase(v.k);
  }

  // A pool VM of `tmpl` (the create's shape), or null; asks the filler to
  // keep the pool on `tmpl` (its VMs of another template are destroyed).
  std::unique_ptr<PoolVm> TakePoolVm(const std::shared_ptr<const microvm::Template>& tmpl,
                                     const microvm::VmConfig& vm) {
    if (o_.pool_size == 0) return nullptr;
    std::unique_ptr<PoolVm> out;
    std::vector<std::unique_ptr<PoolVm>> stale;
    {
      std::lock_guard<std::mutex> l(pool_mu_);
      if (pool_tmpl_ != tmpl) {
        pool_tmpl_ = tmpl;
        pool_vm_ = vm;
        pool_failures_ = 0;
        for (std::unique_ptr<PoolVm>& v : pool_) stale.push_back(std::move(v));
        pool_.clear();
      }
      if (!pool_.empty()) {
        out = std::move(pool_.front());
        pool_.pop_front();
      }
    }
    pool_cv_.notify_all();
    for (std::unique_ptr<PoolVm>& v : stale) DestroyPoolVm(*v);
    return out;
  }

  // The filler thread: keeps pool_ at pool_size VMs of pool_tmpl_.
  void FillPool() {
    while (true) {
      std::shared_ptr<const microvm::Template> tmpl;
      microvm::VmConfig vm;
      uint32_t k = 0;
      {
        std::unique_lock<std::mutex> l(pool_mu_);
        pool_cv_.wait(
            l, [this] { return pool_stop_ || (pool_tmpl_ && pool_failures_ < 3 && pool_.size() < o_.pool_size); });
        if (pool_stop_) return;
        tmpl = pool_tmpl_;
        vm = pool_vm_;
        while (pool_k_.count(k) != 0) ++k;
        if (k >= kMaxPool) {
          pool_failures_ = 3;  // no cgroup name left (pool VMs not yet destroyed)
          continue;
        }
        pool_k_.insert(k);
      }
      auto v = std::make_unique<PoolVm>();
      v->k = k;
      v->tmpl = tmpl;
      v->vm = vm;
      Status s = StartPoolVm(*v);
      std::unique_lock<std::mutex> l(pool_mu_);
      if (!s.ok()) {
        ++pool_failures_;
        l.unlock();
        Log(spdlog::level::warn, "microvm pool: starting a clone failed", {{"error", s.ToString()}});
        DestroyPoolVm(*v);
        continue;
      }
      pool_failures_ = 0;
      if (pool_stop_ || pool_tmpl_ != tmpl) {
        l.unlock();
        DestroyPoolVm(*v);
        continue;
      }
      Log(spdlog::level::info, "microvm pool clone ready",
          {{"cgroup", PoolCgroup(o_.disk_dir, v->k)}, {"pool", std::to_string(pool_.size() + 1)}});
      pool_.push_back(std::move(v));
    }
  }

  // Restores a clone of v.tmpl in cgroup pool-<k>, says hello (a fresh RNG
  // seed; no setup_root: its identity is still the template's, boot_id
  // unread) and runs one command. On error the caller destroys `v`.
  Status StartPoolVm(PoolVm& v) {
    const auto deadline = AgentChannel::Clock::now() + o_.boot_timeout;
    ASSIGN_OR_RETURN(v.slot, uids_->Take());
    v.has_slot = true;
    const std::string name = kPoolPrefix + std::to_string(v.k);
    v.disk = o_.disk_dir + "/" + name + "-u" + std::to_string(v.slot) + ".img";
    ::unlink(v.disk.c_str());
    Status copied = microvm::CopyDisk(v.tmpl->disk, v.disk);
    if (!copied.ok()) {
      v.disk.clear();
      return copied;
    }
    // The lowest CPU weight while in the pool: its restore and warm-up run
    // on CPU that sandboxes leave idle (a taken VM gets the sandbox's).
    jail::CgroupLimits limits;
    limits.cpu_millis = 1000 * o_.cpus;
    limits.best_effort = true;
    limits.memory_bytes = (uint64_t{v.vm.memory_mb} + microvm::kQemuOverheadMb) << 20;
    limits.pids = kQemuPids;
    ASSIGN_OR_RETURN(v.cgroup, cgroups_->Create(PoolCgroup(o_.disk_dir, v.k), limits));
    ASSIGN_OR_RETURN(std::vector<UniqueFd> procs, cgroup_procs(*v.cgroup));
    v.dir = o_.template_dir + "/" + name;
    (void)RemoveTree(v.dir);
    RETURN_IF_ERROR(MkdirAll(v.dir, 0700));
    UniqueFd dir(::open(v.dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!dir.valid()) return ErrnoToStatus(errno, "open(" + v.dir + ")");
    const std::string agent_path = microvm::SocketPath(v.dir, dir.get(), "agent.sock");
    const std::string qmp_path = microvm::SocketPath(v.dir, dir.get(), "qmp.sock");
    ASSIGN_OR_RETURN(UniqueFd listener, microvm::ListenUnix(agent_path));
    ASSIGN_OR_RETURN(UniqueFd qmp_listener, microvm::ListenUnix(qmp_path));
    microvm::VmConfig vm = v.vm;
    vm.disk = v.disk;
    vm.console_log = v.dir + "/console.log";
    // Names the daemon (its disk dir), not its template dir: a restarted
    // daemon kills the QEMUs naming that (KillTemplateQemus), and a taken
    // pool VM is a sandbox.
    vm.name = "warren-pool:" + o_.disk_dir + "/" + name;
    vm.agent_listen_fd = kAgentFd;
    vm.qmp_listen_fd = kQmpFd;
    vm.ram_fd = kRamFd;
    vm.ram_shared = false;
    vm.restore = true;
    std::vector<std::pair<int, int>> fds = {
        {listener.get(), kAgentFd}, {qmp_listener.get(), kQmpFd}, {v.tmpl->ram.get(), kRamFd}};
    std::vector<UniqueFd> files;
    RETURN_IF_ERROR(microvm::OpenVmFiles(&vm, microvm::kFirstFileFd, &files, &fds));
    std::vector<int> procs_fds;
    procs_fds.reserve(procs.size());
    for (const UniqueFd& fd : procs) procs_fds.push_back(fd.get());
    ASSIGN_OR_RETURN(v.q, microvm::LaunchQemu(microvm::QemuArgv(o_.qemu, vm), fds, v.dir + "/qemu.log", procs_fds,
                                              Identity(v.slot)));
    listener.reset();
    qmp_listener.reset();
    files.clear();
    RETURN_IF_ERROR(microvm::RestoreClone(qmp_path, *v.tmpl, deadline));
    int pidfd = v.q.pidfd.get();
    microvm::proto::HelloReply hello;
    ASSIGN_OR_RETURN(std::unique_ptr<AgentChannel> ch,
                     AgentChannel::Connect(
                         name, agent_path, deadline, [pidfd] { return PidfdAlive(pidfd); }, &hello));
    if (!hello.error.empty() || !hello.boot_id.empty()) {
      return absl::FailedPreconditionError("microvm pool: the clone's agent " +
                                           (hello.error.empty() ? std::string("read boot_id early") : hello.error));
    }
    microvm::proto::ExecRequest warm;
    warm.argv = {"/bin/sh", "-c", "exec /usr/bin/env true"};
    warm.env = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"};
    warm.cwd = "/";
    warm.user = "root";
    warm.timeout_ms = 10000;
    StatusOr<ExecOutcome> r = ch->Exec(warm, "", std::chrono::milliseconds(20000));
    if (!r.ok()) return r.status();
    return absl::OkStatus();  // the channel closes: the agent waits for the create's hello
  }

  static StatusOr<std::vector<UniqueFd>> cgroup_procs(jail::Cgroup& cg) { return cg.OpenProcsFds(); }

  // A sandbox of `spec` from pool VM `v` (its shape is the spec's).
  StatusOr<std::unique_ptr<Sandbox>> CreateFromPool(const SandboxSpec& spec, std::unique_ptr<PoolVm> v,
                                                    bool* guest_answered) {
    const auto t0 = std::chrono::steady_clock::now();
    microvm::record::Microvm rec;
    std::unique_ptr<jail::Cgroup> cgroup;
    Rollback rb;
    rb.Add([&] { DestroyPoolVm(*v); });
    jail::CgroupLimits limits;
    limits.cpu_millis = spec.resources.cpu_millis;
    limits.memory_bytes = (uint64_t{spec.resources.memory_mb} + microvm::kQemuOverheadMb) << 20;
    limits.pids = kQemuPids;
    // The pool VM's cgroup takes the sandbox's name and limits (v1: what
    // QEMU was charged so far stays its own); where cgroupfs cannot rename
    // (v2), QEMU (all its threads) moves into a new one and the pool's goes
    // (its memory charged so far stays with the removed cgroup).
    const std::string pool_name = PoolCgroup(o_.disk_dir, v->k);
    // Without cpu_millis SetLimits would leave the pool's CPU weight: a new
    // cgroup then.
    Status renamed = limits.cpu_millis != 0 ? cgroups_->Rename(pool_name, spec.id)
                                            : absl::UnimplementedError("no cpu_millis to reset the weight with");
    if (renamed.ok()) {
      v->cgroup.reset();
      StatusOr<std::unique_ptr<jail::Cgroup>> opened = cgroups_->Open(spec.id);
      if (!opened.ok()) {
        (void)cgroups_->Rename(spec.id, pool_name);  // DestroyPoolVm's, again
        return opened.status();
      }
      cgroup = std::move(*opened);
    } else if (renamed.code() != absl::StatusCode::kUnimplemented) {
      return renamed;
    } else {
      ASSIGN_OR_RETURN(cgroup, cgroups_->Create(spec.id, limits));
    }
    rb.Add([&] {
      Status s = cgroup->Destroy(std::chrono::seconds(5));
      if (!s.ok()) Log(spdlog::level::err, "rollback: removing the VM's cgroup failed", {{"error", s.ToString()}});
    });
    if (renamed.ok()) {
      RETURN_IF_ERROR(cgroup->SetLimits(limits));
    } else {
      RETURN_IF_ERROR(cgroup->AddProcess(v->q.pid));
      if (Status s = v->cgroup->Destroy(std::chrono::seconds(5)); !s.ok()) return s;
      v->cgroup.reset();
    }
    rec.set_accel(Accel());
    rec.set_cgroup(spec.id);
    rec.set_disk(o_.disk_dir + "/" + spec.id + ".img");
    if (::rename(v->disk.c_str(), rec.disk().c_str()) != 0) {
      return ErrnoToStatus(errno, "rename(" + v->disk + ", " + rec.disk() + ")");
    }
    v->disk = rec.disk();
    rec.set_uid_slot(v->slot);
    rb.Add([&spec] {
      for (const char* f : {"/agent.sock", "/qmp.sock", "/console.log", "/qemu.log"}) ::unlink((spec.dir + f).c_str());
    });
    for (const char* f : {"/agent.sock", "/qmp.sock", "/console.log", "/qemu.log"}) {
      if (::rename((v->dir + f).c_str(), (spec.dir + f).c_str()) != 0) {
        return ErrnoToStatus(errno, "rename(" + v->dir + f + ", " + spec.dir + f + ")");
      }
    }
    UniqueFd dir(::open(spec.dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!dir.valid()) return ErrnoToStatus(errno, "open(" + spec.dir + ")");
    microvm::proto::Hello setup;
    setup.setup_root = true;
    setup.layers = v->vm.layer_files.size();
    setup.hostname = spec.hostname.empty() ? spec.id.substr(0, 63) : spec.hostname;
    setup.shm_mb = spec.resources.tmpfs_mb;
    setup.pids = spec.resources.pids;
    microvm::proto::HelloReply hello;
    int pidfd = v->q.pidfd.get();
    ASSIGN_OR_RETURN(
        std::unique_ptr<AgentChannel> ch,
        AgentChannel::Connect(
            spec.id, microvm::SocketPath(spec.dir, dir.get(), "agent.sock"),
            AgentChannel::Clock::now() + o_.boot_timeout, [pidfd] { return PidfdAlive(pidfd); }, &hello, setup));
    *guest_answered = true;
    if (!hello.error.empty()) {
      return absl::FailedPreconditionError("sandbox " + spec.id + ": the guest could not set up: " + hello.error);
    }
    if (hello.boot_id.empty()) {
      return absl::FailedPreconditionError("sandbox " + spec.id +
                                           ": the pool clone's agent kept its template identity");
    }
    for (const std::string& f : v->vm.layer_files) rec.add_layer_files(f);
    rec.set_nic(v->vm.nic);  // the template's NIC, unplugged (no tap): restores must declare it
    rec.set_ram_named(true);
    rec.set_qemu_pid(v->q.pid);
    rec.set_qemu_start_time(v->q.start_time);
    rec.set_kernel_release(hello.kernel_release);
    rec.set_boot_id(hello.boot_id);
    (void)RemoveTree(v->dir);
    {
      std::lock_guard<std::mutex> l(pool_mu_);
      pool_k_.erase(v->k);
    }
    Log(spdlog::level::info, "microvm started (ms since the create began)",
        {{"sandbox", spec.id},
         {"clone", "pool"},
         {"answered",
          std::to_string(
              std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count())}});
    MicrovmSandbox::Parts parts;
    parts.spec = spec;
    parts.record = rec;
    parts.pidfd = std::move(v->q.pidfd);
    parts.cgroup = std::move(cgroup);
    parts.channel = std::move(ch);
    FillRestore(&parts);
    rb.Commit();
    return std::unique_ptr<Sandbox>(new MicrovmSandbox(std::move(parts)));
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

    // A clone of a template with its root: a copy of the template's disk
    // (the guest's ext4 and overlay are already mounted on it).
    const bool rooted = tmpl != nullptr && !tmpl->disk.empty();
    RETURN_IF_ERROR(rooted ? microvm::CopyDisk(tmpl->disk, rec.disk())
                           : microvm::MakeDisk(rec.disk(), spec.resources.disk_mb));
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
      ASSIGN_OR_RETURN(tap, microvm::AttachTap(o_.network, spec.id, *policy, &rec, &rb, &lease));
      fds.push_back({tap.get(), microvm::kTapFd});
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
    if (lease) microvm::FillNetworkHello(*lease, o_.network->has_dns(), &setup);
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
         {"clone", tmpl == nullptr ? "false"
                   : rooted        ? "root"
                                   : "bare"},
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
      RETURN_IF_ERROR(microvm::AdoptRecordedNetwork(o_.network, spec.id, rec, &rb));
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
    RETURN_IF_ERROR(microvm::AdoptRecordedNetwork(o_.network, spec.id, rec, &rb));
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
  // The pool (pool_mu_ guards what follows it).
  std::mutex pool_mu_;
  std::condition_variable pool_cv_;
  std::deque<std::unique_ptr<PoolVm>> pool_;
  std::shared_ptr<const microvm::Template> pool_tmpl_;  // what the pool holds clones of
  microvm::VmConfig pool_vm_;
  std::set<uint32_t> pool_k_;  // pool-<k> cgroups in use
  int pool_failures_ = 0;      // in a row; the filler stops at 3 (until another template)
  bool pool_stop_ = false;
  std::thread filler_;  // last: started in the constructor, joined in the destructor
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
  // Pool VMs of an earlier daemon (killed: a clean end destroys them): not
  // sandboxes, so nothing re-adopts them. Their QEMUs die with their
  // cgroups, their disks name their uid slots.
  for (uint32_t k = 0; k < kMaxPool; ++k) {
    StatusOr<std::unique_ptr<jail::Cgroup>> cg = cgroups->Open(PoolCgroup(options.disk_dir, k));
    if (!cg.ok()) continue;
    Log(spdlog::level::warn, "removing a microvm pool VM left by an earlier daemon", {{"cgroup", (*cg)->rel()}});
    RETURN_IF_ERROR((*cg)->Destroy(std::chrono::seconds(5)));
  }
  if (DIR* d = ::opendir(options.disk_dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string f = e->d_name;
      const size_t u = f.rfind("-u");
      if (f.rfind(kPoolPrefix, 0) != 0 || u == std::string::npos || f.size() < 4 ||
          f.compare(f.size() - 4, 4, ".img") != 0) {
        continue;
      }
      const uint32_t slot = static_cast<uint32_t>(std::strtoul(f.c_str() + u + 2, nullptr, 10));
      ::unlink((options.disk_dir + "/" + f).c_str());
      if (uids->TakeSpecific(slot)) uids->Release(slot);
    }
    ::closedir(d);
  }
  return std::unique_ptr<Backend>(new MicrovmBackend(options, std::move(cgroups), std::move(uids)));
}

}  // namespace warren::runtime
