#include "jail/contain.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <net/if.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace warren::jail {

namespace {
constexpr int kMaxFds = 8;
}  // namespace

int SendFds(int sock, const void* data, size_t len, const int* fds, int nfds) {
  if (nfds < 1 || nfds > kMaxFds || len == 0) return -EINVAL;
  iovec iov{const_cast<void*>(data), len};
  char cbuf[CMSG_SPACE(kMaxFds * sizeof(int))];
  memset(cbuf, 0, sizeof cbuf);
  msghdr msg;
  memset(&msg, 0, sizeof msg);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = cbuf;
  msg.msg_controllen = CMSG_SPACE(static_cast<size_t>(nfds) * sizeof(int));
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(static_cast<size_t>(nfds) * sizeof(int));
  memcpy(CMSG_DATA(c), fds, static_cast<size_t>(nfds) * sizeof(int));
  ssize_t n;
  do n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(len)) return 0;
  return n < 0 ? -errno : -EPIPE;
}

int RecvFds(int sock, void* data, size_t len, int* fds, int nfds) {
  if (nfds < 1 || nfds > kMaxFds || len == 0) return -EINVAL;
  char cbuf[CMSG_SPACE(kMaxFds * sizeof(int))];
  memset(cbuf, 0, sizeof cbuf);
  iovec iov{data, len};
  msghdr msg;
  memset(&msg, 0, sizeof msg);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = cbuf;
  msg.msg_controllen = CMSG_SPACE(static_cast<size_t>(nfds) * sizeof(int));
  ssize_t n;
  do n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n <= 0) return -EPIPE;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (!c || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(static_cast<size_t>(nfds) * sizeof(int))) {
    return -EBADF;
  }
  memcpy(fds, CMSG_DATA(c), static_cast<size_t>(nfds) * sizeof(int));
  return n == static_cast<ssize_t>(len) ? 0 : -EPROTO;
}

int SendFd(int sock, int fd) {
  const char byte = 'g';
  return SendFds(sock, &byte, 1, &fd, 1);
}

int RecvFd(int sock) {
  char byte = 0;
  int fd = -1;
  int rc = RecvFds(sock, &byte, 1, &fd, 1);
  return rc == 0 ? fd : rc;
}

uint64_t DefaultCapabilityMask() {
  const int caps[] = {CAP_CHOWN,  CAP_DAC_OVERRIDE, CAP_FOWNER,           CAP_FSETID,     CAP_KILL,        CAP_SETGID,
                      CAP_SETUID, CAP_SETPCAP,      CAP_NET_BIND_SERVICE, CAP_SYS_CHROOT, CAP_AUDIT_WRITE, CAP_SETFCAP};
  uint64_t m = 0;
  for (int c : caps) m |= uint64_t{1} << c;
  return m;
}

int LastCapability() {
  int fd = ::open("/proc/sys/kernel/cap_last_cap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return CAP_LAST_CAP;
  char buf[16] = {};
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return CAP_LAST_CAP;
  int v = atoi(buf);
  return v > 0 && v < 64 ? v : CAP_LAST_CAP;
}

int LoopbackUp() {
  int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -errno;
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  memcpy(ifr.ifr_name, "lo", 3);
  int rc = 0;
  if (::ioctl(s, SIOCGIFFLAGS, &ifr) != 0) {
    rc = -errno;
  } else {
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (::ioctl(s, SIOCSIFFLAGS, &ifr) != 0) rc = -errno;
  }
  ::close(s);
  return rc;
}

int WriteAll(int fd, const void* buf, size_t len) {
  const char* p = static_cast<const char*>(buf);
  for (int i = 0; len > 0 && i < 1 << 20; ++i) {
    ssize_t n = ::write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return len == 0 ? 0 : -EIO;
}

void ChildFail(int fd, int step, int err) {
  ChildError e{step, err};
  (void)WriteAll(fd, &e, sizeof e);
  ::_exit(127);
}

}  // namespace warren::jail
