// Steps of the containment ladder that run in a freshly cloned/forked child
// of the (multithreaded) daemon, between clone and exec (CONVENTIONS.md:
// cgroup placement -> namespaces -> mounts/pivot_root -> rlimits ->
// capabilities/no_new_privs -> close fds -> seccomp -> exec).
//
// The ladder itself (mounts, masks, rlimits, ids, capabilities,
// no_new_privs, seccomp) is the containment plan's (plan.h); these are the
// helpers around it. Every function marked "async-signal-safe" only issues raw syscalls on
// memory prepared by the parent: no allocation, no locks, no logging. They
// return 0 or -errno. The parent-side helpers (not marked) may allocate.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace warren::jail {

// Capabilities kept by root inside a sandbox (Docker's default set minus
// MKNOD and NET_RAW): CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID,
// SETUID, SETPCAP, NET_BIND_SERVICE, SYS_CHROOT, AUDIT_WRITE, SETFCAP. All
// others (SYS_ADMIN, NET_ADMIN, SYS_PTRACE, MKNOD, ...) are removed from the
// bounding, permitted, effective, inheritable and ambient sets.
uint64_t DefaultCapabilityMask();

// Highest capability number of the running kernel
// (/proc/sys/kernel/cap_last_cap; parent side).
int LastCapability();

struct RlimitSetting {
  int resource;
  struct rlimit limit;
};

// Async-signal-safe: brings the loopback interface of the current network
// namespace up (ioctl SIOCSIFFLAGS; needs CAP_NET_ADMIN in the netns' owner).
int LoopbackUp();

// Async-signal-safe: sends `len` (> 0) bytes of `data` with `nfds` (1..8)
// fds attached (SCM_RIGHTS) over the unix socket `sock`, as one message
// (SOCK_SEQPACKET keeps it whole). Returns 0, -EPIPE for a short send or
// -errno.
int SendFds(int sock, const void* data, size_t len, const int* fds, int nfds);

// Async-signal-safe: receives a message sent by SendFds with exactly `nfds`
// fds (O_CLOEXEC) into `fds` and `len` bytes into `data`. Returns 0, -EPIPE if
// the peer closed the socket or recvmsg failed (the parent gave up), -EBADF if
// the message carried another number of fds, -EPROTO if it had another
// length (the fds are received anyway and must be closed by the caller).
int RecvFds(int sock, void* data, size_t len, int* fds, int nfds);

// Async-signal-safe: sends `fd` over the unix socket `sock` (SCM_RIGHTS,
// one data byte). Returns 0 or -errno.
int SendFd(int sock, int fd);

// Async-signal-safe: receives one fd sent by SendFd (O_CLOEXEC). Returns the
// fd, -EPIPE if the peer closed the socket or recvmsg failed (the parent gave
// up), or -EBADF if the message carried no fd.
int RecvFd(int sock);

// Async-signal-safe: write all of buf, retrying on EINTR/short writes.
int WriteAll(int fd, const void* buf, size_t len);

// Async-signal-safe: report a failed step to the parent as {step, errno}
// over `fd`, then _exit(127).
[[noreturn]] void ChildFail(int fd, int step, int err);

struct ChildError {
  int32_t step = 0;
  int32_t err = 0;
};

}  // namespace warren::jail
