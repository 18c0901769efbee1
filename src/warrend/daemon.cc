#include "warrend/daemon.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "api/fncall_service.h"
#include "api/projects.h"
#include "api/services.h"
#include "cluster/cluster.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "e2b/server.h"
#include "http/run_code_server.h"
#include "jail/lxcfs.h"
#include "metrics/prometheus_metrics.h"
#include "net/sandbox_network.h"
#include "node/fncall_frontend.h"
#include "node/image_layer_provider.h"
#include "node/run_dir.h"
#include "node/sandbox_manager.h"
#include "runtime/container/container_backend.h"
#include "runtime/microvm/microvm_backend.h"
#include "runtime/vm/vm_backend.h"
#include "warrend/expose_gateway.h"
#include "warrend/host_setup.h"

namespace warren::warrend {
namespace {

int g_signal_pipe[2] = {-1, -1};

// SIGTERM/SIGINT become a byte on g_signal_pipe (async-signal-safe).
void OnShutdownSignal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  ssize_t ignored = ::write(g_signal_pipe[1], &b, 1);
  (void)ignored;
  errno = saved;
}

// Nothing is blocked, so forked children do not inherit a blocked signal
// mask; until this is called SIGTERM/SIGINT kill the process (nothing to shut
// down yet).
void InstallShutdownHandler() {
  struct sigaction sa {};
  sa.sa_handler = OnShutdownSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

// The sandbox manager over the container backend and the layer store, started
// (sandboxes of an earlier daemon on this state dir re-adopted).
// `accel` is set to the microvm backend's accelerator choice when it is offered.
StatusOr<std::unique_ptr<node::SandboxManager>> StartManager(const Flags& flags, const std::string& init,
                                                             const std::string& run_dir, const std::string& lxcfs_dir,
                                                             std::shared_future<runtime::AccelChoice>* accel,
                                                             node::Metrics* metrics,
                                                             std::shared_ptr<net::SandboxNetwork>* network) {
  node::NodeLimits limits;
  RETURN_IF_ERROR(node::ParseOvercommit(flags.overcommit, &limits));
  runtime::ContainerOptions copt;
  copt.init_path = init;
  copt.lxcfs_dir = lxcfs_dir;
  copt.warm_shells = flags.warm_shells >= 0 ? static_cast<uint32_t>(flags.warm_shells)
                                            : 2 * static_cast<uint32_t>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  copt.recycled_cgroups = flags.recycled_cgroups;
  // Sandbox uid ranges are claimed host-wide, in the name of this state dir
  // (sandboxes outlive the daemon; a restart on the same dir re-takes them).
  copt.uid_lock_dir = "/run/warren/uid-slots";
  char real[PATH_MAX];
  if (::realpath(flags.state_dir.c_str(), real) == nullptr) {
    return ErrnoToStatus(errno, "realpath(" + flags.state_dir + ")");
  }
  copt.uid_owner = real;
  if (!flags.sandbox_net.empty()) {
    net::NetworkOptions nopt;
    nopt.range = flags.sandbox_net;
    nopt.state_dir = real;
    nopt.expose_host = flags.expose_host;
    nopt.dns_upstream = flags.net_dns_upstream;
    if (nopt.dns_upstream.empty()) {
      StatusOr<std::string> rc = ReadSmallFile("/etc/resolv.conf");
      if (rc.ok()) nopt.dns_upstream = net::FirstNameserver(*rc);
    }
    if (nopt.dns_upstream == "none") nopt.dns_upstream.clear();
    for (const std::string& p : flags.net_presets) RETURN_IF_ERROR(net::ParsePreset(p, &nopt.presets));
    ASSIGN_OR_RETURN(std::unique_ptr<net::SandboxNetwork> nw, net::SandboxNetwork::Open(nopt));
    Log(spdlog::level::info, "sandbox network",
        {{"range", flags.sandbox_net}, {"nft_table", nw->table()}, {"dns_upstream", nopt.dns_upstream}});
    copt.network = std::move(nw);
    *network = copt.network;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<runtime::Backend> container, runtime::NewContainerBackend(copt));
  std::vector<std::unique_ptr<runtime::Backend>> backends;
  backends.push_back(std::move(container));
  runtime::MicrovmOptions vopt;
  // The uncompressed kernel when build-guest.sh extracted it: QEMU boots it
  // through its PVH entry, without the bzImage's decompressor (~270 ms of a
  // cold boot under TCG).
  vopt.kernel =
      flags.microvm_dir + (::access((flags.microvm_dir + "/vmlinux").c_str(), R_OK) == 0 ? "/vmlinux" : "/vmlinuz");
  vopt.initrd = flags.microvm_dir + "/initramfs.cpio";
  vopt.accel = flags.microvm_accel;
  vopt.boot_timeout = std::chrono::milliseconds(flags.microvm_boot_timeout_ms);
  vopt.disk_dir = flags.state_dir + "/microvm-disks";
  if (flags.microvm_templates) vopt.template_dir = run_dir + "/microvm-templates";
  vopt.network = copt.network;  // a tap per VM on the same network
  vopt.pool_size = flags.microvm_pool;
  if (flags.microvm_accel != "auto" && flags.microvm_accel != "tcg" && flags.microvm_accel != "kvm") {
    return absl::InvalidArgumentError("--microvm-accel must be auto, tcg or kvm, not \"" + flags.microvm_accel + "\"");
  }
  vopt.accel = "tcg";  // the host check below is about files; the accelerator is chosen after it
  if (Status s = runtime::CheckMicrovmHost(vopt); !s.ok()) {
    Log(spdlog::level::info, "microvm backend not offered", {{"reason", s.ToString()}});
  } else {
    vopt.accel = flags.microvm_accel;
    ASSIGN_OR_RETURN(vopt.accel_choice, runtime::ChooseAccel(flags.microvm_accel));
    *accel = vopt.accel_choice;
    std::thread([choice = vopt.accel_choice] {
      const runtime::AccelChoice& c = choice.get();
      Log(spdlog::level::info, "microvm accelerator", {{"accel", c.accel}, {"reason", c.reason}});
    }).detach();
    ASSIGN_OR_RETURN(std::unique_ptr<runtime::Backend> microvm, runtime::NewMicrovmBackend(vopt));
    Log(spdlog::level::info, "microvm backend offered", {{"dir", flags.microvm_dir}, {"accel", vopt.accel}});
    backends.push_back(std::move(microvm));
  }
  // The vm backend: full VMs with a display, on the microvm's accelerator choice.
  runtime::VmOptions wopt;
  wopt.guest_dir = flags.vm_dir;
  wopt.disk_dir = flags.state_dir + "/vm-disks";
  wopt.boot_timeout = std::chrono::milliseconds(flags.vm_boot_timeout_ms);
  wopt.desktop_timeout = std::chrono::milliseconds(flags.vm_desktop_timeout_ms);
  if (flags.vm_templates) wopt.template_dir = flags.state_dir + "/vm-templates";
  wopt.network = copt.network;  // a tap per VM, as a microVM's
  if (Status s = runtime::CheckVmHost(wopt); !s.ok()) {
    Log(spdlog::level::info, "vm backend not offered", {{"reason", s.ToString()}});
  } else {
    wopt.accel = flags.microvm_accel;
    if (accel->valid()) {
      wopt.accel_choice = *accel;
    } else {
      ASSIGN_OR_RETURN(wopt.accel_choice, runtime::ChooseAccel(flags.microvm_accel));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<runtime::Backend> vm, runtime::NewVmBackend(wopt));
    Log(spdlog::level::info, "vm backend offered", {{"dir", flags.vm_dir}});
    backends.push_back(std::move(vm));
  }

  std::string store_dir = flags.layer_store.empty() ? flags.state_dir + "/layers" : flags.layer_store;
  node::ReadCacheOptions read_cache;
  read_cache.cap_bytes = flags.layer_cache_bytes;
  read_cache.dir = flags.layer_cache_dir.empty() ? flags.state_dir + "/layer-cache" : flags.layer_cache_dir;
  read_cache.chunk_bytes = flags.layer_cache_chunk_kb * 1024;
  read_cache.fs_mountpoint = flags.state_dir + "/layer-files";
  read_cache.fs_holder_path = Dirname(init) + "/warren-fuse-fd";  // beside warren-init, as warren-spawn
  read_cache.prefetch = flags.layer_cache_prefetch;
  read_cache.keep_metadata = flags.layer_cache_keep_metadata;
  read_cache.chunked_layers = flags.chunked_layers;
  ASSIGN_OR_RETURN(std::unique_ptr<node::LayerProvider> layers,
                   node::NewImageLayerProvider(store_dir, flags.state_dir + "/mnt", flags.mount_grace_ms, read_cache));

  node::ManagerOptions mopt;
  mopt.node_id = flags.node_id;
  mopt.state_dir = flags.state_dir;
  mopt.run_dir = run_dir;
  mopt.limits = limits;
  mopt.limits.max_sandboxes = flags.max_sandboxes;
  mopt.limits.max_creates_in_flight = flags.max_creates_in_flight;
  mopt.limits.max_create_queue = flags.max_create_queue;
  mopt.suspend_prefetch = flags.suspend_prefetch;
  mopt.max_staging_bytes = flags.max_staging_mb << 20;
  mopt.metrics = metrics;
  SetUpSuspendSwap(flags.suspend_swap, flags.zram_size_mb);
  ASSIGN_OR_RETURN(std::unique_ptr<node::SandboxManager> manager,
                   node::SandboxManager::New(mopt, std::move(backends), std::move(layers)));
  if (*network != nullptr) {
    // Refused packets join the sandbox's audit log (op "net_denied").
    (*network)->SetDeniedHook([m = manager.get()](const std::string& id, const net::LoggedPacket& p) {
      m->Audit(id, {{"op", "net_denied"}, {"dst", p.dst}, {"proto", p.proto}, {"port", p.port}});
    });
  }
  RETURN_IF_ERROR(manager->Start());
  if (*network != nullptr) {
    // Adoptions are done: a link no sandbox leases is a leftover (a VM's tap
    // of a create a crash cut short).
    if (int n = (*network)->DropUnleasedLinks(); n > 0)
      Log(spdlog::level::info, "sandbox network: leftover links removed", {{"count", std::to_string(n)}});
  }
  return manager;
}

// Host facts for Node.Status. The probe only feeds Node.Status: it must
// never hold up serving (unknown after 5 s).
api::NodeFacts ProbeFacts() {
  auto probe = std::make_shared<std::promise<runtime::HostFeatures>>();
  std::future<runtime::HostFeatures> probed = probe->get_future();
  std::thread([probe] { probe->set_value(runtime::ProbeHostFeatures()); }).detach();
  runtime::HostFeatures hf;
  if (probed.wait_for(std::chrono::seconds(5)) == std::future_status::ready) {
    hf = probed.get();
  } else {
    warren::Log(spdlog::level::warn, "host feature probe did not finish in 5 s; Node.Status reports them unknown");
  }
  api::NodeFacts facts;
  facts.cgroup_version = hf.cgroup_version;
  facts.cgroup_parent = hf.cgroup_parent;
  facts.idmapped_mounts = hf.idmapped_mounts;
  return facts;
}

// The /run_code HTTP server over `frontend`, as --http-listen and the
// /run_code flags ask.
StatusOr<std::unique_ptr<http::RunCodeServer>> StartRunCode(const Flags& flags, node::FnCallFrontend* frontend,
                                                            const std::string& token) {
  http::RunCodeOptions ho;
  ho.listen = flags.http_listen;
  ho.allowed_hosts = flags.http_allowed_hosts;
  ho.allowed_layers = flags.run_code_layers;
  if (ho.allowed_layers.empty()) {  // the fncall defaults' names (directories among them serve as defaults only)
    for (const std::string& l : flags.fncall_layers) {
      std::stringstream ss(l);
      for (std::string part; std::getline(ss, part, ',');) {
        if (!part.empty() && part.back() == '?') part.pop_back();  // optional defaults may be named too
        if (!part.empty() && part[0] != '/') ho.allowed_layers.push_back(part);
      }
    }
  }
  ho.max_timeout_s = flags.run_code_max_timeout_s;
  ho.max_memory_mb = flags.run_code_max_memory_mb;
  if (ho.max_memory_mb == 0) {
    const uint64_t ram_mb =
        static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) >> 20;
    ho.max_memory_mb = static_cast<uint32_t>(std::min<uint64_t>(4096, std::max<uint64_t>(ram_mb / 2, 64)));
  }
  ho.token = token;
  if (!flags.http_token_file.empty()) {
    ASSIGN_OR_RETURN(ho.token, ReadToken(flags.http_token_file));
  }
  if (ho.token.empty()) {
    warren::Log(spdlog::level::warn,
                "/run_code has no token (--http-token-file or --token-file): any local process may call it",
                {{"listen", flags.http_listen}});
  }
  ASSIGN_OR_RETURN(std::unique_ptr<http::RunCodeServer> server, http::RunCodeServer::Start(frontend, std::move(ho)));
  std::fprintf(stderr, "warrend /run_code on http://%s (port %d)\n", flags.http_listen.c_str(), server->port());
  return server;
}

// The E2B-compatible front end over `manager`, as --e2b-listen and the
// --e2b-* flags ask.
// API keys: --e2b-api-keys and the node's `token` act for every project,
// `projects`' tokens (null on a single node) for theirs.
StatusOr<std::unique_ptr<e2b::E2bServer>> StartE2b(const Flags& flags, node::SandboxManager* manager,
                                                   const std::string& token, api::Projects* projects) {
  e2b::E2bOptions eo;
  eo.listen = flags.e2b_listen;
  if (!flags.e2b_api_keys.empty()) {
    ASSIGN_OR_RETURN(eo.api_keys, e2b::ReadApiKeys(flags.e2b_api_keys));
  }
  eo.node_token = token;
  eo.projects = projects;
  eo.max_body_bytes = flags.e2b_max_upload_mb << 20;
  std::vector<std::string> base;
  for (const std::string& l : flags.fncall_layers) {
    std::stringstream ss(l);
    for (std::string part; std::getline(ss, part, ',');) {
      // Optional fncall defaults ('?') are not part of E2B's "base" template:
      // a template's layers must exist when a sandbox is created.
      if (!part.empty() && part[0] != '/' && part.back() != '?') base.push_back(part);
    }
  }
  ASSIGN_OR_RETURN(eo.templates, e2b::ReadTemplates(flags.e2b_templates, base));
  eo.templates_path = flags.e2b_templates;
  eo.base_layers = std::move(base);
  ASSIGN_OR_RETURN(std::unique_ptr<e2b::E2bServer> server, e2b::E2bServer::Start(manager, std::move(eo)));
  std::fprintf(stderr, "warrend E2B API on http://%s (port %d)\n", flags.e2b_listen.c_str(), server->port());
  return server;
}

// Waits for SIGTERM/SIGINT, then shuts `server` down: in-flight calls get a
// grace period, then are cancelled. A sync handler still blocked in a long
// exec would hold Shutdown() forever: past a second grace the process exits
// anyway (sandboxes are persisted and outlive the daemon; that exec's result
// is lost, as in a crash).
// `first` runs before anything else (the cluster withdraws this node, so no
// new call is routed here).
std::thread ShutdownOnSignal(grpc::Server* server, std::string socket, std::function<void()> first) {
  return std::thread([server, socket = std::move(socket), first = std::move(first)] {
    unsigned char sig = 0;
    while (::read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    warren::Log(spdlog::level::info, "shutting down; sandboxes keep running", {{"signal", strsignal(sig)}});
    if (first) first();
    std::thread([socket] {
      std::this_thread::sleep_for(std::chrono::seconds(20));
      warren::Log(spdlog::level::warn, "in-flight calls did not finish; exiting without them");
      ::unlink(socket.c_str());
      ::_exit(0);
    }).detach();
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
  });
}

}  // namespace

int Run(const Flags& flags) {
  auto fail = [](const Status& s) {
    warren::Log(spdlog::level::critical, "warrend cannot start", {{"error", s.ToString()}});
    return 1;
  };
  if (::pipe2(g_signal_pipe, O_CLOEXEC) != 0) return fail(ErrnoToStatus(errno, "pipe2"));
  BoundHeap();
  if (auto [before, after] = RaiseNofileLimit(); before != after) {
    warren::Log(spdlog::level::info, "raised RLIMIT_NOFILE soft limit to the hard limit",
                {{"from", std::to_string(before)}, {"to", std::to_string(after)}});
  }
  if (flags.state_dir.empty() || flags.state_dir[0] != '/') {
    return fail(absl::InvalidArgumentError("--state-dir must be an absolute path"));
  }
  if (!flags.listen.empty() && flags.token_file.empty()) {
    return fail(absl::InvalidArgumentError("--listen needs --token-file (TCP callers must present a bearer token)"));
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
  // --metrics-listen: bound before anything slow, so that a bad address fails the start at once.
  std::shared_ptr<metrics::PrometheusMetrics> prom;
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  if (!flags.metrics_listen.empty()) {
    prom = std::make_shared<metrics::PrometheusMetrics>();
    StatusOr<std::unique_ptr<metrics::MetricsServer>> m = metrics::MetricsServer::Start(flags.metrics_listen, prom);
    if (!m.ok()) return fail(m.status());
    metrics_server = std::move(*m);
    std::fprintf(stderr, "warrend /metrics on http://%s/metrics (port %d)\n", flags.metrics_listen.c_str(),
                 metrics_server->port());
  }
  StatusOr<std::string> init = FindInit(flags.init_path);
  if (!init.ok()) return fail(init.status());
  StatusOr<std::string> run_dir =
      node::ResolveRunDir(flags.state_dir, flags.run_dir, "/run/warren/runtime", /*mount_tmpfs=*/true);
  if (!run_dir.ok()) return fail(run_dir.status());
  if (Status s = node::LinkRunDir(flags.state_dir, *run_dir); !s.ok()) return fail(s);
  // On every way out (after the manager, declared below, is gone): an unused
  // run dir and its links go, live sandboxes' records stay for the next daemon.
  struct RunDirGuard {
    const std::string &state, &run;
    ~RunDirGuard() { node::RemoveRunDirIfUnused(state, run); }
  } run_dir_guard{flags.state_dir, *run_dir};
  RemoveOrphanRunDirs("/run/warren/runtime", *run_dir, runtime::MicrovmOptions().qemu);
  // lxcfs (jail/lxcfs.h): sandboxes see their own limits in /proc. One per
  // run dir; stopped on the way out when no sandbox is left (no
  // record in the run dir), else left for the next daemon to adopt.
  std::unique_ptr<jail::Lxcfs> lxcfs;
  const std::string lxcfs_base = LxcfsDir(*run_dir);
  if (flags.limit_views == "off") {
    Log(spdlog::level::info, "--limit-views=off: sandboxes see the host's cpus and memory in /proc");
  } else if (StatusOr<std::unique_ptr<jail::Lxcfs>> l = jail::Lxcfs::Start(lxcfs_base, flags.lxcfs_binary); l.ok()) {
    lxcfs = std::move(*l);
  } else if (flags.limit_views == "on") {
    return fail(Status(l.status().code(), "--limit-views=on: " + std::string(l.status().message())));
  } else {
    Log(spdlog::level::warn, "no lxcfs: sandboxes see the host's cpus and memory in /proc",
        {{"error", l.status().ToString()}});
  }
  struct LxcfsGuard {
    const std::string& run;
    std::unique_ptr<jail::Lxcfs>& l;
    ~LxcfsGuard() {
      if (!l) return;
      bool empty = true;  // no live sandbox's record (RemoveRunDirIfUnused's test)
      if (DIR* d = ::opendir((run + "/sandboxes").c_str())) {
        while (const dirent* e = ::readdir(d)) {
          if (e->d_name[0] != '.') {
            empty = false;
            break;
          }
        }
        ::closedir(d);
      }
      if (empty) l->Stop();
    }
  } lxcfs_guard{*run_dir, lxcfs};
  const std::string lxcfs_dir = lxcfs ? lxcfs->mount_dir() : std::string();

  std::shared_future<runtime::AccelChoice> microvm_accel;
  std::shared_ptr<net::SandboxNetwork> sandbox_net;
  StatusOr<std::unique_ptr<node::SandboxManager>> manager =
      StartManager(flags, *init, *run_dir, lxcfs_dir, &microvm_accel, prom.get(), &sandbox_net);
  if (!manager.ok()) return fail(manager.status());
  // Destroyed before the manager: the denied hook (which writes its audit
  // log) is cleared first.
  struct DeniedHookGuard {
    std::shared_ptr<net::SandboxNetwork> n;
    ~DeniedHookGuard() {
      if (n != nullptr) n->SetDeniedHook(nullptr);
    }
  } denied_hook_guard{sandbox_net};

  // Cluster: joined before serving; a node others cannot reach yet refuses
  // their creates (UNAVAILABLE), which moves placement on.
  std::unique_ptr<cluster::Cluster> cluster;
  if (!flags.cluster.empty()) {
    cluster::ClusterFlags cf;
    cf.spec = flags.cluster;
    cf.advertise = flags.cluster_advertise.empty() ? flags.listen : flags.cluster_advertise;
    cf.token = token;
    cf.lease_s = flags.cluster_lease_s;
    cf.refresh_ms = flags.cluster_refresh_ms;
    cf.drain = flags.cluster_drain;
    cf.etcd_ca = flags.cluster_etcd_ca;
    cf.etcd_cert = flags.cluster_etcd_cert;
    cf.etcd_key = flags.cluster_etcd_key;
    cf.etcd_user = flags.cluster_etcd_user;
    cf.etcd_password_file = flags.cluster_etcd_password_file;
    cf.extra_backends = {"fncall"};
    if (flags.listen.empty())
      return fail(absl::InvalidArgumentError("--cluster needs --listen (nodes call each other over TCP)"));
    StatusOr<std::unique_ptr<cluster::Cluster>> c = cluster::Cluster::Join(cf, manager->get());
    if (!c.ok()) return fail(c.status());
    cluster = std::move(*c);
  }

  api::ServiceOptions sopt;
  sopt.token = token;
  sopt.forward = cluster ? cluster->forwarder() : nullptr;
  sopt.members = cluster.get();
  sopt.projects = cluster ? cluster->projects() : nullptr;
  sopt.facts = ProbeFacts();
  sopt.facts.microvm_accel = microvm_accel;
  sopt.extra_backends.push_back("fncall");  // the pool below is always on
  api::WarrenServices services(manager->get(), sopt);
  // fncall: warm worker pool, FnCall gRPC service, optional HTTP /run_code.
  runtime::FnCallOptions fopt;
  fopt.mount_point = flags.state_dir + "/fncall-root";
  fopt.lxcfs_dir = lxcfs_dir;
  fopt.max_workers =
      flags.fncall_max_workers ? flags.fncall_max_workers : std::max(4u, 4 * std::thread::hardware_concurrency());
  StatusOr<std::unique_ptr<runtime::FnCallPool>> fncall_pool = runtime::NewFnCallPool(fopt);
  if (!fncall_pool.ok()) return fail(fncall_pool.status());
  node::FnCallFrontend fncall_frontend(fncall_pool->get(), &(*manager)->layers(), flags.fncall_layers, prom.get());
  std::shared_ptr<void> metrics_watch;  // scrape-time gauges; withdrawn before the manager and the pool go
  if (metrics_server) {
    metrics_watch = metrics_server->Watch([m = manager->get(), pool = fncall_pool->get()] {
      node::NodeGauges g = m->Gauges();
      const runtime::FnCallStats s = pool->Stats();
      g.fncall = true;
      g.fncall_workers_busy = s.busy;
      g.fncall_workers_idle = s.idle;
      return g;
    });
  }
  api::FnCallServiceImpl fncall_service(&fncall_frontend, token);
  std::unique_ptr<http::RunCodeServer> http_server;
  if (!flags.http_listen.empty()) {
    StatusOr<std::unique_ptr<http::RunCodeServer>> h = StartRunCode(flags, &fncall_frontend, token);
    if (!h.ok()) return fail(h.status());
    http_server = std::move(*h);
  }
  std::unique_ptr<e2b::E2bServer> e2b_server;
  if (!flags.e2b_listen.empty()) {
    StatusOr<std::unique_ptr<e2b::E2bServer>> e = StartE2b(flags, manager->get(), token, sopt.projects);
    if (!e.ok()) return fail(e.status());
    e2b_server = std::move(*e);
  }
  std::unique_ptr<net::ExposeGateway> expose_gateway;
  if (!flags.expose_gateway.empty()) {
    StatusOr<std::unique_ptr<net::ExposeGateway>> g =
        StartExposeGateway(flags.expose_gateway, flags.expose_domain, manager->get(), cluster.get(), token);
    if (!g.ok()) return fail(g.status());
    expose_gateway = std::move(*g);
    std::fprintf(stderr, "warrend exposure gateway on %s: http://PORT-SANDBOX_ID.%s:%d/\n",
                 expose_gateway->address().c_str(), flags.expose_domain.c_str(), expose_gateway->listen_port());
  }
  api::ServerOptions server_opt;
  server_opt.unix_socket = flags.socket;
  server_opt.tcp_listen = flags.listen;
  int tcp_port = 0;
  StatusOr<std::unique_ptr<grpc::Server>> server =
      api::StartServer(server_opt, services, flags.listen.empty() ? nullptr : &tcp_port, {&fncall_service});
  if (!server.ok()) return fail(server.status());

  InstallShutdownHandler();
  std::thread signal_thread = ShutdownOnSignal(server->get(), flags.socket, [&cluster] {
    if (cluster) cluster->Leave();
  });
  warren::Log(spdlog::level::info, "warrend ready",
              {{"socket", flags.socket},
               {"state_dir", flags.state_dir},
               {"run_dir", *run_dir},
               {"node_id", flags.node_id},
               {"tcp", flags.listen.empty() ? "" : flags.listen + " (port " + std::to_string(tcp_port) + ")"},
               {"init", *init},
               {"cgroup", "v" + std::to_string(sopt.facts.cgroup_version) + " " + sopt.facts.cgroup_parent}});
  std::fprintf(stderr, "warrend ready on unix:%s\n", flags.socket.c_str());
  std::fflush(stderr);
  (*server)->Wait();
  signal_thread.join();
  ::unlink(flags.socket.c_str());
  metrics_watch.reset();
  server->reset();
  if (http_server) http_server->Stop();
  if (e2b_server) e2b_server->Stop();
  expose_gateway.reset();  // before the manager its resolver asks
  fncall_pool->reset();    // fncall workers go before the layer mounts they use
  fncall_frontend.ReleaseLayers();
  manager->reset();
  warren::Log(spdlog::level::info, "warrend stopped");
  return 0;
}

}  // namespace warren::warrend
