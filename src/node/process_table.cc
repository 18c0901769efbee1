#include "node/process_table.h"

#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/log.h"
#include "common/output_pump.h"
#include "common/time.h"

namespace warren::node {
namespace {

using std::chrono::milliseconds;

constexpr size_t kReadChunk = 64 << 10;  // the pump's read size

}  // namespace

Status CheckMergeStderr(const runtime::Sandbox& sb, const runtime::ExecSpec& spec) {
  // Only the container backend hands the command one pipe for fds 1 and 2.
  if (spec.merge_stderr && sb.backend_name() != "container")
    return absl::InvalidArgumentError("merge_stderr is not supported by the " + std::string(sb.backend_name()) +
                                      " backend");
  return absl::OkStatus();
}

StatusOr<std::shared_ptr<ManagedProcess>> ManagedProcess::Start(std::shared_ptr<runtime::Sandbox> sb,
                                                                std::string sandbox_id, std::string process_id,
                                                                const runtime::ExecSpec& spec,
                                                                const ProcessOptions& options, ExitCallback on_exit) {
  if (options.buffer_bytes == 0 || options.buffer_bytes > kMaxProcessBufferBytes)
    return absl::InvalidArgumentError("buffer_bytes=" + std::to_string(options.buffer_bytes) + " must be in [1, " +
                                      std::to_string(kMaxProcessBufferBytes) + "]");
  ASSIGN_OR_RETURN(runtime::ProcessStarter * starter, runtime::Require<runtime::ProcessStarter>(*sb));
  RETURN_IF_ERROR(CheckMergeStderr(*sb, spec));
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
      rings_{RingBuffer(options.buffer_bytes), RingBuffer(options.buffer_bytes)} {
  in_ = proc_->TakeStdin();
  out_[0] = proc_->TakeStdout();
  out_[1] = proc_->TakeStderr();
  out_[2] = proc_->TakeControl();
  wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  status_.sandbox_id = sandbox_id_;
  status_.process_id = process_id_;
  status_.argv = spec.argv;
  status_.shell = spec.shell;
  status_.pty = options.start.pty;
  status_.started_at_ns = WallNowNs();
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
  bool timed_out = false;
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
    if (!r.chunks.empty() || finished_ || interrupts_ != interrupts || timed_out) return r;
    // A timeout scans once more before it returns: the pump may have added
    // the last bytes and finished between the deadline and this thread
    // getting the lock back, and `finished` with those bytes unread would
    // end a stream without them.
    timed_out = cv_.wait_until(l, deadline) == std::cv_status::timeout;
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
  if (!pump_.joinable()) {  // no pump (Start failed): kill here
    if (running && proc_) (void)proc_->Signal(SIGKILL, true);
    return;
  }
  Wake();  // the pump kills the tree and reaps
  pump_.join();
}

size_t ManagedProcess::Room(int s) const {
  if (s == 2 || !options_.lossless || stopping_) return kReadChunk;
  const uint64_t unread = rings_[s].total() - consumed_[s];
  return unread >= options_.buffer_bytes ? 0 : std::min<size_t>(kReadChunk, options_.buffer_bytes - unread);
}

void ManagedProcess::Append(int s, std::string_view chunk) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (s < 2) {
      rings_[s].Append(chunk);
    } else {
      // The pump drained stdout/stderr before this read of fd 3: everything
      // the process wrote to them before is counted in the marks.
      ControlRecord rec{control_total_, std::string(chunk), rings_[0].total(), rings_[1].total()};
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

void ManagedProcess::Pump() {
  const auto t0 = Clock::now();
  runtime::ExecOutcome outcome;
  bool ended = false;  // the foreground was reaped (or cannot be)
  PumpStream streams[3];
  for (int s = 0; s < 3; ++s) {
    streams[s].fd = std::move(out_[s]);
    streams[s].on_data = [this, s](std::string_view chunk) { Append(s, chunk); };
    if (s < 2) {
      streams[s].room = [this, s] {
        std::lock_guard<std::mutex> l(mu_);
        return Room(s);
      };
    }
  }
  // Control records come after the stdout/stderr bytes written before them.
  streams[2].drain_earlier_first = true;

  PumpOptions po;
  po.exit_fd = proc_->pidfd();
  po.on_exit_readable = [&]() -> StatusOr<bool> {
    StatusOr<bool> w = proc_->TryWait(&outcome);
    if (w.ok() && !*w) return false;
    if (!w.ok()) {  // cannot reap: count it as killed
      outcome.exit_code = 128 + SIGKILL;
      outcome.signal = SIGKILL;
    }
    ended = true;
    return true;
  };
  po.stdin_fd = &in_;
  po.stdin_source = [this](std::string* chunk) {
    std::lock_guard<std::mutex> l(mu_);
    if (!stdin_queue_.empty()) {
      *chunk = std::move(stdin_queue_.front());
      stdin_queue_.pop_front();
      return StdinNext::kChunk;
    }
    return stdin_close_ ? StdinNext::kClose : StdinNext::kWait;
  };
  po.on_stdin_closed = [this] {
    std::lock_guard<std::mutex> l(mu_);
    stdin_closed_ = true;
    stdin_queue_.clear();
  };
  po.wake_fd = wake_.get();
  if (options_.timeout.count() > 0) po.deadline = [d = t0 + options_.timeout] { return d; };
  po.kill = [this](int sig) { (void)proc_->Signal(sig, true); };
  po.kill_grace = options_.kill_grace;
  po.stop = [this] {
    std::lock_guard<std::mutex> l(mu_);
    return stopping_;
  };
  po.stop_wait = milliseconds(5000);  // a frozen sandbox delays the kill
  // Bounded: background writers could keep the pipes busy forever; a slow
  // lossless reader gets up to a minute to take the rest.
  po.after_exit = PumpOptions::AfterExit::kWhileReadable;
  po.linger = milliseconds(2000);
  po.linger_held = milliseconds(60000);
  po.what = "process " + process_id_;
  StatusOr<PumpResult> pumped = PumpOutput(po, {&streams[0], &streams[1], &streams[2]});
  if (!pumped.ok() || pumped->timed_out) (void)proc_->Signal(SIGKILL, true);  // the rest of the tree goes too
  if (!pumped.ok()) {
    Log(spdlog::level::warn, "background process pump ended early",
        {{"sandbox", sandbox_id_}, {"process", process_id_}, {"error", pumped.status().ToString()}});
  }
  if (!ended) {  // stopped but not seen to end: it was killed
    outcome.exit_code = 128 + SIGKILL;
    outcome.signal = SIGKILL;
  }
  outcome.timed_out = pumped.ok() && pumped->timed_out;
  outcome.duration = Clock::now() - t0;
  ProcessStatus st;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& s : streams) s.fd.reset();
    in_.reset();
    stdin_closed_ = true;
    stdin_queue_.clear();
    outcome.stdout_total = rings_[0].total();
    outcome.stderr_total = rings_[1].total();
    status_.outcome = outcome;
    status_.outcome.stdout_data.clear();
    status_.outcome.stderr_data.clear();
    st = status_;
    st.running = false;
    for (int i = 0; i < 2; ++i) {
      st.totals[i] = rings_[i].total();
      st.first_offsets[i] = rings_[i].first_offset();
    }
  }
  // The exit is audited before it is seen as finished: a caller whose wait
  // returned (or who saw it not running) finds it in the audit log.
  if (on_exit_) on_exit_(st);
  {
    std::lock_guard<std::mutex> l(mu_);
    finished_ = true;
  }
  cv_.notify_all();
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
