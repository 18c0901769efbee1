#include "common/output_pump.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/scoped_sigpipe.h"

namespace warren {
namespace {

using Clock = PumpOptions::Clock;
using std::chrono::milliseconds;

constexpr size_t kMaxStreams = 8;
constexpr milliseconds kReKill{200};  // the ladder's SIGKILL, again until the end is seen

void SetNonBlocking(int fd) { (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Milliseconds to wait for `next` (1 s at most: cancellation and deadline
// changes are looked at once a second).
int WaitMs(Clock::time_point next, Clock::time_point now) {
  if (next == Clock::time_point::max()) return 1000;
  return static_cast<int>(
      std::clamp<int64_t>(std::chrono::duration_cast<milliseconds>(next - now).count() + 1, 0, 1000));
}

// One run of PumpOutput: the streams, stdin's state and the ladder's.
class Pump {
 public:
  Pump(const PumpOptions& o, const std::vector<PumpStream*>& streams) : o_(o), streams_(streams) {}

  StatusOr<PumpResult> Run();

 private:
  // The poll set of one wait: the fixed fds first, then every stream that is
  // open and has room; `held` says whether an open stream was left out for
  // want of room.
  struct PollSet {
    pollfd pfds[kMaxStreams + 3];
    int idx[kMaxStreams];  // stream -> its slot, or -1
    nfds_t n = 0;
    int wake = -1;
    bool held = false;
    nfds_t streams = 0;  // slots of streams
  };
  PollSet Build(bool with_wake);
  void ReadReady(const PollSet& ps, int reads);
  void ConsumeWake(const PollSet& ps);

  size_t Room(const PumpStream& s) const;
  // One read into s: false when nothing was read (no room, EAGAIN, EOF).
  bool ReadOnce(PumpStream& s);
  void Drain(PumpStream& s, int max_reads) {
    for (int i = 0; i < max_reads && ReadOnce(s); ++i) {
    }
  }
  // Reads stream i, draining the earlier streams before each read.
  void DrainOrdered(size_t i, int reads);
  void DrainAll(int reads);

  void RefillStdin();
  void WriteStdin();
  void CloseStdin();

  Clock::time_point Deadline() const { return o_.deadline ? o_.deadline() : Clock::time_point::max(); }
  bool StopAsked() const { return o_.stop && o_.stop(); }
  Status CancelledStatus() const { return absl::CancelledError(o_.what + " cancelled"); }

  StatusOr<PumpResult> WhileReadable();
  StatusOr<PumpResult> UntilEof();

  const PumpOptions& o_;
  const std::vector<PumpStream*>& streams_;
  std::string& buf_ = Buffer();

  UniqueFd* in_ = nullptr;    // valid while stdin is open
  std::string_view pending_;  // stdin bytes to write next
  std::string chunk_;         // stdin_source's chunk that pending_ points into
  bool stdin_data_given_ = false;

  PumpResult res_;
  Clock::time_point kill_at_ = Clock::time_point::max();
  bool stopping_ = false;
  Clock::time_point stop_until_ = Clock::time_point::max();

  // 64 KiB per read (a pipe's default capacity), one buffer per thread: a
  // fresh one per command cost a memset, page faults and a heap
  // consolidation on free, for commands most of which print little.
  static std::string& Buffer() {
    thread_local std::string buf(64 << 10, '\0');
    return buf;
  }
};

size_t Pump::Room(const PumpStream& s) const { return s.room ? std::min(s.room(), buf_.size()) : buf_.size(); }

bool Pump::ReadOnce(PumpStream& s) {
  if (!s.fd.valid()) return false;
  const size_t room = Room(s);
  if (room == 0) return false;
  ssize_t r;
  do {
    r = ::read(s.fd.get(), buf_.data(), room);
  } while (r < 0 && errno == EINTR);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
  if (r <= 0) {  // EOF, or EIO: a PTY's slave side is closed everywhere
    s.fd.reset();
    return false;
  }
  const std::string_view chunk(buf_.data(), static_cast<size_t>(r));
  if (s.on_data) s.on_data(chunk);
  s.total += static_cast<uint64_t>(r);
  const uint64_t keep = s.cap > s.data.size() ? s.cap - s.data.size() : 0;
  s.data.append(chunk.data(), static_cast<size_t>(std::min<uint64_t>(keep, chunk.size())));
  return true;
}

void Pump::DrainOrdered(size_t i, int reads) {
  for (int r = 0; r < reads; ++r) {
    for (size_t j = 0; j < i; ++j) Drain(*streams_[j], 64);
    if (!ReadOnce(*streams_[i])) return;
  }
}

void Pump::DrainAll(int reads) {
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i]->drain_earlier_first) {
      DrainOrdered(i, reads);
    } else {
      Drain(*streams_[i], reads);
    }
  }
}

Pump::PollSet Pump::Build(bool with_wake) {
  PollSet ps;
  if (with_wake && o_.wake_fd >= 0) {
    ps.wake = static_cast<int>(ps.n);
    ps.pfds[ps.n++] = {o_.wake_fd, POLLIN, 0};
  }
  for (size_t i = 0; i < streams_.size(); ++i) {
    ps.idx[i] = -1;
    if (!streams_[i]->fd.valid()) continue;
    if (Room(*streams_[i]) == 0) {
      ps.held = true;
      continue;
    }
    ps.idx[i] = static_cast<int>(ps.n);
    ps.pfds[ps.n++] = {streams_[i]->fd.get(), POLLIN, 0};
    ++ps.streams;
  }
  return ps;
}

void Pump::ConsumeWake(const PollSet& ps) {
  if (ps.wake < 0 || !(ps.pfds[ps.wake].revents & POLLIN)) return;
  uint64_t v;
  (void)!::read(o_.wake_fd, &v, sizeof v);
}

void Pump::ReadReady(const PollSet& ps, int reads) {
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (ps.idx[i] < 0 || !ps.pfds[ps.idx[i]].revents) continue;
    if (streams_[i]->drain_earlier_first) {
      DrainOrdered(i, reads);
    } else {
      Drain(*streams_[i], reads);
    }
  }
}

void Pump::CloseStdin() {
  if (in_ == nullptr) return;
  in_->reset();
  in_ = nullptr;
  pending_ = {};
  chunk_.clear();
  if (o_.on_stdin_closed) o_.on_stdin_closed();
}

void Pump::RefillStdin() {
  if (in_ == nullptr || !pending_.empty()) return;
  if (stdin_data_given_ || !o_.stdin_source) {
    CloseStdin();  // all of stdin_data is written
    return;
  }
  for (int i = 0; i < 16; ++i) {  // empty chunks: ask again (bounded)
    chunk_.clear();
    switch (o_.stdin_source(&chunk_)) {
      case StdinNext::kWait: return;
      case StdinNext::kClose: CloseStdin(); return;
      case StdinNext::kChunk:
        pending_ = chunk_;
        if (!pending_.empty()) return;
        break;
    }
  }
}

void Pump::WriteStdin() {
  const ssize_t w = ::write(in_->get(), pending_.data(), pending_.size());
  if (w > 0) pending_.remove_prefix(static_cast<size_t>(w));
  if (w < 0 && errno != EAGAIN && errno != EINTR) {  // EPIPE: nobody reads stdin any more
    CloseStdin();
    return;
  }
  RefillStdin();
}

StatusOr<PumpResult> Pump::Run() {
  if (streams_.size() > kMaxStreams) {
    return absl::InvalidArgumentError(o_.what + ": at most " + std::to_string(kMaxStreams) + " output streams");
  }
  if (!o_.stdin_data.empty() && o_.stdin_source) {
    return absl::InvalidArgumentError(o_.what + ": stdin_data and stdin_source are exclusive");
  }
  ScopedSigpipeBlock no_sigpipe;
  if (o_.stdin_fd != nullptr && o_.stdin_fd->valid()) {
    in_ = o_.stdin_fd;
    SetNonBlocking(in_->get());
    stdin_data_given_ = !o_.stdin_source;
    pending_ = o_.stdin_data;
  }
  for (PumpStream* s : streams_) {
    if (s->fd.valid()) SetNonBlocking(s->fd.get());
  }
  RefillStdin();

  bool exited = false;
  while (!exited) {
    if (o_.cancelled && o_.cancelled()) return CancelledStatus();
    if (!stopping_ && StopAsked()) {
      stopping_ = res_.stopped = true;
      if (o_.kill) o_.kill(SIGKILL);
      const Clock::time_point now = Clock::now();
      kill_at_ = now + kReKill;
      stop_until_ = now + o_.stop_wait;
    }
    RefillStdin();
    PollSet ps = Build(true);
    const int exit_i = static_cast<int>(ps.n);
    ps.pfds[ps.n++] = {o_.exit_fd, POLLIN, 0};
    int in_i = -1;
    if (in_ != nullptr && !pending_.empty()) {
      in_i = static_cast<int>(ps.n);
      ps.pfds[ps.n++] = {in_->get(), POLLOUT, 0};
    }
    const Clock::time_point next = stopping_ ? std::min(stop_until_, kill_at_) : std::min(Deadline(), kill_at_);
    const int pr = ::poll(ps.pfds, ps.n, WaitMs(next, Clock::now()));
    if (pr < 0 && errno != EINTR) return ErrnoToStatus(errno, "poll(" + o_.what + " pipes)");
    ConsumeWake(ps);
    ReadReady(ps, 4);
    if (in_i >= 0 && ps.pfds[in_i].revents && in_ != nullptr) WriteStdin();
    if (ps.pfds[exit_i].revents & POLLIN) {
      ASSIGN_OR_RETURN(exited, o_.on_exit_readable());
    }
    if (exited) break;
    const Clock::time_point now = Clock::now();
    if (stopping_ && now >= stop_until_) {
      return absl::DeadlineExceededError(o_.what + " did not end within " + std::to_string(o_.stop_wait.count()) +
                                         " ms of its stop");
    }
    if (!stopping_ && now >= Deadline() && !res_.timed_out) {
      res_.timed_out = true;
      if (o_.kill) o_.kill(SIGTERM);
      kill_at_ = now + o_.kill_grace;
    }
    if (now >= kill_at_) {
      if (o_.kill) o_.kill(SIGKILL);
      kill_at_ = now + kReKill;  // re-kill until the foreground is gone
    }
  }
  res_.kill_at = kill_at_;
  CloseStdin();
  if (stopping_ || o_.after_exit == PumpOptions::AfterExit::kAvailable) {
    // The foreground is gone: take what is already in the pipes, then stop.
    DrainAll(64);
    return res_;
  }
  if (o_.after_exit == PumpOptions::AfterExit::kWhileReadable) return WhileReadable();
  return UntilEof();
}

StatusOr<PumpResult> Pump::WhileReadable() {
  const Clock::time_point exit_at = Clock::now();
  for (;;) {
    if (o_.cancelled && o_.cancelled()) return CancelledStatus();
    if (StopAsked()) {
      res_.stopped = true;
      DrainAll(64);
      return res_;
    }
    PollSet ps = Build(true);
    if (ps.streams == 0 && !ps.held) return res_;
    const Clock::time_point until = exit_at + (ps.held ? o_.linger_held : o_.linger);
    // Not held back: only what is ready now (a background process holding
    // a pipe open keeps nothing); held back: until the reader makes room.
    const int pr = ::poll(ps.pfds, ps.n, ps.held ? WaitMs(until, Clock::now()) : 0);
    if (pr < 0 && errno != EINTR) return ErrnoToStatus(errno, "poll(" + o_.what + " pipes)");
    ConsumeWake(ps);
    bool ready = false;
    for (size_t i = 0; i < streams_.size(); ++i) ready = ready || (ps.idx[i] >= 0 && ps.pfds[ps.idx[i]].revents);
    if (!ready && !ps.held) return res_;
    // Read before the bound is looked at: room that came late (after
    // `linger`, within `linger_held`) still gets its pass.
    ReadReady(ps, 64);
    if (Clock::now() >= until) return res_;  // the rest stays in the pipes
  }
}

StatusOr<PumpResult> Pump::UntilEof() {
  const Clock::time_point until = Clock::now() + o_.linger;
  for (;;) {
    PollSet ps = Build(true);
    if (ps.streams == 0 && !ps.held) return res_;
    const Clock::time_point now = Clock::now();
    if (now >= until) {
      return absl::DeadlineExceededError(o_.what + ": its pipes stayed open " + std::to_string(o_.linger.count()) +
                                         " ms after it ended");
    }
    if (o_.cancelled && o_.cancelled()) return CancelledStatus();
    if (StopAsked()) {
      res_.stopped = true;
      DrainAll(64);
      return res_;
    }
    const int pr = ::poll(ps.pfds, ps.n, WaitMs(until, now));
    if (pr < 0 && errno != EINTR) return ErrnoToStatus(errno, "poll(" + o_.what + " pipes)");
    ConsumeWake(ps);
    ReadReady(ps, 4);
  }
}

}  // namespace

StatusOr<PumpResult> PumpOutput(const PumpOptions& options, const std::vector<PumpStream*>& streams) {
  return Pump(options, streams).Run();
}

}  // namespace warren
