// QEMU for one microvm sandbox: its command line and its launch.
//
// Machine: `-M microvm` (no PCI, no firmware: direct kernel boot), its
// virtio-mmio devices enumerated by the guest through ACPI (the Debian cloud
// kernel does not build VIRTIO_MMIO_CMDLINE_DEVICES). Devices: a
// virtio-serial port "warren.agent" on a unix socket chardev (the daemon
// passes the LISTENING socket as an fd, so its path may be longer than
// sun_path), one read-only virtio-blk disk per layer (serial wl<i>, bottom
// first), the writable disk (serial wdisk), virtio-rng; no NIC. The serial
// console goes to a file; QEMU's stdin is /dev/null, its own messages go to
// a log file. `-sandbox on` with every deny option (QEMU's seccomp filter).
//
// Accelerator: "tcg" (default) or "kvm". Under TCG the guest's TSC is the
// host's TSC and microvm offers the guest no PIT/HPET reference to measure
// it, so the kernel is told its frequency (tsc_early_khz=, measured once on
// the host by HostTscKhz()); without it the stock kernel hangs calibrating.
// TCG's translation cache is bounded (tb-size) so that the VM's memory
// overhead is known.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace warren::runtime::microvm {

// QEMU's memory beyond the guest's RAM, charged to the VM's cgroup: the
// TCG translation cache plus QEMU's own heap, threads and device buffers.
constexpr uint32_t kTcgCacheMb = 32;
constexpr uint32_t kQemuOverheadMb = kTcgCacheMb + 96;

struct VmConfig {
  std::string kernel;  // bzImage
  std::string initrd;  // newc cpio with the agent as /init
  std::string accel = "tcg";
  uint32_t tsc_khz = 0;  // TCG: the host's TSC frequency
  uint32_t memory_mb = 256;
  uint32_t cpus = 1;
  std::vector<std::string> layer_files;  // EROFS images, bottom first
  std::string disk;                      // the writable disk (ext4)
  std::string console_log;
  std::string name;  // -name: what names the VM in `ps` (a sandbox id, a template's dir)
  std::string hostname;
  uint32_t shm_mb = 64;
  uint32_t pids = 0;        // the sandbox's task limit inside the guest (0: none)
  int agent_listen_fd = 3;  // fd number of the listening socket in QEMU
  // Warm starts (template.h). The guest RAM is a memory-backend-file on
  // /proc/self/fd/<ram_fd> (a memfd QEMU inherits) when ram_fd >= 0, mapped
  // shared (the template writes it) or private (a clone: copy-on-write).
  int ram_fd = -1;
  bool ram_shared = false;
  // Without ram_fd: the RAM is still the named backend "ram0" (anonymous
  // memory), so that the state of a clone (whose RAM block is "ram0") can be
  // restored into it after a suspend.
  bool ram_named = false;
  int qmp_listen_fd = -1;      // QMP monitor on this listening socket when >= 0
  bool template_boot = false;  // warren.template=1: the agent holds its disks
  // A clone: no kernel boot (the RAM holds the running guest), -incoming
  // defer (the state comes over QMP).
  bool restore = false;
  // Files QEMU gets as open fds (its uid may not reach the paths): when
  // set (>= 0), the fd number in QEMU of each layer file, the disk and the
  // console log; QEMU opens them as /dev/fdset/<n> (-add-fd). OpenVmFiles
  // fills them.
  std::vector<int> layer_fds;
  int disk_fd = -1;     // read-write; the set also holds disk_ro_fd:
  int disk_ro_fd = -1;  // QEMU opens a read-write disk read-only first
  int console_fd = -1;
  // The kernel and initramfs (a boot) as /proc/self/fd/<n>: QEMU reads them
  // by path, which skips the directories it could not search; the files
  // themselves must be readable by all (CheckMicrovmHost).
  int kernel_fd = -1;
  int initrd_fd = -1;
};

// QEMU's own seccomp filter (`-sandbox`), every deny option: no obsolete
// syscalls, no setuid/setgid/capset, no fork/exec, no setpriority or
// affinity changes. Every QEMU warren starts (microvm, vm) runs under it.
inline constexpr char kQemuSandbox[] = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";

// The files a QEMU gets as open fds rather than paths (it runs as a uid of
// its own that may not reach them), numbered in QEMU from `first_target`
// on. Open() opens one here (O_CLOEXEC added, mode 0600 when created) and
// returns its number in QEMU; fds() are the (fd here, fd in QEMU) pairs for
// LaunchQemu; the fds stay open until this object goes (after the launch).
// QEMU opens a file it got this way as /dev/fdset/<n> (AddFdArgs: an fd set
// per file; QEMU picks the fd of the set whose access mode matches its
// open) or, where it opens by plain path (-kernel, -initrd), as
// /proc/self/fd/<n> (the file must then be readable by QEMU's uid).
class QemuFiles {
 public:
  explicit QemuFiles(int first_target) : next_(first_target) {}
  StatusOr<int> Open(const std::string& path, int flags);
  const std::vector<std::pair<int, int>>& fds() const { return fds_; }
  // Hands the fds and their pairs over (appended), leaving this empty.
  void MoveTo(std::vector<UniqueFd>* owned, std::vector<std::pair<int, int>>* fds);

 private:
  int next_;
  std::vector<UniqueFd> owned_;
  std::vector<std::pair<int, int>> fds_;
};

// "-add-fd fd=<fd>,set=<set>": fd `fd` of QEMU into fd set `set`.
std::vector<std::string> AddFdArgs(int fd, int set);
inline std::string FdSetPath(int set) { return "/dev/fdset/" + std::to_string(set); }
inline std::string ProcFdPath(int fd) { return "/proc/self/fd/" + std::to_string(fd); }
// A path (or any value) in a QEMU option list: QEMU's option parser splits
// at ',', so one is doubled.
std::string QemuOptValue(const std::string& value);

// The VM's files opened for QEMU (layers read-only, the disk read-write,
// the console log appended to), numbered from `first_target` on in QEMU;
// sets vm->layer_fds/disk_fd/console_fd. `fds` gets (fd here, fd in QEMU)
// pairs for LaunchQemu; `owned` keeps the fds open until QEMU started.
Status OpenVmFiles(VmConfig* vm, int first_target, std::vector<UniqueFd>* owned, std::vector<std::pair<int, int>>* fds);

// The identity QEMU runs as: an unprivileged uid/gid of its own (no
// supplementary groups); 0/0 keeps the daemon's (root).
struct QemuIdentity {
  uid_t uid = 0;
  gid_t gid = 0;
};

// A QMP (QEMU Machine Protocol) client on QEMU's monitor socket, line by
// line (QEMU ends every message with \r\n): answers are told from events by
// their "return"/"error" member (JSON-parsed), events in between skipped.
// Every read is bounded by a deadline: Connect's, or the one given to a
// command. One command at a time; not thread-safe (vm::QmpClient is the
// serialized form the vm backend shares between threads).
class Qmp {
 public:
  using Clock = std::chrono::steady_clock;
  // Connects to `path` (a path that fits sun_path, see SocketPath; retried
  // while QEMU does not accept yet), reads the greeting and negotiates
  // capabilities, all by `deadline`, which stays the default of Command.
  static StatusOr<Qmp> Connect(const std::string& path, Clock::time_point deadline);
  // Sends `json` (with `pass_fd` as SCM_RIGHTS when >= 0: add-fd, getfd)
  // and returns the answer's line. An "error" answer is InternalError naming
  // the command and QEMU's description; a broken or flooded monitor is
  // Unavailable; DeadlineExceeded past the deadline.
  StatusOr<std::string> Command(const std::string& json, int pass_fd = -1) { return Command(json, pass_fd, deadline_); }
  StatusOr<std::string> Command(const std::string& json, int pass_fd, Clock::time_point deadline);

 private:
  Qmp(UniqueFd fd, Clock::time_point deadline) : fd_(std::move(fd)), deadline_(deadline) {}
  StatusOr<std::string> ReadLine(Clock::time_point deadline);

  UniqueFd fd_;
  Clock::time_point deadline_;
  std::string buf_;
};

// x-ignore-shared on (`on`: the template's RAM stays out of the stream) or
// off (a suspend: all of the guest's RAM goes into it).
Status SetIgnoreShared(Qmp& qmp, bool on);

// Saves the VM's state (device state and, unless x-ignore-shared leaves it
// out, its RAM) with QMP `migrate` into the open file `fd`, and waits until
// the migration completed. The run state goes into the stream: a VM saved
// while stopped is restored stopped.
Status MigrateToFd(Qmp& qmp, int fd, Qmp::Clock::time_point deadline);

// Loads a state saved by MigrateToFd into a QEMU started with `-incoming
// defer` (and the same devices), from the open file `fd`, and waits until
// the load finished: OK with *running telling whether the guest runs (the
// state was saved running) or stays paused (saved stopped).
Status MigrateFromFd(Qmp& qmp, int fd, Qmp::Clock::time_point deadline, bool* running);

std::vector<std::string> QemuArgv(const std::string& qemu, const VmConfig& config);

struct LaunchedQemu {
  pid_t pid = -1;
  UniqueFd pidfd;
  uint64_t start_time = 0;  // /proc/<pid>/stat field 22
};

// Starts QEMU as a child of this process in a new session (it outlives the
// daemon: nothing ties it to the daemon's lifetime), with `fds` (each: fd
// in this process, its number in QEMU; numbers 3..kMaxQemuFd, distinct),
// stdin /dev/null, stdout+stderr appended to `log_path`. The child joins its
// cgroup (writes to `procs_fds`), then drops to `id` (setgroups to none,
// setresgid, setresuid: no capabilities left), then execs.
constexpr int kMaxQemuFd = 90;
// The fd numbers in QEMU: the agent's and the monitor's sockets, the
// template's RAM, then the files of OpenVmFiles.
constexpr int kAgentFd = 3, kQmpFd = 4, kRamFd = 5, kFirstFileFd = 10;
StatusOr<LaunchedQemu> LaunchQemu(const std::vector<std::string>& argv, const std::vector<std::pair<int, int>>& fds,
                                  const std::string& log_path, const std::vector<int>& procs_fds, QemuIdentity id = {});

// /proc/<pid>/stat field 22 (start time in clock ticks), 0 if gone.
uint64_t ProcessStartTime(pid_t pid);

// The host's TSC frequency in kHz, measured once per process (~50 ms).
uint32_t HostTscKhz();

// Makes a sparse file of `size_mb` MiB at `path` (which must not exist)
// holding an empty ext4 file system without a journal (the disk dies with
// its sandbox: nothing to recover after a crash). mke2fs 1.47's
// assume_storage_prezeroed skips zeroing the inode tables, so the guest's
// lazy init has nothing to write either. On error nothing is left.
Status MakeDisk(const std::string& path, uint32_t size_mb);

// Makes `path` (which must not exist) a sparse copy of the disk file
// `from`: the same size, the same bytes, holes kept (only the extents
// SEEK_DATA finds are copied, with copy_file_range — a reflink where the
// file system shares extents — or, across file systems, read and write).
// On error nothing is left.
Status CopyDisk(const std::string& from, const std::string& path);

}  // namespace warren::runtime::microvm
