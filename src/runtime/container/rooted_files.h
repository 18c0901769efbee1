// SandboxFiles over a directory fd of the sandbox root as the sandbox sees it
// (/proc/<init>/root of the container). Every path is resolved with
// openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS): ".." stops at "/",
// symlinks planted inside resolve inside, never onto the host.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>

#include "runtime/backend.h"

namespace warren::runtime {

struct RootedFilesOptions {
  // Opens a fresh O_PATH|O_DIRECTORY fd of the sandbox root; called per
  // operation (cheap), so a destroyed sandbox makes calls fail with NotFound
  // / FailedPrecondition instead of touching a stale tree.
  std::function<StatusOr<UniqueFd>()> open_root;
  // Host uid/gid that new files and directories are chowned to (the
  // sandbox's root, as mapped by its user namespace), and the base used to
  // translate host owners back to in-sandbox ids in FileInfo.
  uid_t host_root_uid = 0;
  gid_t host_root_gid = 0;
  uint32_t id_range = 65536;
};

std::unique_ptr<SandboxFiles> NewRootedFiles(RootedFilesOptions options);

}  // namespace warren::runtime
