// Directory watches as envd serves them (filesystem.proto: CreateWatcher +
// GetWatcherEvents + RemoveWatcher, and the WatchDir stream), made from
// listings rather than inotify: a DirWatch lists the directory (and, when
// recursive, every directory below it) through the sandbox's SandboxFiles,
// and each Poll reports what changed since the previous one. Listings work
// the same on every backend, run nothing inside the sandbox (no process in
// its table, no CPU of its own) and never resolve a path outside its root.
//
// What differs from envd's inotify watches (README, "E2B protocol"):
//   * changes are seen when polled, as the difference of two listings: an
//     entry created and removed between two polls is not reported, several
//     writes to a file are one WRITE, a file created and written is one
//     CREATE;
//   * a rename is REMOVE of the old name and CREATE of the new one;
//   * WRITE means the file's size or modification time changed; CHMOD that
//     its permission bits did.
//
// Thread-safety: a DirWatch is not thread-safe (its owner locks it); a
// WatcherTable is.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/backend.h"

namespace warren::e2b {

// filesystem.EventType's values.
enum class WatchEventType : int { kCreate = 1, kWrite = 2, kRemove = 3, kRename = 4, kChmod = 5 };
// "EVENT_TYPE_CREATE", ...
const char* WatchEventTypeName(WatchEventType t);

struct WatchEvent {
  std::string name;  // relative to the watched directory ("sub/file" below it)
  WatchEventType type = WatchEventType::kCreate;
  runtime::FileInfo info;  // the entry now; as last seen for kRemove
};

class DirWatch {
 public:
  static constexpr size_t kMaxEntries = 100000;  // per watch: more is ResourceExhausted
  static constexpr uint32_t kMaxDepth = 32;      // directories below the watched one, when recursive

  // Lists `path` as the baseline. NotFound when it does not exist,
  // InvalidArgument when it is not a directory (as envd answers).
  static StatusOr<std::unique_ptr<DirWatch>> Start(runtime::SandboxFiles& files, const std::string& path,
                                                   bool recursive);

  // What changed since the previous Poll (or Start), in name order. The
  // watched directory gone is NotFound naming it (the watch is then over).
  StatusOr<std::vector<WatchEvent>> Poll(runtime::SandboxFiles& files);

  const std::string& path() const { return path_; }

 private:
  using Listing = std::map<std::string, runtime::FileInfo>;  // by name relative to path_
  DirWatch(std::string path, bool recursive) : path_(std::move(path)), recursive_(recursive) {}
  StatusOr<Listing> List(runtime::SandboxFiles& files) const;

  const std::string path_;
  const bool recursive_;
  Listing seen_;
};

// The watchers of CreateWatcher, by id, each bound to its sandbox. At most
// kMaxPerSandbox per sandbox (ResourceExhausted past it); Drop forgets a
// sandbox's (its destroy).
class WatcherTable {
 public:
  static constexpr size_t kMaxPerSandbox = 16;

  struct Watcher {
    std::mutex mu;  // guards watch
    std::unique_ptr<DirWatch> watch;
    bool include_entry = false;
  };

  // Keeps `w` for sandbox `sandbox_id`; returns its new id ("w<hex>").
  StatusOr<std::string> Add(const std::string& sandbox_id, std::shared_ptr<Watcher> w);
  // NotFound (naming the id) unless `id` is a watcher of `sandbox_id`.
  StatusOr<std::shared_ptr<Watcher>> Find(const std::string& sandbox_id, const std::string& id) const;
  Status Remove(const std::string& sandbox_id, const std::string& id);
  void Drop(const std::string& sandbox_id);

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::pair<std::string, std::shared_ptr<Watcher>>> by_id_;  // id -> (sandbox, watcher)
};

}  // namespace warren::e2b
