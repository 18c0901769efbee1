// Safe tar extraction into a layer staging directory.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"

namespace warren::image {

// Extracts the tar at `tar_path` (plain, gzip, xz, zstd, ... via libarchive)
// into the existing empty directory `dest`, creating every entry with
// openat-family calls relative to fds of directories already inside `dest`
// (never through a symlink, never outside `dest`). Keeps numeric owners,
// modes (incl. setuid), mtimes, xattrs, hardlinks, symlinks (any target) and
// fifos. OCI whiteouts: "d/.wh.x" becomes the overlayfs whiteout "d/x" (char
// device 0:0) and "d/.wh..wh..opq" sets trusted.overlay.opaque=y on "d".
// A "./" entry sets the metadata of `dest` itself.
// InvalidArgument naming the entry for: absolute paths, ".." components, a
// path through a symlink or a non-directory, hardlinks to missing or outside
// targets, char/block devices, an unreadable or truncated archive. On error
// `dest` holds a partial tree that the caller removes.
// `progress` (optional) is called with the bytes of the tar file read so far
// (as stored, i.e. compressed) after each entry and every few MiB of a
// file's data; returning false stops the extraction (Cancelled).
// Sparse files: the holes of a sparse entry (GNU or pax sparse) and every
// 4 KiB-aligned block of zeros in a file's data (the usual form of a sparse
// file in an image layer: Docker's and umoci's tar writers store holes as
// zeros) stay holes in `dest`, never written; `*sparse` (optional) is set
// when some file got a hole.
using TarProgressFn = std::function<bool(uint64_t bytes_read)>;
Status ExtractTar(const std::string& tar_path, const std::string& dest, const TarProgressFn& progress = nullptr,
                  bool* sparse = nullptr);

}  // namespace warren::image
