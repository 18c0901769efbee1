// File-system helpers private to the layer store.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace warren::image {

// Lower-case hex sha256 of a file's contents (OpenSSL EVP).
StatusOr<std::string> Sha256File(const std::string& path);

// Writes `data` to `path` atomically: a temp file beside it, fsync, rename.
Status WriteFileAtomic(const std::string& path, const std::string& data);

// Creates `path` holding `data` only if it does not exist yet, atomically
// even across hosts sharing the directory (temp file + link(2)).
// AlreadyExists (errno EEXIST) if `path` exists.
Status CreateFileExclusive(const std::string& path, const std::string& data);

StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes = 1 << 20);

// mkdir -p (mode 0755 for created components).
Status MakeDirs(const std::string& path);

// Removes a tree without following symlinks and without leaving the file
// system of `path`. NotFound is not an error. Bounded by depth 4096.
Status RemoveTree(const std::string& path);

// A name unique across processes and hosts: "<host>-<pid>-<counter>-<rand>".
std::string UniqueSuffix();

// For a name ending in "-" + UniqueSuffix() (plus an optional ".ext"): true
// if it was made on this host by a process that no longer exists.
bool MadeByDeadLocalProcess(const std::string& name);

int64_t NowRealtimeNs();
int64_t NowMonotonicMs();

}  // namespace warren::image
