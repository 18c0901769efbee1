#include "runtime/vm/qmp.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include <nlohmann/json.hpp>

namespace warren::runtime::vm {

namespace {
constexpr size_t kMaxLine = 1 << 20;  // QEMU's answers here are small; a flood is an error
}

StatusOr<std::unique_ptr<QmpClient>> QmpClient::Connect(const std::string& path, Clock::time_point deadline) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.size() >= sizeof sa.sun_path) return absl::InvalidArgumentError("QMP socket path too long: " + path);
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  Status last;
  while (true) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return ErrnoToStatus(errno, "socket(AF_UNIX)");
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) {
      std::unique_ptr<QmpClient> q(new QmpClient(std::move(fd)));
      ASSIGN_OR_RETURN(std::string greeting, q->ReadLine(deadline));
      if (greeting.find("\"QMP\"") == std::string::npos) return absl::InternalError("QMP: no greeting: " + greeting);
      RETURN_IF_ERROR(q->Roundtrip(R"({"execute":"qmp_capabilities"})", "qmp_capabilities", deadline).status());
      return q;
    }
    last = ErrnoToStatus(errno, "connect(" + path + ")");
    if (Clock::now() >= deadline) return last;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

StatusOr<std::string> QmpClient::Execute(const std::string& execute, const std::string& arguments_json,
                                         std::chrono::milliseconds timeout, int pass_fd) {
  std::lock_guard<std::mutex> l(mu_);
  if (!broken_.ok()) return broken_;
  std::string line = R"({"execute":")" + execute + "\"";
  if (!arguments_json.empty()) line += R"(,"arguments":)" + arguments_json;
  line += "}";
  StatusOr<std::string> r = Roundtrip(line, execute, Clock::now() + timeout, pass_fd);
  if (!r.ok() && r.status().code() != absl::StatusCode::kInternal) broken_ = r.status();
  return r;
}

StatusOr<std::string> QmpClient::Roundtrip(const std::string& line, const std::string& what, Clock::time_point deadline,
                                           int pass_fd) {
  std::string out = line + "\n";
  size_t off = 0;
  if (pass_fd >= 0) {
    // The fd rides on the command's first bytes (QEMU takes it with them).
    iovec iov{out.data(), out.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    ssize_t n;
    do {
      n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n < 0) return absl::UnavailableError("QMP " + what + ": sendmsg: " + std::strerror(errno));
    off = static_cast<size_t>(n);
  }
  while (off < out.size()) {
    ssize_t n = ::send(fd_.get(), out.data() + off, out.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::UnavailableError("QMP " + what + ": send: " + std::strerror(errno));
    off += static_cast<size_t>(n);
  }
  while (true) {
    ASSIGN_OR_RETURN(std::string answer, ReadLine(deadline));
    nlohmann::json j = nlohmann::json::parse(answer, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return absl::UnavailableError("QMP " + what + ": not JSON: " + answer);
    if (j.contains("return")) return j["return"].dump();
    if (j.contains("error")) {
      std::string desc = j["error"].is_object() ? j["error"].value("desc", answer) : answer;
      return absl::InternalError("QMP " + what + ": " + desc);
    }
    // An event ({"event": ...}): not ours.
  }
}

StatusOr<std::string> QmpClient::ReadLine(Clock::time_point deadline) {
  while (true) {
    size_t nl = buf_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return line;
    }
    if (buf_.size() > kMaxLine) return absl::UnavailableError("QMP: a line over 1 MiB");
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return absl::DeadlineExceededError("QMP: QEMU did not answer in time");
    pollfd p{fd_.get(), POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(left));
    if (n < 0 && errno != EINTR) return ErrnoToStatus(errno, "poll(QMP)");
    if (n <= 0) continue;
    char chunk[4096];
    ssize_t r = ::recv(fd_.get(), chunk, sizeof chunk, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return absl::UnavailableError(std::string("QMP: recv: ") + std::strerror(errno));
    if (r == 0) return absl::UnavailableError("QMP: QEMU closed its monitor (exited?)");
    buf_.append(chunk, static_cast<size_t>(r));
  }
}

}  // namespace warren::runtime::vm
