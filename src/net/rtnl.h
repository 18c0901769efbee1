// rtnetlink through libmnl (Debian's libmnl0): links, addresses and routes
// as netlink messages, no iproute2 process per sandbox. A socket acts in the
// network namespace it was created in; InNetns makes one inside another.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "common/unique_fd.h"

struct mnl_socket;

namespace warren::net {

class Rtnl {
 public:
  // A NETLINK_ROUTE socket in the caller's network namespace.
  static StatusOr<std::unique_ptr<Rtnl>> Open();
  // The same, inside the network namespace `netns_fd` (borrowed): made by a
  // short-lived thread that setns()es there (setns(CLONE_NEWNET) affects
  // only the calling thread; the socket keeps its namespace).
  static StatusOr<std::unique_ptr<Rtnl>> InNetns(int netns_fd);
  ~Rtnl();
  Rtnl(const Rtnl&) = delete;
  Rtnl& operator=(const Rtnl&) = delete;

  // A veth pair: `name` here, `peer` in the namespace `peer_netns_fd`, in
  // one message (the pair never exists with both ends on the host).
  Status AddVeth(const std::string& name, const std::string& peer, int peer_netns_fd);
  // Deleting one end deletes the pair. OK when it does not exist.
  Status DelLink(const std::string& name);
  Status SetUp(const std::string& name);
  // addr/prefix on the link (host byte order).
  Status AddAddr(const std::string& name, uint32_t addr, uint8_t prefix);
  // Default route via `gateway` (host byte order).
  Status AddDefaultRoute(uint32_t gateway);
  // 0 when there is no link of that name here.
  uint32_t IfIndex(const std::string& name);

 private:
  explicit Rtnl(mnl_socket* nl) : nl_(nl) {}
  Status Talk(void* buf, const std::string& what);  // send + wait for the ack
  mnl_socket* nl_;
  uint32_t seq_ = 1;
};

}  // namespace warren::net
