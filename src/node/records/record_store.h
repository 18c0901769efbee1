// Persistence of sandbox records: one JSON file per sandbox,
// <dir>/<id>.json, replaced atomically (temp file + rename), so a daemon
// crash leaves either the old or the new record, never a torn one.
// Not fsync'd, on purpose: a record describes live processes and mounts,
// which only a daemon crash outlives (the page cache survives it); a host
// crash takes the sandboxes with it, and the restarted daemon cleans up
// after any record it finds (an unreadable one is reported by LoadAll as
// DataLoss). Two fsyncs per create and destroy cost more than the rest of
// the create path on a busy disk. Thread-safe for distinct ids.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace warren::node {

class RecordStore {
 public:
  // Creates `dir` (0700) if needed.
  static StatusOr<RecordStore> Open(const std::string& dir);

  // ENOSPC/EDQUOT → ResourceExhausted naming the directory; on any error no
  // temporary file is left behind and the previous record (if any) is intact.
  Status Put(const std::string& id, const nlohmann::json& record) const;
  // Idempotent: OK when the record does not exist.
  Status Remove(const std::string& id) const;
  struct Loaded {
    std::string id;
    StatusOr<nlohmann::json> record;  // error: unreadable or corrupt file
  };
  // Every <id>.json in the directory; leftover temp files are removed.
  std::vector<Loaded> LoadAll() const;

  const std::string& dir() const { return dir_; }

 private:
  explicit RecordStore(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
};

// Removes `path` recursively without following symlinks and without crossing
// into other mounts (an entry on another device is an error, left in place).
// OK when `path` does not exist.
Status RemoveTree(const std::string& path);

}  // namespace warren::node
