// A container sandbox (ContainerSandbox): exec, files, destroy, and its
// capabilities (pause = cgroup freezer, suspend = memory reclaim + prefetch,
// processes, export of the overlay upper in the layer format).
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "image/layer_tree.h"
#include "jail/cgroup.h"
#include "net/expose.h"
#include "runtime/backend.h"
#include "runtime/container/memory_prefetch.h"
#include "runtime/container/record.pb.h"
#include "runtime/container/rooted_files.h"
#include "runtime/container/spawn.h"
#include "runtime/container/state.h"
#include "runtime/desktop.h"
#include "runtime/desktop/x11_desktop.h"

namespace warren::runtime::container {

class ContainerSandbox : public Sandbox,
                         public Pausable,
                         public Suspendable,
                         public ProcessStarter,
                         public ChangeExporter,
                         public NetworkConfigurable,
                         public Desktop {
 public:
  ContainerSandbox(std::shared_ptr<BackendState> st, SandboxSpec spec, uint32_t slot, pid_t init_pid,
                   uint64_t start_time, UniqueFd pidfd, std::unique_ptr<jail::Cgroup> cg)
      : st_(std::move(st)),
        spec_(std::move(spec)),
        slot_(slot),
        init_pid_(init_pid),
        start_time_(start_time),
        pidfd_(std::move(pidfd)),
        cgroup_(std::move(cg)),
        // Unique across daemon restarts: an adopted sandbox may still hold
        // exec cgroups (background processes) named by the previous daemon.
        exec_seq_(static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count())) {
    RootedFilesOptions fo;
    const pid_t pid = init_pid_;
    const int pidfd_raw = pidfd_.get();
    std::atomic<bool>* destroyed = &destroyed_;
    fo.open_root = [pid, pidfd_raw, destroyed]() -> StatusOr<UniqueFd> {
      if (destroyed->load()) return absl::FailedPreconditionError("sandbox destroyed");
      std::string p = "/proc/" + std::to_string(pid) + "/root";
      UniqueFd fd(::open(p.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
      if (!fd.valid()) return ErrnoToStatus(errno, "open(" + p + ")");
      // The pid may have been reused if init died: the pidfd tells.
      if (PidfdSignal(pidfd_raw, 0) != 0) return absl::FailedPreconditionError("sandbox init is gone");
      return fd;
    };
    fo.host_root_uid = st_->HostUid(slot_);
    fo.host_root_gid = st_->HostUid(slot_);
    fo.id_range = st_->options.uid_range;
    files_ = NewRootedFiles(std::move(fo));
  }

  ~ContainerSandbox() override = default;

  const std::string& id() const override { return spec_.id; }
  pid_t init_pid() const override { return init_pid_; }
  std::string_view backend_name() const override { return kBackendName; }
  SandboxFiles& files() override { return *files_; }

  std::string Record() const override {
    container::record::Container r;
    r.set_init_pid(init_pid_);
    r.set_init_start_time(start_time_);
    r.set_slot(slot_);
    r.set_host_uid(st_->HostUid(slot_));
    r.set_cgroup(cgroup_->rel());
    for (const std::string& d : cgroup_->dirs()) r.add_cgroup_dirs(d);
    r.set_upper_dev(upper_dev_);
    r.set_upper_ino(upper_ino_);
    RecordNetwork(&r);
    return r.SerializeAsString();
  }

  StatusOr<ExecOutcome> Exec(const ExecSpec& es) override;
  Status Destroy() override;

  // Network (network.cc). AttachNetwork: at create, when spec.network is
  // enabled; AdoptNetwork: after a restart, from the record.
  Status AttachNetwork();
  Status AdoptNetwork(const container::record::Container& r);
  Status SetNetwork(const NetworkSpec& network) override;
  NetworkSpec Network() const override;
  StatusOr<ExposedPort> Expose(uint16_t port) override;
  Status Unexpose(uint16_t port) override;
  std::vector<ExposedPort> Exposed() const override;
  StatusOr<NetworkTraffic> Traffic() const override;

  // Destroy sets destroyed_ under pause_mu_: a pause can never freeze the
  // cgroup after Destroy thawed it (the cgroup may be recycled).
  Status Pause() override {
    std::lock_guard<std::mutex> l(pause_mu_);
    if (destroyed_.load()) return absl::FailedPreconditionError("sandbox " + spec_.id + " destroyed");
    RETURN_IF_ERROR(cgroup_->Freeze());
    if (paused_since_ns_.load() == 0) paused_since_ns_.store(SteadyNs());
    return absl::OkStatus();
  }
  Status Resume() override {
    std::lock_guard<std::mutex> l(pause_mu_);
    if (destroyed_.load()) return absl::FailedPreconditionError("sandbox " + spec_.id + " destroyed");
    RETURN_IF_ERROR(cgroup_->Thaw());
    if (int64_t since = paused_since_ns_.exchange(0); since != 0) paused_total_ns_ += SteadyNs() - since;
    return absl::OkStatus();
  }
  // Nanoseconds this sandbox has spent paused (by this process) so far: exec
  // timeouts do not count them.
  int64_t PausedNs() const {
    int64_t since = paused_since_ns_.load();
    return paused_total_ns_.load() + (since != 0 ? SteadyNs() - since : 0);
  }
  static int64_t SteadyNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  }
  // The upper tmpfs is a detached mount: the daemon keeps an fd on it, and
  // warren-init holds another (argv[1]) through which Adopt finds it again
  // after a daemon restart (ReattachUpper). A sandbox created by a warrend
  // before that existed has no upper after a restart: FailedPrecondition.
  StatusOr<UniqueFd> OpenUpper() {
    std::lock_guard<std::mutex> l(mu_);
    if (destroyed_.load() || !upper_.valid())
      return absl::FailedPreconditionError("sandbox " + spec_.id + ": upper layer not reachable (" +
                                           (destroyed_.load() ? std::string("destroyed") : upper_error_) + ")");
    UniqueFd fd(::openat(upper_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd.valid()) return Errno("openat(upper of " + spec_.id + ")");
    return fd;
  }
  // The upper holds HOST ids (root inside = HostUid(slot_)): the copy shifts
  // them back into the sandbox's range.
  Status ExportChanges(const std::string& dst_dir, const ExportOptions& o) override {
    ASSIGN_OR_RETURN(UniqueFd upper, OpenUpper());
    image::DiffCopyOptions co;
    co.host_root_id = st_->HostUid(slot_);
    co.id_range = st_->options.uid_range;
    co.exclude = o.exclude;
    co.budget = o.budget;
    return image::CopyDiffTree(upper.get(), dst_dir, co);
  }
  StatusOr<ChangeView> OpenChanges() override {
    ChangeView v;
    ASSIGN_OR_RETURN(v.dir, OpenUpper());
    v.id_base = st_->HostUid(slot_);
    v.id_range = st_->options.uid_range;
    return v;
  }
  StatusOr<uint64_t> MemoryUsage() const override { return cgroup_->MemoryUsage(); }
  uint64_t SwapUsage() const override { return cgroup_->SwapUsage(); }
  Status ReclaimMemory() override {
    std::lock_guard<std::mutex> l(pause_mu_);
    if (destroyed_.load()) return absl::FailedPreconditionError("sandbox " + spec_.id + " destroyed");
    if (paused_since_ns_.load() == 0) return absl::FailedPreconditionError("sandbox " + spec_.id + " is not paused");
    reclaimed_.store(true);  // its cgroup's settings may have moved: never recycled
    return cgroup_->ReclaimMemory();
  }
  StatusOr<uint64_t> EndSuspend(bool prefetch) override {
    if (destroyed_.load()) return absl::FailedPreconditionError("sandbox " + spec_.id + " destroyed");
    uint64_t total = 0;
    if (prefetch) {
      const uint64_t swapped = cgroup_->SwapUsage();
      for (pid_t pid : cgroup_->Pids(true)) total += PrefetchMappings(pid);
      UniqueFd up;
      {
        std::lock_guard<std::mutex> l(mu_);
        if (upper_.valid()) up.reset(::openat(upper_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      }
      // Files of the tmpfs upper (not mapped by anyone): read back at most
      // what was in swap.
      if (up.valid()) total += PrefetchFiles(up.get(), swapped);
    }
    RETURN_IF_ERROR(cgroup_->EndReclaim());
    return total;
  }
  StatusOr<std::unique_ptr<Process>> Start(const ExecSpec& es, const StartOptions& so) override;
  // A finished Start()ed process hands its exec cgroup back: removed now when
  // empty, else kept until its last process exits (or the sandbox goes).
  void ReleaseExecCgroup(std::unique_ptr<jail::Cgroup> cg) {
    if (cg->Empty() && cg->Remove().ok()) return;
    std::lock_guard<std::mutex> l(mu_);
    if (!destroy_done_) lingering_.push_back(std::move(cg));
  }
  uint64_t OomKillCount() const { return cgroup_->OomKillCount(); }
  void set_upper(UniqueFd fd) {
    struct stat st;
    std::lock_guard<std::mutex> l(mu_);
    if (fd.valid() && ::fstat(fd.get(), &st) == 0) {
      upper_dev_ = static_cast<uint64_t>(st.st_dev);
      upper_ino_ = static_cast<uint64_t>(st.st_ino);
    }
    upper_ = std::move(fd);
  }
  // After Adopt: finds the upper dir among warren-init's open fds (the one
  // with the recorded device and inode) and keeps an fd on it. The pidfd
  // check after the scan proves the pid was not reused meanwhile.
  Status ReattachUpper(uint64_t dev, uint64_t ino) {
    Status s = FindUpper(dev, ino);
    std::lock_guard<std::mutex> l(mu_);
    upper_error_ = s.ok() ? "" : std::string(s.message());
    return s;
  }
  Status FindUpper(uint64_t dev, uint64_t ino) {
    if (dev == 0 && ino == 0)
      return absl::NotFoundError("sandbox " + spec_.id + ": no upper recorded (created by an older warrend)");
    const std::string dir = "/proc/" + std::to_string(init_pid_) + "/fd";
    UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!d.valid()) return Errno("open(" + dir + ")");
    DIR* dp = ::fdopendir(d.release());
    if (dp == nullptr) return Errno("fdopendir(" + dir + ")");
    UniqueFd found;
    for (int i = 0; i < 4096 && !found.valid(); ++i) {
      dirent* de = ::readdir(dp);
      if (de == nullptr) break;
      if (de->d_name[0] == '.') continue;
      UniqueFd fd(::open((dir + "/" + de->d_name).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      struct stat st;
      if (fd.valid() && ::fstat(fd.get(), &st) == 0 && static_cast<uint64_t>(st.st_dev) == dev &&
          static_cast<uint64_t>(st.st_ino) == ino) {
        found = std::move(fd);
      }
    }
    ::closedir(dp);
    if (!found.valid()) return absl::NotFoundError("sandbox " + spec_.id + ": warren-init holds no upper fd");
    if (PidfdSignal(pidfd_.get(), 0) != 0) return absl::NotFoundError("sandbox " + spec_.id + ": init is gone");
    set_upper(std::move(found));
    return absl::OkStatus();
  }

  // Desktop: the X server inside the sandbox (desktop/x11_desktop.h).
  StatusOr<Screenshot> TakeScreenshot() override { return x11_.TakeScreenshot(); }
  Status Key(const std::string& combo) override { return x11_.Key(combo); }
  Status Type(const std::string& text) override { return x11_.Type(text); }
  Status Mouse(int32_t x, int32_t y, MouseButton button, MouseAction action) override {
    return x11_.Mouse(x, y, button, action);
  }
  Status Scroll(int32_t dx, int32_t dy) override { return x11_.Scroll(dx, dy); }

 private:
  void SweepExecCgroups();
  // The spawn request shared by Exec and Start: ids, caps, rlimits,
  // seccomp, cwd, argv/envp (FillCommand), the sandbox's init and namespaces.
  StatusOr<SpawnRequest> PrepareSpawn(const ExecSpec& es, const char* op, bool default_term);
  // Launches warren-spawn for `req` and waits (bounded) for the command to
  // run: gives up when the sandbox is destroyed or paused (Aborted: nothing
  // of a spawn may sit frozen in a paused sandbox holding a daemon thread) or
  // `deadline` passes (sets *timed_out; paused time does not count).
  StatusOr<SpawnStarted> SpawnCommand(const SpawnRequest& req, const char* verb, Clock::time_point deadline,
                                      bool* timed_out);

  std::shared_ptr<BackendState> st_;
  SandboxSpec spec_;
  uint32_t slot_;
  pid_t init_pid_;
  uint64_t start_time_;
  UniqueFd pidfd_;
  std::unique_ptr<jail::Cgroup> cgroup_;
  std::unique_ptr<SandboxFiles> files_;
  std::atomic<bool> destroyed_{false};
  std::mutex mu_;                                         // guards lingering_, destroy_done_
  std::vector<std::unique_ptr<jail::Cgroup>> lingering_;  // exec cgroups with background processes
  bool destroy_done_ = false;
  std::atomic<bool> reclaimed_{false};    // ReclaimMemory ran (suspend)
  std::atomic<int> spawns_in_flight_{0};  // Exec/Start between their destroyed_ check and CollectSpawn
  // Counts a spawn in flight for its scope; false when the sandbox is destroyed.
  struct SpawnGuard {
    ContainerSandbox* sb;
    bool ok;
    explicit SpawnGuard(ContainerSandbox* s) : sb(s) {
      sb->spawns_in_flight_.fetch_add(1);
      ok = !sb->destroyed_.load();
    }
    ~SpawnGuard() { sb->spawns_in_flight_.fetch_sub(1); }
  };
  std::atomic<uint64_t> exec_seq_;
  UniqueFd upper_;                          // guarded by mu_; see OpenUpper
  uint64_t upper_dev_ = 0, upper_ino_ = 0;  // guarded by mu_ (written once, before Record())
  std::string upper_error_;                 // guarded by mu_: why there is no upper_
  std::mutex pause_mu_;
  std::atomic<int64_t> paused_since_ns_{0};  // steady ns of the pause in effect, 0 = running
  std::atomic<int64_t> paused_total_ns_{0};
  void RecordNetwork(container::record::Container* r) const;
  Status ReleaseNetwork();  // after init died; idempotent; closes the exposed ports too
  // A listener for `port` (0: any node port) whose connections enter this
  // sandbox's network namespace.
  StatusOr<std::unique_ptr<net::Exposure>> OpenExposure(uint16_t port, uint16_t listen_port, std::string token);
  Status WriteResolvConf(uint32_t nameserver);
  mutable std::mutex net_mu_;
  bool has_network_ = false;  // guarded by net_mu_
  uint32_t net_index_ = 0;
  NetworkSpec network_;  // canonical entries
  // Declared after pidfd_: destroyed (threads joined) before it is closed.
  std::map<uint16_t, std::unique_ptr<net::Exposure>> exposed_;  // guarded by net_mu_
  desktop::X11Desktop x11_{*this};                              // last: it only holds a reference to *this
};

}  // namespace warren::runtime::container
