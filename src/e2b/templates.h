// E2B templates on warren: the mapping file (--e2b-templates) from E2B
// template references to warren layers, read by warrend's E2B front end and
// edited by `warren e2b template` (src/cli/e2b.cc). Nothing here needs a
// daemon.
//
// The file is a JSON object {"<template>": ["<layer>", ...]} (bottom layer
// first), a template being `name` or `name:tag`, optionally with a
// `namespace/` first. A create's template reference is read as E2B reads
// them (e2b.dev/docs/template/tags): `name`, `name:tag` or
// `namespace/name[:tag]`, where `name` is `name:default` (E2B's default tag,
// and the reverse) and a build id may stand in the tag's place (a key
// `name:<build id>` then). A key without a namespace answers every
// namespace (warren has no teams); one with a namespace only its own.
#pragma once

#include <cstdint>
#include <ctime>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace warren::e2b {

// template key -> layers (bottom first)
using TemplateMap = std::map<std::string, std::vector<std::string>>;

// InvalidArgument naming `ref` unless it is `[namespace/]name[:tag]` with no
// part empty and at most one ':'.
Status CheckTemplateRef(const std::string& ref);

// The mapping in `text` (the file's contents); errors name `what` (the flag
// and path) and the entry.
StatusOr<TemplateMap> ParseTemplates(std::string_view text, const std::string& what);
// The file at `path` ("" = none), with `base_layers` as template "base"
// unless the file names one (and they are not empty).
StatusOr<TemplateMap> ReadTemplates(const std::string& path, const std::vector<std::string>& base_layers);
// Writes `templates` to `path` as the file holds them (a temporary file
// renamed over it: a reader never sees half of it).
Status WriteTemplates(const std::string& path, const TemplateMap& templates);

// The key of `templates` that `ref` names. NotFound naming the template, or
// the tag and the tags the template has; InvalidArgument for a malformed
// reference.
StatusOr<std::string> ResolveTemplate(const TemplateMap& templates, const std::string& ref);

// The mapping file as it is now: Resolve() reads it again when it changed
// (modification time or size) since the last read, so edits apply to the
// next create without a restart. A file that no longer parses (or is gone)
// keeps the last good mapping, and the error is logged once per change.
// Thread-safe.
class TemplateSource {
 public:
  // `initial`: the mapping read at start (ReadTemplates of the same path).
  TemplateSource(std::string path, std::vector<std::string> base_layers, TemplateMap initial);
  // (key, layers) of the template `ref` names, as ResolveTemplate.
  StatusOr<std::pair<std::string, std::vector<std::string>>> Resolve(const std::string& ref);

 private:
  void ReloadIfChangedLocked();

  const std::string path_;
  const std::vector<std::string> base_layers_;
  std::mutex mu_;
  TemplateMap templates_;  // guarded by mu_
  // What the file was at the last read (mu_).
  struct timespec mtime_ {};
  int64_t size_ = -1;
};

}  // namespace warren::e2b
