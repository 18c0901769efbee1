// EROFS image building (mkfs.erofs) and mounting (new mount API).
#pragma once

#include <string>

#include "common/status.h"
#include "common/unique_fd.h"

namespace warren::image {

// Runs mkfs.erofs (posix_spawn; safe in a multithreaded process) to build
// `image` from `src_dir`, keeping owners, modes, per-file mtimes, xattrs,
// hardlinks and device nodes. The same tree gives a byte-identical image
// (fixed UUID and build time). On failure the error carries mkfs.erofs's
// stderr; `image` may be left for the caller to remove.
// chunked: files are chunk-based with 4 KiB chunks (--chunksize), so holes
// in the source stay holes in the image (the index costs 4 bytes per 4 KiB
// of file size) and the metadata comes first (erofs_layout.h); the plain
// format writes every file densely and packs small files' tails with the
// metadata.
// from_sandbox: the image carries another fixed UUID, so a tree copied from
// a sandbox never gives the digest of a layer built by the operator (the
// store's trust mark, LayerInfo::from_sandbox, is per digest).
Status MkfsErofs(const std::string& image, const std::string& src_dir, bool chunked = false, bool from_sandbox = false);

enum class ErofsSource { kAuto, kFile, kLoop };

// Mounts the EROFS image file `image` read-only, nodev, nosuid and returns
// the detached mount (fsmount fd): attach it with move_mount, or walk it
// through the fd; closing an unattached mount fd unmounts it. kFile mounts the
// file directly (fsconfig source=<file>), kLoop through a loop device set up
// with LOOP_CONFIGURE and autoclear (freed when the mount goes away), kAuto
// picks kFile when ErofsFileBackedSupported().
StatusOr<UniqueFd> MountErofs(const std::string& image, ErofsSource how = ErofsSource::kAuto);

// Probed once: the kernel accepts a regular file as the EROFS source.
bool ErofsFileBackedSupported();

}  // namespace warren::image
