#include "guest/agent/agent.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/random.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "guest/agent/boot.h"
#include "guest/agent/files.h"
#include "guest/agent/net.h"
#include "guest/agent/processes.h"
#include "guest/agent/util.h"
#include "runtime/microvm/protocol.h"

namespace warren::guest {
namespace {

namespace proto = warren::runtime::microvm::proto;
using proto::FrameType;

// A command in flight.
struct Job {
  uint64_t id = 0;
  pid_t pid = -1;
  UniqueFd in_w, out_r, err_r;
  std::string stdin_buf;  // received, not yet written
  bool stdin_eof = false;
  uint64_t cap = 0;
  uint64_t totals[2] = {0, 0};
  int64_t start_ns = 0;
  int64_t deadline_ms = 0;  // 0 = no timeout
  int64_t kill_at_ms = 0;   // set on timeout: cgroup.kill then
  uint64_t grace_ms = 0;
  bool timed_out = false, killed = false, exited = false;
  int status = 0;
  std::string cgroup;
};

class Agent {
 public:
  Agent(std::string port, std::string setup_error, bool root_pending)
      : port_(std::move(port)), setup_error_(std::move(setup_error)), root_pending_(root_pending) {}

  [[noreturn]] void Run() {
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGIO);
    sigprocmask(SIG_BLOCK, &mask, nullptr);
    sigfd_.reset(::signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC));
    ::signal(SIGPIPE, SIG_IGN);
    if (!root_pending_ && setup_error_.empty()) SetUpCgroups();
    chan_.reset(::open(port_.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC));
    if (!chan_.valid()) LogLine("open(" + port_ + "): " + std::strerror(errno));
    // SIGIO when the host end connects (virtio_console signals a port's
    // fasync owner on the host's open/close): while disconnected the port
    // polls HUP, so the agent cannot block on it and waits for this signal
    // instead of polling (a clone is connected to right after its restore).
    if (chan_.valid() && (::fcntl(chan_.get(), F_SETOWN, ::getpid()) != 0 ||
                          ::fcntl(chan_.get(), F_SETFL, ::fcntl(chan_.get(), F_GETFL) | O_ASYNC) != 0)) {
      LogLine(std::string("O_ASYNC on the port: ") + std::strerror(errno) + " (polling for the host instead)");
      async_ = false;
    }
    while (true) Round();
  }

 private:
  // Needs the root's cgroup2 mount (SetUpRoot).
  static void SetUpCgroups() {
    ::mkdir(kCgroupRoot, 0755);
    // The memory controller in the exec cgroups: their memory.events count
    // the OOM kills of their processes (oom_killed of the result).
    WriteFile("/sys/fs/cgroup/cgroup.subtree_control", "+memory +pids");
    WriteFile(std::string(kCgroupRoot) + "/cgroup.subtree_control", "+memory +pids");
    LimitCommandsMemory();
  }

  // The commands' memory limit: the guest's RAM less a reserve for the
  // kernel and the agent (1/8 of it, at least 24 MiB; in whole pages).
  // Without one, a command that eats the guest's RAM drives the whole guest
  // into reclaim:
  // the file pages of every process (the agent's code among them) are
  // evicted and read back, for minutes under TCG, before the kernel's OOM
  // killer acts (an exec timed out at 120 s so in CI). Over its cgroup's
  // limit the command is OOM-killed within its cgroup and the agent keeps
  // answering (oom_killed, exit 137, as in a container).
  static void LimitCommandsMemory() {
    struct sysinfo si;
    if (::sysinfo(&si) != 0) return;
    const uint64_t total = uint64_t{si.totalram} * si.mem_unit;  // MemTotal
    const uint64_t reserve = std::max<uint64_t>(uint64_t{24} << 20, total / 8);
    if (total < 2 * reserve) return;
    WriteFile(std::string(kCgroupRoot) + "/memory.max", std::to_string((total - reserve) / 4096 * 4096));
  }

  // Mixes `seed` into the input pool with full credit and reseeds the CRNG
  // from it at once: a clone of a template starts from the template's CRNG
  // state, and without the forced reseed two clones would draw the same
  // bytes (and boot_id) until the kernel's next periodic reseed.
  static void Reseed(const std::string& seed) {
    int fd = ::open("/dev/urandom", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return LogLine(std::string("open(/dev/urandom): ") + std::strerror(errno));
    std::vector<int> buf((sizeof(rand_pool_info) + seed.size() + sizeof(int) - 1) / sizeof(int) + 1);
    auto* info = reinterpret_cast<rand_pool_info*>(buf.data());
    info->entropy_count = static_cast<int>(seed.size() * 8);
    info->buf_size = static_cast<int>(seed.size());
    std::memcpy(info->buf, seed.data(), seed.size());
    if (::ioctl(fd, RNDADDENTROPY, info) != 0) LogLine(std::string("RNDADDENTROPY: ") + std::strerror(errno));
    if (::ioctl(fd, RNDRESEEDCRNG) != 0) LogLine(std::string("RNDRESEEDCRNG: ") + std::strerror(errno));
    ::close(fd);
  }

  void Round() {
    std::vector<pollfd> fds;
    fds.push_back({sigfd_.get(), POLLIN, 0});
    if (connected_) fds.push_back({chan_.get(), POLLIN, 0});
    std::vector<std::pair<Job*, int>> owners;  // per fds[2..]: job, 0 in / 1 out / 2 err
    for (auto& [id, j] : jobs_) {
      if (j->out_r.valid()) fds.push_back({j->out_r.get(), POLLIN, 0}), owners.push_back({j.get(), 1});
      if (j->err_r.valid()) fds.push_back({j->err_r.get(), POLLIN, 0}), owners.push_back({j.get(), 2});
      if (j->in_w.valid() && (!j->stdin_buf.empty() || j->stdin_eof)) {
        fds.push_back({j->in_w.get(), POLLOUT, 0}), owners.push_back({j.get(), 0});
      }
    }
    const size_t proc_first = fds.size();
    procs_.AddPollFds(&fds);
    // Disconnected: SIGIO says when the host connects; the probe below also
    // runs every 50 ms (20 ms without O_ASYNC) for the connections no signal
    // announces: ~1 in 40 clones restored and connected to at once got none
    // (likely cause: QEMU drops the port-open control message when the
    // guest has no control buffer posted, virtio-serial-bus.c
    // send_control_msg); with a 1 s probe that create's first hello took
    // over a second (bench/microvm/warm.py under load, bench/RESULTS.md).
    // Only a disconnected agent wakes so: a pool clone before it is taken,
    // a sandbox while its daemon restarts.
    int timeout = connected_ ? -1 : async_ ? 50 : 20;
    int64_t now = NowMs();
    for (auto& [id, j] : jobs_) {
      for (int64_t t : {j->deadline_ms, j->kill_at_ms}) {
        if (t == 0) continue;
        int64_t left = std::max<int64_t>(0, t - now);
        if (timeout < 0 || left < timeout) timeout = static_cast<int>(left);
      }
      if (j->exited && j->timed_out && (timeout < 0 || timeout > 10)) timeout = 10;  // waiting for an empty cgroup
    }
    int n = ::poll(fds.data(), fds.size(), timeout);
    if (n < 0 && errno != EINTR) LogLine(std::string("poll: ") + std::strerror(errno));
    size_t base = 1;
    if (connected_) {
      if (fds[1].revents != 0) ReadChannel();
      base = 2;
    } else {
      // The host end is not connected: a read gives EOF and poll HUP until
      // it is. Probe once per round.
      pollfd p{chan_.get(), POLLIN, 0};
      if (chan_.valid() && ::poll(&p, 1, 0) == 1 && !(p.revents & POLLHUP)) connected_ = true;
    }
    for (size_t i = base; i < proc_first; ++i) {
      if (fds[i].revents == 0) continue;
      auto [job, what] = owners[i - base];
      if (what == 0) {
        FeedStdin(*job);
      } else {
        ReadOutput(*job, what == 1 ? job->out_r : job->err_r, what - 1, false);
      }
    }
    procs_.OnPoll(fds, proc_first);
    if (fds[0].revents != 0) {
      signalfd_siginfo si;
      while (::read(sigfd_.get(), &si, sizeof si) > 0) {
      }
    }
    Reap();
    Timers();
  }

  // ---- channel

  void ReadChannel() {
    char buf[64 << 10];
    while (true) {
      ssize_t n = ::read(chan_.get(), buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) break;
      if (n <= 0) {
        Disconnected();
        return;
      }
      decoder_.Feed(std::string_view(buf, static_cast<size_t>(n)));
    }
    proto::Frame f;
    while (true) {
      proto::FrameDecoder::Result r = decoder_.Next(&f);
      if (r == proto::FrameDecoder::Result::kNeedMore) break;
      if (r == proto::FrameDecoder::Result::kError) {
        LogLine("bad frame from host: " + decoder_.error());
        decoder_ = proto::FrameDecoder();
        break;
      }
      Dispatch(f);
    }
  }

  void Disconnected() {
    connected_ = false;
    decoder_ = proto::FrameDecoder();
    files_.Reset();
    procs_.Disconnected();
  }

  void Send(FrameType type, uint16_t flags, uint64_t id, std::string_view payload) {
    if (!connected_) return;
    std::string frame = proto::EncodeFrame(type, flags, id, payload);
    size_t off = 0;
    while (off < frame.size()) {
      ssize_t n = ::write(chan_.get(), frame.data() + off, frame.size() - off);
      if (n > 0) {
        off += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) {
        pollfd p{chan_.get(), POLLOUT, 0};
        if (::poll(&p, 1, 1000) == 1 && (p.revents & POLLHUP) == 0) continue;
        if (p.revents & POLLHUP) return Disconnected();
        continue;
      }
      return Disconnected();
    }
  }

  void SendError(uint64_t id, uint64_t code, int err, const std::string& message) {
    proto::ErrorReply e;
    e.code = code;
    e.err = static_cast<uint64_t>(err);
    e.message = message;
    Send(FrameType::kError, 0, id, proto::Encode(e));
  }

  void Dispatch(const proto::Frame& f) {
    std::string why;
    switch (f.type) {
      case FrameType::kHello: {
        proto::Hello h;
        if (!proto::Decode(f.payload, &h, &why)) return SendError(f.id, kInvalidArgument, 0, "hello: " + why);
        if (h.realtime_ns != 0) {
          timespec ts{static_cast<time_t>(h.realtime_ns / 1000000000), static_cast<long>(h.realtime_ns % 1000000000)};
          ::clock_settime(CLOCK_REALTIME, &ts);
        }
        if (!h.seed.empty()) Reseed(h.seed);
        RootParams p;
        p.layers = static_cast<int>(h.layers);
        if (!h.hostname.empty()) p.hostname = h.hostname;
        p.shm_mb = std::to_string(h.shm_mb);
        p.pids = h.pids;
        if (root_pending_ && h.setup_root) {
          root_pending_ = false;
          setup_error_ = SetUpRoot(p);
          if (setup_error_.empty()) {
            SetUpCgroups();
            // Saved as a template with its root: its clones' first hello
            // sets their identity (below).
            identity_pending_ = h.template_root;
          } else {
            LogLine("setup failed: " + setup_error_);
          }
        } else if (identity_pending_ && h.setup_root && !h.template_root) {
          identity_pending_ = false;
          setup_error_ = ApplyIdentity(p);
          if (!setup_error_.empty()) LogLine("setup failed: " + setup_error_);
        }
        // The NIC once the root is up (its resolv.conf is the root's).
        if (h.net_addr != 0 && !nic_done_ && !root_pending_ && setup_error_.empty()) {
          nic_done_ = true;
          NicParams n;
          n.addr = h.net_addr;
          n.prefix = h.net_prefix;
          n.gateway = h.net_gateway;
          n.mac = h.net_mac;
          n.nameserver = h.nameserver;
          timespec t0, t1, t2;
          ::clock_gettime(CLOCK_MONOTONIC, &t0);
          std::string e = BindNic();
          ::clock_gettime(CLOCK_MONOTONIC, &t1);
          if (e.empty()) e = ConfigureNic(n);
          ::clock_gettime(CLOCK_MONOTONIC, &t2);
          auto ms = [](const timespec& a, const timespec& b) {
            return std::to_string((b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000);
          };
          LogLine("nic: driver " + ms(t0, t1) + " ms, configured " + ms(t1, t2) + " ms");
          if (!e.empty()) {
            setup_error_ = "network: " + e;
            LogLine("setup failed: " + setup_error_);
          }
        }
        proto::HelloReply r;
        r.version = proto::kVersion;
        r.kernel_release = KernelRelease();
        // A template must not generate its boot_id (clones would share it).
        if (!root_pending_ && !identity_pending_) r.boot_id = BootId();
        r.error = setup_error_;
        r.nic = nic_done_ && setup_error_.empty();
        return Send(FrameType::kHelloReply, 0, f.id, proto::Encode(r));
      }
      case FrameType::kPing: return Send(FrameType::kPong, 0, f.id, "");
      case FrameType::kExec: return StartExec(f);
      case FrameType::kFileRequest: {
        if (!setup_error_.empty() || root_pending_) {
          return SendError(f.id, kFailedPrecondition, 0, "guest root not set up: " + setup_error_);
        }
        auto [type, payload] = files_.Handle(f.payload);
        return Send(type, 0, f.id, payload);
      }
      case FrameType::kInterrupts: {
        std::string text = ReadFile("/proc/interrupts", 256u << 10);
        if (text.empty()) return SendError(f.id, kNotFound, 0, "/proc/interrupts: nothing to read");
        return Send(FrameType::kInterruptsReply, 0, f.id, text);
      }
      case FrameType::kProcStart:
      case FrameType::kProcStdin:
      case FrameType::kProcAck:
      case FrameType::kProcSignal:
      case FrameType::kProcResize:
      case FrameType::kProcRelease: return procs_.Handle(f);
      case FrameType::kStdin: {
        auto it = jobs_.find(f.id);
        if (it == jobs_.end() || it->second->stdin_eof) return;
        if (f.payload.empty()) {
          it->second->stdin_eof = true;
        } else {
          it->second->stdin_buf += f.payload;
        }
        return FeedStdin(*it->second);
      }
      default: LogLine("unexpected frame type " + std::to_string(static_cast<int>(f.type)));
    }
  }

  // ---- exec

  void StartExec(const proto::Frame& f) {
    if (!setup_error_.empty()) return SendError(f.id, kFailedPrecondition, 0, "guest setup failed: " + setup_error_);
    if (root_pending_) return SendError(f.id, kFailedPrecondition, 0, "guest root not set up yet (template)");
    if (jobs_.count(f.id)) return SendError(f.id, kInvalidArgument, 0, "exec id in use");
    proto::ExecRequest req;
    std::string why;
    if (!proto::Decode(f.payload, &req, &why)) return SendError(f.id, kInvalidArgument, 0, "exec: " + why);
    uid_t uid;
    gid_t gid;
    if (!ResolveUser(req.user, &uid, &gid, &why)) return SendError(f.id, kNotFound, 0, why);

    auto job = std::make_unique<Job>();
    job->id = f.id;
    job->cap = req.output_cap;
    job->grace_ms = req.kill_grace_ms;
    job->stdin_eof = !req.stdin_follows;
    job->cgroup = std::string(kCgroupRoot) + "/exec-" + std::to_string(f.id);
    if (::mkdir(job->cgroup.c_str(), 0755) != 0 && errno != EEXIST) {
      return SendError(f.id, kInternal, errno, "mkdir(" + job->cgroup + "): " + std::strerror(errno));
    }
    int in[2], out[2], err[2];
    if (::pipe2(in, O_CLOEXEC) != 0) return SendError(f.id, kInternal, errno, "pipe2");
    UniqueFd in_r(in[0]);
    job->in_w.reset(in[1]);
    if (::pipe2(out, O_CLOEXEC) != 0) return SendError(f.id, kInternal, errno, "pipe2");
    job->out_r.reset(out[0]);
    UniqueFd out_w(out[1]);
    if (::pipe2(err, O_CLOEXEC) != 0) return SendError(f.id, kInternal, errno, "pipe2");
    job->err_r.reset(err[0]);
    UniqueFd err_w(err[1]);
    UniqueFd procs(::open((job->cgroup + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));

    std::vector<std::string> args = req.argv;
    if (req.shell) args = {"/bin/sh", "-c", *req.shell};
    std::vector<char*> argv, envp;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (std::string& e : req.env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string cwd = req.cwd.empty() ? "/" : req.cwd;

    job->start_ns = NowNs();
    SpawnArgs sa;
    sa.argv = argv.data();
    sa.envp = envp.data();
    sa.cwd = cwd.c_str();
    sa.uid = uid;
    sa.gid = gid;
    sa.cgroup_procs = procs.get();
    sa.in = in_r.get();
    sa.out = out_w.get();
    sa.err = err_w.get();
    uint64_t code = 0;
    int err_no = 0;
    pid_t pid = Spawn(sa, &code, &err_no, &why);
    if (pid < 0) {
      ::rmdir(job->cgroup.c_str());
      return SendError(f.id, code, err_no, why);
    }
    job->pid = pid;
    for (int fd : {job->in_w.get(), job->out_r.get(), job->err_r.get()}) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    }
    if (req.timeout_ms > 0) job->deadline_ms = NowMs() + static_cast<int64_t>(req.timeout_ms);
    Job* j = job.get();
    jobs_[f.id] = std::move(job);
    FeedStdin(*j);
  }

  void FeedStdin(Job& j) {
    while (j.in_w.valid() && !j.stdin_buf.empty()) {
      ssize_t n = ::write(j.in_w.get(), j.stdin_buf.data(), j.stdin_buf.size());
      if (n > 0) {
        j.stdin_buf.erase(0, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return;
      j.stdin_buf.clear();  // EPIPE: the command closed its stdin
      j.in_w.reset();
    }
    if (j.stdin_eof && j.stdin_buf.empty()) j.in_w.reset();
  }

  // Reads what `fd` has (all of it when `drain`, else one buffer) and
  // forwards it within the cap. Closes `fd` at EOF.
  void ReadOutput(Job& j, UniqueFd& fd, int stream, bool drain) {
    char buf[proto::kMaxChunk];
    do {
      ssize_t n = ::read(fd.get(), buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return;
      if (n <= 0) {
        fd.reset();
        return;
      }
      uint64_t before = j.totals[stream];
      j.totals[stream] += static_cast<uint64_t>(n);
      if (before < j.cap) {
        size_t keep = static_cast<size_t>(std::min<uint64_t>(static_cast<uint64_t>(n), j.cap - before));
        Send(FrameType::kOutput, stream == 0 ? proto::kStreamStdout : proto::kStreamStderr, j.id,
             std::string_view(buf, keep));
      }
    } while (drain);
  }

  static void SignalTree(const Job& j, int sig) { SignalCgroup(j.cgroup, sig); }

  // memory.events "oom_kill": processes of the cgroup killed by any OOM
  // killer (the guest's RAM is the sandbox's memory limit).
  static uint64_t OomKills(const Job& j) {
    std::string ev = ReadFile(j.cgroup + "/memory.events", 4096);
    size_t at = ev.find("oom_kill ");
    return at == std::string::npos ? 0 : std::strtoull(ev.c_str() + at + 9, nullptr, 10);
  }

  static bool CgroupEmpty(const Job& j) { return guest::CgroupEmpty(j.cgroup); }

  void Timers() {
    int64_t now = NowMs();
    for (auto& [id, j] : jobs_) {
      if (j->deadline_ms != 0 && now >= j->deadline_ms && !j->timed_out) {
        j->timed_out = true;
        j->deadline_ms = 0;
        SignalTree(*j, SIGTERM);
        j->kill_at_ms = now + static_cast<int64_t>(j->grace_ms);
      }
      if (j->kill_at_ms != 0 && now >= j->kill_at_ms) {
        j->kill_at_ms = 0;
        j->killed = true;
        SignalTree(*j, SIGKILL);
      }
    }
    FinishDone();
  }

  void Reap() {
    while (true) {
      int st;
      pid_t p = ::waitpid(-1, &st, WNOHANG);
      if (p <= 0) break;
      bool job = false;
      for (auto& [id, j] : jobs_) {
        if (j->pid == p && !j->exited) {
          j->exited = true;
          j->status = st;
          job = true;
        }
      }
      if (!job) procs_.OnReaped(p, st);
    }
    FinishDone();
  }

  // Sends the result of every job whose foreground exited (and, after a
  // timeout, whose tree is gone).
  void FinishDone() {
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      Job& j = *it->second;
      if (!j.exited) {
        ++it;
        continue;
      }
      // After a timeout the result waits for the whole tree: Timers() sends
      // SIGKILL when kill_grace ends, unless SIGTERM emptied it before.
      if (j.timed_out && !CgroupEmpty(j)) {
        ++it;
        continue;
      }
      if (j.out_r.valid()) ReadOutput(j, j.out_r, 0, true);
      if (j.err_r.valid()) ReadOutput(j, j.err_r, 1, true);
      proto::ExitResult r;
      if (WIFSIGNALED(j.status)) {
        r.signal = static_cast<uint32_t>(WTERMSIG(j.status));
        r.exit_code = 128 + r.signal;
      } else {
        r.exit_code = WEXITSTATUS(j.status);
      }
      r.timed_out = j.timed_out;
      r.oom_killed = OomKills(j) > 0;
      r.stdout_total = j.totals[0];
      r.stderr_total = j.totals[1];
      r.duration_ns = static_cast<uint64_t>(NowNs() - j.start_ns);
      Send(FrameType::kExit, 0, j.id, proto::Encode(r));
      // Background processes may remain: the cgroup goes when they are
      // gone (rmdir refuses a populated cgroup; retried by SweepCgroups).
      if (::rmdir(j.cgroup.c_str()) != 0) leftover_cgroups_.push_back(j.cgroup);
      it = jobs_.erase(it);
    }
    if (!leftover_cgroups_.empty()) {
      leftover_cgroups_.erase(std::remove_if(leftover_cgroups_.begin(), leftover_cgroups_.end(),
                                             [](const std::string& c) { return ::rmdir(c.c_str()) == 0; }),
                              leftover_cgroups_.end());
    }
  }

  std::string port_;
  std::string setup_error_;
  bool root_pending_;
  bool nic_done_ = false;  // eth0 configured (by the first hello with a NIC)
  // A template with its root mounted (hello template_root): the next
  // setup_root hello is a clone's, which sets its identity.
  bool identity_pending_ = false;
  UniqueFd chan_, sigfd_;
  bool connected_ = false;
  bool async_ = true;  // SIGIO on the port's host open/close (Run)
  proto::FrameDecoder decoder_;
  std::map<uint64_t, std::unique_ptr<Job>> jobs_;
  FileService files_;
  Processes procs_{
      [this](FrameType type, uint16_t flags, uint64_t id, std::string_view payload) { Send(type, flags, id, payload); },
      [this]() -> std::string {
        if (!setup_error_.empty()) return "guest setup failed: " + setup_error_;
        if (root_pending_) return "guest root not set up yet (template)";
        return "";
      }};
  std::vector<std::string> leftover_cgroups_;
};

}  // namespace

void Serve(const std::string& port_path, const std::string& setup_error, bool root_pending) {
  Agent(port_path, setup_error, root_pending).Run();
}

}  // namespace warren::guest
