// The sandbox's changes as a tar stream (FileOp::kOpenChanges of runtime/
// microvm/protocol_calls.h): what runtime::ChangeExporter (snapshot, fork,
// grade) takes from a microVM. The changes are the overlay's upper dir on
// the writable disk (boot.h), which no guest process can reach (it lies
// under the switched-away initramfs root); the agent keeps an fd of it.
//
// The stream is POSIX pax (ustar + an 'x' header per entry carrying path,
// linkpath, uid, gid, size, mtime with nanoseconds and SCHILY.xattr.*) in
// the OCI layer convention, the form image::ExtractTar reads: an overlay
// whiteout (char device 0:0) becomes an empty ".wh.<name>", an opaque dir
// (trusted.overlay.opaque=y) gets a ".wh..wh..opq" entry; other
// trusted.overlay.* and security.* xattrs are left out. Regular files with
// several links are one file and hardlinks to it; sockets are skipped (tar
// cannot hold them). Entries come parent first, generated as they are read
// (nothing is staged in the guest: a full disk can still be exported).
//
// While the reader is open the commands' cgroup (every exec and process) is
// frozen (cgroup v2 cgroup.freeze), so the tree does not change under the
// walk; the reader's destruction thaws it.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "runtime/backend.h"

namespace warren::guest {

// `upper_fd`: the upper dir (borrowed, must outlive the reader).
// `freeze_cgroup`: the cgroup to freeze while open ("" = none).
// Errors from Read: the entry's path and errno (FailedPrecondition for a
// path longer than a layer holds).
StatusOr<std::unique_ptr<runtime::FileReader>> OpenChangesTar(int upper_fd, const std::string& freeze_cgroup);

}  // namespace warren::guest
