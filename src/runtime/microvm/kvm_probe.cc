#include "runtime/microvm/kvm_probe.h"

#include <fcntl.h>
#include <linux/kvm.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/child_reaper.h"
#include "common/unique_fd.h"
#include "jail/syscalls.h"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

namespace warren::microvm {
namespace {

// The step of the child at which the probe stopped (kOk: the guest ran).
enum class Step : int32_t {
  kOpen,
  kApiVersion,
  kCreateVm,
  kGuestMemory,
  kSetMemoryRegion,
  kCreateVcpu,
  kVcpuMmapSize,
  kMapRun,
  kGetSregs,
  kSetSregs,
  kSetRegs,
  kRun,
  kUnexpectedExit,
  kWrongPortWrite,
  kOk,
};

const char* StepName(Step s) {
  switch (s) {
    case Step::kOpen: return "open";
    case Step::kApiVersion: return "ioctl(KVM_GET_API_VERSION)";
    case Step::kCreateVm: return "ioctl(KVM_CREATE_VM)";
    case Step::kGuestMemory: return "mmap(guest memory)";
    case Step::kSetMemoryRegion: return "ioctl(KVM_SET_USER_MEMORY_REGION)";
    case Step::kCreateVcpu: return "ioctl(KVM_CREATE_VCPU)";
    case Step::kVcpuMmapSize: return "ioctl(KVM_GET_VCPU_MMAP_SIZE)";
    case Step::kMapRun: return "mmap(kvm_run)";
    case Step::kGetSregs: return "ioctl(KVM_GET_SREGS)";
    case Step::kSetSregs: return "ioctl(KVM_SET_SREGS)";
    case Step::kSetRegs: return "ioctl(KVM_SET_REGS)";
    case Step::kRun: return "ioctl(KVM_RUN)";
    case Step::kUnexpectedExit: return "KVM_RUN exit";
    case Step::kWrongPortWrite: return "guest port write";
    case Step::kOk: return "ok";
  }
  return "?";
}

// What the child writes to the pipe: one fixed-size record.
struct Report {
  Step step = Step::kOpen;
  int32_t err = 0;      // errno at `step`
  uint32_t detail = 0;  // kUnexpectedExit: the exit reason; kApiVersion: the version
  uint32_t pad = 0;
  int64_t guest_ns = 0;  // first KVM_RUN to HLT
};

// Guest layout (guest-physical): page tables at 0x1000-0x3fff, code at
// 0x4000, the loop's stores at 1-2 MiB. Everything is mapped at the kernel's
// high-half base through one 2 MiB page.
constexpr uint64_t kGuestMemSize = 2 << 20;
constexpr uint64_t kHighBase = 0xffffffff80000000ULL;
constexpr uint64_t kPml4 = 0x1000, kPdpt = 0x2000, kPd = 0x3000, kCode = 0x4000;
constexpr uint16_t kPort = 0x10;
constexpr uint8_t kPortValue = 0x42;

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Writes the guest program at `code`:
//   mov rcx, iterations; mov rdi, kHighBase + 1 MiB
//   loop: mov rax, rcx; and eax, 0x1ffff; mov [rdi + rax*8], rcx; dec rcx; jnz loop
//   mov al, kPortValue; out kPort, al; hlt
void WriteGuestCode(uint8_t* code, uint32_t iterations) {
  size_t k = 0;
  const uint8_t mov_rcx[] = {0x48, 0xc7, 0xc1};
  memcpy(code + k, mov_rcx, sizeof mov_rcx);
  k += sizeof mov_rcx;
  memcpy(code + k, &iterations, 4);
  k += 4;
  const uint8_t mov_rdi[] = {0x48, 0xbf};
  memcpy(code + k, mov_rdi, sizeof mov_rdi);
  k += sizeof mov_rdi;
  const uint64_t target = kHighBase + (1 << 20);
  memcpy(code + k, &target, 8);
  k += 8;
  const size_t loop = k;
  const uint8_t body[] = {0x48, 0x89, 0xc8, 0x25, 0xff, 0xff, 0x01, 0x00, 0x48, 0x89, 0x0c, 0xc7, 0x48, 0xff, 0xc9};
  memcpy(code + k, body, sizeof body);
  k += sizeof body;
  code[k] = 0x75;  // jnz rel8
  code[k + 1] = static_cast<uint8_t>(static_cast<int>(loop) - static_cast<int>(k + 2));
  k += 2;
  const uint8_t tail[] = {0xb0, kPortValue, 0xe6, static_cast<uint8_t>(kPort), 0xf4};
  memcpy(code + k, tail, sizeof tail);
}

[[noreturn]] void Finish(Report& r, int report_fd, Step step, int err) {
  r.step = step;
  r.err = err;
  ssize_t n = write(report_fd, &r, sizeof r);
  (void)n;
  _exit(0);
}

// The child: async-signal-safe only (it was cloned from a possibly
// multithreaded process): syscalls, memcpy/memset, no allocation or locks.
// Everything it maps or opens goes away with its exit.
[[noreturn]] void ChildMain(const char* device, uint32_t iterations, int report_fd) {
  Report r;
  auto finish = [&](Step step, int err) { Finish(r, report_fd, step, err); };
  // Drop every inherited fd but stdio and the report pipe: the caller's pipes
  // and sockets must not stay open in a child that may live until the deadline.
  if (report_fd > 3) syscall(SYS_close_range, 3u, static_cast<unsigned>(report_fd - 1), 0u);
  syscall(SYS_close_range, static_cast<unsigned>(report_fd + 1), ~0u, 0u);
  int kvm = open(device, O_RDWR | O_CLOEXEC);
  if (kvm < 0) finish(Step::kOpen, errno);
  int version = ioctl(kvm, KVM_GET_API_VERSION, 0);
  if (version != KVM_API_VERSION) {
    r.detail = static_cast<uint32_t>(version);
    finish(Step::kApiVersion, version < 0 ? errno : 0);
  }
  int vm = ioctl(kvm, KVM_CREATE_VM, 0);
  if (vm < 0) finish(Step::kCreateVm, errno);
  void* mem_raw =
      mmap(nullptr, kGuestMemSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem_raw == MAP_FAILED) finish(Step::kGuestMemory, errno);
  auto* mem = static_cast<uint8_t*>(mem_raw);
  uint64_t entry;
  entry = kPdpt | 3;                                 // present, writable
  memcpy(mem + kPml4 + size_t{511} * 8, &entry, 8);  // PML4 slot of 0xffffffff80000000
  entry = kPd | 3;
  memcpy(mem + kPdpt + size_t{510} * 8, &entry, 8);  // its PDPT slot
  entry = 0x83;                                      // 2 MiB page at guest-physical 0: present, writable, PS
  memcpy(mem + kPd, &entry, 8);
  WriteGuestCode(mem + kCode, iterations);
  kvm_userspace_memory_region region;
  memset(&region, 0, sizeof region);
  region.memory_size = kGuestMemSize;
  region.userspace_addr = reinterpret_cast<uint64_t>(mem);
  if (ioctl(vm, KVM_SET_USER_MEMORY_REGION, &region) != 0) finish(Step::kSetMemoryRegion, errno);
  int vcpu = ioctl(vm, KVM_CREATE_VCPU, 0);
  if (vcpu < 0) finish(Step::kCreateVcpu, errno);
  int run_size = ioctl(kvm, KVM_GET_VCPU_MMAP_SIZE, 0);
  if (run_size < static_cast<int>(sizeof(kvm_run))) finish(Step::kVcpuMmapSize, run_size < 0 ? errno : EINVAL);
  void* run_raw = mmap(nullptr, static_cast<size_t>(run_size), PROT_READ | PROT_WRITE, MAP_SHARED, vcpu, 0);
  if (run_raw == MAP_FAILED) finish(Step::kMapRun, errno);
  auto* run = static_cast<kvm_run*>(run_raw);

  kvm_sregs sregs;
  if (ioctl(vcpu, KVM_GET_SREGS, &sregs) != 0) finish(Step::kGetSregs, errno);
  kvm_segment code_seg;
  memset(&code_seg, 0, sizeof code_seg);
  code_seg.limit = 0xffffffff;
  code_seg.selector = 8;
  code_seg.type = 11;  // execute/read, accessed
  code_seg.present = 1;
  code_seg.s = 1;
  code_seg.l = 1;  // 64-bit code
  code_seg.g = 1;
  kvm_segment data_seg = code_seg;
  data_seg.selector = 16;
  data_seg.type = 3;  // read/write, accessed
  data_seg.l = 0;
  data_seg.db = 1;
  sregs.cs = code_seg;
  sregs.ds = sregs.es = sregs.fs = sregs.gs = sregs.ss = data_seg;
  sregs.cr3 = kPml4;
  sregs.cr4 = 1 << 5;  // PAE
  sregs.cr0 =
      (1u << 0) | (1u << 1) | (1u << 4) | (1u << 5) | (1u << 16) | (1u << 18) | (1u << 31);  // PE MP ET NE WP AM PG
  sregs.efer = (1 << 8) | (1 << 10);                                                         // LME, LMA
  if (ioctl(vcpu, KVM_SET_SREGS, &sregs) != 0) finish(Step::kSetSregs, errno);
  kvm_regs regs;
  memset(&regs, 0, sizeof regs);
  regs.rip = kHighBase + kCode;
  regs.rsp = kHighBase + kGuestMemSize;
  regs.rflags = 2;
  if (ioctl(vcpu, KVM_SET_REGS, &regs) != 0) finish(Step::kSetRegs, errno);

  const int64_t start = MonotonicNs();
  bool wrote_port = false;
  for (int exits = 0; exits < 64; ++exits) {
    if (ioctl(vcpu, KVM_RUN, 0) != 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      finish(Step::kRun, errno);
    }
    if (run->exit_reason == KVM_EXIT_IO) {
      const auto* data = reinterpret_cast<const uint8_t*>(run) + run->io.data_offset;
      if (run->io.direction != KVM_EXIT_IO_OUT || run->io.port != kPort || run->io.size != 1 || *data != kPortValue) {
        r.detail = run->io.port;
        finish(Step::kWrongPortWrite, 0);
      }
      wrote_port = true;
      continue;
    }
    if (run->exit_reason == KVM_EXIT_HLT && wrote_port) {
      r.guest_ns = MonotonicNs() - start;
      finish(Step::kOk, 0);
    }
    if (run->exit_reason == KVM_EXIT_INTR) continue;
    r.detail = run->exit_reason;
    finish(Step::kUnexpectedExit, 0);
  }
  r.detail = run->exit_reason;
  Finish(r, report_fd, Step::kUnexpectedExit, 0);
}

// Hint appended when the guest ran too slowly: name the cause on PVM hosts.
std::string PvmHint() {
  if (access("/sys/module/kvm_pvm", F_OK) != 0) return "";
  return " (kvm_pvm is loaded: this host's KVM is PVM, which runs guests that are not PVM-aware in emulation)";
}

// Kills (if asked) and reaps the child behind `pidfd` within 2 s; a child
// that has not exited by then goes to the ChildReaper.
void KillAndReap(UniqueFd pidfd, bool kill_first) {
  if (kill_first) syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0);
  pollfd p = {pidfd.get(), POLLIN, 0};
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (std::chrono::steady_clock::now() < until) {
    if (TryReapPidfd(pidfd.get())) return;
    (void)poll(&p, 1, 50);
  }
  ChildReaper::Get().Adopt(std::move(pidfd));
}

std::string Describe(const Report& r, const std::string& device) {
  switch (r.step) {
    case Step::kOpen: return std::string(ErrnoToStatus(r.err, absl::StrCat("open(", device, ")")).message());
    case Step::kApiVersion:
      if (r.err != 0)
        return std::string(ErrnoToStatus(r.err, absl::StrCat("ioctl(", device, ", KVM_GET_API_VERSION)")).message());
      return absl::StrCat(device, ": KVM API version ", static_cast<int32_t>(r.detail), ", want ", KVM_API_VERSION);
    case Step::kUnexpectedExit:
      return absl::StrCat("guest stopped with KVM exit reason ", r.detail, " (want IO then HLT)");
    case Step::kWrongPortWrite: return absl::StrCat("guest wrote to port ", r.detail, ", not the expected port");
    case Step::kOk: return "ok";
    default: return std::string(ErrnoToStatus(r.err, StepName(r.step)).message());
  }
}

}  // namespace

const char* AccelName(Accel accel) { return accel == Accel::kKvm ? "kvm" : "tcg"; }

StatusOr<KvmProbeResult> ProbeKvm(const KvmProbeOptions& options) {
  if (options.loop_iterations == 0 || options.loop_iterations >= (1u << 31))
    return absl::InvalidArgumentError(
        absl::StrCat("kvm probe: loop_iterations ", options.loop_iterations, " not in [1, 2^31)"));
  if (options.deadline <= std::chrono::milliseconds(0))
    return absl::InvalidArgumentError("kvm probe: deadline must be positive");
  const auto started = std::chrono::steady_clock::now();
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe2(kvm probe)");
  UniqueFd report_rd(pipe_fds[0]), report_wr(pipe_fds[1]);
  const std::string device = options.device;  // the child reads it without allocating
  int pidfd_raw = -1;
  // CLONE_CLEAR_SIGHAND: a signal sent to the child's pid (a process-group
  // kill) must not run the caller's handlers in the child's copy of it.
  const pid_t pid = jail::Clone3(CLONE_PIDFD | CLONE_CLEAR_SIGHAND, &pidfd_raw);
  if (pid < 0) return ErrnoToStatus(errno, "clone3(kvm probe)");
  if (pid == 0) {
    report_rd.release();
    ChildMain(device.c_str(), options.loop_iterations, report_wr.get());
  }
  UniqueFd pidfd(pidfd_raw);
  report_wr.reset();

  KvmProbeResult result;
  Report report;
  size_t got = 0;
  bool eof = false;
  while (got < sizeof report && !eof) {
    const auto left = options.deadline -
                      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    if (left <= std::chrono::milliseconds(0)) break;
    pollfd p = {report_rd.get(), POLLIN, 0};
    const int n = poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno != EINTR) {
      const int err = errno;
      KillAndReap(std::move(pidfd), true);
      return ErrnoToStatus(err, "poll(kvm probe report)");
    }
    if (n <= 0) continue;
    const ssize_t r = read(report_rd.get(), reinterpret_cast<char*>(&report) + got, sizeof report - got);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else {
      // 0: the child exited without (all of) its report; EINTR/EAGAIN: retry.
      eof = r == 0 || (errno != EINTR && errno != EAGAIN);
    }
  }
  const bool complete = got == sizeof report;
  KillAndReap(std::move(pidfd), !complete);

  if (!complete) {
    result.timed_out = !eof;
    result.reason = eof ? "kvm probe child exited without a report"
                        : absl::StrCat("the guest did not finish its ", options.loop_iterations,
                                       "-iteration loop within ", options.deadline.count(), " ms (killed)", PvmHint());
    return result;
  }
  if (report.step != Step::kOk) {
    result.reason = Describe(report, device);
    return result;
  }
  result.guest_time = std::chrono::microseconds(report.guest_ns / 1000);
  const auto guest_ms = std::chrono::duration_cast<std::chrono::milliseconds>(result.guest_time);
  if (guest_ms > options.max_guest_time) {
    result.reason = absl::StrCat("the guest's ", options.loop_iterations, "-iteration loop took ", guest_ms.count(),
                                 " ms, over ", options.max_guest_time.count(), " ms: KVM emulates it", PvmHint());
    return result;
  }
  result.accel = Accel::kKvm;
  result.reason = absl::StrCat("a 64-bit guest ran ", options.loop_iterations, " loop iterations in ",
                               result.guest_time.count(), " us");
  return result;
}

}  // namespace warren::microvm
