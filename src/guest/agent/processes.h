// The guest agent's long-running processes (kProcStart and the frames after
// it, runtime/microvm/protocol_calls.h): background processes, streaming
// exec and PTYs of the node, relayed over the channel. Each runs like an
// exec (its own cgroup under /sys/fs/cgroup/warren, a new session), with
// stdio as pipes or a pty of the guest's devpts (stdin and stdout the
// terminal, stderr folded in), fd 3 a pipe when asked. Output is forwarded
// within a credit of kProcWindow bytes per stream: a stream whose credit is
// used up is not read until the host acks, so a slow reader blocks the
// process, not the agent or the host. The host is told once the foreground
// was reaped (kProcExit) and once the whole tree is gone (kProcTreeEmpty).
// Released processes keep running; their cgroup is removed once empty.
//
// Single-threaded: driven by the agent's poll loop.
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/microvm/protocol_calls.h"

namespace warren::guest {

class Processes {
 public:
  using SendFn =
      std::function<void(runtime::microvm::proto::FrameType, uint16_t flags, uint64_t id, std::string_view payload)>;
  // `ready`: the empty string when commands may start, else why not.
  Processes(SendFn send, std::function<std::string()> ready);
  ~Processes();

  // kProcStart, kProcStdin, kProcAck, kProcSignal, kProcResize, kProcRelease.
  void Handle(const runtime::microvm::proto::Frame& f);
  // Adds the fds to poll to `fds`; OnPoll takes the same vector back with
  // revents, from index `first` (what AddPollFds appended).
  void AddPollFds(std::vector<pollfd>* fds);
  void OnPoll(const std::vector<pollfd>& fds, size_t first);
  // A reaped child: true when it was one of these processes.
  bool OnReaped(pid_t pid, int status);
  // The host went away: every process counts as released.
  void Disconnected();

 private:
  struct Proc;
  void Start(const runtime::microvm::proto::Frame& f);
  void Pump(Proc& p, int stream);
  void FeedStdin(Proc& p);
  void Progress();

  SendFn send_;
  std::function<std::string()> ready_;
  std::map<uint64_t, std::unique_ptr<Proc>> procs_;
  // Per AddPollFds entry: the process id and what (0 stdin, 1..3 stream, 4 events).
  std::vector<std::pair<uint64_t, int>> polled_;
};

}  // namespace warren::guest
