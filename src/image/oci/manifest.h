// OCI image index / manifest / config documents (image-spec v1, and the
// Docker v2 schema 2 equivalents), parsed with nlohmann::json. Every parser
// returns InvalidArgument naming the document and the field that is wrong.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace warren::image::oci {

inline constexpr std::string_view kOciIndex = "application/vnd.oci.image.index.v1+json";
inline constexpr std::string_view kOciManifest = "application/vnd.oci.image.manifest.v1+json";
inline constexpr std::string_view kDockerList = "application/vnd.docker.distribution.manifest.list.v2+json";
inline constexpr std::string_view kDockerManifest = "application/vnd.docker.distribution.manifest.v2+json";
inline constexpr std::string_view kDefaultPlatform = "linux/amd64";

struct Descriptor {
  std::string media_type;
  std::string digest;  // checked "sha256:<hex>"
  int64_t size = -1;
  std::string platform;  // "os/arch[/variant]" (index entries), empty if none
  std::string ref_name;  // org.opencontainers.image.ref.name annotation
};

struct Manifest {
  Descriptor config;
  std::vector<Descriptor> layers;  // bottom first
};

// The parts of an image config a create uses, plus its platform.
struct ImageConfig {
  std::vector<std::string> env;  // "KEY=VALUE"
  std::string workdir;
  std::string user;
  std::vector<std::string> entrypoint;
  std::vector<std::string> cmd;
  std::vector<std::string> exposed_ports;
  std::string os;
  std::string architecture;
};

// True if the document is an index / manifest list (by its mediaType, else
// the Content-Type it came with, else by having "manifests").
StatusOr<bool> IsIndex(std::string_view body, std::string_view content_type);
StatusOr<std::vector<Descriptor>> ParseIndex(std::string_view body);
StatusOr<Manifest> ParseManifest(std::string_view body);
StatusOr<ImageConfig> ParseConfig(std::string_view body);

// The entry of an index for `platform` ("os/arch"; a "/variant" of the
// entry is ignored) and, if `ref_name` is set, with that ref name. An entry
// without a platform matches any platform only when it is the only
// candidate. FailedPrecondition listing the platforms present when none
// matches; nested indexes are returned as they are (the caller descends).
StatusOr<Descriptor> SelectFromIndex(const std::vector<Descriptor>& entries, std::string_view platform,
                                     std::string_view ref_name);

// InvalidArgument unless a layer of this media type can be converted (a
// plain, gzip or zstd tar; not encrypted or foreign).
Status CheckLayerMediaType(std::string_view media_type, std::string_view digest);

// The Accept header value of manifest requests.
std::string ManifestAccept();

}  // namespace warren::image::oci
