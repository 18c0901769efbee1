#include "absl/strings/escaping.h"
#include "image/layer_store.h"

namespace warren::image {
namespace {

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
bool IsAlnum(char c) { return IsLowerAlnum(c) || (c >= 'A' && c <= 'Z'); }

Status BadName(std::string_view s, const std::string& why) {
  return absl::InvalidArgumentError("layer name \"" + absl::CHexEscape(std::string(s)) + "\": " + why);
}

}  // namespace

StatusOr<LayerName> LayerName::Parse(std::string_view s) {
  size_t slash = s.find('/');
  if (slash == std::string_view::npos) {
    return BadName(s, "expected kind/name[@version]");
  }
  std::string kind(s.substr(0, slash));
  LayerName out;
  if (kind == "base") {
    out.kind = LayerKind::kBase;
  } else if (kind == "workspace") {
    out.kind = LayerKind::kWorkspace;
  } else if (kind == "toolset") {
    out.kind = LayerKind::kToolset;
  } else {
    return BadName(s, "kind \"" + absl::CHexEscape(kind) + "\" is not one of base, workspace, toolset");
  }
  std::string_view rest = s.substr(slash + 1);
  size_t at = rest.find('@');
  std::string name(rest.substr(0, at));
  if (name.empty() || name.size() > 128) {
    return BadName(s, "name \"" + absl::CHexEscape(name) + "\" must be 1 to 128 characters");
  }
  if (!IsLowerAlnum(name[0])) {
    return BadName(s, "name \"" + absl::CHexEscape(name) + "\" must start with [a-z0-9]");
  }
  for (char c : name) {
    if (!IsLowerAlnum(c) && c != '.' && c != '_' && c != '-') {
      return BadName(s, "name \"" + absl::CHexEscape(name) + "\" may only contain [a-z0-9._-]");
    }
  }
  out.name = std::move(name);
  if (at != std::string_view::npos) {
    std::string version(rest.substr(at + 1));
    if (version.empty() || version.size() > 64) {
      return BadName(s, "version \"" + absl::CHexEscape(version) + "\" must be 1 to 64 characters");
    }
    if (!IsAlnum(version[0])) {
      return BadName(s, "version \"" + absl::CHexEscape(version) + "\" must start with [A-Za-z0-9]");
    }
    for (char c : version) {
      if (!IsAlnum(c) && c != '.' && c != '_' && c != '+' && c != '-') {
        return BadName(s, "version \"" + absl::CHexEscape(version) + "\" may only contain [A-Za-z0-9._+-]");
      }
    }
    out.version = std::move(version);
  }
  return out;
}

std::string LayerName::ToString() const {
  const char* k = kind == LayerKind::kBase ? "base" : kind == LayerKind::kWorkspace ? "workspace" : "toolset";
  std::string s = std::string(k) + "/" + name;
  if (!version.empty()) s += "@" + version;
  return s;
}

}  // namespace warren::image
