#include "guest/agent/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <net/route.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace warren::guest {
namespace {

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

sockaddr_in In(uint32_t addr) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(addr);
  return a;
}

std::string Dotted(uint32_t a) {
  in_addr x{htonl(a)};
  char b[INET_ADDRSTRLEN];
  return ::inet_ntop(AF_INET, &x, b, sizeof b) != nullptr ? b : "";
}

class Sock {
 public:
  Sock() : fd_(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) {}
  ~Sock() {
    if (fd_ >= 0) ::close(fd_);
  }
  Sock(const Sock&) = delete;
  Sock& operator=(const Sock&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

ifreq Req(const char* name) {
  ifreq r{};
  std::strncpy(r.ifr_name, name, IFNAMSIZ - 1);
  return r;
}

std::string Up(const Sock& s, const char* name) {
  ifreq r = Req(name);
  if (::ioctl(s.fd(), SIOCGIFFLAGS, &r) != 0) return Errno(std::string("SIOCGIFFLAGS ") + name);
  r.ifr_flags = static_cast<short>(r.ifr_flags | IFF_UP);
  if (::ioctl(s.fd(), SIOCSIFFLAGS, &r) != 0) return Errno(std::string("SIOCSIFFLAGS ") + name + " up");
  return "";
}

}  // namespace

std::string LoopbackUp() {
  Sock s;
  if (s.fd() < 0) return Errno("socket(AF_INET)");
  return Up(s, "lo");
}

std::string ConfigureNic(const NicParams& p) {
  Sock s;
  if (s.fd() < 0) return Errno("socket(AF_INET)");
  // virtio_net probed the device when its module loaded (BindNic,
  // just before): eth0 exists, but allow a late probe.
  timespec t0;
  ::clock_gettime(CLOCK_MONOTONIC, &t0);
  while (::if_nametoindex("eth0") == 0) {
    timespec now;
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - t0.tv_sec >= 2) return "no eth0 (the VM has no NIC?)";
    ::usleep(10000);
  }
  ifreq r = Req("eth0");
  r.ifr_hwaddr.sa_family = ARPHRD_ETHER;
  std::memcpy(r.ifr_hwaddr.sa_data, p.mac.data(), 6);
  if (::ioctl(s.fd(), SIOCSIFHWADDR, &r) != 0) return Errno("SIOCSIFHWADDR eth0");
  r = Req("eth0");
  sockaddr_in a = In(p.addr);
  std::memcpy(&r.ifr_addr, &a, sizeof a);
  if (::ioctl(s.fd(), SIOCSIFADDR, &r) != 0) return Errno("SIOCSIFADDR eth0 " + Dotted(p.addr));
  r = Req("eth0");
  a = In(~uint32_t{0} << (32 - p.prefix));
  std::memcpy(&r.ifr_netmask, &a, sizeof a);
  if (::ioctl(s.fd(), SIOCSIFNETMASK, &r) != 0) return Errno("SIOCSIFNETMASK eth0 /" + std::to_string(p.prefix));
  // No IPv6 on the link (the node refuses it): no link-local address,
  // duplicate address detection or router solicitation when it goes up.
  if (int fd = ::open("/proc/sys/net/ipv6/conf/eth0/disable_ipv6", O_WRONLY | O_CLOEXEC); fd >= 0) {
    (void)!::write(fd, "1", 1);
    ::close(fd);
  }
  if (std::string e = Up(s, "eth0"); !e.empty()) return e;
  rtentry rt{};
  sockaddr_in dst = In(0), gw = In(p.gateway), mask = In(0);
  std::memcpy(&rt.rt_dst, &dst, sizeof dst);
  std::memcpy(&rt.rt_gateway, &gw, sizeof gw);
  std::memcpy(&rt.rt_genmask, &mask, sizeof mask);
  rt.rt_flags = RTF_UP | RTF_GATEWAY;
  if (::ioctl(s.fd(), SIOCADDRT, &rt) != 0 && errno != EEXIST)
    return Errno("SIOCADDRT default via " + Dotted(p.gateway));
  if (p.nameserver != 0) {
    // Replaces whatever the image has there (a symlink included).
    ::mkdir("/etc", 0755);
    const std::string text = "nameserver " + Dotted(p.nameserver) + "\n";
    int fd = ::open("/etc/.resolv.conf.warren", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return Errno("open(/etc/.resolv.conf.warren)");
    const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::close(fd);
    if (!ok || ::rename("/etc/.resolv.conf.warren", "/etc/resolv.conf") != 0) return Errno("write(/etc/resolv.conf)");
  }
  return "";
}

}  // namespace warren::guest
