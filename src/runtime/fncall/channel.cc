// The daemon<->zygote protocol: seqpacket messages with fds, the zygote's
// status messages, json frames.
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "jail/contain.h"
#include "jail/plan.h"
#include "jail/plan_builder.h"
#include "runtime/fncall/fncall_internal.h"

namespace warren::runtime::fncall::internal {

// The call process's own steps (zygote_helper.c); from kJailStep0 on, its
// containment plan's (CallJailPlan).
const char* const kHelperSteps[] = {"?",
                                    "chdir(/tmp)",
                                    "open(/proc/self/oom_score_adj)",
                                    "recvmsg(call)",
                                    "malformed call",
                                    "mmap(call memfd)",
                                    "dup3(call fds)",
                                    "getrandom(reseed)"};

Status SendMsgUntil(int sock, const std::string& data, const std::vector<int>& fds, Clock::time_point deadline) {
  iovec v{const_cast<char*>(data.data()), data.size()};
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * 8)];
  msghdr m{};
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  if (!fds.empty()) {
    if (fds.size() > 8) return absl::InternalError("send(worker): too many fds");
    memset(cbuf, 0, sizeof cbuf);
    m.msg_control = cbuf;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (int i = 0; i < (1 << 22); ++i) {
    ssize_t n = ::sendmsg(sock, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(data.size())) return absl::OkStatus();
    if (n >= 0) return absl::InternalError("sendmsg(worker): short send on a seqpacket socket");
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return Errno("sendmsg(worker)");
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return absl::DeadlineExceededError("sendmsg(worker): deadline");
    pollfd p{sock, POLLOUT, 0};
    ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
  }
  return absl::InternalError("sendmsg(worker): stuck");
}

// Receives one message (at most `max` bytes) and at most one fd with it
// (O_CLOEXEC; extra fds are closed), waiting until `deadline`.
Status RecvMsgUntil(int sock, size_t max, std::string* data, UniqueFd* fd, Clock::time_point deadline) {
  data->resize(max);
  for (int i = 0; i < (1 << 22); ++i) {
    iovec v{data->data(), max};
    alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * 8)];
    msghdr m{};
    m.msg_iov = &v;
    m.msg_iovlen = 1;
    m.msg_control = cbuf;
    m.msg_controllen = sizeof cbuf;
    ssize_t n = ::recvmsg(sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n > 0) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t j = 0; j < k; ++j) {
          int f;
          memcpy(&f, CMSG_DATA(c) + j * sizeof(int), sizeof f);
          if (fd != nullptr && !fd->valid()) {
            fd->reset(f);
          } else {
            ::close(f);
          }
        }
      }
      if (m.msg_flags & MSG_TRUNC) return absl::InternalError("recvmsg(worker): message too long");
      data->resize(static_cast<size_t>(n));
      return absl::OkStatus();
    }
    if (n == 0) return absl::UnavailableError("worker closed its channel");
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return Errno("recvmsg(worker)");
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return absl::DeadlineExceededError("recvmsg(worker): deadline");
    pollfd p{sock, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
  }
  return absl::InternalError("recvmsg(worker): stuck");
}

StatusOr<ZygoteMsg> ParseZygoteMsg(const std::string& data) {
  ZygoteMsg m;
  if (data.size() < sizeof m) return absl::InternalError("worker sent a short message");
  memcpy(&m, data.data(), sizeof m);
  if (m.kind == 'E') {
    std::string step =
        m.b > 0 && m.b < static_cast<int32_t>(sizeof kHelperSteps / sizeof kHelperSteps[0]) ? kHelperSteps[m.b] : "?";
    if (m.b >= kJailStep0) {
      // The mount ops do not depend on the pool's options: a plan built here names them.
      auto plan = CallJailPlan(1, nullptr, true);
      step = plan.ok() ? jail::StepDescription(*plan, m.b - kJailStep0) : warren_jail_step_name(m.b - kJailStep0);
    }
    return ErrnoToStatus(m.a, "fncall call process set-up: " + step);
  }
  if (m.kind == 'F') return ErrnoToStatus(m.a, "fncall zygote: clone3(call process)");
  return m;
}

std::string Frame(const json& hdr, const std::string& blob) {
  std::string j = hdr.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out;
  out.reserve(8 + j.size() + blob.size());
  uint32_t lens[2] = {static_cast<uint32_t>(j.size()), static_cast<uint32_t>(blob.size())};
  out.append(reinterpret_cast<const char*>(lens), sizeof lens);
  out += j;
  out += blob;
  return out;
}

// The zygote's "ready" answer to the init message (one json frame).
StatusOr<json> ReadJsonFrame(int fd, Clock::time_point deadline) {
  std::string m;
  RETURN_IF_ERROR(RecvMsgUntil(fd, 1 << 16, &m, nullptr, deadline));
  uint32_t lens[2];
  if (m.size() < sizeof lens) return absl::InternalError("worker sent a short frame");
  memcpy(lens, m.data(), sizeof lens);
  if (lens[0] > m.size() - sizeof lens) return absl::InternalError("worker sent a truncated frame");
  json hdr = json::parse(m.substr(sizeof lens, lens[0]), nullptr, false);
  if (hdr.is_discarded() || !hdr.is_object()) return absl::InternalError("worker sent malformed json");
  return hdr;
}

}  // namespace warren::runtime::fncall::internal
