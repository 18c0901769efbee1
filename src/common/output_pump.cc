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

void SetNonBlocking(int fd) { (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Milliseconds to wait for `next` (1 s at most: cancellation and deadline
// changes are looked at once a second).
int WaitMs(Clock::time_point next, Clock::time_point now) {
  if (next == Clock::time_point::max()) return 1000;
  return static_cast<int>(
      std::clamp<int64_t>(std::chrono::duration_cast<milliseconds>(next - now).count() + 1, 0, 1000));
}

}  // namespace

StatusOr<PumpResult> PumpOutput(const PumpOptions& o, std::vector<PumpStream*> streams) {
  if (streams.size() > kMaxStreams) {
    return absl::InvalidArgumentError(o.what + ": at most " + std::to_string(kMaxStreams) + " output streams");
  }
  ScopedSigpipeBlock no_sigpipe;
  UniqueFd* in = o.stdin_fd != nullptr && o.stdin_fd->valid() ? o.stdin_fd : nullptr;
  size_t stdin_off = 0;
  if (in != nullptr && o.stdin_data.empty()) {
    in->reset();
    in = nullptr;
  }
  if (in != nullptr) SetNonBlocking(in->get());
  for (PumpStream* s : streams) {
    if (s->fd.valid()) SetNonBlocking(s->fd.get());
  }
  // 64 KiB per read (a pipe's default capacity), one buffer per thread: a
  // fresh one per command cost a memset, page faults and a heap
  // consolidation on free, for commands most of which print little.
  thread_local std::string buf(64 << 10, '\0');
  auto drain = [&](PumpStream& s, int max_reads) {
    for (int i = 0; i < max_reads && s.fd.valid(); ++i) {
      ssize_t r = ::read(s.fd.get(), buf.data(), buf.size());
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return;  // EAGAIN: nothing more right now
      if (r == 0) {
        s.fd.reset();
        return;
      }
      const std::string_view chunk(buf.data(), static_cast<size_t>(r));
      if (s.on_data) s.on_data(chunk);
      s.total += static_cast<uint64_t>(r);
      const uint64_t room = s.cap > s.data.size() ? s.cap - s.data.size() : 0;
      s.data.append(chunk.data(), static_cast<size_t>(std::min<uint64_t>(room, chunk.size())));
    }
  };
  auto deadline_now = [&] { return o.deadline ? o.deadline() : Clock::time_point::max(); };

  PumpResult res;
  Clock::time_point kill_at = Clock::time_point::max();
  bool exited = false;
  while (!exited) {
    if (o.cancelled && o.cancelled()) return absl::CancelledError(o.what + " cancelled");
    pollfd pfds[kMaxStreams + 2];
    int idx[kMaxStreams];
    nfds_t np = 0;
    pfds[np++] = {o.exit_fd, POLLIN, 0};
    for (size_t i = 0; i < streams.size(); ++i) {
      idx[i] = -1;
      if (!streams[i]->fd.valid()) continue;
      idx[i] = static_cast<int>(np);
      pfds[np++] = {streams[i]->fd.get(), POLLIN, 0};
    }
    int in_i = -1;
    if (in != nullptr && in->valid()) {
      in_i = static_cast<int>(np);
      pfds[np++] = {in->get(), POLLOUT, 0};
    }
    const int pr = ::poll(pfds, np, WaitMs(std::min(deadline_now(), kill_at), Clock::now()));
    if (pr < 0 && errno != EINTR) return ErrnoToStatus(errno, "poll(" + o.what + " pipes)");
    for (size_t i = 0; i < streams.size(); ++i) {
      if (idx[i] >= 0 && pfds[idx[i]].revents) drain(*streams[i], 4);
    }
    if (in_i >= 0 && pfds[in_i].revents) {
      ssize_t w = ::write(in->get(), o.stdin_data.data() + stdin_off, o.stdin_data.size() - stdin_off);
      if (w > 0) stdin_off += static_cast<size_t>(w);
      if ((w < 0 && errno != EAGAIN && errno != EINTR) || stdin_off == o.stdin_data.size()) in->reset();
    }
    if (pfds[0].revents & POLLIN) {
      ASSIGN_OR_RETURN(exited, o.on_exit_readable());
    }
    const Clock::time_point now = Clock::now();
    if (!exited && now >= deadline_now() && !res.timed_out) {
      res.timed_out = true;
      if (o.kill) o.kill(SIGTERM);
      kill_at = now + o.kill_grace;
    }
    if (!exited && now >= kill_at) {
      if (o.kill) o.kill(SIGKILL);
      kill_at = now + milliseconds(200);  // re-kill until the foreground is gone
    }
  }
  res.kill_at = kill_at;
  if (in != nullptr) in->reset();
  if (o.after_exit == PumpOptions::AfterExit::kAvailable) {
    // The foreground is gone: take what is already in the pipes, then stop.
    for (PumpStream* s : streams) drain(*s, 64);
    return res;
  }
  const Clock::time_point until = Clock::now() + o.linger;
  for (;;) {
    pollfd pfds[kMaxStreams];
    int idx[kMaxStreams];
    nfds_t np = 0;
    for (size_t i = 0; i < streams.size(); ++i) {
      idx[i] = -1;
      if (!streams[i]->fd.valid()) continue;
      idx[i] = static_cast<int>(np);
      pfds[np++] = {streams[i]->fd.get(), POLLIN, 0};
    }
    if (np == 0) return res;
    const Clock::time_point now = Clock::now();
    if (now >= until) {
      return absl::DeadlineExceededError(o.what + ": its pipes stayed open " + std::to_string(o.linger.count()) +
                                         " ms after it ended");
    }
    if (o.cancelled && o.cancelled()) return absl::CancelledError(o.what + " cancelled");
    const int pr = ::poll(pfds, np, WaitMs(until, now));
    if (pr < 0 && errno != EINTR) return ErrnoToStatus(errno, "poll(" + o.what + " pipes)");
    for (size_t i = 0; i < streams.size(); ++i) {
      if (idx[i] >= 0 && pfds[idx[i]].revents) drain(*streams[i], 4);
    }
  }
}

}  // namespace warren
