#include "runtime/microvm/qemu.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/close_range.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/file_util.h"

extern char** environ;

namespace warren::runtime::microvm {

namespace {
constexpr size_t kMaxQmpLine = 1 << 20;
}  // namespace

StatusOr<Qmp> Qmp::Connect(const std::string& path, Clock::time_point deadline) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.size() >= sizeof sa.sun_path) return absl::InvalidArgumentError("QMP socket path too long: " + path);
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  while (true) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return ErrnoToStatus(errno, "socket(AF_UNIX)");
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) {
      Qmp q(std::move(fd), deadline);
      ASSIGN_OR_RETURN(std::string greeting, q.ReadLine(deadline));
      if (greeting.find("\"QMP\"") == std::string::npos) return absl::InternalError("QMP: no greeting: " + greeting);
      RETURN_IF_ERROR(q.Command(R"({"execute":"qmp_capabilities"})").status());
      return q;
    }
    // QEMU makes its socket before it accepts: retried until the deadline.
    Status last = ErrnoToStatus(errno, "connect(" + path + ")");
    if (Clock::now() >= deadline) return last;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

StatusOr<std::string> Qmp::Command(const std::string& json, int pass_fd, Clock::time_point deadline) {
  std::string out = json + "\n";
  size_t off = 0;
  if (pass_fd >= 0) {
    // The fd rides on the command's first bytes (QEMU takes it with them).
    iovec iov{out.data(), out.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    ssize_t n;
    do {
      n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n < 0) return absl::UnavailableError("QMP " + json + ": sendmsg: " + std::strerror(errno));
    off = static_cast<size_t>(n);
  }
  while (off < out.size()) {
    ssize_t n = ::send(fd_.get(), out.data() + off, out.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::UnavailableError("QMP " + json + ": send: " + std::strerror(errno));
    off += static_cast<size_t>(n);
  }
  while (true) {
    ASSIGN_OR_RETURN(std::string answer, ReadLine(deadline));
    nlohmann::json j = nlohmann::json::parse(answer, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return absl::UnavailableError("QMP " + json + ": not JSON: " + answer);
    if (j.contains("return")) return answer;
    if (j.contains("error")) {
      std::string desc = j["error"].is_object() ? j["error"].value("desc", answer) : answer;
      return absl::InternalError("QMP " + json + ": " + desc);
    }
    // An event ({"event": ...}): not an answer.
  }
}

StatusOr<std::string> Qmp::ReadLine(Clock::time_point deadline) {
  while (true) {
    size_t nl = buf_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return line;
    }
    if (buf_.size() > kMaxQmpLine) return absl::UnavailableError("QMP: a line over 1 MiB");
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return absl::DeadlineExceededError("QMP: QEMU did not answer in time");
    pollfd p{fd_.get(), POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(left));
    if (n < 0 && errno != EINTR) return ErrnoToStatus(errno, "poll(QMP)");
    if (n <= 0) continue;
    char chunk[4096];
    ssize_t r = ::recv(fd_.get(), chunk, sizeof chunk, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return absl::UnavailableError(std::string("QMP: recv: ") + std::strerror(errno));
    if (r == 0) return absl::UnavailableError("QMP: QEMU closed its monitor (exited?)");
    buf_.append(chunk, static_cast<size_t>(r));
  }
}

Status SetIgnoreShared(Qmp& qmp, bool on) {
  return qmp
      .Command(std::string(R"({"execute":"migrate-set-capabilities","arguments":{"capabilities":[)") +
               R"({"capability":"x-ignore-shared","state":)" + (on ? "true" : "false") + "}]}}")
      .status();
}

Status MigrateToFd(Qmp& qmp, int fd, Qmp::Clock::time_point deadline) {
  RETURN_IF_ERROR(qmp.Command(R"({"execute":"getfd","arguments":{"fdname":"state"}})", fd).status());
  RETURN_IF_ERROR(qmp.Command(R"({"execute":"migrate","arguments":{"uri":"fd:state"}})").status());
  while (true) {
    ASSIGN_OR_RETURN(std::string st, qmp.Command(R"({"execute":"query-migrate"})"));
    if (st.find("\"completed\"") != std::string::npos) return absl::OkStatus();
    if (st.find("\"failed\"") != std::string::npos || st.find("\"cancelled\"") != std::string::npos) {
      return absl::InternalError("saving the VM's state failed: " + st);
    }
    if (Qmp::Clock::now() > deadline)
      return absl::DeadlineExceededError("saving the VM's state did not complete in time");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Status MigrateFromFd(Qmp& qmp, int fd, Qmp::Clock::time_point deadline, bool* running) {
  RETURN_IF_ERROR(qmp.Command(R"({"execute":"getfd","arguments":{"fdname":"state"}})", fd).status());
  RETURN_IF_ERROR(qmp.Command(R"({"execute":"migrate-incoming","arguments":{"uri":"fd:state"}})").status());
  // Polled until QEMU left "inmigrate". A failed load makes QEMU exit:
  // Command() then fails (monitor closed).
  while (true) {
    ASSIGN_OR_RETURN(std::string st, qmp.Command(R"({"execute":"query-status"})"));
    if (st.find("\"running\": true") != std::string::npos) {
      *running = true;
      return absl::OkStatus();
    }
    if (st.find("\"inmigrate\"") == std::string::npos) {
      *running = false;
      return absl::OkStatus();
    }
    if (Qmp::Clock::now() > deadline)
      return absl::DeadlineExceededError("restoring the VM's state did not finish in time");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::vector<std::string> QemuArgv(const std::string& qemu, const VmConfig& c) {
  std::string append =
      "console=ttyS0 quiet panic=-1 mitigations=off i8042.noaux i8042.nomux i8042.nopnp "
      "i8042.dumbkbd cryptomgr.notests";
  // TCG: the guest's TSC is the host's (constant, invariant). tsc=reliable
  // keeps the clocksource watchdog from marking it unstable when jiffies
  // lag on a loaded host: the guest would fall back to jiffies, which are
  // not valid for high-resolution timers, so it would never leave the
  // periodic tick (250 wake-ups a second of an idle VM) and its clock would
  // drift.
  if (c.accel == "tcg" && c.tsc_khz != 0) append += " tsc_early_khz=" + std::to_string(c.tsc_khz) + " tsc=reliable";
  append += " warren.layers=" + std::to_string(c.layer_files.size());
  append += " warren.hostname=" + c.hostname;
  append += " warren.shm_mb=" + std::to_string(c.shm_mb);
  if (c.pids != 0 && !c.template_boot) append += " warren.pids=" + std::to_string(c.pids);
  if (c.template_boot) append += " warren.template=1";
  // A file passed as an open fd: its fd set (-add-fd; processed before any
  // device, wherever it stands).
  std::vector<std::string> fdsets;
  auto fdset = [&fdsets](int fd) {
    for (std::string& arg : AddFdArgs(fd, fd)) fdsets.push_back(std::move(arg));
    return FdSetPath(fd);
  };
  const std::string console = c.console_fd >= 0 ? fdset(c.console_fd) : c.console_log;
  std::string machine = "microvm,x-option-roms=off,rtc=on";
  if (c.ram_fd >= 0 || c.ram_named) machine += ",memory-backend=ram0";
  std::vector<std::string> a = {
      qemu,
      "-M",
      machine,
      "-accel",
      c.accel == "tcg" ? "tcg,tb-size=" + std::to_string(kTcgCacheMb) : c.accel,
      "-cpu",
      c.accel == "kvm" ? "host" : "max",
      "-m",
      std::to_string(c.memory_mb) + "M",
      "-smp",
      std::to_string(c.cpus),
      "-nodefaults",
      "-no-user-config",
      "-nographic",
      "-no-reboot",
      "-sandbox",
      kQemuSandbox,
      "-chardev",
      "file,id=console,path=" + console,
      "-serial",
      "chardev:console",
      "-device",
      "virtio-serial-device",
      "-chardev",
      "socket,id=agent,fd=" + std::to_string(c.agent_listen_fd) + ",server=on,wait=off",
      "-device",
      "virtserialport,chardev=agent,name=warren.agent",
  };
  if (!c.restore) {
    auto by_fd = [](int fd, const std::string& path) { return fd >= 0 ? ProcFdPath(fd) : path; };
    a.insert(a.end(),
             {"-kernel", by_fd(c.kernel_fd, c.kernel), "-initrd", by_fd(c.initrd_fd, c.initrd), "-append", append});
  }
  if (c.ram_fd >= 0) {
    a.insert(a.end(), {"-object", "memory-backend-file,id=ram0,size=" + std::to_string(c.memory_mb) +
                                      "M,mem-path=/proc/self/fd/" + std::to_string(c.ram_fd) +
                                      ",share=" + (c.ram_shared ? "on" : "off")});
  } else if (c.ram_named) {
    a.insert(a.end(), {"-object", "memory-backend-ram,id=ram0,size=" + std::to_string(c.memory_mb) + "M"});
  }
  if (c.qmp_listen_fd >= 0) {
    a.insert(a.end(), {"-chardev", "socket,id=qmp,fd=" + std::to_string(c.qmp_listen_fd) + ",server=on,wait=off",
                       "-mon", "chardev=qmp,mode=control"});
  }
  if (c.restore) a.insert(a.end(), {"-incoming", "defer"});
  if (!c.name.empty()) a.insert(a.end(), {"-name", QemuOptValue(c.name) + ",debug-threads=on"});
  // Devices from here on, in one order for template and clone (the
  // migration stream names virtio-mmio devices by creation order).
  for (size_t i = 0; i < c.layer_files.size(); ++i) {
    std::string id = "l" + std::to_string(i);
    const std::string path = i < c.layer_fds.size() && c.layer_fds[i] >= 0 ? fdset(c.layer_fds[i]) : c.layer_files[i];
    const std::string file = QemuOptValue(path);
    a.insert(a.end(), {"-drive", "file=" + file + ",if=none,id=" + id + ",format=raw,readonly=on", "-device",
                       "virtio-blk-device,drive=" + id + ",serial=wl" + std::to_string(i)});
  }
  std::string disk_path = c.disk;
  if (c.disk_fd >= 0) {
    disk_path = fdset(c.disk_fd);
    if (c.disk_ro_fd >= 0) {
      for (std::string& arg : AddFdArgs(c.disk_ro_fd, c.disk_fd)) fdsets.push_back(std::move(arg));
    }
  }
  const std::string disk = QemuOptValue(disk_path);
  a.insert(a.end(), {"-drive", "file=" + disk + ",if=none,id=wdisk,format=raw,cache=unsafe,discard=unmap", "-device",
                     "virtio-blk-device,drive=wdisk,serial=wdisk", "-device", "virtio-rng-device"});
  if (c.nic) {
    if (c.tap_fd >= 0) a.insert(a.end(), {"-netdev", "tap,id=net0,fd=" + std::to_string(c.tap_fd)});
    a.insert(a.end(), {"-device", std::string("virtio-net-device,id=nic0") + (c.tap_fd >= 0 ? ",netdev=net0" : "")});
  }
  a.insert(a.end(), fdsets.begin(), fdsets.end());
  return a;
}

uint64_t ProcessStartTime(pid_t pid) {
  StatusOr<std::string> stat = ReadSmallFile("/proc/" + std::to_string(pid) + "/stat", 4096);
  if (!stat.ok()) return 0;
  size_t paren = stat->rfind(')');
  if (paren == std::string::npos) return 0;
  // Fields after the command: state is field 3, start time field 22.
  size_t pos = paren + 2;
  for (int field = 3; field < 22; ++field) {
    pos = stat->find(' ', pos);
    if (pos == std::string::npos) return 0;
    ++pos;
  }
  return std::strtoull(stat->c_str() + pos, nullptr, 10);
}

StatusOr<int> QemuFiles::Open(const std::string& path, int flags) {
  UniqueFd fd(::open(path.c_str(), flags | O_CLOEXEC, 0600));
  if (!fd.valid()) return ErrnoToStatus(errno, "open(" + path + ")");
  const int target = next_++;
  fds_.push_back({fd.get(), target});
  owned_.push_back(std::move(fd));
  return target;
}

void QemuFiles::MoveTo(std::vector<UniqueFd>* owned, std::vector<std::pair<int, int>>* fds) {
  fds->insert(fds->end(), fds_.begin(), fds_.end());
  for (UniqueFd& fd : owned_) owned->push_back(std::move(fd));
  fds_.clear();
  owned_.clear();
}

std::vector<std::string> AddFdArgs(int fd, int set) {
  return {"-add-fd", "fd=" + std::to_string(fd) + ",set=" + std::to_string(set)};
}

std::string QemuOptValue(const std::string& value) {
  std::string out;
  for (char c : value) out += c == ',' ? std::string(",,") : std::string(1, c);
  return out;
}

Status OpenVmFiles(VmConfig* vm, int first_target, std::vector<UniqueFd>* owned,
                   std::vector<std::pair<int, int>>* fds) {
  QemuFiles files(first_target);
  vm->layer_fds.assign(vm->layer_files.size(), -1);
  for (size_t i = 0; i < vm->layer_files.size(); ++i) {
    ASSIGN_OR_RETURN(vm->layer_fds[i], files.Open(vm->layer_files[i], O_RDONLY));
  }
  ASSIGN_OR_RETURN(vm->disk_fd, files.Open(vm->disk, O_RDWR));
  ASSIGN_OR_RETURN(vm->disk_ro_fd, files.Open(vm->disk, O_RDONLY));
  ASSIGN_OR_RETURN(vm->console_fd, files.Open(vm->console_log, O_WRONLY | O_CREAT | O_APPEND));
  if (!vm->restore) {
    ASSIGN_OR_RETURN(vm->kernel_fd, files.Open(vm->kernel, O_RDONLY));
    ASSIGN_OR_RETURN(vm->initrd_fd, files.Open(vm->initrd, O_RDONLY));
  }
  files.MoveTo(owned, fds);
  return absl::OkStatus();
}

StatusOr<LaunchedQemu> LaunchQemu(const std::vector<std::string>& argv, const std::vector<std::pair<int, int>>& fds,
                                  const std::string& log_path, const std::vector<int>& procs_fds, QemuIdentity id) {
  constexpr size_t kMaxFds = kMaxQemuFd - 2;
  if (fds.empty() || fds.size() > kMaxFds) return absl::InvalidArgumentError("LaunchQemu: too many fds");
  int max_target = 2;
  for (const auto& [src, target] : fds) {
    if (target < 3 || target > kMaxQemuFd) return absl::InvalidArgumentError("LaunchQemu: fd targets must be 3..90");
    max_target = std::max(max_target, target);
  }
  UniqueFd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!devnull.valid()) return ErrnoToStatus(errno, "open(/dev/null)");
  UniqueFd log(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (!log.valid()) return ErrnoToStatus(errno, "open(" + log_path + ")");
  int rep[2];
  if (::pipe2(rep, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe2");
  UniqueFd rep_r(rep[0]), rep_w(rep[1]);
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& s : argv) args.push_back(const_cast<char*>(s.c_str()));
  args.push_back(nullptr);

  pid_t pid = ::fork();
  if (pid < 0) return ErrnoToStatus(errno, "fork (qemu)");
  if (pid == 0) {
    // Async-signal-safe only: the daemon is multi-threaded. The report
    // pipe and the fds move above every target first, so that filling 0-2
    // and the targets cannot overwrite them.
    int rep_fd = ::fcntl(rep_w.get(), F_DUPFD_CLOEXEC, kMaxQemuFd + 1);
    auto fail = [&](int step) {
      int msg[2] = {step, errno};
      ssize_t ignored = ::write(rep_fd, msg, sizeof msg);
      (void)ignored;
      ::_exit(127);
    };
    int moved[kMaxFds];
    for (size_t i = 0; i < fds.size(); ++i) {
      moved[i] = ::fcntl(fds[i].first, F_DUPFD_CLOEXEC, kMaxQemuFd + 1);
      if (moved[i] < 0) fail(3);
    }
    if (rep_fd < 0) fail(3);
    for (int fd : procs_fds) {
      if (::write(fd, "0", 1) != 1) fail(1);
    }
    if (::setsid() < 0) fail(2);
    if (::dup2(devnull.get(), 0) < 0 || ::dup2(log.get(), 1) < 0 || ::dup2(log.get(), 2) < 0) fail(3);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (::dup2(moved[i], fds[i].second) < 0) fail(3);  // dup2 clears close-on-exec
    }
    // Nothing else goes to QEMU (CLOSE_RANGE_CLOEXEC: Linux 5.11).
    if (::syscall(SYS_close_range, max_target + 1, ~0U, CLOSE_RANGE_CLOEXEC) != 0) fail(3);
    // Its own ids last (the cgroup files and fds above needed root): with
    // every uid non-zero the kernel clears all capabilities.
    if (id.uid != 0 || id.gid != 0) {
      if (::setgroups(0, nullptr) != 0) fail(5);
      if (::setresgid(id.gid, id.gid, id.gid) != 0) fail(5);
      if (::setresuid(id.uid, id.uid, id.uid) != 0) fail(5);
    }
    ::execve(args[0], args.data(), environ);
    fail(4);
  }
  rep_w.reset();
  int msg[2] = {0, 0};
  ssize_t got;
  do {
    got = ::read(rep_r.get(), msg, sizeof msg);
  } while (got < 0 && errno == EINTR);
  if (got == static_cast<ssize_t>(sizeof msg)) {
    int st;
    ::waitpid(pid, &st, 0);
    const char* step = msg[0] == 1   ? "joining the VM's cgroup"
                       : msg[0] == 2 ? "setsid"
                       : msg[0] == 3 ? "dup2"
                       : msg[0] == 5 ? "setgroups/setresgid/setresuid"
                                     : "execve";
    return ErrnoToStatus(msg[1], std::string("starting ") + argv[0] + ": " + step);
  }
  LaunchedQemu out;
  out.pid = pid;
  out.pidfd.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!out.pidfd.valid()) {
    Status s = ErrnoToStatus(errno, "pidfd_open(" + std::to_string(pid) + ")");
    ::kill(pid, SIGKILL);
    int st;
    ::waitpid(pid, &st, 0);
    return s;
  }
  out.start_time = ProcessStartTime(pid);
  return out;
}

uint32_t HostTscKhz() {
  static std::once_flag once;
  static uint32_t khz = 0;
  std::call_once(once, [] {
    auto now_ns = [] {
      timespec ts;
      ::clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
      return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
    };
    int64_t t0 = now_ns();
    uint64_t c0 = __rdtsc();
    timespec nap{0, 50L * 1000 * 1000};
    ::nanosleep(&nap, nullptr);
    int64_t t1 = now_ns();
    uint64_t c1 = __rdtsc();
    // cycles per ns * 10^6 = cycles per ms = kHz.
    if (t1 > t0) khz = static_cast<uint32_t>((c1 - c0) * 1000000 / static_cast<uint64_t>(t1 - t0));
  });
  return khz;
}

Status MakeDisk(const std::string& path, uint32_t size_mb) {
  {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd.valid()) return ErrnoToStatus(errno, "open(" + path + ", O_CREAT|O_EXCL)");
    if (::ftruncate(fd.get(), static_cast<off_t>(size_mb) << 20) != 0) {
      Status s = ErrnoToStatus(errno, "ftruncate(" + path + ", " + std::to_string(size_mb) + " MiB)");
      ::unlink(path.c_str());
      return s;
    }
  }
  std::vector<std::string> argv = {
      "mke2fs", "-q",           "-F", "-t", "ext4", "-O", "^has_journal", "-m", "0", "-E", "assume_storage_prezeroed=1",
      "-L",     "warren-upper", path};
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& s : argv) args.push_back(const_cast<char*>(s.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  int rc = ::posix_spawnp(&pid, "mke2fs", &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    ::unlink(path.c_str());
    return ErrnoToStatus(rc, "posix_spawnp(mke2fs)");
  }
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0) {
    if (errno != EINTR) {
      Status s = ErrnoToStatus(errno, "waitpid(mke2fs)");
      ::unlink(path.c_str());
      return s;
    }
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    ::unlink(path.c_str());
    return absl::InternalError("mke2fs " + path + " failed (status " + std::to_string(st) + ")");
  }
  return absl::OkStatus();
}

Status CopyDisk(const std::string& from, const std::string& path) {
  UniqueFd in(::open(from.c_str(), O_RDONLY | O_CLOEXEC));
  if (!in.valid()) return ErrnoToStatus(errno, "open(" + from + ")");
  struct stat st;
  if (::fstat(in.get(), &st) != 0) return ErrnoToStatus(errno, "fstat(" + from + ")");
  UniqueFd out(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!out.valid()) return ErrnoToStatus(errno, "open(" + path + ", O_CREAT|O_EXCL)");
  auto fail = [&path](const Status& s) {
    ::unlink(path.c_str());
    return s;
  };
  if (::ftruncate(out.get(), st.st_size) != 0) return fail(ErrnoToStatus(errno, "ftruncate(" + path + ")"));
  bool by_copy_range = true;
  std::vector<char> buf(1 << 20);
  off_t pos = 0;
  while (pos < st.st_size) {
    off_t data = ::lseek(in.get(), pos, SEEK_DATA);
    if (data < 0 && errno == ENXIO) break;  // only a hole is left
    if (data < 0) return fail(ErrnoToStatus(errno, "lseek(" + from + ", SEEK_DATA)"));
    off_t hole = ::lseek(in.get(), data, SEEK_HOLE);
    if (hole < 0) return fail(ErrnoToStatus(errno, "lseek(" + from + ", SEEK_HOLE)"));
    off_t off_in = data, off_out = data;
    while (off_in < hole) {
      const size_t want = static_cast<size_t>(hole - off_in);
      ssize_t n = by_copy_range ? ::copy_file_range(in.get(), &off_in, out.get(), &off_out, want, 0) : -1;
      if (n < 0 && by_copy_range && (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP)) {
        by_copy_range = false;  // another file system (a template on tmpfs): read and write
        continue;
      }
      if (!by_copy_range) {
        n = ::pread(in.get(), buf.data(), std::min(want, buf.size()), off_in);
        if (n > 0 && ::pwrite(out.get(), buf.data(), static_cast<size_t>(n), off_out) != n) n = -1;
        if (n > 0) off_in += n, off_out += n;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return fail(ErrnoToStatus(errno, "copying " + from + " to " + path));
      if (n == 0) break;  // the source shrank under us
    }
    pos = hole;
  }
  return absl::OkStatus();
}

}  // namespace warren::runtime::microvm
