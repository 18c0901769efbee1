#include "runtime/microvm/template.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "common/file_util.h"
#include "common/fnv.h"
#include "common/log.h"
#include "common/rollback.h"
#include "runtime/microvm/channel.h"
#include "runtime/microvm/sandbox.h"

namespace warren::runtime::microvm {
namespace {

using Clock = std::chrono::steady_clock;

// FNV-1a 64 over a file's bytes, into `h`.
Status HashFile(const std::string& path, uint64_t* h) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, "open(" + path + ")");
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "read(" + path + ")");
    if (n == 0) return absl::OkStatus();
    *h = Fnv1a64(std::string_view(buf, static_cast<size_t>(n)), *h);
  }
}

StatusOr<std::string> StatIdentity(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, "stat(" + path + ")");
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" + std::to_string(st.st_size) + ":" +
         std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec) + ";";
}

}  // namespace

StatusOr<UniqueFd> ListenUnix(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, "socket(AF_UNIX)");
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.size() >= sizeof sa.sun_path) return absl::InvalidArgumentError("socket path too long: " + path);
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    return ErrnoToStatus(errno, "bind(" + path + ")");
  }
  if (::listen(fd.get(), 1) != 0) return ErrnoToStatus(errno, "listen(" + path + ")");
  return fd;
}

int KillTemplateQemus(const std::string& qemu, const std::string& dir) {
  int killed = 0;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return 0;
  const std::string& needle = dir;
  while (dirent* e = ::readdir(proc)) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    pid_t pid = static_cast<pid_t>(std::strtol(e->d_name, nullptr, 10));
    StatusOr<std::string> cmd = ReadSmallFile(std::string("/proc/") + e->d_name + "/cmdline", 64 << 10);
    if (!cmd.ok() || cmd->compare(0, qemu.size() + 1, qemu + '\0') != 0) continue;
    if (cmd->find(needle) == std::string::npos) continue;
    uint64_t start = ProcessStartTime(pid);
    UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    // Checked again with the pidfd held: the pid cannot be reused now.
    if (!pidfd.valid() || start == 0 || ProcessStartTime(pid) != start) continue;
    Log(spdlog::level::warn, "killing a template QEMU left by an earlier daemon", {{"pid", std::to_string(pid)}});
    KillQemu(std::move(pidfd));
    ++killed;
  }
  ::closedir(proc);
  return killed;
}

bool FitsTemplate(const std::vector<std::string>& layer_files, uint64_t disk_mb) {
  if ((disk_mb << 20) > kTemplateDiskBytes) return false;
  for (const std::string& f : layer_files) {
    struct stat st;
    if (::stat(f.c_str(), &st) != 0 || static_cast<uint64_t>(st.st_size) > kTemplateDiskBytes) return false;
  }
  return true;
}

Template::~Template() {
  if (!dir.empty()) {
    Status s = RemoveTree(dir);
    if (!s.ok()) Log(spdlog::level::warn, "removing a microvm template failed", {{"error", s.ToString()}});
  }
}

TemplateCache::~TemplateCache() {
  std::lock_guard<std::mutex> l(mu_);
  entries_.clear();         // each Template's dir goes with its last user
  ::rmdir(o_.dir.c_str());  // empty unless a clone still being created holds one
}

StatusOr<std::string> TemplateCache::InputsHash() {
  std::string key;
  for (const std::string* p : {&o_.kernel, &o_.initrd, &o_.qemu}) {
    ASSIGN_OR_RETURN(std::string id, StatIdentity(*p));
    key += id;
  }
  if (key == stat_key_) return inputs_hash_;
  uint64_t h = kFnv1a64Offset;
  RETURN_IF_ERROR(HashFile(o_.kernel, &h));
  RETURN_IF_ERROR(HashFile(o_.initrd, &h));
  // QEMU's version: its binary's identity (a package upgrade replaces it).
  ASSIGN_OR_RETURN(std::string qemu_id, StatIdentity(o_.qemu));
  h = Fnv1a64(qemu_id, h);
  stat_key_ = key;
  inputs_hash_ = Hex16(h);
  return inputs_hash_;
}

StatusOr<std::string> TemplateCache::BareName(const VmConfig& vm) {
  ASSIGN_OR_RETURN(std::string inputs, InputsHash());
  // The arguments: what QemuArgv makes of this shape (disk paths aside).
  VmConfig shape = vm;
  shape.layer_files.assign(vm.layer_files.size(), "L");
  shape.disk = "D";
  shape.console_log = "C";
  shape.hostname = "H";
  shape.shm_mb = 0;  // a clone's comes in its hello
  shape.pids = 0;
  uint64_t h = kFnv1a64Offset;
  for (const std::string& a : QemuArgv(o_.qemu, shape)) h = Fnv1a64(a + '\0', h);
  std::string name = inputs + "-" + Hex16(h).substr(0, 8) + "-l" + std::to_string(vm.layer_files.size()) + "-m" +
                     std::to_string(vm.memory_mb);
  // Templates of other inputs are stale: gone once their clones started.
  for (auto it = entries_.begin(); it != entries_.end();) {
    it = it->first.rfind(inputs, 0) == 0 ? std::next(it) : entries_.erase(it);
  }
  return name;
}

StatusOr<std::shared_ptr<const Template>> TemplateCache::Get(const VmConfig& vm) {
  std::shared_ptr<Entry> e;
  std::string name;
  {
    std::lock_guard<std::mutex> l(mu_);
    ASSIGN_OR_RETURN(name, BareName(vm));
    std::shared_ptr<Entry>& slot = entries_[name];
    if (!slot) slot = std::make_shared<Entry>();
    e = slot;
  }
  std::lock_guard<std::mutex> b(e->build);
  if (e->ready) return e->ready;
  if (!e->failed.empty()) return absl::FailedPreconditionError(e->failed);
  StatusOr<std::shared_ptr<const Template>> t = Build(vm, name);
  if (!t.ok()) {
    e->failed = "building the template " + name + " failed: " + t.status().ToString();
    return absl::FailedPreconditionError(e->failed);
  }
  e->ready = *t;
  return e->ready;
}

StatusOr<std::shared_ptr<const Template>> TemplateCache::GetRooted(const VmConfig& vm, uint32_t disk_mb) {
  // Which files, and what they are now: a layer replaced under its path
  // (another inode, size or mtime) makes another template.
  std::string layer_inputs = std::to_string(disk_mb) + ";";
  uint64_t h = kFnv1a64Offset;
  for (const std::string& f : vm.layer_files) {
    ASSIGN_OR_RETURN(std::string id, StatIdentity(f));
    layer_inputs += f + '\0' + id;
    h = Fnv1a64(f + '\0', h);
  }
  h = (h ^ disk_mb) * kFnv1a64Prime;
  std::shared_ptr<Entry> e;
  std::string name;
  {
    std::lock_guard<std::mutex> l(mu_);
    ASSIGN_OR_RETURN(std::string bare, BareName(vm));
    name = bare + "-r" + Hex16(h).substr(0, 8);
    std::shared_ptr<Entry>& slot = entries_[name];
    if (!slot) slot = std::make_shared<Entry>();
    e = slot;
    e->last_used = ++uses_;
  }
  std::lock_guard<std::mutex> b(e->build);
  if (e->layer_inputs != layer_inputs) {
    if (!e->layer_inputs.empty()) {
      Log(spdlog::level::info, "microvm root template out of date (a layer changed); rebuilding", {{"template", name}});
    }
    e->ready.reset();
    e->failed.clear();
    e->layer_inputs = layer_inputs;
  }
  if (e->ready) return e->ready;
  if (!e->failed.empty()) return absl::FailedPreconditionError(e->failed);
  ASSIGN_OR_RETURN(std::shared_ptr<const Template> bare, Get(vm));
  StatusOr<std::shared_ptr<const Template>> t = BuildRooted(vm, disk_mb, *bare, name);
  if (!t.ok()) {
    e->failed = "building the root template " + name + " failed: " + t.status().ToString();
    return absl::FailedPreconditionError(e->failed);
  }
  e->ready = *t;
  e->memory_mb = vm.memory_mb;
  {
    std::lock_guard<std::mutex> l(mu_);
    EvictRooted(name);
  }
  return e->ready;
}

void TemplateCache::EvictRooted(const std::string& keep) {
  while (true) {
    uint64_t total = 0;
    std::map<std::string, std::shared_ptr<Entry>>::iterator oldest = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second->memory_mb == 0) continue;  // bare, or not built (yet)
      total += it->second->memory_mb;
      if (it->first != keep && (oldest == entries_.end() || it->second->last_used < oldest->second->last_used)) {
        oldest = it;
      }
    }
    if (total <= kMaxRootedTemplateMb || oldest == entries_.end()) return;
    Log(spdlog::level::info, "dropping the least recently used microvm root template", {{"template", oldest->first}});
    entries_.erase(oldest);  // its dir goes with its last user
  }
}

StatusOr<std::shared_ptr<const Template>> TemplateCache::Build(const VmConfig& vm, const std::string& name) {
  const Clock::time_point deadline = Clock::now() + o_.boot_timeout;
  auto t = std::make_shared<Template>();
  RETURN_IF_ERROR(MkdirAll(o_.dir, 0700));
  const std::string dir = o_.dir + "/" + name;
  if (::access(dir.c_str(), F_OK) == 0) RETURN_IF_ERROR(RemoveTree(dir));
  RETURN_IF_ERROR(MkdirAll(dir, 0700));
  t->dir = dir;  // from here on, failing removes it (~Template)
  t->state_file = dir + "/state";
  t->memory_mb = vm.memory_mb;

  VmConfig c = vm;
  c.layer_files.clear();
  for (size_t i = 0; i <= vm.layer_files.size(); ++i) {
    std::string p = dir + "/placeholder" + std::to_string(i);
    UniqueFd fd(::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd.valid() || ::ftruncate(fd.get(), static_cast<off_t>(kTemplateDiskBytes)) != 0)
      return ErrnoToStatus(errno, "create(" + p + ")");
    if (i < vm.layer_files.size()) {
      c.layer_files.push_back(p);
    } else {
      c.disk = p;
    }
  }
  c.console_log = dir + "/console.log";
  c.name = "warren-template:" + dir;
  c.hostname = "template";
  c.agent_listen_fd = kAgentFd;
  c.qmp_listen_fd = kQmpFd;
  c.ram_fd = kRamFd;
  c.ram_shared = true;
  c.template_boot = true;
  c.restore = false;

  t->ram.reset(::memfd_create("warren-template-ram", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!t->ram.valid()) return ErrnoToStatus(errno, "memfd_create(warren-template-ram)");
  if (::ftruncate(t->ram.get(), static_cast<off_t>(vm.memory_mb) << 20) != 0) {
    return ErrnoToStatus(errno, "ftruncate(template memfd)");
  }
  // Every page allocated now (zeroed, charged to the daemon), not on first
  // touch: a clone's fault on a page the template never touched would
  // otherwise allocate it in the memfd, charged to that clone's memory
  // cgroup, on top of the private copy its write makes, and a guest using
  // all of its RAM got its QEMU killed by the cgroup limit (memory_mb +
  // kQemuOverheadMb) instead of its own OOM killer acting
  // (test_guest_oom_kill_is_reported).
  if (::fallocate(t->ram.get(), 0, 0, static_cast<off_t>(vm.memory_mb) << 20) != 0) {
    return ErrnoToStatus(errno, "fallocate(template memfd)");
  }
  UniqueFd dir_fd(::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd.valid()) return ErrnoToStatus(errno, "open(" + dir + ")");
  const std::string agent_path = SocketPath(dir, dir_fd.get(), "agent.sock");
  const std::string qmp_path = SocketPath(dir, dir_fd.get(), "qmp.sock");
  ASSIGN_OR_RETURN(UniqueFd agent_listener, ListenUnix(agent_path));
  ASSIGN_OR_RETURN(UniqueFd qmp_listener, ListenUnix(qmp_path));
  std::vector<std::pair<int, int>> fds = {
      {agent_listener.get(), kAgentFd}, {qmp_listener.get(), kQmpFd}, {t->ram.get(), kRamFd}};
  std::vector<UniqueFd> files;
  RETURN_IF_ERROR(OpenVmFiles(&c, kFirstFileFd, &files, &fds));
  ASSIGN_OR_RETURN(LaunchedQemu q, LaunchQemu(QemuArgv(o_.qemu, c), fds, dir + "/qemu.log", {}, o_.identity));
  agent_listener.reset();
  qmp_listener.reset();
  files.clear();
  Rollback rb;
  rb.Add([&] { KillQemu(std::move(q.pidfd)); });
  auto fail = [&](const Status& s) { return Status(s.code(), std::string(s.message()) + LogTails(dir)); };

  int pidfd = q.pidfd.get();
  auto alive = [pidfd] {
    pollfd p{pidfd, POLLIN, 0};
    return ::poll(&p, 1, 0) == 0;
  };
  proto::HelloReply hello;
  {
    StatusOr<std::unique_ptr<AgentChannel>> ch =
        AgentChannel::Connect("template " + name, agent_path, deadline, alive, &hello);
    if (!ch.ok()) return fail(ch.status());
  }  // the agent stays idle in its read: the state to save
  if (!hello.error.empty()) return absl::FailedPreconditionError("the template guest failed: " + hello.error);
  if (!hello.boot_id.empty()) {
    return absl::FailedPreconditionError(
        "the guest agent does not hold its root for templates (it predates warren.template=1; rebuild the guest "
        "with scripts/microvm/build-guest.sh)");
  }
  StatusOr<Qmp> qmp = Qmp::Connect(qmp_path, deadline);
  if (!qmp.ok()) return fail(qmp.status());
  RETURN_IF_ERROR(SetIgnoreShared(*qmp, true));
  {
    UniqueFd state(::open(t->state_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!state.valid()) return ErrnoToStatus(errno, "open(" + t->state_file + ")");
    // Not `stop` first: the stream records the run state, clones of a
    // stopped template would stay paused.
    Status s = MigrateToFd(*qmp, state.get(), deadline);
    if (!s.ok()) return fail(s);
  }
  rb.Commit();
  KillQemu(std::move(q.pidfd));  // QEMU gone: no shared writable mapping is left, so sealing works
  if (::fcntl(t->ram.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return ErrnoToStatus(errno, "fcntl(template memfd, F_ADD_SEALS)");
  }
  for (const char* f : {"agent.sock", "qmp.sock", "console.log", "qemu.log"}) ::unlink((dir + "/" + f).c_str());
  for (size_t i = 0; i <= vm.layer_files.size(); ++i) ::unlink((dir + "/placeholder" + std::to_string(i)).c_str());
  Log(spdlog::level::info, "microvm template saved", {{"template", name}});
  return std::shared_ptr<const Template>(std::move(t));
}

StatusOr<std::shared_ptr<const Template>> TemplateCache::BuildRooted(const VmConfig& vm, uint32_t disk_mb,
                                                                     const Template& bare, const std::string& name) {
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point deadline = t0 + o_.boot_timeout;
  auto t = std::make_shared<Template>();
  const std::string dir = o_.dir + "/" + name;
  if (::access(dir.c_str(), F_OK) == 0) RETURN_IF_ERROR(RemoveTree(dir));
  RETURN_IF_ERROR(MkdirAll(dir, 0700));
  t->dir = dir;  // from here on, failing removes it (~Template)
  t->state_file = dir + "/state";
  t->memory_mb = vm.memory_mb;
  t->disk = dir + "/disk";
  RETURN_IF_ERROR(MakeDisk(t->disk, disk_mb));

  // Its RAM: a copy of the bare template's (which stays sealed), every
  // page allocated (see Build).
  const size_t bytes = size_t{vm.memory_mb} << 20;
  t->ram.reset(::memfd_create("warren-template-ram", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!t->ram.valid()) return ErrnoToStatus(errno, "memfd_create(warren-template-ram)");
  {
    void* src = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, bare.ram.get(), 0);
    if (src == MAP_FAILED) return ErrnoToStatus(errno, "mmap(the bare template's memfd)");
    size_t off = 0;
    while (off < bytes) {
      ssize_t n = ::write(t->ram.get(), static_cast<const char*>(src) + off, std::min<size_t>(bytes - off, 8 << 20));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        Status s = ErrnoToStatus(errno, "write(template memfd)");
        ::munmap(src, bytes);
        return s;
      }
      off += static_cast<size_t>(n);
    }
    ::munmap(src, bytes);
  }

  VmConfig c = vm;
  c.disk = t->disk;
  c.console_log = dir + "/console.log";
  c.name = "warren-template:" + dir;
  c.hostname = "template";
  c.agent_listen_fd = kAgentFd;
  c.qmp_listen_fd = kQmpFd;
  c.ram_fd = kRamFd;
  c.ram_shared = true;  // its writes are this template's RAM
  c.template_boot = false;
  c.restore = true;
  UniqueFd dir_fd(::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd.valid()) return ErrnoToStatus(errno, "open(" + dir + ")");
  const std::string agent_path = SocketPath(dir, dir_fd.get(), "agent.sock");
  const std::string qmp_path = SocketPath(dir, dir_fd.get(), "qmp.sock");
  ASSIGN_OR_RETURN(UniqueFd agent_listener, ListenUnix(agent_path));
  ASSIGN_OR_RETURN(UniqueFd qmp_listener, ListenUnix(qmp_path));
  std::vector<std::pair<int, int>> fds = {
      {agent_listener.get(), kAgentFd}, {qmp_listener.get(), kQmpFd}, {t->ram.get(), kRamFd}};
  std::vector<UniqueFd> files;
  RETURN_IF_ERROR(OpenVmFiles(&c, kFirstFileFd, &files, &fds));
  ASSIGN_OR_RETURN(LaunchedQemu q, LaunchQemu(QemuArgv(o_.qemu, c), fds, dir + "/qemu.log", {}, o_.identity));
  agent_listener.reset();
  qmp_listener.reset();
  files.clear();
  Rollback rb;
  rb.Add([&] { KillQemu(std::move(q.pidfd)); });
  auto fail = [&](const Status& s) { return Status(s.code(), std::string(s.message()) + LogTails(dir)); };
  if (Status s = RestoreClone(qmp_path, bare, deadline); !s.ok()) return fail(s);

  int pidfd = q.pidfd.get();
  auto alive = [pidfd] {
    pollfd p{pidfd, POLLIN, 0};
    return ::poll(&p, 1, 0) == 0;
  };
  proto::Hello setup;
  setup.setup_root = true;
  setup.template_root = true;
  setup.layers = vm.layer_files.size();
  setup.hostname = "template";
  setup.shm_mb = 64;
  proto::HelloReply hello;
  {
    StatusOr<std::unique_ptr<AgentChannel>> ch =
        AgentChannel::Connect("template " + name, agent_path, deadline, alive, &hello, setup);
    if (!ch.ok()) return fail(ch.status());
    if (!hello.error.empty()) return absl::FailedPreconditionError("the template guest failed: " + hello.error);
    if (!hello.boot_id.empty()) {
      return absl::FailedPreconditionError(
          "the guest agent reads boot_id in a template with its root (it predates template_root; rebuild the guest "
          "with scripts/microvm/build-guest.sh)");
    }
    // What every first exec reads: the loader, libc, the shell, the PATH
    // walk into the page cache (a failure, e.g. no /bin/sh in the layers,
    // only leaves them cold).
    proto::ExecRequest warm;
    warm.argv = {"/bin/sh", "-c", "exec /usr/bin/env true"};
    warm.env = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"};
    warm.cwd = "/";
    warm.user = "root";
    warm.timeout_ms = 10000;
    StatusOr<ExecOutcome> r = (*ch)->Exec(warm, "", std::chrono::milliseconds(20000));
    if (!r.ok() || r->exit_code != 0) {
      Log(spdlog::level::info, "microvm root template: warming the page cache failed (clones start cold)",
          {{"template", name}, {"error", r.ok() ? "exit " + std::to_string(r->exit_code) : r.status().ToString()}});
    }
  }  // closed: the agent waits for the next host (a clone's) on SIGIO
  StatusOr<Qmp> qmp = Qmp::Connect(qmp_path, deadline);
  if (!qmp.ok()) return fail(qmp.status());
  RETURN_IF_ERROR(SetIgnoreShared(*qmp, true));
  {
    UniqueFd state(::open(t->state_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!state.valid()) return ErrnoToStatus(errno, "open(" + t->state_file + ")");
    Status s = MigrateToFd(*qmp, state.get(), deadline);
    if (!s.ok()) return fail(s);
  }
  rb.Commit();
  KillQemu(std::move(q.pidfd));  // its disk is final now: migrate drained and flushed it
  if (::fcntl(t->ram.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return ErrnoToStatus(errno, "fcntl(template memfd, F_ADD_SEALS)");
  }
  for (const char* f : {"agent.sock", "qmp.sock", "console.log", "qemu.log"}) ::unlink((dir + "/" + f).c_str());
  Log(spdlog::level::info, "microvm root template saved",
      {{"template", name},
       {"ms", std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count())}});
  return std::shared_ptr<const Template>(std::move(t));
}

Status RestoreClone(const std::string& qmp_path, const Template& t, Clock::time_point deadline) {
  ASSIGN_OR_RETURN(Qmp qmp, Qmp::Connect(qmp_path, deadline));
  RETURN_IF_ERROR(SetIgnoreShared(qmp, true));
  UniqueFd state(::open(t.state_file.c_str(), O_RDONLY | O_CLOEXEC));
  if (!state.valid()) return ErrnoToStatus(errno, "open(" + t.state_file + ")");
  // The agent is spoken to once the guest runs: bytes sent to the port
  // while the device state is still loading could be dropped.
  bool running = false;
  RETURN_IF_ERROR(MigrateFromFd(qmp, state.get(), deadline, &running));
  if (!running) return absl::InternalError("the restored clone is not running");
  return absl::OkStatus();
}

}  // namespace warren::runtime::microvm
