// Whole-buffer reads and writes on file descriptors and small files, and
// directory paths, with errors that carry errno and name the call and the
// file (`what`). EINTR is retried; short reads and writes continue until done.
//
// Thread-compatible: no shared state.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace warren {

// write(2) until all of `data` is written. Errors: "write(<what>)" with errno.
Status WriteAll(int fd, std::string_view data, std::string_view what);

// read(2) until EOF. Errors: "read(<what>)" with errno; OutOfRange once more
// than `max_bytes` would be read.
StatusOr<std::string> ReadAll(int fd, std::string_view what, size_t max_bytes = SIZE_MAX);

// read(2) until `len` bytes or EOF; returns the count (< len only at EOF).
StatusOr<size_t> ReadFull(int fd, char* buf, size_t len, std::string_view what);

// The whole of a small file (a /proc or /sys entry, a token file): open with
// O_CLOEXEC, read to EOF. Errors: "open(<path>)" / "read(<path>)" with
// errno; OutOfRange when longer than `max_bytes`.
StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes = 1 << 20);

// mkdir(2) of `path` and every missing parent, each with `mode`; existing
// ones are left as they are. Errors: "mkdir(<component>)" with errno.
Status MkdirAll(const std::string& path, mode_t mode);

// Removes `path` recursively without following symlinks and without crossing
// into other mounts (an entry on another device is an error, left in place).
// OK when `path` does not exist. Bounded by depth 4096 (FailedPrecondition).
Status RemoveTree(const std::string& path);

// Writes `data` to the EXISTING file `path` in one write(2) (a /proc or
// cgroup control file, where a split write would mean something else): not
// created, not truncated.
Status WriteFile(const std::string& path, std::string_view data);

// The directory part of `path`: "/a/b" -> "/a", "/a" -> "/", "a" -> ".".
std::string Dirname(const std::string& path);

}  // namespace warren
