#include "warrend/flags.h"

namespace warren::warrend {

void AddFlags(CLI::App& app, Flags& flags) {
  app.add_option("--state-dir", flags.state_dir, "state directory (records, runtime dirs, mounts)")
      ->capture_default_str();
  app.add_option("--run-dir", flags.run_dir,
                 "per-sandbox runtime state (records, runtime dirs, audit logs; linked from the state dir); "
                 "default: /run/warren/runtime/<hash of the state dir> on a tmpfs (mounted there if /run is "
                 "not one), or the state dir when its sandboxes/ already holds records");
  app.add_option("--socket", flags.socket, "unix socket to serve on")->capture_default_str();
  app.add_option("--listen", flags.listen, "also serve TCP on HOST:PORT (needs --token-file)");
  app.add_option("--token-file", flags.token_file, "file holding the bearer token for TCP callers");
  app.add_option("--layer-store", flags.layer_store, "layer store directory (default <state-dir>/layers)");
  app.add_option("--init-path", flags.init_path,
                 "warren-init binary (default: next to warrend or ../init/warren-init)");
  app.add_option("--node-id", flags.node_id, "node id, prefix of sandbox ids")->capture_default_str();
  app.add_option("--log-level", flags.log_level, "trace|debug|info|warn|error|critical|off")->capture_default_str();
  app.add_option("--log-format", flags.log_format, "text|json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  app.add_option("--max-sandboxes", flags.max_sandboxes, "admission: max sandboxes (0 = 16384)");
  app.add_option("--max-creates-in-flight", flags.max_creates_in_flight,
                 "admission: max concurrent creates (0 = 4 x cpus)");
  app.add_option("--max-create-queue", flags.max_create_queue,
                 "admission: creates beyond --max-creates-in-flight wait in a FIFO queue of at most this many "
                 "(until their deadline) before RESOURCE_EXHAUSTED (0 = 1024)");
  app.add_option("--overcommit", flags.overcommit,
                 "admission per QoS class: CLASS=RATIO[,CLASS=RATIO] (classes latency, best-effort), e.g. "
                 "latency=1,best-effort=4: the cpu_millis (memory_mb) that a class's sandboxes ask for may add up "
                 "to cpus x 1000 (the node's memory) x RATIO; a create past it is RESOURCE_EXHAUSTED naming the "
                 "class. A class not named (or RATIO 0) is not counted. Default: none counted");
  app.add_option("--warm-shells", flags.warm_shells,
                 "container: keep this many pre-spawned sandbox shells (namespaces + cgroup, waiting for a "
                 "rootfs) so that a create skips the fork and cgroup attach (-1 = 2 x cpus, 0 = off)")
      ->capture_default_str();
  app.add_option("--sandbox-net", flags.sandbox_net,
                 "IPv4 range (e.g. 10.213.0.0/16) of the sandboxes that ask for a network: a routed /30 and a "
                 "veth pair each, NAT'ed, filtered by nftables (table inet warren_<tag>); sets "
                 "net.ipv4.ip_forward=1. Empty = no sandbox network");
  app.add_option("--net-preset", flags.net_presets,
                 "NAME=ENTRY[,ENTRY...]: a named list of network entries (e.g. pypi=tcp:203.0.113.10:443) that "
                 "a sandbox's policy names as \"pypi\"; repeatable");
  app.add_option("--net-dns-upstream", flags.net_dns_upstream,
                 "IPv4[:PORT] the sandboxes' DNS forwarder asks (it answers only names a sandbox's policy allows "
                 "and pins their addresses); default: the first nameserver of /etc/resolv.conf; none = no names");
  app.add_option("--expose-host", flags.expose_host,
                 "IPv4 address the exposed ports of sandboxes listen on (sb.expose)")
      ->capture_default_str();
  app.add_option("--expose-gateway", flags.expose_gateway,
                 "IPv4:PORT of the exposure gateway: one listener reaching every sandbox's exposed port (on any "
                 "node of the cluster) by the request's Host, PORT-SANDBOX_ID.<--expose-domain>; the exposure's "
                 "token is still required. Empty = none");
  app.add_option("--expose-domain", flags.expose_domain,
                 "the exposure gateway's domain (a wildcard DNS name; the default, localhost, needs no DNS: "
                 "http://PORT-ID.localhost:GATEWAY_PORT/)")
      ->capture_default_str();
  app.add_option("--recycled-cgroups", flags.recycled_cgroups,
                 "container (cgroup v1): keep up to this many emptied sandbox cgroups for new sandboxes "
                 "instead of removing and creating them (only those whose sandbox left < 1 MiB charged; 0 = off)")
      ->capture_default_str();
  app.add_option("--mount-grace-ms", flags.mount_grace_ms, "keep an unused layer mount this long before unmounting")
      ->capture_default_str();
  app.add_option("--layer-cache-bytes", flags.layer_cache_bytes,
                 "node-local read cache of layer images: at most this many bytes of chunks read from the layer "
                 "store kept on local disk, least recently used evicted first; layers are mounted through it "
                 "(0 = no cache: layers mounted straight from the store)")
      ->capture_default_str();
  app.add_option("--layer-cache-dir", flags.layer_cache_dir,
                 "the read cache's local dir (default <state-dir>/layer-cache; emptied at start)");
  app.add_option("--layer-cache-chunk-kb", flags.layer_cache_chunk_kb,
                 "the read cache's unit: bytes read from the store at a time and evicted together (KiB, power of "
                 "two, 4..4096)")
      ->capture_default_str();
  app.add_flag("--layer-cache-prefetch,!--no-layer-cache-prefetch", flags.layer_cache_prefetch,
               "with the read cache: record what a layer's first sandboxes read (its hot list, kept in the "
               "store) and read it ahead when a node mounts the layer (on by default)");
  app.add_flag("--chunked-layers,!--no-chunked-layers", flags.chunked_layers,
               "build every layer this node converts chunk-based (metadata first, so a read cache keeps it "
               "local; holes and repeated 4 KiB blocks cost nothing); off (the default): only layers with sparse "
               "files and sandbox copies");
  app.add_flag("--layer-cache-keep-metadata,!--no-layer-cache-keep-metadata", flags.layer_cache_keep_metadata,
               "with the read cache: keep a mounted layer's EROFS metadata (superblock, inodes, directories, "
               "chunk indexes: the image's first ~0.5 %) local, read whole at the mount and never evicted (on by "
               "default)");
  app.add_option("--microvm-dir", flags.microvm_dir,
                 "microvm: dir of the guest kernel and initramfs (vmlinux or vmlinuz, initramfs.cpio: "
                 "scripts/microvm/build-guest.sh); the backend is offered only when they and QEMU exist")
      ->capture_default_str();
  app.add_option(
         "--microvm-accel", flags.microvm_accel,
         "microvm: auto | tcg | kvm; auto probes /dev/kvm once at start (at most 1 s, beside serving) and takes kvm "
         "where it runs a stock guest (PVM-based /dev/kvm does not), tcg otherwise")
      ->check(CLI::IsMember({"auto", "tcg", "kvm"}))
      ->capture_default_str();
  app.add_option("--microvm-templates", flags.microvm_templates,
                 "microvm: warm starts: creates restore a clone of a template saved once per shape (in the run dir); "
                 "false: every create boots cold")
      ->capture_default_str();
  app.add_option("--microvm-pool", flags.microvm_pool,
                 "microvm: clones kept restored and warmed up ahead of creates (of the template the last create "
                 "used); 0: none")
      ->check(CLI::Range(0, 16))
      ->capture_default_str();
  app.add_option("--microvm-boot-timeout-ms", flags.microvm_boot_timeout_ms,
                 "microvm: a create fails (DeadlineExceeded, the VM removed) when the guest agent has not "
                 "answered this long after QEMU started")
      ->capture_default_str();
  app.add_option(
         "--vm-dir", flags.vm_dir,
         "vm: dir of the desktop guest (system.erofs, upper.img, vmlinuz, initrd.img: scripts/vm/build-guest.sh); the "
         "backend is offered only when they, QEMU and qemu-img exist; it runs on --microvm-accel's choice")
      ->capture_default_str();
  app.add_option("--vm-boot-timeout-ms", flags.vm_boot_timeout_ms,
                 "vm: a create fails (DeadlineExceeded, the VM removed) when the guest agent has not answered this "
                 "long after QEMU started (a full systemd boot under TCG takes tens of seconds)")
      ->capture_default_str();
  app.add_option("--vm-templates", flags.vm_templates,
                 "vm: warm starts: the first create of a memory size boots a template until its desktop takes input "
                 "and saves it (in <state-dir>/vm-templates); creates restore copy-on-write clones of it; false: "
                 "every create boots cold")
      ->capture_default_str();
  app.add_option("--vm-desktop-timeout-ms", flags.vm_desktop_timeout_ms,
                 "vm: a template's wait, after its agent answered, for its desktop to take input; past it the "
                 "template fails (named in the log) and creates boot cold")
      ->capture_default_str();
  app.add_option("--http-listen", flags.http_listen,
                 "fncall: serve SandboxFusion-compatible POST /run_code on HOST:PORT (plain HTTP)");
  app.add_option("--http-token-file", flags.http_token_file,
                 "/run_code: file holding the bearer token callers send as 'Authorization: Bearer <token>' "
                 "(default: --token-file's token; neither = no token)");
  app.add_option("--http-allowed-hosts", flags.http_allowed_hosts,
                 "/run_code: Host header names accepted besides localhost, IP literals and the --http-listen host")
      ->delimiter(',');
  app.add_option("--run-code-layers", flags.run_code_layers,
                 "/run_code: layers a request's \"layers\" may name (kind/name = any version, kind/name@version; "
                 "default: --fncall-layers)")
      ->delimiter(',');
  app.add_option("--run-code-max-memory-mb", flags.run_code_max_memory_mb,
                 "/run_code: largest memory_limit_MB accepted (0 = min(4096, RAM/2))");
  app.add_option("--run-code-max-timeout-s", flags.run_code_max_timeout_s,
                 "/run_code: largest run_timeout / compile_timeout accepted, in seconds")
      ->capture_default_str();
  app.add_option("--e2b-listen", flags.e2b_listen,
                 "serve an E2B-compatible API (REST lifecycle + envd process service) on HOST:PORT (plain HTTP); "
                 "the e2b SDK's E2B_API_URL and E2B_SANDBOX_URL both point here (needs API keys: --e2b-api-keys, "
                 "--token-file or --cluster)");
  app.add_option("--e2b-api-keys", flags.e2b_api_keys,
                 "E2B: file of API keys (X-API-KEY / E2B_API_KEY) acting for every project, one a line "
                 "(the node's --token-file and, in a cluster, project tokens are keys too)");
  app.add_option("--e2b-max-upload-mb", flags.e2b_max_upload_mb,
                 "E2B: largest request body (a file upload) in MiB; larger ones are answered 413 and not kept")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20));
  app.add_option("--e2b-templates", flags.e2b_templates,
                 "E2B: JSON file {\"name[:tag]\": [layer, ...]} (warren e2b template; read again when it changes); "
                 "template \"base\" defaults to --fncall-layers");
  app.add_option("--fncall-max-workers", flags.fncall_max_workers, "fncall: max warm workers (0 = 4 x cpus)");
  app.add_option("--fncall-layers", flags.fncall_layers,
                 "fncall: default layers of calls that name none (comma-separated, bottom first; a trailing '?' "
                 "marks a layer used only while the store has it)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--limit-views", flags.limit_views,
                 "sandboxes see their own cpu and memory limits in /proc (lxcfs): auto (when lxcfs is "
                 "installed) | on (refuse to start without it) | off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--lxcfs", flags.lxcfs_binary,
                 "the lxcfs binary of --limit-views (a name is looked up in /usr/bin, "
                 "/usr/local/bin, /bin, /usr/sbin)")
      ->capture_default_str();
  app.add_option("--suspend-swap", flags.suspend_swap,
                 "swap for suspended sandboxes: auto (set up zram when the host has no swap) | none")
      ->check(CLI::IsMember({"auto", "none"}))
      ->capture_default_str();
  app.add_option("--zram-size-mb", flags.zram_size_mb,
                 "size of the zram swap set up by --suspend-swap=auto (0 = RAM/4)");
  app.add_option("--max-staging-mb", flags.max_staging_mb,
                 "node-wide cap on what snapshots and grades copy from sandboxes at once, MiB (0 = none; "
                 "each sandbox is also bounded by its disk limit)");
  app.add_option("--suspend-prefetch", flags.suspend_prefetch,
                 "resuming a suspended sandbox prefetches its working set (true|false)")
      ->capture_default_str();
  app.add_option("--cluster", flags.cluster,
                 "join a cluster: etcd=URL[,URL...] (http[s]://HOST:PORT); needs --listen and --token-file (the "
                 "nodes call each other with that token) and a --node-id unique in the cluster");
  app.add_option("--cluster-advertise", flags.cluster_advertise,
                 "cluster: HOST:PORT the other nodes reach this one at (default: --listen)");
  app.add_option("--cluster-lease-s", flags.cluster_lease_s,
                 "cluster: etcd lease of this node's record; a node silent this long leaves placement")
      ->capture_default_str();
  app.add_option("--cluster-refresh-ms", flags.cluster_refresh_ms,
                 "cluster: rewrite this node's record and read the others' this often")
      ->capture_default_str();
  app.add_option("--cluster-drain", flags.cluster_drain, "cluster: take no new sandboxes (running ones stay)")
      ->capture_default_str();
  app.add_option("--cluster-etcd-ca", flags.cluster_etcd_ca, "cluster: CA bundle (PEM) for https etcd endpoints");
  app.add_option("--cluster-etcd-cert", flags.cluster_etcd_cert, "cluster: client certificate (PEM) for etcd");
  app.add_option("--cluster-etcd-key", flags.cluster_etcd_key, "cluster: client key (PEM) for etcd");
  app.add_option("--cluster-etcd-user", flags.cluster_etcd_user, "cluster: etcd user (etcd auth)");
  app.add_option("--metrics-listen", flags.metrics_listen,
                 "serve Prometheus metrics on http://HOST:PORT/metrics (IPv4 or [IPv6] address; plain HTTP, no "
                 "token: bind it to an address only the monitoring can reach); default: off");
  app.add_option("--cluster-etcd-password-file", flags.cluster_etcd_password_file,
                 "cluster: file holding the etcd user's password");
}

}  // namespace warren::warrend
