#include "runtime/microvm/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "absl/strings/cord.h"
#include "runtime/microvm/protocol_calls.h"

namespace warren::runtime::microvm {
namespace {

using proto::FrameType;

void SetNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

void Signal1(int eventfd) {
  uint64_t one = 1;
  (void)!::write(eventfd, &one, sizeof one);
}

class MicrovmProcess : public Process {
 public:
  MicrovmProcess(std::shared_ptr<AgentChannel> ch, const StartOptions& o)
      : ch_(std::move(ch)), pty_(o.pty), control_(o.control_fd) {}

  ~MicrovmProcess() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    if (wake_.valid()) Signal1(wake_.get());
    if (relay_.joinable()) relay_.join();
    if (id_ != 0) {
      ch_->CloseStream(id_);
      bool broken;
      {
        std::lock_guard<std::mutex> l(mu_);
        broken = broken_;
      }
      if (!broken) (void)ch_->SendFrame(FrameType::kProcRelease, 0, id_, "");
    }
  }

  Status Init(const proto::ExecRequest& req, std::chrono::milliseconds timeout) {
    exit_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!exit_fd_.valid() || !wake_.valid()) return ErrnoToStatus(errno, "eventfd");
    if (pty_) {
      int sp[2];
      if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0) {
        return ErrnoToStatus(errno, "socketpair(AF_UNIX)");
      }
      take_out_.reset(sp[0]);
      take_in_.reset(::fcntl(sp[0], F_DUPFD_CLOEXEC, 3));
      out_dst_[0].reset(sp[1]);
      in_src_.reset(::fcntl(sp[1], F_DUPFD_CLOEXEC, 3));
      if (!take_in_.valid() || !in_src_.valid()) return ErrnoToStatus(errno, "fcntl(F_DUPFD_CLOEXEC)");
    } else {
      int p[2];
      if (::pipe2(p, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe2");
      in_src_.reset(p[0]);
      take_in_.reset(p[1]);
      UniqueFd* node_end[2] = {&take_out_, &take_err_};
      for (int s = 0; s < 2; ++s) {
        if (::pipe2(p, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe2");
        node_end[s]->reset(p[0]);
        out_dst_[s].reset(p[1]);
      }
    }
    if (control_) {
      int p[2];
      if (::pipe2(p, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe2");
      take_control_.reset(p[0]);
      out_dst_[2].reset(p[1]);
    }
    SetNonBlocking(in_src_.get());
    for (UniqueFd& o : out_dst_) {
      if (o.valid()) SetNonBlocking(o.get());
    }

    AgentChannel::Stream stream;
    stream.sink = [this](proto::Frame& f, std::string* why) { return Sink(f, why); };
    stream.on_end = [this](const Status& why) { OnEnd(why); };
    ASSIGN_OR_RETURN(id_, ch_->OpenStream(std::move(stream)));
    Status sent = ch_->SendFrame(FrameType::kProcStart, 0, id_, proto::Encode(req));
    std::unique_lock<std::mutex> l(mu_);
    if (!sent.ok() && !broken_) {
      return Status(sent.code(),
                    "sandbox " + ch_->sandbox_id() + ": starting a process: " + std::string(sent.message()));
    }
    if (!cv_.wait_for(l, timeout, [&] { return started_ || !start_error_.ok() || broken_; })) {
      return absl::DeadlineExceededError("sandbox " + ch_->sandbox_id() +
                                         ": the guest agent did not start the process within " +
                                         std::to_string(timeout.count()) + " ms");
    }
    if (!start_error_.ok()) return start_error_;
    if (!started_) return end_why_;
    l.unlock();
    relay_ = std::thread([this] { Relay(); });
    return absl::OkStatus();
  }

  pid_t pid() const override { return pid_; }
  int pidfd() const override { return exit_fd_.get(); }
  UniqueFd TakeStdin() override { return std::move(take_in_); }
  UniqueFd TakeStdout() override { return std::move(take_out_); }
  UniqueFd TakeStderr() override { return std::move(take_err_); }
  UniqueFd TakeControl() override { return std::move(take_control_); }

  StatusOr<bool> TryWait(ExecOutcome* out) override {
    std::lock_guard<std::mutex> l(mu_);
    if (!exited_ || exit_pending_) return false;
    out->exit_code = static_cast<int>(exit_.exit_code);
    out->signal = static_cast<int>(exit_.signal);
    out->oom_killed = exit_.oom_killed;
    return true;
  }

  Status Signal(int sig, bool whole_tree) override {
    if (sig <= 0 || sig > 64) return absl::InvalidArgumentError("signal " + std::to_string(sig) + " out of range");
    {
      std::lock_guard<std::mutex> l(mu_);
      if (broken_ || tree_empty_) return absl::OkStatus();  // gone already
    }
    proto::ProcSignal m;
    m.signal = static_cast<uint64_t>(sig);
    m.whole_tree = whole_tree;
    Status s = ch_->SendFrame(FrameType::kProcSignal, 0, id_, proto::Encode(m));
    std::lock_guard<std::mutex> l(mu_);
    return broken_ ? absl::OkStatus() : s;
  }

  bool TreeEmpty() override {
    std::lock_guard<std::mutex> l(mu_);
    return tree_empty_ || broken_;
  }

  Status Resize(uint16_t rows, uint16_t cols) override {
    if (!pty_) return absl::FailedPreconditionError("process " + std::to_string(pid_) + ": resize without a pty");
    if (rows == 0 || cols == 0) return absl::InvalidArgumentError("resize: rows and cols must be > 0");
    proto::ProcResize m;
    m.rows = rows;
    m.cols = cols;
    return ch_->SendFrame(FrameType::kProcResize, 0, id_, proto::Encode(m));
  }

 private:
  // On the channel's reader thread, under its lock (channel.h Stream).
  bool Sink(proto::Frame& f, std::string* why) {
    std::lock_guard<std::mutex> l(mu_);
    if (!started_ && f.type != FrameType::kProcStarted && f.type != FrameType::kError) {
      *why = "process frame type " + std::to_string(static_cast<int>(f.type)) + " before it started";
      return false;
    }
    switch (f.type) {
      case FrameType::kProcStarted: {
        if (started_ || !start_error_.ok()) return *why = "process started twice", false;
        proto::ProcStarted m;
        if (!proto::Decode(f.payload, &m, why)) return false;
        pid_ = static_cast<pid_t>(m.pid);
        started_ = true;
        cv_.notify_all();
        return true;
      }
      case FrameType::kError: {
        if (started_ || !start_error_.ok()) return *why = "error reply to a started process", false;
        proto::ErrorReply e;
        if (!proto::Decode(f.payload, &e, why)) return false;
        std::string msg = "sandbox " + ch_->sandbox_id() + ": " + e.message;
        start_error_ = Status(static_cast<absl::StatusCode>(e.code), msg);
        if (e.err != 0) start_error_.SetPayload("warren.errno", absl::Cord(std::to_string(e.err)));
        cv_.notify_all();
        return true;
      }
      case FrameType::kProcOutput: {
        const int s = f.flags - 1;
        if ((s == 1 && pty_) || (s == 2 && !control_)) return *why = "output on a stream the process lacks", false;
        if (eof_[s]) return *why = "output after the stream's end", false;
        if (f.payload.empty()) {
          eof_[s] = true;
        } else {
          if (queue_[s].size() + f.payload.size() > proto::kProcWindow) {
            return *why = "process output beyond its credit", false;
          }
          queue_[s] += f.payload;
        }
        Signal1(wake_.get());
        return true;
      }
      case FrameType::kProcExit: {
        if (exited_) return *why = "process exited twice", false;
        if (!proto::Decode(f.payload, &exit_, why)) return false;
        exited_ = true;
        // Seen by the node (its pidfd) once the output before it is in the
        // node's pipes: the relay signals it (the node's pump takes only
        // what is ready when the exit shows, kWhileReadable).
        exit_pending_ = true;
        Signal1(wake_.get());
        return true;
      }
      case FrameType::kProcTreeEmpty:
        if (!exited_) return *why = "process tree empty before its exit", false;
        tree_empty_ = true;
        return true;
      default:
        *why = "unexpected frame type " + std::to_string(static_cast<int>(f.type)) + " for a process";
        return false;
    }
  }

  void OnEnd(const Status& why) {
    std::lock_guard<std::mutex> l(mu_);
    broken_ = true;
    end_why_ = why;
    if (exit_pending_) {  // what was queued still goes to the node; the exit shows now
      exit_pending_ = false;
      Signal1(exit_fd_.get());
    }
    if (!exited_) {  // the VM is gone or the channel broke: count it as killed
      exited_ = true;
      exit_.signal = SIGKILL;
      exit_.exit_code = 128 + SIGKILL;
      Signal1(exit_fd_.get());
    }
    for (bool& e : eof_) e = true;
    cv_.notify_all();
    Signal1(wake_.get());
  }

  // Moves stdin to the guest and queued output to the node's fds.
  void Relay() {
    bool stdin_done = false;
    char buf[proto::kMaxChunk];
    while (true) {
      pollfd fds[5];
      int n = 0;
      fds[n++] = {wake_.get(), POLLIN, 0};
      int stdin_at = -1, out_at[3] = {-1, -1, -1};
      {
        std::lock_guard<std::mutex> l(mu_);
        if (stop_) return;
        if (!stdin_done && !broken_ && in_src_.valid()) {
          stdin_at = n;
          fds[n++] = {in_src_.get(), POLLIN, 0};
        }
        for (int s = 0; s < 3; ++s) {
          if (!out_dst_[s].valid()) continue;
          if (!queue_[s].empty()) {
            out_at[s] = n;
            fds[n++] = {out_dst_[s].get(), POLLOUT, 0};
          } else if (eof_[s]) {
            // Its end in the guest: EOF for the node (a PTY's socket keeps
            // carrying stdin the other way).
            if (pty_ && s == 0) {
              ::shutdown(out_dst_[0].get(), SHUT_WR);
            }
            out_dst_[s].reset();
          }
        }
        if (exit_pending_) {
          bool relayed = true;
          for (int s = 0; s < 3; ++s) relayed = relayed && (queue_[s].empty() || !out_dst_[s].valid());
          if (relayed) {
            exit_pending_ = false;
            Signal1(exit_fd_.get());
          }
        }
      }
      if (::poll(fds, static_cast<nfds_t>(n), -1) < 0 && errno != EINTR) return;
      if (fds[0].revents != 0) {
        uint64_t v;
        (void)!::read(wake_.get(), &v, sizeof v);
      }
      if (stdin_at >= 0 && fds[stdin_at].revents != 0) {
        ssize_t r = ::read(in_src_.get(), buf, sizeof buf);
        if (r > 0) {
          (void)ch_->SendFrame(FrameType::kProcStdin, 0, id_, std::string_view(buf, static_cast<size_t>(r)));
        } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
          stdin_done = true;
          (void)ch_->SendFrame(FrameType::kProcStdin, 0, id_, "");  // EOF
          if (!pty_) in_src_.reset();
        }
      }
      for (int s = 0; s < 3; ++s) {
        if (out_at[s] < 0 || fds[out_at[s]].revents == 0) continue;
        std::string chunk;
        {
          std::lock_guard<std::mutex> l(mu_);
          chunk = queue_[s].substr(0, proto::kMaxChunk);
        }
        ssize_t w = ::write(out_dst_[s].get(), chunk.data(), chunk.size());
        size_t taken = 0;
        if (w > 0) {
          taken = static_cast<size_t>(w);
        } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
          // The node closed its end: what the process writes is dropped
          // (credited back so it does not block on a reader that is gone).
          std::lock_guard<std::mutex> l(mu_);
          taken = queue_[s].size();
          out_dst_[s].reset();
          dropping_[s] = true;
        }
        if (taken == 0) continue;
        {
          std::lock_guard<std::mutex> l(mu_);
          queue_[s].erase(0, taken);
        }
        proto::ProcAck ack;
        ack.bytes = taken;
        (void)ch_->SendFrame(FrameType::kProcAck, static_cast<uint16_t>(s + 1), id_, proto::Encode(ack));
      }
      // Output for a stream the node no longer reads: acked and dropped.
      for (int s = 0; s < 3; ++s) {
        size_t dropped = 0;
        {
          std::lock_guard<std::mutex> l(mu_);
          if (!dropping_[s] || queue_[s].empty()) continue;
          dropped = queue_[s].size();
          queue_[s].clear();
        }
        proto::ProcAck ack;
        ack.bytes = dropped;
        (void)ch_->SendFrame(FrameType::kProcAck, static_cast<uint16_t>(s + 1), id_, proto::Encode(ack));
      }
    }
  }

  const std::shared_ptr<AgentChannel> ch_;  // kept alive while the process is (a suspend closes it)
  const bool pty_, control_;
  uint64_t id_ = 0;
  pid_t pid_ = 0;
  UniqueFd exit_fd_, wake_;
  UniqueFd take_in_, take_out_, take_err_, take_control_;  // the node's ends
  UniqueFd in_src_, out_dst_[3];                           // the relay's ends
  std::thread relay_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;
  Status start_error_;
  bool broken_ = false;
  Status end_why_ = absl::UnavailableError("the guest agent's channel ended");
  bool stop_ = false;
  std::string queue_[3];
  bool eof_[3] = {false, false, false};
  bool dropping_[3] = {false, false, false};
  bool exited_ = false, tree_empty_ = false;
  bool exit_pending_ = false;  // exited, the node not told yet (output before it still queued)
  proto::ExitResult exit_;
};

}  // namespace

StatusOr<std::unique_ptr<Process>> StartProcess(std::shared_ptr<AgentChannel> channel,
                                                const proto::ExecRequest& request, const StartOptions& options,
                                                std::chrono::milliseconds timeout) {
  auto p = std::make_unique<MicrovmProcess>(std::move(channel), options);
  RETURN_IF_ERROR(p->Init(request, timeout));
  return std::unique_ptr<Process>(std::move(p));
}

}  // namespace warren::runtime::microvm
