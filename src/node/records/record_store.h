// Persistence of sandbox records (record.proto's Sandbox): one file per
// sandbox, <dir>/<id>.json, in protobuf's JSON mapping with the proto's field
// names. JSON rather than binary: an operator (and a test) can read a record
// with any JSON tool, the env stays byte-exact (bytes are base64), and a
// record an older daemon wrote (JSON of its own, version 1) is read by the
// same store and converted. Records are small; the encoding costs nothing
// next to a create. Replaced atomically (temp file + rename), so a daemon
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

#include "common/status.h"
#include "node/records/record.pb.h"

namespace warren::node {

class RecordStore {
 public:
  // Creates `dir` (0700) if needed.
  static StatusOr<RecordStore> Open(const std::string& dir);

  // ENOSPC/EDQUOT → ResourceExhausted naming the directory; on any error no
  // temporary file is left behind and the previous record (if any) is intact.
  Status Put(const std::string& id, const record::Sandbox& record) const;
  // Idempotent: OK when the record does not exist.
  Status Remove(const std::string& id) const;
  struct Loaded {
    std::string id;
    // Error: unreadable or corrupt file. A version-1 record (an older
    // daemon's JSON) comes converted, its backend part as the JSON text the
    // backend wrote then.
    StatusOr<record::Sandbox> record;
  };
  // Every <id>.json in the directory; leftover temp files are removed.
  std::vector<Loaded> LoadAll() const;

  const std::string& dir() const { return dir_; }

 private:
  explicit RecordStore(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
};

}  // namespace warren::node
