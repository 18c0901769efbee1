#include "e2b/templates.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "common/log.h"
#include "common/unique_fd.h"

namespace warren::e2b {

namespace {

// A template reference split as `[ns/]name[:tag]`.
struct TemplateRef {
  std::string ns, name, tag;
};

StatusOr<TemplateRef> SplitTemplateRef(const std::string& ref) {
  TemplateRef r;
  std::string rest = ref;
  if (const size_t slash = rest.rfind('/'); slash != std::string::npos) {
    r.ns = rest.substr(0, slash);
    rest = rest.substr(slash + 1);
    if (r.ns.empty()) return absl::InvalidArgumentError("template \"" + ref + "\" has an empty namespace before '/'");
  }
  if (const size_t colon = rest.find(':'); colon != std::string::npos) {
    r.tag = rest.substr(colon + 1);
    rest = rest.substr(0, colon);
    if (r.tag.empty() || r.tag.find(':') != std::string::npos)
      return absl::InvalidArgumentError("template \"" + ref + "\" is not name:tag (an empty tag or a second ':')");
  }
  r.name = rest;
  if (r.name.empty()) return absl::InvalidArgumentError("template \"" + ref + "\" has no name");
  return r;
}

}  // namespace

StatusOr<std::string> ResolveTemplate(const TemplateMap& templates, const std::string& ref) {
  ASSIGN_OR_RETURN(const TemplateRef r, SplitTemplateRef(ref));
  // The tags that name the same build: "" and "default" are one.
  std::vector<std::string> tags = {r.tag};
  if (r.tag.empty()) tags.push_back("default");
  if (r.tag == "default") tags.push_back("");
  std::vector<std::string> spaces = {r.ns};
  if (!r.ns.empty()) spaces.push_back("");
  for (const std::string& ns : spaces) {
    for (const std::string& tag : tags) {
      const std::string key = (ns.empty() ? "" : ns + "/") + r.name + (tag.empty() ? "" : ":" + tag);
      if (templates.count(key) != 0) return key;
    }
  }
  // Not here: name the template's tags when it has others.
  std::string others;
  for (const auto& [key, layers] : templates) {
    StatusOr<TemplateRef> k = SplitTemplateRef(key);
    if (!k.ok() || k->name != r.name || (!k->ns.empty() && k->ns != r.ns)) continue;
    others += (others.empty() ? "" : ", ") + (k->tag.empty() ? std::string("default") : k->tag);
  }
  if (!others.empty())
    return absl::NotFoundError("tag \"" + (r.tag.empty() ? std::string("default") : r.tag) +
                               "\" does not exist for template \"" + r.name + "\" (its tags on this node: " + others +
                               "; warrend --e2b-templates)");
  std::string known;
  for (const auto& [k, v] : templates) known += (known.empty() ? "" : ", ") + k;
  return absl::NotFoundError("template \"" + ref + "\" not found on this node (known: " +
                             (known.empty() ? "none" : known) + "; warrend --e2b-templates)");
}

Status CheckTemplateRef(const std::string& ref) { return SplitTemplateRef(ref).status(); }

StatusOr<TemplateMap> ParseTemplates(std::string_view text, const std::string& what) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return absl::InvalidArgumentError(what + ": not a JSON object {\"name[:tag]\": [layer, ...]}");
  TemplateMap out;
  for (const auto& [id, layers] : j.items()) {
    if (id.empty()) return absl::InvalidArgumentError(what + ": an empty template id");
    if (Status r = CheckTemplateRef(id); !r.ok())
      return absl::InvalidArgumentError(what + ": " + std::string(r.message()));
    if (!layers.is_array() || layers.empty())
      return absl::InvalidArgumentError(what + ": template \"" + id + "\" must map to a non-empty list of layers");
    for (const auto& l : layers) {
      if (!l.is_string() || l.get<std::string>().empty())
        return absl::InvalidArgumentError(what + ": template \"" + id +
                                          "\" has a layer that is not a non-empty string");
      out[id].push_back(l.get<std::string>());
    }
  }
  return out;
}

StatusOr<TemplateMap> ReadTemplates(const std::string& path, const std::vector<std::string>& base_layers) {
  TemplateMap out;
  if (!path.empty()) {
    ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path));
    ASSIGN_OR_RETURN(out, ParseTemplates(text, "--e2b-templates " + path));
  }
  if (out.count("base") == 0 && !base_layers.empty()) out["base"] = base_layers;
  return out;
}

Status WriteTemplates(const std::string& path, const TemplateMap& templates) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [id, layers] : templates) j[id] = layers;
  const std::string text = j.dump(2) + "\n";
  const std::string tmp = path + ".tmp";
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd.valid()) return ErrnoToStatus(errno, "open(" + tmp + ")");
    RETURN_IF_ERROR(WriteAll(fd.get(), text, tmp));
    if (::fsync(fd.get()) != 0) return ErrnoToStatus(errno, "fsync(" + tmp + ")");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    (void)::unlink(tmp.c_str());
    return ErrnoToStatus(err, "rename(" + tmp + ", " + path + ")");
  }
  return absl::OkStatus();
}

TemplateSource::TemplateSource(std::string path, std::vector<std::string> base_layers, TemplateMap initial)
    : path_(std::move(path)), base_layers_(std::move(base_layers)), templates_(std::move(initial)) {
  struct stat st {};
  if (!path_.empty() && ::stat(path_.c_str(), &st) == 0) {
    mtime_ = st.st_mtim;
    size_ = st.st_size;
  }
}

void TemplateSource::ReloadIfChangedLocked() {
  if (path_.empty()) return;
  struct stat st {};
  const bool there = ::stat(path_.c_str(), &st) == 0;
  const int64_t size = there ? st.st_size : -2;
  const struct timespec mtime = there ? st.st_mtim : timespec{};
  if (size == size_ && mtime.tv_sec == mtime_.tv_sec && mtime.tv_nsec == mtime_.tv_nsec) return;
  mtime_ = mtime;
  size_ = size;
  StatusOr<TemplateMap> now = ReadTemplates(path_, base_layers_);
  if (!now.ok()) {
    Log(spdlog::level::warn, "e2b templates: the changed file is not used (the last good mapping stays)",
        {{"file", path_}, {"error", now.status().ToString()}});
    return;
  }
  templates_ = *std::move(now);
  Log(spdlog::level::info, "e2b templates: reloaded",
      {{"file", path_}, {"templates", std::to_string(templates_.size())}});
}

StatusOr<std::pair<std::string, std::vector<std::string>>> TemplateSource::Resolve(const std::string& ref) {
  std::lock_guard<std::mutex> lock(mu_);
  ReloadIfChangedLocked();
  ASSIGN_OR_RETURN(std::string key, ResolveTemplate(templates_, ref));
  return std::make_pair(key, templates_.at(key));
}

}  // namespace warren::e2b
