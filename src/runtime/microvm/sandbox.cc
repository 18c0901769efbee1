#include "runtime/microvm/sandbox.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <map>

#include "common/child_reaper.h"
#include "common/file_util.h"
#include "common/log.h"
#include "runtime/microvm/files.h"
#include "runtime/microvm/process.h"

namespace warren::runtime::microvm {

namespace {

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

Status RemoveVmFiles(const std::string& dir, const std::string& disk) {
  Status first;
  if (!disk.empty() && ::unlink(disk.c_str()) != 0 && errno != ENOENT)
    first = ErrnoToStatus(errno, "unlink(" + disk + ")");
  if (!dir.empty() && ::access(dir.c_str(), F_OK) == 0) {
    Status s = RemoveTree(dir);
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
  if (p_.channel) p_.channel->Close();
}

// A file call's bound in the guest (a recursive remove of a big tree is
// one call; TCG is slow).
constexpr std::chrono::milliseconds kFileCallTimeout{120000};
// How long the guest may take to start a process.
constexpr std::chrono::milliseconds kProcessStartTimeout{60000};

MicrovmSandbox::MicrovmSandbox(Parts parts)
    : p_(std::move(parts)), files_(NewMicrovmFiles(p_.channel.get(), kFileCallTimeout)) {}

SandboxFiles& MicrovmSandbox::files() { return *files_; }

StatusOr<ExecOutcome> MicrovmSandbox::Exec(const ExecSpec& es) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (destroyed_) {
      ExecOutcome out;
      out.signal = SIGKILL;
      out.exit_code = 128 + SIGKILL;
      return out;
    }
  }
  proto::ExecRequest req = Request(es);
  std::chrono::milliseconds bound{0};
  if (es.timeout.count() > 0) bound = es.timeout + es.kill_grace + p_.exec_slack;
  return p_.channel->Exec(req, es.stdin_data, bound);
}

StatusOr<std::unique_ptr<Process>> MicrovmSandbox::Start(const ExecSpec& es, const StartOptions& options) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (destroyed_) return absl::FailedPreconditionError("sandbox " + p_.spec.id + " was destroyed");
  }
  proto::ExecRequest req = Request(es);
  req.stdin_follows = false;
  req.timeout_ms = 0;
  req.pty = options.pty;
  req.rows = options.rows;
  req.cols = options.cols;
  req.control_fd = options.control_fd;
  return StartProcess(p_.channel.get(), req, options, kProcessStartTimeout);
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

Status MicrovmSandbox::Destroy() {
  UniqueFd pidfd;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (destroyed_) return absl::OkStatus();
    destroyed_ = true;
    pidfd = std::move(p_.pidfd);
  }
  p_.channel->Close();
  KillQemu(std::move(pidfd));
  Status first;
  if (p_.cgroup) {
    Status s = p_.cgroup->Destroy(std::chrono::seconds(5));
    if (!s.ok()) first = s;
  }
  Status s = RemoveVmFiles(p_.spec.dir, p_.record.disk());
  if (first.ok()) first = s;
  return first;
}

}  // namespace warren::runtime::microvm
