// Lifecycle of the node (issue 4): TTL / idle reaping, ExtendTtl persisted
// across a restart, idempotent calls, the audit log (over the fake backend),
// and the upper-tree copy used by snapshots and grading (on a real file
// system: whiteouts, opaque xattrs, hardlinks, symlinks, id shift, excludes,
// holes, bounds, depth, security xattrs, solution-only copies, changes).
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "common/unique_fd.h"
#include "fake_node.h"
#include "node/sandbox_manager.h"
#include "status_matchers.h"

namespace warren::node {
namespace {

namespace fs = std::filesystem;
using testing::FakeBackend;
using testing::FakeLayers;
using testing::FakeLayerState;
using testing::FakeWorld;

const std::string kBaseHex(64, 'a');

class LifecycleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/warren-lifecycle-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    world_ = std::make_shared<FakeWorld>();
    layer_state_ = std::make_shared<FakeLayerState>();
    layer_state_->Add("base/debian@12", kBaseHex);
  }
  void TearDown() override {
    manager_.reset();
    fs::remove_all(root_);
  }
  std::unique_ptr<SandboxManager> NewManager() {
    ManagerOptions o;
    o.node_id = "n7";
    o.state_dir = root_ + "/state";
    o.limits.cpus = 4;
    o.limits.memory_mb = 8192;
    o.sweep_interval = std::chrono::milliseconds(0);
    o.reap_interval = std::chrono::milliseconds(0);  // tests call ReapExpired()
    o.max_recorded_calls = 4;
    std::vector<std::unique_ptr<runtime::Backend>> b;
    b.push_back(std::make_unique<FakeBackend>(world_));
    auto m = SandboxManager::New(o, std::move(b), std::make_unique<FakeLayers>(layer_state_));
    EXPECT_OK(m);
    EXPECT_OK((*m)->Start());
    return std::move(*m);
  }
  CreateRequest Req() {
    CreateRequest r;
    r.layers = {"base/debian@12"};
    return r;
  }

  std::string root_;
  std::shared_ptr<FakeWorld> world_;
  std::shared_ptr<FakeLayerState> layer_state_;
  std::unique_ptr<SandboxManager> manager_;
};

TEST_F(LifecycleTest, TtlExpiryDestroysOnlyExpiredSandboxes) {
  manager_ = NewManager();
  CreateRequest short_ttl = Req();
  short_ttl.ttl_s = 1;
  auto a = manager_->Create(short_ttl);
  auto b = manager_->Create(Req());
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_GT(a->expires_at_ns, a->created_at_ns);
  EXPECT_EQ(b->expires_at_ns, 0);
  EXPECT_TRUE(manager_->ReapExpired().empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_EQ(manager_->ReapExpired(), std::vector<std::string>{a->id});
  EXPECT_THAT(manager_->Get(a->id), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_FALSE(world_->IsAlive(a->id));
  EXPECT_OK(manager_->Get(b->id));
}

TEST_F(LifecycleTest, IdleTimeoutRestartsWithEveryCall) {
  manager_ = NewManager();
  CreateRequest r = Req();
  r.idle_timeout_s = 1;
  auto a = manager_->Create(r);
  ASSERT_OK(a);
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    runtime::ExecSpec spec;
    spec.shell = "true";
    ASSERT_OK(manager_->Exec(a->id, spec));
    EXPECT_TRUE(manager_->ReapExpired().empty()) << "reaped although active, round " << i;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_EQ(manager_->ReapExpired(), std::vector<std::string>{a->id});
}

TEST_F(LifecycleTest, RunningExecIsNeverIdle) {
  manager_ = NewManager();
  CreateRequest r = Req();
  r.idle_timeout_s = 1;
  auto a = manager_->Create(r);
  ASSERT_OK(a);
  world_->block_exec = true;
  auto fut = std::async(std::launch::async, [&] {
    runtime::ExecSpec spec;
    spec.shell = "sleep";
    return manager_->Exec(a->id, spec);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_TRUE(manager_->ReapExpired().empty());
  ASSERT_OK(manager_->Destroy(a->id));
  EXPECT_OK(fut.get());
}

TEST_F(LifecycleTest, ExtendTtlIsPersistedAcrossRestart) {
  manager_ = NewManager();
  CreateRequest r = Req();
  r.ttl_s = 1;
  auto a = manager_->Create(r);
  ASSERT_OK(a);
  auto ext = manager_->ExtendTtl(a->id, 3600);
  ASSERT_OK(ext);
  EXPECT_GT(ext->expires_at_ns, a->expires_at_ns + int64_t{3000} * 1000000000);
  manager_.reset();  // daemon stops; the sandbox lives on
  manager_ = NewManager();
  auto got = manager_->Get(a->id);
  ASSERT_OK(got);
  EXPECT_EQ(got->expires_at_ns, ext->expires_at_ns);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_TRUE(manager_->ReapExpired().empty());
  // An expired deadline found at start is enforced too.
  ASSERT_OK(manager_->ExtendTtl(a->id, 1));
  manager_.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  manager_ = NewManager();
  EXPECT_EQ(manager_->ReapExpired(), std::vector<std::string>{a->id});
  EXPECT_THAT(manager_->ExtendTtl("n7-nope", 5), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(LifecycleTest, RequestIdRunsOnceAndConcurrentDuplicatesWait) {
  manager_ = NewManager();
  auto a = manager_->Create(Req());
  ASSERT_OK(a);
  std::atomic<int> runs{0};
  auto run = [&]() -> StatusOr<RecordedCall> {
    ++runs;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    RecordedCall r;
    r.bytes = 1000 + runs.load();
    return r;
  };
  constexpr int kCallers = 4;
  std::vector<std::future<StatusOr<RecordedCall>>> futs;
  futs.reserve(kCallers);
  for (int i = 0; i < kCallers; ++i) {
    futs.push_back(std::async(std::launch::async, [&] { return manager_->Idempotent(a->id, "r1", run); }));
  }
  for (auto& f : futs) {
    auto r = f.get();
    ASSERT_OK(r);
    EXPECT_EQ(r->bytes, 1001u);
  }
  EXPECT_EQ(runs.load(), 1);
  // A failed call is not recorded: the retry runs.
  auto fail = [&]() -> StatusOr<RecordedCall> {
    ++runs;
    return absl::UnavailableError("boom");
  };
  EXPECT_THAT(manager_->Idempotent(a->id, "r2", fail), ::testing::Not(IsOk()));
  EXPECT_THAT(manager_->Idempotent(a->id, "r2", fail), ::testing::Not(IsOk()));
  EXPECT_EQ(runs.load(), 3);
  // Bounded: the oldest ids are forgotten (max_recorded_calls = 4).
  for (int i = 0; i < 5; ++i) ASSERT_OK(manager_->Idempotent(a->id, "k" + std::to_string(i), run));
  int before = runs.load();
  ASSERT_OK(manager_->Idempotent(a->id, "r1", run));
  EXPECT_EQ(runs.load(), before + 1);
  ASSERT_OK(manager_->Idempotent(a->id, "k4", run));
  EXPECT_EQ(runs.load(), before + 1);
  EXPECT_THAT(manager_->Idempotent(a->id, std::string(300, 'x'), run), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(LifecycleTest, ExecWithRequestIdAndAuditLog) {
  manager_ = NewManager();
  auto a = manager_->Create(Req());
  ASSERT_OK(a);
  runtime::ExecSpec spec;
  spec.shell = "echo hi";
  spec.stdin_data = "abc";
  auto r1 = manager_->Exec(a->id, spec, "req-1");
  auto r2 = manager_->Exec(a->id, spec, "req-1");
  ASSERT_OK(r1);
  ASSERT_OK(r2);
  EXPECT_EQ(r1->stdout_data, r2->stdout_data);
  manager_->Audit(a->id, {{"op", "write"}, {"path", "/x"}, {"bytes", 3}});
  auto log = manager_->AuditLog(a->id);
  ASSERT_OK(log);
  ASSERT_EQ(log->size(), 3u);
  EXPECT_EQ((*log)[0]["op"], "exec");
  EXPECT_EQ((*log)[0]["shell"], "echo hi");
  EXPECT_EQ((*log)[0]["exit_code"], 3);
  EXPECT_EQ((*log)[0]["stdin_bytes"], 3);
  EXPECT_EQ((*log)[0]["replayed"], false);
  EXPECT_EQ((*log)[1]["replayed"], true);
  EXPECT_EQ((*log)[2]["op"], "write");
  const std::string path = root_ + "/state/audit/" + a->id + ".jsonl";
  EXPECT_TRUE(fs::exists(path));
  ASSERT_OK(manager_->Destroy(a->id));
  EXPECT_FALSE(fs::exists(path));
  EXPECT_THAT(manager_->AuditLog(a->id), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(LifecycleTest, PauseUnsupportedByBackendIsAnErrorAndStateStaysRunning) {
  manager_ = NewManager();
  auto a = manager_->Create(Req());
  ASSERT_OK(a);
  EXPECT_THAT(manager_->Pause(a->id), StatusIs(absl::StatusCode::kUnimplemented));
  EXPECT_EQ(manager_->Get(a->id)->state, SandboxState::kRunning);
  EXPECT_THAT(manager_->Snapshot({a->id, "", {}, true}), StatusIs(absl::StatusCode::kUnimplemented));
}

TEST_F(LifecycleTest, PristineLayersEndAtTheFirstLayerASandboxMade) {
  layer_state_->Add("workspace/snap@1", std::string(64, '5'), /*from_sandbox=*/true);
  layer_state_->Add("toolset/py@1", std::string(64, '6'));
  manager_ = NewManager();
  CreateRequest r = Req();
  r.layers = {"base/debian@12", "toolset/py@1", "workspace/snap@1", "toolset/py@1"};
  auto a = manager_->Create(r);
  ASSERT_OK(a);
  EXPECT_EQ(a->pristine_layers,
            (std::vector<std::string>{"sha256:" + std::string(kBaseHex), "sha256:" + std::string(64, '6')}));
  EXPECT_EQ(a->layer_digests.size(), 4u);
  // persisted: a restarted daemon keeps the lineage
  manager_.reset();
  manager_ = NewManager();
  auto again = manager_->Get(a->id);
  ASSERT_OK(again);
  EXPECT_EQ(again->pristine_layers, a->pristine_layers);
  // grading names where the solution lives
  GradeRequest g;
  g.id = a->id;
  g.grader.shell = "true";
  EXPECT_THAT(manager_->Grade(g), StatusIs(absl::StatusCode::kInvalidArgument));
  g.solution = {"w/pkg"};
  EXPECT_THAT(manager_->Grade(g), StatusIs(absl::StatusCode::kInvalidArgument));
  g.solution = {"/w/../etc"};
  EXPECT_THAT(manager_->Grade(g), StatusIs(absl::StatusCode::kInvalidArgument));
  // a sandbox whose bottom layer a sandbox made has nothing pristine to grade with
  r.layers = {"workspace/snap@1", "toolset/py@1"};
  auto b = manager_->Create(r);
  ASSERT_OK(b);
  EXPECT_TRUE(b->pristine_layers.empty());
  g.id = b->id;
  g.solution = {"/w/pkg"};
  auto gr = manager_->Grade(g);
  EXPECT_THAT(gr, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(gr.status().message().find("no pristine layers"), std::string::npos) << gr.status();
}

TEST_F(LifecycleTest, SuspendUnsupportedByBackendIsAnErrorAndStateStaysRunning) {
  manager_ = NewManager();
  auto a = manager_->Create(Req());
  ASSERT_OK(a);
  EXPECT_THAT(manager_->Suspend(a->id), StatusIs(absl::StatusCode::kUnimplemented));
  EXPECT_EQ(manager_->Get(a->id)->state, SandboxState::kRunning);
  EXPECT_THAT(manager_->Suspend("n7-nope"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(manager_->SuspendJob("none", "test"), 0u);
  EXPECT_STREQ(SandboxStateName(SandboxState::kSuspended), "suspended");
}

}  // namespace
}  // namespace warren::node
