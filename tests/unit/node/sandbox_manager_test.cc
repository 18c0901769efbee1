#include "node/sandbox_manager.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/escaping.h"
#include "common/file_util.h"

#include "fake_node.h"
#include "status_matchers.h"

namespace warren::node {
namespace {

namespace fs = std::filesystem;
using testing::FakeBackend;
using testing::FakeLayers;
using testing::FakeLayerState;
using testing::FakeWorld;

const std::string kBaseHex(64, 'a');
const std::string kWsHex(64, 'b');
const std::string kBase = "sha256:" + kBaseHex;
const std::string kWs = "sha256:" + kWsHex;

class SandboxManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/warren-node-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    state_dir_ = root_ + "/state";
    world_ = std::make_shared<FakeWorld>();
    layer_state_ = std::make_shared<FakeLayerState>();
    layer_state_->Add("base/debian@12", kBaseHex);
    layer_state_->Add("workspace/demo@1", kWsHex);
  }
  void TearDown() override {
    manager_.reset();
    if (tmpfs_mounted_) {
      ASSERT_EQ(umount2(state_dir_.c_str(), 0), 0) << strerror(errno);
    }
    fs::remove_all(root_);
  }

  std::unique_ptr<SandboxManager> NewManager(NodeLimits limits = {}) {
    ManagerOptions o;
    o.node_id = "n7";
    o.state_dir = state_dir_;
    o.limits = limits;
    if (o.limits.cpus == 0) o.limits.cpus = 4;
    if (o.limits.memory_mb == 0) o.limits.memory_mb = 8192;
    o.sweep_interval = std::chrono::milliseconds(0);
    std::vector<std::unique_ptr<runtime::Backend>> b;
    b.push_back(std::make_unique<FakeBackend>(world_));
    auto m = SandboxManager::New(o, std::move(b), std::make_unique<FakeLayers>(layer_state_));
    EXPECT_OK(m);
    if (!m.ok()) return nullptr;
    EXPECT_OK((*m)->Start());
    return std::move(*m);
  }

  CreateRequest Req() {
    CreateRequest r;
    r.layers = {"base/debian@12", "workspace/demo@1"};
    r.labels = {{"task", "t1"}};
    r.job = "run-1";
    r.env = {{"A", std::string("x\0\xff", 3).substr(0, 1) + "\xff"}};
    return r;
  }

  std::string RecordPath(const std::string& id) { return state_dir_ + "/sandboxes/" + id + ".json"; }
  std::string RunDir(const std::string& id) { return state_dir_ + "/run/" + id; }
  size_t Entries(const std::string& dir) {
    size_t n = 0;
    for (auto it = fs::directory_iterator(dir); it != fs::directory_iterator(); ++it) ++n;
    return n;
  }
  // Nothing of a failed create is left: no record, no dir, no mount ref, no table entry.
  void ExpectNothingLeft(SandboxManager& m) {
    EXPECT_EQ(Entries(state_dir_ + "/sandboxes"), 0u);
    EXPECT_EQ(Entries(state_dir_ + "/run"), 0u);
    EXPECT_EQ(layer_state_->Refs(kBase), 0);
    EXPECT_EQ(layer_state_->Refs(kWs), 0);
    EXPECT_TRUE(m.List({}, "").empty());
    EXPECT_EQ(m.Counters().creates_in_flight, 0u);
    std::lock_guard<std::mutex> l(world_->mu);
    EXPECT_TRUE(world_->alive.empty());
  }
  nlohmann::json ReadRecord(const std::string& id) {
    std::ifstream f(RecordPath(id));
    return nlohmann::json::parse(f);
  }

  std::string root_, state_dir_;
  bool tmpfs_mounted_ = false;
  std::shared_ptr<FakeWorld> world_;
  std::shared_ptr<FakeLayerState> layer_state_;
  std::unique_ptr<SandboxManager> manager_;
};

TEST_F(SandboxManagerTest, CreateGetListExecDestroy) {
  manager_ = NewManager();
  auto sb = manager_->Create(Req());
  ASSERT_OK(sb);
  EXPECT_EQ(sb->id.rfind("n7-", 0), 0u);
  EXPECT_EQ(sb->id.size(), 3u + 12u);
  EXPECT_EQ(sb->state, SandboxState::kRunning);
  EXPECT_EQ(sb->layer_digests, (std::vector<std::string>{kBase, kWs}));
  EXPECT_EQ(sb->resources.cpu_millis, 1000u);
  EXPECT_EQ(sb->resources.memory_mb, 2048u);
  EXPECT_EQ(sb->resources.open_files, 1024u);
  EXPECT_EQ(sb->hostname, sb->id);
  EXPECT_EQ(sb->init_pid, 4242);
  // The backend got the acquired mounts bottom first, in the dir we made.
  ASSERT_EQ(world_->create_specs.size(), 1u);
  EXPECT_EQ(world_->create_specs[0].lower_dirs,
            (std::vector<std::string>{"/fake/mnt/" + kBaseHex, "/fake/mnt/" + kWsHex}));
  EXPECT_EQ(world_->create_specs[0].dir, RunDir(sb->id));
  EXPECT_EQ(layer_state_->Refs(kBase), 1);
  EXPECT_EQ(manager_->LayerUsers(kBase), 1u);
  nlohmann::json rec = ReadRecord(sb->id);
  EXPECT_EQ(rec["state"], "running");
  std::string brec;  // the backend's record: opaque bytes (base64 in the JSON mapping)
  ASSERT_TRUE(absl::Base64Unescape(rec["backend_record"].get<std::string>(), &brec));
  EXPECT_EQ(nlohmann::json::parse(brec)["fake_pid"], 4242);

  EXPECT_EQ(manager_->List({{"task", "t1"}}, "").size(), 1u);
  EXPECT_EQ(manager_->List({{"task", "t2"}}, "").size(), 0u);
  EXPECT_EQ(manager_->List({}, "run-1").size(), 1u);
  EXPECT_EQ(manager_->List({}, "run-2").size(), 0u);

  runtime::ExecSpec es;
  es.shell = "echo hi";
  auto out = manager_->Exec(sb->id, es);
  ASSERT_OK(out);
  EXPECT_EQ(out->stdout_data, "echo hi");
  EXPECT_THAT(manager_->Exec("n7-000000000000", es), StatusIs(absl::StatusCode::kNotFound));

  ASSERT_OK(manager_->Destroy(sb->id));
  EXPECT_THAT(manager_->Get(sb->id), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(manager_->Destroy(sb->id), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(world_->Count("destroy:" + sb->id), 1);
  ExpectNothingLeft(*manager_);
}

// A request the node cannot grant is refused before anything is made, naming
// the field, the value and the maximum (a sandbox's open-files limit cannot
// exceed the daemon's hard RLIMIT_NOFILE: setting it would fail in the
// sandbox's setup with EPERM).
TEST_F(SandboxManagerTest, RequestsBeyondTheNodeAreRefusedNamingTheMaximum) {
  // In a child: lowering a hard limit cannot be undone without
  // CAP_SYS_RESOURCE in the initial user namespace.
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(pipefd[0]);
    struct rlimit low = {1024, 4096};
    std::string out;
    if (setrlimit(RLIMIT_NOFILE, &low) != 0) {
      out = "setrlimit failed";
    } else {
      std::unique_ptr<SandboxManager> m = NewManager();
      CreateRequest r = Req();
      r.resources.open_files = 5000;
      auto sb = m->Create(r);
      out = sb.ok() ? "created" : sb.status().ToString();
      if (!world_->calls.empty()) out += " (backend called)";
    }
    (void)!write(pipefd[1], out.data(), out.size());
    _exit(0);
  }
  close(pipefd[1]);
  std::string got;
  char buf[512];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof buf)) > 0) got.append(buf, static_cast<size_t>(n));
  close(pipefd[0]);
  int wst = 0;
  ASSERT_EQ(waitpid(child, &wst, 0), child);
  EXPECT_NE(got.find("INVALID_ARGUMENT"), std::string::npos) << got;
  EXPECT_NE(got.find("resources.open_files=5000"), std::string::npos) << got;
  EXPECT_NE(got.find("4096"), std::string::npos) << got;
  EXPECT_EQ(got.find("backend called"), std::string::npos) << got;

  manager_ = NewManager();
  struct Case {
    std::function<void(CreateRequest&)> mutate;
    std::string field, max;
  };
  std::vector<Case> cases = {
      {[](CreateRequest& q) { q.resources.cpu_millis = 4001; }, "resources.cpu_millis=4001", "4000"},
      {[](CreateRequest& q) { q.resources.memory_mb = 9000; }, "resources.memory_mb=9000", "8192"},
      {[](CreateRequest& q) { q.resources.tmpfs_mb = 9000; }, "resources.tmpfs_mb=9000", "8192"},
      {[](CreateRequest& q) { q.resources.disk_mb = 9000; }, "resources.disk_mb=9000", "8192"},
      {[](CreateRequest& q) { q.resources.pids = 5000000; }, "resources.pids=5000000", "4194304"},
  };
  for (const Case& c : cases) {
    CreateRequest q = Req();
    c.mutate(q);
    auto got = manager_->Create(q);
    ASSERT_THAT(got, ::testing::Not(IsOk())) << c.field;
    EXPECT_THAT(got, StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_NE(got.status().message().find(c.field), absl::string_view::npos) << got.status();
    EXPECT_NE(got.status().message().find(c.max), absl::string_view::npos) << got.status();
  }
  EXPECT_TRUE(world_->calls.empty());
}

// A node whose daemon holds fewer open files than the default gets the
// default clamped, like the other defaults (never an explicit ask).
TEST_F(SandboxManagerTest, DefaultOpenFilesFitTheNode) {
  NodeLimits lim;
  lim.max_open_files = 512;
  manager_ = NewManager(lim);
  auto sb = manager_->Create(Req());
  ASSERT_OK(sb);
  EXPECT_EQ(sb->resources.open_files, 512u);
}

// The default locale is UTF-8 unless the request chose one.
TEST_F(SandboxManagerTest, DefaultLocaleIsUtf8UnlessTheRequestSetsOne) {
  manager_ = NewManager();
  ASSERT_OK(manager_->Create(Req()));
  EXPECT_EQ(world_->create_specs.back().env["LANG"], "C.UTF-8");
  CreateRequest r = Req();
  r.env["LANG"] = "de_DE.UTF-8";
  ASSERT_OK(manager_->Create(r));
  EXPECT_EQ(world_->create_specs.back().env["LANG"], "de_DE.UTF-8");
  r = Req();
  r.env["LC_ALL"] = "C";
  ASSERT_OK(manager_->Create(r));
  EXPECT_EQ(world_->create_specs.back().env.count("LANG"), 0u);
  EXPECT_EQ(world_->create_specs.back().env["LC_ALL"], "C");
}

TEST_F(SandboxManagerTest, ValidationErrorsNameTheField) {
  manager_ = NewManager();
  struct Case {
    std::function<void(CreateRequest&)> mutate;
    std::string want;
  };
  std::vector<Case> cases = {
      {[](CreateRequest& r) { r.layers.clear(); }, "layers"},
      {[](CreateRequest& r) { r.backend = "vm"; }, "backend \"vm\""},
      {[](CreateRequest& r) { r.resources.cpu_millis = 4001; }, "resources.cpu_millis=4001"},
      {[](CreateRequest& r) { r.resources.memory_mb = 9000; }, "resources.memory_mb=9000"},
      {[](CreateRequest& r) { r.resources.disk_mb = 100000; }, "resources.disk_mb=100000"},
      {[](CreateRequest& r) { r.resources.pids = 5000000; }, "resources.pids=5000000"},
      {[](CreateRequest& r) { r.resources.open_files = 8; }, "resources.open_files=8"},
      {[](CreateRequest& r) { r.resources.open_files = 2000000; }, "resources.open_files=2000000"},
      {[](CreateRequest& r) { r.env["A=B"] = "1"; }, "env key \"A=B\""},
      {[](CreateRequest& r) { r.env[""] = "1"; }, "env key \"\""},
      {[](CreateRequest& r) { r.env[std::string("A\0B", 3)] = "1"; }, "env key \"A\\x00"},
      {[](CreateRequest& r) { r.env["V"] = std::string("a\0b", 3); }, "env[\"V\"]"},
      {[](CreateRequest& r) { r.workdir = "rel/dir"; }, "workdir=\"rel/dir\""},
      {[](CreateRequest& r) { r.user = "Bad User"; }, "user=\"Bad User\""},
      {[](CreateRequest& r) { r.hostname = "-bad"; }, "hostname=\"-bad\""},
      {[](CreateRequest& r) { r.hostname = std::string(64, 'h'); }, "hostname="},
      {[](CreateRequest& r) { r.labels["bad key"] = "v"; }, "label key \"bad key\""},
      {[](CreateRequest& r) { r.labels["k"] = "a\nb"; }, "labels[\"k\"]"},
      {[](CreateRequest& r) { r.job = std::string(300, 'j'); }, "job="},
      {[](CreateRequest& r) { r.layers = {"nokind"}; }, "layers[0]=\"nokind\""},
  };
  for (const Case& c : cases) {
    CreateRequest r = Req();
    c.mutate(r);
    auto sb = manager_->Create(r);
    ASSERT_THAT(sb, ::testing::Not(IsOk())) << c.want;
    EXPECT_THAT(sb, StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_NE(sb.status().message().find(c.want), absl::string_view::npos)
        << "message: " << sb.status().message() << " want: " << c.want;
  }
  EXPECT_TRUE(world_->calls.empty());
  ExpectNothingLeft(*manager_);
  // Valid edge values pass.
  CreateRequest r = Req();
  r.resources.cpu_millis = 4000;
  r.resources.pids = 1;
  r.resources.open_files = 16;
  r.user = "1000:1000";
  r.hostname = "box-1.example";
  r.workdir = "/w";
  EXPECT_OK(manager_->Create(r));
}

TEST_F(SandboxManagerTest, UnknownLayerIsNotFoundNamingTheRef) {
  manager_ = NewManager();
  CreateRequest r = Req();
  r.layers.push_back("toolset/missing@3");
  auto sb = manager_->Create(r);
  EXPECT_THAT(sb, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_NE(sb.status().message().find("toolset/missing@3"), absl::string_view::npos);
  EXPECT_TRUE(world_->calls.empty());
  ExpectNothingLeft(*manager_);
}

TEST_F(SandboxManagerTest, RollbackWhenSecondLayerMountFails) {
  manager_ = NewManager();
  layer_state_->fail_acquire = kWs;
  auto sb = manager_->Create(Req());
  EXPECT_THAT(sb, StatusIs(absl::StatusCode::kInternal));
  EXPECT_NE(sb.status().message().find(kWs), absl::string_view::npos);
  EXPECT_EQ(world_->Count("create:" + std::string()), 0);
  ExpectNothingLeft(*manager_);
}

TEST_F(SandboxManagerTest, RollbackWhenBackendCreateFails) {
  manager_ = NewManager();
  world_->fail_create = absl::ResourceExhaustedError("clone3(): no slot");
  std::string seen_record;
  world_->on_create = [&](const runtime::SandboxSpec& spec) {
    // The "creating" record is persisted before the backend runs.
    std::ifstream f(RecordPath(spec.id));
    seen_record = nlohmann::json::parse(f)["state"];
  };
  auto sb = manager_->Create(Req());
  EXPECT_THAT(sb, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(seen_record, "creating");
  ASSERT_EQ(world_->create_specs.size(), 1u);
  EXPECT_EQ(world_->Count("cleanup:" + world_->create_specs[0].id), 1);
  ExpectNothingLeft(*manager_);
  // A later create works.
  world_->fail_create = absl::OkStatus();
  world_->on_create = nullptr;
  EXPECT_OK(manager_->Create(Req()));
}

TEST_F(SandboxManagerTest, StateDirFullIsResourceExhaustedAndRollsBack) {
  ASSERT_EQ(mkdir(state_dir_.c_str(), 0700), 0);
  if (mount("tmpfs", state_dir_.c_str(), "tmpfs", 0, "size=256k") != 0) {
    GTEST_SKIP() << "cannot mount tmpfs: " << strerror(errno);
  }
  tmpfs_mounted_ = true;
  manager_ = NewManager();
  // The backend fills the state dir's file system: the "running" record cannot be written.
  std::string filler = state_dir_ + "/filler";
  auto fill = [filler] {
    int fd = open(filler.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    ASSERT_GE(fd, 0);
    std::string chunk(4096, 'x');
    for (int i = 0; i < 1024 && write(fd, chunk.data(), chunk.size()) > 0; ++i) {
    }
    for (int i = 0; i < 4096 && write(fd, chunk.data(), 1) > 0; ++i) {
    }
    close(fd);
  };
  world_->on_create = [&](const runtime::SandboxSpec&) { fill(); };
  auto sb = manager_->Create(Req());
  ASSERT_THAT(sb, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_NE(sb.status().message().find(state_dir_), absl::string_view::npos) << sb.status();
  ASSERT_EQ(world_->create_specs.size(), 1u);
  EXPECT_EQ(world_->Count("destroy:" + world_->create_specs[0].id), 1);
  ExpectNothingLeft(*manager_);
  // With the state dir full from the start, the "creating" record fails first.
  world_->on_create = nullptr;
  fill();
  sb = manager_->Create(Req());
  EXPECT_THAT(sb, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(world_->create_specs.size(), 1u);  // backend not reached
  ExpectNothingLeft(*manager_);
  unlink(filler.c_str());
  EXPECT_OK(manager_->Create(Req()));
}

TEST_F(SandboxManagerTest, AdmissionBoundsCreatesInFlightAndQueuesTheRest) {
  NodeLimits lim;
  lim.max_creates_in_flight = 2;
  lim.max_create_queue = 1;
  lim.max_sandboxes = 3;
  manager_ = NewManager(lim);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> entered{0};
  world_->on_create = [&](const runtime::SandboxSpec&) {
    ++entered;
    released.wait_for(std::chrono::seconds(20));
  };
  auto a = std::async(std::launch::async, [&] { return manager_->Create(Req()); });
  auto b = std::async(std::launch::async, [&] { return manager_->Create(Req()); });
  for (int i = 0; i < 2000 && entered < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(entered, 2);
  EXPECT_EQ(manager_->Counters().creates_in_flight, 2u);
  // Creating sandboxes are visible.
  auto listed = manager_->List({}, "");
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].state, SandboxState::kCreating);
  // The third waits in the queue (not refused, not started)...
  auto c = std::async(std::launch::async, [&] { return manager_->Create(Req()); });
  for (int i = 0; i < 2000 && manager_->Counters().creates_queued < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(manager_->Counters().creates_queued, 1u);
  EXPECT_EQ(entered, 2);
  // ...the fourth finds the queue full and is refused, naming the limits.
  auto d = manager_->Create(Req());
  EXPECT_THAT(d, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_NE(d.status().message().find("create queue is full"), absl::string_view::npos) << d.status();
  EXPECT_NE(d.status().message().find("--max-create-queue=1"), absl::string_view::npos) << d.status();
  release.set_value();
  EXPECT_OK(a.get());
  EXPECT_OK(b.get());
  EXPECT_OK(c.get());
  EXPECT_EQ(entered, 3);
  world_->on_create = nullptr;
  auto e = manager_->Create(Req());
  EXPECT_THAT(e, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_NE(e.status().message().find("node full"), absl::string_view::npos) << e.status();
}

TEST_F(SandboxManagerTest, QueuedCreatesRunInOrderAndHonourDeadlines) {
  NodeLimits lim;
  lim.max_creates_in_flight = 1;
  manager_ = NewManager(lim);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::mutex order_mu;
  std::vector<std::string> order;
  world_->on_create = [&](const runtime::SandboxSpec& s) {
    released.wait_for(std::chrono::seconds(20));
    std::lock_guard<std::mutex> l(order_mu);
    order.push_back(s.hostname);
  };
  auto req = [&](const std::string& host) {
    CreateRequest r = Req();
    r.hostname = host;
    return r;
  };
  auto first = std::async(std::launch::async, [&] { return manager_->Create(req("h0")); });
  for (int i = 0; i < 2000 && manager_->Counters().creates_in_flight < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // A create with a short deadline times out in the queue.
  CreateRequest late = req("late");
  late.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  auto t = manager_->Create(late);
  EXPECT_THAT(t, StatusIs(absl::StatusCode::kDeadlineExceeded));
  // A cancelled one gives up too.
  CreateRequest gone = req("gone");
  gone.cancelled = [] { return true; };
  EXPECT_THAT(manager_->Create(gone), StatusIs(absl::StatusCode::kCancelled));
  // Queued creates are served first come, first served.
  std::vector<std::future<StatusOr<SandboxInfo>>> queued;
  for (int k = 1; k <= 5; ++k) {
    queued.push_back(std::async(std::launch::async, [&, k] { return manager_->Create(req("h" + std::to_string(k))); }));
    for (int i = 0; i < 2000 && manager_->Counters().creates_queued < static_cast<uint32_t>(k); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_EQ(manager_->Counters().creates_queued, static_cast<uint32_t>(k));
  }
  release.set_value();
  EXPECT_OK(first.get());
  for (auto& q : queued) EXPECT_OK(q.get());
  EXPECT_EQ(order, (std::vector<std::string>{"h0", "h1", "h2", "h3", "h4", "h5"}));
  EXPECT_EQ(manager_->Counters().creates_queued, 0u);
  EXPECT_EQ(manager_->Counters().creates_in_flight, 0u);
}

TEST_F(SandboxManagerTest, DestroyDuringExecAndConcurrentDestroys) {
  manager_ = NewManager();
  auto sb = manager_->Create(Req());
  ASSERT_OK(sb);
  world_->block_exec = true;
  world_->destroy_delay = std::chrono::milliseconds(300);
  auto exec = std::async(std::launch::async, [&] {
    runtime::ExecSpec es;
    es.shell = "sleep 1000";
    return manager_->Exec(sb->id, es);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto d1 = std::async(std::launch::async, [&] { return manager_->Destroy(sb->id); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // While destroying: exec is refused, a second destroy waits and succeeds.
  runtime::ExecSpec es;
  es.shell = "true";
  EXPECT_THAT(manager_->Exec(sb->id, es), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_OK(manager_->Destroy(sb->id));
  EXPECT_OK(d1.get());
  auto out = exec.get();
  ASSERT_OK(out);
  EXPECT_EQ(out->signal, 9);
  EXPECT_EQ(world_->Count("destroy:" + sb->id), 1);
  ExpectNothingLeft(*manager_);
}

TEST_F(SandboxManagerTest, DestroyDuringCreateWaitsThenDestroys) {
  manager_ = NewManager();
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> entered{false};
  world_->on_create = [&](const runtime::SandboxSpec&) {
    entered = true;
    released.wait_for(std::chrono::seconds(20));
  };
  auto create = std::async(std::launch::async, [&] { return manager_->Create(Req()); });
  for (int i = 0; i < 2000 && !entered; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(entered);
  auto listed = manager_->List({}, "");
  ASSERT_EQ(listed.size(), 1u);
  std::string id = listed[0].id;
  runtime::ExecSpec es;
  es.shell = "true";
  EXPECT_THAT(manager_->Exec(id, es), StatusIs(absl::StatusCode::kFailedPrecondition));
  auto destroy = std::async(std::launch::async, [&] { return manager_->Destroy(id); });
  EXPECT_EQ(destroy.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  release.set_value();
  auto created = create.get();
  ASSERT_OK(created);
  EXPECT_OK(destroy.get());
  EXPECT_EQ(world_->Count("destroy:" + id), 1);
  ExpectNothingLeft(*manager_);
}

// The env is bytes (the API's map<string, bytes>): a value that is not UTF-8
// is persisted and handed back to the backend byte-exact after a restart.
TEST_F(SandboxManagerTest, NonUtf8EnvSurvivesARestartByteExact) {
  manager_ = NewManager();
  CreateRequest r = Req();
  r.env = {{"BIN", std::string("\xff\xfe\x80 \xc3(", 6)}, {"TEXT", "caf\xc3\xa9"}};
  auto sb = manager_->Create(r);
  ASSERT_OK(sb);
  std::map<std::string, std::string> want = r.env;
  want["LANG"] = "C.UTF-8";
  EXPECT_EQ(world_->create_specs.back().env, want);
  manager_.reset();
  manager_ = NewManager();
  ASSERT_OK(manager_->Get(sb->id));
  ASSERT_EQ(world_->adopt_specs.size(), 1u);
  EXPECT_EQ(world_->adopt_specs[0].env, want);
  EXPECT_EQ(world_->adopt_specs[0].workdir, "/");
  EXPECT_EQ(world_->adopt_specs[0].hostname, sb->id);
}

// A record an older daemon wrote (JSON of its own, version 1, env in base64,
// the backend's part a JSON object) is adopted, and rewritten in the current
// format.
TEST_F(SandboxManagerTest, AdoptsARecordOfAnOlderDaemon) {
  manager_ = NewManager();
  manager_.reset();
  const std::string id = "n7-00000000beef";
  ASSERT_EQ(mkdir(RunDir(id).c_str(), 0700), 0);
  {
    std::lock_guard<std::mutex> l(world_->mu);
    world_->alive.insert(id);
  }
  nlohmann::json old = {{"version", 1},
                        {"id", id},
                        {"state", "running"},
                        {"paused", false},
                        {"suspended", false},
                        {"expires_at_ns", 0},
                        {"idle_timeout_s", 0},
                        {"backend", "container"},
                        {"dir", RunDir(id)},
                        {"layers", {kBase, kWs}},
                        {"layer_names", {"base/debian@12", "workspace/demo@1"}},
                        {"resources",
                         {{"cpu_millis", 1000},
                          {"memory_mb", 512},
                          {"disk_mb", 256},
                          {"pids", 64},
                          {"open_files", 128},
                          {"tmpfs_mb", 16}}},
                        {"env_b64", {{absl::Base64Escape("K"), absl::Base64Escape(std::string("\xff\x01", 2))}}},
                        {"workdir", "/w"},
                        {"user", "1000"},
                        {"hostname", "old-box"},
                        {"labels", {{"task", "t9"}}},
                        {"job", "j"},
                        {"ttl_s", 0},
                        {"created_at_ns", 123},
                        {"backend_record", {{"id", id}, {"dir", RunDir(id)}, {"fake_pid", 4242}}},
                        {"request_id", ""},
                        {"transitions", nlohmann::json::array()}};
  std::ofstream(RecordPath(id)) << old.dump();
  manager_ = NewManager();
  auto got = manager_->Get(id);
  ASSERT_OK(got);
  EXPECT_EQ(got->resources.memory_mb, 512u);
  EXPECT_EQ(got->hostname, "old-box");
  EXPECT_EQ(got->labels.at("task"), "t9");
  EXPECT_EQ(got->pristine_layers, (std::vector<std::string>{kBase, kWs}));
  ASSERT_EQ(world_->adopt_specs.size(), 1u);
  EXPECT_EQ(world_->adopt_specs[0].env.at("K"), std::string("\xff\x01", 2));
  EXPECT_EQ(world_->adopt_specs[0].workdir, "/w");
  EXPECT_EQ(world_->adopt_specs[0].user, "1000");
  nlohmann::json rec = ReadRecord(id);
  EXPECT_EQ(rec["version"], 2);
  EXPECT_EQ(rec["env"]["K"], absl::Base64Escape(std::string("\xff\x01", 2)));
  EXPECT_EQ(rec["transitions"].back()["reason"], "adopted after daemon restart");
  EXPECT_OK(manager_->Destroy(id));
}

TEST_F(SandboxManagerTest, RestartAdoptsRunningAndCleansTheRest) {
  manager_ = NewManager();
  auto keep = manager_->Create(Req());
  auto lost = manager_->Create(Req());
  ASSERT_OK(keep);
  ASSERT_OK(lost);
  manager_.reset();  // daemon stops: sandboxes keep running
  EXPECT_TRUE(world_->IsAlive(keep->id));
  EXPECT_TRUE(world_->IsAlive(lost->id));
  EXPECT_EQ(world_->Count("destroy:" + keep->id), 0);
  // The daemon's mount references died with it.
  {
    std::lock_guard<std::mutex> l(layer_state_->mu);
    layer_state_->refs.clear();
  }
  // Meanwhile one sandbox died, and a create was interrupted half-way.
  {
    std::lock_guard<std::mutex> l(world_->mu);
    world_->alive.erase(lost->id);
  }
  std::string half = "n7-0123456789ab";
  ASSERT_EQ(mkdir(RunDir(half).c_str(), 0700), 0);
  std::ofstream(RunDir(half) + "/upper-leftover") << "x";
  std::ofstream(RecordPath(half)) << nlohmann::json{
      {"id", half},
      {"state", "creating"},
      {"backend", "container"}}.dump();
  std::ofstream(RecordPath("n7-corrupt")) << "{not json";
  std::ofstream(state_dir_ + "/sandboxes/.tmp-n7-x.json") << "partial";
  int sweeps_before = layer_state_->sweeps;

  manager_ = NewManager();
  auto got = manager_->Get(keep->id);
  ASSERT_OK(got);
  EXPECT_EQ(got->state, SandboxState::kRunning);
  EXPECT_EQ(got->labels, keep->labels);
  EXPECT_EQ(got->layer_digests, keep->layer_digests);
  EXPECT_EQ(layer_state_->Refs(kBase), 1);  // re-acquired for the adopted sandbox
  EXPECT_EQ(world_->Count("adopt:" + keep->id), 1);
  nlohmann::json rec = ReadRecord(keep->id);
  EXPECT_EQ(rec["transitions"].back()["reason"], "adopted after daemon restart");

  EXPECT_THAT(manager_->Get(lost->id), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(world_->Count("cleanup:" + lost->id), 1);
  EXPECT_FALSE(fs::exists(RecordPath(lost->id)));
  EXPECT_FALSE(fs::exists(RunDir(lost->id)));

  EXPECT_EQ(world_->Count("cleanup:" + half), 1);
  EXPECT_FALSE(fs::exists(RecordPath(half)));
  EXPECT_FALSE(fs::exists(RunDir(half)));
  EXPECT_FALSE(fs::exists(RecordPath("n7-corrupt")));
  EXPECT_FALSE(fs::exists(state_dir_ + "/sandboxes/.tmp-n7-x.json"));
  EXPECT_GT(layer_state_->sweeps, sweeps_before);

  // The adopted sandbox works and destroys cleanly.
  runtime::ExecSpec es;
  es.argv = {"true"};
  EXPECT_OK(manager_->Exec(keep->id, es));
  ASSERT_OK(manager_->Destroy(keep->id));
  ExpectNothingLeft(*manager_);
}

TEST_F(SandboxManagerTest, EnvIsPersistedByteExact) {
  manager_ = NewManager();
  CreateRequest r = Req();
  r.env = {{"BIN", std::string("\xff\xfe\x01 ok", 6)}};
  auto sb = manager_->Create(r);
  ASSERT_OK(sb);
  EXPECT_EQ(world_->create_specs[0].env.at("BIN"), std::string("\xff\xfe\x01 ok", 6));
  manager_.reset();
  manager_ = NewManager();
  EXPECT_OK(manager_->Get(sb->id));
}

TEST_F(SandboxManagerTest, RemoveLayerRefusesInUse) {
  manager_ = NewManager();
  auto sb = manager_->Create(Req());
  ASSERT_OK(sb);
  Status s = manager_->RemoveLayer("workspace/demo@1");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(s.message().find("in use by 1"), absl::string_view::npos);
  ASSERT_OK(manager_->Destroy(sb->id));
  EXPECT_OK(manager_->RemoveLayer("workspace/demo@1"));
  EXPECT_THAT(manager_->RemoveLayer("workspace/demo@1"), StatusIs(absl::StatusCode::kNotFound));
}

TEST(RecordStoreTest, PutReplacesAtomicallyAndRemoveIsIdempotent) {
  char tmpl[] = "/tmp/warren-rec-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  auto rs = RecordStore::Open(std::string(tmpl) + "/r");
  ASSERT_OK(rs);
  node::record::Sandbox r;
  r.set_version(2);
  r.set_id("n0-a");
  r.set_job("v1");
  ASSERT_OK(rs->Put("n0-a", r));
  r.set_job("v2");
  ASSERT_OK(rs->Put("n0-a", r));
  auto all = rs->LoadAll();
  ASSERT_EQ(all.size(), 1u);
  ASSERT_OK(all[0].record);
  EXPECT_EQ(all[0].record->job(), "v2");
  EXPECT_OK(rs->Remove("n0-a"));
  EXPECT_OK(rs->Remove("n0-a"));
  EXPECT_TRUE(rs->LoadAll().empty());
  fs::remove_all(tmpl);
}

TEST(RemoveTreeTest, DoesNotFollowSymlinksOrCrossMounts) {
  char tmpl[] = "/tmp/warren-rt-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string root = tmpl;
  fs::create_directories(root + "/outside");
  std::ofstream(root + "/outside/keep") << "k";
  fs::create_directories(root + "/t/a/b");
  std::ofstream(root + "/t/a/b/f") << "x";
  fs::create_symlink(root + "/outside", root + "/t/link");
  EXPECT_OK(RemoveTree(root + "/t"));
  EXPECT_FALSE(fs::exists(root + "/t"));
  EXPECT_TRUE(fs::exists(root + "/outside/keep"));
  // A mount inside is refused and left alone.
  fs::create_directories(root + "/t2/m");
  if (mount("tmpfs", (root + "/t2/m").c_str(), "tmpfs", 0, "size=64k") == 0) {
    std::ofstream(root + "/t2/m/inner") << "i";
    EXPECT_THAT(RemoveTree(root + "/t2"), ::testing::Not(IsOk()));
    EXPECT_TRUE(fs::exists(root + "/t2/m/inner"));
    EXPECT_EQ(umount2((root + "/t2/m").c_str(), 0), 0);
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace warren::node
