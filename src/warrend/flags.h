// warrend's command line: every flag with its default, and their CLI11
// definitions (help texts are the flags' documentation; README.md lists
// them too).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace warren::warrend {

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
  // Admission.
  uint32_t max_sandboxes = 0;
  uint32_t max_creates_in_flight = 0;
  uint32_t max_create_queue = 0;
  std::string overcommit;  // CLASS=RATIO[,CLASS=RATIO] (node::ParseOvercommit); "" = no class counted
  // Container backend.
  int32_t warm_shells = -1;  // -1 = 2 x cpus
  uint32_t recycled_cgroups = 64;
  // Sandbox network (net/sandbox_network.h): IPv4 range, a /30 per sandbox
  // with a network; "" = none (creates asking for a network fail).
  std::string sandbox_net;
  std::vector<std::string> net_presets;  // NAME=ENTRY[,ENTRY...]
  std::string expose_host = "127.0.0.1";
  std::string expose_gateway;               // IPv4:PORT; "" = no gateway
  std::string expose_domain = "localhost";  // the gateway's names: PORT-ID.<domain>
  std::string net_dns_upstream;             // "" = the host's first nameserver; "none" = no DNS for sandboxes
  int64_t mount_grace_ms = 60000;
  // Node-local read cache of layer blobs (image/read_cache.h): 0 = none
  // (layers mounted straight from the store).
  uint64_t layer_cache_bytes = 0;
  std::string layer_cache_dir;  // "" = <state-dir>/layer-cache
  uint32_t layer_cache_chunk_kb = 64;
  bool layer_cache_prefetch = true;
  bool layer_cache_keep_metadata = true;
  bool chunked_layers = false;
  // microvm backend: offered when QEMU and <microvm_dir>/{vmlinuz,initramfs.cpio}
  // (scripts/microvm/build-guest.sh) exist.
  std::string microvm_dir = "/var/cache/warren/microvm";
  std::string microvm_accel = "auto";
  uint32_t microvm_boot_timeout_ms = 60000;
  bool microvm_templates = true;
  uint32_t microvm_pool = 2;
  // vm backend: offered when QEMU and <vm_dir>/{system.erofs,upper.img,vmlinuz,initrd.img}
  // (scripts/vm/build-guest.sh) exist; its accelerator is --microvm-accel's.
  std::string vm_dir = "/var/cache/warren/vm";
  uint32_t vm_boot_timeout_ms = 600000;
  bool vm_templates = true;
  uint32_t vm_desktop_timeout_ms = 300000;
  // fncall.
  std::string http_listen;
  uint32_t fncall_max_workers = 0;
  // A trailing '?' marks an optional layer (node/fncall_frontend.h): the
  // toolsets of the languages fncall runs, each used once the store has it,
  // so calls that cannot pick layers (a stock SandboxFusion client) get
  // every language whose toolset was built.
  std::vector<std::string> fncall_layers = {"base/debian-12", "toolset/gcc?",  "toolset/jdk?",       "toolset/go?",
                                            "toolset/rust?",  "toolset/node?", "toolset/python-sci?"};
  // /run_code (src/http/run_code_server.h).
  std::vector<std::string> run_code_layers;  // empty = fncall_layers
  std::vector<std::string> http_allowed_hosts;
  std::string http_token_file;          // "" = --token-file's token, if any
  uint32_t run_code_max_memory_mb = 0;  // 0 = min(4096, RAM/2)
  double run_code_max_timeout_s = 300;
  // E2B-compatible front end (src/e2b/server.h); "" = off.
  std::string e2b_listen;
  std::string e2b_api_keys;          // file: one key a line
  std::string e2b_templates;         // file: JSON {template id: [layer, ...]}
  uint64_t e2b_max_upload_mb = 512;  // request body limit (uploads), MiB
  // Suspend.
  std::string suspend_swap = "auto";
  std::string limit_views = "auto";  // auto | on | off (lxcfs)
  std::string lxcfs_binary = "lxcfs";
  uint64_t zram_size_mb = 0;
  bool suspend_prefetch = true;
  uint64_t max_staging_mb = 0;
  // Cluster (src/cluster): "etcd=URL[,URL...]"; "" = a single node.
  std::string cluster;
  std::string cluster_advertise;  // HOST:PORT; "" = --listen's (its host must not be 0.0.0.0)
  int64_t cluster_lease_s = 10;
  uint32_t cluster_refresh_ms = 2000;
  bool cluster_drain = false;
  std::string cluster_etcd_ca, cluster_etcd_cert, cluster_etcd_key;
  std::string cluster_etcd_user, cluster_etcd_password_file;
  // Prometheus /metrics (src/metrics) on HOST:PORT; "" = off.
  std::string metrics_listen;
};

// Defines every flag on `app`, bound to the fields of `flags` (which must
// outlive the parse).
void AddFlags(CLI::App& app, Flags& flags);

}  // namespace warren::warrend
