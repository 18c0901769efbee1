// The Backend interface (DESIGN.md §3): how a sandbox is isolated. One
// implementation per folder under src/runtime/ (container/ now; microvm/,
// vm/ later). fncall/ (stateless calls) implements only CommandRunner, the
// exec contract (see below why); every CommandRunner passes the applicable
// cases of tests/conformance/.
//
// Threading: a Backend and the Sandboxes it returns are thread-safe. Exec and
// the file operations of one sandbox may run concurrently with each other;
// Destroy may run concurrently with them and makes them return promptly
// (Exec returns an outcome with signal=SIGKILL, file calls return an error).
//
// Errors: absl::Status with errno preserved (common/status.h). The outcome of
// a command (exit code, signal, OOM, timeout) is an ExecOutcome, never an error.
//
// What every Sandbox does (exec, files, destroy, record) is on Sandbox. What
// only some backends can do is a CAPABILITY: an interface below (Pausable,
// Suspendable, ProcessStarter, ChangeExporter) that a backend's Sandbox
// implements, the whole set reported by Backend::capabilities(). Callers ask
// with As<C>(sandbox) (nullptr when absent) or Require<C>(sandbox)
// (Unimplemented naming the backend and the capability). Each interface
// states how a microVM backend (a guest kernel behind QEMU/Firecracker, a
// guest agent on a vsock channel, a block device as writable layer) maps it.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace warren::image {
class CopyBudget;  // image/layer_tree.h
}  // namespace warren::image

namespace warren::runtime {

// Limits of one sandbox. Units in the names; 0 is never passed here (the node
// fills defaults before calling the backend).
struct Resources {
  uint32_t cpu_millis = 1000;  // 1000 = one core (cfs quota), also cpu weight
  uint32_t memory_mb = 1024;   // memory cgroup limit (RSS + page cache + tmpfs)
  uint32_t disk_mb = 1024;     // cap of the writable upper layer
  uint32_t pids = 1024;        // pids cgroup limit
  uint32_t open_files = 1024;  // RLIMIT_NOFILE
  uint32_t tmpfs_mb = 256;     // cap of /dev/shm (tmpfs)
};

// The sandbox's network (see net/policy.h for the entry syntax and
// semantics). Not enabled: loopback only, nothing outside reachable.
struct NetworkSpec {
  bool enabled = false;
  std::vector<std::string> allow, deny;
};

// A sandbox's CPU/memory class. kLatency: today's behaviour (a cpu weight
// by its cpu_millis). kBestEffort: every process runs SCHED_IDLE (runs
// only on a CPU nothing else wants) with the lowest cgroup cpu weight, and
// its memory is reclaimed first under host memory pressure (see
// jail::CgroupLimits::best_effort). Unused capacity is its to take: the
// class is for sandboxes that ask for much and use little.
enum class Qos { kLatency, kBestEffort };
inline const char* QosName(Qos q) { return q == Qos::kBestEffort ? "best-effort" : "latency"; }
// "latency" / "best-effort"; false for anything else.
inline bool ParseQos(std::string_view s, Qos* q) {
  if (s == "latency")
    *q = Qos::kLatency;
  else if (s == "best-effort")
    *q = Qos::kBestEffort;
  else
    return false;
  return true;
}

struct SandboxSpec {
  std::string id;                       // [a-z0-9-]{1,63}, unique on the node
  std::string dir;                      // private runtime dir, created by the caller, empty
  std::vector<std::string> lower_dirs;  // mounted read-only layers, BOTTOM FIRST
  // The same layers as EROFS image files, BOTTOM FIRST (backends that attach
  // them as disks: microvm); empty where the node has none.
  std::vector<std::string> layer_files;
  Resources resources;
  Qos qos = Qos::kLatency;
  std::map<std::string, std::string> env;  // default env of every exec
  std::string workdir = "/";
  std::string user = "root";
  std::string hostname;  // default: id (truncated to 63)
  NetworkSpec network;
};

struct ExecSpec {
  std::vector<std::string> argv;           // argv[0] searched in PATH; or:
  std::optional<std::string> shell;        // run as /bin/sh -c <shell>
  std::map<std::string, std::string> env;  // merged over the sandbox env
  std::string cwd;                         // empty: the sandbox workdir
  std::string user;                        // empty: the sandbox user
  std::string stdin_data;                  // fed then EOF; empty = immediate EOF
  std::chrono::milliseconds timeout{0};    // 0 = none
  std::chrono::milliseconds kill_grace{500};
  uint64_t output_cap_bytes = 16u << 20;  // kept per stream
  // stderr is the stdout pipe (fd 2 a dup of fd 1): one stream in write
  // order, stderr_data empty. Backends without it refuse it (InvalidArgument).
  bool merge_stderr = false;
  // Optional; polled (at least once a second) while the command runs: true
  // kills the command's whole tree and the exec ends with Cancelled (the
  // caller went away: a unary exec's client disconnected).
  std::function<bool()> cancelled;
};

struct ExecOutcome {
  int exit_code = 0;        // exit status, or 128+signal
  int signal = 0;           // signal that ended the foreground process
  bool oom_killed = false;  // the sandbox's memory cgroup OOM-killed during the exec
  bool timed_out = false;
  std::string stdout_data, stderr_data;  // bytes, at most output_cap_bytes each
  bool stdout_truncated = false, stderr_truncated = false;
  uint64_t stdout_total = 0, stderr_total = 0;
  std::chrono::nanoseconds duration{0};
};

enum class FileType { kRegular, kDirectory, kSymlink, kOther };

struct FileInfo {
  std::string name;  // last component, byte-exact
  std::string path;  // as asked, joined with name for listings
  FileType type = FileType::kOther;
  uint64_t size = 0;
  uint32_t mode = 0;          // permission bits (07777)
  uint32_t uid = 0, gid = 0;  // as seen inside the sandbox
  int64_t mtime_ns = 0;
  std::string symlink_target;
};

// Streamed write; the data becomes visible at `path` only on Commit() (written
// to a temporary file in the same directory, then renamed). Destroying an
// uncommitted writer removes the temporary file.
class FileWriter {
 public:
  virtual ~FileWriter() = default;
  virtual Status Write(std::string_view data) = 0;
  virtual StatusOr<uint64_t> Commit() = 0;  // returns bytes written
};

class FileReader {
 public:
  virtual ~FileReader() = default;
  // Reads up to `max` bytes; an empty string means end of file.
  virtual StatusOr<std::string> Read(size_t max) = 0;
};

// File operations on paths inside the sandbox. Every path is resolved inside
// the sandbox root (openat2 RESOLVE_IN_ROOT or equivalent): ".." stops at "/",
// symlinks resolve as inside the sandbox, never onto the host. Errors name the
// path and the errno (NotFound, PermissionDenied, ResourceExhausted for ENOSPC).
// New files are owned by the sandbox's root (uid 0 inside).
class SandboxFiles {
 public:
  virtual ~SandboxFiles() = default;
  virtual StatusOr<std::unique_ptr<FileWriter>> OpenWrite(const std::string& path, uint32_t mode,
                                                          bool make_parents) = 0;
  virtual StatusOr<std::unique_ptr<FileReader>> OpenRead(const std::string& path, uint64_t offset, uint64_t length) = 0;
  virtual StatusOr<FileInfo> Stat(const std::string& path) = 0;
  virtual StatusOr<std::vector<FileInfo>> List(const std::string& path) = 0;
  virtual Status Mkdir(const std::string& path, uint32_t mode, bool parents) = 0;
  virtual Status Remove(const std::string& path, bool recursive) = 0;
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
};

// Options of ProcessStarter::Start.
struct StartOptions {
  bool pty = false;  // a pseudo-terminal from the sandbox's devpts as stdio + controlling tty
  uint16_t rows = 24, cols = 80;
  bool control_fd = false;  // a pipe on fd 3 (read end: Process::TakeControl)
};

// A command started by ProcessStarter::Start, running in its own exec cgroup (the
// whole tree: setsid'ed and double-forked descendants included) and in a new
// session (setsid) whose process group the foreground process leads.
// The caller pumps its fds. Destroying the object closes the fds it still
// owns and kills nothing: processes left in the tree keep running (like
// Exec's background processes) until they exit or the sandbox is destroyed.
// The Process must not outlive its Sandbox object. Not thread-safe except
// Signal and Resize, which may be called from any thread.
class Process {
 public:
  virtual ~Process() = default;
  virtual pid_t pid() const = 0;  // host pid of the foreground process
  virtual int pidfd() const = 0;  // borrowed; readable (POLLIN) once it exited
  // The caller takes the pipe ends (each once; later calls return an invalid
  // fd). With a PTY stdin and stdout are both the terminal's master (dups),
  // stderr is invalid. Control: fd 3's read end, invalid unless asked.
  virtual UniqueFd TakeStdin() = 0;
  virtual UniqueFd TakeStdout() = 0;
  virtual UniqueFd TakeStderr() = 0;
  virtual UniqueFd TakeControl() = 0;
  // Reaps the foreground process if it exited: true and exit_code/signal/
  // oom_killed of *out set; false while it runs.
  virtual StatusOr<bool> TryWait(ExecOutcome* out) = 0;
  // whole_tree: every process of the exec cgroup; else the foreground's
  // process group (kill(-pid)). No error when they are already gone.
  virtual Status Signal(int sig, bool whole_tree) = 0;
  // True when no process of the tree is left.
  virtual bool TreeEmpty() = 0;
  // Window size of the PTY (TIOCSWINSZ, the foreground group gets SIGWINCH).
  // FailedPrecondition without a PTY.
  virtual Status Resize(uint16_t rows, uint16_t cols) = 0;
};

// "Run this command with these limits, give me its ExecOutcome": the part
// every backend shares, and the one the conformance suite
// (tests/conformance/) checks on each of them. A container/microvm Sandbox is
// a CommandRunner whose execs share the sandbox's state; the fncall backend
// offers one too (runtime/fncall/fncall.h, FnCallRunner) whose every Exec
// runs in a fresh, pristine worker call.
//
// Why fncall is not a Backend: a Backend makes STATEFUL sandboxes (Create,
// Adopt after a daemon restart, Cleanup, files that persist between execs,
// pause/snapshot). An fncall has no state to create, persist, adopt, browse
// or snapshot; its worker pool is an internal cache. Wrapping it in Sandbox
// would give a Sandbox whose files vanish between execs and whose Record()
// means nothing, so only the exec contract is shared.
class CommandRunner {
 public:
  virtual ~CommandRunner() = default;
  // Runs a command to completion of its foreground process (see Sandbox::Exec
  // for the shared semantics). The command's outcome is never an error;
  // errors mean the platform failed.
  virtual StatusOr<ExecOutcome> Exec(const ExecSpec& spec) = 0;
};

class Sandbox : public CommandRunner {
 public:
  ~Sandbox() override = default;  // does NOT destroy: the sandbox outlives the object
  virtual const std::string& id() const = 0;
  // Runs a command to completion of its foreground process (not pipe EOF).
  // Processes it leaves in the background keep running; their output after
  // the foreground exits is discarded. On timeout the exec's whole process tree
  // (including setsid'ed and double-forked descendants) gets SIGTERM, then
  // SIGKILL after kill_grace.
  StatusOr<ExecOutcome> Exec(const ExecSpec& spec) override = 0;
  virtual SandboxFiles& files() = 0;
  // Kills every process, unmounts, removes cgroups and the runtime dir.
  // Idempotent; safe to call concurrently with Exec.
  virtual Status Destroy() = 0;
  // What Backend::Adopt needs after a daemon restart beyond the spec: the
  // backend's own serialized message (opaque bytes to the node, which
  // persists them in its record and hands them back to Adopt/Cleanup).
  virtual std::string Record() const = 0;
  virtual pid_t init_pid() const = 0;
  // Backend::name() of the backend that made it (errors name it).
  virtual std::string_view backend_name() const = 0;
};

// ---- capabilities

enum class Capability : uint32_t {
  kPause = 1u << 0,          // Pausable
  kSuspend = 1u << 1,        // Suspendable
  kProcesses = 1u << 2,      // ProcessStarter
  kExportChanges = 1u << 3,  // ChangeExporter (snapshot, fork, grade)
  kNetwork = 1u << 4,        // NetworkConfigurable
};

// "pause", "suspend", "processes", "export_changes".
constexpr std::string_view CapabilityName(Capability c) {
  switch (c) {
    case Capability::kPause: return "pause";
    case Capability::kSuspend: return "suspend";
    case Capability::kProcesses: return "processes";
    case Capability::kExportChanges: return "export_changes";
    case Capability::kNetwork: return "network";
  }
  return "unknown";
}

// What a backend's sandboxes can do beyond Sandbox. A Sandbox implements the
// interface of a capability iff its Backend reports it.
class Capabilities {
 public:
  constexpr Capabilities() = default;
  constexpr Capabilities(std::initializer_list<Capability> cs) {
    for (Capability c : cs) bits_ |= static_cast<uint32_t>(c);
  }
  constexpr bool has(Capability c) const { return (bits_ & static_cast<uint32_t>(c)) != 0; }
  constexpr bool operator==(const Capabilities&) const = default;
  // Names joined by ",", in enum order ("" when none).
  std::string ToString() const {
    std::string out;
    for (Capability c : {Capability::kPause, Capability::kSuspend, Capability::kProcesses, Capability::kExportChanges,
                         Capability::kNetwork}) {
      if (!has(c)) continue;
      if (!out.empty()) out += ",";
      out += CapabilityName(c);
    }
    return out;
  }

 private:
  uint32_t bits_ = 0;
};

// Freezes and thaws every process of the sandbox. Both idempotent. While
// paused, Exec would block: the node resumes first.
// container: the cgroup freezer. microVM: QMP `stop`/`cont` (the vCPUs stop;
// the guest's clock and processes do not run).
class Pausable {
 public:
  static constexpr Capability kCapability = Capability::kPause;
  virtual ~Pausable() = default;
  virtual Status Pause() = 0;
  virtual Status Resume() = 0;
};

// A paused sandbox gives its memory back to the host, and takes it again.
// container: the memory cgroup (reclaim to swap/zram, then prefetch by
// process_madvise). microVM: the balloon (inflate to take guest pages,
// deflate before resume) or a migrate-to-file of the stopped VM (QMP
// `migrate` to a file; EndSuspend restores from it), memory usage = the
// VMM's RSS (+ its swap).
class Suspendable {
 public:
  static constexpr Capability kCapability = Capability::kSuspend;
  virtual ~Suspendable() = default;
  // Bytes of memory charged to the sandbox (container: its memory cgroup:
  // RSS, page cache, tmpfs upper) and bytes of it in swap.
  virtual StatusOr<uint64_t> MemoryUsage() const = 0;
  virtual uint64_t SwapUsage() const = 0;
  // Pushes the memory of a PAUSED sandbox out to swap/zram (anonymous and
  // tmpfs pages) or drops it (clean page cache): see jail::Cgroup::
  // ReclaimMemory. FailedPrecondition when not paused. Without swap on the
  // host only clean page cache goes.
  virtual Status ReclaimMemory() = 0;
  // Ends a suspend, before Resume (the sandbox still paused). If `prefetch`,
  // brings the reclaimed working set back before the sandbox runs again:
  // MADV_WILLNEED (process_madvise) over every mapping of every process and
  // a read of the tmpfs upper's files (up to the bytes in swap); then the
  // sandbox runs without swap again (v2). Best effort per process and file
  // (one that vanished meanwhile is skipped); returns the bytes prefetched.
  virtual StatusOr<uint64_t> EndSuspend(bool prefetch) = 0;
};

// Long-running processes whose stdio the caller pumps (background processes,
// streaming exec, PTYs). container: a spawn into the sandbox's namespaces and
// an exec cgroup. microVM: the guest agent starts the process and relays its
// stdio, pty and signals over the vsock channel (one stream per fd).
class ProcessStarter {
 public:
  static constexpr Capability kCapability = Capability::kProcesses;
  virtual ~ProcessStarter() = default;
  // Starts `spec` (argv/shell, env, cwd, user; stdin_data, timeout,
  // output_cap and kill_grace are NOT used: the caller drives the fds and
  // timeouts). Errors as Exec's (bad cwd/user: the error, not an outcome).
  virtual StatusOr<std::unique_ptr<Process>> Start(const ExecSpec& spec, const StartOptions& options) = 0;
};

struct ExportOptions {
  // fnmatch(3) patterns WITHOUT FNM_PATHNAME ('*' also matches '/'), matched
  // against the absolute path inside the sandbox ("/w/answers.txt"); a match
  // drops the entry and its whole subtree. A pattern ending in "/" is taken
  // without it.
  std::vector<std::string> exclude;
  // Bounds what is written (ResourceExhausted naming the sandbox); nullptr =
  // unbounded.
  image::CopyBudget* budget = nullptr;
};

// The sandbox's changes to its layers, as a diff in warren's LAYER FORMAT
// (image/layer_tree.h: overlayfs diff convention, whiteouts as 0:0 char
// devices, opaque dirs by trusted.overlay.opaque, ids as seen inside): what
// snapshot, fork and grade build layers from, so the node never touches a
// backend's writable layer. The caller freezes the sandbox (Pausable) for a
// consistent view.
// container: a copy of its overlay upper (ids shifted back from the host
// range). microVM: the guest agent walks its upper (the overlay on the
// writable block device) and streams the entries as tar (PAX, with
// xattrs) over its channel; the host extracts them into `dst_dir` in the same
// form (tar whiteouts ".wh.<name>" become 0:0 char devices).
class ChangeExporter {
 public:
  static constexpr Capability kCapability = Capability::kExportChanges;
  virtual ~ChangeExporter() = default;
  // Writes the changes into the new directory `dst_dir` (it must not exist;
  // its parent must). On error `dst_dir` is removed. FailedPrecondition when a
  // path is longer than a layer holds.
  virtual Status ExportChanges(const std::string& dst_dir, const ExportOptions& options) = 0;

  // A read-only view of the same changes, walked in place (nothing copied):
  // grading lists every change but copies only what lies under the solution
  // paths, so a huge or deep tree the agent left elsewhere costs a walk, not
  // a copy. `dir` is the changes in the layer format, except that ids in
  // [id_base, id_base + id_range) are id - id_base inside (others 65534;
  // id_range 0: ids as they are) and trusted.overlay.* xattrs other than the
  // opaque/whiteout markers are to be ignored (the tree code does both:
  // image::DiffCopyOptions). The caller freezes the sandbox while it walks.
  // container: its overlay upper (host ids: id_base = the host uid of its
  // root). microVM: ExportChanges into a private dir, returned with id_base 0.
  struct ChangeView {
    UniqueFd dir;
    uint32_t id_base = 0;
    uint32_t id_range = 0;
  };
  virtual StatusOr<ChangeView> OpenChanges() = 0;
};

// A network outside the sandbox, its egress policy replaced at any time.
// A replaced policy applies to the next packet (connections it no longer
// allows are refused on their next packet). FailedPrecondition for a
// sandbox created without a network. container: a veth pair into the
// node's SandboxNetwork (net/sandbox_network.h), reported only when the
// node has one (--sandbox-net). microVM: a tap device into the same.
//
// Exposed ports: `port` of the sandbox's loopback served on the node behind a
// token (net/expose.h), whether or not the sandbox has a link (microVM: of
// its eth0 address, dialed over its tap: FailedPrecondition without a
// link, microvm/sandbox.h); closed with
// the sandbox; kept in its record (a restarted node listens again, on the
// same node port when it is free, with the same token).
struct ExposedPort {
  uint16_t port = 0;    // in the sandbox
  std::string address;  // HOST:PORT on the node
  std::string token;    // X-Warren-Token header or warren_token query parameter
};
// What the sandbox's link carried and refused (net::NetworkCounters).
struct NetworkTraffic {
  uint64_t egress_bytes = 0, ingress_bytes = 0, connections = 0, denied = 0;
};
class NetworkConfigurable {
 public:
  static constexpr Capability kCapability = Capability::kNetwork;
  virtual ~NetworkConfigurable() = default;
  virtual Status SetNetwork(const NetworkSpec& network) = 0;
  // The policy in force, entries canonical.
  virtual NetworkSpec Network() const = 0;
  // The same port again: the same exposure. InvalidArgument for port 0,
  // ResourceExhausted past the backend's bound.
  virtual StatusOr<ExposedPort> Expose(uint16_t port) = 0;
  // NotFound when `port` is not exposed. Its open connections end.
  virtual Status Unexpose(uint16_t port) = 0;
  virtual std::vector<ExposedPort> Exposed() const = 0;
  // FailedPrecondition for a sandbox without a link.
  virtual StatusOr<NetworkTraffic> Traffic() const = 0;
};

// The capability C of `sb`, or nullptr.
template <class C>
C* As(Sandbox& sb) {
  return dynamic_cast<C*>(&sb);
}

// Unimplemented: "sandbox <id>: <capability> is not supported by the
// <backend> backend".
inline Status NotSupported(const Sandbox& sb, Capability c) {
  return absl::UnimplementedError("sandbox " + sb.id() + ": " + std::string(CapabilityName(c)) +
                                  " is not supported by the " + std::string(sb.backend_name()) + " backend");
}

// The capability C of `sb`, or Unimplemented naming the backend and C.
template <class C>
StatusOr<C*> Require(Sandbox& sb) {
  if (C* c = As<C>(sb)) return c;
  return NotSupported(sb, C::kCapability);
}

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "container", ...
  // The capabilities its sandboxes implement (see Capability).
  virtual Capabilities capabilities() const = 0;
  // Creates and starts a sandbox. On error nothing is left behind (no
  // process, mount, cgroup, file under spec.dir).
  virtual StatusOr<std::unique_ptr<Sandbox>> Create(const SandboxSpec& spec) = 0;
  // Re-attaches to a sandbox that a previous daemon created: `spec` as it
  // was created (lower_dirs may be empty), `backend_record` its Record().
  // NotFound if it is gone (then call Cleanup); InvalidArgument for a
  // record this backend cannot read.
  virtual StatusOr<std::unique_ptr<Sandbox>> Adopt(const SandboxSpec& spec, const std::string& backend_record) = 0;
  // Removes whatever a half-created or dead sandbox left (processes, mounts,
  // cgroups, dir). `spec` holds at least id and dir (the node persists both
  // before Create); `backend_record` is its Record(), or empty when the
  // sandbox never got that far. Idempotent.
  virtual Status Cleanup(const SandboxSpec& spec, const std::string& backend_record) = 0;
};

}  // namespace warren::runtime
