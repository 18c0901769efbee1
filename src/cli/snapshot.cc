// warren snapshot ID [--exclude GLOB]... [--name KIND/NAME@VERSION] [--no-pause]:
//   the sandbox's changes become a layer; prints the layer digest (--json:
//   the layer and the layers to create from).
// warren fork ID -n N [--exclude GLOB]... [--no-pause] [--ttl S] [--label K=V]...:
//   N new running sandboxes from the sandbox's current file system, made by
//   the daemon in one call (Lifecycle.Fork: all or nothing; they keep its
//   resources, env, workdir, user, labels, ttl and job; --label K=V is
//   merged over the labels, --ttl S replaces the TTL); prints their ids, one per line.
// warren grade ID --solution PATH... [--timeout S] -- CMD...: runs the
//   grader in a fresh sandbox from the pristine layers + the agent's changes
//   under the solution paths only; prints the grader's output, reports the
//   agent's changes outside them on stderr, exits with the grader's exit code.
#include <unistd.h>

#include <cmath>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/client.h"
#include "cli/commands.h"
#include "cli/output.h"

namespace warren::cli {
namespace {

constexpr uint32_t kMaxFork = 256;  // ForkRequest.count

StatusOr<v1::SnapshotResponse> DoSnapshot(Client& client, const RlArgs& a) {
  v1::Lifecycle::Stub stub(client.channel());
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::SnapshotRequest req;
  req.set_id(a.id);
  req.set_name(a.name);
  for (const std::string& x : a.exclude) req.add_exclude(x);
  req.set_no_pause(a.no_pause);
  v1::SnapshotResponse resp;
  RETURN_IF_ERROR(FromGrpc(stub.Snapshot(&ctx, req, &resp)));
  return resp;
}

int RunSnapshot(Invocation& inv) {
  Client client(inv.global);
  StatusOr<v1::SnapshotResponse> r = DoSnapshot(client, inv.rl);
  if (!r.ok()) {
    PrintError(r.status());
    return kExitError;
  }
  if (inv.global.json) {
    PrintJson({{"layer", LayerToJson(r->layer())},
               {"layers", std::vector<std::string>(r->layers().begin(), r->layers().end())}});
  } else {
    std::cout << r->layer().digest() << "\t" << r->layer().name() << std::endl;
  }
  return kExitOk;
}

int RunFork(Invocation& inv) {
  const RlArgs& a = inv.rl;
  if (a.n < 1 || a.n > kMaxFork) {
    return UsageError(absl::InvalidArgumentError(absl::StrCat("-n must be in [1, ", kMaxFork, "], got ", a.n)));
  }
  v1::ForkRequest req;
  req.set_id(a.id);
  req.set_count(a.n);
  for (const std::string& x : a.exclude) req.add_exclude(x);
  req.set_no_pause(a.no_pause);
  req.set_ttl_s(a.ttl_s);
  for (const std::string& kv : a.labels) {
    StatusOr<std::pair<std::string, std::string>> p = ParseKeyValue(kv, "--label");
    if (!p.ok()) return UsageError(p.status());
    (*req.mutable_labels())[p->first] = p->second;
  }
  Client client(inv.global);
  v1::Lifecycle::Stub stub(client.channel());
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::ForkResponse resp;
  if (Status st = FromGrpc(stub.Fork(&ctx, req, &resp)); !st.ok()) {
    PrintError(st);
    return kExitError;
  }
  std::vector<std::string> ids;
  std::vector<std::string> layers;
  for (const v1::Sandbox& sb : resp.sandboxes()) ids.push_back(sb.id());
  if (!resp.sandboxes().empty()) {
    layers.assign(resp.sandboxes(0).layers().begin(), resp.sandboxes(0).layers().end());
  }
  if (inv.global.json) {
    PrintJson({{"ids", ids}, {"layer", LayerToJson(resp.layer())}, {"layers", layers}});
  } else {
    for (const std::string& id : ids) std::cout << id << "\n";
    std::cout.flush();
  }
  return kExitOk;
}

int RunGrade(Invocation& inv) {
  StatusOr<v1::GradeRequest> req = BuildGradeRequest(inv.rl, inv.exec_tail);
  if (!req.ok()) return UsageError(req.status());
  Client client(inv.global);
  v1::Lifecycle::Stub stub(client.channel());
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::GradeResponse resp;
  if (Status st = FromGrpc(stub.Grade(&ctx, *req, &resp)); !st.ok()) {
    PrintError(st);
    return kExitError;
  }
  const v1::ExecResult& r = resp.result();
  const int code = (r.exit_code() >= 0 && r.exit_code() <= 255) ? r.exit_code() : kExitError;
  std::vector<std::string> touched(resp.touched().begin(), resp.touched().end());
  if (inv.global.json) {
    PrintJson({{"result", ExecResultToJson(r)},
               {"passed", r.exit_code() == 0},
               {"touched", touched},
               {"touched_truncated", resp.touched_truncated()},
               {"rejected", resp.rejected()},
               {"grade_sandbox_id", resp.grade_sandbox_id()}});
    return code;
  }
  (void)WriteAll(STDOUT_FILENO, r.stdout(), "stdout");
  (void)WriteAll(STDERR_FILENO, r.stderr(), "stderr");
  for (const std::string& t : touched) std::cerr << "warren: changed by the agent outside the solution: " << t << "\n";
  if (resp.touched_truncated()) std::cerr << "warren: (more changes outside the solution not listed)\n";
  if (r.timed_out()) std::cerr << "warren: grader timed out\n";
  return code;
}

}  // namespace

StatusOr<v1::GradeRequest> BuildGradeRequest(const RlArgs& a, const std::vector<std::string>& cmd) {
  if (a.id.empty()) return absl::InvalidArgumentError("missing sandbox ID");
  if (cmd.empty()) return absl::InvalidArgumentError("missing grader: warren grade [flags] ID -- CMD...");
  if (!(a.timeout_s >= 0) || a.timeout_s > 4294967.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout must be between 0 and 4294967 seconds, got ", a.timeout_s));
  }
  v1::GradeRequest req;
  req.set_id(a.id);
  v1::ExecRequest* g = req.mutable_grader();
  if (cmd.size() == 1) {
    g->set_shell(cmd[0]);
  } else {
    for (const std::string& w : cmd) g->add_argv(w);
  }
  uint32_t ms = static_cast<uint32_t>(std::llround(a.timeout_s * 1000.0));
  if (a.timeout_s > 0 && ms == 0) ms = 1;
  g->set_timeout_ms(ms);
  if (a.solution.empty()) {
    return absl::InvalidArgumentError(
        "missing --solution PATH: where the task's solution lives (the agent's changes "
        "enter the grader only there)");
  }
  for (const std::string& p : a.protected_paths) req.add_protected_paths(p);
  for (const std::string& p : a.solution) req.add_solution(p);
  return req;
}

void AddSnapshotCommands(CLI::App& root, Invocation& inv) {
  RlArgs& a = inv.rl;
  CLI::App* snap = root.add_subcommand("snapshot", "Pack a sandbox's changes into a new layer (pack_diff).");
  snap->fallthrough();
  snap->add_option("id", a.id, "sandbox id")->required();
  snap->add_option("--exclude", a.exclude, "fnmatch pattern of absolute paths left out of the layer; repeatable")
      ->allow_extra_args(false);
  snap->add_option("--name", a.name, "layer name kind/name@version (default workspace/snap-<id>@<ns>)");
  snap->add_flag("--no-pause", a.no_pause, "do not freeze the sandbox while its changes are read");
  snap->callback([&inv] {
    inv.verb = "snapshot";
    inv.run = RunSnapshot;
  });

  CLI::App* fork = root.add_subcommand("fork", "Start N running copies of a sandbox's file system state.");
  fork->fallthrough();
  fork->add_option("id", a.id, "sandbox id")->required();
  fork->add_option("-n", a.n, "number of copies")->required();
  fork->add_option("--exclude", a.exclude, "fnmatch pattern of absolute paths left out of the copies; repeatable")
      ->allow_extra_args(false);
  fork->add_flag("--no-pause", a.no_pause, "do not freeze the sandbox while its changes are read");
  fork->add_option("--ttl", a.ttl_s, "TTL of the copies in seconds (default: the sandbox's)");
  fork->add_option("--label", a.labels, "K=V label of the copies (merged over the sandbox's); repeatable")
      ->allow_extra_args(false);
  fork->callback([&inv] {
    inv.verb = "fork";
    inv.run = RunFork;
  });

  CLI::App* grade =
      root.add_subcommand("grade",
                          "Grade a sandbox: warren grade [flags] ID -- CMD...\n"
                          "The grader runs in a fresh sandbox from the pristine layers + the agent's changes\n"
                          "under the --solution paths only; exits with the grader's exit code.");
  grade->fallthrough();
  grade->add_option("id", a.id, "sandbox id")->required();
  grade
      ->add_option("--solution", a.solution,
                   "absolute path where the task's solution lives (the agent's changes enter the grader only "
                   "there); repeatable, required")
      ->allow_extra_args(false);
  grade
      ->add_option("--protected", a.protected_paths,
                   "deprecated: a path inside a solution path kept pristine; repeatable")
      ->allow_extra_args(false);
  grade->add_option("--timeout", a.timeout_s, "grader timeout in seconds; 0 = none");
  grade->callback([&inv] {
    inv.verb = "grade";
    inv.run = RunGrade;
  });
}

}  // namespace warren::cli
