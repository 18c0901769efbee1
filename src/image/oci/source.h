// Where an image comes from: a registry, an OCI image layout directory, or a
// `docker save` archive. A source resolves the image for a platform to its
// manifest and config, and hands out each layer blob as a verified file.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "image/oci/manifest.h"
#include "image/oci/registry.h"

namespace warren::image::oci {

struct ResolvedImage {
  std::string digest;  // of the manifest (docker archive: of the config)
  Manifest manifest;
  ImageConfig config;
  std::string default_name;  // the name the source suggests ("" if none)
};

class ImageSource {
 public:
  virtual ~ImageSource() = default;
  // The image for `platform` ("os/arch"): descends indexes, checks the
  // config's os/architecture. FailedPrecondition naming the platforms
  // present when the image has none for `platform`.
  virtual StatusOr<ResolvedImage> Resolve(const std::string& platform) = 0;
  // A file holding layer `d`'s blob, verified against its digest and size
  // (DataLoss otherwise). Either `scratch` (a path the caller removes) or a
  // file of the source itself (left alone).
  virtual StatusOr<std::string> LayerFile(const Descriptor& d, const std::string& scratch,
                                          const ProgressFn& progress) = 0;
  // "registry 127.0.0.1:5000/a:b", "OCI layout /x", "docker archive /y".
  virtual std::string Describe() const = 0;
};

StatusOr<std::unique_ptr<ImageSource>> NewRegistrySource(const ImageRef& ref, RegistryOptions options);
// ref_name: the manifest's org.opencontainers.image.ref.name ("" = the only one).
StatusOr<std::unique_ptr<ImageSource>> NewLayoutSource(const std::string& dir, const std::string& ref_name);
// Unpacks the archive's members (regular files only) under `scratch_dir`
// (created; removed by the source's destructor).
StatusOr<std::unique_ptr<ImageSource>> NewDockerArchiveSource(const std::string& tar_path,
                                                              const std::string& scratch_dir);

// The platform check shared by sources: FailedPrecondition unless the
// config's os/architecture match `platform` (empty fields match).
Status CheckConfigPlatform(const ImageConfig& c, const std::string& platform);

}  // namespace warren::image::oci
