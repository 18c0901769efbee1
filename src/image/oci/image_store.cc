#include "image/oci/image_store.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <nlohmann/json.hpp>
#include <set>

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
  if (r.merged_count > 0) {
    j["merged"] = {{"oci_digest", r.merged.oci_digest},
                   {"layer_digest", r.merged.layer_digest},
                   {"layer_name", r.merged.layer_name},
                   {"size", r.merged.size_bytes},
                   {"count", r.merged_count}};
  }
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
    if (j.contains("merged")) {
      const json& m = j.at("merged");
      r.merged = {m.at("oci_digest").get<std::string>(), m.at("layer_digest").get<std::string>(),
                  m.at("layer_name").get<std::string>(), m.value("size", uint64_t{0})};
      r.merged_count = m.at("count").get<uint32_t>();
      if (r.merged_count < 2 || r.merged_count > r.layers.size()) {
        return absl::DataLossError("image record: merged count " + std::to_string(r.merged_count) + " of " +
                                   std::to_string(r.layers.size()) + " layers");
      }
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
  // the same layer waits and then finds it. The layer is held (before the
  // latch opens) until the add wrote its record or rolled back, so that a
  // concurrent add's rollback or a remove never takes it away.
  Latch(d.digest);
  struct Unlatcher {
    ImageStore* s;
    std::string key;
    ~Unlatcher() { s->Unlatch(key); }
  } unlatch{this, d.digest};
  auto hold = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    Hold(lname);
  };
  if (StatusOr<LayerInfo> li = layers_->Resolve(lname); li.ok()) {
    hold();
    return done(*li, "exists");
  }
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
  p.bytes_done = 0;
  if (progress && !progress(p)) return absl::CancelledError("pull cancelled");
  TarProgressFn convert_progress = [&](uint64_t n) {
    p.bytes_done = std::min(n, p.bytes_total);
    return !progress || progress(p);
  };
  StatusOr<LayerInfo> li = layers_->BuildFromTar(lname, file, convert_progress);
  if (!li.ok()) {
    return Status(li.status().code(),
                  "layer " + d.digest + " of " + src.Describe() + ": " + std::string(li.status().message()));
  }
  *created = true;
  hold();
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
  std::vector<std::string> held;
  // Unholds what this add holds; on failure removes the layers it created
  // unless a record lists them or another pull/merge/create holds them (an
  // add that found the layer this one built uses it).
  auto finish = [&](bool failed) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& n : held) {
      if (--holds_[n] <= 0) holds_.erase(n);
    }
    if (!failed) return;
    for (const std::string& n : created) {
      if (!Held(n) && !Listed(n, "")) (void)layers_->Remove(n);
    }
  };
  const uint32_t count = static_cast<uint32_t>(img.manifest.layers.size());
  for (uint32_t i = 0; i < count; ++i) {
    const Descriptor& d = img.manifest.layers[i];
    PullProgress p{d.digest, i, count, "", 0, static_cast<uint64_t>(std::max<int64_t>(d.size, 0))};
    bool made = false;
    StatusOr<ImageLayerRef> l = EnsureLayer(src, d, p, progress, &made);
    if (l.ok() || made) held.push_back(LayerNameFor(d.digest));  // EnsureLayer held it
    if (!l.ok()) {
      if (made) created.push_back(LayerNameFor(d.digest));
      finish(/*failed=*/true);
      return l.status();
    }
    if (made) created.push_back(l->layer_name);
    rec.layers.push_back(*l);
  }
  rec.created_at_ns = NowRealtimeNs();
  Status s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = WriteFileAtomic(RecordPath(norm), RecordToJson(rec));
  }
  finish(/*failed=*/!s.ok());
  if (!s.ok()) return s;
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
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(ImageRecord rec, Get(name));
  std::vector<ImageLayerRef> all = rec.layers;
  if (rec.merged_count > 0) all.push_back(rec.merged);
  for (const ImageLayerRef& l : all) {
    if (in_use(l.layer_digest)) {
      return absl::FailedPreconditionError("image " + rec.name + " is in use: a sandbox uses its layer " +
                                           l.layer_name);
    }
  }
  const std::string path = RecordPath(rec.name);
  if (::unlink(path.c_str()) != 0) return ErrnoToStatus(errno, "unlink(" + path + ")");
  // A layer another image lists stays; so does one a pull, merge or create
  // holds right now (CollectGarbage reclaims it once nothing does).
  for (const ImageLayerRef& l : all) {
    if (Listed(l.layer_name, rec.name) || Held(l.layer_name)) continue;
    Status s = layers_->Remove(l.layer_name);
    if (!s.ok() && !absl::IsNotFound(s)) return s;
  }
  return absl::OkStatus();
}

std::vector<ImageLayerRef> ImageRecord::Stack() const {
  if (merged_count == 0) return layers;
  std::vector<ImageLayerRef> out{merged};
  out.insert(out.end(), layers.begin() + merged_count, layers.end());
  return out;
}

void ImageStore::Hold(const std::string& layer_name) { ++holds_[layer_name]; }

void ImageStore::Unhold(const std::string& layer_name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = holds_.find(layer_name);
  if (it != holds_.end() && --it->second <= 0) holds_.erase(it);
}

bool ImageStore::Listed(const std::string& layer_name, const std::string& except) const {
  for (const ImageRecord& r : List()) {
    if (r.name == except) continue;
    if (r.merged_count > 0 && r.merged.layer_name == layer_name) return true;
    for (const ImageLayerRef& l : r.layers) {
      if (l.layer_name == layer_name) return true;
    }
  }
  return false;
}

void ImageStore::Latch(const std::string& key) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return converting_.count(key) == 0; });
  converting_[key] = 1;
}

void ImageStore::Unlatch(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  converting_.erase(key);
  cv_.notify_all();
}

ImageUse::~ImageUse() {
  for (const ImageLayerRef& l : rec_.Stack()) s_->Unhold(l.layer_name);
}

StatusOr<std::unique_ptr<ImageUse>> ImageStore::Use(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);  // against Remove between the read and the holds
  ASSIGN_OR_RETURN(ImageRecord rec, Get(name));
  for (const ImageLayerRef& l : rec.Stack()) Hold(l.layer_name);
  return std::unique_ptr<ImageUse>(new ImageUse(this, std::move(rec)));
}

StatusOr<ImageRecord> ImageStore::Merge(const std::string& name, bool include_top, uint64_t max_bytes,
                                        const PullProgressFn& progress) {
  ASSIGN_OR_RETURN(std::unique_ptr<ImageUse> use, Use(name));
  const ImageRecord& rec = use->record();
  const size_t n = include_top ? rec.layers.size() : (rec.layers.empty() ? 0 : rec.layers.size() - 1);
  if (n < 2) {
    return absl::FailedPreconditionError("image " + rec.name + " has " + std::to_string(rec.layers.size()) +
                                         " layers: nothing to merge" +
                                         (include_top ? "" : " below its top layer (include_top merges all)"));
  }
  if (rec.merged_count == n) return rec;
  // The merged layers' own holds: the ImageUse holds the current stack.
  std::vector<std::string> digests;
  std::string chain;
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    digests.push_back(rec.layers[i].layer_digest);
    chain += rec.layers[i].oci_digest + "\n";
    total += rec.layers[i].size_bytes;
  }
  if (max_bytes != 0 && total > max_bytes) {
    return absl::FailedPreconditionError("image " + rec.name + ": the " + std::to_string(n) + " layers to merge hold " +
                                         std::to_string(total) + " bytes, over the merge cap of " +
                                         std::to_string(max_bytes));
  }
  const std::string hex = Sha256Hex(chain);
  const std::string lname = "base/oci-chain@" + hex;
  PullProgress p{"chain:sha256:" + hex, 0, 1, "merging", 0, total};
  if (progress && !progress(p)) return absl::CancelledError("merge cancelled");
  bool created = false;
  LayerInfo li;
  {
    Latch(lname);
    struct Unlatcher {
      ImageStore* s;
      std::string key;
      ~Unlatcher() { s->Unlatch(key); }
    } unlatch{this, lname};
    StatusOr<LayerInfo> found = layers_->Resolve(lname);
    if (!found.ok()) {
      found = layers_->BuildMerged(lname, digests);
      if (!found.ok()) {
        return Status(found.status().code(),
                      "merging image " + rec.name + ": " + std::string(found.status().message()));
      }
      created = true;
    }
    li = *found;
    std::lock_guard<std::mutex> lock(mu_);
    Hold(lname);
  }
  struct Unholder {
    ImageStore* s;
    std::string name;
    ~Unholder() { s->Unhold(name); }
  } unhold{this, lname};
  std::lock_guard<std::mutex> lock(mu_);
  // The record may have been replaced or removed meanwhile: merge into the
  // current one only if it is still this image.
  StatusOr<ImageRecord> cur = Get(rec.name);
  Status s;
  if (!cur.ok()) {
    s = cur.status();
  } else if (cur->digest != rec.digest) {
    s = absl::AbortedError("image " + rec.name + " was replaced while it was merged; merge again");
  } else {
    cur->merged = ImageLayerRef{"chain:sha256:" + hex, li.digest, lname, li.size_bytes};
    cur->merged_count = static_cast<uint32_t>(n);
    s = WriteFileAtomic(RecordPath(rec.name), RecordToJson(*cur));
  }
  if (!s.ok()) {
    if (created && holds_[lname] <= 1 && !Listed(lname, "")) (void)layers_->Remove(lname);
    return s;
  }
  p.phase = "done";
  p.bytes_done = total;
  if (progress) (void)progress(p);
  return *cur;
}

StatusOr<ImageStore::GcResult> ImageStore::CollectGarbage(const std::function<bool(const std::string&)>& in_use) {
  std::lock_guard<std::mutex> lock(mu_);
  std::set<std::string> listed;
  for (const ImageRecord& r : List()) {
    for (const ImageLayerRef& l : r.layers) listed.insert(l.layer_name);
    if (r.merged_count > 0) listed.insert(r.merged.layer_name);
  }
  GcResult out;
  for (const LayerInfo& li : layers_->List()) {
    if (li.name.rfind("base/oci-sha256@", 0) != 0 && li.name.rfind("base/oci-chain@", 0) != 0) continue;
    // A pull converting a layer latches its OCI digest until it holds it.
    const std::string latch = li.name.rfind("base/oci-sha256@", 0) == 0 ? "sha256:" + li.name.substr(16) : li.name;
    if (listed.count(li.name) > 0 || Held(li.name) || converting_.count(latch) > 0 || in_use(li.digest)) continue;
    Status s = layers_->Remove(li.name);
    if (absl::IsNotFound(s) || absl::IsFailedPrecondition(s)) continue;  // gone, or taken meanwhile
    RETURN_IF_ERROR(s);
    out.removed.push_back(li.name);
    out.bytes += li.size_bytes;
  }
  return out;
}

}  // namespace warren::image::oci
