// The guest agent's file calls (kFileRequest, runtime/microvm/
// protocol_calls.h): the container backend's SandboxFiles (runtime/
// container/rooted_files.h) over the guest's root, so paths resolve the same
// way (openat2 RESOLVE_IN_ROOT: ".." stops at "/", symlinks stay inside) and
// errors carry the same codes and errno. Writers and readers live between
// calls as numbered handles; a disconnect drops them (an uncommitted
// writer's temporary file goes with it).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/backend.h"
#include "runtime/microvm/protocol_calls.h"

namespace warren::guest {

class FileService {
 public:
  FileService();
  ~FileService();
  // Serves one request: the reply's frame type (kFileReply or kError) and
  // payload.
  std::pair<runtime::microvm::proto::FrameType, std::string> Handle(std::string_view payload);
  // The host went away: every handle is dropped.
  void Reset();

 private:
  StatusOr<runtime::microvm::proto::FileReply> Serve(const runtime::microvm::proto::FileRequest& req);

  std::unique_ptr<runtime::SandboxFiles> files_;
  std::map<uint64_t, std::unique_ptr<runtime::FileWriter>> writers_;
  std::map<uint64_t, std::unique_ptr<runtime::FileReader>> readers_;
  uint64_t next_handle_ = 1;
  // The last listing, for the batches after the first (List asks again
  // from an offset while `more`).
  std::string listed_path_;
  std::vector<runtime::FileInfo> listed_;
};

}  // namespace warren::guest
