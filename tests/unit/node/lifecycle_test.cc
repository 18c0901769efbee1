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
#include "node/upper_copy.h"
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
  std::vector<std::future<StatusOr<RecordedCall>>> futs;
  futs.reserve(4);
  for (int i = 0; i < 4; ++i) {
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
  EXPECT_EQ(a->pristine_layers, (std::vector<std::string>{"sha256:" + std::string(kBaseHex),
                                                          "sha256:" + std::string(64, '6')}));
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
  ASSERT_OK(CopyUpperTree(src.get(), dst, o));

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
  EXPECT_THAT(CopyUpperTree(src.get(), dst, o), ::testing::Not(IsOk()));
  EXPECT_TRUE(fs::exists(dst + "/d/f"));
}

TEST_F(UpperCopyTest, UpperTouchesAndExcludes) {
  // upper: /t opaque with /t/new, /x whiteout, /u/file
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
  EXPECT_TRUE(PathExcluded("/a/b/__pycache__", {"*/__pycache__"}));
  EXPECT_TRUE(PathExcluded("/a/b.pyc", {"*.pyc"}));
  EXPECT_FALSE(PathExcluded("/a/bc", {"/a/b"}));
  EXPECT_TRUE(PathWithin("/a/b/c", "/a/b"));
  EXPECT_TRUE(PathWithin("/a/b", "/a/b"));
  EXPECT_FALSE(PathWithin("/a/bc", "/a/b"));
}

// The diff of a task sandbox over a pristine lower:
//   lower: /t/tests/a, /t/keep, /t/pkg/x, /x/, /etc/
//   upper: /t opaque with /t/new and /t/pkg/x, /x whiteout, /u/file
class SolutionCopyTest : public UpperCopyTest {
 protected:
  void SetUp() override {
    UpperCopyTest::SetUp();
    lower_ = root_ + "/lower";
    fs::create_directories(lower_ + "/t/tests");
    fs::create_directories(lower_ + "/t/pkg");
    fs::create_directories(lower_ + "/x");
    fs::create_directories(lower_ + "/etc");
    ASSERT_EQ(::chmod((lower_ + "/t").c_str(), 0751), 0);
    std::ofstream(lower_ + "/t/tests/a") << "pristine";
    std::ofstream(lower_ + "/t/keep") << "k";
    std::ofstream(lower_ + "/t/pkg/x") << "old";
    ASSERT_EQ(::mkdir((up_ + "/t").c_str(), 0751), 0);
    ASSERT_EQ(::lsetxattr((up_ + "/t").c_str(), "trusted.overlay.opaque", "y", 1, 0), 0);
    Write("/t/new", "n");
    ASSERT_EQ(::mkdir((up_ + "/t/pkg").c_str(), 0755), 0);
    Write("/t/pkg/x", "new");
    ASSERT_EQ(::mknod((up_ + "/x").c_str(), S_IFCHR | 0, makedev(0, 0)), 0);
    ASSERT_EQ(::mkdir((up_ + "/u").c_str(), 0755), 0);
    Write("/u/file", "f");
    src_.reset(::open(up_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    lower_fd_.reset(::open(lower_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(src_.valid() && lower_fd_.valid());
  }
  std::string Read(const std::string& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  bool Opaque(const std::string& p) {
    char v[4];
    return ::lgetxattr(p.c_str(), "trusted.overlay.opaque", v, sizeof v) == 1;
  }
  std::string lower_;
  UniqueFd src_, lower_fd_;
};

TEST_F(SolutionCopyTest, CopiesOnlyTheSolutionWithPristineAncestors) {
  const std::string dst = root_ + "/out";
  ASSERT_OK(CopySolution(src_.get(), dst, {"/t/pkg", "/x/y", "/v/w"}, {}, {lower_fd_.get()}, {}));
  // the ancestor is a plain merging dir with the pristine mode
  struct stat t = Lstat(dst + "/t");
  EXPECT_TRUE(S_ISDIR(t.st_mode));
  EXPECT_EQ(t.st_mode & 07777, 0751u);
  EXPECT_FALSE(Opaque(dst + "/t"));
  // below a replaced ancestor the solution path is opaque: only the agent's
  // view of it shows
  EXPECT_TRUE(Opaque(dst + "/t/pkg"));
  EXPECT_EQ(Read(dst + "/t/pkg/x"), "new");
  EXPECT_FALSE(fs::exists(dst + "/t/new"));
  EXPECT_FALSE(fs::exists(dst + "/t/keep"));
  EXPECT_FALSE(fs::exists(dst + "/u"));
  // a solution path under a deleted ancestor is deleted
  struct stat w = Lstat(dst + "/x/y");
  EXPECT_TRUE(S_ISCHR(w.st_mode) && w.st_rdev == makedev(0, 0));
  EXPECT_FALSE(Opaque(dst + "/x"));
  // one the diff does not touch is not in the copy at all
  EXPECT_FALSE(fs::exists(dst + "/v"));
}

TEST_F(SolutionCopyTest, ProtectedPathsInsideTheSolutionShowThePristineLayers) {
  const std::string dst = root_ + "/out";
  ASSERT_OK(CopySolution(src_.get(), dst, {"/t"}, {"/t/tests/a"}, {lower_fd_.get()}, {}));
  EXPECT_FALSE(Opaque(dst + "/t"));  // not opaque: /t/tests/a comes from below
  EXPECT_FALSE(fs::exists(dst + "/t/tests"));
  EXPECT_EQ(Read(dst + "/t/new"), "n");
}

TEST_F(SolutionCopyTest, ListChangesReportsEverythingOutsideTheSolution) {
  std::vector<std::string> out;
  bool truncated = false;
  ASSERT_OK(ListChanges(src_.get(), {"/t/pkg"}, {lower_fd_.get()}, {}, 100, &out, &truncated));
  EXPECT_EQ(out, (std::vector<std::string>{"/t", "/t/new", "/u", "/x"}));
  EXPECT_FALSE(truncated);
  out.clear();
  ASSERT_OK(ListChanges(src_.get(), {"/t/pkg"}, {lower_fd_.get()}, {}, 2, &out, &truncated));
  EXPECT_EQ(out.size(), 2u);
  EXPECT_TRUE(truncated);
  // a chmod of a pristine dir is a change; a copied-up dir is not
  ASSERT_EQ(::mkdir((up_ + "/etc").c_str(), 0700), 0);
  out.clear();
  truncated = false;
  ASSERT_OK(ListChanges(src_.get(), {"/t", "/u", "/x"}, {lower_fd_.get()}, {}, 100, &out, &truncated));
  EXPECT_EQ(out, (std::vector<std::string>{"/etc"}));
  ASSERT_EQ(::chmod((up_ + "/etc").c_str(), 0755), 0);
  out.clear();
  ASSERT_OK(ListChanges(src_.get(), {"/t", "/u", "/x"}, {lower_fd_.get()}, {}, 100, &out, &truncated));
  EXPECT_TRUE(out.empty()) << out[0];
}

TEST_F(SolutionCopyTest, SymlinksInDiffsAndLayersAreNeverFollowedOnTheHost) {
  // host dir with a secret; the diff has /s -> host dir, the pristine layer
  // has /p -> host dir
  const std::string host = root_ + "/host";
  fs::create_directories(host + "/pkg");
  std::ofstream(host + "/pkg/secret") << "host secret";
  ASSERT_EQ(::symlink(host.c_str(), (up_ + "/s").c_str()), 0);
  ASSERT_EQ(::symlink(host.c_str(), (lower_ + "/p").c_str()), 0);
  // the agent replaced the pristine symlink /p by a directory
  fs::create_directories(up_ + "/p/pkg");
  Write("/p/pkg/q", "agent");
  const std::string dst = root_ + "/out";
  ASSERT_OK(CopySolution(src_.get(), dst, {"/s/pkg", "/p/pkg/q"}, {}, {lower_fd_.get()}, {}));
  // /s/pkg: its ancestor is a symlink in the diff: deleted, nothing copied
  struct stat w = Lstat(dst + "/s/pkg");
  EXPECT_TRUE(S_ISCHR(w.st_mode));
  EXPECT_FALSE(fs::exists(dst + "/s/pkg/secret"));
  // /p/pkg/q: a directory /p in the grade layer would hide the pristine
  // symlink: the solution path cannot enter
  EXPECT_FALSE(fs::exists(dst + "/p"));
  std::vector<std::string> out;
  bool truncated = false;
  ASSERT_OK(ListChanges(src_.get(), {"/t", "/u", "/x"}, {lower_fd_.get()}, {}, 100, &out, &truncated));
  EXPECT_EQ(out, (std::vector<std::string>{"/p", "/s"}));
}

TEST_F(UpperCopyTest, SparseFilesStaySparseAndCopiesAreBounded) {
  Write("/sparse", "");
  {
    UniqueFd f(::open((up_ + "/sparse").c_str(), O_WRONLY | O_CLOEXEC));
    ASSERT_EQ(::ftruncate(f.get(), off_t{1} << 30), 0);
    ASSERT_EQ(::pwrite(f.get(), "data", 4, off_t{1} << 29), 4);
  }
  UniqueFd src(::open(up_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  CopyBudget budget("sandbox n0-test", 128 << 20);
  UpperCopyOptions o;
  o.budget = &budget;
  const std::string dst = root_ + "/out";
  ASSERT_OK(CopyUpperTree(src.get(), dst, o));
  struct stat st = Lstat(dst + "/sparse");
  EXPECT_EQ(st.st_size, off_t{1} << 30);
  EXPECT_LT(st.st_blocks * 512, 1 << 20);  // holes kept
  EXPECT_LT(budget.used(), uint64_t{65} << 20);  // data + 1/16 of the size
  char buf[4];
  UniqueFd f(::open((dst + "/sparse").c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_EQ(::pread(f.get(), buf, 4, off_t{1} << 29), 4);
  EXPECT_EQ(std::string(buf, 4), "data");
  // over the limit: ResourceExhausted naming the sandbox and the limit, nothing left
  std::atomic<uint64_t> node_used{0};
  CopyBudget small("sandbox n0-test", 32 << 20, &node_used, 0);
  o.budget = &small;
  Status s = CopyUpperTree(src.get(), root_ + "/out2", o);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_NE(s.message().find("sandbox n0-test"), std::string::npos) << s;
  EXPECT_NE(s.message().find(std::to_string(32 << 20)), std::string::npos) << s;
  EXPECT_FALSE(fs::exists(root_ + "/out2"));
  small.ReleaseNode();
  EXPECT_EQ(node_used.load(), 0u);
  // the node-wide cap
  CopyBudget capped("sandbox n0-test", 0, &node_used, 1000);
  o.budget = &capped;
  s = CopyUpperTree(src.get(), root_ + "/out3", o);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_TRUE(capped.node_cap_hit());
}

TEST_F(UpperCopyTest, DeepTreesCopyWithoutARecursionLimitUpToPathMax) {
  std::string p = up_;
  for (int i = 0; i < 600; ++i) {
    p += "/d";
    ASSERT_EQ(::mkdir(p.c_str(), 0755), 0);
  }
  std::ofstream(p + "/f") << "deep";
  UniqueFd src(::open(up_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  const std::string dst = root_ + "/out";
  ASSERT_OK(CopyUpperTree(src.get(), dst, {}));
  EXPECT_TRUE(fs::exists(dst + p.substr(up_.size()) + "/f"));
  // longer than PATH_MAX: a clear FailedPrecondition, nothing left behind
  UniqueFd cur(::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  for (int i = 0; i < 1500; ++i) {
    ASSERT_EQ(::mkdirat(cur.get(), "d", 0755), 0);
    cur.reset(::openat(cur.get(), "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(cur.valid());
  }
  Status s = CopyUpperTree(src.get(), root_ + "/out2", {});
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(s.message().find("longer than a layer"), std::string::npos) << s;
  EXPECT_FALSE(fs::exists(root_ + "/out2"));
  std::vector<std::string> out;
  bool truncated = false;
  ASSERT_OK(ListChanges(src.get(), {"/other"}, {}, {}, 100, &out, &truncated));
  EXPECT_EQ(out, (std::vector<std::string>{"/d"}));
}

TEST_F(UpperCopyTest, SecurityXattrsAreDropped) {
  Write("/bin-with-cap", "x", 0755);
  const unsigned char cap[20] = {0x01, 0, 0, 0x02, 0, 0x20, 0, 0};  // v2, effective, CAP_NET_RAW
  ASSERT_EQ(::lsetxattr((up_ + "/bin-with-cap").c_str(), "security.capability", cap, sizeof cap, 0), 0);
  ASSERT_EQ(::lsetxattr((up_ + "/bin-with-cap").c_str(), "user.keep", "v", 1, 0), 0);
  UniqueFd src(::open(up_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  const std::string dst = root_ + "/out";
  ASSERT_OK(CopyUpperTree(src.get(), dst, {}));
  char v[32];
  EXPECT_EQ(::lgetxattr((dst + "/bin-with-cap").c_str(), "security.capability", v, sizeof v), -1);
  EXPECT_EQ(errno, ENODATA);
  EXPECT_EQ(::lgetxattr((dst + "/bin-with-cap").c_str(), "user.keep", v, sizeof v), 1);
}

}  // namespace
}  // namespace warren::node
