// SandboxFiles of a microvm sandbox: every call is a kFileRequest to the
// guest agent (protocol_calls.h), which serves it with the container
// backend's rooted file code over the guest's root, so paths are confined
// and errors coded the same way. Data moves in chunks of at most kMaxChunk
// bytes per frame; a List is fetched in batches. Replies are untrusted: one
// that does not decode, or holds more than was asked for, breaks the channel
// (the sandbox fails, nothing else does).
//
// Thread-safe (calls run concurrently on the channel). Must not outlive the
// channel.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "runtime/backend.h"
#include "runtime/microvm/channel.h"

namespace warren::runtime::microvm {

// `timeout`: how long one request may take in the guest (a recursive remove
// of a large tree is one request).
// `channel` yields the sandbox's live channel for each call (an error while
// the VM is suspended or gone: that call fails with it).
using ChannelSource = std::function<StatusOr<std::shared_ptr<AgentChannel>>()>;
std::unique_ptr<SandboxFiles> NewMicrovmFiles(std::string sandbox_id, ChannelSource channel,
                                              std::chrono::milliseconds timeout);

// The guest's changes as a tar stream (FileOp::kOpenChanges): read until
// "" (the end of the archive, after which the guest dropped the handle).
// With `freeze` the guest's commands stay frozen until the end or until
// the reader is destroyed. The bytes are the guest's: untrusted.
StatusOr<std::unique_ptr<FileReader>> OpenChangesStream(ChannelSource channel, std::chrono::milliseconds timeout,
                                                        bool freeze);

}  // namespace warren::runtime::microvm
