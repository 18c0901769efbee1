// ChangeExporter of a microvm sandbox (runtime/backend.h): the guest agent
// streams its overlay's upper dir as a tar (src/guest/agent/changes.h, the
// commands frozen in the guest meanwhile); the host bounds it, extracts it
// with image::ExtractTar (the untrusted-archive path of image imports: no
// entry outside the dir, no devices) and copies the result into the layer
// format with image::CopyDiffTree (the exclude patterns, the copy budget and
// the xattr filter every backend's changes go through).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "runtime/backend.h"
#include "runtime/microvm/files.h"

namespace warren::runtime::microvm {

// Writes the changes into the new dir `dst_dir` (its parent must exist);
// `<dst_dir>.tar` and `<dst_dir>.x` beside it are scratch, removed before
// returning. `max_tar_bytes` bounds what the guest may send
// (ResourceExhausted naming the sandbox). On error nothing is left.
Status ExportChangesOverChannel(const std::string& sandbox_id, ChannelSource channel,
                                std::chrono::milliseconds call_timeout, uint64_t max_tar_bytes,
                                const std::string& dst_dir, const ExportOptions& options);

// What a guest's tar of its changes may hold for a writable disk of
// `disk_mb`: the data, plus the headers of as many entries as its ext4 has
// inodes (one per 4 KiB at most, ~1.5 KiB of headers each), plus slack.
constexpr uint64_t MaxChangesTarBytes(uint32_t disk_mb) {
  const uint64_t disk = uint64_t{disk_mb} << 20;
  return disk + disk / 2 + (64u << 20);
}

}  // namespace warren::runtime::microvm
