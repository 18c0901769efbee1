#include "image/oci/image_store.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "image/fs_util.h"
#include "image/oci/digest.h"

namespace warren::image::oci {
namespace {

using nlohmann::json;

json ConfigJson(const ImageConfig& c) {
  return json{{"env", c.env},   {"workdir", c.workdir},
              {"user", c.user}, {"entrypoint", c.entrypoint},
              {"cmd", c.cmd},   {"exposed_ports", c.exposed_ports},
              {"os", c.os},     {"architecture", c.architecture}};
}

}  // namespace

std::string RecordToJson(const ImageRecord& r) {
  json layers = json::array();
  for (const ImageLayerRef& l : r.layers) {
    layers.push_back({{"oci_digest", l.oci_digest},
                      {"layer_digest", l.layer_digest},
                      {"layer_name", l.layer_name},
                      {"size", l.size_bytes}});
  }
  json j{{"name", r.name},     {"digest", r.digest},
         {"source", r.source}, {"created_at_ns", r.created_at_ns},
         {"layers", layers},   {"config", ConfigJson(r.config)}};
  return j.dump(2) + "\n";
}

StatusOr<ImageRecord> RecordFromJson(const std::string& s) {
  json j = json::parse(s, nullptr, false);
  if (!j.is_object()) return absl::DataLossError("image record is not a JSON object");
  ImageRecord r;
  try {
    r.name = j.at("name").get<std::string>();
    r.digest = j.at("digest").get<std::string>();
    r.source = j.value("source", "");
    r.created_at_ns = j.value("created_at_ns", int64_t{0});
    for (const json& l : j.at("layers")) {
      r.layers.push_back({l.at("oci_digest").get<std::string>(), l.at("layer_digest").get<std::string>(),
                          l.at("layer_name").get<std::string>(), l.value("size", uint64_t{0})});
    }
    const json& c = j.at("config");
    r.config.env = c.value("env", std::vector<std::string>{});
    r.config.workdir = c.value("workdir", "");
    r.config.user = c.value("user", "");
    r.config.entrypoint = c.value("entrypoint", std::vector<std::string>{});
    r.config.cmd = c.value("cmd", std::vector<std::string>{});
    r.config.exposed_ports = c.value("exposed_ports", std::vector<std::string>{});
    r.config.os = c.value("os", "");
    r.config.architecture = c.value("architecture", "");
  } catch (const json::exception& e) {
    return absl::DataLossError(std::string("image record: ") + e.what());
  }
  return r;
}

StatusOr<std::unique_ptr<ImageStore>> ImageStore::Open(const std::string& dir, const std::string& tmp_dir,
                                                       LayerBackend* layers) {
  RETURN_IF_ERROR(MakeDirs(dir));
  RETURN_IF_ERROR(MakeDirs(tmp_dir));
  return std::unique_ptr<ImageStore>(new ImageStore(dir, tmp_dir, layers));
}

StatusOr<std::string> ImageStore::NormalizeName(const std::string& name) {
  bool ok =
      !name.empty() && name.size() <= 255 && name.find("..") == std::string::npos && name[0] != '/' && name[0] != '-';
  for (char c : name) {
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '/' || c == ':' ||
                c == '@' || c == '-');
  }
  if (!ok) {
    return absl::InvalidArgumentError("image name \"" + name.substr(0, 300) +
                                      "\" is not [A-Za-z0-9._/:@-]{1,255} (without \"..\")");
  }
  const size_t last = name.rfind('/');
  const std::string tail = last == std::string::npos ? name : name.substr(last + 1);
  if (tail.find(':') == std::string::npos && tail.find('@') == std::string::npos) return name + ":latest";
  return name;
}

std::string ImageStore::LayerNameFor(const std::string& oci_digest) {
  return "base/oci-sha256@" + DigestHex(oci_digest);
}

std::string ImageStore::RecordPath(const std::string& name) const { return dir_ + "/" + Sha256Hex(name) + ".json"; }

StatusOr<ImageLayerRef> ImageStore::EnsureLayer(ImageSource& src, const Descriptor& d, PullProgress p,
                                                const PullProgressFn& progress, bool* created) {
  *created = false;
  const std::string lname = LayerNameFor(d.digest);
  auto done = [&](const LayerInfo& li, const char* phase) -> StatusOr<ImageLayerRef> {
    p.phase = phase;
    p.bytes_done = p.bytes_total;
    if (progress && !progress(p)) return absl::CancelledError("pull cancelled");
    return ImageLayerRef{d.digest, li.digest, lname, li.size_bytes};
  };
  // One conversion of a digest at a time in this process: a second add of
  // the same layer waits and then finds it.
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return converting_.count(d.digest) == 0; });
    converting_[d.digest] = 1;
  }
  struct Unlatch {
    ImageStore* s;
    std::string digest;
    ~Unlatch() {
      std::lock_guard<std::mutex> lock(s->mu_);
      s->converting_.erase(digest);
      s->cv_.notify_all();
    }
  } unlatch{this, d.digest};
  if (StatusOr<LayerInfo> li = layers_->Resolve(lname); li.ok()) return done(*li, "exists");
  RETURN_IF_ERROR(CheckLayerMediaType(d.media_type, d.digest));
  const std::string scratch = tmp_dir_ + "/pull-" + UniqueSuffix();
  UnlinkGuard remove_scratch(scratch);
  p.phase = "fetching";
  ProgressFn fetch_progress = [&](uint64_t n) {
    p.bytes_done = n;
    return !progress || progress(p);
  };
  ASSIGN_OR_RETURN(std::string file, src.LayerFile(d, scratch, fetch_progress));
  p.phase = "converting";
  p.bytes_done = p.bytes_total;
  if (progress && !progress(p)) return absl::CancelledError("pull cancelled");
  StatusOr<LayerInfo> li = layers_->BuildFromTar(lname, file);
  if (!li.ok()) {
    return Status(li.status().code(),
                  "layer " + d.digest + " of " + src.Describe() + ": " + std::string(li.status().message()));
  }
  *created = true;
  return done(*li, "done");
}

StatusOr<ImageRecord> ImageStore::Add(ImageSource& src, const std::string& name, const std::string& platform,
                                      const PullProgressFn& progress) {
  const std::string plat = platform.empty() ? std::string(kDefaultPlatform) : platform;
  ASSIGN_OR_RETURN(ResolvedImage img, src.Resolve(plat));
  std::string want = name.empty() ? img.default_name : name;
  if (want.empty()) return absl::InvalidArgumentError(src.Describe() + " suggests no name: give one");
  ASSIGN_OR_RETURN(std::string norm, NormalizeName(want));
  ImageRecord rec;
  rec.name = norm;
  rec.digest = img.digest;
  rec.source = src.Describe();
  rec.config = img.config;
  std::vector<std::string> created;
  auto rollback = [&] {
    for (const std::string& n : created) (void)layers_->Remove(n);
  };
  const uint32_t count = static_cast<uint32_t>(img.manifest.layers.size());
  for (uint32_t i = 0; i < count; ++i) {
    const Descriptor& d = img.manifest.layers[i];
    PullProgress p{d.digest, i, count, "", 0, static_cast<uint64_t>(std::max<int64_t>(d.size, 0))};
    bool made = false;
    StatusOr<ImageLayerRef> l = EnsureLayer(src, d, p, progress, &made);
    if (!l.ok()) {
      rollback();
      return l.status();
    }
    if (made) created.push_back(l->layer_name);
    rec.layers.push_back(*l);
  }
  rec.created_at_ns = NowRealtimeNs();
  std::lock_guard<std::mutex> lock(mu_);
  if (Status s = WriteFileAtomic(RecordPath(norm), RecordToJson(rec)); !s.ok()) {
    rollback();
    return s;
  }
  return rec;
}

StatusOr<ImageRecord> ImageStore::Get(const std::string& name) const {
  ASSIGN_OR_RETURN(std::string norm, NormalizeName(name));
  const std::string path = RecordPath(norm);
  if (::access(path.c_str(), F_OK) != 0) return absl::NotFoundError("image " + norm + " not found");
  ASSIGN_OR_RETURN(std::string body, ReadSmallFile(path, 16 << 20));
  return RecordFromJson(body);
}

std::vector<ImageRecord> ImageStore::List() const {
  std::vector<ImageRecord> out;
  DIR* d = ::opendir(dir_.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n.size() != 64 + 5 || n.substr(64) != ".json") continue;
    StatusOr<std::string> body = ReadSmallFile(dir_ + "/" + n, 16 << 20);
    if (!body.ok()) continue;  // removed meanwhile
    if (StatusOr<ImageRecord> r = RecordFromJson(*body); r.ok()) out.push_back(std::move(*r));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end(), [](const ImageRecord& a, const ImageRecord& b) { return a.name < b.name; });
  return out;
}

Status ImageStore::Remove(const std::string& name, const std::function<bool(const std::string&)>& in_use) {
  ASSIGN_OR_RETURN(ImageRecord rec, Get(name));
  std::lock_guard<std::mutex> lock(mu_);
  for (const ImageLayerRef& l : rec.layers) {
    if (in_use(l.layer_digest)) {
      return absl::FailedPreconditionError("image " + rec.name + " is in use: a sandbox uses its layer " +
                                           l.layer_name);
    }
  }
  const std::string path = RecordPath(rec.name);
  if (::unlink(path.c_str()) != 0) return ErrnoToStatus(errno, "unlink(" + path + ")");
  std::vector<ImageRecord> others = List();
  for (const ImageLayerRef& l : rec.layers) {
    bool shared = std::any_of(others.begin(), others.end(), [&](const ImageRecord& o) {
      return std::any_of(o.layers.begin(), o.layers.end(),
                         [&](const ImageLayerRef& ol) { return ol.layer_name == l.layer_name; });
    });
    if (shared) continue;
    Status s = layers_->Remove(l.layer_name);
    if (!s.ok() && !absl::IsNotFound(s)) return s;
  }
  return absl::OkStatus();
}

}  // namespace warren::image::oci
