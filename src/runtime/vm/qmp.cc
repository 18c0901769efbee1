#include "runtime/vm/qmp.h"

#include <nlohmann/json.hpp>

namespace warren::runtime::vm {

StatusOr<std::unique_ptr<QmpClient>> QmpClient::Connect(const std::string& path, Clock::time_point deadline) {
  ASSIGN_OR_RETURN(microvm::Qmp qmp, microvm::Qmp::Connect(path, deadline));
  return std::unique_ptr<QmpClient>(new QmpClient(std::move(qmp)));
}

StatusOr<std::string> QmpClient::Execute(const std::string& execute, const std::string& arguments_json,
                                         std::chrono::milliseconds timeout, int pass_fd) {
  std::lock_guard<std::mutex> l(mu_);
  if (!broken_.ok()) return broken_;
  std::string line = R"({"execute":")" + execute + "\"";
  if (!arguments_json.empty()) line += R"(,"arguments":)" + arguments_json;
  line += "}";
  StatusOr<std::string> r = qmp_.Command(line, pass_fd, Clock::now() + timeout);
  if (!r.ok()) {
    // QEMU's own "error" answers leave the monitor usable and name the
    // command; anything else (closed, flooded, out of step after a
    // timeout) does not, named here.
    if (r.status().code() == absl::StatusCode::kInternal) return r.status();
    broken_ = Status(r.status().code(), "QMP " + execute + ": " + std::string(r.status().message()));
    return broken_;
  }
  return nlohmann::json::parse(*r)["return"].dump();
}

Status QmpClient::With(const std::function<Status(microvm::Qmp&)>& f) {
  std::lock_guard<std::mutex> l(mu_);
  if (!broken_.ok()) return broken_;
  Status s = f(qmp_);
  if (!s.ok() && s.code() != absl::StatusCode::kInternal) broken_ = s;
  return s;
}

}  // namespace warren::runtime::vm
