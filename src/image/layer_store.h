// Layer store (DESIGN.md §4): read-only EROFS layers addressed by the sha256
// of their image file and named "kind/name@version" (kind in base, workspace,
// toolset). The store is a plain directory that may live on a shared or
// distributed file system; several nodes may read it.
//
// Layout under the store dir:
//   blobs/sha256/<hex>          the EROFS image (immutable once renamed in)
//   names/<kind>/<name>/<ver>   text file holding "sha256:<hex>\n"
//   meta/<hex>.json             {name, size, created_at_ns}
//   meta/<hex>.sandbox          present: built from a sandbox's contents
//   meta/<hex>.projects         the projects owning it, one path a line (a
//                               snapshot of a project's sandbox); absent: every
//                               project's (see LayerInfo::projects)
//   tmp/                        builds in progress (removed on failure)
//
// Thread-safe.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "image/tar_extract.h"

namespace warren::image {

enum class LayerKind { kBase, kWorkspace, kToolset };

struct LayerName {
  LayerKind kind;
  std::string name;     // [a-z0-9][a-z0-9._-]{0,127}; one path segment (no '/')
  std::string version;  // [A-Za-z0-9][A-Za-z0-9._+-]{0,63}; empty = newest (lookups only)
  // Parses "kind/name" or "kind/name@version". InvalidArgument naming the
  // offending part otherwise.
  static StatusOr<LayerName> Parse(std::string_view s);
  std::string ToString() const;  // "kind/name@version" (or "kind/name")
};

struct LayerInfo {
  std::string digest;  // "sha256:<64 hex>"
  std::string name;    // "kind/name@version"; empty for an unnamed layer
  uint64_t size_bytes = 0;
  int64_t created_at_ns = 0;
  // Built from a sandbox's contents (a snapshot or a grade layer): never a
  // pristine layer (see SandboxManager::Grade). Sticky per digest: once a
  // sandbox produced these bytes, every name of them is marked.
  bool from_sandbox = false;
  // The projects that own these bytes (snapshots and forks of their
  // sandboxes): only they, the projects above them and the cluster's
  // operators see and use the layer. Empty: every project's (layers the
  // operators built, and snapshots of sandboxes of no project). Per digest,
  // like from_sandbox; a digest that was every project's stays so.
  std::vector<std::string> projects{};
};

class LayerStore {
 public:
  // Opens (creating if needed) a store directory. Removes what builds of
  // this host that died (their pid is gone) left in tmp/; builds of other
  // hosts sharing the store are left alone.
  static StatusOr<std::unique_ptr<LayerStore>> Open(const std::string& dir);

  // Builds of this store from now on: every layer chunk-based (MkfsErofs
  // chunked: metadata first, holes and repeated 4 KiB blocks cost nothing;
  // what a read cache keeps local, read_cache.h) instead of only layers with
  // a sparse file and trees copied from sandboxes (the default).
  void set_chunked_layers(bool on) { chunked_layers_ = on; }

  // Builds an EROFS image (mkfs.erofs) from a host directory, verifies it
  // (mounted tree equals the source: names, modes, owners, sizes, contents,
  // symlinks, hardlinks, xattrs) and names it. The same content gives the
  // same digest. AlreadyExists if `name` (with version) already points at a
  // different digest; InvalidArgument if `name` has no version. The tree
  // must not change while it is built (verify would fail: Internal naming
  // the first differing path). Nothing is left behind on error.
  StatusOr<LayerInfo> BuildFromDir(std::string_view name, const std::string& dir);
  // Same for a tree copied from a sandbox (snapshot, grade): the layer is
  // marked from_sandbox (meta/<hex>.sandbox) and files are chunk-based, so
  // that holes stay holes (a sparse file costs its data, not its size).
  // `project`: the sandbox's project, recorded as an owner (empty: none).
  StatusOr<LayerInfo> BuildFromSandboxDir(std::string_view name, const std::string& dir,
                                          const std::string& project = "");
  // Same from a tar file (plain/gz/xz/zstd, via libarchive). OCI/docker
  // whiteouts ".wh.<name>" become overlayfs whiteouts (0:0 char devices) and
  // ".wh..wh..opq" an opaque dir (trusted.overlay.opaque=y). Rejected with
  // InvalidArgument naming the entry: absolute or ".." paths, device nodes
  // other than whiteouts, links pointing outside the tree. `progress`: as
  // ExtractTar's (bytes of the tar read), during the extraction. A layer
  // with a sparse file (holes, or blocks of zeros: see ExtractTar) is built
  // chunk-based as BuildFromSandboxDir's, so its holes cost no data blocks;
  // any other in the plain format unless set_chunked_layers.
  StatusOr<LayerInfo> BuildFromTar(std::string_view name, const std::string& tar_path,
                                   const TarProgressFn& progress = nullptr);
  // One layer equal to the stack of `digests` (bottom first, >= 2) as a
  // sandbox sees it: the layers stacked in a read-only overlayfs, the image
  // built from that view and verified against it (CompareTrees). Whiteouts
  // and opaque dirs are applied, not copied (the result is meant to be the
  // bottom of a stack). NotFound naming a missing digest. See layer_merge.cc.
  StatusOr<LayerInfo> BuildMerged(std::string_view name, const std::vector<std::string>& digests);

  // ref: "kind/name", "kind/name@version" or "sha256:<hex>". NotFound if absent.
  // Without a version the newest version is picked: the one whose name was
  // created last (created_at_ns), ties broken by version in natural order
  // ("10" > "9"). For a named layer created_at_ns is when the name was
  // created; for a bare digest, when the blob was built (and name is empty).
  StatusOr<LayerInfo> Resolve(std::string_view ref) const;
  // Every name, sorted by name; unnamed blobs are not listed.
  std::vector<LayerInfo> List() const;
  // Removes the name (and the blob when no other name points at it).
  // ref must carry a version ("kind/name@version") or be a digest (which
  // removes every name pointing at it, then the blob); InvalidArgument for
  // "kind/name". The caller (node) refuses removal of layers in use. When
  // the blob would go, Remove first takes an OFD write lock on it without
  // waiting: FailedPrecondition (nothing removed) while any process of any
  // node sharing the store holds it (HoldBlob).
  Status Remove(std::string_view ref);
  // Holds the blob of `digest` (or its hex) against removal, across the
  // nodes sharing the store: an OFD read lock (fcntl F_OFD_SETLK, the one
  // byte kBlobHoldLockByte) on an open fd of the blob, held while the returned fd is open
  // (MountCache holds one per Acquire). A hold never lands on a blob being
  // removed: Unavailable (retryable) while a Remove holds its write lock,
  // NotFound when the blob is gone (also when it was unlinked between the
  // open and the lock). On a file system that refuses OFD locks (EINVAL,
  // ENOLCK, EOPNOTSUPP) the fd comes back unlocked: removal is then guarded
  // by the nodes' in-use counts only. OFD locks name no holder (l_pid is
  // -1): the refusal says what holds it, not which node.
  StatusOr<UniqueFd> HoldBlob(std::string_view digest) const;
  // The byte of a blob that HoldBlob read-locks and Remove write-locks: one
  // byte far past any layer's end, never the whole file, because QEMU's image
  // locking (block/file-posix.c, "raw_check_lock_bytes") test-locks bytes
  // 100.. and 200.. of every image it opens, and a microVM or VM attaches
  // layer blobs as read-only drives: a whole-file lock made every cold boot
  // fail with 'Failed to get "consistent read" lock'.
  static constexpr off_t kBlobHoldLockByte = off_t{1} << 40;
  // Path of the blob of a digest.
  std::string BlobPath(std::string_view digest) const;

  const std::string& dir() const { return dir_; }

 private:
  explicit LayerStore(std::string dir) : dir_(std::move(dir)) {}
  // Runs mkfs.erofs on `src` into tmp/, hashes, verifies and names the image
  // (chunk-based if from_sandbox, chunked or set_chunked_layers: see MkfsErofs).
  StatusOr<LayerInfo> BuildImage(const LayerName& name, const std::string& src, bool from_sandbox = false,
                                 bool chunked = false, const std::string& project = "");
  StatusOr<LayerInfo> Publish(const LayerName& name, const std::string& tmp_image, const std::string& hex,
                              uint64_t size, bool from_sandbox, const std::string& project);
  std::string NamePath(const LayerName& name) const;
  std::string TmpPath(std::string_view what) const;

  std::string dir_;
  bool chunked_layers_ = false;
  // Serializes publish/remove within this process; across processes (nodes
  // sharing the store) names are created with link(2), which fails if the
  // name exists, and blobs are immutable.
  mutable std::mutex mu_;
};

// Mounts each layer once per node (file-backed EROFS through fsopen/fsconfig/
// fsmount where the kernel allows, a loop device otherwise) under
// <mount_root>/<hex>, shared by every sandbox using it. Refcounted; a mount
// whose count dropped to zero is unmounted after `grace` (LRU), never while in
// use. Thread-safe.
class MountCache {
 public:
  // Adopts mounts left under mount_root by a previous daemon (refcount 0
  // until sandboxes are re-adopted and Acquire() them again).
  // source_root: "" mounts each layer from its store blob; otherwise from
  // <source_root>/<hex> (the node's read cache as files: BlobFs), the store
  // blob still deciding whether the layer exists.
  static StatusOr<std::unique_ptr<MountCache>> Open(const LayerStore* store, const std::string& mount_root,
                                                    int64_t grace_ms, std::string source_root = "");
  // Mounts (if needed) and takes a reference; returns the mount path. The
  // reference holds the blob against removal on every node sharing the
  // store (LayerStore::HoldBlob) until Release; Acquire fails as HoldBlob
  // does (a blob being removed or gone: also when a mount of it is cached).
  StatusOr<std::string> Acquire(std::string_view digest);
  void Release(std::string_view digest);
  // Unmounts unreferenced mounts whose grace expired (called periodically)
  // or all unreferenced ones if `all`.
  // Returns the layers (hex) it unmounted.
  std::vector<std::string> Sweep(bool all = false);
  bool IsMounted(std::string_view digest) const;
  uint32_t RefCount(std::string_view digest) const;
  size_t MountedCount() const;
  // What the cache did since it was opened. hits: Acquires served by a mount
  // that existed (or that another Acquire was making); misses: Acquires that
  // mounted; failures: Acquires whose mount failed; evictions: mounts Sweep
  // removed. mounted / mounted_bytes: the layers mounted now and the size of
  // their EROFS images (bytes).
  struct Stats {
    uint64_t hits = 0, misses = 0, failures = 0, evictions = 0;
    uint64_t mounted = 0, mounted_bytes = 0;
  };
  Stats stats() const;
  // Probed once per process: the kernel mounts EROFS straight from a regular
  // file (Linux >= 6.12 with CONFIG_EROFS_FS_BACKED_BY_FILE).
  static bool FileBackedErofsSupported();

  ~MountCache();  // Leaves mounts in place (a restarted daemon adopts them).

 private:
  enum class State { kMounting, kMounted, kUnmounting, kUnmounted };
  struct Entry {
    State state = State::kUnmounted;
    uint32_t refs = 0;
    std::vector<UniqueFd> holds;  // LayerStore::HoldBlob, one per reference
    int64_t released_at_ms = 0;   // CLOCK_MONOTONIC, when refs dropped to 0
    uint64_t bytes = 0;           // the image's size, once mounted
  };
  MountCache(const LayerStore* store, std::string mount_root, int64_t grace_ms, std::string source_root)
      : store_(store), mount_root_(std::move(mount_root)), grace_ms_(grace_ms), source_root_(std::move(source_root)) {}
  Status Adopt();
  std::string MountPath(const std::string& hex) const;

  const LayerStore* store_;
  const std::string mount_root_;
  const int64_t grace_ms_;
  const std::string source_root_;
  // Guards entries_; never held across mount/umount: Acquire of one digest
  // waits on cv_ while another thread mounts it (per-digest latch).
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Entry> entries_;                           // key: hex digest
  uint64_t hits_ = 0, misses_ = 0, failures_ = 0, evictions_ = 0;  // guarded by mu_
};

}  // namespace warren::image
