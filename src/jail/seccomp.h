// Seccomp policy as data (firecracker resources/seccomp/*.json): the profile
// is a reviewable JSON file (src/jail/seccomp/default.json, each rule with a
// reason), compiled with libseccomp into a classic-BPF program in the parent,
// then installed in the child between clone and exec with one raw prctl
// (async-signal-safe: no allocation after fork).
#pragma once

#include <linux/filter.h>

#include <string>
#include <vector>

#include "common/status.h"

namespace warren::jail {

struct SeccompProgram {
  std::vector<sock_filter> filter;
  sock_fprog prog() const {
    return sock_fprog{static_cast<unsigned short>(filter.size()), const_cast<sock_filter*>(filter.data())};
  }
};

// The profile compiled into the binary (src/jail/seccomp/default.json).
const std::string& DefaultSeccompProfile();

// Compiles a JSON profile for the host architecture. InvalidArgument naming
// the bad rule (unknown syscall name, bad action, bad argument filter).
// binary_tree: libseccomp's binary-tree syscall dispatch (SCMP_FLTATR_CTL_
// OPTIMIZE=2): same decisions, O(log n) instead of O(n) per syscall, and much
// cheaper to install (the kernel emulates the filter for every syscall
// number to fill its allow-cache at attach time, with interrupts off: ~150 us
// for the linear default profile on this project's VMs). Both backends use it.
StatusOr<SeccompProgram> CompileSeccompProfile(const std::string& json_text, bool binary_tree = false);

// Installs a compiled program in the calling thread's process (requires
// no_new_privs or CAP_SYS_ADMIN). Async-signal-safe; returns 0 or -errno.
int InstallSeccompProgram(const sock_fprog* prog);

}  // namespace warren::jail
