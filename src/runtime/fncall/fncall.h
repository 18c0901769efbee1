// The `fncall` backend (DESIGN.md §3): stateless function calls on a
// warm pool of pre-isolated workers.
//
// A worker is a jailed process tree: user (root inside = one unprivileged
// host uid per worker), mnt, pid, net (loopback only), ipc and uts
// namespaces; a cgroup <daemon cgroup>/<cgroup_name>/w<N> with cpu, memory and
// pids limits; a read-only root (the layer mount itself, or a read-only
// overlay of several layers: no upper); private /dev, /proc and a scratch
// tmpfs; no_new_privs. Its PID 1 is the python zygote (zygote.py), which
// holds the standard library pre-imported, then hands control to its
// per-call loop in C (zygote_helper.c: a freestanding shared object warrend
// embeds and passes as a memfd) and never runs python bytecode again. Per
// call the loop clones a call process D into a fresh mount, pid and ipc
// namespace AHEAD of the call (right after the previous D ended), passes
// D's pidfd to warrend over the worker channel (SOCK_SEQPACKET, SCM_RIGHTS)
// and reports D's wait status when it ends. D mounts a fresh tmpfs /tmp
// (cwd and scratch), /dev/shm and /proc, drops every capability, sets
// no_new_privs, installs the seccomp profile, and only then receives the
// call from warrend together with the call's pipes (warrend keeps the other
// ends): python runs in D itself (a fork of the pristine interpreter),
// bash and compiled programs are spawned by it. warrend feeds stdin,
// collects stdout/stderr (output cap), kills D at the time-outs (its pid
// namespace dies with it) and builds the result. Nothing of one call
// (files, env, processes, imported modules, monkeypatches) is visible to
// the next: each call is a fork of the pristine zygote, and its namespaces
// die with it. A worker whose protocol breaks (crash, garbage, deadline) is
// destroyed, never reused.
//
// Cost (bench/RESULTS.md): per call the floor is the fork of the ~20 MB
// zygote (page-table copy) plus the copy-on-write faults of the python code
// the call runs; everything else on the call's path is kept off python
// (the zygote's loop) or out of the call process (I/O in warrend).
//
// The layer stack must contain /usr/bin/python3 (the zygote is python for
// every language); the other languages need their tools in the layers, at
// the paths Debian's packages install them (zygote.py's lang_plan): C/C++
// gcc/g++ (toolset/gcc), Rust rustc (toolset/rust, over toolset/gcc: it
// links with gcc), Go /usr/lib/go-*/bin/go (toolset/go), Java
// /usr/lib/jvm/*/bin/javac (toolset/jdk), nodejs /usr/bin/node
// (toolset/node); else the call returns a SandboxError naming the missing
// tool, the language and the layer.
//
// Thread-safety: FnCallPool is thread-safe; Call may run concurrently from
// any number of threads (at most max_workers run at once, others wait).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "runtime/backend.h"

namespace warren::runtime {

// The languages fncall runs (FnCallRequest::language), and those of them
// with a compile stage (FnCallResult::compile; compile_timeout applies).
inline constexpr std::string_view kFnCallLanguages[] = {"python", "bash", "cpp", "c", "java", "go", "rust", "nodejs"};
inline constexpr std::string_view kFnCallCompiled[] = {"cpp", "c", "java", "go", "rust"};

// A language name as callers spell it -> fncall's (kFnCallLanguages):
// "python3" -> python, "c++" -> cpp, "javascript" and "js" -> nodejs;
// anything else unchanged.
inline std::string CanonicalFnCallLanguage(std::string l) {
  if (l == "python3") return "python";
  if (l == "c++") return "cpp";
  if (l == "javascript" || l == "js") return "nodejs";
  return l;
}

struct FnCallRequest {
  std::string language = "python";  // one of kFnCallLanguages
  std::string code;
  std::string stdin_data;
  std::map<std::string, std::string> files;          // path (relative to /tmp or under /tmp) -> bytes
  std::vector<std::string> fetch_files;              // read back after the run
  std::map<std::string, std::string> env;            // over the default env
  std::chrono::milliseconds run_timeout{10000};      // 0 = none
  std::chrono::milliseconds compile_timeout{10000};  // kFnCallCompiled only
  uint32_t memory_mb = 512;                          // 0 = pool default
  uint64_t output_cap_bytes = 16u << 20;             // per stream
};

struct FnCallResult {
  // Set for compiled languages. run is unset when compilation failed.
  std::optional<ExecOutcome> compile;
  std::optional<ExecOutcome> run;
  std::map<std::string, std::string> files;  // fetched
  std::vector<std::string> missing_files;
  // Non-empty when the platform (not the code) failed: bad request for the
  // image, worker lost. The call's outcome fields are then partial.
  std::string sandbox_error;
  std::chrono::nanoseconds duration{0};
};

struct FnCallOptions {
  std::string cgroup_name = "warren-fncall";
  // An empty directory; every worker mounts its root over it in its own
  // mount namespace (the host never sees those mounts).
  std::string mount_point;
  uint32_t max_workers = 16;                      // per node, over all pools
  std::chrono::milliseconds idle_timeout{30000};  // idle workers beyond that are destroyed
  uint32_t cpu_millis = 1000;                     // per worker
  uint32_t pids = 256;                            // per worker (zygote included)
  uint32_t scratch_mb = 256;                      // per-call /tmp tmpfs (charged to memory)
  uint32_t default_memory_mb = 512;
  uint32_t uid_base = 2100000000;  // worker k: root inside = host uid uid_base + k
  uint32_t uid_count = 65536;
  std::string seccomp_profile;  // JSON; empty = the built-in default profile
  // An lxcfs mount (jail/lxcfs.h): calls see their worker's limits in
  // /proc/{meminfo,cpuinfo,stat,...} and sysconf's cpu count. "" = the host's.
  std::string lxcfs_dir;
};

struct FnCallStats {
  uint32_t workers = 0, idle = 0, busy = 0, pools = 0;
  uint64_t calls = 0, spawned = 0, discarded = 0;
};

class FnCallPool {
 public:
  virtual ~FnCallPool() = default;
  // Runs one call on a worker of the pool for `lower_dirs` (mounted layers,
  // bottom first; the pool is created on first use). Errors: InvalidArgument
  // (bad request), ResourceExhausted (no worker within the wait budget),
  // Internal (worker spawn failed). The code's outcome is never an error.
  virtual StatusOr<FnCallResult> Call(const std::vector<std::string>& lower_dirs, const FnCallRequest& request) = 0;
  // Destroys idle workers unused for idle_timeout. Called periodically by an
  // internal thread; public for tests.
  virtual void Shrink(std::chrono::milliseconds idle_timeout) = 0;
  virtual FnCallStats Stats() const = 0;
};

StatusOr<std::unique_ptr<FnCallPool>> NewFnCallPool(const FnCallOptions& options);

// The fncall backend's CommandRunner (backend.h; why it is not a Backend is
// explained there): every Exec is one bash call on `pool`, so it starts from
// a pristine worker and leaves nothing behind. ExecSpec mapping: argv is run
// as `exec argv...` (shell-quoted), shell as the bash script; env over the
// call's default env (PATH, HOME=/tmp, LANG, TMPDIR); cwd must be empty or
// under /tmp (the scratch dir, default /tmp); user must be empty or "root";
// stdin_data, timeout (0 = none), output_cap_bytes as given; kill_grace is
// not used (a timed-out call is SIGKILLed at once). Errors: InvalidArgument
// for a spec it cannot honour, Internal when the platform failed the call
// (FnCallResult::sandbox_error), and the pool's errors.
class FnCallRunner : public CommandRunner {
 public:
  // `pool` must outlive the runner; lower_dirs as for FnCallPool::Call.
  FnCallRunner(FnCallPool* pool, std::vector<std::string> lower_dirs, uint32_t memory_mb)
      : pool_(pool), lower_dirs_(std::move(lower_dirs)), memory_mb_(memory_mb) {}
  StatusOr<ExecOutcome> Exec(const ExecSpec& spec) override;

 private:
  FnCallPool* pool_;
  std::vector<std::string> lower_dirs_;
  uint32_t memory_mb_;
};

// The zygote source (zygote.py), embedded at build time.
const std::string& ZygoteSource();
// The zygote helper (zygote_helper.c built as a freestanding shared object:
// the zygote's per-call loop), embedded at build time.
const std::string& ZygoteHelperSo();

}  // namespace warren::runtime
