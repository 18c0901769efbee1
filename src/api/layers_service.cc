#include "api/layers_service.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <vector>

#include "api/convert.h"
#include "api/forward.h"
#include "api/projects.h"
#include "api/status_map.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/unique_fd.h"

namespace warren::api {

namespace v1 = ::warren::v1;

void LayersService::ToLayer(const image::LayerInfo& li, v1::Layer* out) const {
  ToProto(li, out);
  out->set_in_use(deps_.manager->LayerUsers(li.digest));
  out->set_mounted(deps_.manager->layers().IsMounted(li.digest));
}

grpc::Status LayersService::Build(grpc::ServerContext* ctx, grpc::ServerReader<v1::BuildLayerRequest>* reader,
                                  v1::Layer* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(RequireEveryProject(deps_, *ctx, "layer build (layers are node-wide)"));
  v1::BuildLayerRequest msg;
  if (!reader->Read(&msg)) return Invalid("empty stream: the first message must carry the name");
  if (msg.name().empty()) return Invalid("name is empty");
  const std::string name = msg.name();
  node::LayerProvider& layers = deps_.manager->layers();
  if (!msg.source_dir().empty()) {
    RETURN_IF_GRPC_ERROR(Authorizer::RequireLocal(*ctx, "source_dir builds are accepted only over the unix socket"));
    if (msg.source_dir()[0] != '/') {
      return Invalid("source_dir=" + Quote(msg.source_dir()) + " must be an absolute path");
    }
    if (!msg.tar_chunk().empty()) return Invalid("give either source_dir or tar_chunk, not both");
    ASSIGN_OR_RETURN_GRPC(image::LayerInfo li, layers.BuildFromDir(name, msg.source_dir()));
    warren::Log(spdlog::level::info, "layer built",
                {{"layer", name}, {"digest", li.digest}, {"from", msg.source_dir()}});
    ToLayer(li, resp);
    return grpc::Status::OK;
  }
  // Spool the tar next to the store (same file system, no copy of a huge
  // upload into memory); removed whatever happens.
  std::string dir = layers.TmpDir();
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ToGrpcStatus(ErrnoToStatus(errno, "mkdir(" + dir + ")"));
  }
  std::string path = dir + "/upload-XXXXXX";
  UniqueFd fd(::mkostemp(path.data(), O_CLOEXEC));
  if (!fd.valid()) return ToGrpcStatus(ErrnoToStatus(errno, "mkostemp(" + path + ")"));
  struct Unlink {
    std::string p;
    ~Unlink() { ::unlink(p.c_str()); }
  } unlink_guard{path};
  uint64_t total = 0;
  do {
    if (!msg.source_dir().empty()) return Invalid("source_dir is only allowed in the first message");
    RETURN_IF_GRPC_ERROR(ToGrpcStatus(WriteAll(fd.get(), msg.tar_chunk(), path)));
    total += msg.tar_chunk().size();
  } while (reader->Read(&msg));
  if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "upload cancelled");
  if (total == 0) return Invalid("no tar data and no source_dir");
  fd.reset();
  ASSIGN_OR_RETURN_GRPC(image::LayerInfo li, layers.BuildFromTar(name, path));
  warren::Log(spdlog::level::info, "layer built",
              {{"layer", name}, {"digest", li.digest}, {"tar_bytes", std::to_string(total)}});
  ToLayer(li, resp);
  return grpc::Status::OK;
}

grpc::Status LayersService::Get(grpc::ServerContext* ctx, const v1::GetLayerRequest* req, v1::Layer* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  if (req->ref().empty()) return Invalid("ref is empty");
  ASSIGN_OR_RETURN_GRPC(image::LayerInfo li, deps_.manager->layers().Resolve(req->ref()));
  // Another project's layer is answered as one that does not exist.
  if (!LayerVisible(deps_.auth->Project(*ctx), li.projects)) {
    return {grpc::StatusCode::NOT_FOUND, "layer " + req->ref() + " not found"};
  }
  ToLayer(li, resp);
  // In a cluster the nodes share the layer store: in use and mounted on any node.
  v1::GetLayerRequest by_digest;
  by_digest.set_ref(li.digest);
  std::vector<v1::Layer> peers;
  RETURN_IF_GRPC_ERROR(FanOut<v1::Layers>(deps_.forward, *ctx, &peers, [&](auto& s, auto* c, auto* r) {
    grpc::Status g = s.Get(c, by_digest, r);
    return g.error_code() == grpc::StatusCode::NOT_FOUND ? grpc::Status::OK : g;  // a store of its own
  }));
  for (const v1::Layer& p : peers) {
    if (p.digest() != li.digest) continue;
    resp->set_in_use(resp->in_use() + p.in_use());
    resp->set_mounted(resp->mounted() || p.mounted());
  }
  return grpc::Status::OK;
}

grpc::Status LayersService::List(grpc::ServerContext* ctx, const v1::ListLayersRequest*, v1::ListLayersResponse* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  const std::string project = deps_.auth->Project(*ctx);
  for (const auto& li : deps_.manager->layers().List()) {
    if (LayerVisible(project, li.projects)) ToLayer(li, resp->add_layers());
  }
  // In a cluster: in use and mounted on any node (the store is shared).
  std::vector<v1::ListLayersResponse> peers;
  RETURN_IF_GRPC_ERROR(FanOut<v1::Layers>(
      deps_.forward, *ctx, &peers, [&](auto& s, auto* c, auto* r) { return s.List(c, v1::ListLayersRequest(), r); }));
  std::map<std::string, v1::Layer*> by_digest;
  for (v1::Layer& l : *resp->mutable_layers()) by_digest[l.digest()] = &l;
  for (const v1::ListLayersResponse& p : peers) {
    for (const v1::Layer& l : p.layers()) {
      auto it = by_digest.find(l.digest());
      if (it == by_digest.end()) continue;
      it->second->set_in_use(it->second->in_use() + l.in_use());
      it->second->set_mounted(it->second->mounted() || l.mounted());
    }
  }
  return grpc::Status::OK;
}

grpc::Status LayersService::Remove(grpc::ServerContext* ctx, const v1::RemoveLayerRequest* req, v1::Empty*) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  if (req->ref().empty()) return Invalid("ref is empty");
  // In a cluster the store is shared: a layer a sandbox of another node uses
  // is refused as a local one is (each node counts only its own sandboxes).
  // The counts miss a create on another node between its resolve and its
  // mount: the store's blob locks cover that window (LayerStore::Remove
  // write-locks the blob; a node read-locks it before it mounts: HoldBlob).
  ASSIGN_OR_RETURN_GRPC(image::LayerInfo li, deps_.manager->layers().Resolve(req->ref()));
  // A project removes the layers that are its own alone (every owner in
  // its scope); the operators' and those it shares are the operators'.
  if (const std::string project = deps_.auth->Project(*ctx); !project.empty()) {
    if (!LayerVisible(project, li.projects)) {
      return {grpc::StatusCode::NOT_FOUND, "layer " + req->ref() + " not found"};
    }
    const bool own = !li.projects.empty() && std::all_of(li.projects.begin(), li.projects.end(),
                                                         [&](const std::string& o) { return InProject(project, o); });
    if (!own) RETURN_IF_GRPC_ERROR(RequireEveryProject(deps_, *ctx, "layer rm of a layer every project sees"));
  }
  v1::GetLayerRequest by_digest;
  by_digest.set_ref(li.digest);
  std::vector<v1::Layer> peers;
  RETURN_IF_GRPC_ERROR(FanOut<v1::Layers>(deps_.forward, *ctx, &peers, [&](auto& s, auto* c, auto* r) {
    grpc::Status g = s.Get(c, by_digest, r);
    return g.error_code() == grpc::StatusCode::NOT_FOUND ? grpc::Status::OK : g;
  }));
  uint32_t users = 0;
  for (const v1::Layer& p : peers) users += p.digest() == li.digest ? p.in_use() : 0;
  if (users > 0) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "layer " + req->ref() + " (" + li.digest +
                                                                   ") is in use by " + std::to_string(users) +
                                                                   " sandbox(es) on other nodes");
  }
  return ToGrpcStatus(deps_.manager->RemoveLayer(req->ref()));
}

}  // namespace warren::api
