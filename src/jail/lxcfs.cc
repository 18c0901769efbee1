#include "jail/lxcfs.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "common/file_util.h"

extern char** environ;

namespace warren::jail {
namespace {

constexpr long kFuseSuperMagic = 0x65735546;
const char* const kProcFiles[] = {"meminfo", "cpuinfo", "stat", "uptime", "loadavg", "swaps", "diskstats"};

bool IsFuse(const std::string& path) {
  struct statfs fs;
  return ::statfs(path.c_str(), &fs) == 0 && fs.f_type == kFuseSuperMagic;
}

// The mount answers: its meminfo reads.
bool Answers(const std::string& mnt) {
  if (!IsFuse(mnt)) return false;
  const int fd = ::open((mnt + "/proc/meminfo").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[64];
  const ssize_t n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  return n > 0;
}

// The pid in lxcfs's pid file when that process is alive and is lxcfs (a
// pid file outlives its process, and the pid may be reused).
pid_t ReadPid(const std::string& path) {
  std::ifstream f(path);
  long v = 0;
  if (!(f >> v) || v <= 1) return -1;
  const auto pid = static_cast<pid_t>(v);
  StatusOr<std::string> comm = ReadSmallFile("/proc/" + std::to_string(pid) + "/comm", 64);
  if (!comm.ok() || comm->rfind("lxcfs", 0) != 0) return -1;
  return ::kill(pid, 0) == 0 ? pid : -1;
}

// Where the binary is, from PATH (posix_spawnp would too, but we want to say
// FailedPrecondition when it is missing).
std::string FindBinary(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  for (const char* dir : {"/usr/bin", "/usr/local/bin", "/bin", "/usr/sbin"}) {
    std::string p = std::string(dir) + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

}  // namespace

StatusOr<std::unique_ptr<Lxcfs>> Lxcfs::Start(const std::string& dir, const std::string& binary) {
  auto l = std::unique_ptr<Lxcfs>(new Lxcfs);
  l->dir_ = dir;
  l->mnt_ = dir + "/mnt";
  const std::string pidfile = dir + "/lxcfs.pid";
  RETURN_IF_ERROR(MkdirAll(dir, 0755));
  // A failed start leaves no dir behind (rmdir removes only empty ones: an
  // earlier lxcfs's log stays for the operator).
  struct Undo {
    const std::string &mnt, &dir;
    bool armed = true;
    ~Undo() {
      if (!armed) return;
      (void)::rmdir(mnt.c_str());
      (void)::rmdir(dir.c_str());
    }
  } undo{l->mnt_, l->dir_};
  if (::mkdir(l->mnt_.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoToStatus(errno, "mkdir(" + l->mnt_ + ")");
  l->pid_ = ReadPid(pidfile);
  if (l->pid_ > 0 && Answers(l->mnt_)) {
    // A previous daemon's: adopt it.
  } else {
    if (l->pid_ > 0) (void)::kill(l->pid_, SIGKILL);
    // A dead lxcfs leaves its mount behind (ENOTCONN): detach it.
    if (IsFuse(l->mnt_) || ::access((l->mnt_ + "/proc").c_str(), F_OK) != 0)
      (void)::umount2(l->mnt_.c_str(), MNT_DETACH);
    const std::string bin = FindBinary(binary);
    if (bin.empty())
      return absl::FailedPreconditionError("lxcfs: " + binary + " not installed (apt-get install lxcfs)");
    if (::access("/dev/fuse", R_OK | W_OK) != 0) return ErrnoToStatus(errno, "lxcfs: access(/dev/fuse)");
    const std::string log = dir + "/lxcfs.log";
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawnattr_t at;
    posix_spawnattr_init(&at);
    sigset_t none;
    sigemptyset(&none);
    sigset_t all;
    sigfillset(&all);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &all);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    // Not the daemon's child: started through setsid(1) --fork, whose
    // child it is, so it is re-parented to init at once. It outlives a
    // daemon that leaves sandboxes running, in its own session (a signal to
    // the daemon's process group does not reach it); its pid comes from the
    // pid file. -f: lxcfs itself stays in the foreground of that process.
    // --enable-cfs: cpu views from the CFS quota, not only the cpuset.
    const std::string setsid = FindBinary("setsid");
    if (setsid.empty()) return absl::FailedPreconditionError("lxcfs: setsid (util-linux) not installed");
    std::string a0 = setsid, a1 = "--fork", a2 = bin, a3 = "-f", a4 = "--enable-cfs", a5 = "-p", a6 = pidfile,
                a7 = l->mnt_;
    char* argv[] = {a0.data(), a1.data(), a2.data(), a3.data(), a4.data(), a5.data(), a6.data(), a7.data(), nullptr};
    pid_t pid = -1;
    (void)::unlink(pidfile.c_str());
    const int rc = posix_spawn(&pid, setsid.c_str(), &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (rc != 0) return ErrnoToStatus(rc, "posix_spawn(" + setsid + " --fork " + bin + ")");
    int status = 0;
    if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
      return absl::UnavailableError("lxcfs failed to start (see " + log + ")");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (int i = 0; i < 500 && !Answers(l->mnt_); ++i) {
      if (std::chrono::steady_clock::now() > deadline) {
        l->pid_ = ReadPid(pidfile);
        l->Stop();
        return absl::UnavailableError("lxcfs did not mount " + l->mnt_ + " within 5 s (see " + log + ")");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    l->pid_ = ReadPid(pidfile);
  }
  for (const char* f : kProcFiles) {
    if (::access((l->mnt_ + "/proc/" + f).c_str(), R_OK) == 0) l->proc_files_.push_back(f);
  }
  l->cpu_online_ = ::access((l->mnt_ + "/sys/devices/system/cpu/online").c_str(), R_OK) == 0;
  undo.armed = false;
  return l;
}

void Lxcfs::StopAt(const std::string& dir) {
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return;
  Lxcfs l;
  l.dir_ = dir;
  l.mnt_ = dir + "/mnt";
  l.pid_ = ReadPid(dir + "/lxcfs.pid");
  l.Stop();
}

void Lxcfs::Stop() {
  if (pid_ > 0) {
    (void)::kill(pid_, SIGTERM);
    // Not our child: wait (bounded) for it to go.
    for (int i = 0; i < 200 && ::kill(pid_, 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (::kill(pid_, 0) == 0) (void)::kill(pid_, SIGKILL);
    pid_ = -1;
  }
  (void)::umount2(mnt_.c_str(), MNT_DETACH);
  (void)::unlink((dir_ + "/lxcfs.pid").c_str());
  (void)::unlink((dir_ + "/lxcfs.log").c_str());
  (void)::rmdir(mnt_.c_str());
  (void)::rmdir(dir_.c_str());
}

}  // namespace warren::jail
