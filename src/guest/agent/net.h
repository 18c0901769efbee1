// The guest's network, done by the agent with ioctls (the initramfs has no
// ip(8) and the kernel no IP autoconfiguration): loopback up at every boot,
// and eth0 (the VM's virtio-net NIC, runtime/microvm/qemu.h) configured
// from the host's hello when the sandbox has a network.
#pragma once

#include <cstdint>
#include <string>

namespace warren::guest {

// `lo` up (127.0.0.1/8 comes with it). Error text or "".
std::string LoopbackUp();

struct NicParams {
  uint32_t addr = 0;  // host byte order
  uint32_t prefix = 30;
  uint32_t gateway = 0;
  std::string mac;          // 6 bytes
  uint32_t nameserver = 0;  // 0: /etc/resolv.conf left alone
};

// eth0 (BindNic first; waited for up to 2 s): MAC set while down, address/prefix, up,
// default route via `gateway`; then /etc/resolv.conf of the current root
// replaced with "nameserver <nameserver>". Error text or "".
std::string ConfigureNic(const NicParams& p);

}  // namespace warren::guest
