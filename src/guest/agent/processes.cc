#include "guest/agent/processes.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/unique_fd.h"
#include "guest/agent/boot.h"
#include "guest/agent/util.h"

namespace warren::guest {

namespace proto = runtime::microvm::proto;
using proto::FrameType;

namespace {
constexpr size_t kMaxProcesses = 1024;
}  // namespace

struct Processes::Proc {
  uint64_t id = 0;
  pid_t pid = -1;
  std::string cgroup;
  UniqueFd in_w;    // stdin: a pipe, or the pty master
  UniqueFd out[3];  // stdout (or the pty master), stderr, control (fd 3)
  UniqueFd master;  // the pty master (Resize)
  UniqueFd events;  // cgroup.events (POLLPRI when populated changes)
  std::string stdin_buf;
  bool stdin_eof = false;
  uint64_t unacked[3] = {0, 0, 0};
  bool exited = false, tree_empty = false, released = false;
  int status = 0;
  int64_t start_ns = 0;
};

Processes::Processes(SendFn send, std::function<std::string()> ready)
    : send_(std::move(send)), ready_(std::move(ready)) {}

Processes::~Processes() = default;

void Processes::Handle(const proto::Frame& f) {
  if (f.type == FrameType::kProcStart) return Start(f);
  auto it = procs_.find(f.id);
  if (it == procs_.end() || it->second->released) return;  // gone meanwhile
  Proc& p = *it->second;
  std::string why;
  switch (f.type) {
    case FrameType::kProcStdin:
      if (p.stdin_eof) return;
      if (f.payload.empty()) {
        p.stdin_eof = true;
      } else {
        p.stdin_buf += f.payload;
      }
      return FeedStdin(p);
    case FrameType::kProcAck: {
      proto::ProcAck a;
      if (!proto::Decode(f.payload, &a, &why)) return LogLine("process ack: " + why);
      uint64_t& u = p.unacked[f.flags - 1];
      u -= std::min(u, a.bytes);
      return;
    }
    case FrameType::kProcSignal: {
      proto::ProcSignal s;
      if (!proto::Decode(f.payload, &s, &why)) return LogLine("process signal: " + why);
      if (s.whole_tree) {
        SignalCgroup(p.cgroup, static_cast<int>(s.signal));
      } else if (!p.exited) {
        ::kill(-p.pid, static_cast<int>(s.signal));
      }
      return;
    }
    case FrameType::kProcResize: {
      proto::ProcResize r;
      if (!proto::Decode(f.payload, &r, &why)) return LogLine("process resize: " + why);
      // The kernel sends SIGWINCH to the terminal's foreground group.
      winsize ws{static_cast<unsigned short>(r.rows), static_cast<unsigned short>(r.cols), 0, 0};
      if (p.master.valid()) ::ioctl(p.master.get(), TIOCSWINSZ, &ws);
      return;
    }
    case FrameType::kProcRelease:
      p.released = true;
      p.in_w.reset();
      for (UniqueFd& o : p.out) o.reset();
      p.master.reset();
      p.stdin_buf.clear();
      return Progress();
    default: LogLine("unexpected process frame type " + std::to_string(static_cast<int>(f.type)));
  }
}

void Processes::Start(const proto::Frame& f) {
  auto fail = [&](uint64_t code, int err, const std::string& message) {
    proto::ErrorReply e;
    e.code = code;
    e.err = static_cast<uint64_t>(err);
    e.message = message;
    send_(FrameType::kError, 0, f.id, proto::Encode(e));
  };
  std::string why = ready_();
  if (!why.empty()) return fail(kFailedPrecondition, 0, why);
  if (procs_.count(f.id)) return fail(kInvalidArgument, 0, "process id in use");
  if (procs_.size() >= kMaxProcesses) return fail(kResourceExhausted, 0, "more than 1024 processes in the guest");
  proto::ExecRequest req;
  if (!proto::Decode(f.payload, &req, &why)) return fail(kInvalidArgument, 0, "process: " + why);
  uid_t uid;
  gid_t gid;
  if (!ResolveUser(req.user, &uid, &gid, &why)) return fail(kNotFound, 0, why);

  auto p = std::make_unique<Proc>();
  p->id = f.id;
  p->cgroup = std::string(kCgroupRoot) + "/proc-" + std::to_string(f.id);
  if (::mkdir(p->cgroup.c_str(), 0755) != 0 && errno != EEXIST) {
    return fail(kInternal, errno, "mkdir(" + p->cgroup + "): " + std::strerror(errno));
  }
  struct RemoveCgroup {
    std::string path;
    ~RemoveCgroup() {
      if (!path.empty()) ::rmdir(path.c_str());
    }
  } undo{p->cgroup};
  auto sys_fail = [&](const char* what) { fail(kInternal, errno, std::string(what) + ": " + std::strerror(errno)); };
  UniqueFd child_in, child_out, child_err, child_control;
  if (req.pty) {
    p->master.reset(::open("/dev/pts/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!p->master.valid()) return sys_fail("open(/dev/pts/ptmx)");
    int unlock = 0;
    if (::ioctl(p->master.get(), TIOCSPTLCK, &unlock) != 0) return sys_fail("ioctl(TIOCSPTLCK)");
    winsize ws{static_cast<unsigned short>(req.rows), static_cast<unsigned short>(req.cols), 0, 0};
    if (::ioctl(p->master.get(), TIOCSWINSZ, &ws) != 0) return sys_fail("ioctl(TIOCSWINSZ)");
    child_in.reset(::ioctl(p->master.get(), TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!child_in.valid()) return sys_fail("ioctl(TIOCGPTPEER)");
    p->in_w.reset(::fcntl(p->master.get(), F_DUPFD_CLOEXEC, 3));
    p->out[0].reset(::fcntl(p->master.get(), F_DUPFD_CLOEXEC, 3));
    if (!p->in_w.valid() || !p->out[0].valid()) return sys_fail("dup(pty master)");
  } else {
    int in[2], out[2], err[2];
    if (::pipe2(in, O_CLOEXEC) != 0) return sys_fail("pipe2");
    child_in.reset(in[0]);
    p->in_w.reset(in[1]);
    if (::pipe2(out, O_CLOEXEC) != 0) return sys_fail("pipe2");
    p->out[0].reset(out[0]);
    child_out.reset(out[1]);
    if (::pipe2(err, O_CLOEXEC) != 0) return sys_fail("pipe2");
    p->out[1].reset(err[0]);
    child_err.reset(err[1]);
  }
  if (req.control_fd) {
    int c[2];
    if (::pipe2(c, O_CLOEXEC) != 0) return sys_fail("pipe2");
    p->out[2].reset(c[0]);
    child_control.reset(c[1]);
  }
  UniqueFd procs(::open((p->cgroup + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));

  std::vector<std::string> args = req.argv;
  if (req.shell) args = {"/bin/sh", "-c", *req.shell};
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : req.env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string cwd = req.cwd.empty() ? "/" : req.cwd;

  SpawnArgs sa;
  sa.argv = argv.data();
  sa.envp = envp.data();
  sa.cwd = cwd.c_str();
  sa.uid = uid;
  sa.gid = gid;
  sa.cgroup_procs = procs.get();
  sa.in = child_in.get();
  sa.out = req.pty ? child_in.get() : child_out.get();
  sa.err = req.pty ? child_in.get() : child_err.get();
  sa.control = child_control.get();
  sa.ctty = req.pty;
  uint64_t code = 0;
  int err_no = 0;
  p->start_ns = NowNs();
  pid_t pid = Spawn(sa, &code, &err_no, &why);
  if (pid < 0) return fail(code, err_no, why);
  undo.path.clear();
  p->pid = pid;
  for (UniqueFd* fd : {&p->in_w, &p->out[0], &p->out[1], &p->out[2]}) {
    if (fd->valid()) ::fcntl(fd->get(), F_SETFL, ::fcntl(fd->get(), F_GETFL) | O_NONBLOCK);
  }
  p->events.reset(::open((p->cgroup + "/cgroup.events").c_str(), O_RDONLY | O_CLOEXEC));
  proto::ProcStarted started;
  started.pid = static_cast<uint64_t>(pid);
  send_(FrameType::kProcStarted, 0, f.id, proto::Encode(started));
  procs_[f.id] = std::move(p);
}

void Processes::FeedStdin(Proc& p) {
  while (p.in_w.valid() && !p.stdin_buf.empty()) {
    ssize_t n = ::write(p.in_w.get(), p.stdin_buf.data(), p.stdin_buf.size());
    if (n > 0) {
      p.stdin_buf.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    p.stdin_buf.clear();  // EPIPE: the process closed its stdin
    p.in_w.reset();
  }
  // A pty has no EOF of its own: the terminal's EOF character (VEOF) is
  // what the node sends; closing our master copy is not an EOF.
  if (p.stdin_eof && p.stdin_buf.empty() && !p.master.valid()) p.in_w.reset();
}

void Processes::Pump(Proc& p, int s) {
  char buf[proto::kMaxChunk];
  while (p.out[s].valid()) {
    uint64_t room = proto::kProcWindow - std::min(proto::kProcWindow, p.unacked[s]);
    if (room == 0) return;
    ssize_t n = ::read(p.out[s].get(), buf, std::min<uint64_t>(sizeof buf, room));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    const uint16_t flags = static_cast<uint16_t>(s + 1);
    if (n <= 0) {  // EOF (EIO on a pty master once the terminal's last user left)
      p.out[s].reset();
      if (!p.released) send_(FrameType::kProcOutput, flags, p.id, "");
      return;
    }
    if (!p.released) {
      p.unacked[s] += static_cast<uint64_t>(n);
      send_(FrameType::kProcOutput, flags, p.id, std::string_view(buf, static_cast<size_t>(n)));
    }
  }
}

void Processes::AddPollFds(std::vector<pollfd>* fds) {
  polled_.clear();
  for (auto& [id, p] : procs_) {
    if (p->in_w.valid() && !p->stdin_buf.empty()) {
      fds->push_back({p->in_w.get(), POLLOUT, 0});
      polled_.push_back({id, 0});
    }
    for (int s = 0; s < 3; ++s) {
      if (p->out[s].valid() && p->unacked[s] < proto::kProcWindow) {
        fds->push_back({p->out[s].get(), POLLIN, 0});
        polled_.push_back({id, s + 1});
      }
    }
    if (p->events.valid() && p->exited && !p->tree_empty) {
      fds->push_back({p->events.get(), POLLPRI, 0});
      polled_.push_back({id, 4});
    }
  }
}

void Processes::OnPoll(const std::vector<pollfd>& fds, size_t first) {
  bool events = false;
  for (size_t i = 0; i < polled_.size() && first + i < fds.size(); ++i) {
    if (fds[first + i].revents == 0) continue;
    auto it = procs_.find(polled_[i].first);
    if (it == procs_.end()) continue;
    int what = polled_[i].second;
    if (what == 0) {
      FeedStdin(*it->second);
    } else if (what <= 3) {
      Pump(*it->second, what - 1);
    } else {
      events = true;
    }
  }
  if (events) Progress();
}

bool Processes::OnReaped(pid_t pid, int status) {
  for (auto& [id, p] : procs_) {
    if (p->pid != pid || p->exited) continue;
    p->exited = true;
    p->status = status;
    for (int s = 0; s < 3; ++s) Pump(*p, s);  // what it wrote before it exited
    if (!p->released) {
      proto::ExitResult r;
      if (WIFSIGNALED(status)) {
        r.signal = static_cast<uint32_t>(WTERMSIG(status));
        r.exit_code = 128 + r.signal;
      } else {
        r.exit_code = WEXITSTATUS(status);
      }
      std::string ev = ReadFile(p->cgroup + "/memory.events", 4096);
      size_t at = ev.find("oom_kill ");
      r.oom_killed = at != std::string::npos && std::strtoull(ev.c_str() + at + 9, nullptr, 10) > 0;
      r.duration_ns = static_cast<uint64_t>(NowNs() - p->start_ns);
      send_(FrameType::kProcExit, 0, id, proto::Encode(r));
    }
    Progress();
    return true;
  }
  return false;
}

void Processes::Progress() {
  for (auto it = procs_.begin(); it != procs_.end();) {
    Proc& p = *it->second;
    if (p.exited && !p.tree_empty && CgroupEmpty(p.cgroup)) {
      p.tree_empty = true;
      if (!p.released) send_(FrameType::kProcTreeEmpty, 0, p.id, "");
    }
    if (p.released && p.exited && p.tree_empty) {
      p.events.reset();
      ::rmdir(p.cgroup.c_str());
      it = procs_.erase(it);
      continue;
    }
    ++it;
  }
}

void Processes::Disconnected() {
  for (auto& [id, p] : procs_) {
    p->released = true;
    p->in_w.reset();
    for (UniqueFd& o : p->out) o.reset();
    p->master.reset();
    p->stdin_buf.clear();
  }
  Progress();
}

}  // namespace warren::guest
