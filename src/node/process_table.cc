#include "node/process_table.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace warren::node {
namespace {

using std::chrono::milliseconds;

int64_t UnixNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

constexpr size_t kReadChunk = 64 << 10;

}  // namespace

StatusOr<std::shared_ptr<ManagedProcess>> ManagedProcess::Start(std::shared_ptr<runtime::Sandbox> sb,
                                                                std::string sandbox_id, std::string process_id,
                                                                const runtime::ExecSpec& spec,
                                                                const ProcessOptions& options, ExitCallback on_exit) {
  if (options.buffer_bytes == 0 || options.buffer_bytes > kMaxProcessBufferBytes)
    return absl::InvalidArgumentError("buffer_bytes=" + std::to_string(options.buffer_bytes) + " must be in [1, " +
                                      std::to_string(kMaxProcessBufferBytes) + "]");
  ASSIGN_OR_RETURN(runtime::ProcessStarter * starter, runtime::Require<runtime::ProcessStarter>(*sb));
  ASSIGN_OR_RETURN(std::unique_ptr<runtime::Process> proc, starter->Start(spec, options.start));
  std::shared_ptr<ManagedProcess> mp(new ManagedProcess(std::move(sb), std::move(proc), std::move(sandbox_id),
                                                        std::move(process_id), spec, options, std::move(on_exit)));
  if (!mp->wake_.valid()) {
    Status s = ErrnoToStatus(errno, "eventfd");
    mp->Stop();
    return s;
  }
  mp->pump_ = std::thread([p = mp.get()] { p->Pump(); });
  return mp;
}

ManagedProcess::ManagedProcess(std::shared_ptr<runtime::Sandbox> sb, std::unique_ptr<runtime::Process> proc,
                               std::string sandbox_id, std::string process_id, const runtime::ExecSpec& spec,
                               const ProcessOptions& options, ExitCallback on_exit)
    : sb_(std::move(sb)),
      proc_(std::move(proc)),
      sandbox_id_(std::move(sandbox_id)),
      process_id_(std::move(process_id)),
      options_(options),
      on_exit_(std::move(on_exit)),
      buf_(kReadChunk, '\0'),
      rings_{RingBuffer(options.buffer_bytes), RingBuffer(options.buffer_bytes)} {
  in_ = proc_->TakeStdin();
  out_[0] = proc_->TakeStdout();
  out_[1] = proc_->TakeStderr();
  out_[2] = proc_->TakeControl();
  for (auto* fd : {&in_, &out_[0], &out_[1], &out_[2]}) {
    if (fd->valid()) (void)::fcntl(fd->get(), F_SETFL, ::fcntl(fd->get(), F_GETFL) | O_NONBLOCK);
  }
  wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  status_.sandbox_id = sandbox_id_;
  status_.process_id = process_id_;
  status_.argv = spec.argv;
  status_.shell = spec.shell;
  status_.pty = options.start.pty;
  status_.started_at_ns = UnixNs();
  status_.pid = proc_->pid();
  status_.buffer_bytes = options.buffer_bytes;
  if (!spec.stdin_data.empty()) stdin_queue_.push_back(spec.stdin_data);
}

ManagedProcess::~ManagedProcess() { Stop(); }

void ManagedProcess::Wake() {
  uint64_t one = 1;
  if (wake_.valid()) (void)!::write(wake_.get(), &one, sizeof one);
}

Status ManagedProcess::Write(std::string data, bool close) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (finished_ || stdin_close_ || stdin_closed_)
      return absl::FailedPreconditionError("process " + process_id_ + ": stdin is closed");
    if (!data.empty()) stdin_queue_.push_back(std::move(data));
    if (close) stdin_close_ = true;
  }
  Wake();
  return absl::OkStatus();
}

Status ManagedProcess::Signal(int sig, bool whole_tree) {
  if (sig <= 0 || sig >= NSIG) return absl::InvalidArgumentError("signal " + std::to_string(sig) + " out of range");
  return proc_->Signal(sig, whole_tree);
}

Status ManagedProcess::Resize(uint16_t rows, uint16_t cols) {
  if (rows == 0 || cols == 0) return absl::InvalidArgumentError("resize: rows and cols must be > 0");
  return proc_->Resize(rows, cols);
}

ManagedProcess::ReadResult ManagedProcess::Read(const std::array<uint64_t, 3>& offsets, size_t max_bytes,
                                                Clock::time_point deadline) {
  ReadResult r;
  std::unique_lock<std::mutex> l(mu_);
  const uint64_t interrupts = interrupts_;
  for (;;) {
    for (int s = 0; s < 2; ++s) {
      const RingBuffer& ring = rings_[s];
      if (ring.total() > offsets[s] || offsets[s] < ring.first_offset()) {
        RingBuffer::Slice sl = ring.Read(offsets[s], max_bytes);
        if (sl.data.empty() && sl.dropped == 0) continue;
        OutputData d;
        d.stream = static_cast<ProcStream>(s);
        d.data = std::move(sl.data);
        d.offset = sl.offset;
        d.dropped = sl.dropped;
        r.chunks.push_back(std::move(d));
      }
    }
    if (control_total_ > offsets[2]) {
      // One chunk per record (each with its own marks), at most 64 per read.
      const uint64_t first = control_total_ - control_held_;
      uint64_t off = offsets[2];
      uint64_t dropped = 0;
      if (off < first) {
        dropped = first - off;
        off = first;
      }
      int n = 0;
      for (const ControlRecord& rec : control_) {
        if (rec.offset + rec.data.size() <= off) continue;
        if (++n > 64) break;
        OutputData d;
        d.stream = ProcStream::kControl;
        const size_t skip = off > rec.offset ? static_cast<size_t>(off - rec.offset) : 0;
        d.offset = rec.offset + skip;
        d.dropped = dropped;
        dropped = 0;
        d.data = rec.data.substr(skip);
        d.stdout_mark = rec.stdout_mark;
        d.stderr_mark = rec.stderr_mark;
        r.chunks.push_back(std::move(d));
      }
    }
    r.finished = finished_;
    if (!r.chunks.empty() || finished_ || interrupts_ != interrupts) return r;
    if (cv_.wait_until(l, deadline) == std::cv_status::timeout) {
      r.finished = finished_;
      return r;
    }
  }
}

void ManagedProcess::Consumed(const std::array<uint64_t, 2>& offsets) {
  {
    std::lock_guard<std::mutex> l(mu_);
    for (int s = 0; s < 2; ++s) consumed_[s] = std::max(consumed_[s], offsets[s]);
  }
  Wake();
}

void ManagedProcess::Interrupt() {
  {
    std::lock_guard<std::mutex> l(mu_);
    ++interrupts_;
  }
  cv_.notify_all();
}

bool ManagedProcess::WaitFinished(Clock::time_point deadline) {
  std::unique_lock<std::mutex> l(mu_);
  return cv_.wait_until(l, deadline, [this] { return finished_; });
}

ProcessStatus ManagedProcess::Info() const {
  std::lock_guard<std::mutex> l(mu_);
  ProcessStatus s = status_;
  for (int i = 0; i < 2; ++i) {
    s.totals[i] = rings_[i].total();
    s.first_offsets[i] = rings_[i].first_offset();
  }
  s.running = !finished_;
  return s;
}

void ManagedProcess::Stop() {
  bool running;
  {
    std::lock_guard<std::mutex> l(mu_);
    running = !finished_;
    stopping_ = true;
  }
  if (running && proc_) (void)proc_->Signal(SIGKILL, true);
  Wake();
  if (pump_.joinable()) pump_.join();
}

size_t ManagedProcess::Room(int s) const {
  if (s == 2 || !options_.lossless || stopping_) return kReadChunk;
  const uint64_t unread = rings_[s].total() - consumed_[s];
  return unread >= options_.buffer_bytes ? 0 : std::min<size_t>(kReadChunk, options_.buffer_bytes - unread);
}

bool ManagedProcess::Drain(int s, int reads) {
  for (int i = 0; i < reads && out_[s].valid(); ++i) {
    size_t room;
    {
      std::lock_guard<std::mutex> l(mu_);
      room = Room(s);
    }
    if (room == 0) return true;
    ssize_t n = ::read(out_[s].get(), buf_.data(), std::min(room, buf_.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    if (n <= 0) {  // EOF, or EIO: the PTY's slave side is closed everywhere
      out_[s].reset();
      return false;
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      if (s < 2) {
        rings_[s].Append(std::string_view(buf_.data(), static_cast<size_t>(n)));
      } else {
        // Everything written to stdout/stderr before fd 3 goes first.
        ControlRecord rec{control_total_, std::string(buf_.data(), static_cast<size_t>(n)), rings_[0].total(),
                          rings_[1].total()};
        control_total_ += rec.data.size();
        control_held_ += rec.data.size();
        control_.push_back(std::move(rec));
        while (control_held_ > options_.buffer_bytes && control_.size() > 1) {
          control_held_ -= control_.front().data.size();
          control_.pop_front();
        }
      }
    }
    cv_.notify_all();
  }
  return out_[2].valid() || s != 2;
}

void ManagedProcess::Pump() {
  // Writing to a stdin whose reader is gone must give EPIPE, not kill us.
  sigset_t pipe_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, nullptr);

  const auto t0 = Clock::now();
  const auto deadline = options_.timeout.count() > 0 ? t0 + options_.timeout : Clock::time_point::max();
  auto kill_at = Clock::time_point::max();
  bool exited = false, timed_out = false;
  runtime::ExecOutcome outcome;
  std::string pending;  // stdin bytes being written
  auto exit_seen_at = Clock::time_point::max();
  auto stop_seen = Clock::time_point::max();

  for (;;) {
    bool stopping;
    bool want_close = false;
    std::array<size_t, 2> room{};
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping = stopping_;
      if (pending.empty() && !stdin_queue_.empty()) {
        pending = std::move(stdin_queue_.front());
        stdin_queue_.pop_front();
      }
      want_close = stdin_close_ && pending.empty() && stdin_queue_.empty();
      room = {Room(0), Room(1)};
    }
    if (want_close && in_.valid()) {
      in_.reset();
      std::lock_guard<std::mutex> l(mu_);
      stdin_closed_ = true;
    }

    pollfd pfds[6];
    int np = 0;
    pfds[np++] = {wake_.get(), POLLIN, 0};
    int pid_i = -1, in_i = -1, out_i[3] = {-1, -1, -1};
    if (!exited) {
      pid_i = np;
      pfds[np++] = {proc_->pidfd(), POLLIN, 0};
    }
    for (int s = 0; s < 3; ++s) {
      if (out_[s].valid() && (s == 2 || room[s] > 0)) {
        out_i[s] = np;
        pfds[np++] = {out_[s].get(), POLLIN, 0};
      }
    }
    if (in_.valid() && !pending.empty()) {
      in_i = np;
      pfds[np++] = {in_.get(), POLLOUT, 0};
    }
    int wait_ms = 1000;
    const auto now = Clock::now();
    const auto next = std::min(deadline, kill_at);
    if (next != Clock::time_point::max())
      wait_ms = static_cast<int>(
          std::clamp<int64_t>(std::chrono::duration_cast<milliseconds>(next - now).count() + 1, 0, 1000));
    if (exited) wait_ms = std::min(wait_ms, 50);
    int pr = ::poll(pfds, static_cast<nfds_t>(np), wait_ms);
    if (pr < 0 && errno != EINTR) break;
    if (pfds[0].revents & POLLIN) {
      uint64_t v;
      (void)!::read(wake_.get(), &v, sizeof v);
    }
    // Output: stdout and stderr first, so that a control record always comes
    // after what the process wrote to them before it.
    for (int s = 0; s < 2; ++s) {
      if (out_i[s] >= 0 && pfds[out_i[s]].revents) Drain(s, 4);
    }
    if (out_i[2] >= 0 && pfds[out_i[2]].revents) {
      Drain(0, 64);
      Drain(1, 64);
      Drain(2, 4);
    }
    if (in_i >= 0 && pfds[in_i].revents) {
      ssize_t w = ::write(in_.get(), pending.data(), pending.size());
      if (w > 0) pending.erase(0, static_cast<size_t>(w));
      if (w < 0 && errno != EAGAIN && errno != EINTR) {  // EPIPE: nobody reads stdin any more
        pending.clear();
        in_.reset();
        std::lock_guard<std::mutex> l(mu_);
        stdin_queue_.clear();
        stdin_closed_ = true;
      }
    }
    if (!exited && pid_i >= 0 && (pfds[pid_i].revents & POLLIN)) {
      StatusOr<bool> w = proc_->TryWait(&outcome);
      if (!w.ok() || *w) {
        exited = true;
        exit_seen_at = Clock::now();
        if (!w.ok()) {
          outcome.exit_code = 128 + SIGKILL;
          outcome.signal = SIGKILL;
        }
      }
    }
    const auto t = Clock::now();
    if (!exited && t >= deadline && !timed_out) {
      timed_out = true;
      (void)proc_->Signal(SIGTERM, true);
      kill_at = t + options_.kill_grace;
    }
    if (!exited && t >= kill_at) {
      (void)proc_->Signal(SIGKILL, true);
      kill_at = t + milliseconds(200);
    }
    if (exited) {
      // The foreground is gone: take what is already in the pipes, then stop
      // (background processes holding them do not keep the process open).
      // Bounded: background writers could keep the pipes busy forever; a
      // slow lossless reader gets up to a minute to take the rest.
      bool more = false, waiting_for_reader = false;
      for (int s = 0; s < 3; ++s) {
        if (!out_[s].valid()) continue;
        size_t r;
        {
          std::lock_guard<std::mutex> l(mu_);
          r = Room(s);
        }
        if (r == 0) {
          more = waiting_for_reader = true;
          continue;
        }
        Drain(s, 64);
        if (out_[s].valid()) {
          pollfd p{out_[s].get(), POLLIN, 0};
          if (::poll(&p, 1, 0) > 0 && (p.revents & POLLIN)) more = true;
        }
      }
      const auto since_exit = Clock::now() - exit_seen_at;
      if (!more || stopping || since_exit > milliseconds(waiting_for_reader ? 60000 : 2000)) break;
    } else if (stopping) {
      // Stop() killed the tree: keep reaping until the foreground is gone,
      // at most 5 s (a frozen sandbox delays the kill).
      if (stop_seen == Clock::time_point::max()) stop_seen = Clock::now();
      if (Clock::now() - stop_seen > milliseconds(5000)) break;
    }
  }
  if (timed_out) (void)proc_->Signal(SIGKILL, true);  // the rest of the tree goes too
  outcome.timed_out = timed_out;
  outcome.duration = Clock::now() - t0;
  ProcessStatus st;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& fd : out_) fd.reset();
    in_.reset();
    stdin_closed_ = true;
    stdin_queue_.clear();
    outcome.stdout_total = rings_[0].total();
    outcome.stderr_total = rings_[1].total();
    status_.outcome = outcome;
    status_.outcome.stdout_data.clear();
    status_.outcome.stderr_data.clear();
    finished_ = true;
    st = status_;
    st.running = false;
    for (int i = 0; i < 2; ++i) {
      st.totals[i] = rings_[i].total();
      st.first_offsets[i] = rings_[i].first_offset();
    }
  }
  cv_.notify_all();
  if (on_exit_) on_exit_(st);
}

// ------------------------------------------------------------------ table

ProcessTable::~ProcessTable() {
  std::map<std::string, std::vector<std::shared_ptr<ManagedProcess>>> all;
  {
    std::lock_guard<std::mutex> l(mu_);
    all.swap(by_sandbox_);
  }
  for (auto& [id, v] : all) {
    for (auto& p : v) p->Stop();
  }
}

std::string ProcessTable::NewId() {
  std::lock_guard<std::mutex> l(mu_);
  return "p" + std::to_string(next_++);
}

Status ProcessTable::Insert(const std::string& sandbox_id, std::shared_ptr<ManagedProcess> mp) {
  std::shared_ptr<ManagedProcess> forgotten;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto& v = by_sandbox_[sandbox_id];
    if (v.size() >= kMaxProcessesPerSandbox) {
      auto it = std::find_if(v.begin(), v.end(), [](const auto& p) { return !p->Info().running; });
      if (it == v.end()) {
        return absl::ResourceExhaustedError("sandbox " + sandbox_id + " already runs " +
                                            std::to_string(kMaxProcessesPerSandbox) + " background processes");
      }
      forgotten = std::move(*it);
      v.erase(it);
    }
    v.push_back(std::move(mp));
  }
  return absl::OkStatus();  // `forgotten` (finished) is released outside the lock
}

StatusOr<std::shared_ptr<ManagedProcess>> ProcessTable::Find(const std::string& sandbox_id,
                                                             const std::string& process_id) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = by_sandbox_.find(sandbox_id);
  if (it != by_sandbox_.end()) {
    for (const auto& p : it->second) {
      if (p->id() == process_id) return p;
    }
  }
  return absl::NotFoundError("process " + process_id + " not found in sandbox " + sandbox_id);
}

std::vector<std::shared_ptr<ManagedProcess>> ProcessTable::List(const std::string& sandbox_id) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = by_sandbox_.find(sandbox_id);
  if (it == by_sandbox_.end()) return {};
  return it->second;
}

void ProcessTable::DropSandbox(const std::string& sandbox_id) {
  std::vector<std::shared_ptr<ManagedProcess>> v;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = by_sandbox_.find(sandbox_id);
    if (it == by_sandbox_.end()) return;
    v = std::move(it->second);
    by_sandbox_.erase(it);
  }
  for (auto& p : v) p->Stop();
}

}  // namespace warren::node
