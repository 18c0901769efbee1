#include "jail/cgroup_view.h"

#include <fcntl.h>
#include <linux/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jail/cgroup_path.h"
#include "jail/syscalls.h"

namespace warren::jail {
namespace {

constexpr uint64_t kRo = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;

// A read-only clone of the cgroup directory `dir` (a detached mount).
StatusOr<UniqueFd> ReadOnlyClone(const std::string& dir) {
  const CgPath at = RouteCgroupPath(dir);
  UniqueFd c(OpenTree(at.dirfd, at.rel.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC));
  if (!c.valid()) return ErrnoToStatus(errno, "open_tree(" + dir + ", OPEN_TREE_CLONE)");
  mount_attr a{};
  a.attr_set = kRo;
  if (MountSetattr(c.get(), "", AT_EMPTY_PATH, &a) != 0)
    return ErrnoToStatus(errno, "mount_setattr(" + dir + " clone, read-only)");
  return c;
}

}  // namespace

StatusOr<UniqueFd> DetachedCgroupView(const std::vector<std::string>& dirs) {
  const std::string root = "/sys/fs/cgroup/";
  if (dirs.empty()) return absl::InvalidArgumentError("cgroup view: no cgroup directory");
  const bool v2 = dirs.size() == 1 && ::access("/sys/fs/cgroup/cgroup.controllers", F_OK) == 0;
  if (v2) return ReadOnlyClone(dirs[0]);
  UniqueFd fs(FsOpen("tmpfs", FSOPEN_CLOEXEC));
  if (!fs.valid()) return ErrnoToStatus(errno, "fsopen(tmpfs) for the cgroup view");
  for (const char* kv : {"size=16k", "nr_inodes=64", "mode=755"}) {
    const std::string s(kv);
    const size_t eq = s.find('=');
    if (FsConfig(fs.get(), FSCONFIG_SET_STRING, s.substr(0, eq).c_str(), s.substr(eq + 1).c_str(), 0) != 0)
      return ErrnoToStatus(errno, "fsconfig(tmpfs, " + s + ") for the cgroup view");
  }
  if (FsConfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0)
    return ErrnoToStatus(errno, "fsconfig(tmpfs, create) for the cgroup view");
  UniqueFd view(FsMount(fs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC));
  if (!view.valid()) return ErrnoToStatus(errno, "fsmount(tmpfs) for the cgroup view");
  for (const std::string& d : dirs) {
    if (d.compare(0, root.size(), root) != 0) continue;
    const std::string h = d.substr(root.size(), d.find('/', root.size()) - root.size());
    if (h.empty() || h == "." || h == "..") continue;
    if (::mkdirat(view.get(), h.c_str(), 0755) != 0 && errno != EEXIST)
      return ErrnoToStatus(errno, "mkdir(cgroup view/" + h + ")");
    ASSIGN_OR_RETURN(UniqueFd c, ReadOnlyClone(d));
    if (MoveMount(c.get(), "", view.get(), h.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0)
      return ErrnoToStatus(errno, "move_mount(" + d + " clone, cgroup view/" + h + ")");
  }
  mount_attr a{};
  a.attr_set = MOUNT_ATTR_RDONLY;
  if (MountSetattr(view.get(), "", AT_EMPTY_PATH, &a) != 0)
    return ErrnoToStatus(errno, "mount_setattr(cgroup view, read-only)");
  return view;
}

}  // namespace warren::jail
