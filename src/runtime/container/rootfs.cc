#include "runtime/container/rootfs.h"

#include <fcntl.h>
#include <linux/mount.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "jail/contain.h"
#include "jail/plan_builder.h"
#include "runtime/container/init.h"

namespace warren::runtime::container {

using jail::FsConfig;
using jail::FsMount;
using jail::FsOpen;
using jail::MountSetattr;
using jail::OpenTree;

namespace {

// /etc/hosts for images that have none (a debootstrapped Debian has none:
// `localhost` then does not resolve, and test suites that bind or connect
// to it fail). Like Docker's, written per sandbox, here into the upper: the
// loopback names and the sandbox's hostname (127.0.1.1, Debian's
// convention). An image's own /etc/hosts is left alone; one we wrote (a
// snapshot or fork of a sandbox carries it in a layer) is written again with
// this sandbox's hostname.
constexpr char kEtcHostsMark[] = "# warren: generated for this sandbox\n";

Status SeedEtcHosts(int upper_fd, const SandboxSpec& spec, uid_t host_uid) {
  for (auto it = spec.lower_dirs.rbegin(); it != spec.lower_dirs.rend(); ++it) {  // top layer first
    // One component at a time from the layer's root: a symlink /etc in a
    // layer is never resolved on the host.
    UniqueFd root(::open(it->c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!root.valid()) return Errno("open(" + *it + ")");
    UniqueFd etc(::openat(root.get(), "etc", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!etc.valid()) {
      if (errno == ENOENT) continue;
      return absl::OkStatus();  // /etc is not a directory here: the image's own business
    }
    UniqueFd f(::openat(etc.get(), "hosts", O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
    if (!f.valid()) {
      if (errno == ENOENT) continue;
      return absl::OkStatus();  // present (a symlink, ...): the image's own
    }
    struct stat st;
    if (::fstat(f.get(), &st) != 0 || !S_ISREG(st.st_mode)) return absl::OkStatus();
    char head[sizeof kEtcHostsMark - 1];
    if (::read(f.get(), head, sizeof head) != static_cast<ssize_t>(sizeof head) ||
        memcmp(head, kEtcHostsMark, sizeof head) != 0) {
      return absl::OkStatus();
    }
    break;  // ours, from a snapshot: replace it
  }
  if (::mkdirat(upper_fd, "etc", 0755) != 0 && errno != EEXIST) return Errno("mkdirat(upper, etc)");
  if (::fchownat(upper_fd, "etc", host_uid, host_uid, AT_SYMLINK_NOFOLLOW) != 0) return Errno("fchownat(upper, etc)");
  UniqueFd f(::openat(upper_fd, "etc/hosts", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!f.valid()) return Errno("openat(upper, etc/hosts)");
  std::string text = std::string(kEtcHostsMark) + "127.0.0.1\tlocalhost\n";
  if (!spec.hostname.empty()) text += "127.0.1.1\t" + spec.hostname + "\n";
  text += "::1\tlocalhost ip6-localhost ip6-loopback\n";
  if (::write(f.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    return Errno("write(upper, etc/hosts)");
  }
  if (::fchown(f.get(), host_uid, host_uid) != 0) return Errno("fchown(upper, etc/hosts)");
  return absl::OkStatus();
}
}  // namespace

StatusOr<UniqueFd> BuildRootfs(const SandboxSpec& spec, int userns_fd, uid_t host_uid, UniqueFd* upper_out,
                               UniqueFd* dev_out, bool* dev_nodes_made) {
  // 1. tmpfs for upper/ and work/: its size is the disk limit.
  UniqueFd fsfd(FsOpen("tmpfs", FSOPEN_CLOEXEC));
  if (!fsfd.valid()) return Errno("fsopen(tmpfs)");
  const uint64_t inodes = std::max<uint64_t>(16384, uint64_t{spec.resources.disk_mb} * 256);
  const std::string size = std::to_string(spec.resources.disk_mb) + "m", ino = std::to_string(inodes),
                    uid = std::to_string(host_uid);
  for (const auto& [k, v] : std::vector<std::pair<const char*, std::string>>{
           {"size", size}, {"nr_inodes", ino}, {"mode", "0755"}, {"uid", uid}, {"gid", uid}}) {
    if (FsConfig(fsfd.get(), FSCONFIG_SET_STRING, k, v.c_str(), 0) != 0)
      return Errno(std::string("fsconfig(tmpfs, ") + k + "=" + v + ")");
  }
  if (FsConfig(fsfd.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) return Errno("fsconfig(tmpfs, create)");
  UniqueFd tmnt(FsMount(fsfd.get(), FSMOUNT_CLOEXEC, 0));
  if (!tmnt.valid()) return Errno("fsmount(tmpfs)");
  for (const char* d : {"upper", "work", "dev"}) {
    if (::mkdirat(tmnt.get(), d, 0755) != 0) return Errno(std::string("mkdirat(tmpfs, ") + d + ")");
    if (::fchownat(tmnt.get(), d, host_uid, host_uid, AT_SYMLINK_NOFOLLOW) != 0)
      return Errno(std::string("fchownat(tmpfs, ") + d + ")");
  }
  // The device nodes of /dev, made here by host root on this tmpfs (created
  // in the initial user namespace, so its nodes open; the sandbox can never
  // make one: mknod needs CAP_MKNOD there): 6 bind mounts fewer per sandbox
  // to set up and tear down. Any failure: the shell bind-mounts the host's.
  *dev_nodes_made = true;
  for (size_t i = 0; i < std::size(jail::kDevNodes); ++i) {
    const jail::DevNode& node = jail::kDevNodes[i];
    const std::string path = std::string("dev/") + node.name;
    if (::mknodat(tmnt.get(), path.c_str(), S_IFCHR | 0666, makedev(node.major, node.minor)) != 0 ||
        ::fchmodat(tmnt.get(), path.c_str(), 0666, 0) != 0) {
      for (size_t j = 0; j <= i; ++j)
        (void)::unlinkat(tmnt.get(), (std::string("dev/") + jail::kDevNodes[j].name).c_str(), 0);
      *dev_nodes_made = false;
      break;
    }
  }
  UniqueFd upper(::openat(tmnt.get(), "upper", O_PATH | O_DIRECTORY | O_CLOEXEC));
  UniqueFd work(::openat(tmnt.get(), "work", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!upper.valid() || !work.valid()) return Errno("openat(tmpfs, upper|work)");
  upper_out->reset(::openat(upper.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!upper_out->valid()) return Errno("openat(tmpfs upper, O_RDONLY)");
  dev_out->reset(OpenTree(tmnt.get(), "dev", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC));
  if (!dev_out->valid()) return Errno("open_tree(tmpfs dev, OPEN_TREE_CLONE)");
  {
    mount_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC;
    if (MountSetattr(dev_out->get(), "", AT_EMPTY_PATH, &attr) != 0)
      return Errno("mount_setattr(tmpfs dev, nosuid|noexec)");
  }

  RETURN_IF_ERROR(SeedEtcHosts(upper_out->get(), spec, host_uid));

  // 2. Idmapped, read-only clones of the lower layers.
  std::vector<UniqueFd> lowers;
  for (const auto& dir : spec.lower_dirs) {
    UniqueFd l(OpenTree(AT_FDCWD, dir.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE));
    if (!l.valid()) return Errno("open_tree(" + dir + ", OPEN_TREE_CLONE)");
    mount_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY;
    attr.userns_fd = static_cast<uint64_t>(userns_fd);
    if (MountSetattr(l.get(), "", AT_EMPTY_PATH | AT_RECURSIVE, &attr) != 0) {
      // File systems that cannot be idmapped (overlayfs, some network file
      // systems): fall back to a plain read-only clone. Its files then appear
      // owned by nobody (65534) inside, but stay readable per their modes.
      if (errno != EINVAL && errno != EOPNOTSUPP && errno != EPERM)
        return Errno("mount_setattr(" + dir + ", MOUNT_ATTR_IDMAP)");
      attr.attr_set = MOUNT_ATTR_RDONLY;
      attr.userns_fd = 0;
      if (MountSetattr(l.get(), "", AT_EMPTY_PATH | AT_RECURSIVE, &attr) != 0)
        return Errno("mount_setattr(" + dir + ", MOUNT_ATTR_RDONLY)");
    }
    lowers.push_back(std::move(l));
  }

  // 3. The overlay, layers given by fd (top first).
  UniqueFd ofs(FsOpen("overlay", FSOPEN_CLOEXEC));
  if (!ofs.valid()) return Errno("fsopen(overlay)");
  for (auto it = lowers.rbegin(); it != lowers.rend(); ++it) {
    if (FsConfig(ofs.get(), FSCONFIG_SET_FD, "lowerdir+", nullptr, it->get()) != 0)
      return Errno("fsconfig(overlay, lowerdir+)");
  }
  if (FsConfig(ofs.get(), FSCONFIG_SET_FD, "upperdir", nullptr, upper.get()) != 0)
    return Errno("fsconfig(overlay, upperdir)");
  if (FsConfig(ofs.get(), FSCONFIG_SET_FD, "workdir", nullptr, work.get()) != 0)
    return Errno("fsconfig(overlay, workdir)");
  if (FsConfig(ofs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) return Errno("fsconfig(overlay, create)");
  UniqueFd omnt(FsMount(ofs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_NODEV));
  if (!omnt.valid()) return Errno("fsmount(overlay)");
  return omnt;
}

// ---- density: mounts shared by every sandbox.
// Each superblock costs more than its own few KiB: every superblock registers
// a memcg-aware shrinker, and EVERY memory cgroup on the host holds a
// per-shrinker slot for each shrinker id up to the highest one in use (16
// bytes each, in 1 KiB units, measured in bench/density: components.c), so
// per-sandbox superblocks make each sandbox's memcg grow with the number of
// sandboxes. Read-only, empty or namespace-neutral file systems are therefore
// mounted once by the backend and cloned into each sandbox:
//   mask   an empty tmpfs, read-only at the superblock (SB_RDONLY: the
//          sandbox's root, privileged only in its own user namespace, cannot
//          remount it writable), over /proc/{acpi,scsi,driver}, /sys/firmware;
//   sysfs  sysfs of a network namespace made for it on a short-lived thread
//          (sysfs holds only a passive reference: once the thread is gone,
//          the netns is dismantled and no process can ever enter it),
//          read-only. Sandboxes see the host's devices as with a sysfs of
//          their own; /sys/class/net is empty (the sandbox's lo shows in
//          /proc/net and over netlink). Files are owned by host root: not
//          writable inside.
// Both fail soft: a sandbox then mounts its own, as before.
StatusOr<UniqueFd> MakeSharedMaskMount() {
  UniqueFd fs(FsOpen("tmpfs", FSOPEN_CLOEXEC));
  if (!fs.valid()) return Errno("fsopen(tmpfs)");
  for (const auto& [k, v] :
       std::vector<std::pair<const char*, const char*>>{{"size", "4k"}, {"nr_inodes", "16"}, {"mode", "0555"}}) {
    if (FsConfig(fs.get(), FSCONFIG_SET_STRING, k, v, 0) != 0)
      return Errno(std::string("fsconfig(tmpfs, ") + k + "=" + v + ")");
  }
  if (FsConfig(fs.get(), FSCONFIG_SET_FLAG, "ro", nullptr, 0) != 0) return Errno("fsconfig(tmpfs, ro)");
  if (FsConfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) return Errno("fsconfig(tmpfs, create)");
  UniqueFd mnt(
      FsMount(fs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC));
  if (!mnt.valid()) return Errno("fsmount(mask tmpfs)");
  return mnt;
}

// sysfs is tagged with the network namespace of the task that creates it: a
// short-lived thread enters a fresh netns (a per-thread attribute) for that.
StatusOr<UniqueFd> MakeSharedSysfs() {
  StatusOr<UniqueFd> out = absl::InternalError("sysfs thread did not run");
  std::thread t([&out] {
    if (::unshare(CLONE_NEWNET) != 0) {
      out = Errno("unshare(CLONE_NEWNET) for the shared sysfs");
      return;
    }
    UniqueFd fs(FsOpen("sysfs", FSOPEN_CLOEXEC));
    if (!fs.valid()) {
      out = Errno("fsopen(sysfs)");
      return;
    }
    if (FsConfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) {
      out = Errno("fsconfig(sysfs, create)");
      return;
    }
    UniqueFd mnt(FsMount(fs.get(), FSMOUNT_CLOEXEC,
                         MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC));
    if (!mnt.valid()) {
      out = Errno("fsmount(sysfs)");
      return;
    }
    out = std::move(mnt);
  });
  t.join();
  return out;
}
Status SendSharedMounts(const BackendState& st, int sock, UniqueFd dev) {
  if (int r = jail::SendFd(sock, dev.get()); r != 0) return ErrnoToStatus(-r, "sendmsg(dev fd)");
  for (const UniqueFd* m : {&st.sysfs_mnt, &st.mask_mnt}) {
    if (!m->valid()) continue;
    UniqueFd c(OpenTree(m->get(), "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH));
    if (!c.valid())
      return Errno(std::string("open_tree(shared ") + (m == &st.sysfs_mnt ? "sysfs" : "mask") + ", OPEN_TREE_CLONE)");
    if (int r = jail::SendFd(sock, c.get()); r != 0) return ErrnoToStatus(-r, "sendmsg(shared mount fd)");
  }
  return absl::OkStatus();
}

}  // namespace warren::runtime::container
