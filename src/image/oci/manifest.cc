#include "image/oci/manifest.h"

#include <nlohmann/json.hpp>

#include "image/oci/digest.h"

namespace warren::image::oci {
namespace {

using nlohmann::json;

StatusOr<json> ParseJson(std::string_view body, std::string_view what) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(std::string(what) + " is not a JSON object");
  }
  return j;
}

std::string Str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

StatusOr<Descriptor> ParseDescriptor(const json& j, std::string_view what) {
  if (!j.is_object()) return absl::InvalidArgumentError(std::string(what) + " is not an object");
  Descriptor d;
  d.media_type = Str(j, "mediaType");
  d.digest = Str(j, "digest");
  RETURN_IF_ERROR(CheckDigest(d.digest, what));
  auto size = j.find("size");
  if (size == j.end() || !size->is_number_integer() || size->get<int64_t>() < 0) {
    return absl::InvalidArgumentError(std::string(what) + " (" + d.digest + "): size missing or negative");
  }
  d.size = size->get<int64_t>();
  if (auto p = j.find("platform"); p != j.end() && p->is_object()) {
    d.platform = Str(*p, "os") + "/" + Str(*p, "architecture");
    if (std::string v = Str(*p, "variant"); !v.empty()) d.platform += "/" + v;
  }
  if (auto a = j.find("annotations"); a != j.end() && a->is_object()) {
    d.ref_name = Str(*a, "org.opencontainers.image.ref.name");
  }
  return d;
}

std::vector<std::string> Strings(const json& j, const char* key) {
  std::vector<std::string> out;
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return out;
  for (const json& e : *it) {
    if (e.is_string()) out.push_back(e.get<std::string>());
  }
  return out;
}

}  // namespace

StatusOr<bool> IsIndex(std::string_view body, std::string_view content_type) {
  ASSIGN_OR_RETURN(json j, ParseJson(body, "manifest"));
  std::string mt = Str(j, "mediaType");
  if (mt.empty()) mt = std::string(content_type.substr(0, content_type.find(';')));
  if (mt == kOciIndex || mt == kDockerList) return true;
  if (mt == kOciManifest || mt == kDockerManifest) return false;
  if (j.contains("manifests")) return true;
  if (j.contains("layers")) return false;
  return absl::InvalidArgumentError("manifest of media type \"" + mt +
                                    "\" is neither an OCI/Docker image manifest nor an index");
}

StatusOr<std::vector<Descriptor>> ParseIndex(std::string_view body) {
  ASSIGN_OR_RETURN(json j, ParseJson(body, "image index"));
  auto m = j.find("manifests");
  if (m == j.end() || !m->is_array()) return absl::InvalidArgumentError("image index: \"manifests\" is not an array");
  std::vector<Descriptor> out;
  for (size_t i = 0; i < m->size(); ++i) {
    ASSIGN_OR_RETURN(Descriptor d, ParseDescriptor((*m)[i], "image index manifests[" + std::to_string(i) + "]"));
    out.push_back(std::move(d));
  }
  return out;
}

StatusOr<Manifest> ParseManifest(std::string_view body) {
  ASSIGN_OR_RETURN(json j, ParseJson(body, "image manifest"));
  Manifest m;
  auto c = j.find("config");
  if (c == j.end()) return absl::InvalidArgumentError("image manifest: no \"config\"");
  ASSIGN_OR_RETURN(m.config, ParseDescriptor(*c, "image manifest config"));
  auto l = j.find("layers");
  if (l == j.end() || !l->is_array()) return absl::InvalidArgumentError("image manifest: \"layers\" is not an array");
  for (size_t i = 0; i < l->size(); ++i) {
    ASSIGN_OR_RETURN(Descriptor d, ParseDescriptor((*l)[i], "image manifest layers[" + std::to_string(i) + "]"));
    m.layers.push_back(std::move(d));
  }
  return m;
}

StatusOr<ImageConfig> ParseConfig(std::string_view body) {
  ASSIGN_OR_RETURN(json j, ParseJson(body, "image config"));
  ImageConfig c;
  c.os = Str(j, "os");
  c.architecture = Str(j, "architecture");
  auto cfg = j.find("config");
  if (cfg == j.end() || !cfg->is_object()) return c;  // a config without defaults
  c.env = Strings(*cfg, "Env");
  c.workdir = Str(*cfg, "WorkingDir");
  c.user = Str(*cfg, "User");
  c.entrypoint = Strings(*cfg, "Entrypoint");
  c.cmd = Strings(*cfg, "Cmd");
  if (auto p = cfg->find("ExposedPorts"); p != cfg->end() && p->is_object()) {
    for (auto it = p->begin(); it != p->end(); ++it) c.exposed_ports.push_back(it.key());
  }
  return c;
}

StatusOr<Descriptor> SelectFromIndex(const std::vector<Descriptor>& entries, std::string_view platform,
                                     std::string_view ref_name) {
  std::vector<const Descriptor*> named;
  for (const Descriptor& d : entries) {
    if (ref_name.empty() || d.ref_name == ref_name) named.push_back(&d);
  }
  if (named.empty()) {
    std::string names;
    for (const Descriptor& d : entries) names += (names.empty() ? "" : ", ") + d.ref_name;
    return absl::NotFoundError("image index has no manifest named \"" + std::string(ref_name) + "\" (names: " + names +
                               ")");
  }
  std::string seen;
  for (const Descriptor* d : named) {
    if (d->platform.empty()) {
      if (named.size() == 1) return *d;  // the config's os/architecture is checked later
      continue;
    }
    std::string_view p = d->platform;
    if (p == platform ||
        (p.size() > platform.size() && p.substr(0, platform.size()) == platform && p[platform.size()] == '/')) {
      return *d;
    }
    seen += (seen.empty() ? "" : ", ") + d->platform;
  }
  return absl::FailedPreconditionError("no manifest for platform " + std::string(platform) +
                                       " in the image index (it has: " + (seen.empty() ? "none" : seen) + ")");
}

Status CheckLayerMediaType(std::string_view media_type, std::string_view digest) {
  static const char* kOk[] = {
      "application/vnd.oci.image.layer.v1.tar",
      "application/vnd.oci.image.layer.v1.tar+gzip",
      "application/vnd.oci.image.layer.v1.tar+zstd",
      "application/vnd.docker.image.rootfs.diff.tar.gzip",
      "application/vnd.docker.image.rootfs.diff.tar",
      "",  // docker save archives name no media type
  };
  for (const char* ok : kOk) {
    if (media_type == ok) return absl::OkStatus();
  }
  return absl::InvalidArgumentError("layer " + std::string(digest) + " has media type \"" + std::string(media_type) +
                                    "\", not a plain, gzip or zstd tar layer");
}

std::string ManifestAccept() {
  return std::string(kOciIndex) + ", " + std::string(kOciManifest) + ", " + std::string(kDockerList) + ", " +
         std::string(kDockerManifest);
}

}  // namespace warren::image::oci
