#include "api/services.h"

#include <sys/stat.h>

#include <cerrno>

#include "api/desktop_service.h"
#include "api/files_service.h"
#include "api/image_service.h"
#include "api/layers_service.h"
#include "api/lifecycle_service.h"
#include "api/processes_service.h"
#include "api/projects_service.h"
#include "api/sandboxes_service.h"

namespace warren::api {

struct WarrenServices::Holder {
  Holder(node::SandboxManager* m, ServiceOptions o)
      : auth(std::move(o.token), o.projects),
        node_images(m),
        sandboxes(ServiceDeps{m, &auth, &node_images, o.forward}),
        files(ServiceDeps{m, &auth, nullptr, o.forward}),
        layers(ServiceDeps{m, &auth, nullptr, o.forward}),
        node(ServiceDeps{m, &auth, nullptr, o.forward}, std::move(o.facts), std::move(o.extra_backends), o.members),
        lifecycle(ServiceDeps{m, &auth, nullptr, o.forward}),
        processes(ServiceDeps{m, &auth, nullptr, o.forward}),
        images(ServiceDeps{m, &auth, nullptr, o.forward}, &node_images),
        desktop(ServiceDeps{m, &auth, nullptr, o.forward}),
        projects(ServiceDeps{m, &auth, nullptr, o.forward}) {}
  const Authorizer auth;   // before the services, which borrow it
  NodeImages node_images;  // likewise
  SandboxesService sandboxes;
  FilesService files;
  LayersService layers;
  NodeService node;
  LifecycleService lifecycle;
  ProcessesService processes;
  ImagesService images;
  DesktopService desktop;
  ProjectsService projects;
};

WarrenServices::WarrenServices(node::SandboxManager* manager, ServiceOptions options)
    : holder_(std::make_unique<Holder>(manager, std::move(options))) {}

WarrenServices::~WarrenServices() = default;

std::vector<grpc::Service*> WarrenServices::services() {
  return {&holder_->sandboxes, &holder_->files,  &holder_->layers,  &holder_->node,    &holder_->lifecycle,
          &holder_->processes, &holder_->images, &holder_->desktop, &holder_->projects};
}

StatusOr<std::unique_ptr<grpc::Server>> StartServer(const ServerOptions& options, WarrenServices& services,
                                                    int* tcp_port, const std::vector<grpc::Service*>& extra) {
  grpc::ServerBuilder builder;
  if (!options.unix_socket.empty()) {
    builder.AddListeningPort("unix:" + options.unix_socket, grpc::InsecureServerCredentials());
  }
  if (!options.tcp_listen.empty()) {
    builder.AddListeningPort(options.tcp_listen, grpc::InsecureServerCredentials(), tcp_port);
  }
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // Execs block a handler thread for their duration: allow many threads so
  // hundreds of long execs do not starve short calls.
  grpc::ResourceQuota quota("warrend");
  quota.SetMaxThreads(options.max_threads);
  builder.SetResourceQuota(quota);
  // Idle handler threads kept after a burst: with 16, a cluster entry
  // relaying ~100 concurrent creates spent a fifth of its CPU making and
  // ending threads (bench/cluster/bench_scale.py, RESULTS 2026-12-03); the
  // ones beyond 64 still exit. An idle one wakes once per CQ timeout (10 s).
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 2);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 64);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  for (grpc::Service* s : services.services()) builder.RegisterService(s);
  for (grpc::Service* s : extra) builder.RegisterService(s);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    return absl::UnavailableError("gRPC server failed to start on unix:" + options.unix_socket +
                                  (options.tcp_listen.empty() ? "" : " and " + options.tcp_listen) +
                                  " (address in use or not permitted?)");
  }
  if (!options.tcp_listen.empty() && tcp_port != nullptr && *tcp_port == 0) {
    server->Shutdown();
    return absl::UnavailableError("could not listen on " + options.tcp_listen);
  }
  if (!options.unix_socket.empty() && ::chmod(options.unix_socket.c_str(), 0660) != 0) {
    Status s = ErrnoToStatus(errno, "chmod(" + options.unix_socket + ")");
    server->Shutdown();
    return s;
  }
  return server;
}

}  // namespace warren::api
