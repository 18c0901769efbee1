#include "runtime/microvm/channel.h"

#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/cord.h"

namespace warren::runtime::microvm {

namespace {

using proto::FrameType;

constexpr size_t kMaxResyncBytes = 1u << 20;
// A hello answered later than this after it was sent is repeated (Connect).
constexpr std::chrono::milliseconds kFreshHello{200};

int64_t RealtimeNs() {
  timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

uint64_t RandomU64() {
  uint64_t v = 0;
  while (v == 0) {
    if (::getrandom(&v, sizeof v, 0) != sizeof v) v = static_cast<uint64_t>(RealtimeNs());
  }
  return v;
}

// One connect(2) attempt; an invalid fd while the socket is not there yet.
StatusOr<UniqueFd> TryConnect(const std::string& path) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.size() >= sizeof sa.sun_path) return absl::InvalidArgumentError("socket path too long: " + path);
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, "socket(AF_UNIX)");
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    if (errno == ENOENT || errno == ECONNREFUSED || errno == EAGAIN) return UniqueFd();
    return ErrnoToStatus(errno, "connect(" + path + ")");
  }
  return fd;
}

Status SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "send(agent socket)");
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

struct AgentChannel::Call {
  std::condition_variable cv;
  uint64_t cap = 0;
  std::string out[2];
  uint64_t host_totals[2] = {0, 0};
  bool done = false;
  bool is_exec = true;
  uint16_t reply_type = 0;  // Request(): the frame type that answers it
  const Validator* valid = nullptr;
  std::string reply;
  std::shared_ptr<Stream> stream;  // OpenStream()
  proto::ExitResult exit;
  Status error;
};

AgentChannel::AgentChannel(std::string sandbox_id, UniqueFd fd)
    : sandbox_id_(std::move(sandbox_id)), fd_(std::move(fd)) {}

AgentChannel::~AgentChannel() { Close(); }

StatusOr<std::unique_ptr<AgentChannel>> AgentChannel::Connect(
    const std::string& sandbox_id, const std::string& socket_path, Clock::time_point deadline,
    const std::function<bool()>& alive, proto::HelloReply* reply, const proto::Hello& base_hello) {
  auto timed_out = [&] {
    return absl::DeadlineExceededError("sandbox " + sandbox_id +
                                       ": the guest agent did not answer within the boot timeout");
  };
  auto died = [&] { return absl::FailedPreconditionError("sandbox " + sandbox_id + ": QEMU exited during boot"); };
  UniqueFd fd;
  while (true) {
    ASSIGN_OR_RETURN(fd, TryConnect(socket_path));
    if (fd.valid()) break;
    if (!alive()) return died();
    if (Clock::now() >= deadline) return timed_out();
    ::usleep(5000);
  }
  proto::Hello hello = base_hello;
  std::unique_ptr<AgentChannel> ch;
  uint64_t hello_id = 0;
  for (int round = 0;; ++round) {
    hello_id = RandomU64();
    hello.realtime_ns = static_cast<uint64_t>(RealtimeNs());
    hello.seed.resize(32);
    if (::getrandom(hello.seed.data(), hello.seed.size(), 0) != static_cast<ssize_t>(hello.seed.size())) {
      hello.seed.clear();
    }
    const Clock::time_point sent = Clock::now();
    RETURN_IF_ERROR(SendAll(fd.get(), proto::EncodeFrame(FrameType::kHello, 0, hello_id, proto::Encode(hello))));

    // Read until the reply to this hello; what comes before it is what an
    // earlier connection left in flight.
    std::string buf;
    size_t at = std::string::npos;
    while (true) {
      at = proto::FindHelloReply(buf, hello_id);
      if (at != std::string::npos) break;
      if (buf.size() > kMaxResyncBytes) {
        return absl::UnavailableError("sandbox " + sandbox_id + ": the guest sent " + std::to_string(buf.size()) +
                                      " bytes without answering hello");
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return timed_out();
      pollfd p{fd.get(), POLLIN, 0};
      int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 100)));
      if (n < 0 && errno != EINTR) return ErrnoToStatus(errno, "poll(agent socket)");
      if (n <= 0) {
        if (!alive()) return died();
        continue;
      }
      char chunk[64 << 10];
      ssize_t r = ::recv(fd.get(), chunk, sizeof chunk, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return ErrnoToStatus(errno, "recv(agent socket)");
      if (r == 0) {
        if (!alive()) return died();
        return absl::UnavailableError("sandbox " + sandbox_id + ": the agent socket closed before hello");
      }
      buf.append(chunk, static_cast<size_t>(r));
    }
    ch.reset(new AgentChannel(sandbox_id, std::move(fd)));
    ch->decoder_.Feed(std::string_view(buf).substr(at));
    proto::Frame f;
    while (ch->decoder_.Next(&f) != proto::FrameDecoder::Result::kFrame) {
      if (!ch->decoder_.error().empty()) {
        return absl::UnavailableError("sandbox " + sandbox_id + ": bad hello reply: " + ch->decoder_.error());
      }
      // The header is there, its payload not yet: read on (bounded).
      pollfd p{ch->fd_.get(), POLLIN, 0};
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) return timed_out();
      char chunk[64 << 10];
      ssize_t r = ::recv(ch->fd_.get(), chunk, sizeof chunk, 0);
      if (r <= 0) return absl::UnavailableError("sandbox " + sandbox_id + ": the agent socket closed during hello");
      ch->decoder_.Feed(std::string_view(chunk, static_cast<size_t>(r)));
    }
    std::string why;
    if (!proto::Decode(f.payload, reply, &why)) {
      return absl::UnavailableError("sandbox " + sandbox_id + ": bad hello reply: " + why);
    }
    if (reply->version != proto::kVersion) {
      return absl::FailedPreconditionError("sandbox " + sandbox_id + ": guest agent speaks protocol version " +
                                           std::to_string(reply->version) + ", warrend " +
                                           std::to_string(proto::kVersion) + " (rebuild the initramfs)");
    }
    // A hello sent while the guest was still booting waited in the port and
    // set a clock as old as that wait: once more, now that the agent reads.
    // Frames after a reply cannot be lost: the agent sends only answers.
    // Not for a clone's hello (setup_root): its guest runs when the hello is
    // sent (RestoreClone waited for that) and the agent sets the clock on
    // receipt, before setting up its root: a late answer is that setup.
    if (round > 0 || base_hello.setup_root || Clock::now() - sent < kFreshHello) break;
    fd = std::move(ch->fd_);
    ch.reset();
    hello.setup_root = false;
  }
  ch->next_id_ = hello_id + 1;
  ch->reader_ = std::thread([c = ch.get()] { c->ReaderLoop(); });
  return ch;
}

void AgentChannel::Close() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return;
    closed_ = true;
    for (auto& [id, c] : calls_) c->cv.notify_all();
  }
  if (fd_.valid()) ::shutdown(fd_.get(), SHUT_RDWR);
  if (reader_.joinable()) reader_.join();
}

uint64_t AgentChannel::bytes_received() const {
  std::lock_guard<std::mutex> l(mu_);
  return received_;
}

void AgentChannel::Break(Status why) {
  std::lock_guard<std::mutex> l(mu_);
  if (broken_.ok()) broken_ = std::move(why);
  for (auto& [id, c] : calls_) {
    c->cv.notify_all();
    if (c->stream && c->stream->on_end) std::exchange(c->stream->on_end, nullptr)(broken_);
  }
}

void AgentChannel::ReaderLoop() {
  // The hello left bytes in the decoder: deliver them first.
  std::string chunk(64 << 10, '\0');
  while (true) {
    proto::Frame f;
    proto::FrameDecoder::Result r;
    while ((r = decoder_.Next(&f)) == proto::FrameDecoder::Result::kFrame) Deliver(f);
    if (r == proto::FrameDecoder::Result::kError) {
      return Break(
          absl::UnavailableError("sandbox " + sandbox_id_ + ": protocol violation by the guest: " + decoder_.error()));
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!broken_.ok()) return;
    }
    ssize_t n = ::recv(fd_.get(), chunk.data(), chunk.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      bool closing;
      {
        std::lock_guard<std::mutex> l(mu_);
        closing = closed_;
      }
      return Break(absl::UnavailableError("sandbox " + sandbox_id_ + ": the guest agent's channel " +
                                          (closing ? "was closed" : "ended (the VM died?)")));
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      received_ += static_cast<uint64_t>(n);
    }
    decoder_.Feed(std::string_view(chunk.data(), static_cast<size_t>(n)));
  }
}

void AgentChannel::Deliver(proto::Frame& f) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = calls_.find(f.id);
  if (it == calls_.end()) return;  // a call that gave up meanwhile
  Call& c = *it->second;
  if (c.done) return;
  std::string why;
  auto violation = [&](const std::string& what) {
    if (broken_.ok()) {
      broken_ = absl::UnavailableError("sandbox " + sandbox_id_ + ": protocol violation by the guest: " + what);
    }
    for (auto& [id, other] : calls_) {
      other->cv.notify_all();
      if (other->stream && other->stream->on_end) std::exchange(other->stream->on_end, nullptr)(broken_);
    }
  };
  if (c.stream) {
    if (!c.stream->sink(f, &why)) return violation(why);
    return;
  }
  if (c.reply_type != 0 && f.type != FrameType::kError) {
    if (static_cast<uint16_t>(f.type) != c.reply_type) {
      return violation("frame type " + std::to_string(static_cast<int>(f.type)) + " answers a request of type " +
                       std::to_string(c.reply_type));
    }
    if (c.valid && *c.valid && !(*c.valid)(f.payload, &why)) return violation(why);
    c.reply = std::move(f.payload);
    c.done = true;
    c.cv.notify_all();
    return;
  }
  switch (f.type) {
    case FrameType::kOutput: {
      if (!c.is_exec) return violation("output for a non-exec request");
      int s = f.flags == proto::kStreamStdout ? 0 : 1;
      c.host_totals[s] += f.payload.size();
      if (c.out[s].size() < c.cap)
        c.out[s].append(f.payload, 0, std::min<size_t>(f.payload.size(), c.cap - c.out[s].size()));
      return;
    }
    case FrameType::kExit:
      if (!c.is_exec) return violation("exit for a non-exec request");
      if (!proto::Decode(f.payload, &c.exit, &why)) return violation("exit: " + why);
      c.done = true;
      c.cv.notify_all();
      return;
    case FrameType::kPong:
      if (c.is_exec || c.reply_type != 0) return violation("pong for an exec");
      c.done = true;
      c.cv.notify_all();
      return;
    case FrameType::kError: {
      proto::ErrorReply e;
      if (!proto::Decode(f.payload, &e, &why)) return violation("error reply: " + why);
      std::string msg = "sandbox " + sandbox_id_ + ": " + e.message;
      if (c.reply_type != 0) {
        // File calls: the guest's code and message as they are (the message
        // names the path and errno), errno kept like ErrnoToStatus does.
        c.error = Status(static_cast<absl::StatusCode>(e.code), msg);
        if (e.err != 0) c.error.SetPayload("warren.errno", absl::Cord(std::to_string(e.err)));
      } else {
        c.error = e.err != 0 ? ErrnoToStatus(static_cast<int>(e.err), msg)
                             : Status(static_cast<absl::StatusCode>(e.code), msg);
      }
      c.done = true;
      c.cv.notify_all();
      return;
    }
    default: return violation("unexpected frame type " + std::to_string(static_cast<int>(f.type)));
  }
}

Status AgentChannel::Send(FrameType type, uint64_t id, std::string_view payload) {
  return SendFrame(type, 0, id, payload);
}

Status AgentChannel::SendFrame(FrameType type, uint16_t flags, uint64_t id, std::string_view payload) {
  std::lock_guard<std::mutex> l(send_mu_);
  return SendAll(fd_.get(), proto::EncodeFrame(type, flags, id, payload));
}

StatusOr<std::string> AgentChannel::Request(FrameType type, std::string_view payload, FrameType reply_type,
                                            std::chrono::milliseconds timeout, const Validator& valid) {
  uint64_t id;
  std::shared_ptr<Call> c = NewCall(&id);
  c->is_exec = false;
  c->reply_type = static_cast<uint16_t>(reply_type);
  c->valid = &valid;  // lives until EndCall
  struct End {
    AgentChannel* ch;
    uint64_t id;
    ~End() { ch->EndCall(id); }
  } end{this, id};
  Status s = Send(type, id, payload);
  std::unique_lock<std::mutex> l(mu_);
  auto ready = [&] { return c->done || closed_ || !broken_.ok(); };
  if (!s.ok() && broken_.ok() && !closed_) {
    return Status(s.code(), "sandbox " + sandbox_id_ + ": sending a request: " + std::string(s.message()));
  }
  if (!c->cv.wait_for(l, timeout, ready)) {
    return absl::DeadlineExceededError("sandbox " + sandbox_id_ + ": the guest agent did not answer within " +
                                       std::to_string(timeout.count()) + " ms");
  }
  if (!c->done) {
    if (!broken_.ok()) return broken_;
    return absl::UnavailableError("sandbox " + sandbox_id_ + ": the sandbox was destroyed");
  }
  if (!c->error.ok()) return c->error;
  return std::move(c->reply);
}

StatusOr<uint64_t> AgentChannel::OpenStream(Stream stream) {
  uint64_t id;
  std::shared_ptr<Call> c = NewCall(&id);
  c->is_exec = false;
  c->stream = std::make_shared<Stream>(std::move(stream));
  std::lock_guard<std::mutex> l(mu_);
  if (!broken_.ok() || closed_) {
    calls_.erase(id);
    if (!broken_.ok()) return broken_;
    return absl::UnavailableError("sandbox " + sandbox_id_ + ": the sandbox was destroyed");
  }
  return id;
}

void AgentChannel::CloseStream(uint64_t id) { EndCall(id); }

std::shared_ptr<AgentChannel::Call> AgentChannel::NewCall(uint64_t* id) {
  auto c = std::make_shared<Call>();
  std::lock_guard<std::mutex> l(mu_);
  *id = next_id_++;
  calls_[*id] = c;
  return c;
}

void AgentChannel::EndCall(uint64_t id) {
  std::lock_guard<std::mutex> l(mu_);
  calls_.erase(id);
}

StatusOr<ExecOutcome> AgentChannel::Exec(const proto::ExecRequest& request, std::string_view stdin_data,
                                         std::chrono::milliseconds wait_bound) {
  uint64_t id;
  std::shared_ptr<Call> c = NewCall(&id);
  c->cap = request.output_cap;
  struct End {
    AgentChannel* ch;
    uint64_t id;
    ~End() { ch->EndCall(id); }
  } end{this, id};
  auto start = Clock::now();
  Status s = Send(FrameType::kExec, id, proto::Encode(request));
  for (size_t off = 0; s.ok() && request.stdin_follows; off += proto::kMaxChunk) {
    std::string_view part = stdin_data.substr(std::min(off, stdin_data.size()), proto::kMaxChunk);
    s = Send(FrameType::kStdin, id, part);
    if (part.empty()) break;
  }
  std::unique_lock<std::mutex> l(mu_);
  auto ready = [&] { return c->done || closed_ || !broken_.ok(); };
  if (!s.ok() && broken_.ok() && !closed_) {
    return Status(s.code(), "sandbox " + sandbox_id_ + ": sending the command: " + std::string(s.message()));
  }
  if (wait_bound.count() > 0) {
    if (!c->cv.wait_for(l, wait_bound, ready)) {
      return absl::DeadlineExceededError("sandbox " + sandbox_id_ + ": the guest agent did not finish the command " +
                                         std::to_string(wait_bound.count()) + " ms after its timeout");
    }
  } else {
    c->cv.wait(l, ready);
  }
  ExecOutcome out;
  out.duration = Clock::now() - start;
  if (!c->done) {
    if (closed_) {  // destroyed meanwhile
      out.signal = SIGKILL;
      out.exit_code = 128 + SIGKILL;
      return out;
    }
    return broken_;
  }
  if (!c->error.ok()) return c->error;
  out.exit_code = static_cast<int>(c->exit.exit_code);
  out.signal = static_cast<int>(c->exit.signal);
  out.timed_out = c->exit.timed_out;
  out.oom_killed = c->exit.oom_killed;
  out.stdout_data = std::move(c->out[0]);
  out.stderr_data = std::move(c->out[1]);
  // The guest's totals, but never below what the host saw.
  out.stdout_total = std::max(c->exit.stdout_total, c->host_totals[0]);
  out.stderr_total = std::max(c->exit.stderr_total, c->host_totals[1]);
  out.stdout_truncated = out.stdout_total > out.stdout_data.size();
  out.stderr_truncated = out.stderr_total > out.stderr_data.size();
  return out;
}

Status AgentChannel::Ping(std::chrono::milliseconds timeout) {
  uint64_t id;
  std::shared_ptr<Call> c = NewCall(&id);
  c->is_exec = false;
  struct End {
    AgentChannel* ch;
    uint64_t id;
    ~End() { ch->EndCall(id); }
  } end{this, id};
  RETURN_IF_ERROR(Send(FrameType::kPing, id, ""));
  std::unique_lock<std::mutex> l(mu_);
  if (!c->cv.wait_for(l, timeout, [&] { return c->done || closed_ || !broken_.ok(); })) {
    return absl::DeadlineExceededError("sandbox " + sandbox_id_ + ": no pong within " +
                                       std::to_string(timeout.count()) + " ms");
  }
  if (!broken_.ok()) return broken_;
  if (!c->done) return absl::UnavailableError("sandbox " + sandbox_id_ + ": channel closed");
  return c->error;
}

}  // namespace warren::runtime::microvm
