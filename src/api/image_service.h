// warren.v1.Images (api/warren/v1/image.proto): pull from a registry, import
// an OCI layout or a docker save archive (local callers only), get, list,
// remove; and the resolution of CreateSandboxRequest.image for creates.
//
// Thread-safe: handlers run concurrently on the server's thread pool.
#pragma once

#include <memory>
#include <string>

#include "api/service_deps.h"
#include "image/oci/image_store.h"
#include "warren/v1/image.grpc.pb.h"

namespace warren::api {

// The node's images: an image::oci::ImageStore whose layers are the node's
// layer provider's (records under <layer store>/images). Layer removal goes
// through the sandbox manager, which refuses layers in use.
class NodeImages final : public image::oci::LayerBackend {
 public:
  // Never fails: a store that cannot be opened makes every call return its
  // error.
  explicit NodeImages(node::SandboxManager* manager);

  StatusOr<image::LayerInfo> Resolve(const std::string& ref) const override;
  StatusOr<image::LayerInfo> BuildFromTar(const std::string& name, const std::string& tar_path,
                                          const image::TarProgressFn& progress) override;
  StatusOr<image::LayerInfo> BuildMerged(const std::string& name, const std::vector<std::string>& digests) override;
  Status Remove(const std::string& ref) override;
  std::vector<image::LayerInfo> List() const override;

  StatusOr<image::oci::ImageStore*> store() const;
  const std::string& tmp_dir() const { return tmp_dir_; }
  node::SandboxManager* manager() const { return manager_; }

  // A create from `image`: its layers (ImageRecord::Stack: the merged one
  // if merged) go below r->layers, its Env entries fill keys r->env lacks,
  // WorkingDir and User fill an empty workdir/user. The returned use holds
  // the layers (an image rm meanwhile keeps them): keep it until the
  // create returned (the sandbox then holds them itself).
  StatusOr<std::unique_ptr<image::oci::ImageUse>> ApplyToCreate(const std::string& image, node::CreateRequest* r) const;

 private:
  node::SandboxManager* const manager_;
  std::string tmp_dir_;
  StatusOr<std::unique_ptr<image::oci::ImageStore>> store_;
};

class ImagesService final : public warren::v1::Images::Service {
 public:
  ImagesService(ServiceDeps deps, NodeImages* images) : deps_(deps), images_(images) {}

  grpc::Status Pull(grpc::ServerContext* ctx, const warren::v1::PullImageRequest* req,
                    grpc::ServerWriter<warren::v1::ImageProgress>* writer) override;
  grpc::Status Import(grpc::ServerContext* ctx, const warren::v1::ImportImageRequest* req,
                      grpc::ServerWriter<warren::v1::ImageProgress>* writer) override;
  grpc::Status Get(grpc::ServerContext* ctx, const warren::v1::GetImageRequest* req, warren::v1::Image* resp) override;
  grpc::Status List(grpc::ServerContext* ctx, const warren::v1::ListImagesRequest* req,
                    warren::v1::ListImagesResponse* resp) override;
  grpc::Status Remove(grpc::ServerContext* ctx, const warren::v1::RemoveImageRequest* req,
                      warren::v1::Empty* resp) override;
  grpc::Status Merge(grpc::ServerContext* ctx, const warren::v1::MergeImageRequest* req,
                     grpc::ServerWriter<warren::v1::ImageProgress>* writer) override;
  grpc::Status Prune(grpc::ServerContext* ctx, const warren::v1::PruneImagesRequest* req,
                     warren::v1::PruneImagesResponse* resp) override;

 private:
  // Adds the image from `src`, streaming progress to `writer`.
  grpc::Status AddFrom(grpc::ServerContext* ctx, image::oci::ImageSource& src, const std::string& name,
                       const std::string& platform, grpc::ServerWriter<warren::v1::ImageProgress>* writer);
  void ToImage(const image::oci::ImageRecord& r, warren::v1::Image* out) const;
  // Streams progress to `writer` (at most every 200 ms per layer and phase);
  // false once the client went away.
  static image::oci::PullProgressFn ProgressWriter(grpc::ServerContext* ctx,
                                                   grpc::ServerWriter<warren::v1::ImageProgress>* writer);

  const ServiceDeps deps_;
  NodeImages* const images_;  // borrowed
};

}  // namespace warren::api
