// Lifecycle of the node (issue 4): TTL / idle reaping, ExtendTtl persisted
// across a restart, idempotent calls, the audit log (over the fake backend),
// and the upper-tree copy used by snapshots and grading (on a real file
// system: whiteouts, opaque xattrs, hardlinks, symlinks, id shift, excludes).
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
#include "node/upper_copy.h"

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
    EXPECT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE((*m)->Start().ok());
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
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_GT(a->expires_at_ns, a->created_at_ns);
  EXPECT_EQ(b->expires_at_ns, 0);
  EXPECT_TRUE(manager_->ReapExpired().empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_EQ(manager_->ReapExpired(), std::vector<std::string>{a->id});
  EXPECT_EQ(manager_->Get(a->id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(world_->IsAlive(a->id));
  EXPECT_TRUE(manager_->Get(b->id).ok());
}

TEST_F(LifecycleTest, IdleTimeoutRestartsWithEveryCall) {
  manager_ = NewManager();
  CreateRequest r = Req();
  r.idle_timeout_s = 1;
  auto a = manager_->Create(r);
  ASSERT_TRUE(a.ok());
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    runtime::ExecSpec spec;
    spec.shell = "true";
    ASSERT_TRUE(manager_->Exec(a->id, spec).ok());
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
  ASSERT_TRUE(a.ok());
  world_->block_exec = true;
  auto fut = std::async(std::launch::async, [&] {
    runtime::ExecSpec spec;
    spec.shell = "sleep";
    return manager_->Exec(a->id, spec);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_TRUE(manager_->ReapExpired().empty());
  ASSERT_TRUE(manager_->Destroy(a->id).ok());
  EXPECT_TRUE(fut.get().ok());
}

TEST_F(LifecycleTest, ExtendTtlIsPersistedAcrossRestart) {
  manager_ = NewManager();
  CreateRequest r = Req();
  r.ttl_s = 1;
  auto a = manager_->Create(r);
  ASSERT_TRUE(a.ok());
  auto ext = manager_->ExtendTtl(a->id, 3600);
  ASSERT_TRUE(ext.ok()) << ext.status();
  EXPECT_GT(ext->expires_at_ns, a->expires_at_ns + int64_t{3000} * 1000000000);
  manager_.reset();  // daemon stops; the sandbox lives on
  manager_ = NewManager();
  auto got = manager_->Get(a->id);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->expires_at_ns, ext->expires_at_ns);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_TRUE(manager_->ReapExpired().empty());
  // An expired deadline found at start is enforced too.
  ASSERT_TRUE(manager_->ExtendTtl(a->id, 1).ok());
  manager_.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  manager_ = NewManager();
  EXPECT_EQ(manager_->ReapExpired(), std::vector<std::string>{a->id});
  EXPECT_EQ(manager_->ExtendTtl("n7-nope", 5).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(LifecycleTest, RequestIdRunsOnceAndConcurrentDuplicatesWait) {
  manager_ = NewManager();
  auto a = manager_->Create(Req());
  ASSERT_TRUE(a.ok());
  std::atomic<int> runs{0};
  auto run = [&]() -> StatusOr<RecordedCall> {
    ++runs;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    RecordedCall r;
    r.bytes = 1000 + runs.load();
    return r;
  };
  std::vector<std::future<StatusOr<RecordedCall>>> futs;
  for (int i = 0; i < 4; ++i) {
    futs.push_back(std::async(std::launch::async, [&] { return manager_->Idempotent(a->id, "r1", run); }));
  }
  for (auto& f : futs) {
    auto r = f.get();
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->bytes, 1001u);
  }
  EXPECT_EQ(runs.load(), 1);
  // A failed call is not recorded: the retry runs.
  auto fail = [&]() -> StatusOr<RecordedCall> {
    ++runs;
    return absl::UnavailableError("boom");
  };
  EXPECT_FALSE(manager_->Idempotent(a->id, "r2", fail).ok());
  EXPECT_FALSE(manager_->Idempotent(a->id, "r2", fail).ok());
  EXPECT_EQ(runs.load(), 3);
  // Bounded: the oldest ids are forgotten (max_recorded_calls = 4).
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(manager_->Idempotent(a->id, "k" + std::to_string(i), run).ok());
  int before = runs.load();
  ASSERT_TRUE(manager_->Idempotent(a->id, "r1", run).ok());
  EXPECT_EQ(runs.load(), before + 1);
  ASSERT_TRUE(manager_->Idempotent(a->id, "k4", run).ok());
  EXPECT_EQ(runs.load(), before + 1);
  EXPECT_EQ(manager_->Idempotent(a->id, std::string(300, 'x'), run).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(LifecycleTest, ExecWithRequestIdAndAuditLog) {
  manager_ = NewManager();
  auto a = manager_->Create(Req());
  ASSERT_TRUE(a.ok());
  runtime::ExecSpec spec;
  spec.shell = "echo hi";
  spec.stdin_data = "abc";
  auto r1 = manager_->Exec(a->id, spec, "req-1");
  auto r2 = manager_->Exec(a->id, spec, "req-1");
  ASSERT_TRUE(r1.ok() && r2.ok());
  EXPECT_EQ(r1->stdout_data, r2->stdout_data);
  manager_->Audit(a->id, {{"op", "write"}, {"path", "/x"}, {"bytes", 3}});
  auto log = manager_->AuditLog(a->id);
  ASSERT_TRUE(log.ok());
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
  ASSERT_TRUE(manager_->Destroy(a->id).ok());
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(manager_->AuditLog(a->id).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(LifecycleTest, PauseUnsupportedByBackendIsAnErrorAndStateStaysRunning) {
  manager_ = NewManager();
  auto a = manager_->Create(Req());
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(manager_->Pause(a->id).code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(manager_->Get(a->id)->state, SandboxState::kRunning);
  EXPECT_EQ(manager_->Snapshot({a->id, "", {}, true}).status().code(), absl::StatusCode::kUnimplemented);
}

TEST_F(LifecycleTest, SuspendUnsupportedByBackendIsAnErrorAndStateStaysRunning) {
  manager_ = NewManager();
  auto a = manager_->Create(Req());
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(manager_->Suspend(a->id).code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(manager_->Get(a->id)->state, SandboxState::kRunning);
  EXPECT_EQ(manager_->Suspend("n7-nope").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->SuspendJob("none", "test"), 0u);
  EXPECT_STREQ(SandboxStateName(SandboxState::kSuspended), "suspended");
}

// ---------------------------------------------------------------- upper copy

class UpperCopyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/warren-upper-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    up_ = root_ + "/upper";
    ASSERT_EQ(::mkdir(up_.c_str(), 0755), 0);
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const std::string& rel, const std::string& data, mode_t mode = 0644) {
    std::ofstream(up_ + rel) << data;
    ASSERT_EQ(::chmod((up_ + rel).c_str(), mode), 0);
  }
  struct stat Lstat(const std::string& p) {
    struct stat st {};
    EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
    return st;
  }
  std::string root_, up_;
};

TEST_F(UpperCopyTest, KeepsWhiteoutsOpaqueHardlinksSymlinksAndShiftsIds) {
  const uint32_t base = 1000000;
  ASSERT_EQ(::mkdir((up_ + "/d").c_str(), 0750), 0);
  ASSERT_EQ(::lsetxattr((up_ + "/d").c_str(), "trusted.overlay.opaque", "y", 1, 0), 0);
  ASSERT_EQ(::lsetxattr((up_ + "/d").c_str(), "trusted.overlay.impure", "y", 1, 0), 0);
  Write("/d/f", "hello", 0640);
  ASSERT_EQ(::lsetxattr((up_ + "/d/f").c_str(), "user.tag", "v", 1, 0), 0);
  ASSERT_EQ(::link((up_ + "/d/f").c_str(), (up_ + "/d/hard").c_str()), 0);
  ASSERT_EQ(::symlink("../etc/passwd", (up_ + "/d/sym").c_str()), 0);
  ASSERT_EQ(::mknod((up_ + "/gone").c_str(), S_IFCHR | 0, makedev(0, 0)), 0);
  ASSERT_EQ(::lchown((up_ + "/d/f").c_str(), base + 1000, base + 1000), 0);
  ASSERT_EQ(::lchown((up_ + "/d").c_str(), base, base), 0);
  ASSERT_EQ(::lchown((up_ + "/gone").c_str(), 5, 5), 0);  // outside the range
  Write("/answer.txt", "42");
  ASSERT_EQ(::mkdir((up_ + "/cache").c_str(), 0755), 0);
  Write("/cache/x", "x");

  UniqueFd src(::open(up_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(src.valid());
  UpperCopyOptions o;
  o.host_root_id = base;
  o.id_range = 65536;
  o.exclude = {"/answer.txt", "/cache/"};
  const std::string dst = root_ + "/out";
  ASSERT_TRUE(CopyUpperTree(src.get(), dst, o).ok());

  struct stat d = Lstat(dst + "/d");
  EXPECT_TRUE(S_ISDIR(d.st_mode));
  EXPECT_EQ(d.st_mode & 07777, 0750u);
  EXPECT_EQ(d.st_uid, 0u);
  char v[8];
  EXPECT_EQ(::lgetxattr((dst + "/d").c_str(), "trusted.overlay.opaque", v, sizeof v), 1);
  EXPECT_EQ(::lgetxattr((dst + "/d").c_str(), "trusted.overlay.impure", v, sizeof v), -1);
  struct stat f = Lstat(dst + "/d/f");
  struct stat h = Lstat(dst + "/d/hard");
  EXPECT_EQ(f.st_ino, h.st_ino);
  EXPECT_EQ(f.st_mode & 07777, 0640u);
  EXPECT_EQ(f.st_uid, 1000u);
  EXPECT_EQ(f.st_gid, 1000u);
  EXPECT_EQ(::lgetxattr((dst + "/d/f").c_str(), "user.tag", v, sizeof v), 1);
  EXPECT_EQ(fs::read_symlink(dst + "/d/sym"), "../etc/passwd");
  struct stat w = Lstat(dst + "/gone");
  EXPECT_TRUE(S_ISCHR(w.st_mode));
  EXPECT_EQ(w.st_rdev, makedev(0, 0));
  EXPECT_EQ(w.st_uid, 65534u);
  EXPECT_FALSE(fs::exists(dst + "/answer.txt"));
  EXPECT_FALSE(fs::exists(dst + "/cache"));
  std::ifstream in(dst + "/d/f");
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(data, "hello");

  // An existing destination is refused and left alone.
  EXPECT_FALSE(CopyUpperTree(src.get(), dst, o).ok());
  EXPECT_TRUE(fs::exists(dst + "/d/f"));
}

TEST_F(UpperCopyTest, UpperTouchesAndRestoreFromLowers) {
  // lower: /t/tests/a, /t/keep ; upper: /t opaque with /t/new, /x whiteout
  const std::string lower = root_ + "/lower";
  fs::create_directories(lower + "/t/tests");
  std::ofstream(lower + "/t/tests/a") << "pristine";
  std::ofstream(lower + "/t/keep") << "k";
  fs::create_directories(lower + "/x");
  ASSERT_EQ(::mkdir((up_ + "/t").c_str(), 0755), 0);
  ASSERT_EQ(::lsetxattr((up_ + "/t").c_str(), "trusted.overlay.opaque", "y", 1, 0), 0);
  Write("/t/new", "n");
  ASSERT_EQ(::mknod((up_ + "/x").c_str(), S_IFCHR | 0, makedev(0, 0)), 0);
  ASSERT_EQ(::mkdir((up_ + "/u").c_str(), 0755), 0);
  Write("/u/file", "f");
  UniqueFd src(::open(up_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  EXPECT_TRUE(UpperTouches(src.get(), "/t/tests/a"));  // ancestor opaque
  EXPECT_TRUE(UpperTouches(src.get(), "/x/y"));        // ancestor whiteout
  EXPECT_TRUE(UpperTouches(src.get(), "/u"));          // something below
  EXPECT_TRUE(UpperTouches(src.get(), "/u/file"));
  EXPECT_FALSE(UpperTouches(src.get(), "/u/other"));
  EXPECT_FALSE(UpperTouches(src.get(), "/v"));

  const std::string dst = root_ + "/out";
  UpperCopyOptions o;
  o.exclude = {"/t/tests", "/x/y"};
  ASSERT_TRUE(CopyUpperTree(src.get(), dst, o).ok());
  ASSERT_TRUE(RestoreFromLowers(dst, "/t/tests", {lower}).ok());
  ASSERT_TRUE(RestoreFromLowers(dst, "/x/y", {lower}).ok());  // absent in pristine
  ASSERT_TRUE(RestoreFromLowers(dst, "/t/missing", {lower}).ok());
  std::ifstream in(dst + "/t/tests/a");
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(data, "pristine");
  EXPECT_TRUE(fs::exists(dst + "/t/new"));  // the agent's other changes stay
  EXPECT_FALSE(fs::exists(dst + "/t/keep"));  // opaque: not copied from the lower
  EXPECT_FALSE(fs::exists(dst + "/t/missing"));
  EXPECT_TRUE(PathExcluded("/a/b/__pycache__", {"*/__pycache__"}));
  EXPECT_TRUE(PathExcluded("/a/b.pyc", {"*.pyc"}));
  EXPECT_FALSE(PathExcluded("/a/bc", {"/a/b"}));
}

}  // namespace
}  // namespace warren::node
