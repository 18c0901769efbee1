#include "net/rtnl.h"

#include <arpa/inet.h>
#include <libmnl/libmnl.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <net/if.h>
#include <sched.h>

#include <memory>
#include <thread>
#include <vector>

namespace warren::net {

namespace {
constexpr size_t kBuf = 8192;
}

StatusOr<std::unique_ptr<Rtnl>> Rtnl::Open() {
  mnl_socket* nl = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
  if (nl == nullptr) return ErrnoToStatus(errno, "socket(AF_NETLINK, NETLINK_ROUTE)");
  if (mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0) {
    int e = errno;
    mnl_socket_close(nl);
    return ErrnoToStatus(e, "bind(NETLINK_ROUTE)");
  }
  return std::unique_ptr<Rtnl>(new Rtnl(nl));
}

StatusOr<std::unique_ptr<Rtnl>> Rtnl::InNetns(int netns_fd) {
  StatusOr<std::unique_ptr<Rtnl>> out = absl::InternalError("unset");
  std::thread t([&] {
    if (::setns(netns_fd, CLONE_NEWNET) != 0) {
      out = ErrnoToStatus(errno, "setns(netns fd " + std::to_string(netns_fd) + ", CLONE_NEWNET)");
      return;
    }
    out = Open();
  });
  t.join();
  return out;
}

Rtnl::~Rtnl() { mnl_socket_close(nl_); }

Status Rtnl::Talk(void* buf, const std::string& what) {
  auto* nlh = static_cast<nlmsghdr*>(buf);
  nlh->nlmsg_seq = seq_++;
  nlh->nlmsg_flags |= NLM_F_REQUEST | NLM_F_ACK;
  if (mnl_socket_sendto(nl_, nlh, nlh->nlmsg_len) < 0) return ErrnoToStatus(errno, "sendto(rtnetlink " + what + ")");
  char rbuf[kBuf];
  const uint32_t portid = mnl_socket_get_portid(nl_);
  for (int i = 0; i < 16; ++i) {
    ssize_t n = mnl_socket_recvfrom(nl_, rbuf, sizeof rbuf);
    if (n < 0) return ErrnoToStatus(errno, "recvfrom(rtnetlink " + what + ")");
    int r = mnl_cb_run(rbuf, static_cast<size_t>(n), nlh->nlmsg_seq, portid, nullptr, nullptr);
    if (r == MNL_CB_ERROR) return ErrnoToStatus(errno, "rtnetlink " + what);
    if (r == MNL_CB_STOP) return absl::OkStatus();
  }
  return absl::InternalError("rtnetlink " + what + ": no ack");
}

uint32_t Rtnl::IfIndex(const std::string& name) {
  // if_nametoindex uses an ioctl on a socket of the CALLER's namespace:
  // ask over this socket instead.
  char buf[kBuf];
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = RTM_GETLINK;
  nlh->nlmsg_flags = NLM_F_REQUEST;
  nlh->nlmsg_seq = seq_++;
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(nlh, IFLA_IFNAME, name.c_str());
  if (mnl_socket_sendto(nl_, nlh, nlh->nlmsg_len) < 0) return 0;
  char rbuf[kBuf];
  ssize_t n = mnl_socket_recvfrom(nl_, rbuf, sizeof rbuf);
  if (n < static_cast<ssize_t>(sizeof(nlmsghdr))) return 0;
  auto* r = reinterpret_cast<nlmsghdr*>(rbuf);
  if (r->nlmsg_type != RTM_NEWLINK) return 0;
  return static_cast<uint32_t>(static_cast<ifinfomsg*>(mnl_nlmsg_get_payload(r))->ifi_index);
}

Status Rtnl::AddVeth(const std::string& name, const std::string& peer, int peer_netns_fd) {
  char buf[kBuf];
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = RTM_NEWLINK;
  nlh->nlmsg_flags = NLM_F_CREATE | NLM_F_EXCL;
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(nlh, IFLA_IFNAME, name.c_str());
  nlattr* linkinfo = mnl_attr_nest_start(nlh, IFLA_LINKINFO);
  mnl_attr_put_strz(nlh, IFLA_INFO_KIND, "veth");
  nlattr* data = mnl_attr_nest_start(nlh, IFLA_INFO_DATA);
  nlattr* peer_attr = mnl_attr_nest_start(nlh, VETH_INFO_PEER);
  auto* pifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  pifm->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(nlh, IFLA_IFNAME, peer.c_str());
  mnl_attr_put_u32(nlh, IFLA_NET_NS_FD, static_cast<uint32_t>(peer_netns_fd));
  mnl_attr_nest_end(nlh, peer_attr);
  mnl_attr_nest_end(nlh, data);
  mnl_attr_nest_end(nlh, linkinfo);
  return Talk(buf, "RTM_NEWLINK veth " + name + " peer " + peer);
}

Status Rtnl::DelLink(const std::string& name) {
  char buf[kBuf];
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = RTM_DELLINK;
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(nlh, IFLA_IFNAME, name.c_str());
  Status s = Talk(buf, "RTM_DELLINK " + name);
  if (!s.ok() && (StatusErrno(s) == ENODEV || StatusErrno(s) == ENOENT)) return absl::OkStatus();
  return s;
}

Status Rtnl::SetUp(const std::string& name) {
  char buf[kBuf];
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = RTM_NEWLINK;
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  ifm->ifi_change = IFF_UP;
  ifm->ifi_flags = IFF_UP;
  mnl_attr_put_strz(nlh, IFLA_IFNAME, name.c_str());
  return Talk(buf, "RTM_NEWLINK " + name + " up");
}

Status Rtnl::AddAddr(const std::string& name, uint32_t addr, uint8_t prefix) {
  const uint32_t idx = IfIndex(name);
  if (idx == 0) return ErrnoToStatus(ENODEV, "rtnetlink RTM_GETLINK " + name);
  char buf[kBuf];
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = RTM_NEWADDR;
  nlh->nlmsg_flags = NLM_F_CREATE | NLM_F_REPLACE;
  auto* ifa = static_cast<ifaddrmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifaddrmsg)));
  ifa->ifa_family = AF_INET;
  ifa->ifa_prefixlen = prefix;
  ifa->ifa_scope = RT_SCOPE_UNIVERSE;
  ifa->ifa_index = idx;
  const uint32_t be = htonl(addr);
  mnl_attr_put_u32(nlh, IFA_LOCAL, be);
  mnl_attr_put_u32(nlh, IFA_ADDRESS, be);
  return Talk(buf, "RTM_NEWADDR " + name);
}

Status Rtnl::AddDefaultRoute(uint32_t gateway) {
  char buf[kBuf];
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = RTM_NEWROUTE;
  nlh->nlmsg_flags = NLM_F_CREATE | NLM_F_REPLACE;
  auto* rtm = static_cast<rtmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(rtmsg)));
  rtm->rtm_family = AF_INET;
  rtm->rtm_dst_len = 0;
  rtm->rtm_table = RT_TABLE_MAIN;
  rtm->rtm_protocol = RTPROT_STATIC;
  rtm->rtm_scope = RT_SCOPE_UNIVERSE;
  rtm->rtm_type = RTN_UNICAST;
  mnl_attr_put_u32(nlh, RTA_GATEWAY, htonl(gateway));
  return Talk(buf, "RTM_NEWROUTE default");
}

}  // namespace warren::net
