#include "guest/agent/boot.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace warren::guest {
namespace {

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

std::string ReadSmallFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[4096];
  ssize_t n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  if (n <= 0) return "";
  std::string s(buf, static_cast<size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

bool WriteSmallFile(const std::string& path, const std::string& data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size());
  ::close(fd);
  return ok;
}

std::string Mount(const char* src, const std::string& dst, const char* type, unsigned long flags,
                  const std::string& data) {
  ::mkdir(dst.c_str(), 0755);
  if (::mount(src, dst.c_str(), type, flags, data.empty() ? nullptr : data.c_str()) != 0) {
    return Errno(std::string("mount(") + src + ", " + dst + ", " + (type ? type : "") + ", " + data + ")");
  }
  return "";
}

// warren.<key>=<value> words of the kernel command line.
std::map<std::string, std::string> CmdlineParams() {
  std::map<std::string, std::string> out;
  std::string line = ReadSmallFile("/proc/cmdline");
  size_t i = 0;
  while (i < line.size()) {
    size_t j = line.find(' ', i);
    if (j == std::string::npos) j = line.size();
    std::string w = line.substr(i, j - i);
    if (w.rfind("warren.", 0) == 0) {
      size_t eq = w.find('=');
      if (eq != std::string::npos) out[w.substr(7, eq - 7)] = w.substr(eq + 1);
    }
    i = j + 1;
  }
  return out;
}

int64_t MonotonicMs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

// serial -> /dev/vdX of every virtio-blk disk.
std::map<std::string, std::string> DisksBySerial() {
  std::map<std::string, std::string> out;
  DIR* d = ::opendir("/sys/block");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, "vd", 2) != 0) continue;
    std::string serial = ReadSmallFile(std::string("/sys/block/") + e->d_name + "/serial");
    if (!serial.empty()) out[serial] = std::string("/dev/") + e->d_name;
  }
  ::closedir(d);
  return out;
}

}  // namespace

void LogLine(const std::string& line) {
  std::string s = "warren-agent: " + line + "\n";
  ssize_t ignored = ::write(2, s.data(), s.size());
  (void)ignored;
}

RootParams CmdlineRootParams() {
  std::map<std::string, std::string> params = CmdlineParams();
  RootParams r;
  r.layers = params.count("layers") ? std::atoi(params["layers"].c_str()) : 0;
  if (params.count("hostname")) r.hostname = params["hostname"];
  if (params.count("shm_mb")) r.shm_mb = params["shm_mb"];
  if (params.count("pids")) r.pids = std::strtoull(params["pids"].c_str(), nullptr, 10);
  return r;
}

bool IsTemplateBoot() { return CmdlineParams()["template"] == "1"; }

namespace {
std::string LoadModule(const std::string& name) {
  std::string path = "/lib/modules/" + name + ".ko";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("open(" + path + ")");
  long rc = ::syscall(SYS_finit_module, fd, "", 0);
  int saved = errno;
  ::close(fd);
  if (rc != 0 && saved != EEXIST) {
    errno = saved;
    return Errno("finit_module(" + path + ")");
  }
  ::unlink(path.c_str());  // the initramfs is RAM: give the pages back
  return "";
}
}  // namespace

namespace {
// The modules of /modules.net, opened at boot (the initramfs is out of
// reach once the root is switched), loaded by LoadNetModules.
std::vector<std::pair<std::string, int>> g_net_modules;
}  // namespace

namespace {
bool g_net_loaded_unbound = false;  // loaded with the virtio bus's autoprobe off (a template)

std::string LoadNetModuleFds() {
  for (auto& [name, fd] : g_net_modules) {
    if (fd < 0) continue;
    long rc = ::syscall(SYS_finit_module, fd, "", 0);
    int saved = errno;
    ::close(fd);
    fd = -1;
    if (rc != 0 && saved != EEXIST) {
      errno = saved;
      return Errno("finit_module(" + name + ")");
    }
  }
  return "";
}
}  // namespace

std::string PrepareNetModules() {
  // The virtio bus's autoprobe is read when a driver registers: off while
  // virtio_net loads, so the NIC stays unbound until BindNic probes it, and
  // on again after (a device added later binds as usual).
  if (!WriteSmallFile("/sys/bus/virtio/drivers_autoprobe", "0")) return Errno("write(virtio drivers_autoprobe)");
  std::string err = LoadNetModuleFds();
  if (!WriteSmallFile("/sys/bus/virtio/drivers_autoprobe", "1") && err.empty())
    err = Errno("write(virtio drivers_autoprobe)");
  if (err.empty()) g_net_loaded_unbound = true;
  return err;
}

namespace {
// /sys/bus/virtio/devices/<dev> of each virtio device, and whether it is a
// NIC (VIRTIO_ID_NET).
std::vector<std::pair<std::string, bool>> VirtioDevices() {
  std::vector<std::pair<std::string, bool>> out;
  DIR* d = ::opendir("/sys/bus/virtio/devices");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string dev = std::string("/sys/bus/virtio/devices/") + e->d_name;
    const bool nic = ReadSmallFile(dev + "/device") == "0x0001";
    out.emplace_back(std::move(dev), nic);
  }
  ::closedir(d);
  return out;
}

bool Bound(const std::string& dev) { return ::access((dev + "/driver").c_str(), F_OK) == 0; }

// Whether every virtio device but the NIC has its driver.
bool OnlyTheNicUnbound() {
  for (const auto& [dev, nic] : VirtioDevices()) {
    if (!nic && !Bound(dev)) return false;
  }
  return true;
}
}  // namespace

std::string BindNic() {
  if (!g_net_loaded_unbound) return LoadNetModuleFds();  // binds the NIC as it loads
  for (const auto& [dev, nic] : VirtioDevices()) {
    if (!nic) continue;
    if (Bound(dev)) return "";
    const std::string name = dev.substr(dev.rfind('/') + 1);
    if (!WriteSmallFile("/sys/bus/virtio/drivers_probe", name)) return Errno("write(drivers_probe, " + name + ")");
    return "";
  }
  return "no virtio-net device (the VM has no NIC?)";
}

std::string EarlySetup(bool* template_boot) {
  std::string err;
  if (!(err = Mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "")).empty()) return err;
  if (!(err = Mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "")).empty()) return err;
  if (!(err = Mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755")).empty()) return err;
  // The kernel opens /dev/console as fds 0-2 for init only when it exists
  // in the initramfs; never leave them closed (a pipe would land there).
  for (int fd = 0; fd < 3; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0) continue;
    int c = ::open("/dev/console", O_RDWR);
    if (c < 0) c = ::open("/dev/null", O_RDWR);
    if (c >= 0 && c != fd) {
      ::dup2(c, fd);
      ::close(c);
    }
  }
  *template_boot = IsTemplateBoot();
  std::string list = ReadSmallFile("/modules.load");
  size_t i = 0;
  while (i < list.size()) {
    size_t j = list.find('\n', i);
    if (j == std::string::npos) j = list.size();
    std::string name = list.substr(i, j - i);
    i = j + 1;
    if (name.empty()) continue;
    if (std::string err = LoadModule(name); !err.empty()) return err;
  }
  list = ReadSmallFile("/modules.net");
  for (size_t i = 0, j; i < list.size(); i = j + 1) {
    j = list.find('\n', i);
    if (j == std::string::npos) j = list.size();
    std::string name = list.substr(i, j - i);
    if (name.empty()) continue;
    const std::string path = "/lib/modules/" + name + ".ko";
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Errno("open(" + path + ")");
    g_net_modules.emplace_back(name, fd);
  }
  return "";
}

std::string FindPort(const std::string& name) {
  int64_t deadline = MonotonicMs() + 2000;
  while (true) {
    DIR* d = ::opendir("/sys/class/virtio-ports");
    if (d != nullptr) {
      while (dirent* e = ::readdir(d)) {
        if (e->d_name[0] == '.') continue;
        if (ReadSmallFile(std::string("/sys/class/virtio-ports/") + e->d_name + "/name") == name) {
          std::string dev = std::string("/dev/") + e->d_name;
          ::closedir(d);
          return dev;
        }
      }
      ::closedir(d);
    }
    if (MonotonicMs() > deadline) return "";
    ::usleep(10000);
  }
}

namespace {
int g_upper_fd = -1;
}  // namespace

int UpperDirFd() { return g_upper_fd; }

std::string ServiceSetup() {
  std::string err;
  auto add = [&err](const std::string& e) { err += (err.empty() ? "" : "; ") + e; };
  if (!WriteSmallFile("/proc/sys/vm/overcommit_memory", "1")) add(Errno("write(vm.overcommit_memory)"));
  if (g_upper_fd < 0) g_upper_fd = ::open(kServiceUpperDir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (g_upper_fd < 0) add(Errno(std::string("open(") + kServiceUpperDir + ")"));
  // The NIC's driver and its dependencies, in load order, bound by BindNic
  // when a hello names an address: the guest keeps udev from loading it
  // (build-guest.sh blacklists virtio_net), so a VM without a network has
  // no link but lo, as a container.
  const std::string dir = "/lib/modules/" + KernelRelease() + "/kernel/";
  bool opened = true;
  for (const char* m : {"net/core/failover", "drivers/net/net_failover", "drivers/net/virtio_net"}) {
    const std::string path = dir + m + ".ko";
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      add(Errno("open(" + path + ")"));
      opened = false;
      continue;
    }
    g_net_modules.emplace_back(m, fd);
  }
  // Loaded now, unbound (in a desktop template: once for all its clones;
  // loading them after the restore was most of a networked clone's NIC
  // bring-up under TCG), so BindNic only probes the NIC. The other virtio
  // devices (disks, console, RNG) are bound by now (the agent's channel is
  // one); wait a little in case one is still probing, as a driver
  // registered with autoprobe off would not bind to it.
  if (opened) {
    const int64_t deadline = MonotonicMs() + 3000;
    while (MonotonicMs() < deadline && !OnlyTheNicUnbound()) ::usleep(20000);
    if (std::string e = PrepareNetModules(); !e.empty()) add(e);
  }
  return err;
}

namespace {
// serial -> /dev/vdX, read in a template boot: the same in its clones
// (their devices are the template's, probed once), where reading each
// disk's serial again costs a virtio request per disk.
std::map<std::string, std::string> g_template_disks;

// The disks are probed when virtio_blk loads; wait (bounded) in case a
// probe is still running.
std::map<std::string, std::string> WaitForDisks(int count) {
  std::map<std::string, std::string> disks;
  int64_t deadline = MonotonicMs() + 2000;
  while (true) {
    disks = DisksBySerial();
    if (static_cast<int>(disks.size()) >= count || MonotonicMs() > deadline) return disks;
    ::usleep(10000);
  }
}
}  // namespace

namespace {
bool g_cgroup_root_ready = false;

// The sandbox's limits as a container has them, the parts that need no
// disk: cgroup2 at /sys/fs/cgroup (SetUpRoot moves it into the root with
// /sys) with the memory and pids controllers on for the cgroup "warren"
// every command runs under (its task limit: SetUpRoot), and memory
// overcommitted as on the host, so an allocation past the guest's RAM is
// OOM-killed when touched (the guest's RAM is the memory limit) rather
// than refused by the kernel's heuristic. Once per boot (a template's
// clones find it done).
std::string SetUpCgroupRoot() {
  if (g_cgroup_root_ready) return "";
  std::string err = Mount("cgroup2", "/sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, "");
  if (!err.empty()) return err;
  ::mkdir("/sys/fs/cgroup/warren", 0755);
  (void)WriteSmallFile("/sys/fs/cgroup/cgroup.subtree_control", "+memory +pids");
  if (!WriteSmallFile("/proc/sys/vm/overcommit_memory", "1")) return Errno("write(vm.overcommit_memory)");
  g_cgroup_root_ready = true;
  return "";
}
}  // namespace

std::string PrepareTemplate() {
  const int layers = CmdlineRootParams().layers;
  if (layers >= 1 && layers <= 64) g_template_disks = WaitForDisks(layers + 1);
  // Loaded once here, not in every networked clone (~200 ms under TCG).
  if (std::string err = PrepareNetModules(); !err.empty()) return err;
  return SetUpCgroupRoot();
}

namespace {
std::string g_shm_mb;  // the size /dev/shm was mounted with (SetUpRoot)
}  // namespace

std::string SetUpRoot(const RootParams& params) {
  const int layers = params.layers;
  if (layers < 1 || layers > 64) return "warren.layers must be 1..64";

  std::map<std::string, std::string> disks = g_template_disks;
  if (static_cast<int>(disks.size()) < layers + 1) disks = WaitForDisks(layers + 1);
  std::string err;
  std::string lowerdir;
  for (int i = 0; i < layers; ++i) {
    std::string serial = "wl" + std::to_string(i);
    if (!disks.count(serial)) return "no disk with serial " + serial + " (layer " + std::to_string(i) + ")";
    std::string dir = "/layers/" + std::to_string(i);
    ::mkdir("/layers", 0755);
    if (!(err = Mount(disks[serial].c_str(), dir, "erofs", MS_RDONLY | MS_NODEV, "")).empty()) return err;
    lowerdir = lowerdir.empty() ? dir : dir + ":" + lowerdir;  // top first
  }
  if (!disks.count("wdisk")) return "no disk with serial wdisk (the writable disk)";
  if (!(err = Mount(disks["wdisk"].c_str(), "/disk", "ext4", MS_NODEV | MS_NOATIME, "")).empty()) return err;
  ::mkdir("/disk/upper", 0755);
  ::mkdir("/disk/work", 0755);
  // Kept for the changes export (changes.h): after the switch the upper dir
  // lies under the old root, out of every guest process's reach.
  g_upper_fd = ::open("/disk/upper", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (g_upper_fd < 0) return Errno("open(/disk/upper)");
  if (!(err = Mount("overlay", "/newroot", "overlay", 0,
                    "lowerdir=" + lowerdir + ",upperdir=/disk/upper,workdir=/disk/work"))
           .empty()) {
    return err;
  }
  // Moved with /sys below.
  if (!(err = SetUpCgroupRoot()).empty()) return err;
  for (const char* m : {"/dev", "/proc", "/sys"}) {
    std::string dst = std::string("/newroot") + m;
    ::mkdir(dst.c_str(), 0755);
    if (::mount(m, dst.c_str(), nullptr, MS_MOVE, nullptr) != 0) return Errno(std::string("move mount ") + m);
  }
  const std::string& shm_mb = params.shm_mb;
  if (!(err =
            Mount("devpts", "/newroot/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"))
           .empty()) {
    return err;
  }
  if (!(err = Mount("shm", "/newroot/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=" + shm_mb + "m"))
           .empty()) {
    return err;
  }
  g_shm_mb = shm_mb;
  // The task limit of the commands' cgroup (SetUpCgroupRoot).
  if (params.pids > 0 && !WriteSmallFile("/newroot/sys/fs/cgroup/warren/pids.max", std::to_string(params.pids))) {
    return Errno("write(/sys/fs/cgroup/warren/pids.max)");
  }
  if (::chdir("/newroot") != 0) return Errno("chdir(/newroot)");
  if (::mount(".", "/", nullptr, MS_MOVE, nullptr) != 0) return Errno("move mount /newroot to /");
  if (::chroot(".") != 0) return Errno("chroot(/newroot)");
  if (::chdir("/") != 0) return Errno("chdir(/)");
  const std::string& host = params.hostname;
  if (::sethostname(host.data(), host.size()) != 0) return Errno("sethostname(" + host + ")");
  return "";
}

std::string ApplyIdentity(const RootParams& params) {
  if (params.shm_mb != g_shm_mb) {
    if (::mount("shm", "/dev/shm", nullptr, MS_REMOUNT | MS_NOSUID | MS_NODEV,
                ("mode=1777,size=" + params.shm_mb + "m").c_str()) != 0) {
      return Errno("remount(/dev/shm, size=" + params.shm_mb + "m)");
    }
    g_shm_mb = params.shm_mb;
  }
  if (params.pids > 0 && !WriteSmallFile("/sys/fs/cgroup/warren/pids.max", std::to_string(params.pids))) {
    return Errno("write(/sys/fs/cgroup/warren/pids.max)");
  }
  const std::string& host = params.hostname;
  if (::sethostname(host.data(), host.size()) != 0) return Errno("sethostname(" + host + ")");
  return "";
}

std::string KernelRelease() {
  struct utsname u;
  if (::uname(&u) != 0) return "";
  return u.release;
}

std::string BootId() { return ReadSmallFile("/proc/sys/kernel/random/boot_id"); }

}  // namespace warren::guest
