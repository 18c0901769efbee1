#include "net/tap.h"

#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <sys/ioctl.h>

#include <cstring>

namespace warren::net {

StatusOr<UniqueFd> OpenTap(const std::string& name, bool persist) {
  if (name.empty() || name.size() >= IFNAMSIZ) return absl::InvalidArgumentError("tap name '" + name + "' too long");
  UniqueFd fd(::open("/dev/net/tun", O_RDWR | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, "open(/dev/net/tun)");
  ifreq ifr{};
  std::memcpy(ifr.ifr_name, name.c_str(), name.size());
  ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
  if (::ioctl(fd.get(), TUNSETIFF, &ifr) != 0) return ErrnoToStatus(errno, "ioctl(TUNSETIFF, tap " + name + ")");
  if (persist && ::ioctl(fd.get(), TUNSETPERSIST, 1) != 0)
    return ErrnoToStatus(errno, "ioctl(TUNSETPERSIST, tap " + name + ")");
  return fd;
}

}  // namespace warren::net
