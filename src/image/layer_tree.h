// warren's LAYER FORMAT and the tree code that reads and writes it.
//
// A "diff" (the changes of a sandbox, or a layer a snapshot made) is a
// directory tree in the overlayfs diff convention, the one containerd's
// overlay snapshotter and composefs use, and the one every warren layer is
// mounted with:
//  * a deleted entry is a WHITEOUT: a character device 0:0 of that name;
//  * a directory deleted and recreated is OPAQUE: xattr
//    trusted.overlay.opaque = "y" (nothing of the layers below shows there);
//  * owners are the ids AS SEEN INSIDE the sandbox (root = 0), never host
//    ids; an id outside the sandbox's range is 65534;
//  * of the trusted.overlay.* xattrs only the opaque/whiteout markers are
//    kept (origin, impure, ... describe one upper's own file system);
//    security.* xattrs are dropped (see KeepXattr in layer_tree.cc); other
//    xattrs, modes, mtimes, symlinks (never followed), hardlinks (kept as
//    hardlinks), holes of sparse files and special files are kept;
//  * every path is shorter than PATH_MAX with the staging dir (mkfs.erofs).
// A backend yields a sandbox's changes in this form (runtime::ChangeExporter);
// the node builds layers from it (snapshot) and grades on it.
//
// Everything here walks diffs and pristine layers through directory fds, one
// component at a time with O_NOFOLLOW: no name found in a diff or a layer is
// ever resolved on the host, and a symlink is copied as a symlink, never
// followed. Walks are iterative (no recursion, no fixed depth limit); the
// only bound on depth is the path length the layer builder takes (PATH_MAX,
// mkfs.erofs), reported as FailedPrecondition naming the path.
//
// Copies keep holes (SEEK_DATA/SEEK_HOLE): a sparse file is written sparse.
// What a copy may write is bounded by a CopyBudget: ResourceExhausted naming
// the sandbox, the size and the limit.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace warren::image {

// Bytes a copy may write into staging (and from there into a layer). Every
// entry costs kEntryCost plus its name and xattrs; a regular file also costs
// its data (holes excluded, rounded up to 4 KiB) plus size/kHoleDivisor: the
// chunk index of a chunk-based EROFS file is size/1024, and the layer
// builder (mkfs.erofs 1.5) reads and hashes holes like data, so a hole's
// share bounds that time by the sandbox's limit too. Not thread-safe (one
// per copy); the node-wide counter is shared and atomic.
class CopyBudget {
 public:
  static constexpr uint64_t kEntryCost = 256;
  static constexpr uint64_t kHoleDivisor = 16;
  // `what` names the sandbox in errors ("sandbox n0-abc"); limit 0 =
  // unbounded. node_used/node_limit (optional): bytes in flight node-wide.
  CopyBudget(std::string what, uint64_t limit, std::atomic<uint64_t>* node_used = nullptr, uint64_t node_limit = 0)
      : what_(std::move(what)), limit_(limit), node_used_(node_used), node_limit_(node_limit) {}
  ~CopyBudget() { ReleaseNode(); }
  CopyBudget(const CopyBudget&) = delete;
  CopyBudget& operator=(const CopyBudget&) = delete;

  // ResourceExhausted once the total passes the sandbox's limit or the node's.
  Status Charge(uint64_t bytes);
  uint64_t used() const { return used_; }
  // The last failure was the node-wide cap (not the sandbox's own limit).
  bool node_cap_hit() const { return node_cap_hit_; }
  // Gives the bytes charged back to the node-wide counter (the staging is gone).
  void ReleaseNode();

 private:
  std::string what_;
  uint64_t limit_;
  std::atomic<uint64_t>* node_used_;
  uint64_t node_limit_;
  uint64_t used_ = 0;
  uint64_t node_charged_ = 0;
  bool node_cap_hit_ = false;
};

struct DiffCopyOptions {
  // Ids in [host_root_id, host_root_id + id_range) become id - host_root_id
  // (the ids seen inside the sandbox); other ids become 65534. id_range 0:
  // ids are copied unchanged (a diff in the layer format holds ids as seen
  // inside; only a backend reading its own id-mapped upper shifts).
  uint32_t host_root_id = 0;
  uint32_t id_range = 0;
  // fnmatch(3) patterns WITHOUT FNM_PATHNAME ('*' also matches '/'), matched
  // against the absolute path inside the sandbox ("/w/answers.txt"); a match
  // drops the entry and its whole subtree. A pattern ending in "/" is taken
  // without it.
  std::vector<std::string> exclude;
  CopyBudget* budget = nullptr;  // nullptr = unbounded
};

// Copies the diff at `src_dir_fd` into the new directory `dst` (must not
// exist; its parent must): regular files (sparse), dirs, symlinks, hardlinks
// (kept as hardlinks), overlay whiteouts (0:0 char devices) and other
// special files, modes, owners (shifted), mtimes and xattrs. Of the
// trusted.overlay.* xattrs only opaque/whiteout markers are kept (origin,
// impure, ... refer to the upper's own file system); security.* xattrs are
// dropped (see KeepXattr). On error `dst` is removed.
Status CopyDiffTree(int src_dir_fd, const std::string& dst, const DiffCopyOptions& options);

// The agent's solution, for grading: copies from the diff `src_dir_fd` only
// what lies under the `solution` paths (absolute, inside) into the new
// directory `dst`, such that the diff layer built from `dst`, stacked on
// layers holding the rest, shows at each solution path what the diff shows
// there, and nothing of the diff anywhere else:
//  * ancestors of a solution path become plain (merging, never opaque) dirs
//    with the metadata of `pristine_fds` (layer roots, bottom first; 0755
//    root:root where no pristine layer has the dir);
//  * a solution path whose ancestor the diff deleted or replaced (whiteout,
//    non-directory, opaque dir) is copied opaque, or becomes a whiteout when
//    the diff has nothing there;
//  * `protected_paths` inside a solution path are not copied and their
//    ancestors below the solution path are not made opaque, so the layers
//    below show through there.
Status CopySolution(int src_dir_fd, const std::string& dst, const std::vector<std::string>& solution,
                    const std::vector<std::string>& protected_paths, const std::vector<int>& pristine_fds,
                    const DiffCopyOptions& options);

// Every change the diff makes outside the `solution` paths, as absolute
// inside paths, sorted: every non-directory entry (added, modified or
// metadata-changed files, symlinks, devices; whiteouts = deletions), every
// opaque directory (deleted and recreated), every directory that no pristine
// layer has or whose mode or owner differs from the pristine one. A new or
// opaque directory stands for its whole subtree (not descended) unless a
// solution path lies below it. At most `max` paths (`*truncated` set when
// more exist).
Status ListChanges(int src_dir_fd, const std::vector<std::string>& solution, const std::vector<int>& pristine_fds,
                   const DiffCopyOptions& options, size_t max, std::vector<std::string>* out, bool* truncated);

// True when the diff changes `path` (absolute, inside): the path or something
// below it is in the diff, or one of its ancestors is replaced there (a
// non-directory, a whiteout, or an opaque directory).
bool DiffTouches(int upper_dir_fd, const std::string& path);

// Matches `inside_path` against the patterns like DiffCopyOptions::exclude.
bool PathExcluded(const std::string& inside_path, const std::vector<std::string>& patterns);

// `path` equals `prefix` or lies below it (both absolute, normalized).
bool PathWithin(const std::string& path, const std::string& prefix);

}  // namespace warren::image
