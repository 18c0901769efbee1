// warren eval: the main job, SWE-style rollouts in fresh sandboxes. The runner
// is the Python SDK's warren.eval (sdk/python/warren/eval.py); this verb
// execs `PYTHON -m warren.eval ARGS...` with every word after "eval" passed
// through unchanged (so `warren eval --help` is the runner's help).
//
// PYTHON: $WARREN_PYTHON, else the first .venv/bin/python found walking up
// from this binary's directory (build/src/cli/warren -> <repo>/.venv), else
// python3 from PATH. If a directory holding sdk/python/warren/eval.py is
// found the same way, it is put first on PYTHONPATH, so the CLI of a source
// tree runs that tree's SDK. --addr/--token given to `warren` are passed as
// WARREN_ADDR/WARREN_TOKEN.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"

namespace warren::cli {
namespace {

namespace fs = std::filesystem;

// The directory of the running binary, or "" if /proc/self/exe is unreadable.
fs::path SelfDir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

// First `dir/rel` that exists, for dir = start and up to `levels` parents.
fs::path FindUp(const fs::path& start, const fs::path& rel, int levels) {
  if (start.empty()) return {};
  fs::path dir = start;
  for (int i = 0; i <= levels; ++i) {
    std::error_code ec;
    if (fs::exists(dir / rel, ec)) return dir / rel;
    if (!dir.has_parent_path() || dir.parent_path() == dir) break;
    dir = dir.parent_path();
  }
  return {};
}

int RunEval(Invocation& inv) {
  const fs::path self = SelfDir();
  std::string python;
  if (const char* p = getenv("WARREN_PYTHON"); p != nullptr && *p != '\0') {
    python = p;
  } else if (fs::path venv = FindUp(self, ".venv/bin/python", 4); !venv.empty()) {
    python = venv.string();
  } else {
    python = "python3";
  }
  if (fs::path sdk = FindUp(self, "sdk/python/warren/eval.py", 4); !sdk.empty()) {
    std::string pp = sdk.parent_path().parent_path().string();
    const char* old = getenv("PYTHONPATH");
    if (old != nullptr && *old != '\0') pp = absl::StrCat(pp, ":", old);
    setenv("PYTHONPATH", pp.c_str(), 1);
  }
  // Globals given on the command line win over the environment (CLI11 has
  // already merged WARREN_ADDR/WARREN_TOKEN into them).
  setenv("WARREN_ADDR", inv.global.addr.c_str(), 1);
  if (!inv.global.token.empty()) setenv("WARREN_TOKEN", inv.global.token.c_str(), 1);

  std::vector<std::string> args = {python, "-m", "warren.eval"};
  args.insert(args.end(), inv.eval_args.begin(), inv.eval_args.end());
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  execvp(argv[0], argv.data());
  int err = errno;
  std::cerr << "error: exec " << python << ": " << strerror(err)
            << " (set WARREN_PYTHON to a Python with the warren SDK)" << std::endl;
  return kExitError;
}

}  // namespace

void AddEvalCommand(CLI::App& root, Invocation& inv) {
  CLI::App* eval = root.add_subcommand("eval",
                                       "Run N SWE-style rollouts in fresh sandboxes and grade them (the Python runner "
                                       "warren.eval; `warren eval --help` for its options).");
  // Every word after "eval" (also --help) goes to the runner.
  eval->fallthrough(false);
  eval->prefix_command();
  eval->set_help_flag();
  eval->allow_extras();
  eval->callback([&inv, eval] {
    inv.verb = "eval";
    inv.eval_args = eval->remaining();
    inv.run = RunEval;
  });
}

}  // namespace warren::cli
