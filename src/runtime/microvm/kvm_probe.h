// Whether this host's /dev/kvm runs a stock (non-paravirtualized) guest at
// hardware speed, decided within a bounded time.
//
// Why a run and not a feature check: on hosts whose KVM is PVM (the kvm_pvm
// module, KVM implemented on top of a host that itself is a guest), /dev/kvm
// opens, KVM_CREATE_VM and KVM_RUN succeed and a few real-mode instructions
// run fine, but a guest that is not PVM-aware runs in instruction emulation,
// thousands of times slower: a stock Debian kernel never leaves its
// decompressor. So the probe runs a tiny 64-bit guest the way a stock kernel
// runs (long mode, 4-level paging, code at the kernel's high-half address) that
// stores to memory in a loop of `loop_iterations`, then reports through a port
// write and halts. Hardware KVM finishes in about a millisecond; emulation
// takes seconds.
//
// The guest runs in a child process (clone3 with a pidfd) that the caller
// kills at `deadline`: ProbeKvm never hangs, whatever the kernel does.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace warren::microvm {

enum class Accel { kKvm, kTcg };

// "kvm" or "tcg" (QEMU's -accel names).
const char* AccelName(Accel accel);

struct KvmProbeOptions {
  std::string device = "/dev/kvm";
  // Iterations of the guest's store loop (6 instructions each). < 2^31.
  uint32_t loop_iterations = 1'000'000;
  // The child is killed when it has not answered by then (from the call).
  std::chrono::milliseconds deadline{1000};
  // A guest that ran its loop but took longer than this counts as emulated.
  std::chrono::milliseconds max_guest_time{250};
};

struct KvmProbeResult {
  Accel accel = Accel::kTcg;
  // Why: the failing ioctl with its errno, the guest's unexpected exit, the
  // time the guest took, or the deadline that killed it.
  std::string reason;
  // Time the guest's loop took, from the first KVM_RUN to its HLT (0 when it
  // did not get there).
  std::chrono::microseconds guest_time{0};
  // The child was killed at the deadline.
  bool timed_out = false;
};

// Runs the probe. Every way /dev/kvm can be unfit is an answer (kTcg with the
// reason), not an error; an error means the probe itself could not run
// (pipe2, clone3 or poll failed; errno and the call named). Thread-safe; the
// child runs only async-signal-safe code (syscalls), so any thread may call it.
StatusOr<KvmProbeResult> ProbeKvm(const KvmProbeOptions& options = {});

}  // namespace warren::microvm
