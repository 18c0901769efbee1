// Process of a microvm sandbox (backend.h ProcessStarter): the guest agent
// runs the command (protocol_calls.h, kProcStart) and relays its stdio; here
// its streams become local fds as the node expects them: pipes (a unix
// socket pair standing in for the terminal's master with a PTY: stdin and
// stdout are dups of one end), and pidfd() an eventfd that turns readable
// once the guest reported the foreground's exit (or the channel broke: then
// the process counts as SIGKILLed). One relay thread per process moves bytes
// between those fds and the channel and acknowledges output once the
// node's pipe took it (the guest's credit, kProcWindow: host memory per
// process stays bounded, a slow reader blocks the guest process).
//
// pid() is the guest's pid. Signal/Resize may be called from any thread.
#pragma once

#include <memory>

#include "runtime/backend.h"
#include "runtime/microvm/channel.h"
#include "runtime/microvm/protocol.h"

namespace warren::runtime::microvm {

// Starts `request` (argv/shell, env, cwd, user already resolved against the
// sandbox's defaults) in the guest. Errors as Exec's (bad cwd/user: the
// guest's error). The Process keeps `channel` alive; once it closes (the
// sandbox suspended or destroyed) the process reads as ended.
StatusOr<std::unique_ptr<Process>> StartProcess(std::shared_ptr<AgentChannel> channel,
                                                const proto::ExecRequest& request, const StartOptions& options,
                                                std::chrono::milliseconds timeout);

}  // namespace warren::runtime::microvm
