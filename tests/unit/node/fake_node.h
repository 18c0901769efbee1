// Fakes of runtime::Backend and node::LayerProvider for node and API tests.
// They really record calls, keep state across manager instances (a FakeWorld
// outlives a "daemon"), and can be told to fail at a given step.
#pragma once

#include <sys/stat.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include "node/layer_provider.h"

#include "runtime/backend.h"

namespace warren::testing {

// State shared by every fake backend/sandbox: what "the kernel" holds.
struct FakeWorld {
  std::mutex mu;
  std::condition_variable cv;
  std::set<std::string> alive;     // sandbox ids with live "processes"
  std::vector<std::string> calls;  // "create:<id>", "destroy:<id>", "cleanup:<id>", "adopt:<id>"
  std::vector<runtime::SandboxSpec> create_specs;
  std::vector<runtime::SandboxSpec> adopt_specs;
  Status fail_create = absl::OkStatus();
  std::function<void(const runtime::SandboxSpec&)> on_create;  // runs inside Create
  std::chrono::milliseconds destroy_delay{0};
  bool block_exec = false;  // Exec waits until its sandbox is destroyed

  void Call(const std::string& c) {
    std::lock_guard<std::mutex> l(mu);
    calls.push_back(c);
  }
  int Count(const std::string& c) {
    std::lock_guard<std::mutex> l(mu);
    int n = 0;
    for (const auto& x : calls) n += (x == c);
    return n;
  }
  bool IsAlive(const std::string& id) {
    std::lock_guard<std::mutex> l(mu);
    return alive.count(id) > 0;
  }
};

class FakeFiles final : public runtime::SandboxFiles {
 public:
  struct Writer final : runtime::FileWriter {
    FakeFiles* files;
    std::string path, data;
    Status Write(std::string_view d) override {
      data.append(d.data(), d.size());
      return absl::OkStatus();
    }
    StatusOr<uint64_t> Commit() override {
      std::lock_guard<std::mutex> l(files->mu);
      files->data[path] = data;
      return data.size();
    }
  };
  struct Reader final : runtime::FileReader {
    std::string data;
    size_t pos = 0;
    StatusOr<std::string> Read(size_t max) override {
      std::string out = data.substr(pos, max);
      pos += out.size();
      return out;
    }
  };
  StatusOr<std::unique_ptr<runtime::FileWriter>> OpenWrite(const std::string& path, uint32_t, bool) override {
    auto w = std::make_unique<Writer>();
    w->files = this;
    w->path = path;
    return std::unique_ptr<runtime::FileWriter>(std::move(w));
  }
  StatusOr<std::unique_ptr<runtime::FileReader>> OpenRead(const std::string& path, uint64_t offset,
                                                          uint64_t length) override {
    std::lock_guard<std::mutex> l(mu);
    auto it = data.find(path);
    if (it == data.end()) return absl::NotFoundError("open(" + path + "): not found");
    auto r = std::make_unique<Reader>();
    r->data = it->second.substr(std::min<size_t>(offset, it->second.size()), length == 0 ? std::string::npos : length);
    return std::unique_ptr<runtime::FileReader>(std::move(r));
  }
  StatusOr<runtime::FileInfo> Stat(const std::string& path) override {
    std::lock_guard<std::mutex> l(mu);
    auto it = data.find(path);
    if (it == data.end()) return absl::NotFoundError("stat(" + path + "): not found");
    runtime::FileInfo fi;
    fi.path = path;
    fi.name = path.substr(path.rfind('/') + 1);
    fi.type = runtime::FileType::kRegular;
    fi.size = it->second.size();
    fi.mode = 0644;
    return fi;
  }
  StatusOr<std::vector<runtime::FileInfo>> List(const std::string&) override {
    return std::vector<runtime::FileInfo>{};
  }
  Status Mkdir(const std::string&, uint32_t, bool) override { return absl::OkStatus(); }
  Status Remove(const std::string& path, bool) override {
    std::lock_guard<std::mutex> l(mu);
    return data.erase(path) ? absl::OkStatus() : absl::NotFoundError("remove(" + path + ")");
  }
  Status Rename(const std::string&, const std::string&) override { return absl::OkStatus(); }

  std::mutex mu;
  std::map<std::string, std::string> data;
};

class FakeSandbox final : public runtime::Sandbox {
 public:
  FakeSandbox(std::string id, std::shared_ptr<FakeWorld> world) : id_(std::move(id)), world_(std::move(world)) {}
  const std::string& id() const override { return id_; }
  StatusOr<runtime::ExecOutcome> Exec(const runtime::ExecSpec& spec) override {
    runtime::ExecOutcome o;
    std::unique_lock<std::mutex> l(world_->mu);
    if (!world_->alive.count(id_)) return absl::FailedPreconditionError("sandbox " + id_ + " is gone");
    if (world_->block_exec) {
      world_->cv.wait_for(l, std::chrono::seconds(20), [&] { return !world_->alive.count(id_); });
      o.signal = 9;
      o.exit_code = 137;
      return o;
    }
    o.stdout_data = spec.shell ? *spec.shell : (spec.argv.empty() ? "" : spec.argv[0]);
    o.stderr_data = spec.stdin_data;
    o.stdout_total = o.stdout_data.size();
    o.stderr_total = o.stderr_data.size();
    o.exit_code = 3;
    return o;
  }
  runtime::SandboxFiles& files() override { return files_; }
  Status Destroy() override {
    if (world_->destroy_delay.count() > 0) std::this_thread::sleep_for(world_->destroy_delay);
    world_->Call("destroy:" + id_);
    {
      std::lock_guard<std::mutex> l(world_->mu);
      world_->alive.erase(id_);
    }
    world_->cv.notify_all();
    return absl::OkStatus();
  }
  std::string Record() const override { return nlohmann::json{{"id", id_}, {"fake_pid", 4242}}.dump(); }
  pid_t init_pid() const override { return 4242; }
  std::string_view backend_name() const override { return "container"; }

 private:
  std::string id_;
  std::shared_ptr<FakeWorld> world_;
  FakeFiles files_;
};

class FakeBackend final : public runtime::Backend {
 public:
  explicit FakeBackend(std::shared_ptr<FakeWorld> world) : world_(std::move(world)) {}
  std::string name() const override { return "container"; }
  runtime::Capabilities capabilities() const override { return {}; }
  StatusOr<std::unique_ptr<runtime::Sandbox>> Create(const runtime::SandboxSpec& spec) override {
    world_->Call("create:" + spec.id);
    struct stat st;
    if (::stat(spec.dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError("spec.dir " + spec.dir + " does not exist");
    }
    {
      std::lock_guard<std::mutex> l(world_->mu);
      world_->create_specs.push_back(spec);
    }
    if (world_->on_create) world_->on_create(spec);
    if (!world_->fail_create.ok()) return world_->fail_create;
    {
      std::lock_guard<std::mutex> l(world_->mu);
      world_->alive.insert(spec.id);
    }
    return std::unique_ptr<runtime::Sandbox>(std::make_unique<FakeSandbox>(spec.id, world_));
  }
  StatusOr<std::unique_ptr<runtime::Sandbox>> Adopt(const runtime::SandboxSpec& spec,
                                                    const std::string& backend_record) override {
    nlohmann::json record = nlohmann::json::parse(backend_record, nullptr, false);
    if (!record.is_object()) return absl::InvalidArgumentError("bad record");
    std::string id = spec.id;
    {
      std::lock_guard<std::mutex> l(world_->mu);
      world_->adopt_specs.push_back(spec);
    }
    world_->Call("adopt:" + id);
    if (record.value("fake_pid", 0) != 4242) return absl::InvalidArgumentError("bad record");
    if (!world_->IsAlive(id)) return absl::NotFoundError("sandbox " + id + " is gone");
    return std::unique_ptr<runtime::Sandbox>(std::make_unique<FakeSandbox>(id, world_));
  }
  Status Cleanup(const runtime::SandboxSpec& spec, const std::string& backend_record) override {
    (void)backend_record;
    std::string id = spec.id;
    world_->Call("cleanup:" + id);
    std::lock_guard<std::mutex> l(world_->mu);
    world_->alive.erase(id);
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<FakeWorld> world_;
};

struct FakeLayerState {
  std::mutex mu;
  std::map<std::string, image::LayerInfo> by_ref;  // ref and digest → info
  std::map<std::string, int> refs;                 // digest → refcount
  std::set<std::string> mounted;
  std::string fail_acquire;  // digest whose Acquire fails
  int sweeps = 0;
  std::vector<std::string> builds;  // "dir:<name>:<dir>", "tar:<name>:<bytes>"
  std::string tmp_dir = "/tmp";

  void Add(const std::string& name, const std::string& hex, bool from_sandbox = false) {
    image::LayerInfo li{"sha256:" + hex, name, 4096, 1};
    li.from_sandbox = from_sandbox;
    std::lock_guard<std::mutex> l(mu);
    by_ref[name] = li;
    by_ref[li.digest] = li;
  }
  int Refs(const std::string& digest) {
    std::lock_guard<std::mutex> l(mu);
    return refs.count(digest) ? refs[digest] : 0;
  }
};

class FakeLayers final : public node::LayerProvider {
 public:
  explicit FakeLayers(std::shared_ptr<FakeLayerState> s) : s_(std::move(s)) {}
  StatusOr<image::LayerInfo> Resolve(const std::string& ref) const override {
    std::lock_guard<std::mutex> l(s_->mu);
    if (ref.find('/') == std::string::npos && ref.rfind("sha256:", 0) != 0) {
      return absl::InvalidArgumentError("layer ref " + ref + ": missing kind");
    }
    auto it = s_->by_ref.find(ref);
    if (it == s_->by_ref.end()) return absl::NotFoundError("layer " + ref + " not found");
    return it->second;
  }
  std::vector<image::LayerInfo> List() const override {
    std::lock_guard<std::mutex> l(s_->mu);
    std::vector<image::LayerInfo> out;
    for (const auto& [ref, li] : s_->by_ref) {
      if (ref.rfind("sha256:", 0) != 0) out.push_back(li);
    }
    return out;
  }
  StatusOr<image::LayerInfo> BuildFromDir(const std::string& name, const std::string& dir) override {
    std::lock_guard<std::mutex> l(s_->mu);
    s_->builds.push_back("dir:" + name + ":" + dir);
    return image::LayerInfo{"sha256:" + std::string(64, 'd'), name, 1, 1};
  }
  StatusOr<image::LayerInfo> BuildFromSandboxDir(const std::string& name, const std::string& dir,
                                                 const std::string& project) override {
    std::lock_guard<std::mutex> l(s_->mu);
    s_->builds.push_back("sandbox-dir:" + name + ":" + dir);
    image::LayerInfo li{"sha256:" + std::string(64, 'e'), name, 1, 1};
    li.from_sandbox = true;
    if (!project.empty()) li.projects.push_back(project);
    return li;
  }
  StatusOr<image::LayerInfo> BuildFromTar(const std::string& name, const std::string& tar) override {
    struct stat st;
    if (::stat(tar.c_str(), &st) != 0) return absl::NotFoundError("tar " + tar);
    std::lock_guard<std::mutex> l(s_->mu);
    s_->builds.push_back("tar:" + name + ":" + std::to_string(st.st_size));
    return image::LayerInfo{"sha256:" + std::string(64, 't'), name, static_cast<uint64_t>(st.st_size), 1};
  }
  Status Remove(const std::string& ref) override {
    std::lock_guard<std::mutex> l(s_->mu);
    auto it = s_->by_ref.find(ref);
    if (it == s_->by_ref.end()) return absl::NotFoundError("layer " + ref);
    std::string digest = it->second.digest;
    s_->by_ref.erase(ref);
    s_->by_ref.erase(digest);
    return absl::OkStatus();
  }
  std::string TmpDir() const override { return s_->tmp_dir; }
  StatusOr<std::string> Acquire(const std::string& digest) override {
    std::lock_guard<std::mutex> l(s_->mu);
    if (digest == s_->fail_acquire) return absl::InternalError("mount(" + digest + "): injected");
    ++s_->refs[digest];
    s_->mounted.insert(digest);
    return "/fake/mnt/" + digest.substr(7);
  }
  void Release(const std::string& digest) override {
    std::lock_guard<std::mutex> l(s_->mu);
    --s_->refs[digest];
  }
  void Sweep() override {
    std::lock_guard<std::mutex> l(s_->mu);
    ++s_->sweeps;
  }
  bool IsMounted(const std::string& digest) const override {
    std::lock_guard<std::mutex> l(s_->mu);
    return s_->mounted.count(digest) > 0;
  }
  size_t MountedCount() const override {
    std::lock_guard<std::mutex> l(s_->mu);
    return s_->mounted.size();
  }
  bool FileBackedErofs() const override { return true; }

 private:
  std::shared_ptr<FakeLayerState> s_;
};

}  // namespace warren::testing
