#include "api/image_service.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>

#include "api/convert.h"
#include "api/projects.h"
#include "api/status_map.h"
#include "common/log.h"
#include "image/fs_util.h"

namespace warren::api {
namespace {

namespace v1 = ::warren::v1;
namespace oci = ::warren::image::oci;

// Fetch progress is sent at most this often (phase changes always).
constexpr auto kProgressInterval = std::chrono::milliseconds(200);

}  // namespace

NodeImages::NodeImages(node::SandboxManager* manager)
    : manager_(manager), tmp_dir_(manager->layers().TmpDir()), store_(absl::UnknownError("unset")) {
  const std::string store_dir = tmp_dir_.substr(0, tmp_dir_.rfind('/'));
  store_ = oci::ImageStore::Open(store_dir + "/images", tmp_dir_, this);
  if (!store_.ok()) {
    warren::Log(spdlog::level::warn, "image store unavailable", {{"error", store_.status().ToString()}});
  }
}

StatusOr<image::LayerInfo> NodeImages::Resolve(const std::string& ref) const { return manager_->layers().Resolve(ref); }
StatusOr<image::LayerInfo> NodeImages::BuildFromTar(const std::string& name, const std::string& tar_path,
                                                    const image::TarProgressFn& progress) {
  return manager_->layers().BuildFromTarWithProgress(name, tar_path, progress);
}
StatusOr<image::LayerInfo> NodeImages::BuildMerged(const std::string& name, const std::vector<std::string>& digests) {
  return manager_->layers().BuildMerged(name, digests);
}
Status NodeImages::Remove(const std::string& ref) { return manager_->RemoveLayer(ref); }
std::vector<image::LayerInfo> NodeImages::List() const { return manager_->layers().List(); }

StatusOr<oci::ImageStore*> NodeImages::store() const {
  if (!store_.ok()) return store_.status();
  return store_->get();
}

StatusOr<std::unique_ptr<oci::ImageUse>> NodeImages::ApplyToCreate(const std::string& image,
                                                                   node::CreateRequest* r) const {
  ASSIGN_OR_RETURN(oci::ImageStore * store, store());
  ASSIGN_OR_RETURN(std::unique_ptr<oci::ImageUse> use, store->Use(image));
  const oci::ImageRecord& rec = use->record();
  std::vector<std::string> layers;
  layers.reserve(rec.layers.size() + r->layers.size());
  for (const oci::ImageLayerRef& l : rec.Stack()) layers.push_back(l.layer_name);
  layers.insert(layers.end(), r->layers.begin(), r->layers.end());
  r->layers = std::move(layers);
  for (const std::string& kv : rec.config.env) {
    const size_t eq = kv.find('=');
    if (eq == 0 || eq == std::string::npos) continue;     // not KEY=VALUE: no default to give
    r->env.emplace(kv.substr(0, eq), kv.substr(eq + 1));  // the request's value wins
  }
  if (r->workdir.empty()) r->workdir = rec.config.workdir;
  if (r->user.empty()) r->user = rec.config.user;
  return use;
}

void ImagesService::ToImage(const oci::ImageRecord& r, v1::Image* out) const {
  out->set_name(r.name);
  out->set_digest(r.digest);
  out->set_created_at_ns(r.created_at_ns);
  out->set_source(r.source);
  uint32_t in_use = 0;
  auto fill = [&](const oci::ImageLayerRef& l, v1::ImageLayer* pl) {
    pl->set_digest(l.oci_digest);
    pl->set_layer(l.layer_digest);
    pl->set_layer_name(l.layer_name);
    pl->set_size_bytes(l.size_bytes);
    in_use = std::max(in_use, deps_.manager->LayerUsers(l.layer_digest));
  };
  for (const oci::ImageLayerRef& l : r.layers) fill(l, out->add_layers());
  if (r.merged_count > 0) {
    fill(r.merged, out->mutable_merged());
    out->set_merged_count(r.merged_count);
  }
  out->set_in_use(in_use);
  v1::ImageConfig* c = out->mutable_config();
  for (const auto& e : r.config.env) c->add_env(e);
  c->set_workdir(r.config.workdir);
  c->set_user(r.config.user);
  for (const auto& e : r.config.entrypoint) c->add_entrypoint(e);
  for (const auto& e : r.config.cmd) c->add_cmd(e);
  for (const auto& e : r.config.exposed_ports) c->add_exposed_ports(e);
}

grpc::Status ImagesService::AddFrom(grpc::ServerContext* ctx, oci::ImageSource& src, const std::string& name,
                                    const std::string& platform, grpc::ServerWriter<v1::ImageProgress>* writer) {
  ASSIGN_OR_RETURN_GRPC(oci::ImageStore * store, images_->store());
  auto progress = ProgressWriter(ctx, writer);
  const auto start = std::chrono::steady_clock::now();
  StatusOr<oci::ImageRecord> rec = store->Add(src, name, platform, progress);
  if (!rec.ok()) {
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "image pull cancelled by the client");
    return ToGrpcStatus(rec.status());
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  warren::Log(spdlog::level::info, "image added",
              {{"image", rec->name},
               {"from", src.Describe()},
               {"layers", std::to_string(rec->layers.size())},
               {"ms", std::to_string(ms.count())}});
  v1::ImageProgress last;
  ToImage(*rec, last.mutable_image());
  writer->Write(last);
  return grpc::Status::OK;
}

oci::PullProgressFn ImagesService::ProgressWriter(grpc::ServerContext* ctx,
                                                  grpc::ServerWriter<v1::ImageProgress>* writer) {
  auto last_phase = std::make_shared<std::string>();
  auto last_sent = std::make_shared<std::chrono::steady_clock::time_point>();
  return [ctx, writer, last_phase, last_sent](const oci::PullProgress& p) {
    if (ctx->IsCancelled()) return false;
    const auto now = std::chrono::steady_clock::now();
    const std::string key = p.layer_digest + p.phase;
    if (key == *last_phase && now - *last_sent < kProgressInterval) return true;
    *last_phase = key;
    *last_sent = now;
    v1::ImageProgress m;
    m.set_layer_digest(p.layer_digest);
    m.set_layer_index(p.layer_index);
    m.set_layer_count(p.layer_count);
    m.set_phase(p.phase);
    m.set_bytes_done(p.bytes_done);
    m.set_bytes_total(p.bytes_total);
    return writer->Write(m);  // false: the client went away
  };
}

grpc::Status ImagesService::Pull(grpc::ServerContext* ctx, const v1::PullImageRequest* req,
                                 grpc::ServerWriter<v1::ImageProgress>* writer) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(RequireEveryProject(deps_, *ctx, "image pull (images are node-wide)"));
  ASSIGN_OR_RETURN_GRPC(oci::ImageRef ref, oci::ImageRef::Parse(req->ref()));
  oci::RegistryOptions opt;
  // Loopback registries speak http:// unless a CA file asks for TLS.
  opt.plain_http = req->plain_http() || (oci::IsLoopbackHost(ref.host) && req->ca_file().empty());
  opt.ca_file = req->ca_file();
  if (!opt.ca_file.empty() && opt.ca_file[0] != '/') {
    return Invalid("ca_file=" + Quote(opt.ca_file) + " must be an absolute path");
  }
  opt.username = req->auth().username();
  opt.password = req->auth().password();
  opt.bearer_token = req->auth().bearer_token();
  opt.stall_timeout_s = req->stall_timeout_s() == 0 ? 30 : std::min<uint32_t>(req->stall_timeout_s(), 3600);
  ASSIGN_OR_RETURN_GRPC(std::unique_ptr<oci::ImageSource> src, oci::NewRegistrySource(ref, opt));
  return AddFrom(ctx, *src, req->name(), req->platform(), writer);
}

grpc::Status ImagesService::Import(grpc::ServerContext* ctx, const v1::ImportImageRequest* req,
                                   grpc::ServerWriter<v1::ImageProgress>* writer) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(RequireEveryProject(deps_, *ctx, "image import (images are node-wide)"));
  RETURN_IF_GRPC_ERROR(Authorizer::RequireLocal(*ctx, "image imports read the node's files: unix socket only"));
  const std::string& path = req->path();
  if (path.empty() || path[0] != '/') return Invalid("path=" + Quote(path) + " must be an absolute path");
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ToGrpcStatus(ErrnoToStatus(errno, "stat(" + path + ")"));
  std::unique_ptr<oci::ImageSource> src;
  if (S_ISDIR(st.st_mode)) {
    ASSIGN_OR_RETURN_GRPC(src, oci::NewLayoutSource(path, req->ref_name()));
  } else if (S_ISREG(st.st_mode)) {
    if (!req->ref_name().empty()) return Invalid("ref_name selects a manifest of an OCI layout, not of an archive");
    ASSIGN_OR_RETURN_GRPC(src,
                          oci::NewDockerArchiveSource(path, images_->tmp_dir() + "/import-" + image::UniqueSuffix()));
  } else {
    return Invalid("path=" + Quote(path) + " is neither an OCI layout directory nor an archive file");
  }
  return AddFrom(ctx, *src, req->name(), req->platform(), writer);
}

grpc::Status ImagesService::Get(grpc::ServerContext* ctx, const v1::GetImageRequest* req, v1::Image* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  ASSIGN_OR_RETURN_GRPC(oci::ImageStore * store, images_->store());
  ASSIGN_OR_RETURN_GRPC(oci::ImageRecord rec, store->Get(req->name()));
  ToImage(rec, resp);
  return grpc::Status::OK;
}

grpc::Status ImagesService::List(grpc::ServerContext* ctx, const v1::ListImagesRequest*, v1::ListImagesResponse* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  ASSIGN_OR_RETURN_GRPC(oci::ImageStore * store, images_->store());
  for (const oci::ImageRecord& r : store->List()) ToImage(r, resp->add_images());
  return grpc::Status::OK;
}

grpc::Status ImagesService::Remove(grpc::ServerContext* ctx, const v1::RemoveImageRequest* req, v1::Empty*) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(RequireEveryProject(deps_, *ctx, "image rm (images are node-wide)"));
  ASSIGN_OR_RETURN_GRPC(oci::ImageStore * store, images_->store());
  node::SandboxManager* m = deps_.manager;
  return ToGrpcStatus(store->Remove(req->name(), [m](const std::string& d) { return m->LayerUsers(d) > 0; }));
}

grpc::Status ImagesService::Merge(grpc::ServerContext* ctx, const v1::MergeImageRequest* req,
                                  grpc::ServerWriter<v1::ImageProgress>* writer) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(RequireEveryProject(deps_, *ctx, "image merge (images are node-wide)"));
  ASSIGN_OR_RETURN_GRPC(oci::ImageStore * store, images_->store());
  const uint64_t cap = req->max_bytes() == 0 ? uint64_t{3} << 30 : req->max_bytes();
  const auto start = std::chrono::steady_clock::now();
  StatusOr<oci::ImageRecord> rec = store->Merge(req->name(), req->include_top(), cap, ProgressWriter(ctx, writer));
  if (!rec.ok()) {
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "image merge cancelled by the client");
    return ToGrpcStatus(rec.status());
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  warren::Log(spdlog::level::info, "image merged",
              {{"image", rec->name},
               {"layer", rec->merged.layer_name},
               {"count", std::to_string(rec->merged_count)},
               {"ms", std::to_string(ms.count())}});
  v1::ImageProgress last;
  ToImage(*rec, last.mutable_image());
  writer->Write(last);
  return grpc::Status::OK;
}

grpc::Status ImagesService::Prune(grpc::ServerContext* ctx, const v1::PruneImagesRequest*,
                                  v1::PruneImagesResponse* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(RequireEveryProject(deps_, *ctx, "image prune (images are node-wide)"));
  ASSIGN_OR_RETURN_GRPC(oci::ImageStore * store, images_->store());
  node::SandboxManager* m = deps_.manager;
  ASSIGN_OR_RETURN_GRPC(oci::ImageStore::GcResult r,
                        store->CollectGarbage([m](const std::string& d) { return m->LayerUsers(d) > 0; }));
  for (const std::string& n : r.removed) resp->add_removed(n);
  resp->set_bytes_freed(r.bytes);
  return grpc::Status::OK;
}

}  // namespace warren::api
