#include "jail/cgroup.h"

#include "jail/cgroup_path.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace warren::jail {
namespace {

// How long Freeze waits for the kernel to report the cgroup frozen. A task
// in an uninterruptible sleep (a FUSE read of an lxcfs /proc view, I/O on a
// loaded disk) freezes only when it wakes: 1 s was too short on a loaded
// 2-core machine (a suspend answered Aborted in the integration suite).
constexpr std::chrono::milliseconds kFreezeWait{5000};

// Polls `frozen` (every 1 ms for the first 100 ms, then every 10 ms) until it
// holds or kFreezeWait has passed; calls `kick` every 250 ms meanwhile.
bool WaitFrozen(const std::function<bool()>& frozen, const std::function<void()>& kick) {
  const auto t0 = std::chrono::steady_clock::now();
  auto next_kick = t0 + std::chrono::milliseconds(250);
  while (true) {
    if (frozen()) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now - t0 >= kFreezeWait) return false;
    if (now >= next_kick) {
      kick();
      next_kick = now + std::chrono::milliseconds(250);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(now - t0 < std::chrono::milliseconds(100) ? 1 : 10));
  }
}

constexpr int64_t kCfsPeriodUs = 100000;

Status WriteFile(const std::string& path, const std::string& value) {
  UniqueFd fd(CgOpen(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, "open(" + path + ")");
  ssize_t n = ::write(fd.get(), value.data(), value.size());
  if (n < 0) return ErrnoToStatus(errno, "write(" + path + ", " + value + ")");
  return absl::OkStatus();
}

std::optional<std::string> ReadFile(const std::string& path) {
  UniqueFd fd(CgOpen(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return std::nullopt;
  std::string out;
  char buf[4096];
  for (int i = 0; i < 4096; ++i) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, n);
  }
  return out;
}

bool Exists(const std::string& path) { return CgAccess(path.c_str()) == 0; }

std::vector<pid_t> ReadPids(const std::string& dir, bool recursive, int depth = 0) {
  std::vector<pid_t> pids;
  auto text = ReadFile(dir + "/cgroup.procs");
  if (text) {
    for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
      int p;
      if (absl::SimpleAtoi(line, &p) && p > 0) pids.push_back(p);
    }
  }
  if (recursive && depth < 8) {
    UniqueFd d(CgOpen(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!d.valid()) return pids;
    DIR* dp = ::fdopendir(d.release());
    if (!dp) return pids;
    while (struct dirent* e = ::readdir(dp)) {
      if (e->d_type != DT_DIR || e->d_name[0] == '.') continue;
      auto sub = ReadPids(dir + "/" + e->d_name, true, depth + 1);
      pids.insert(pids.end(), sub.begin(), sub.end());
    }
    ::closedir(dp);
  }
  return pids;
}

// Removes `dir`'s sub-directories (depth first) then `dir`. ENOENT ignored.
Status RemoveTree(const std::string& dir, int depth = 0) {
  if (depth < 8) {
    UniqueFd d(CgOpen(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!d.valid()) {
      if (errno == ENOENT) return absl::OkStatus();
      return ErrnoToStatus(errno, "open(" + dir + ")");
    }
    std::vector<std::string> subs;
    if (DIR* dp = ::fdopendir(d.release())) {
      while (struct dirent* e = ::readdir(dp)) {
        if (e->d_type == DT_DIR && e->d_name[0] != '.') subs.push_back(e->d_name);
      }
      ::closedir(dp);
    }
    for (const auto& s : subs) RETURN_IF_ERROR(RemoveTree(dir + "/" + s, depth + 1));
  }
  if (CgRmdir(dir.c_str()) != 0 && errno != ENOENT) return ErrnoToStatus(errno, "rmdir(" + dir + ")");
  return absl::OkStatus();
}

// Writes `value` to `file` in `dir` and every descendant of it (depth first
// is not needed: each cgroup's own state is independent). ENOENT (removed
// meanwhile) ignored; the first other error returned after trying all.
Status WriteTree(const std::string& dir, const char* file, const std::string& value, bool self = true, int depth = 0) {
  Status first;
  const std::string path = dir + "/" + file;
  if (self) {
    UniqueFd fd(CgOpen(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd.valid()) {
      if (errno == ENOENT) return first;
      first = ErrnoToStatus(errno, "open(" + path + ")");
    } else if (::write(fd.get(), value.data(), value.size()) < 0 && errno != ENOENT) {
      first = ErrnoToStatus(errno, "write(" + path + ", " + value + ")");
    }
  }
  if (depth >= 8) return first;
  UniqueFd d(CgOpen(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d.valid()) return first;
  std::vector<std::string> subs;
  if (DIR* dp = ::fdopendir(d.release())) {
    while (struct dirent* e = ::readdir(dp)) {
      if (e->d_type == DT_DIR && e->d_name[0] != '.') subs.push_back(e->d_name);
    }
    ::closedir(dp);
  }
  for (const auto& sub : subs) {
    Status st = WriteTree(dir + "/" + sub, file, value, true, depth + 1);
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

// rmdir of every descendant of `dir`, deepest first; failures (EBUSY: a
// process is still in it) ignored.
void RemoveEmptyBelow(const std::string& dir, int depth = 0) {
  if (depth >= 8) return;
  UniqueFd d(CgOpen(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d.valid()) return;
  std::vector<std::string> subs;
  if (DIR* dp = ::fdopendir(d.release())) {
    while (struct dirent* e = ::readdir(dp)) {
      if (e->d_type == DT_DIR && e->d_name[0] != '.') subs.push_back(e->d_name);
    }
    ::closedir(dp);
  }
  for (const auto& sub : subs) {
    RemoveEmptyBelow(dir + "/" + sub, depth + 1);
    (void)CgRmdir((dir + "/" + sub).c_str());
  }
}

std::string Join(const std::string& a, const std::string& b) {
  if (b.empty()) return a;
  return a + "/" + b;
}

// Own cgroup path per controller ("memory" -> "/process_api/x"; "" -> v2).
std::map<std::string, std::string> OwnCgroups() {
  std::map<std::string, std::string> own;
  auto text = ReadFile("/proc/self/cgroup");
  if (!text) return own;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    for (absl::string_view c : absl::StrSplit(f[1], ',')) own[std::string(c)] = f[2];
  }
  return own;
}

// cgroup (v1) mount points per controller, and the cgroup2 mount point.
struct Mounts {
  std::map<std::string, std::string> v1;  // controller -> mount point
  std::string v2;
  bool v2_at_root = false;
};

Mounts FindMounts() {
  Mounts m;
  auto text = ReadFile("/proc/self/mountinfo");
  if (!text) return m;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    auto sep = std::find(f.begin(), f.end(), "-");
    if (f.size() < 5 || sep == f.end() || sep + 3 >= f.end() + 1) continue;
    if (sep + 2 >= f.end()) continue;
    const std::string& fstype = *(sep + 1);
    const std::string& mp = f[4];
    if (fstype == "cgroup2") {
      if (m.v2.empty() || mp == "/sys/fs/cgroup") m.v2 = mp;
    } else if (fstype == "cgroup" && sep + 3 < f.end()) {
      for (absl::string_view opt : absl::StrSplit(*(sep + 3), ',')) {
        std::string o(opt);
        // cpuset, cpuacct: no limit of ours, but lxcfs finds a reader's cpu
        // quota through its cpuset cgroup's path and per-cpu usage in its
        // cpuacct cgroup (jail/lxcfs.h). One entry per hierarchy (cpu and
        // cpuacct are often one, "cpu,cpuacct").
        if (o == "cpu" || o == "memory" || o == "pids" || o == "freezer" || o == "cpuset" || o == "cpuacct") {
          // The limits are set under "cpu": it names a shared hierarchy.
          std::string other;
          for (const auto& [c, p] : m.v1) {
            if (p == mp) other = c;
          }
          if (other.empty()) {
            m.v1[o] = mp;
          } else if (o == "cpu") {
            m.v1.erase(other);
            m.v1[o] = mp;
          }
        }
      }
    }
  }
  m.v2_at_root = m.v2 == "/sys/fs/cgroup";
  return m;
}

uint64_t ParseKey(const std::string& text, const std::string& key) {
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> kv = absl::StrSplit(line, ' ');
    uint64_t v;
    if (kv.size() == 2 && kv[0] == key && absl::SimpleAtoi(kv[1], &v)) return v;
  }
  return 0;
}

void KillPids(const std::vector<pid_t>& pids, int sig) {
  for (pid_t p : pids) ::kill(p, sig);  // ESRCH: raced with exit, fine
}

// ---------------------------------------------------------------- v1
class CgroupV1 : public Cgroup {
 public:
  // hiers: controller -> directory of this cgroup.
  CgroupV1(std::string rel, std::map<std::string, std::string> hiers)
      : rel_(std::move(rel)), hiers_(std::move(hiers)) {}

  const std::string& rel() const override { return rel_; }
  std::vector<std::string> dirs() const override {
    std::vector<std::string> d;
    d.reserve(hiers_.size());
    for (const auto& [c, dir] : hiers_) d.push_back(dir);
    return d;
  }

  Status SetLimits(const CgroupLimits& l) override {
    if (l.cpu_millis && hiers_.count("cpu")) {
      const std::string& d = hiers_.at("cpu");
      // Every write of the period or the quota walks all of the host's task
      // groups (tg_set_cfs_bandwidth -> __cfs_schedulable): at thousands of
      // sandboxes that is the costliest step of a create. A new cgroup
      // already has the default period: only the quota is written then.
      auto period = ReadFile(d + "/cpu.cfs_period_us");
      if (!period || absl::StripAsciiWhitespace(*period) != std::to_string(kCfsPeriodUs))
        RETURN_IF_ERROR(WriteFile(d + "/cpu.cfs_period_us", std::to_string(kCfsPeriodUs)));
      RETURN_IF_ERROR(WriteFile(d + "/cpu.cfs_quota_us", std::to_string(int64_t{l.cpu_millis} * kCfsPeriodUs / 1000)));
      RETURN_IF_ERROR(WriteFile(
          d + "/cpu.shares", std::to_string(l.best_effort ? 2 : std::max<uint64_t>(2, l.cpu_millis * 1024ull / 1000))));
    }
    if (l.memory_bytes && hiers_.count("memory")) {
      const std::string& d = hiers_.at("memory");
      const std::string v = std::to_string(l.memory_bytes);
      const bool memsw = Exists(d + "/memory.memsw.limit_in_bytes");
      // memsw must stay >= the memory limit: when raising both (a cgroup
      // that had limits already, e.g. a warm shell's), memsw goes first.
      if (!WriteFile(d + "/memory.limit_in_bytes", v).ok() && memsw)
        RETURN_IF_ERROR(WriteFile(d + "/memory.memsw.limit_in_bytes", v));
      RETURN_IF_ERROR(WriteFile(d + "/memory.limit_in_bytes", v));
      if (memsw) RETURN_IF_ERROR(WriteFile(d + "/memory.memsw.limit_in_bytes", v));
      // -1: no soft limit (what a new cgroup has; a recycled best-effort one may not).
      RETURN_IF_ERROR(WriteFile(d + "/memory.soft_limit_in_bytes", l.best_effort ? "0" : "-1"));
    }
    if (l.pids && hiers_.count("pids")) {
      RETURN_IF_ERROR(WriteFile(hiers_.at("pids") + "/pids.max", std::to_string(l.pids)));
    }
    return absl::OkStatus();
  }

  Status AddProcess(pid_t pid) override {
    for (const auto& [c, d] : hiers_) RETURN_IF_ERROR(WriteFile(d + "/cgroup.procs", std::to_string(pid)));
    return absl::OkStatus();
  }

  StatusOr<std::vector<UniqueFd>> OpenProcsFds() override {
    std::vector<UniqueFd> fds;
    for (const auto& [c, d] : hiers_) {
      std::string p = d + "/cgroup.procs";
      UniqueFd fd(CgOpen(p.c_str(), O_WRONLY | O_CLOEXEC));
      if (!fd.valid()) return ErrnoToStatus(errno, "open(" + p + ")");
      fds.push_back(std::move(fd));
    }
    return fds;
  }

  bool ChildrenCoverAllControllers() const override { return false; }

  // v1 children (an exec's, a background process's) live in one hierarchy:
  // freezer (tracking and freeze-then-kill of the whole tree), or pids
  // without a freezer. Their processes join the parent itself in the other
  // hierarchies, whose limits are hierarchical anyway: each extra directory
  // is a mkdir/rmdir under the global cgroup mutex.
  StatusOr<std::unique_ptr<Cgroup>> CreateChild(const std::string& name) override {
    std::map<std::string, std::string> sub;
    for (const char* c : {"freezer", "pids"}) {
      if (!sub.empty()) break;
      auto it = hiers_.find(c);
      if (it == hiers_.end()) continue;
      std::string d = it->second + "/" + name;
      if (CgMkdir(d.c_str(), 0755) != 0 && errno != EEXIST) {
        Status st = ErrnoToStatus(errno, "mkdir(" + d + ")");
        for (auto& [cc, dd] : sub) CgRmdir(dd.c_str());
        return st;
      }
      sub[c] = d;
    }
    return std::unique_ptr<Cgroup>(new CgroupV1(Join(rel_, name), std::move(sub)));
  }

  std::vector<pid_t> Pids(bool recursive) const override {
    for (const char* c : {"freezer", "pids"}) {
      auto it = hiers_.find(c);
      if (it != hiers_.end()) return ReadPids(it->second, recursive);
    }
    return {};
  }

  Status Freeze() override {
    auto it = hiers_.find("freezer");
    if (it == hiers_.end()) return absl::OkStatus();
    const std::string state = it->second + "/freezer.state";
    RETURN_IF_ERROR(WriteFile(state, "FROZEN"));
    const bool frozen = WaitFrozen(
        [&] {
          auto s = ReadFile(state);
          return !s || s->rfind("FROZEN", 0) == 0;
        },
        // v1 tries each task once per write: tasks that could not freeze
        // then (in an uninterruptible sleep) are tried again.
        [&] { (void)WriteFile(state, "FROZEN"); });
    if (frozen) return absl::OkStatus();
    (void)WriteFile(state, "THAWED");
    return absl::AbortedError("freezer.state of " + it->second + " still FREEZING after " +
                              std::to_string(kFreezeWait.count()) +
                              " ms (a task could not freeze now); thawed again, retry");
  }
  Status ThawTree() override {
    auto it = hiers_.find("freezer");
    if (it == hiers_.end()) return absl::OkStatus();
    return WriteTree(it->second, "freezer.state", "THAWED");
  }
  Status ThawDescendants() override {
    auto it = hiers_.find("freezer");
    if (it == hiers_.end()) return absl::OkStatus();
    return WriteTree(it->second, "freezer.state", "THAWED", /*self=*/false);
  }

  Status Thaw() override {
    auto it = hiers_.find("freezer");
    if (it == hiers_.end()) return absl::OkStatus();
    return WriteFile(it->second + "/freezer.state", "THAWED");
  }

  bool Frozen() const override {
    auto it = hiers_.find("freezer");
    if (it == hiers_.end()) return false;
    auto st = ReadFile(it->second + "/freezer.state");
    return st && st->rfind("THAWED", 0) != 0;
  }

  Status SignalAll(int sig) override {
    Status fz = Freeze();
    KillPids(Pids(true), sig);
    Status th = Thaw();
    if (!fz.ok() && !Exists(hiers_.begin()->second)) return absl::OkStatus();
    return th;
  }

  uint64_t OomKillCount() const override {
    auto it = hiers_.find("memory");
    if (it == hiers_.end()) return 0;
    auto t = ReadFile(it->second + "/memory.oom_control");
    return t ? ParseKey(*t, "oom_kill") : 0;
  }

  StatusOr<uint64_t> MemoryUsage() const override {
    auto it = hiers_.find("memory");
    if (it == hiers_.end()) return absl::NotFoundError("cgroup " + rel_ + " has no memory controller");
    const std::string path = it->second + "/memory.usage_in_bytes";
    auto t = ReadFile(path);
    uint64_t v = 0;
    if (!t || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*t), &v)) return ErrnoToStatus(errno, "read(" + path + ")");
    return v;
  }
  uint64_t SwapUsage() const override {
    auto it = hiers_.find("memory");
    if (it == hiers_.end()) return 0;
    auto t = ReadFile(it->second + "/memory.stat");
    return t ? ParseKey(*t, "swap") : 0;
  }
  StatusOr<uint64_t> PageMemoryUsage() const override {
    auto it = hiers_.find("memory");
    if (it == hiers_.end()) return absl::NotFoundError("cgroup " + rel_ + " has no memory controller");
    const std::string path = it->second + "/memory.stat";
    auto t = ReadFile(path);
    if (!t) return ErrnoToStatus(errno, "read(" + path + ")");
    return ParseKey(*t, "cache") + ParseKey(*t, "rss");
  }
  Status ReclaimMemory() override {
    auto it = hiers_.find("memory");
    if (it == hiers_.end()) return absl::NotFoundError("cgroup " + rel_ + " has no memory controller");
    // The kernel reclaims until the usage is 0 or 16 passes free nothing;
    // it returns 0 either way (EINTR only on a signal). Pages touched just
    // before (a file read back, then activated) stay on the active LRU when
    // reclaim's view of the memcg's stats is stale (flushed at most every
    // 2 s): it then does not deactivate them. Reading memory.stat flushes the
    // stats; measured here, a pass after it reclaims them (without it, ~100
    // MiB of a just-read tmpfs file stayed). So: flush, pass, repeat while a
    // pass frees >= 1 MiB (at most 4 passes; one with nothing left costs ~0).
    const std::string path = it->second + "/memory.force_empty";
    uint64_t prev = MemoryUsage().value_or(0);
    for (int pass = 0; pass < 4; ++pass) {
      (void)ReadFile(it->second + "/memory.stat");
      RETURN_IF_ERROR(WriteFile(path, "0"));
      const uint64_t cur = MemoryUsage().value_or(0);
      if (cur + (1u << 20) > prev) break;
      prev = cur;
    }
    return absl::OkStatus();
  }
  Status EndReclaim() override { return absl::OkStatus(); }

  Status Remove() override {
    Status first;
    for (const auto& [c, d] : hiers_) {
      Status st = RemoveTree(d);
      if (!st.ok() && first.ok()) first = st;
    }
    return first;
  }

 private:
  std::string rel_;
  std::map<std::string, std::string> hiers_;
};

class CgroupManagerV1 : public CgroupManager {
 public:
  CgroupManagerV1(std::map<std::string, std::string> bases, bool view_hierarchies)
      : bases_(std::move(bases)), view_hierarchies_(view_hierarchies) {}
  int version() const override { return 1; }
  std::string parent() const override { return parent_; }
  void set_parent(std::string p) { parent_ = std::move(p); }

  StatusOr<std::unique_ptr<Cgroup>> Create(const std::string& rel, const CgroupLimits& limits) override {
    std::map<std::string, std::string> made;
    std::vector<std::string> created;  // for rollback, deepest last
    auto rollback = [&] {
      for (auto it = created.rbegin(); it != created.rend(); ++it) CgRmdir(it->c_str());
    };
    for (const auto& [c, base] : bases_) {
      if (!view_hierarchies_ && IsViewHierarchy(c)) continue;
      std::string path = base;
      // Create the base and each component of rel.
      std::vector<std::string> comps = {""};
      for (absl::string_view s : absl::StrSplit(rel, '/', absl::SkipEmpty())) comps.emplace_back(s);
      for (const auto& comp : comps) {
        if (!comp.empty()) path += "/" + comp;
        const bool made_now = CgMkdir(path.c_str(), 0755) == 0;
        if (made_now) {
          created.push_back(path);
        } else if (errno != EEXIST) {
          Status st = ErrnoToStatus(errno, "mkdir(" + path + ")");
          rollback();
          return st;
        }
        // A new v1 cpuset has no cpus and no mems (joining it fails with
        // ENOSPC): copy the parent's where they are empty. Also for a dir
        // another create made a moment ago and has not filled yet (two
        // creates race on the shared components); the same value written
        // twice is harmless. clone_children makes the kernel fill the ones
        // below from then on.
        if (c == "cpuset") {
          const std::string parent = path.substr(0, path.rfind('/'));
          Status st;
          for (const char* f : {"/cpuset.cpus", "/cpuset.mems"}) {
            auto cur = ReadFile(path + f);
            if (cur && !absl::StripAsciiWhitespace(*cur).empty()) continue;
            auto v = ReadFile(parent + f);
            if (!v) {
              st = ErrnoToStatus(errno ? errno : EIO, "read(" + parent + f + ")");
              break;
            }
            std::string val(absl::StripAsciiWhitespace(*v));
            if (st = WriteFile(path + f, val); !st.ok()) break;
          }
          if (st.ok() && made_now) st = WriteFile(path + "/cgroup.clone_children", "1");
          if (!st.ok()) {
            rollback();
            return st;
          }
        }
      }
      made[c] = path;
    }
    auto cg = std::make_unique<CgroupV1>(rel, std::move(made));
    Status st = cg->SetLimits(limits);
    if (!st.ok()) {
      rollback();
      return st;
    }
    return std::unique_ptr<Cgroup>(std::move(cg));
  }

  StatusOr<std::unique_ptr<Cgroup>> Open(const std::string& rel) override {
    std::map<std::string, std::string> found;
    for (const auto& [c, base] : bases_) {
      std::string p = Join(base, rel);
      if (Exists(p)) found[c] = p;
    }
    if (found.empty()) return absl::NotFoundError("cgroup " + rel + " not found");
    return std::unique_ptr<Cgroup>(new CgroupV1(rel, std::move(found)));
  }

  Status Rename(const std::string& from, const std::string& to) override {
    if (from.empty() || to.empty() || from.find('/') != std::string::npos || to.find('/') != std::string::npos)
      return absl::InvalidArgumentError("cgroup rename: '" + from + "' -> '" + to + "' must be direct children");
    std::vector<std::string> done;  // bases renamed so far
    for (const auto& [c, base] : bases_) {
      const std::string a = base + "/" + from, b = base + "/" + to;
      if (CgRename(a.c_str(), b.c_str()) == 0) {
        done.push_back(base);
        continue;
      }
      if (errno == ENOENT && IsViewHierarchy(c)) continue;  // made without the view hierarchies
      Status st = ErrnoToStatus(errno, "rename(" + a + ", " + b + ")");
      for (const auto& d : done) (void)CgRename((d + "/" + to).c_str(), (d + "/" + from).c_str());
      return st;
    }
    return absl::OkStatus();
  }

 private:
  static bool IsViewHierarchy(const std::string& c) { return c == "cpuset" || c == "cpuacct"; }
  std::map<std::string, std::string> bases_;  // controller -> <mnt><own>/<name>
  bool view_hierarchies_;
  std::string parent_;
};

// ---------------------------------------------------------------- v2
class CgroupV2 : public Cgroup {
 public:
  CgroupV2(std::string rel, std::string dir) : rel_(std::move(rel)), dir_(std::move(dir)) {}
  const std::string& rel() const override { return rel_; }
  std::vector<std::string> dirs() const override { return {dir_}; }

  Status SetLimits(const CgroupLimits& l) override {
    if (l.cpu_millis) {
      RETURN_IF_ERROR(WriteFile(dir_ + "/cpu.max", std::to_string(int64_t{l.cpu_millis} * kCfsPeriodUs / 1000) + " " +
                                                       std::to_string(kCfsPeriodUs)));
      RETURN_IF_ERROR(WriteFile(dir_ + "/cpu.weight",
                                std::to_string(l.best_effort ? 1 : std::clamp<uint64_t>(l.cpu_millis / 10, 1, 10000))));
    }
    if (l.memory_bytes) {
      RETURN_IF_ERROR(WriteFile(dir_ + "/memory.max", std::to_string(l.memory_bytes)));
      if (Exists(dir_ + "/memory.swap.max")) RETURN_IF_ERROR(WriteFile(dir_ + "/memory.swap.max", "0"));
    }
    if (l.pids) RETURN_IF_ERROR(WriteFile(dir_ + "/pids.max", std::to_string(l.pids)));
    return absl::OkStatus();
  }

  Status AddProcess(pid_t pid) override { return WriteFile(dir_ + "/cgroup.procs", std::to_string(pid)); }

  StatusOr<std::vector<UniqueFd>> OpenProcsFds() override {
    std::string p = dir_ + "/cgroup.procs";
    UniqueFd fd(CgOpen(p.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd.valid()) return ErrnoToStatus(errno, "open(" + p + ")");
    std::vector<UniqueFd> v;
    v.push_back(std::move(fd));
    return v;
  }

  bool ChildrenCoverAllControllers() const override { return true; }

  StatusOr<std::unique_ptr<Cgroup>> CreateChild(const std::string& name) override {
    std::string d = dir_ + "/" + name;
    if (CgMkdir(d.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoToStatus(errno, "mkdir(" + d + ")");
    return std::unique_ptr<Cgroup>(new CgroupV2(Join(rel_, name), d));
  }

  std::vector<pid_t> Pids(bool recursive) const override { return ReadPids(dir_, recursive); }

  Status Freeze() override {
    RETURN_IF_ERROR(WriteFile(dir_ + "/cgroup.freeze", "1"));
    const bool frozen = WaitFrozen(
        [&] {
          auto t = ReadFile(dir_ + "/cgroup.events");
          return !t || ParseKey(*t, "frozen") == 1;
        },
        [] {});  // v2 keeps freezing tasks as they become freezable
    if (frozen) return absl::OkStatus();
    (void)WriteFile(dir_ + "/cgroup.freeze", "0");
    return absl::AbortedError("cgroup.events of " + dir_ + " did not report frozen 1 within " +
                              std::to_string(kFreezeWait.count()) +
                              " ms (a task could not freeze now); thawed again, retry");
  }
  Status Thaw() override { return WriteFile(dir_ + "/cgroup.freeze", "0"); }
  Status ThawTree() override { return WriteTree(dir_, "cgroup.freeze", "0"); }
  Status ThawDescendants() override { return WriteTree(dir_, "cgroup.freeze", "0", /*self=*/false); }
  bool Frozen() const override {
    auto ev = ReadFile(dir_ + "/cgroup.events");
    return ev && ParseKey(*ev, "frozen") == 1;
  }

  Status SignalAll(int sig) override {
    if (sig == SIGKILL && Exists(dir_ + "/cgroup.kill")) return WriteFile(dir_ + "/cgroup.kill", "1");
    (void)Freeze();
    KillPids(Pids(true), sig);
    return Thaw();
  }

  uint64_t OomKillCount() const override {
    auto t = ReadFile(dir_ + "/memory.events");
    return t ? ParseKey(*t, "oom_kill") : 0;
  }

  StatusOr<uint64_t> MemoryUsage() const override {
    const std::string path = dir_ + "/memory.current";
    auto t = ReadFile(path);
    uint64_t v = 0;
    if (!t || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*t), &v)) return ErrnoToStatus(errno, "read(" + path + ")");
    return v;
  }
  uint64_t SwapUsage() const override {
    auto t = ReadFile(dir_ + "/memory.swap.current");
    uint64_t v = 0;
    return t && absl::SimpleAtoi(absl::StripAsciiWhitespace(*t), &v) ? v : 0;
  }
  StatusOr<uint64_t> PageMemoryUsage() const override {
    const std::string path = dir_ + "/memory.stat";
    auto t = ReadFile(path);
    if (!t) return ErrnoToStatus(errno, "read(" + path + ")");
    return ParseKey(*t, "file") + ParseKey(*t, "anon");
  }
  Status ReclaimMemory() override {
    // Sandboxes run with memory.swap.max = 0 (SetLimits); a suspended one may swap.
    if (Exists(dir_ + "/memory.swap.max")) RETURN_IF_ERROR(WriteFile(dir_ + "/memory.swap.max", "max"));
    ASSIGN_OR_RETURN(uint64_t usage, MemoryUsage());
    if (usage == 0) return absl::OkStatus();
    // EAGAIN: less than asked could be reclaimed, which is expected (kernel memory).
    Status s = WriteFile(dir_ + "/memory.reclaim", std::to_string(usage));
    if (!s.ok() && StatusErrno(s) == EAGAIN) return absl::OkStatus();
    return s;
  }
  Status EndReclaim() override {
    if (!Exists(dir_ + "/memory.swap.max")) return absl::OkStatus();
    return WriteFile(dir_ + "/memory.swap.max", "0");
  }

  Status Remove() override { return RemoveTree(dir_); }

 private:
  std::string rel_, dir_;
};

class CgroupManagerV2 : public CgroupManager {
 public:
  CgroupManagerV2(std::string base, std::string parent) : base_(std::move(base)), parent_(std::move(parent)) {}
  int version() const override { return 2; }
  std::string parent() const override { return parent_; }

  StatusOr<std::unique_ptr<Cgroup>> Create(const std::string& rel, const CgroupLimits& limits) override {
    std::vector<std::string> created;
    auto rollback = [&] {
      for (auto it = created.rbegin(); it != created.rend(); ++it) CgRmdir(it->c_str());
    };
    std::string path = base_;
    // Best effort: delegate the controllers from the daemon's own cgroup down
    // (fails with EBUSY if the daemon's process lives there and it is not
    // the root: start the daemon in a leaf of a delegated subtree).
    (void)WriteFile(base_.substr(0, base_.rfind('/')) + "/cgroup.subtree_control", "+cpu +memory +pids");
    std::vector<std::string> comps = {""};
    for (absl::string_view s : absl::StrSplit(rel, '/', absl::SkipEmpty())) comps.emplace_back(s);
    for (size_t i = 0; i < comps.size(); ++i) {
      if (!comps[i].empty()) path += "/" + comps[i];
      if (CgMkdir(path.c_str(), 0755) == 0) {
        created.push_back(path);
      } else if (errno != EEXIST) {
        Status st = ErrnoToStatus(errno, "mkdir(" + path + ")");
        rollback();
        return st;
      }
      // Delegate the controllers one level further down (no-internal-process
      // rule: sandboxes keep their processes in leaves).
      (void)WriteFile(path + "/cgroup.subtree_control", "+cpu +memory +pids");
    }
    auto cg = std::make_unique<CgroupV2>(rel, path);
    Status st = cg->SetLimits(limits);
    if (!st.ok()) {
      rollback();
      return st;
    }
    return std::unique_ptr<Cgroup>(std::move(cg));
  }

  StatusOr<std::unique_ptr<Cgroup>> Open(const std::string& rel) override {
    std::string p = Join(base_, rel);
    if (!Exists(p)) return absl::NotFoundError("cgroup " + p + " not found");
    return std::unique_ptr<Cgroup>(new CgroupV2(rel, p));
  }

 private:
  std::string base_, parent_;
};

}  // namespace

Status Cgroup::Evacuate(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int i = 0; i < 10000; ++i) {
    if (Empty()) return absl::OkStatus();
    // SignalAll freezes and thaws this cgroup only: a descendant frozen on
    // its own would keep its tasks frozen, and a v1-frozen task ignores
    // SIGKILL until thawed.
    (void)SignalAll(SIGKILL);
    (void)ThawTree();
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(i < 20 ? 1 : 10));
  }
  (void)ThawTree();
  // Each survivor named with its comm, state and wait channel
  // (/proc/<pid>/stat, wchan): what a process that outlives SIGKILL waits on.
  std::string left;
  for (pid_t p : Pids(true)) {
    std::string what = std::to_string(p);
    const std::string proc = "/proc/" + std::to_string(p);
    if (auto st = ReadFile(proc + "/stat")) {
      const size_t l = st->find('('), r = st->rfind(')');
      if (l != std::string::npos && r != std::string::npos && r + 2 < st->size())
        what += " " + st->substr(l, r - l + 1) + " " + st->substr(r + 2, 1);
    }
    if (auto w = ReadFile(proc + "/wchan"); w && !w->empty()) what += " wchan=" + *w;
    left += (left.empty() ? "" : ", ") + what;
  }
  if (left.empty()) return absl::OkStatus();
  return absl::UnavailableError("cgroup " + rel() + " still has processes after SIGKILL (pids " + left +
                                "): thawed, retry");
}

void Cgroup::RemoveEmptyDescendants() {
  for (const std::string& d : dirs()) RemoveEmptyBelow(d);
}

Status Cgroup::RemoveChildren() {
  for (const std::string& d : dirs()) {
    DIR* dp = CgOpendir(d.c_str());
    if (dp == nullptr) {
      if (errno == ENOENT) continue;
      return ErrnoToStatus(errno, "opendir(" + d + ")");
    }
    std::vector<std::string> subs;
    while (struct dirent* e = ::readdir(dp)) {
      if (e->d_type == DT_DIR && e->d_name[0] != '.') subs.push_back(e->d_name);
    }
    ::closedir(dp);
    for (const auto& sub : subs) RETURN_IF_ERROR(RemoveTree(d + "/" + sub));
  }
  return absl::OkStatus();
}

Status Cgroup::Destroy(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  RETURN_IF_ERROR(Evacuate(timeout));
  // An empty cgroup may still be briefly busy while exiting tasks detach.
  Status st;
  for (int i = 0; i < 200; ++i) {
    st = Remove();
    if (st.ok() || StatusErrno(st) != EBUSY || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return st;
}

StatusOr<std::unique_ptr<CgroupManager>> CgroupManager::OpenV2(const std::string& mount, const std::string& name) {
  if (!Exists(mount + "/cgroup.controllers")) {
    return absl::FailedPreconditionError("no cgroup2 file system at " + mount + " (no cgroup.controllers)");
  }
  auto own = OwnCgroups();
  std::string ownp = own.count("") ? own[""] : "/";
  std::string rel = (ownp == "/" ? "" : ownp) + "/" + name;
  return std::unique_ptr<CgroupManager>(new CgroupManagerV2(mount + rel, rel));
}

std::string CgroupManager::FindCgroup2Mount() { return FindMounts().v2; }

StatusOr<std::unique_ptr<CgroupManager>> CgroupManager::Detect(const std::string& name, bool view_hierarchies) {
  Mounts m = FindMounts();
  auto own = OwnCgroups();
  if (m.v2_at_root && Exists(m.v2 + "/cgroup.controllers")) {
    std::string ownp = own.count("") ? own[""] : "/";
    std::string ctl_path = m.v2 + (ownp == "/" ? "" : ownp) + "/cgroup.controllers";
    auto c = ReadFile(ctl_path);
    if (c && c->find("memory") != std::string::npos) return OpenV2(m.v2, name);
  }
  for (const char* req : {"memory", "pids", "freezer"}) {
    if (!m.v1.count(req)) {
      return absl::FailedPreconditionError(std::string("no usable cgroup v2 and no cgroup v1 '") + req +
                                           "' hierarchy mounted");
    }
  }
  std::map<std::string, std::string> bases;
  for (const auto& [c, mp] : m.v1) {
    std::string ownp = own.count(c) ? own[c] : "/";
    bases[c] = mp + (ownp == "/" ? "" : ownp) + "/" + name;
  }
  auto mgr = std::make_unique<CgroupManagerV1>(bases, view_hierarchies);
  std::string ownmem = own.count("memory") ? own["memory"] : "/";
  mgr->set_parent((ownmem == "/" ? "" : ownmem) + "/" + name);
  return std::unique_ptr<CgroupManager>(std::move(mgr));
}

}  // namespace warren::jail
