// Compares two directory trees for layer verification.
#pragma once

#include <string>

#include "common/status.h"

namespace warren::image {

// Compares the tree below directory fd `src` (the build source) with the
// tree below `img` (the mounted image): entry names (byte-exact), file
// types, permission bits incl. setuid/setgid/sticky, uid/gid, sizes, regular
// file contents, symlink targets, device numbers, hardlink groups (paths
// sharing an inode in one tree share one in the other) and user.*,
// trusted.* and security.* xattrs. The roots are compared too. Timestamps
// are not. Internal error naming the first differing path (relative, "."
// for the root) and what differs; OK if equal. Bounded by depth 4096.
Status CompareTrees(int src, int img);

}  // namespace warren::image
