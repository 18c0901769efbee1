// Refused packets as events: an nftables `log group N` statement hands each
// packet it sees to NFLOG group N (netfilter netlink); this reader, bound to
// the group, calls back with the rule's prefix and where the packet was
// going. The kernel drops events it cannot queue (a burst beyond the
// socket's buffer): the reader reports what arrives, the rules' counters
// stay exact.
//
// One thread; the destructor unbinds and joins it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/status.h"
#include "common/unique_fd.h"

struct mnl_socket;

namespace warren::net {

struct LoggedPacket {
  std::string prefix;  // the log statement's prefix
  std::string dst;     // destination address ("" when unparsable)
  std::string proto;   // "tcp", "udp", "icmp", "ipv6", or the IP protocol number
  uint16_t port = 0;   // TCP/UDP destination port, else 0
};

class NflogReader {
 public:
  using Handler = std::function<void(const LoggedPacket&)>;
  // Binds `group`; `handler` runs on the reader's thread.
  static StatusOr<std::unique_ptr<NflogReader>> Open(uint16_t group, Handler handler);
  ~NflogReader();
  NflogReader(const NflogReader&) = delete;
  NflogReader& operator=(const NflogReader&) = delete;

 private:
  NflogReader() = default;
  Status Config(uint16_t group, uint8_t cmd);
  void Loop();

  mnl_socket* nl_ = nullptr;
  uint16_t group_ = 0;
  uint32_t seq_ = 1;
  Handler handler_;
  UniqueFd stop_;
  std::thread thread_;
};

}  // namespace warren::net
