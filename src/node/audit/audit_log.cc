#include "node/audit/audit_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>

#include "common/log.h"
#include "common/unique_fd.h"
#include "node/admission/validate.h"

namespace warren::node {

void AuditLog::Append(const std::string& id, const nlohmann::json& entry) const {
  if (!ValidSandboxId(id)) return;
  std::string line = entry.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::lock_guard<std::mutex> l(mu_);
  if (!alive_(id)) return;  // gone: no log to resurrect
  const std::string path = Path(id);
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600));
  if (!fd.valid() || ::write(fd.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    Log(spdlog::level::warn, "audit write failed",
        {{"sandbox", id}, {"error", ErrnoToStatus(errno, "write(" + path + ")").ToString()}});
  }
}

std::vector<nlohmann::json> AuditLog::Read(const std::string& id) const {
  std::vector<nlohmann::json> out;
  std::lock_guard<std::mutex> l(mu_);
  std::ifstream f(Path(id));
  std::string line;
  size_t bytes = 0;
  while (std::getline(f, line) && bytes < (64u << 20)) {
    bytes += line.size();
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) out.push_back(std::move(j));
  }
  return out;
}

void AuditLog::Remove(const std::string& id) const {
  std::lock_guard<std::mutex> l(mu_);
  (void)::unlink(Path(id).c_str());
}

}  // namespace warren::node
