// warren create: make a sandbox; prints its id (or the Sandbox as JSON).
#include <iostream>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/output.h"

namespace warren::cli {
namespace {

int RunCreate(Invocation& inv) {
  StatusOr<v1::CreateSandboxRequest> req = BuildCreateRequest(inv.create);
  if (!req.ok()) return UsageError(req.status());
  Client client(inv.global);
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::Sandbox sandbox;
  Status st = FromGrpc(client.sandboxes().Create(&ctx, *req, &sandbox));
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  if (inv.global.json) {
    PrintJson(SandboxToJson(sandbox));
  } else {
    std::cout << sandbox.id() << std::endl;
  }
  return kExitOk;
}

}  // namespace

StatusOr<v1::CreateSandboxRequest> BuildCreateRequest(const CreateArgs& a) {
  v1::CreateSandboxRequest req;
  req.set_backend(a.backend);
  for (const std::string& layer : a.layers) {
    if (layer.empty()) return absl::InvalidArgumentError("--layer must not be empty");
    req.add_layers(layer);
  }
  req.set_image(a.image);
  v1::Resources* r = req.mutable_resources();
  r->set_cpu_millis(a.cpu_millis);
  r->set_memory_mb(a.memory_mb);
  r->set_disk_mb(a.disk_mb);
  r->set_pids(a.pids);
  r->set_open_files(a.open_files);
  r->set_tmpfs_mb(a.tmpfs_mb);
  for (const std::string& kv : a.env) {
    ASSIGN_OR_RETURN(auto p, ParseKeyValue(kv, "--env"));
    (*req.mutable_env())[p.first] = p.second;
  }
  for (const std::string& kv : a.labels) {
    ASSIGN_OR_RETURN(auto p, ParseKeyValue(kv, "--label"));
    (*req.mutable_labels())[p.first] = p.second;
  }
  req.set_workdir(a.workdir);
  req.set_user(a.user);
  req.set_hostname(a.hostname);
  req.set_ttl_s(a.ttl_s);
  req.set_job(a.job);
  req.set_qos(a.qos);
  if (a.network || !a.net_allow.empty() || !a.net_deny.empty()) {
    v1::NetworkPolicy* n = req.mutable_network();
    for (const std::string& e : a.net_allow) n->add_allow(e);
    for (const std::string& e : a.net_deny) n->add_deny(e);
  }
  req.set_start(a.start);
  for (const std::string& c : a.command) req.add_command(c);
  for (uint32_t p : a.expose) req.add_expose(p);
  req.set_expose_image_ports(a.expose_image_ports);
  return req;
}

void AddCreateCommand(CLI::App& root, Invocation& inv) {
  CreateArgs& a = inv.create;
  CLI::App* sub = root.add_subcommand("create", "Create a sandbox; prints its id (--json: the Sandbox).");
  sub->fallthrough();
  sub->add_option("--backend", a.backend, "isolation backend")->capture_default_str();
  sub->add_option("--image", a.image, "image name:tag (warren image ls); its layers go below --layer's");
  sub->add_option("--layer", a.layers, "layer ref kind/name[@version] or sha256:<hex>; repeatable, bottom first")
      ->allow_extra_args(false);
  sub->add_option("--cpu", a.cpu_millis, "CPU in millicores (1000 = one core); 0 = default");
  sub->add_option("--memory", a.memory_mb, "memory limit in MiB; 0 = default");
  sub->add_option("--disk", a.disk_mb, "writable layer size cap in MiB; 0 = default");
  sub->add_option("--pids", a.pids, "max tasks; 0 = default");
  sub->add_option("--open-files", a.open_files, "RLIMIT_NOFILE; 0 = default");
  sub->add_option("--tmpfs", a.tmpfs_mb,
                  "/dev/shm cap in MiB (/tmp lives in the upper, capped by --disk); 0 = default");
  sub->add_option("--env", a.env, "K=V environment of every exec; repeatable")->allow_extra_args(false);
  sub->add_option("--workdir", a.workdir, "default working directory of execs");
  sub->add_option("--user", a.user, "default user of execs: root, a name, or uid[:gid]");
  sub->add_option("--hostname", a.hostname, "hostname inside the sandbox");
  sub->add_option("--label", a.labels, "K=V label; repeatable")->allow_extra_args(false);
  sub->add_option("--ttl", a.ttl_s, "seconds until the node destroys it; 0 = none");
  sub->add_option("--job", a.job, "owning job");
  sub->add_option("--qos", a.qos,
                  "QoS class: latency (default) or best-effort (SCHED_IDLE, lowest cpu weight, memory reclaimed "
                  "first; admitted against warrend --overcommit's best-effort ratio)");
  sub->add_flag("--network", a.network,
                "a network link (routed, NAT'ed) that reaches only what --net-allow allows; default: loopback only");
  sub->add_option("--net-allow", a.net_allow,
                  "egress allowed: [tcp:|udp:|icmp:]CIDR[:PORT[-PORT]]; repeatable (implies --network)")
      ->allow_extra_args(false);
  sub->add_option("--net-deny", a.net_deny, "egress denied (wins over --net-allow); repeatable")
      ->allow_extra_args(false);
  sub->add_flag("--start", a.start,
                "start a main process (docker run -d): the image's Entrypoint + Cmd, or + the command after --");
  sub->add_option("--expose", a.expose, "port exposed at create (see warren expose); repeatable")
      ->allow_extra_args(false);
  sub->add_flag("--expose-image-ports", a.expose_image_ports, "also expose the image's TCP ExposedPorts (docker -P)");
  sub->add_option("command", a.command,
                  "after --: the main process's arguments (replace the image's Cmd; imply --start)");
  sub->callback([&inv] {
    inv.verb = "create";
    inv.run = RunCreate;
  });
}

}  // namespace warren::cli
