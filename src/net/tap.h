// Tap devices for VMs (TUNSETIFF on /dev/net/tun): a VM's NIC is QEMU's
// userspace virtio-net over a tap queue whose fd the daemon opens and QEMU
// inherits (QEMU runs unprivileged and never opens /dev/net/tun itself; no
// vhost-net on these hosts). Flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR
// (QEMU's tap backend probes the vnet header with TUNGETIFF and then
// offers the guest checksum/segmentation offloads).
#pragma once

#include <string>

#include "common/status.h"
#include "common/unique_fd.h"

namespace warren::net {

// A queue of the tap `name` (at most IFNAMSIZ-1 bytes), made persistent
// (TUNSETPERSIST) when `persist`: it then outlives every fd (a VM's QEMU
// ending, a suspend, a daemon restart) until RTM_DELLINK. Opening an
// existing persistent tap of the same flags attaches to it (needs
// CAP_NET_ADMIN). Errors name the ioctl and the tap.
StatusOr<UniqueFd> OpenTap(const std::string& name, bool persist);

}  // namespace warren::net
