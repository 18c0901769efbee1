#include "node/metrics.h"

#include <cctype>

namespace warren::node {

Metrics& NullMetrics() {
  static Metrics* const null = new Metrics();  // never destroyed: hooks may run during exit
  return *null;
}

std::string OutcomeLabel(const Status& s) {
  if (s.ok()) return "ok";
  // absl's names are upper case with underscores ("INVALID_ARGUMENT").
  std::string name = absl::StatusCodeToString(s.code());
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name.empty() ? "unknown" : name;
}

std::string ExecOutcomeLabel(const Status& s, bool timed_out, bool oom_killed) {
  if (!s.ok()) return OutcomeLabel(s);
  if (timed_out) return "timed_out";
  if (oom_killed) return "oom_killed";
  return "ok";
}

std::string_view DestroyCause(std::string_view reason) {
  // The reason texts the node's rooms pass to SandboxTable::Destroy.
  if (reason == "destroy requested") return "client";
  if (reason == "ttl expired") return "ttl";
  if (reason == "idle timeout") return "idle";
  if (reason.starts_with("job ")) return "job";  // "job destroy requested", "job lease lapsed ..."
  if (reason == "create abandoned by its client") return "abandoned";
  if (reason == "fork failed") return "fork";
  if (reason == "grade finished") return "grade";
  return "other";
}

}  // namespace warren::node
