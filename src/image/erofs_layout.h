// Where an EROFS image keeps its metadata (DESIGN.md §4, "metadata local"):
// the superblock, inodes, directories, xattrs, inline tails and chunk
// indexes, as opposed to regular files' data blocks. warren builds every
// layer chunk-based (MkfsErofs), and mkfs.erofs writes a chunk-based
// image as all of its metadata first, then the file data (the layout of its
// `--blobdev` split, in one file), so a node can keep a layer's metadata
// local by keeping the image's first `metadata_end` bytes.
//
// Format: the on-disk EROFS layout of linux/fs/erofs/erofs_fs.h (superblock
// at 1024, 32/64-byte inodes at meta_blkaddr + nid * 32, dirents of 12 bytes
// + names, chunk indexes of 4 or 8 bytes after the inode and its xattrs).
#pragma once

#include <cstdint>
#include <functional>

#include "common/status.h"

namespace warren::image {

struct ErofsLayout {
  uint32_t block_bytes = 0;           // the image's block size
  uint64_t image_bytes = 0;           // as given to ReadErofsLayout
  uint64_t metadata_end = 0;          // bytes: [0, metadata_end) ends at the first data block (the image's end if none)
  uint64_t metadata_bytes = 0;        // bytes of blocks that are not regular-file data (in the prefix or not)
  uint64_t stray_metadata_bytes = 0;  // of them, past metadata_end (0 for a chunk-based mkfs.erofs image)
  uint64_t inodes = 0;                // inodes reached from the root
};

// Reads [off, off + len) of the image into buf; returns the bytes read.
using ErofsReadFn = std::function<StatusOr<size_t>(uint64_t off, size_t len, char* buf)>;

// Walks the image of `image_bytes` bytes from its root directory. Reads
// only metadata (each block at most once; at most kMaxMetadataBytes of it).
// InvalidArgument naming what is wrong for a malformed image (bad magic, an
// inode or block past the end, a directory loop is tolerated: each inode is
// visited once), Unimplemented for a compressed layout (warren does not
// build those); the read function's error as is.
inline constexpr uint64_t kMaxErofsMetadataBytes = 256ull << 20;
StatusOr<ErofsLayout> ReadErofsLayout(const ErofsReadFn& read, uint64_t image_bytes);

}  // namespace warren::image
