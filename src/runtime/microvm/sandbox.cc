#include "runtime/microvm/sandbox.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <map>

#include "common/child_reaper.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/rollback.h"
#include "image/layer_tree.h"
#include "net/expose.h"
#include "runtime/microvm/changes.h"
#include "runtime/microvm/files.h"
#include "runtime/microvm/process.h"
#include "runtime/microvm/template.h"

namespace warren::runtime::microvm {

namespace {

constexpr std::chrono::milliseconds kQmpTimeout{10000};
constexpr const char* kDefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

std::string Tail(const std::string& path, size_t max) {
  StatusOr<std::string> s = ReadSmallFile(path, 1 << 20);
  if (!s.ok() || s->empty()) return "";
  std::string t = s->size() > max ? s->substr(s->size() - max) : *s;
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  return t;
}

}  // namespace

std::string SocketPath(const std::string& dir, int dir_fd, const std::string& name) {
  std::string plain = dir + "/" + name;
  if (plain.size() < sizeof(sockaddr_un{}.sun_path)) return plain;
  return "/proc/self/fd/" + std::to_string(dir_fd) + "/" + name;
}

std::string LogTails(const std::string& dir) {
  std::string out;
  std::string console = Tail(dir + "/console.log", 600);
  std::string qemu = Tail(dir + "/qemu.log", 600);
  if (!console.empty()) out += "; console: " + console;
  if (!qemu.empty()) out += "; qemu: " + qemu;
  return out;
}

std::string StateFilePath(const std::string& disk) {
  std::string base = disk;
  if (base.size() > 4 && base.compare(base.size() - 4, 4, ".img") == 0) base.resize(base.size() - 4);
  return base + ".vmstate";
}

std::string ChangesDirPath(const std::string& disk) {
  std::string base = disk;
  if (base.size() > 4 && base.compare(base.size() - 4, 4, ".img") == 0) base.resize(base.size() - 4);
  return base + ".changes";
}

Status RemoveVmFiles(const std::string& dir, const std::string& disk) {
  Status first;
  std::vector<std::string> files, trees = {dir};
  if (!disk.empty()) {
    const std::string changes = ChangesDirPath(disk);
    files = {disk, StateFilePath(disk), StateFilePath(disk) + ".part", changes + ".tar"};
    trees.insert(trees.end(), {changes, changes + ".x"});
  }
  for (const std::string& f : files) {
    if (::unlink(f.c_str()) != 0 && errno != ENOENT && first.ok()) first = ErrnoToStatus(errno, "unlink(" + f + ")");
  }
  for (const std::string& t : trees) {
    if (t.empty() || ::access(t.c_str(), F_OK) != 0) continue;
    Status s = RemoveTree(t);
    if (first.ok()) first = s;
  }
  return first;
}

void KillQemu(UniqueFd pidfd) {
  if (!pidfd.valid()) return;
  if (::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0) != 0 && errno != ESRCH) {
    Log(spdlog::level::warn, "pidfd_send_signal(qemu) failed", {{"error", std::strerror(errno)}});
  }
  pollfd p{pidfd.get(), POLLIN, 0};
  (void)::poll(&p, 1, 5000);
  // A child of this daemon (not after a restart: then init reaps it).
  if (!TryReapPidfd(pidfd.get())) ChildReaper::Get().Adopt(std::move(pidfd));
}

MicrovmSandbox::~MicrovmSandbox() {
  if (channel_) channel_->Close();
}

// A file call's bound in the guest (a recursive remove of a big tree is
// one call; TCG is slow).
constexpr std::chrono::milliseconds kFileCallTimeout{120000};
// How long the guest may take to start a process.
constexpr std::chrono::milliseconds kProcessStartTimeout{60000};

MicrovmSandbox::MicrovmSandbox(Parts parts)
    : p_(std::move(parts)),
      files_(NewMicrovmFiles(
          p_.spec.id, [this] { return Channel(); }, kFileCallTimeout)),
      dir_fd_(::open(p_.spec.dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC)),
      channel_(std::move(p_.channel)) {
  if (p_.record.network()) {
    has_network_ = true;
    net_index_ = p_.record.network_index();
    network_.enabled = true;
    network_.allow.assign(p_.record.network_allow().begin(), p_.record.network_allow().end());
    network_.deny.assign(p_.record.network_deny().begin(), p_.record.network_deny().end());
  }
}

StatusOr<std::shared_ptr<AgentChannel>> MicrovmSandbox::Channel() const {
  std::lock_guard<std::mutex> l(mu_);
  if (destroyed_) return absl::FailedPreconditionError("sandbox " + p_.spec.id + " was destroyed");
  if (!channel_) return absl::FailedPreconditionError("sandbox " + p_.spec.id + " is suspended (resume it first)");
  return channel_;
}

SandboxFiles& MicrovmSandbox::files() { return *files_; }

std::string MicrovmSandbox::Record() const {
  record::Microvm r;
  {
    std::lock_guard<std::mutex> l(mu_);
    r = p_.record;
  }
  RecordNetwork(&r);
  return r.SerializeAsString();
}

pid_t MicrovmSandbox::init_pid() const {
  std::lock_guard<std::mutex> l(mu_);
  return p_.pidfd.valid() ? p_.record.qemu_pid() : 0;
}

StatusOr<ExecOutcome> MicrovmSandbox::Exec(const ExecSpec& es) {
  std::shared_ptr<AgentChannel> ch;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (destroyed_) {
      ExecOutcome out;
      out.signal = SIGKILL;
      out.exit_code = 128 + SIGKILL;
      return out;
    }
    ch = channel_;
  }
  if (!ch) return absl::FailedPreconditionError("sandbox " + p_.spec.id + " is suspended (resume it first)");
  proto::ExecRequest req = Request(es);
  std::chrono::milliseconds bound{0};
  if (es.timeout.count() > 0) bound = es.timeout + es.kill_grace + p_.exec_slack;
  return ch->Exec(req, es.stdin_data, bound);
}

StatusOr<std::string> MicrovmSandbox::GuestInterrupts(std::chrono::milliseconds timeout) const {
  ASSIGN_OR_RETURN(std::shared_ptr<AgentChannel> ch, Channel());
  return ch->Request(proto::FrameType::kInterrupts, "", proto::FrameType::kInterruptsReply, timeout);
}

StatusOr<std::unique_ptr<Process>> MicrovmSandbox::Start(const ExecSpec& es, const StartOptions& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<AgentChannel> ch, Channel());
  proto::ExecRequest req = Request(es);
  req.stdin_follows = false;
  req.timeout_ms = 0;
  req.pty = options.pty;
  req.rows = options.rows;
  req.cols = options.cols;
  req.control_fd = options.control_fd;
  return StartProcess(std::move(ch), req, options, kProcessStartTimeout);
}

proto::ExecRequest MicrovmSandbox::Request(const ExecSpec& es) const {
  proto::ExecRequest req;
  req.argv = es.argv;
  req.shell = es.shell;
  std::map<std::string, std::string> env = p_.spec.env;
  for (const auto& [k, v] : es.env) env[k] = v;
  if (!env.count("PATH")) env["PATH"] = kDefaultPath;
  for (const auto& [k, v] : env) req.env.push_back(k + "=" + v);
  req.cwd = es.cwd.empty() ? p_.spec.workdir : es.cwd;
  req.user = es.user.empty() ? p_.spec.user : es.user;
  req.timeout_ms = static_cast<uint64_t>(es.timeout.count());
  req.kill_grace_ms = static_cast<uint64_t>(es.kill_grace.count());
  req.output_cap = es.output_cap_bytes;
  req.stdin_follows = !es.stdin_data.empty();
  return req;
}

StatusOr<std::string> MicrovmSandbox::QmpSocketPath() const {
  if (!dir_fd_.valid()) return absl::FailedPreconditionError("sandbox " + p_.spec.id + ": its dir is gone");
  return SocketPath(p_.spec.dir, dir_fd_.get(), "qmp.sock");
}

StatusOr<Qmp> MicrovmSandbox::ConnectQmp(std::chrono::milliseconds timeout) const {
  if (!dir_fd_.valid()) return absl::FailedPreconditionError("sandbox " + p_.spec.id + ": its dir is gone");
  return Qmp::Connect(SocketPath(p_.spec.dir, dir_fd_.get(), "qmp.sock"), Qmp::Clock::now() + timeout);
}

Status MicrovmSandbox::Pause() {
  std::lock_guard<std::mutex> lk(life_mu_);
  if (destroyed_) return absl::FailedPreconditionError("sandbox " + p_.spec.id + " is destroyed");
  if (p_.suspended || p_.paused) return absl::OkStatus();  // a suspended VM does not run either
  ASSIGN_OR_RETURN(Qmp qmp, ConnectQmp(kQmpTimeout));
  Status s = qmp.Command(R"({"execute":"stop"})").status();
  if (!s.ok()) return Status(s.code(), "sandbox " + p_.spec.id + ": pause: " + std::string(s.message()));
  p_.paused = true;
  return absl::OkStatus();
}

Status MicrovmSandbox::Resume() {
  std::lock_guard<std::mutex> lk(life_mu_);
  if (destroyed_) return absl::FailedPreconditionError("sandbox " + p_.spec.id + " is destroyed");
  if (p_.suspended) RETURN_IF_ERROR(RestoreLocked().status());
  if (p_.paused) {
    ASSIGN_OR_RETURN(Qmp qmp, ConnectQmp(kQmpTimeout));
    Status s = qmp.Command(R"({"execute":"cont"})").status();
    if (!s.ok()) return Status(s.code(), "sandbox " + p_.spec.id + ": resume: " + std::string(s.message()));
    p_.paused = false;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    if (channel_) return absl::OkStatus();
  }
  // Restored from a suspend: the agent gets a fresh hello (its clock set
  // to the host's) on the new QEMU's port.
  int pidfd;
  {
    std::lock_guard<std::mutex> l(mu_);
    pidfd = p_.pidfd.get();
  }
  proto::HelloReply hello;
  ASSIGN_OR_RETURN(std::unique_ptr<AgentChannel> ch,
                   AgentChannel::Connect(
                       p_.spec.id, SocketPath(p_.spec.dir, dir_fd_.get(), "agent.sock"),
                       AgentChannel::Clock::now() + p_.boot_timeout,
                       [pidfd] {
                         pollfd p{pidfd, POLLIN, 0};
                         return ::poll(&p, 1, 0) == 0;
                       },
                       &hello));
  if (hello.boot_id != p_.record.boot_id()) {
    return absl::InternalError("sandbox " + p_.spec.id + ": the restored guest has another boot id (" + hello.boot_id +
                               ", saved " + p_.record.boot_id() + ")");
  }
  std::lock_guard<std::mutex> l(mu_);
  channel_ = std::move(ch);
  return absl::OkStatus();
}

StatusOr<uint64_t> MicrovmSandbox::MemoryUsage() const {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!p_.pidfd.valid()) return 0;  // suspended: no process
  }
  if (!p_.cgroup) return absl::FailedPreconditionError("sandbox " + p_.spec.id + ": its cgroup is gone");
  return p_.cgroup->MemoryUsage();
}

uint64_t MicrovmSandbox::SwapUsage() const { return p_.cgroup ? p_.cgroup->SwapUsage() : 0; }

Status MicrovmSandbox::ReclaimMemory() {
  std::lock_guard<std::mutex> lk(life_mu_);
  if (destroyed_) return absl::FailedPreconditionError("sandbox " + p_.spec.id + " is destroyed");
  if (p_.suspended) return absl::OkStatus();
  if (!p_.paused) return absl::FailedPreconditionError("sandbox " + p_.spec.id + " is not paused");
  const auto deadline = Qmp::Clock::now() + p_.boot_timeout;
  const std::string state = StateFilePath(p_.record.disk());
  const std::string part = state + ".part";
  ASSIGN_OR_RETURN(Qmp qmp, ConnectQmp(p_.boot_timeout));
  // x-ignore-shared off: a clone's RAM (private pages over the template's)
  // goes into the file as well; the restore does not need the template.
  RETURN_IF_ERROR(SetIgnoreShared(qmp, false));
  {
    UniqueFd fd(::open(part.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!fd.valid()) return ErrnoToStatus(errno, "open(" + part + ")");
    Status s = MigrateToFd(qmp, fd.get(), deadline);
    if (s.ok() && ::fsync(fd.get()) != 0) s = ErrnoToStatus(errno, "fsync(" + part + ")");
    if (!s.ok()) {
      ::unlink(part.c_str());
      // A failed migration leaves the source as it was (stopped).
      return Status(s.code(), "sandbox " + p_.spec.id + ": saving its state: " + std::string(s.message()));
    }
  }
  if (::rename(part.c_str(), state.c_str()) != 0) {
    Status s = ErrnoToStatus(errno, "rename(" + part + ", " + state + ")");
    ::unlink(part.c_str());
    // QEMU ran `migrate` to completion: it is in "postmigrate" and `cont`
    // works again.
    return s;
  }
  // From here the file is the VM (Adopt restores from it if the daemon
  // dies now).
  std::shared_ptr<AgentChannel> ch;
  UniqueFd pidfd;
  {
    std::lock_guard<std::mutex> l(mu_);
    ch = std::move(channel_);
    pidfd = std::move(p_.pidfd);
    p_.suspended = true;
  }
  if (ch) ch->Close();
  KillQemu(std::move(pidfd));
  for (const char* f : {"/agent.sock", "/qmp.sock"}) ::unlink((p_.spec.dir + f).c_str());
  return absl::OkStatus();
}

StatusOr<uint64_t> MicrovmSandbox::EndSuspend(bool /*prefetch: the whole RAM comes back from the file*/) {
  std::lock_guard<std::mutex> lk(life_mu_);
  if (destroyed_) return absl::FailedPreconditionError("sandbox " + p_.spec.id + " is destroyed");
  if (!p_.suspended) return 0;
  return RestoreLocked();
}

StatusOr<uint64_t> MicrovmSandbox::RestoreLocked() {
  const auto deadline = Qmp::Clock::now() + p_.boot_timeout;
  const std::string state = StateFilePath(p_.record.disk());
  UniqueFd state_fd(::open(state.c_str(), O_RDONLY | O_CLOEXEC));
  if (!state_fd.valid()) return ErrnoToStatus(errno, "sandbox " + p_.spec.id + ": open(" + state + ")");
  struct stat st;
  if (::fstat(state_fd.get(), &st) != 0) return ErrnoToStatus(errno, "fstat(" + state + ")");
  if (!p_.cgroup) return absl::FailedPreconditionError("sandbox " + p_.spec.id + ": its cgroup is gone");
  if (!dir_fd_.valid()) return absl::FailedPreconditionError("sandbox " + p_.spec.id + ": its dir is gone");
  // Leftovers of a restore a crash cut short.
  for (const char* f : {"/agent.sock", "/qmp.sock"}) ::unlink((p_.spec.dir + f).c_str());
  const std::string agent_path = SocketPath(p_.spec.dir, dir_fd_.get(), "agent.sock");
  const std::string qmp_path = SocketPath(p_.spec.dir, dir_fd_.get(), "qmp.sock");
  ASSIGN_OR_RETURN(UniqueFd agent_listener, ListenUnix(agent_path));
  ASSIGN_OR_RETURN(UniqueFd qmp_listener, ListenUnix(qmp_path));
  ASSIGN_OR_RETURN(std::vector<UniqueFd> procs, p_.cgroup->OpenProcsFds());
  std::vector<int> procs_fds;
  procs_fds.reserve(procs.size());
  for (const UniqueFd& fd : procs) procs_fds.push_back(fd.get());
  LaunchedQemu q;
  if (p_.relaunch) {
    ASSIGN_OR_RETURN(UniqueFd tap, OpenTapQueue());
    ASSIGN_OR_RETURN(q, p_.relaunch({agent_listener.get(), qmp_listener.get(), procs_fds, tap.get()}));
  } else {
    VmConfig vm = p_.restore_vm;
    vm.restore = true;
    vm.ram_fd = -1;
    vm.agent_listen_fd = kAgentFd;
    vm.qmp_listen_fd = kQmpFd;
    std::vector<std::pair<int, int>> fds = {{agent_listener.get(), kAgentFd}, {qmp_listener.get(), kQmpFd}};
    // The NIC's backend: a new queue of the sandbox's tap (it outlived the
    // saved QEMU).
    ASSIGN_OR_RETURN(UniqueFd tap, OpenTapQueue());
    vm.tap_fd = tap.valid() ? kTapFd : -1;
    if (tap.valid()) fds.push_back({tap.get(), kTapFd});
    // As at the create: every file an open fd, QEMU under the VM's own
    // unprivileged uid (its jail holds across a suspend).
    std::vector<UniqueFd> files;
    RETURN_IF_ERROR(OpenVmFiles(&vm, kFirstFileFd, &files, &fds));
    ASSIGN_OR_RETURN(q, LaunchQemu(QemuArgv(p_.qemu, vm), fds, p_.spec.dir + "/qemu.log", procs_fds, p_.identity));
    files.clear();
    tap.reset();
  }
  agent_listener.reset();
  qmp_listener.reset();
  Rollback rb;
  rb.Add([&] { KillQemu(std::move(q.pidfd)); });
  bool running = true;
  {
    StatusOr<Qmp> qmp = Qmp::Connect(qmp_path, deadline);
    Status s = qmp.ok() ? SetIgnoreShared(*qmp, false) : qmp.status();
    if (s.ok()) s = MigrateFromFd(*qmp, state_fd.get(), deadline, &running);
    if (!s.ok()) {
      return Status(s.code(), "sandbox " + p_.spec.id + ": restoring its saved state: " + std::string(s.message()) +
                                  LogTails(p_.spec.dir));
    }
  }
  rb.Commit();
  {
    std::lock_guard<std::mutex> l(mu_);
    p_.record.set_qemu_pid(q.pid);
    p_.record.set_qemu_start_time(q.start_time);
    p_.pidfd = std::move(q.pidfd);
    p_.suspended = false;
    p_.paused = !running;  // saved while stopped: stays stopped until Resume
  }
  // The restored QEMU is the VM now: the file goes last, so a crash before
  // this line finds the file (and kills the QEMU in the cgroup).
  if (::unlink(state.c_str()) != 0) {
    Log(spdlog::level::warn, "removing a restored VM's state file failed",
        {{"sandbox", p_.spec.id}, {"error", std::strerror(errno)}});
  }
  return static_cast<uint64_t>(st.st_size);
}

Status MicrovmSandbox::ExportChanges(const std::string& dst_dir, const ExportOptions& options) {
  bool stop_after = false;
  {
    std::lock_guard<std::mutex> lk(life_mu_);
    if (destroyed_) return absl::FailedPreconditionError("sandbox " + p_.spec.id + " is destroyed");
    if (p_.suspended) {
      return absl::FailedPreconditionError("sandbox " + p_.spec.id +
                                           " is suspended: resume it before taking its changes");
    }
    if (p_.paused) {
      // The agent needs the vCPUs; the guest's freezer holds the commands.
      ASSIGN_OR_RETURN(Qmp qmp, ConnectQmp(kQmpTimeout));
      Status s = qmp.Command(R"({"execute":"cont"})").status();
      if (!s.ok()) return Status(s.code(), "sandbox " + p_.spec.id + ": changes: " + std::string(s.message()));
      p_.paused = false;
      stop_after = true;
    }
  }
  Status s = ExportChangesOverChannel(
      p_.spec.id, [this] { return Channel(); }, kFileCallTimeout, MaxChangesTarBytes(p_.spec.resources.disk_mb),
      dst_dir, options);
  if (stop_after) {
    std::lock_guard<std::mutex> lk(life_mu_);
    if (!destroyed_ && !p_.suspended && !p_.paused) {
      StatusOr<Qmp> qmp = ConnectQmp(kQmpTimeout);
      Status st = qmp.ok() ? qmp->Command(R"({"execute":"stop"})").status() : qmp.status();
      if (st.ok()) {
        p_.paused = true;
      } else if (s.ok()) {
        s = Status(st.code(),
                   "sandbox " + p_.spec.id + ": pausing again after its changes: " + std::string(st.message()));
      }
    }
  }
  return s;
}

StatusOr<ChangeExporter::ChangeView> MicrovmSandbox::OpenChanges() {
  std::string dir;
  {
    std::lock_guard<std::mutex> l(mu_);
    dir = ChangesDirPath(p_.record.disk());
  }
  if (::access(dir.c_str(), F_OK) == 0) RETURN_IF_ERROR(RemoveTree(dir));
  const uint64_t disk = uint64_t{p_.spec.resources.disk_mb} << 20;
  image::CopyBudget budget("sandbox " + p_.spec.id, disk + disk / 4);
  ExportOptions o;
  o.budget = &budget;
  RETURN_IF_ERROR(ExportChanges(dir, o));
  ChangeView v;
  v.dir.reset(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!v.dir.valid()) return ErrnoToStatus(errno, "open(" + dir + ")");
  return v;
}

Status MicrovmSandbox::Destroy() {
  std::lock_guard<std::mutex> lk(life_mu_);
  UniqueFd pidfd;
  std::shared_ptr<AgentChannel> ch;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (destroyed_) return absl::OkStatus();
    destroyed_ = true;
    pidfd = std::move(p_.pidfd);
    ch = channel_;
  }
  if (ch) ch->Close();
  KillQemu(std::move(pidfd));
  Status first;
  if (p_.cgroup) {
    Status s = p_.cgroup->Destroy(std::chrono::seconds(5));
    if (!s.ok()) first = s;
  }
  // QEMU is gone: its tap, chains and exposed listeners go now.
  if (Status ns = ReleaseNetwork(); !ns.ok() && first.ok()) first = ns;
  Status s = RemoveVmFiles(p_.spec.dir, p_.record.disk());
  if (first.ok()) first = s;
  if (p_.release_uid) p_.release_uid();
  return first;
}

}  // namespace warren::runtime::microvm
