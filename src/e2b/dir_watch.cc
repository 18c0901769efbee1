#include "e2b/dir_watch.h"

#include <utility>

#include "common/secret.h"

namespace warren::e2b {

const char* WatchEventTypeName(WatchEventType t) {
  switch (t) {
    case WatchEventType::kCreate: return "EVENT_TYPE_CREATE";
    case WatchEventType::kWrite: return "EVENT_TYPE_WRITE";
    case WatchEventType::kRemove: return "EVENT_TYPE_REMOVE";
    case WatchEventType::kRename: return "EVENT_TYPE_RENAME";
    case WatchEventType::kChmod: return "EVENT_TYPE_CHMOD";
  }
  return "EVENT_TYPE_UNSPECIFIED";
}

StatusOr<std::unique_ptr<DirWatch>> DirWatch::Start(runtime::SandboxFiles& files, const std::string& path,
                                                    bool recursive) {
  ASSIGN_OR_RETURN(runtime::FileInfo fi, files.Stat(path));
  if (fi.type != runtime::FileType::kDirectory)
    return absl::InvalidArgumentError("path " + path + " is not a directory");
  std::unique_ptr<DirWatch> w(new DirWatch(path, recursive));
  ASSIGN_OR_RETURN(w->seen_, w->List(files));
  return w;
}

StatusOr<DirWatch::Listing> DirWatch::List(runtime::SandboxFiles& files) const {
  Listing out;
  struct Dir {
    std::string path, rel;
    uint32_t depth;
  };
  std::vector<Dir> todo{{path_, "", 0}};
  while (!todo.empty()) {
    const Dir d = std::move(todo.back());
    todo.pop_back();
    StatusOr<std::vector<runtime::FileInfo>> entries = files.List(d.path);
    if (!entries.ok()) {
      const bool gone = entries.status().code() == absl::StatusCode::kNotFound;
      if (d.depth == 0 && gone) return absl::NotFoundError("watched directory " + path_ + " was removed");
      if (!gone) return entries.status();
      continue;  // a directory below it, removed between two listings: only gone
    }
    for (runtime::FileInfo& fi : *entries) {
      std::string rel = d.rel.empty() ? fi.name : d.rel + "/" + fi.name;
      if (recursive_ && fi.type == runtime::FileType::kDirectory && d.depth < kMaxDepth)
        todo.push_back({fi.path, rel, d.depth + 1});
      out.emplace(std::move(rel), std::move(fi));
      if (out.size() > kMaxEntries)
        return absl::ResourceExhaustedError("watched directory " + path_ + " holds more than " +
                                            std::to_string(kMaxEntries) + " entries");
    }
  }
  return out;
}

StatusOr<std::vector<WatchEvent>> DirWatch::Poll(runtime::SandboxFiles& files) {
  ASSIGN_OR_RETURN(Listing now, List(files));
  std::vector<WatchEvent> events;
  auto old_it = seen_.begin();
  auto new_it = now.begin();
  auto emit = [&events](const std::string& name, WatchEventType t, const runtime::FileInfo& fi) {
    events.push_back(WatchEvent{name, t, fi});
  };
  while (old_it != seen_.end() || new_it != now.end()) {
    if (new_it == now.end() || (old_it != seen_.end() && old_it->first < new_it->first)) {
      emit(old_it->first, WatchEventType::kRemove, old_it->second);
      ++old_it;
    } else if (old_it == seen_.end() || new_it->first < old_it->first) {
      emit(new_it->first, WatchEventType::kCreate, new_it->second);
      ++new_it;
    } else {
      const runtime::FileInfo& a = old_it->second;
      const runtime::FileInfo& b = new_it->second;
      if (a.type != b.type) {  // replaced by another kind of entry
        emit(new_it->first, WatchEventType::kRemove, a);
        emit(new_it->first, WatchEventType::kCreate, b);
      } else {
        if (a.mode != b.mode) emit(new_it->first, WatchEventType::kChmod, b);
        if (b.type == runtime::FileType::kRegular && (a.size != b.size || a.mtime_ns != b.mtime_ns))
          emit(new_it->first, WatchEventType::kWrite, b);
      }
      ++old_it;
      ++new_it;
    }
  }
  seen_ = std::move(now);
  return events;
}

StatusOr<std::string> WatcherTable::Add(const std::string& sandbox_id, std::shared_ptr<Watcher> w) {
  const std::string id = "w" + RandomHex(12);
  std::lock_guard<std::mutex> lock(mu_);
  size_t mine = 0;
  for (const auto& [_, entry] : by_id_) mine += entry.first == sandbox_id ? 1 : 0;
  if (mine >= kMaxPerSandbox)
    return absl::ResourceExhaustedError("sandbox " + sandbox_id + " already has " + std::to_string(kMaxPerSandbox) +
                                        " directory watchers; remove one first");
  by_id_[id] = {sandbox_id, std::move(w)};
  return id;
}

StatusOr<std::shared_ptr<WatcherTable::Watcher>> WatcherTable::Find(const std::string& sandbox_id,
                                                                    const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end() || it->second.first != sandbox_id)
    return absl::NotFoundError("watcher with id " + id + " not found");
  return it->second.second;
}

Status WatcherTable::Remove(const std::string& sandbox_id, const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end() || it->second.first != sandbox_id)
    return absl::NotFoundError("watcher with id " + id + " not found");
  by_id_.erase(it);
  return absl::OkStatus();
}

void WatcherTable::Drop(const std::string& sandbox_id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = by_id_.begin(); it != by_id_.end();) {
    it = it->second.first == sandbox_id ? by_id_.erase(it) : std::next(it);
  }
}

}  // namespace warren::e2b
