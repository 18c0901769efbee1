// Reading a sandbox's overlay upper dir for snapshots (pack_diff) and grading
// (DESIGN.md §5). The upper is read through a directory fd handed out by the
// backend (Sandbox::OpenUpper); nothing here follows a symlink found in it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace warren::node {

struct UpperCopyOptions {
  // Ids in [host_root_id, host_root_id + id_range) become id - host_root_id
  // (the ids seen inside the sandbox); other ids become 65534. id_range 0:
  // ids are copied unchanged.
  uint32_t host_root_id = 0;
  uint32_t id_range = 0;
  // fnmatch(3) patterns WITHOUT FNM_PATHNAME ('*' also matches '/'), matched
  // against the absolute path inside the sandbox ("/w/answers.txt"); a match
  // drops the entry and its whole subtree. A pattern ending in "/" is taken
  // without it.
  std::vector<std::string> exclude;
};

// Copies the upper tree at `src_dir_fd` into the new directory `dst` (must
// not exist; its parent must): regular files, dirs, symlinks, hardlinks
// (kept as hardlinks), overlay whiteouts (0:0 char devices) and other
// special files, modes, owners (shifted), mtimes and xattrs. Of the
// trusted.overlay.* xattrs only opaque/whiteout markers are kept (origin,
// impure, ... refer to the upper's own file system). Depth bounded at 256.
// On error `dst` is removed.
Status CopyUpperTree(int src_dir_fd, const std::string& dst, const UpperCopyOptions& options);

// True when the upper changes `path` (absolute, inside): the path or something
// below it is in the upper, or one of its ancestors is replaced there (a
// non-directory, a whiteout, or an opaque directory).
bool UpperTouches(int upper_dir_fd, const std::string& path);

// Restores `path` (absolute, inside) in a copied upper tree `dst` to the
// state of the pristine layers `lower_dirs` (bottom first, host mount paths):
// what `dst` holds at `path` is replaced by a copy from the topmost lower that
// has it (lowers hold ids as seen inside: copied unchanged); when no lower has
// it, `path` is left absent. Ancestors that `dst` replaced (whiteout or
// non-directory) become opaque directories so the restored entry is visible.
Status RestoreFromLowers(const std::string& dst, const std::string& path,
                         const std::vector<std::string>& lower_dirs);

// Matches `inside_path` against the patterns like UpperCopyOptions::exclude.
bool PathExcluded(const std::string& inside_path, const std::vector<std::string>& patterns);

}  // namespace warren::node
