// The command tree and the parse-then-run driver.
#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "cli/output.h"

namespace warren::cli {

StatusOr<std::pair<std::string, std::string>> ParseKeyValue(const std::string& kv, const std::string& flag) {
  size_t eq = kv.find('=');
  if (eq == std::string::npos || eq == 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " wants KEY=VALUE with a non-empty KEY, got \"", kv, "\""));
  }
  return std::make_pair(kv.substr(0, eq), kv.substr(eq + 1));
}

int UsageError(const Status& status) {
  std::cout.flush();
  std::string msg(status.message());
  std::cerr << "error: " << msg << "\nRun with --help for more information." << std::endl;
  return kExitUsage;
}

std::unique_ptr<CLI::App> MakeApp(Invocation& inv) {
  auto app = std::make_unique<CLI::App>(
      "warren: client of warrend, the elastic sandbox daemon.\n"
      "Errors go to stderr as \"error: <GRPC_CODE>: <message>\"; exit 1 on error, "
      "2 on usage error.",
      "warren");
  app->add_option("--addr", inv.global.addr, "daemon address: unix:/path, /path (unix socket) or host:port (TCP)")
      ->envname("WARREN_ADDR")
      ->capture_default_str();
  app->add_option("--token", inv.global.token, "bearer token sent as 'authorization: Bearer <token>'")
      ->envname("WARREN_TOKEN");
  app->add_flag("--json", inv.global.json, "print one JSON document on stdout");
  app->require_subcommand(1);
  // Global flags are accepted after the verb too (warren ls --json).
  app->fallthrough();

  AddCreateCommand(*app, inv);
  AddExecCommand(*app, inv);
  AddLsCommands(*app, inv);
  AddRmCommand(*app, inv);
  AddCpCommand(*app, inv);
  AddLayerCommand(*app, inv);
  AddImageCommand(*app, inv);
  AddStatusCommands(*app, inv);
  AddNodeCommands(*app, inv);
  AddProjectCommands(*app, inv);
  AddLifecycleCommands(*app, inv);
  AddDesktopCommands(*app, inv);
  AddSnapshotCommands(*app, inv);
  AddJobCommand(*app, inv);
  AddLogsCommand(*app, inv);
  AddEvalCommand(*app, inv);
  AddNetworkCommand(*app, inv);
  AddE2bCommand(*app, inv);
  return app;
}

namespace {

// If the verb is `exec` or `grade` and a "--" follows it, moves the words after the
// "--" into inv.exec_tail and drops them (and the "--") from args.
// Index of the verb in args (the first word that is not a global flag), or
// args.size() if there is none.
size_t VerbIndex(const std::vector<std::string>& args) {
  size_t i = 1;
  while (i < args.size()) {
    const std::string& a = args[i];
    if (a == "--addr" || a == "--token") {
      i += 2;
    } else if (!a.empty() && a[0] == '-') {
      ++i;
    } else {
      break;
    }
  }
  return std::min(i, args.size());
}

void SplitExecTail(std::vector<std::string>& args, Invocation& inv) {
  const size_t i = VerbIndex(args);
  if (i >= args.size() || (args[i] != "exec" && args[i] != "grade")) return;
  for (size_t j = i + 1; j < args.size(); ++j) {
    if (args[j] == "--") {
      inv.exec_dashdash = true;
      inv.exec_tail.assign(args.begin() + static_cast<std::ptrdiff_t>(j) + 1, args.end());
      args.resize(j);
      return;
    }
  }
}

}  // namespace

int ParseArgs(CLI::App& app, Invocation& inv, int argc, const char* const* argv) {
  std::vector<std::string> args(argv, argv + argc);
  // An unknown verb: name it (CLI11 would only say a subcommand is required).
  if (size_t v = VerbIndex(args); v < args.size()) {
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      known = known || sub->check_name(args[v]);
    }
    if (!known) {
      return UsageError(absl::InvalidArgumentError("unknown command \"" + args[v] + "\""));
    }
  }
  SplitExecTail(args, inv);
  std::vector<const char*> ptrs;
  ptrs.reserve(args.size());
  for (const std::string& a : args) ptrs.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(ptrs.size()), ptrs.data());
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? -1 : kExitUsage;
  }
  return 0;
}

int RunCli(int argc, const char* const* argv) {
  Invocation inv;
  std::unique_ptr<CLI::App> app = MakeApp(inv);
  int rc = ParseArgs(*app, inv, argc, argv);
  if (rc != 0) return rc < 0 ? kExitOk : rc;
  if (!inv.run) {
    std::cerr << app->help();
    return kExitUsage;
  }
  return inv.run(inv);
}

}  // namespace warren::cli
