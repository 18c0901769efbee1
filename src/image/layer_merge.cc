// LayerStore::BuildMerged: one EROFS layer equal to a stack of layers.
//
// The stack is merged by the kernel, not by a user-space reimplementation of
// the overlay rules: the layers are mounted (detached, read-only) and stacked
// in a read-only overlayfs (lowers only, no upper), whose merged view is
// exactly what a sandbox on those layers sees: a whiteout (0:0 char device)
// hides what is below it and is itself invisible, an opaque dir
// (trusted.overlay.opaque=y) shows nothing of the layers below, and the
// overlay's own trusted.overlay.* xattrs are not listed. mkfs.erofs builds
// the new layer from that view and BuildImage verifies the result against
// it (CompareTrees), so the merged layer is checked against the stacked
// layers it replaces. Hardlinks survive: overlayfs reports a lower
// non-directory's own inode number with a per-layer device, so links within
// one layer stay one inode in the merged layer.
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/unique_fd.h"
#include "image/erofs.h"
#include "image/fs_util.h"
#include "image/layer_store.h"

namespace warren::image {
namespace {

// Unmounts (lazily: a walker still holding an fd does not block it) and
// removes the mount point.
struct MountPointGuard {
  std::string path;
  bool mounted = false;
  ~MountPointGuard() {
    if (mounted) umount2(path.c_str(), MNT_DETACH);
    rmdir(path.c_str());
  }
};

}  // namespace

StatusOr<LayerInfo> LayerStore::BuildMerged(std::string_view name, const std::vector<std::string>& digests) {
  ASSIGN_OR_RETURN(LayerName n, LayerName::Parse(name));
  if (n.version.empty()) {
    return absl::InvalidArgumentError("layer name \"" + std::string(name) +
                                      "\": building needs a version (kind/name@version)");
  }
  if (digests.size() < 2) {
    return absl::InvalidArgumentError("merging " + std::string(name) + " needs at least 2 layers, got " +
                                      std::to_string(digests.size()));
  }
  std::vector<UniqueFd> lowers;  // bottom first
  for (const std::string& d : digests) {
    ASSIGN_OR_RETURN(LayerInfo li, Resolve(d));  // NotFound naming the digest
    ASSIGN_OR_RETURN(UniqueFd m, MountErofs(BlobPath(li.digest)));
    lowers.push_back(std::move(m));
  }
  UniqueFd ofs(fsopen("overlay", FSOPEN_CLOEXEC));
  if (!ofs.valid()) return ErrnoToStatus(errno, "fsopen(overlay)");
  for (auto it = lowers.rbegin(); it != lowers.rend(); ++it) {  // top first
    if (fsconfig(ofs.get(), FSCONFIG_SET_FD, "lowerdir+", nullptr, it->get()) != 0) {
      return ErrnoToStatus(errno, "fsconfig(overlay, lowerdir+) merging " + std::string(name));
    }
  }
  if (fsconfig(ofs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) {
    return ErrnoToStatus(errno, "fsconfig(overlay, FSCONFIG_CMD_CREATE) merging " + std::string(name));
  }
  UniqueFd omnt(fsmount(ofs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID));
  if (!omnt.valid()) return ErrnoToStatus(errno, "fsmount(overlay) merging " + std::string(name));
  // mkfs.erofs takes a path: attach the overlay on a private mount point in
  // tmp/ for the build (removed on every path out).
  MountPointGuard mp{TmpPath("merge")};
  if (mkdir(mp.path.c_str(), 0700) != 0) return ErrnoToStatus(errno, "mkdir(" + mp.path + ")");
  if (move_mount(omnt.get(), "", AT_FDCWD, mp.path.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0) {
    return ErrnoToStatus(errno, "move_mount(overlay, " + mp.path + ")");
  }
  mp.mounted = true;
  return BuildImage(n, mp.path);
}

}  // namespace warren::image
