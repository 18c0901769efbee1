#include "runtime/microvm/changes.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/file_util.h"
#include "common/rollback.h"
#include "image/layer_tree.h"
#include "image/tar_extract.h"
#include "runtime/microvm/protocol_calls.h"

namespace warren::runtime::microvm {

Status ExportChangesOverChannel(const std::string& sandbox_id, ChannelSource channel,
                                std::chrono::milliseconds call_timeout, uint64_t max_tar_bytes,
                                const std::string& dst_dir, const ExportOptions& options) {
  const std::string tar = dst_dir + ".tar";
  const std::string scratch = dst_dir + ".x";
  // The scratch goes whatever happens (never committed); dst_dir is made
  // last, by CopyDiffTree, which removes it on its own failure.
  Rollback cleanup;
  cleanup.Add([&] {
    ::unlink(tar.c_str());
    if (::access(scratch.c_str(), F_OK) == 0) (void)RemoveTree(scratch);
  });
  {
    UniqueFd out(::open(tar.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!out.valid()) return ErrnoToStatus(errno, "open(" + tar + ")");
    ASSIGN_OR_RETURN(std::unique_ptr<FileReader> in, OpenChangesStream(std::move(channel), call_timeout, true));
    uint64_t total = 0;
    while (true) {
      ASSIGN_OR_RETURN(std::string chunk, in->Read(proto::kMaxChunk));
      if (chunk.empty()) break;
      total += chunk.size();
      if (total > max_tar_bytes) {
        return absl::ResourceExhaustedError("sandbox " + sandbox_id + ": its changes exceed " +
                                            std::to_string(max_tar_bytes) + " bytes of tar (more than its disk holds)");
      }
      RETURN_IF_ERROR(WriteAll(out.get(), chunk, tar));
    }
  }
  if (::mkdir(scratch.c_str(), 0700) != 0) return ErrnoToStatus(errno, "mkdir(" + scratch + ")");
  Status x = image::ExtractTar(tar, scratch);
  if (!x.ok()) {
    return Status(x.code(), "sandbox " + sandbox_id + ": the guest's changes: " + std::string(x.message()));
  }
  ::unlink(tar.c_str());
  UniqueFd root(::open(scratch.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!root.valid()) return ErrnoToStatus(errno, "open(" + scratch + ")");
  image::DiffCopyOptions copy;
  copy.exclude = options.exclude;
  copy.budget = options.budget;
  return image::CopyDiffTree(root.get(), dst_dir, copy);
}

}  // namespace warren::runtime::microvm
