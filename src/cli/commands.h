// The `warren` command line: one verb per file (create.cc, exec.cc, ...).
//
// Parsing and running are split so argument handling is testable without a
// daemon: MakeApp() wires every verb's flags into an Invocation, the chosen
// verb's parse callback sets Invocation::run, and RunCli() then runs it.
// The Build*Request() functions turn parsed flags into the gRPC request and
// reject malformed input with InvalidArgument (a usage error, exit 2).
//
// Exit codes: 0 success, 1 error (RPC or local I/O; printed on stderr as
// "error: <GRPC_CODE_NAME>: <message>"), 2 usage error. `warren exec` exits
// with the command's own exit code instead.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "CLI/CLI.hpp"
#include "common/status.h"
#include "warren/v1/warren.pb.h"

namespace warren::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;

inline constexpr char kDefaultAddr[] = "unix:/run/warren/warrend.sock";

struct GlobalOptions {
  // As given by --addr / WARREN_ADDR; see ResolveTarget() in client.h.
  std::string addr = kDefaultAddr;
  // Sent as "authorization: Bearer <token>" when non-empty.
  std::string token;
  bool json = false;
};

struct CreateArgs {
  std::string backend = "container";
  std::vector<std::string> layers;
  uint32_t cpu_millis = 0;
  uint32_t memory_mb = 0;
  uint32_t disk_mb = 0;
  uint32_t pids = 0;
  uint32_t open_files = 0;
  uint32_t tmpfs_mb = 0;
  std::vector<std::string> env;     // K=V
  std::vector<std::string> labels;  // K=V
  std::string workdir;
  std::string user;
  std::string hostname;
  std::string qos;  // "" = the node's default (latency)
  uint32_t ttl_s = 0;
  std::string job;
  std::string image;  // name:tag; its layers go below `layers`
  // Network: enabled by --network or any --net-allow/--net-deny.
  bool network = false;
  std::vector<std::string> net_allow, net_deny;
  // A main process (CreateSandboxRequest.start/command) and exposed ports.
  bool start = false;
  std::vector<std::string> command;  // after "--"
  std::vector<uint32_t> expose;
  bool expose_image_ports = false;
};

struct ExecArgs {
  std::string id;
  double timeout_s = 0;
  std::vector<std::string> env;  // K=V
  std::string cwd;
  std::string user;
  std::string stdin_file;   // read fully and sent as stdin
  bool read_stdin = false;  // -i: read our stdin fully and send it
  bool force_argv = false;  // --argv: a single CMD word is argv, not shell
  uint64_t output_cap_bytes = 0;
  bool tty = false;  // -t: run on a PTY, streamed (stream.cc); with -i stdin is streamed live
  // One word = shell string (`/bin/sh -c WORD`), several = argv.
  std::vector<std::string> cmd;
};

struct LsArgs {
  std::vector<std::string> labels;  // K=V
  std::string job;
};

struct CpArgs {
  std::string src;
  std::string dst;
  bool parents = false;    // -p: create missing parent directories remotely
  bool recursive = false;  // -r: copy directories
};

struct LayerBuildArgs {
  std::string name;
  std::string dir;
  std::string tar;  // path or "-" for stdin
};

// RL lifecycle verbs (lifecycle.cc: suspend, ttl; snapshot.cc: snapshot,
// fork, grade; job.cc: job ...).
struct RlArgs {
  std::string id;                            // sandbox id
  std::string name;                          // snapshot --name; job NAME
  std::vector<std::string> exclude;          // snapshot --exclude GLOB
  bool no_pause = false;                     // snapshot --no-pause
  uint32_t n = 0;                            // fork -n
  std::vector<std::string> labels;           // fork --label K=V
  std::vector<std::string> protected_paths;  // grade --protected PATH (deprecated)
  std::vector<std::string> solution;         // grade --solution PATH
  double timeout_s = 0;                      // grade --timeout
  uint32_t ttl_s = 0;                        // ttl ID SECONDS; fork --ttl
  uint32_t lease_s = 0, grace_s = 0;         // job heartbeat --lease/--grace
};

// Everything one invocation parsed. Exactly one verb's callback sets `run`.
// warren image pull|import|ls|inspect|rm (image.cc).
struct ImageArgs {
  std::string ref;   // pull: registry ref; import: path; inspect/rm: name
  std::string name;  // pull/import: stored name
  std::string username;
  bool password_stdin = false;
  std::string bearer_token;
  bool plain_http = false;
  std::string ca_file;
  std::string platform;
  uint32_t stall_timeout_s = 0;
  std::string ref_name;      // import of an OCI layout: which manifest
  bool quiet = false;        // no progress lines
  bool include_top = false;  // merge: every layer, the top one too
  uint64_t max_bytes = 0;    // merge: cap (0 = the daemon's default, 3 GiB)
};

// screenshot, input (desktop.cc).
struct DesktopArgs {
  std::string id;
  std::string out;   // screenshot: the PNG's path ("-": stdout)
  std::string kind;  // input: key, type, mouse, scroll
  std::string text;  // key: the combination; type: the text
  int32_t x = 0, y = 0;
  std::string button;  // mouse: left, middle, right ("" = none)
  std::string action = "move";
};

// project create|ls|get|rm (project.cc).
struct ProjectArgs {
  std::string path;
  uint32_t sandboxes = 0;  // quotas; 0 = no limit of its own
  uint64_t cpu_millis = 0;
  double creates_per_second = 0;  // quota; 0 = no limit of its own
  uint32_t create_burst = 0;      // 0 = max(1, floor(creates_per_second))
  uint64_t memory_mb = 0;
};

// warren e2b template (e2b.cc): the mapping file and the verb's words.
struct E2bArgs {
  std::string file = "/etc/warren/e2b-templates.json";
  std::string name;                 // set / rm / resolve
  std::vector<std::string> layers;  // set
};

struct Invocation {
  GlobalOptions global;
  CreateArgs create;
  ExecArgs exec;
  LsArgs ls;
  std::string get_id;
  std::vector<std::string> rm_ids;
  CpArgs cp;
  LayerBuildArgs layer_build;
  ImageArgs image;
  std::string layer_ref;  // layer get / layer rm
  // Words after exec's "--", split off before CLI11 sees them (CLI11 would
  // hand them to the root parser); see ParseArgs().
  bool exec_dashdash = false;
  std::vector<std::string> exec_tail;
  // audit, pause, resume (lifecycle.cc): the sandbox id.
  std::string lifecycle_id;
  RlArgs rl;
  struct {
    std::string id;
    std::vector<std::string> allow, deny;
    uint32_t port = 0;  // expose
    bool close = false;
  } network;
  DesktopArgs desktop;
  std::string node_id;  // node drain / undrain (node.cc)
  ProjectArgs project;
  E2bArgs e2b;
  // eval (eval.cc): the words after "eval", passed to the Python runner.
  std::vector<std::string> eval_args;
  // "create", "exec", "layer build", ...: the verb that was chosen.
  std::string verb;
  std::function<int(Invocation&)> run;
};

// Verb registration: each adds a subcommand to `root` writing into `inv`.
void AddCreateCommand(CLI::App& root, Invocation& inv);
void AddExecCommand(CLI::App& root, Invocation& inv);
void AddLsCommands(CLI::App& root, Invocation& inv);  // ls, get
void AddRmCommand(CLI::App& root, Invocation& inv);
void AddCpCommand(CLI::App& root, Invocation& inv);
void AddLayerCommand(CLI::App& root, Invocation& inv);
void AddImageCommand(CLI::App& root, Invocation& inv);
void AddStatusCommands(CLI::App& root, Invocation& inv);     // status, version
void AddLifecycleCommands(CLI::App& root, Invocation& inv);  // audit, pause, resume, suspend, ttl
void AddDesktopCommands(CLI::App& root, Invocation& inv);    // screenshot, input
void AddSnapshotCommands(CLI::App& root, Invocation& inv);   // snapshot, fork, grade
void AddJobCommand(CLI::App& root, Invocation& inv);         // job ls|show|heartbeat|suspend|resume|rm
// `warren node ls --json`: a Prometheus-style per-node summary,
// {"metrics": [{"name", "labels", "value"}], "nodes": [records]}: metric
// names in Prometheus conventions (warren_node_sandboxes,
// warren_node_cpu_free_millis, warren_node_memory_free_bytes, per class
// warren_node_qos_*{qos=...}; base units: bytes, seconds), each labelled
// node=<id>; "nodes" keeps every field of the records.
nlohmann::json NodesSummaryJson(const std::vector<v1::ClusterNode>& nodes);

void AddNodeCommands(CLI::App& root, Invocation& inv);     // node ls|drain|undrain (node.cc)
void AddProjectCommands(CLI::App& root, Invocation& inv);  // project create|ls|get|rm (project.cc)
void AddLogsCommand(CLI::App& root, Invocation& inv);      // logs (stream.cc)
// `warren exec -t`: the streaming, PTY variant of exec (stream.cc).
int RunExecTty(Invocation& inv);
void AddNetworkCommand(CLI::App& root, Invocation& inv);  // network ID --allow/--deny, expose ID PORT (network.cc)
void AddEvalCommand(CLI::App& root, Invocation& inv);     // eval: execs python -m warren.eval
void AddE2bCommand(CLI::App& root, Invocation& inv);      // e2b template ls|set|rm|resolve (e2b.cc)

// The whole command tree. `inv` must outlive the returned app.
std::unique_ptr<CLI::App> MakeApp(Invocation& inv);

// Parses argv[0..argc) into `inv` through `app` (from MakeApp(inv)). Returns
// 0, or the exit code of a CLI11 ParseError after printing it (help: 0 is
// returned as -1 so callers know to stop; usage errors: kExitUsage).
int ParseArgs(CLI::App& app, Invocation& inv, int argc, const char* const* argv);

// Parses argv and runs the chosen verb; returns the process exit code.
int RunCli(int argc, const char* const* argv);

// ------------------------------------------------------------ pure helpers

// "K=V" split at the first '='; K must be non-empty. V may be empty.
StatusOr<std::pair<std::string, std::string>> ParseKeyValue(const std::string& kv, const std::string& flag);

StatusOr<v1::CreateSandboxRequest> BuildCreateRequest(const CreateArgs& a);
// grade: the grader command is inv.exec_tail (words after "--").
StatusOr<v1::GradeRequest> BuildGradeRequest(const RlArgs& a, const std::vector<std::string>& cmd);
// Does not read stdin or --stdin-file (RunExec does).
StatusOr<v1::ExecRequest> BuildExecRequest(const ExecArgs& a);
StatusOr<v1::ListSandboxesRequest> BuildListRequest(const LsArgs& a);

// One side of `warren cp`: "ID:/path" is remote, anything else is a host path
// ("-" is stdin/stdout). A host path containing ':' before any '/' must be
// written with a "./" prefix.
struct CpEndpoint {
  bool remote = false;
  std::string sandbox_id;  // remote only
  std::string path;
};
CpEndpoint ParseCpEndpoint(const std::string& arg);
// Exactly one side must be remote, and the remote path must be non-empty.
StatusOr<std::pair<CpEndpoint, CpEndpoint>> ParseCpArgs(const std::string& src, const std::string& dst);

// Prints "error: <message>" plus a --help hint on stderr; returns kExitUsage.
int UsageError(const Status& status);

}  // namespace warren::cli
