// The host end of a guest agent's channel (protocol.h): a unix stream socket
// that QEMU's virtio-serial chardev listens on, one connection per daemon
// lifetime. A reader thread decodes the guest's frames and hands them to the
// call waiting for their request id; calls run concurrently.
//
// Trust: every frame is untrusted. A frame the decoder rejects (oversized,
// unknown type, bad flags), a malformed reply or EOF BREAKS the channel:
// every pending and later call fails with Unavailable naming the sandbox
// and the violation; nothing else is affected (one channel per sandbox, no
// shared state). Output beyond a call's cap is dropped on the host too,
// whatever the guest sends; frames for unknown ids are dropped.
//
// Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/status.h"
#include "common/unique_fd.h"
#include "runtime/backend.h"
#include "runtime/microvm/protocol.h"

namespace warren::runtime::microvm {

class AgentChannel {
 public:
  using Clock = std::chrono::steady_clock;

  // Connects to the socket at `socket_path` (retrying while QEMU has not
  // created it), says kHello and waits for the agent's kHelloReply, until
  // `deadline`. `alive` is polled between attempts: false (QEMU exited)
  // ends the wait with FailedPrecondition. DeadlineExceeded when the agent
  // did not answer in time. `hello`'s setup fields are sent as given; its
  // clock and seed are filled in here, right before sending.
  static StatusOr<std::unique_ptr<AgentChannel>> Connect(const std::string& sandbox_id, const std::string& socket_path,
                                                         Clock::time_point deadline, const std::function<bool()>& alive,
                                                         proto::HelloReply* reply,
                                                         const proto::Hello& hello = proto::Hello{});
  ~AgentChannel();  // Close()s

  // Runs one command: sends kExec (+ stdin), collects kOutput up to
  // `cap` bytes per stream, returns at kExit. The guest enforces the
  // timeout; the host waits at most `wait_bound` (0 = unbounded) beyond
  // which the guest is deemed hung (DeadlineExceeded). A kError reply is
  // returned as its Status (errno kept). After Close(): an outcome with
  // signal = SIGKILL (the sandbox was destroyed).
  StatusOr<ExecOutcome> Exec(const proto::ExecRequest& request, std::string_view stdin_data,
                             std::chrono::milliseconds wait_bound);

  // Round trip of kPing; DeadlineExceeded past `timeout`.
  Status Ping(std::chrono::milliseconds timeout);

  // A request answered by one frame of `reply_type` (or kError, returned as
  // its Status): the reply's payload. `valid` (if set) checks the payload
  // on delivery: false (with *why) is a protocol violation that breaks the
  // channel. DeadlineExceeded past `timeout`; Unavailable once the channel
  // broke or closed.
  using Validator = std::function<bool(std::string_view payload, std::string* why)>;
  StatusOr<std::string> Request(proto::FrameType type, std::string_view payload, proto::FrameType reply_type,
                                std::chrono::milliseconds timeout, const Validator& valid = nullptr);

  // Frames under one id for as long as the stream is open (a process,
  // protocol_calls.h). `sink` gets every guest frame for it, on the reader
  // thread, under the channel's lock: it must not call into the channel;
  // false (with *why) is a protocol violation. `on_end` gets why the
  // channel broke or closed, once. Unavailable when it already has.
  struct Stream {
    std::function<bool(proto::Frame& frame, std::string* why)> sink;
    std::function<void(const Status& why)> on_end;
  };
  StatusOr<uint64_t> OpenStream(Stream stream);
  void CloseStream(uint64_t id);  // no more frames to its sink after return
  Status SendFrame(proto::FrameType type, uint16_t flags, uint64_t id, std::string_view payload);

  const std::string& sandbox_id() const { return sandbox_id_; }

  // Shuts the socket down, joins the reader; pending calls end (see Exec).
  void Close();

  // Bytes fed to the decoder so far (tests, diagnostics).
  uint64_t bytes_received() const;

 private:
  struct Call;
  AgentChannel(std::string sandbox_id, UniqueFd fd);
  void ReaderLoop();
  void Deliver(proto::Frame& frame);
  void Break(Status why);
  Status Send(proto::FrameType type, uint64_t id, std::string_view payload);
  std::shared_ptr<Call> NewCall(uint64_t* id);
  void EndCall(uint64_t id);

  const std::string sandbox_id_;
  UniqueFd fd_;
  std::mutex send_mu_;  // one frame at a time on the socket
  mutable std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<Call>> calls_;
  Status broken_;  // first error that broke the channel
  bool closed_ = false;
  uint64_t next_id_ = 1;
  uint64_t received_ = 0;
  proto::FrameDecoder decoder_;  // reader thread only
  std::thread reader_;
};

}  // namespace warren::runtime::microvm
