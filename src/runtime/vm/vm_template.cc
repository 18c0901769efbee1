#include "runtime/vm/vm_template.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <thread>

#include "common/file_util.h"
#include "common/fnv.h"
#include "common/log.h"
#include "runtime/vm/input.h"
#include "runtime/vm/vm_sandbox.h"

namespace warren::runtime::vm {

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kCallTimeout{10000};
// Between typed characters: the desktop wait types its probe again until it
// runs, so a key the guest dropped costs a retry, not the wait (VmSandbox
// paces its keys: key_pacer.h).
constexpr std::chrono::milliseconds kTypeGap{8};
constexpr char kMarker[] = "/tmp/.warren-desktop-ready";

// Runs `command` with sh in the guest as root: its exit code.
StatusOr<int64_t> Run(microvm::AgentChannel& ch, const std::string& command) {
  microvm::proto::ExecRequest req;
  req.argv = {"/bin/sh", "-c", command};
  req.env = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"};
  req.cwd = "/";
  req.user = "root";
  req.timeout_ms = 30000;
  ASSIGN_OR_RETURN(ExecOutcome out, ch.Exec(req, "", std::chrono::milliseconds(60000)));
  return out.exit_code;
}

Status Type(QmpClient& qmp, const std::string& text) {
  ASSIGN_OR_RETURN(std::vector<KeyBatch> chars, TextEvents(text));
  for (const KeyBatch& c : chars) {
    RETURN_IF_ERROR(qmp.Execute("input-send-event", R"({"events":)" + c.events + "}", kCallTimeout).status());
    std::this_thread::sleep_for(kTypeGap);
  }
  return absl::OkStatus();
}

}  // namespace

Template::~Template() {
  if (!dir.empty()) {
    Status s = RemoveTree(dir);
    if (!s.ok()) Log(spdlog::level::warn, "removing a vm template failed", {{"error", s.ToString()}});
  }
}

TemplateCache::TemplateCache(std::string dir, std::vector<std::string> inputs)
    : dir_(std::move(dir)), inputs_(std::move(inputs)) {}

TemplateCache::~TemplateCache() {
  std::lock_guard<std::mutex> l(mu_);
  entries_.clear();
  ::rmdir(dir_.c_str());
}

StatusOr<std::shared_ptr<const Template>> TemplateCache::Get(const std::string& shape, const Builder& build) {
  std::shared_ptr<Entry> e;
  std::string name;
  {
    std::lock_guard<std::mutex> l(mu_);
    uint64_t h = kFnv1a64Offset;
    for (const std::string& f : inputs_) {
      struct stat st;
      if (::stat(f.c_str(), &st) != 0) return ErrnoToStatus(errno, "stat(" + f + ")");
      std::string id = f + ":" + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" +
                       std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
                       std::to_string(st.st_mtim.tv_nsec) + ";";
      h = Fnv1a64(id, h);
    }
    const std::string inputs = Hex16(h);
    name = inputs + "-" + shape;
    // Templates of other inputs are stale: gone once their clones started.
    for (auto it = entries_.begin(); it != entries_.end();) {
      it = it->first.rfind(inputs + "-", 0) == 0 ? std::next(it) : entries_.erase(it);
    }
    std::shared_ptr<Entry>& slot = entries_[name];
    if (!slot) slot = std::make_shared<Entry>();
    e = slot;
  }
  std::lock_guard<std::mutex> b(e->build);
  if (e->ready) return e->ready;
  if (!e->failed.empty()) return absl::FailedPreconditionError(e->failed);
  RETURN_IF_ERROR(MkdirAll(dir_, 0700));
  const std::string dir = dir_ + "/" + name;
  if (::access(dir.c_str(), F_OK) == 0) RETURN_IF_ERROR(RemoveTree(dir));
  RETURN_IF_ERROR(MkdirAll(dir, 0700));
  StatusOr<std::shared_ptr<Template>> t = build(dir);
  if (!t.ok()) {
    (void)RemoveTree(dir);
    // A guest that did not answer or show its desktop in time may do so
    // on a less loaded host: not remembered, the next create tries again.
    if (absl::IsDeadlineExceeded(t.status())) return t.status();
    e->failed = "building the vm template " + name + " failed: " + t.status().ToString();
    return absl::FailedPreconditionError(e->failed);
  }
  e->ready = std::move(*t);
  return e->ready;
}

Status CopyDisk(const std::string& from, const std::string& to) {
  UniqueFd src(::open(from.c_str(), O_RDONLY | O_CLOEXEC));
  if (!src.valid()) return ErrnoToStatus(errno, "open(" + from + ")");
  struct stat st;
  if (::fstat(src.get(), &st) != 0) return ErrnoToStatus(errno, "fstat(" + from + ")");
  UniqueFd dst(::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!dst.valid()) return ErrnoToStatus(errno, "open(" + to + ", O_CREAT|O_EXCL)");
  auto fail = [&to](const Status& s) {
    ::unlink(to.c_str());
    return s;
  };
  if (::ioctl(dst.get(), FICLONE, src.get()) == 0) return absl::OkStatus();
  off_t left = st.st_size;
  while (left > 0) {
    ssize_t n = ::copy_file_range(src.get(), nullptr, dst.get(), nullptr, static_cast<size_t>(left), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(ErrnoToStatus(errno, "copy_file_range(" + from + ", " + to + ")"));
    if (n == 0) return fail(absl::InternalError("copy_file_range(" + from + "): file shrank"));
    left -= n;
  }
  return absl::OkStatus();
}

static Status WaitForDesktopSteps(microvm::AgentChannel& ch, QmpClient& qmp, Clock::time_point deadline,
                                  std::string* step);

Status WaitForDesktop(microvm::AgentChannel& ch, QmpClient& qmp, Clock::time_point deadline) {
  std::string step = "start";
  Status s = WaitForDesktopSteps(ch, qmp, deadline, &step);
  if (s.ok() ||
      (absl::IsDeadlineExceeded(s) && s.message().find("desktop did not come up") != std::string_view::npos)) {
    return s;
  }
  return Status(s.code(), "waiting for the guest's desktop (" + step + "): " + std::string(s.message()));
}

static Status WaitForDesktopSteps(microvm::AgentChannel& ch, QmpClient& qmp, Clock::time_point deadline,
                                  std::string* step) {
  auto late = [&deadline](const std::string& what) -> Status {
    if (Clock::now() < deadline) return absl::OkStatus();
    return absl::DeadlineExceededError("the guest's desktop did not come up in time: waited for " + what);
  };
  // X's socket and xterm's process.
  *step = "X's socket and xterm";
  while (true) {
    ASSIGN_OR_RETURN(int64_t rc, Run(ch, "test -S /tmp/.X11-unix/X0 && grep -qx xterm /proc/[0-9]*/comm"));
    if (rc == 0) break;
    RETURN_IF_ERROR(late("X's socket and xterm"));
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  // xterm's process runs before its window is mapped and focused and its
  // shell reads: keys typed before then are lost. A typed command that runs
  // tells when the desktop takes input (the leading space keeps it out of
  // a history that ignores such lines).
  *step = "typed input";
  bool ready = false;
  while (!ready) {
    RETURN_IF_ERROR(Type(qmp, std::string(" touch ") + kMarker + "\n"));
    const auto until = std::min(deadline, Clock::now() + std::chrono::seconds(10));
    while (!ready && Clock::now() < until) {
      ASSIGN_OR_RETURN(int64_t rc, Run(ch, std::string("test -e ") + kMarker));
      ready = rc == 0;
      if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    if (!ready) RETURN_IF_ERROR(late("xterm to take typed input"));
  }
  *step = "the screen to settle";
  RETURN_IF_ERROR(Run(ch, std::string("rm -f ") + kMarker).status());
  ASSIGN_OR_RETURN(KeyBatch clear, ComboEvents("ctrl+l"));
  RETURN_IF_ERROR(qmp.Execute("input-send-event", R"({"events":)" + clear.events + "}", kCallTimeout).status());
  ASSIGN_OR_RETURN(Screenshot prev, Screendump(qmp, kCallTimeout));
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ASSIGN_OR_RETURN(Screenshot cur, Screendump(qmp, kCallTimeout));
    if (cur.png == prev.png) return absl::OkStatus();
    RETURN_IF_ERROR(late("the screen to settle"));
    prev = std::move(cur);
  }
}

}  // namespace warren::runtime::vm
