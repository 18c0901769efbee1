#include "net/nflog.h"

#include <arpa/inet.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_log.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>

#include <cstring>
#include <vector>

namespace warren::net {

namespace {

constexpr size_t kBuf = 1 << 16;
constexpr uint32_t kCopyRange = 64;  // IPv4 + TCP/UDP headers fit

// Fills `out` from an IPv4/IPv6 packet's first bytes.
void ParsePacket(const uint8_t* p, size_t n, LoggedPacket* out) {
  if (n < 1) return;
  if ((p[0] >> 4) == 6) {
    out->proto = "ipv6";
    if (n >= 40) {
      char buf[INET6_ADDRSTRLEN];
      if (inet_ntop(AF_INET6, p + 24, buf, sizeof buf) != nullptr) out->dst = buf;
    }
    return;
  }
  if ((p[0] >> 4) != 4 || n < 20) return;
  const size_t ihl = static_cast<size_t>(p[0] & 0x0f) * 4;
  char buf[INET_ADDRSTRLEN];
  if (inet_ntop(AF_INET, p + 16, buf, sizeof buf) != nullptr) out->dst = buf;
  const uint8_t proto = p[9];
  switch (proto) {
    case IPPROTO_TCP: out->proto = "tcp"; break;
    case IPPROTO_UDP: out->proto = "udp"; break;
    case IPPROTO_ICMP: out->proto = "icmp"; break;
    default: out->proto = std::to_string(proto);
  }
  if ((proto == IPPROTO_TCP || proto == IPPROTO_UDP) && n >= ihl + 4)
    out->port = static_cast<uint16_t>((p[ihl + 2] << 8) | p[ihl + 3]);
}

int AttrCb(const nlattr* attr, void* data) {
  auto** tb = static_cast<const nlattr**>(data);
  const uint16_t type = mnl_attr_get_type(attr);
  if (type <= NFULA_MAX) tb[type] = attr;
  return MNL_CB_OK;
}

}  // namespace

StatusOr<std::unique_ptr<NflogReader>> NflogReader::Open(uint16_t group, Handler handler) {
  auto r = std::unique_ptr<NflogReader>(new NflogReader());
  r->group_ = group;
  r->handler_ = std::move(handler);
  r->nl_ = mnl_socket_open2(NETLINK_NETFILTER, SOCK_CLOEXEC);
  if (r->nl_ == nullptr) return ErrnoToStatus(errno, "socket(AF_NETLINK, NETLINK_NETFILTER)");
  if (mnl_socket_bind(r->nl_, 0, MNL_SOCKET_AUTOPID) < 0) return ErrnoToStatus(errno, "bind(NETLINK_NETFILTER)");
  RETURN_IF_ERROR(r->Config(group, NFULNL_CFG_CMD_BIND));
  r->stop_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!r->stop_.valid()) return ErrnoToStatus(errno, "eventfd");
  r->thread_ = std::thread([p = r.get()] { p->Loop(); });
  return r;
}

NflogReader::~NflogReader() {
  const uint64_t one = 1;
  if (stop_.valid()) (void)!::write(stop_.get(), &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  if (nl_ != nullptr) {
    (void)Config(group_, NFULNL_CFG_CMD_UNBIND);
    mnl_socket_close(nl_);
  }
}

// One NFULNL_MSG_CONFIG: the command, and with BIND the copy mode (the
// packet's first kCopyRange bytes) and a queue threshold of 1 (each packet
// sent at once, not batched for up to a second).
Status NflogReader::Config(uint16_t group, uint8_t cmd) {
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf.data());
  nlh->nlmsg_type = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG;
  nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
  nlh->nlmsg_seq = seq_++;
  auto* nfg = static_cast<nfgenmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(nfgenmsg)));
  nfg->nfgen_family = AF_UNSPEC;
  nfg->version = NFNETLINK_V0;
  nfg->res_id = htons(group);
  nfulnl_msg_config_cmd c{cmd};
  mnl_attr_put(nlh, NFULA_CFG_CMD, sizeof c, &c);
  if (cmd == NFULNL_CFG_CMD_BIND) {
    nfulnl_msg_config_mode m{};
    m.copy_range = htonl(kCopyRange);
    m.copy_mode = NFULNL_COPY_PACKET;
    mnl_attr_put(nlh, NFULA_CFG_MODE, sizeof m, &m);
    mnl_attr_put_u32(nlh, NFULA_CFG_QTHRESH, htonl(1));
  }
  const std::string what = "nfnetlink_log config group " + std::to_string(group);
  if (mnl_socket_sendto(nl_, nlh, nlh->nlmsg_len) < 0) return ErrnoToStatus(errno, "sendto(" + what + ")");
  std::vector<char> rbuf(MNL_SOCKET_BUFFER_SIZE);
  const uint32_t portid = mnl_socket_get_portid(nl_);
  for (int i = 0; i < 16; ++i) {
    ssize_t n = mnl_socket_recvfrom(nl_, rbuf.data(), rbuf.size());
    if (n < 0) return ErrnoToStatus(errno, "recvfrom(" + what + ")");
    int rc = mnl_cb_run(rbuf.data(), static_cast<size_t>(n), nlh->nlmsg_seq, portid, nullptr, nullptr);
    if (rc == MNL_CB_ERROR) return ErrnoToStatus(errno, what);
    if (rc == MNL_CB_STOP) return absl::OkStatus();
  }
  return absl::InternalError(what + ": no ack");
}

void NflogReader::Loop() {
  std::vector<char> buf(kBuf);
  const int fd = mnl_socket_get_fd(nl_);
  for (;;) {
    pollfd p[2] = {{fd, POLLIN, 0}, {stop_.get(), POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) return;
    if (p[1].revents != 0) return;
    ssize_t n = ::recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n <= 0) continue;  // ENOBUFS: the kernel dropped events; go on
    auto cb = [](const nlmsghdr* nlh, void* data) -> int {
      if ((nlh->nlmsg_type & 0xff) != NFULNL_MSG_PACKET) return MNL_CB_OK;
      const nlattr* tb[NFULA_MAX + 1] = {};
      if (mnl_attr_parse(nlh, sizeof(nfgenmsg), AttrCb, tb) < 0) return MNL_CB_OK;
      LoggedPacket pkt;
      if (tb[NFULA_PREFIX] != nullptr) pkt.prefix = mnl_attr_get_str(tb[NFULA_PREFIX]);
      if (tb[NFULA_PAYLOAD] != nullptr)
        ParsePacket(static_cast<const uint8_t*>(mnl_attr_get_payload(tb[NFULA_PAYLOAD])),
                    mnl_attr_get_payload_len(tb[NFULA_PAYLOAD]), &pkt);
      static_cast<NflogReader*>(data)->handler_(pkt);
      return MNL_CB_OK;
    };
    (void)mnl_cb_run(buf.data(), static_cast<size_t>(n), 0, 0, cb, this);
  }
}

}  // namespace warren::net
