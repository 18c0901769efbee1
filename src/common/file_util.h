// File helpers every room shares. Errors name the syscall and the path and
// keep errno (common/status.h).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace warren {

// Removes `path` recursively without following symlinks and without crossing
// into other mounts (an entry on another device is an error, left in place).
// OK when `path` does not exist. Bounded by depth 4096 (FailedPrecondition).
Status RemoveTree(const std::string& path);

// The whole file at `path` (a /proc or /sys file, a small config file): read
// until EOF, at most `max_bytes` (more: FailedPrecondition naming the path).
StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes = 1 << 20);

// Writes all of `data` to `fd` (retrying short writes and EINTR); `what`
// names the file in errors.
Status WriteAll(int fd, std::string_view data, const std::string& what);

// Writes `data` to the EXISTING file `path` in one write(2) (a /proc or
// cgroup control file, where a split write would mean something else): not
// created, not truncated.
Status WriteFile(const std::string& path, std::string_view data);

// read(2) until EOF; `what` names the file in errors. More than `max_bytes`:
// FailedPrecondition.
StatusOr<std::string> ReadAll(int fd, const std::string& what, size_t max_bytes = SIZE_MAX);

// read(2) until `len` bytes or EOF; returns the count (< len only at EOF).
StatusOr<size_t> ReadFull(int fd, char* buf, size_t len, const std::string& what);

// mkdir(2) of `path` and every missing parent, each with `mode`; existing
// ones are left as they are. Errors: "mkdir(<component>)" with errno.
Status MkdirAll(const std::string& path, mode_t mode);

// The directory part of `path`: "/a/b" -> "/a", "/a" -> "/", "a" -> ".".
std::string Dirname(const std::string& path);

}  // namespace warren
