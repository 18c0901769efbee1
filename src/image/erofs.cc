#include "image/erofs.h"

#include <fcntl.h>
#include <linux/loop.h>
#include <poll.h>
#include <spawn.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <vector>

extern char** environ;

namespace warren::image {
namespace {

constexpr size_t kMaxStderr = size_t{16} * 1024;
// Free bytes below which a failed mkfs.erofs is taken to have run out of space.
constexpr uint64_t kFullBytes = uint64_t{1} << 20;

// Reads `fd` to EOF, keeping at most kMaxStderr bytes.
std::string Drain(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (out.size() < kMaxStderr) {
      out.append(buf, std::min(static_cast<size_t>(n), kMaxStderr - out.size()));
    }
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// Copies the file `from` to a new file `to` (0644), read/write in 1 MiB
// pieces (works across file systems, FUSE ones included).
Status CopyNewFile(const std::string& from, const std::string& to) {
  UniqueFd in(open(from.c_str(), O_RDONLY | O_CLOEXEC));
  if (!in.valid()) return ErrnoToStatus(errno, "open(" + from + ")");
  UniqueFd out(open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!out.valid()) return ErrnoToStatus(errno, "open(" + to + ")");
  std::vector<char> buf(1 << 20);
  for (;;) {
    ssize_t n = read(in.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "read(" + from + ")");
    if (n == 0) break;
    for (ssize_t done = 0; done < n;) {
      ssize_t w = write(out.get(), buf.data() + done, static_cast<size_t>(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return ErrnoToStatus(errno, "write(" + to + ")");
      done += w;
    }
  }
  if (fsync(out.get()) != 0) return ErrnoToStatus(errno, "fsync(" + to + ")");
  return absl::OkStatus();
}

Status RunMkfsErofs(const std::string& image, const std::string& src_dir, bool chunked, bool from_sandbox);

}  // namespace

Status MkfsErofs(const std::string& image, const std::string& src_dir, bool chunked, bool from_sandbox) {
  if (!chunked) return RunMkfsErofs(image, src_dir, false, from_sandbox);
  // mkfs.erofs 1.5 keeps a chunk-based build's file data in a tmpfile(3),
  // always under /tmp, and copies it into the image with copy_file_range:
  // across file systems (EXDEV, e.g. a store on GlusterFS) its fallback
  // fails the build with EIO. So the image is built beside that tmpfile and
  // then copied to `image`.
  char tmp[] = "/tmp/warren-mkfs-XXXXXX";
  UniqueFd fd(mkstemp(tmp));
  if (!fd.valid()) return ErrnoToStatus(errno, "mkstemp(/tmp/warren-mkfs-XXXXXX)");
  fd.reset();
  Status st = RunMkfsErofs(tmp, src_dir, true, from_sandbox);
  if (st.ok()) {
    st = CopyNewFile(tmp, image);
    if (!st.ok()) st = Status(st.code(), "mkfs.erofs: putting the built image in place: " + std::string(st.message()));
  }
  unlink(tmp);
  return st;
}

namespace {

Status RunMkfsErofs(const std::string& image, const std::string& src_dir, bool chunked, bool from_sandbox) {
  // --preserve-mtime keeps per-file mtimes; a fixed UUID and a fixed build
  // time make the image a function of the tree. SOURCE_DATE_EPOCH is the only
  // way erofs-utils 1.5 takes a fixed build time without also overriding
  // file mtimes (-T does): it clamps mtimes to it, so use the largest u32
  // time (2106) and nothing real is clamped.
  std::vector<std::string> args = {
      "mkfs.erofs",
      "--quiet",
      "--preserve-mtime",
      "-U",
      from_sandbox ? "00000000-0000-0000-0000-000000000001" : "00000000-0000-0000-0000-000000000000",
      image,
      src_dir};
  if (chunked) args.insert(args.begin() + 1, "--chunksize=4096");
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  std::vector<std::string> env_store;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (strncmp(*e, "SOURCE_DATE_EPOCH=", 18) != 0) env_store.emplace_back(*e);
  }
  env_store.emplace_back("SOURCE_DATE_EPOCH=4294967295");
  std::vector<char*> envp;
  envp.reserve(env_store.size() + 1);
  for (auto& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);

  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe2()");
  UniqueFd rd(pipefd[0]), wr(pipefd[1]);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, wr.get(), 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Default signal dispositions and an empty mask in the child, whatever the
  // daemon set up for its own threads.
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, "mkfs.erofs", &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return ErrnoToStatus(rc, "posix_spawnp(mkfs.erofs)");
  wr.reset();
  std::string err = Drain(rd.get());
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0) {
    if (errno != EINTR) return ErrnoToStatus(errno, "waitpid(mkfs.erofs)");
  }
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) return absl::OkStatus();
  // mkfs.erofs follows its "<E> ..." error lines with its usage text; keep
  // only the error lines when there are any.
  std::string errors;
  for (size_t pos = 0; pos < err.size();) {
    size_t end = err.find('\n', pos);
    if (end == std::string::npos) end = err.size();
    if (err.substr(pos, end - pos).find("<E>") != std::string::npos) {
      if (!errors.empty()) errors += "; ";
      errors += err.substr(pos, end - pos);
    }
    pos = end + 1;
  }
  if (!errors.empty()) err = errors;
  std::string how = WIFEXITED(wstatus) ? "exit status " + std::to_string(WEXITSTATUS(wstatus))
                                       : "signal " + std::to_string(WTERMSIG(wstatus));
  // A full file system under the image is the caller's to act on (free
  // space, retry elsewhere), not an internal error. mkfs.erofs reports
  // ENOSPC in words (or only as a failed write), so ask the file system:
  // the partial image is still there, so it is still full.
  const std::string dir = image.substr(0, image.rfind('/') + 1);
  struct statvfs vfs;
  const bool full =
      err.find(strerror(ENOSPC)) != std::string::npos ||
      (statvfs(dir.c_str(), &vfs) == 0 && static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize < kFullBytes);
  if (full) return ErrnoToStatus(ENOSPC, "mkfs.erofs " + image + " " + src_dir + " (" + how + ": " + err + ")");
  return absl::InternalError("mkfs.erofs " + image + " " + src_dir + " failed (" + how + "): " + err);
}

}  // namespace

namespace {

// Sets up a read-only autoclear loop device over `image`. Returns its fd
// (the device goes away once this fd is closed and nothing mounts it).
StatusOr<UniqueFd> SetupLoop(const std::string& image, std::string* dev_path) {
  UniqueFd file(open(image.c_str(), O_RDONLY | O_CLOEXEC));
  if (!file.valid()) return ErrnoToStatus(errno, "open(" + image + ")");
  UniqueFd ctl(open("/dev/loop-control", O_RDWR | O_CLOEXEC));
  if (!ctl.valid()) return ErrnoToStatus(errno, "open(/dev/loop-control)");
  // Another process may grab the free device between GET_FREE and CONFIGURE.
  for (int attempt = 0; attempt < 16; ++attempt) {
    int n = ioctl(ctl.get(), LOOP_CTL_GET_FREE);
    if (n < 0) return ErrnoToStatus(errno, "ioctl(/dev/loop-control, LOOP_CTL_GET_FREE)");
    std::string dev = "/dev/loop" + std::to_string(n);
    UniqueFd lfd(open(dev.c_str(), O_RDONLY | O_CLOEXEC));
    if (!lfd.valid()) return ErrnoToStatus(errno, "open(" + dev + ")");
    loop_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.fd = static_cast<uint32_t>(file.get());
    cfg.info.lo_flags = LO_FLAGS_READ_ONLY | LO_FLAGS_AUTOCLEAR;
    strncpy(reinterpret_cast<char*>(cfg.info.lo_file_name), image.c_str(), LO_NAME_SIZE - 1);
    if (ioctl(lfd.get(), LOOP_CONFIGURE, &cfg) == 0) {
      *dev_path = dev;
      return lfd;
    }
    if (errno != EBUSY) return ErrnoToStatus(errno, "ioctl(" + dev + ", LOOP_CONFIGURE)");
  }
  return ErrnoToStatus(EBUSY, "loop device for " + image);
}

StatusOr<UniqueFd> FsMountErofs(const std::string& source, const std::string& what) {
  UniqueFd fs(fsopen("erofs", FSOPEN_CLOEXEC));
  if (!fs.valid()) return ErrnoToStatus(errno, "fsopen(erofs)");
  if (fsconfig(fs.get(), FSCONFIG_SET_STRING, "source", source.c_str(), 0) != 0) {
    return ErrnoToStatus(errno, "fsconfig(source=" + source + ")");
  }
  // Read-only superblock: otherwise a block device source is opened for
  // writing, which a read-only loop device refuses (EACCES).
  if (fsconfig(fs.get(), FSCONFIG_SET_FLAG, "ro", nullptr, 0) != 0) {
    return ErrnoToStatus(errno, "fsconfig(ro) for " + what);
  }
  if (fsconfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) {
    return ErrnoToStatus(errno, "fsconfig(FSCONFIG_CMD_CREATE) for " + what);
  }
  int m = fsmount(fs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID);
  if (m < 0) return ErrnoToStatus(errno, "fsmount(" + what + ")");
  return UniqueFd(m);
}

}  // namespace

StatusOr<UniqueFd> MountErofs(const std::string& image, ErofsSource how) {
  const bool chosen = how == ErofsSource::kAuto;
  if (chosen) how = ErofsFileBackedSupported() ? ErofsSource::kFile : ErofsSource::kLoop;
  struct stat st;
  if (stat(image.c_str(), &st) != 0) return ErrnoToStatus(errno, "stat(" + image + ")");
  if (!S_ISREG(st.st_mode)) return ErrnoToStatus(EINVAL, "EROFS image " + image);
  if (how == ErofsSource::kFile) {
    StatusOr<UniqueFd> m = FsMountErofs(image, image);
    // The kernel backs EROFS only by files whose file system reads folios
    // through its address space; on others (tmpfs) it answers ENOTBLK:
    // a loop device reads them through read_iter.
    if (m.ok() || !chosen || StatusErrno(m.status()) != ENOTBLK) return m;
  }
  std::string dev;
  ASSIGN_OR_RETURN(UniqueFd loop, SetupLoop(image, &dev));
  // The mount holds the device; closing `loop` leaves autoclear to free it
  // when the mount goes away (or right now if the mount failed).
  return FsMountErofs(dev, image + " on " + dev);
}

bool ErofsFileBackedSupported() {
  static std::once_flag once;
  static bool supported = false;
  std::call_once(once, [] {
    // A kernel without file-backed EROFS refuses a regular-file source with
    // ENOTBLK before reading it; one with it reads the superblock and fails
    // on the bad magic (EINVAL). The probe file is an empty tmpfile.
    UniqueFd fs(fsopen("erofs", FSOPEN_CLOEXEC));
    if (!fs.valid()) return;
    char path[] = "/tmp/warren-erofs-probe-XXXXXX";
    UniqueFd f(mkstemp(path));
    if (!f.valid()) return;
    if (ftruncate(f.get(), 4096) != 0) {
      unlink(path);
      return;
    }
    int rc = fsconfig(fs.get(), FSCONFIG_SET_STRING, "source", path, 0);
    if (rc == 0) rc = fsconfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0);
    int err = errno;
    unlink(path);
    supported = rc == 0 || (err != ENOTBLK && err != ENODEV);
  });
  return supported;
}

}  // namespace warren::image
