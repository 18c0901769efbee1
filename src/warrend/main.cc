// warrend: the node daemon (DESIGN.md §2). Serves the warren.v1 API on a unix
// socket (and optionally TCP with a bearer token), owns the sandbox table,
// and leaves sandboxes running when it stops: the next warrend on the same
// state dir re-adopts them.
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>

#include "api/fncall_service.h"  // fncall (issue 5)
#include "api/services.h"
#include "http/run_code_server.h"  // fncall (issue 5)
#include "common/status.h"
#include "common/unique_fd.h"
#include "node/image_layer_provider.h"
#include "common/log.h"
#include "node/run_dir.h"
#include "node/sandbox_manager.h"
#include "node/suspend_swap.h"
#include "runtime/container/container_backend.h"

namespace warren {
namespace {

int g_signal_pipe[2] = {-1, -1};

void OnShutdownSignal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  ssize_t ignored = ::write(g_signal_pipe[1], &b, 1);
  (void)ignored;
  errno = saved;
}

struct Flags {
  std::string state_dir = "/var/lib/warren";
  std::string run_dir;  // "" = automatic (node/run_dir.h)
  std::string socket = "/run/warren/warrend.sock";
  std::string listen;
  std::string token_file;
  std::string layer_store;
  std::string init_path;
  std::string node_id = "n0";
  std::string log_level = "info";
  std::string log_format = "text";
  uint32_t max_sandboxes = 0;
  uint32_t max_creates_in_flight = 0;
  uint32_t max_create_queue = 0;
  int32_t warm_shells = -1;  // -1 = 2 x cpus
  uint32_t recycled_cgroups = 64;
  int64_t mount_grace_ms = 60000;
  // fncall (issue 5)
  std::string http_listen;
  uint32_t fncall_max_workers = 0;
  std::vector<std::string> fncall_layers = {"base/debian-12"};
  // /run_code (src/http/run_code_server.h)
  std::vector<std::string> run_code_layers;  // empty = fncall_layers
  std::vector<std::string> http_allowed_hosts;
  std::string http_token_file;                // "" = --token-file's token, if any
  uint32_t run_code_max_memory_mb = 0;        // 0 = min(4096, RAM/2)
  double run_code_max_timeout_s = 300;
  // suspend (issue 4)
  std::string suspend_swap = "auto";
  uint64_t zram_size_mb = 0;
  bool suspend_prefetch = true;
  uint64_t max_staging_mb = 0;
};

Status MkdirAll(const std::string& path, mode_t mode) {
  std::string cur;
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += "/" + part;
    if (::mkdir(cur.c_str(), mode) != 0 && errno != EEXIST) {
      return ErrnoToStatus(errno, "mkdir(" + cur + ")");
    }
  }
  return absl::OkStatus();
}

std::string Dirname(const std::string& p) {
  size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

StatusOr<std::string> FindInit(const std::string& flag) {
  if (!flag.empty()) {
    char real[PATH_MAX];
    if (::access(flag.c_str(), X_OK) != 0 || ::realpath(flag.c_str(), real) == nullptr) {
      return ErrnoToStatus(errno, "--init-path " + flag);
    }
    return std::string(real);
  }
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n < 0) return ErrnoToStatus(errno, "readlink(/proc/self/exe)");
  std::string dir = Dirname(std::string(buf, static_cast<size_t>(n)));
  std::vector<std::string> candidates = {dir + "/warren-init", dir + "/../init/warren-init",
                                         "/usr/lib/warren/warren-init"};
  for (const std::string& c : candidates) {
    if (::access(c.c_str(), X_OK) == 0) {
      char real[PATH_MAX];
      if (::realpath(c.c_str(), real) != nullptr) return std::string(real);
      return c;
    }
  }
  return absl::NotFoundError("warren-init not found (looked at " + candidates[0] + ", " +
                             candidates[1] + ", " + candidates[2] + "); pass --init-path");
}

// Holds an exclusive lock on <state_dir>/warrend.lock for the daemon's life.
// A POSIX record lock (not flock): it belongs to this process only, so
// children forked by backends never keep it alive after the daemon dies.
StatusOr<UniqueFd> LockStateDir(const std::string& state_dir) {
  std::string path = state_dir + "/warrend.lock";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoToStatus(errno, "open(" + path + ")");
  struct flock lk {};
  lk.l_type = F_WRLCK;
  lk.l_whence = SEEK_SET;
  if (::fcntl(fd.get(), F_SETLK, &lk) != 0) {
    int err = errno;
    if (err == EAGAIN || err == EACCES) {
      struct flock who {};
      who.l_type = F_WRLCK;
      who.l_whence = SEEK_SET;
      std::string pid = "?";
      if (::fcntl(fd.get(), F_GETLK, &who) == 0 && who.l_type != F_UNLCK) {
        pid = std::to_string(who.l_pid);
      }
      return absl::FailedPreconditionError("another warrend (pid " + pid +
                                           ") is running on state dir " + state_dir);
    }
    return ErrnoToStatus(err, "fcntl(F_SETLK, " + path + ")");
  }
  std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), pid.data(), pid.size(), 0) < 0) {
    return ErrnoToStatus(errno, "write(" + path + ")");
  }
  return fd;
}

// Removes a socket file left by a daemon that died; refuses a live one.
Status PrepareSocket(const std::string& path) {
  RETURN_IF_ERROR(MkdirAll(Dirname(path), 0755));
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoToStatus(errno, "lstat(" + path + ")");
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError("--socket " + path + " exists and is not a socket");
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError("--socket " + path + " is too long for a unix socket");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  // A daemon killed a moment ago may still have children between fork and
  // exec (they die with it, PR_SET_PDEATHSIG) holding its listening socket:
  // give them up to 2 s before calling the socket served.
  for (int attempt = 0;; ++attempt) {
    UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) return ErrnoToStatus(errno, "socket(AF_UNIX)");
    if (::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) break;
    if (attempt >= 40) {
      return absl::FailedPreconditionError("--socket " + path +
                                           " is served by another live process");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, "unlink(" + path + ")");
  }
  warren::Log(spdlog::level::info, "removed stale socket", {{"socket", path}});
  return absl::OkStatus();
}

StatusOr<std::string> ReadToken(const std::string& path) {
  std::ifstream f(path);
  if (!f) return ErrnoToStatus(errno, "open(" + path + ")");
  std::string token;
  std::getline(f, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ' || token.back() == '\t')) {
    token.pop_back();
  }
  if (token.size() < 16) {
    return absl::InvalidArgumentError("--token-file " + path +
                                      ": the token must be at least 16 characters");
  }
  return token;
}

// Density (issue 3): the daemon holds fds per sandbox (init pidfd, upper
// dir) and per running exec/process; a 1024 soft limit (systemd's default)
// would stop it near 500 sandboxes long before memory does. Raises the soft
// RLIMIT_NOFILE to the hard limit; returns {soft before, soft after}.
std::pair<uint64_t, uint64_t> RaiseNofileLimit() {
  struct rlimit rl;
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return {0, 0};
  const uint64_t before = rl.rlim_cur;
  if (rl.rlim_cur != rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) return {before, before};
  }
  return {before, rl.rlim_cur};
}

// The daemon's heap stays bounded in steady state. glibc's defaults let it
// grow with the load's history, not its size: (1) the mmap threshold is
// dynamic, raised to the size of every large block freed (up to 32 MiB), so
// after the first big exec output (up to 2 x output_cap) every later one is
// carved from an arena, whose freed middle is never returned; (2) each of up
// to 8 x cores arenas (one per thread that ever contended) keeps its own free
// memory. So: a fixed threshold (blocks >= 1 MiB are mmapped and unmapped on
// free), at most 4 arenas, and every 10 s malloc_trim(0) hands the free
// pages inside the arenas back (MADV_DONTNEED; a few ms of CPU).
void BoundHeap() {
  (void)::mallopt(M_MMAP_THRESHOLD, 1 << 20);
  (void)::mallopt(M_ARENA_MAX, 4);
  std::thread([] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      (void)::malloc_trim(0);
    }
  }).detach();
}

int Run(const Flags& flags) {
  BoundHeap();
  if (auto [before, after] = RaiseNofileLimit(); before != after) {
    warren::Log(spdlog::level::info, "raised RLIMIT_NOFILE soft limit to the hard limit",
              {{"from", std::to_string(before)}, {"to", std::to_string(after)}});
  }
  auto fail = [](const Status& s) {
    warren::Log(spdlog::level::critical, "warrend cannot start", {{"error", s.ToString()}});
    return 1;
  };
  if (flags.state_dir.empty() || flags.state_dir[0] != '/') {
    return fail(absl::InvalidArgumentError("--state-dir must be an absolute path"));
  }
  if (!flags.listen.empty() && flags.token_file.empty()) {
    return fail(absl::InvalidArgumentError("--listen needs --token-file (TCP callers must "
                                           "present a bearer token)"));
  }
  std::string token;
  if (!flags.token_file.empty()) {
    StatusOr<std::string> t = ReadToken(flags.token_file);
    if (!t.ok()) return fail(t.status());
    token = *t;
  }
  if (Status s = MkdirAll(flags.state_dir, 0711); !s.ok()) return fail(s);
  // Not listable by other users (0711, also when it existed): they must not
  // find snapshot staging, layer mounts or records. Traversable, because a
  // fncall worker attaches its root at <state-dir>/fncall-root from inside
  // its user namespace (a non-root host uid). What holds sandbox contents
  // below it (mnt/, tmp/) is 0700.
  if (::chmod(flags.state_dir.c_str(), 0711) != 0) {
    return fail(ErrnoToStatus(errno, "chmod(" + flags.state_dir + ", 0711)"));
  }
  StatusOr<UniqueFd> lock = LockStateDir(flags.state_dir);
  if (!lock.ok()) return fail(lock.status());
  if (Status s = PrepareSocket(flags.socket); !s.ok()) return fail(s);
  StatusOr<std::string> init = FindInit(flags.init_path);
  if (!init.ok()) return fail(init.status());
  StatusOr<std::string> run_dir = node::ResolveRunDir(flags.state_dir, flags.run_dir, "/run/warren/runtime",
                                                             /*mount_tmpfs=*/true);
  if (!run_dir.ok()) return fail(run_dir.status());
  if (Status s = node::LinkRunDir(flags.state_dir, *run_dir); !s.ok()) return fail(s);
  // On every way out (after the manager, declared below, is gone): an unused
  // run dir and its links go, live sandboxes' records stay for the next daemon.
  struct RunDirGuard {
    const std::string &state, &run;
    ~RunDirGuard() { node::RemoveRunDirIfUnused(state, run); }
  } run_dir_guard{flags.state_dir, *run_dir};

  runtime::ContainerOptions copt;
  copt.init_path = *init;
  copt.warm_shells = flags.warm_shells >= 0
                         ? static_cast<uint32_t>(flags.warm_shells)
                         : 2 * static_cast<uint32_t>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  copt.recycled_cgroups = flags.recycled_cgroups;
  // Sandbox uid ranges are claimed host-wide, in the name of this state dir
  // (sandboxes outlive the daemon; a restart on the same dir re-takes them).
  copt.uid_lock_dir = "/run/warren/uid-slots";
  {
    char real[PATH_MAX];
    if (::realpath(flags.state_dir.c_str(), real) == nullptr)
      return fail(ErrnoToStatus(errno, "realpath(" + flags.state_dir + ")"));
    copt.uid_owner = real;
  }
  StatusOr<std::unique_ptr<runtime::Backend>> container = runtime::NewContainerBackend(copt);
  if (!container.ok()) return fail(container.status());
  std::vector<std::unique_ptr<runtime::Backend>> backends;
  backends.push_back(std::move(*container));

  std::string store_dir = flags.layer_store.empty() ? flags.state_dir + "/layers" : flags.layer_store;
  StatusOr<std::unique_ptr<node::LayerProvider>> layers =
      node::NewImageLayerProvider(store_dir, flags.state_dir + "/mnt", flags.mount_grace_ms);
  if (!layers.ok()) return fail(layers.status());

  node::ManagerOptions mopt;
  mopt.node_id = flags.node_id;
  mopt.state_dir = flags.state_dir;
  mopt.run_dir = *run_dir;
  mopt.limits.max_sandboxes = flags.max_sandboxes;
  mopt.limits.max_creates_in_flight = flags.max_creates_in_flight;
  mopt.limits.max_create_queue = flags.max_create_queue;
  mopt.suspend_prefetch = flags.suspend_prefetch;
  mopt.max_staging_bytes = flags.max_staging_mb << 20;
  {
    node::SuspendSwapOptions so;
    so.mode = flags.suspend_swap;
    so.zram_size_mb = flags.zram_size_mb;
    StatusOr<node::SuspendSwap> sw = node::EnsureSuspendSwap(so);
    if (!sw.ok()) {
      warren::Log(spdlog::level::warn, "no swap for suspend: suspended sandboxes give back only page cache",
                {{"error", sw.status().ToString()}});
    } else if (sw->how == "disabled") {
      warren::Log(spdlog::level::info, "suspend swap disabled (--suspend-swap=none)");
    } else {
      warren::Log(spdlog::level::info,
                sw->how == "created" ? "suspend swap: set up zram swap"
                : sw->how == "adopted" ? "suspend swap: adopted the zram swap set up earlier"
                                       : "suspend swap: using the host's swap",
                {{"device", sw->device}, {"size_mb", std::to_string(sw->size_bytes >> 20)}});
    }
  }
  StatusOr<std::unique_ptr<node::SandboxManager>> manager =
      node::SandboxManager::New(mopt, std::move(backends), std::move(*layers));
  if (!manager.ok()) return fail(manager.status());
  if (Status s = (*manager)->Start(); !s.ok()) return fail(s);

  // The probe only feeds Node.Status: it must never hold up serving.
  auto probe = std::make_shared<std::promise<runtime::HostFeatures>>();
  std::future<runtime::HostFeatures> probed = probe->get_future();
  std::thread([probe] { probe->set_value(runtime::ProbeHostFeatures()); }).detach();
  runtime::HostFeatures hf;
  if (probed.wait_for(std::chrono::seconds(5)) == std::future_status::ready) {
    hf = probed.get();
  } else {
    warren::Log(spdlog::level::warn,
              "host feature probe did not finish in 5 s; Node.Status reports them unknown");
  }
  api::ServiceOptions sopt;
  sopt.token = token;
  sopt.facts.cgroup_version = hf.cgroup_version;
  sopt.facts.cgroup_parent = hf.cgroup_parent;
  sopt.facts.idmapped_mounts = hf.idmapped_mounts;
  sopt.extra_backends.push_back("fncall");  // the pool below is always on
  api::WarrenServices services(manager->get(), sopt);
  // fncall (issue 5): warm worker pool, FnCall gRPC service, optional HTTP /run_code.
  runtime::FnCallOptions fopt;
  fopt.mount_point = flags.state_dir + "/fncall-root";
  fopt.max_workers = flags.fncall_max_workers ? flags.fncall_max_workers
                                              : std::max(4u, 4 * std::thread::hardware_concurrency());
  StatusOr<std::unique_ptr<runtime::FnCallPool>> fncall_pool = runtime::NewFnCallPool(fopt);
  if (!fncall_pool.ok()) return fail(fncall_pool.status());
  node::FnCallFrontend fncall_frontend(fncall_pool->get(), &(*manager)->layers(), flags.fncall_layers);
  api::FnCallServiceImpl fncall_service(&fncall_frontend, token);
  std::unique_ptr<http::RunCodeServer> http_server;
  if (!flags.http_listen.empty()) {
    http::RunCodeOptions ho;
    ho.listen = flags.http_listen;
    ho.allowed_hosts = flags.http_allowed_hosts;
    ho.allowed_layers = flags.run_code_layers;
    if (ho.allowed_layers.empty()) {  // the fncall defaults' names (directories among them serve as defaults only)
      for (const std::string& l : flags.fncall_layers) {
        std::stringstream ss(l);
        for (std::string part; std::getline(ss, part, ',');) {
          if (!part.empty() && part[0] != '/') ho.allowed_layers.push_back(part);
        }
      }
    }
    ho.max_timeout_s = flags.run_code_max_timeout_s;
    ho.max_memory_mb = flags.run_code_max_memory_mb;
    if (ho.max_memory_mb == 0) {
      const uint64_t ram_mb = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                              static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) >> 20;
      ho.max_memory_mb = static_cast<uint32_t>(std::min<uint64_t>(4096, std::max<uint64_t>(ram_mb / 2, 64)));
    }
    ho.token = token;
    if (!flags.http_token_file.empty()) {
      StatusOr<std::string> t = ReadToken(flags.http_token_file);
      if (!t.ok()) return fail(t.status());
      ho.token = *t;
    }
    if (ho.token.empty()) {
      warren::Log(spdlog::level::warn,
                "/run_code has no token (--http-token-file or --token-file): any local process may call it",
                {{"listen", flags.http_listen}});
    }
    StatusOr<std::unique_ptr<http::RunCodeServer>> h = http::RunCodeServer::Start(&fncall_frontend, std::move(ho));
    if (!h.ok()) return fail(h.status());
    http_server = std::move(*h);
    std::fprintf(stderr, "warrend /run_code on http://%s (port %d)\n", flags.http_listen.c_str(), http_server->port());
  }
  api::ServerOptions server_opt;
  server_opt.unix_socket = flags.socket;
  server_opt.tcp_listen = flags.listen;
  int tcp_port = 0;
  StatusOr<std::unique_ptr<grpc::Server>> server = api::StartServer(
      server_opt, services, flags.listen.empty() ? nullptr : &tcp_port, {&fncall_service});
  if (!server.ok()) return fail(server.status());

  // SIGTERM/SIGINT are turned into a byte on g_signal_pipe by an
  // async-signal-safe handler (nothing is blocked, so forked children do
  // not inherit a blocked signal mask); this thread does the shutdown.
  // Until here SIGTERM/SIGINT kill the process (nothing to shut down yet).
  struct sigaction sa {};
  sa.sa_handler = OnShutdownSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::thread signal_thread([&server, socket = flags.socket] {
    unsigned char sig = 0;
    while (::read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    warren::Log(spdlog::level::info, "shutting down; sandboxes keep running",
              {{"signal", strsignal(sig)}});
    // In-flight calls get a grace period, then are cancelled. A sync
    // handler still blocked in a long exec would hold Shutdown() forever:
    // past a second grace the process exits anyway (sandboxes are persisted
    // and outlive the daemon; that exec's result is lost, as in a crash).
    std::thread([socket] {
      std::this_thread::sleep_for(std::chrono::seconds(20));
      warren::Log(spdlog::level::warn, "in-flight calls did not finish; exiting without them");
      ::unlink(socket.c_str());
      ::_exit(0);
    }).detach();
    (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
  });

  warren::Log(spdlog::level::info, "warrend ready",
            {{"socket", flags.socket}, {"state_dir", flags.state_dir}, {"run_dir", *run_dir}, {"node_id", flags.node_id},
             {"tcp", flags.listen.empty() ? "" : flags.listen + " (port " + std::to_string(tcp_port) + ")"},
             {"init", *init}, {"cgroup", "v" + std::to_string(hf.cgroup_version) + " " + hf.cgroup_parent}});
  std::fprintf(stderr, "warrend ready on unix:%s\n", flags.socket.c_str());
  std::fflush(stderr);
  (*server)->Wait();
  signal_thread.join();
  ::unlink(flags.socket.c_str());
  server->reset();
  if (http_server) http_server->Stop();
  fncall_pool->reset();  // fncall workers go before the layer mounts they use
  fncall_frontend.ReleaseLayers();
  manager->reset();
  warren::Log(spdlog::level::info, "warrend stopped");
  return 0;
}

}  // namespace
}  // namespace warren

int main(int argc, char** argv) {
  warren::Flags f;
  CLI::App app{"warrend: the warren node daemon"};
  app.add_option("--state-dir", f.state_dir, "state directory (records, runtime dirs, mounts)")
      ->capture_default_str();
  app.add_option("--run-dir", f.run_dir,
                 "per-sandbox runtime state (records, runtime dirs, audit logs; linked from the state dir); "
                 "default: /run/warren/runtime/<hash of the state dir> on a tmpfs (mounted there if /run is "
                 "not one), or the state dir when its sandboxes/ already holds records");
  app.add_option("--socket", f.socket, "unix socket to serve on")->capture_default_str();
  app.add_option("--listen", f.listen, "also serve TCP on HOST:PORT (needs --token-file)");
  app.add_option("--token-file", f.token_file, "file holding the bearer token for TCP callers");
  app.add_option("--layer-store", f.layer_store, "layer store directory (default <state-dir>/layers)");
  app.add_option("--init-path", f.init_path,
                 "warren-init binary (default: next to warrend or ../init/warren-init)");
  app.add_option("--node-id", f.node_id, "node id, prefix of sandbox ids")->capture_default_str();
  app.add_option("--log-level", f.log_level, "trace|debug|info|warn|error|critical|off")
      ->capture_default_str();
  app.add_option("--log-format", f.log_format, "text|json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  app.add_option("--max-sandboxes", f.max_sandboxes, "admission: max sandboxes (0 = 16384)");
  app.add_option("--max-creates-in-flight", f.max_creates_in_flight,
                 "admission: max concurrent creates (0 = 4 x cpus)");
  app.add_option("--max-create-queue", f.max_create_queue,
                 "admission: creates beyond --max-creates-in-flight wait in a FIFO queue of at most this many "
                 "(until their deadline) before RESOURCE_EXHAUSTED (0 = 1024)");
  app.add_option("--warm-shells", f.warm_shells,
                 "container: keep this many pre-spawned sandbox shells (namespaces + cgroup, waiting for a "
                 "rootfs) so that a create skips the fork and cgroup attach (-1 = 2 x cpus, 0 = off)")
      ->capture_default_str();
  app.add_option("--recycled-cgroups", f.recycled_cgroups,
                 "container (cgroup v1): keep up to this many emptied sandbox cgroups for new sandboxes "
                 "instead of removing and creating them (only those whose sandbox left < 1 MiB charged; 0 = off)")
      ->capture_default_str();
  app.add_option("--mount-grace-ms", f.mount_grace_ms,
                 "keep an unused layer mount this long before unmounting")
      ->capture_default_str();
  app.add_option("--http-listen", f.http_listen,
                 "fncall: serve SandboxFusion-compatible POST /run_code on HOST:PORT (plain HTTP)");
  app.add_option("--http-token-file", f.http_token_file,
                 "/run_code: file holding the bearer token callers send as 'Authorization: Bearer <token>' "
                 "(default: --token-file's token; neither = no token)");
  app.add_option("--http-allowed-hosts", f.http_allowed_hosts,
                 "/run_code: Host header names accepted besides localhost, IP literals and the --http-listen host")
      ->delimiter(',');
  app.add_option("--run-code-layers", f.run_code_layers,
                 "/run_code: layers a request's \"layers\" may name (kind/name = any version, kind/name@version; "
                 "default: --fncall-layers)")
      ->delimiter(',');
  app.add_option("--run-code-max-memory-mb", f.run_code_max_memory_mb,
                 "/run_code: largest memory_limit_MB accepted (0 = min(4096, RAM/2))");
  app.add_option("--run-code-max-timeout-s", f.run_code_max_timeout_s,
                 "/run_code: largest run_timeout / compile_timeout accepted, in seconds")
      ->capture_default_str();
  app.add_option("--fncall-max-workers", f.fncall_max_workers, "fncall: max warm workers (0 = 4 x cpus)");
  app.add_option("--fncall-layers", f.fncall_layers, "fncall: default layers of calls that name none")
      ->capture_default_str();
  app.add_option("--suspend-swap", f.suspend_swap,
                 "swap for suspended sandboxes: auto (set up zram when the host has no swap) | none")
      ->check(CLI::IsMember({"auto", "none"}))
      ->capture_default_str();
  app.add_option("--zram-size-mb", f.zram_size_mb, "size of the zram swap set up by --suspend-swap=auto (0 = RAM/4)");
  app.add_option("--max-staging-mb", f.max_staging_mb,
                 "node-wide cap on what snapshots and grades copy from sandboxes at once, MiB (0 = none; "
                 "each sandbox is also bounded by its disk limit)");
  app.add_option("--suspend-prefetch", f.suspend_prefetch,
                 "resuming a suspended sandbox prefetches its working set (true|false)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  warren::Status s = warren::SetupLogging(
      f.log_format == "json" ? warren::LogFormat::kJson : warren::LogFormat::kText,
      f.log_level);
  if (!s.ok()) {
    std::fprintf(stderr, "warrend: %s\n", s.ToString().c_str());
    return 2;
  }
  if (::pipe2(warren::g_signal_pipe, O_CLOEXEC) != 0) {
    std::perror("warrend: pipe2");
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);
  return warren::Run(f);
}
