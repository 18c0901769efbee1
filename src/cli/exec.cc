// warren exec: run one command in a sandbox and relay its outcome.
//
// `warren exec [flags] ID [--] CMD...`: every word after ID is the command
// (flags after the first CMD word are the command's, not ours); "--" may
// separate it explicitly. One CMD word is a shell string run as
// `/bin/sh -c WORD` in the sandbox; several words are argv (execve'd, PATH
// searched); --argv forces argv for a single word. The command's stdout and
// stderr bytes are written raw to ours, notes (timeout, OOM, truncation) go
// to stderr prefixed "warren: ", and we exit with the command's exit code
// (128+signal when a signal ended it). --json prints ExecResultToJson() and
// still exits with the command's exit code.
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/client.h"
#include "cli/commands.h"
#include "cli/output.h"
#include "common/unique_fd.h"

namespace warren::cli {
namespace {

StatusOr<std::string> ReadStdinBytes(const ExecArgs& a) {
  if (a.read_stdin) return ReadAll(STDIN_FILENO, "stdin");
  if (a.stdin_file.empty()) return std::string();
  UniqueFd fd(::open(a.stdin_file.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, "open(" + a.stdin_file + ")");
  return ReadAll(fd.get(), a.stdin_file);
}

void PrintNotes(const ExecArgs& a, const v1::ExecResult& r) {
  std::string notes;
  if (r.timed_out()) {
    notes += absl::StrFormat("warren: timed out after %gs; the process tree was killed\n", a.timeout_s);
  }
  if (r.oom_killed()) {
    notes += "warren: out of memory: the sandbox's memory cgroup killed a process\n";
  }
  if (r.stdout_truncated()) {
    notes +=
        absl::StrCat("warren: stdout truncated: kept ", r.stdout().size(), " of ", r.stdout_total_bytes(), " bytes\n");
  }
  if (r.stderr_truncated()) {
    notes +=
        absl::StrCat("warren: stderr truncated: kept ", r.stderr().size(), " of ", r.stderr_total_bytes(), " bytes\n");
  }
  if (!notes.empty()) (void)WriteAll(STDERR_FILENO, notes, "stderr");
}

int ExitCodeOf(const v1::ExecResult& r) {
  return (r.exit_code() >= 0 && r.exit_code() <= 255) ? r.exit_code() : kExitError;
}

int RunExec(Invocation& inv) {
  if (inv.exec.tty) return RunExecTty(inv);
  StatusOr<v1::ExecRequest> req = BuildExecRequest(inv.exec);
  if (!req.ok()) return UsageError(req.status());
  StatusOr<std::string> input = ReadStdinBytes(inv.exec);
  if (!input.ok()) {
    PrintError(input.status());
    return kExitError;
  }
  req->set_stdin(*std::move(input));

  Client client(inv.global);
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::ExecResult result;
  Status st = FromGrpc(client.sandboxes().Exec(&ctx, *req, &result));
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  if (inv.global.json) {
    PrintJson(ExecResultToJson(result));
    return ExitCodeOf(result);
  }
  Status out = WriteAll(STDOUT_FILENO, result.stdout(), "stdout");
  Status err = WriteAll(STDERR_FILENO, result.stderr(), "stderr");
  PrintNotes(inv.exec, result);
  if (!out.ok()) {
    PrintError(out);
    return kExitError;
  }
  (void)err;  // nowhere left to report a broken stderr
  return ExitCodeOf(result);
}

}  // namespace

StatusOr<v1::ExecRequest> BuildExecRequest(const ExecArgs& a) {
  if (a.id.empty()) return absl::InvalidArgumentError("missing sandbox ID");
  if (a.cmd.empty()) {
    return absl::InvalidArgumentError("missing command: warren exec [flags] ID [--] CMD...");
  }
  if (a.read_stdin && !a.stdin_file.empty()) {
    return absl::InvalidArgumentError("-i and --stdin-file exclude each other");
  }
  if (!(a.timeout_s >= 0) || a.timeout_s > 4294967.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout must be between 0 and 4294967 seconds, got ", a.timeout_s));
  }
  v1::ExecRequest req;
  req.set_sandbox_id(a.id);
  if (a.cmd.size() == 1 && !a.force_argv) {
    req.set_shell(a.cmd[0]);
  } else {
    for (const std::string& word : a.cmd) req.add_argv(word);
  }
  for (const std::string& kv : a.env) {
    ASSIGN_OR_RETURN(auto p, ParseKeyValue(kv, "--env"));
    (*req.mutable_env())[p.first] = p.second;
  }
  req.set_cwd(a.cwd);
  req.set_user(a.user);
  uint32_t ms = static_cast<uint32_t>(std::llround(a.timeout_s * 1000.0));
  if (a.timeout_s > 0 && ms == 0) ms = 1;  // a tiny timeout is not "none"
  req.set_timeout_ms(ms);
  req.set_output_cap_bytes(a.output_cap_bytes);
  return req;
}

void AddExecCommand(CLI::App& root, Invocation& inv) {
  ExecArgs& a = inv.exec;
  CLI::App* sub = root.add_subcommand("exec",
                                      "Run a command: warren exec [flags] ID [--] CMD...\n"
                                      "One CMD word runs as `/bin/sh -c WORD`; several run as argv. Exits with the\n"
                                      "command's exit code (128+signal if killed).");
  sub->add_option("id", a.id, "sandbox id")->required();
  // CMD is everything from the first word after ID on (flags after it belong
  // to the command, as in `warren exec ID ls -la`); "--" also ends our flags.
  // No fallthrough: it would hand CMD words to the root parser. So --addr and
  // --token go before `exec`; --json is accepted here too.
  sub->fallthrough(false);
  sub->prefix_command();
  sub->add_flag("--json", inv.global.json, "print the ExecResult as one JSON document");
  sub->add_option("--timeout", a.timeout_s, "seconds (fractions allowed); kills the whole process tree; 0 = none");
  sub->add_option("--env", a.env, "K=V added to the environment; repeatable")->allow_extra_args(false);
  sub->add_option("--cwd", a.cwd, "working directory");
  sub->add_option("--user", a.user, "root, a user name, or uid[:gid]");
  CLI::Option* file = sub->add_option("--stdin-file", a.stdin_file, "send this file's bytes as stdin (then EOF)");
  CLI::Option* in = sub->add_flag("-i,--stdin", a.read_stdin, "read our stdin to EOF and send it as stdin");
  file->excludes(in);
  in->excludes(file);
  sub->add_flag("-t,--tty", a.tty,
                "run on a pseudo-terminal, output streamed; with -i (-it) our stdin is streamed live\n"
                "(raw mode on a terminal) and window size changes follow");
  sub->add_flag("--argv", a.force_argv, "run a single CMD word as argv, not shell");
  sub->add_option("--output-cap", a.output_cap_bytes, "bytes kept per stream; 0 = node default");
  sub->callback([&inv, sub] {
    // `ID ls -- x` keeps its "--": it is an argument of ls.
    inv.exec.cmd = sub->remaining();
    if (inv.exec_dashdash) {
      if (!inv.exec.cmd.empty()) inv.exec.cmd.push_back("--");
      inv.exec.cmd.insert(inv.exec.cmd.end(), inv.exec_tail.begin(), inv.exec_tail.end());
    }
    inv.verb = "exec";
    inv.run = RunExec;
  });
}

}  // namespace warren::cli
