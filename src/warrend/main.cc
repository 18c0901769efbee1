// warrend: the node daemon (DESIGN.md §2). Serves the warren.v1 API on a unix
// socket (and optionally TCP with a bearer token), owns the sandbox table,
// and leaves sandboxes running when it stops: the next warrend on the same
// state dir re-adopts them. Flags: flags.h; host setup: host_setup.h; the
// daemon's life: daemon.h.
#include <signal.h>

#include <cstdio>

#include <CLI/CLI.hpp>

#include "absl/synchronization/mutex.h"

#include "common/log.h"
#include "warrend/daemon.h"
#include "warrend/flags.h"

namespace {

// Parses the command line into `f`: -1 to go on, else main's exit code (0
// after --help; CLI11's message and code for a bad command line). CLI11
// reports a bad flag definition by exception too (a ConstructionError, from
// App's constructor or AddFlags): that ends here with its message as well.
int ParseFlags(int argc, char** argv, warren::warrend::Flags& f) {
  try {
    CLI::App app{"warrend: the warren node daemon"};
    warren::warrend::AddFlags(app, f);
    CLI11_PARSE(app, argc, argv);
  } catch (const CLI::Error& e) {
    std::fprintf(stderr, "warrend: flags: %s\n", e.what());
    return e.get_exit_code();
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  warren::warrend::Flags f;
  if (int rc = ParseFlags(argc, argv, f); rc >= 0) return rc;

  warren::Status s =
      warren::SetupLogging(f.log_format == "json" ? warren::LogFormat::kJson : warren::LogFormat::kText, f.log_level);
  if (!s.ok()) {
    std::fprintf(stderr, "warrend: %s\n", s.ToString().c_str());
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  // gRPC locks through absl::Mutex, and Debian builds abseil without NDEBUG,
  // so every lock and every mutex destroyed would go through the deadlock
  // detector's one global cycle graph (measured in warrend's profile:
  // GraphCycles::GetId, Mutex::ForgetDeadlockInfo). Lock-order bugs are the
  // TSan build's to find, not the serving daemon's.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return warren::warrend::Run(f);
}
