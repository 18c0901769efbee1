// End to end: the real warrend binary (real layer store, mount cache and
// container backend) driven over its unix socket with the generated stubs.
// Needs root; skipped otherwise.
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "status_matchers.h"
#include "warren/v1/warren.grpc.pb.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
namespace v1 = ::warren::v1;
using namespace std::chrono_literals;

std::string Sh(const std::string& cmd) {
  std::string out;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  ::pclose(f);
  return out;
}

class WarrendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root";
    if (access("/bin/busybox", X_OK) != 0) GTEST_SKIP() << "needs /bin/busybox (busybox-static)";
    char tmpl[] = "/tmp/warren-e2e-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    state_ = root_ + "/state";
    socket_ = root_ + "/run/warrend.sock";
    image_ = root_ + "/image";
    fs::create_directories(image_ + "/bin");
    fs::create_directories(image_ + "/etc");
    fs::create_directories(image_ + "/w");
    fs::copy_file("/bin/busybox", image_ + "/bin/busybox");
    std::istringstream in(Sh("/bin/busybox --list"));
    for (std::string applet; std::getline(in, applet);) {
      if (applet.empty() || applet == "busybox") continue;
      ASSERT_EQ(symlink("busybox", (image_ + "/bin/" + applet).c_str()), 0);
    }
    std::ofstream(image_ + "/etc/passwd") << "root:x:0:0:root:/root:/bin/sh\n";
  }

  void TearDown() override {
    if (root_.empty()) return;
    // A failed assertion may leave sandboxes: destroy them through the daemon.
    if (pid_ > 0) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + 5s);
      v1::ListSandboxesResponse all;
      auto stub = v1::Sandboxes::NewStub(channel_);
      if (stub->List(&ctx, v1::ListSandboxesRequest(), &all).ok()) {
        for (const auto& sb : all.sandboxes()) {
          grpc::ClientContext dctx;
          dctx.set_deadline(std::chrono::system_clock::now() + 10s);
          v1::DestroySandboxRequest req;
          req.set_id(sb.id());
          v1::DestroySandboxResponse resp;
          stub->Destroy(&dctx, req, &resp);
        }
      }
    }
    StopDaemon(SIGTERM);
    // Layer mounts outlive the daemon by design (re-adopted on restart); the
    // test owns this state dir, so it unmounts what is left under it.
    std::ifstream mi("/proc/self/mountinfo");
    std::vector<std::string> mounts;
    for (std::string line; std::getline(mi, line);) {
      std::istringstream ls(line);
      std::string a, b, c, d, mp;
      ls >> a >> b >> c >> d >> mp;
      if (mp.rfind(root_, 0) == 0) mounts.push_back(mp);
    }
    for (auto it = mounts.rbegin(); it != mounts.rend(); ++it) umount2(it->c_str(), MNT_DETACH);
    fs::remove_all(root_);
  }

  pid_t Spawn(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {WARREND_PATH,     "--state-dir", state_, "--socket",     socket_, "--init-path",
                                     WARREN_INIT_PATH, "--node-id",   "e2e",  "--log-format", "json"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    argv.reserve(args.size() + 1);
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    std::string log = root_ + "/warrend.log";
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    EXPECT_EQ(rc, 0);
    return pid;
  }

  // Starts the daemon and waits (bounded) until its socket answers.
  bool StartDaemon() {
    pid_ = Spawn();
    channel_ = grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials());
    for (int i = 0; i < 200; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        ADD_FAILURE() << "warrend exited early:\n" << Log();
        return false;
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + 200ms);
      v1::NodeStatus st;
      if (v1::Node::NewStub(channel_)->Status(&ctx, v1::NodeStatusRequest(), &st).ok()) return true;
      std::this_thread::sleep_for(50ms);
    }
    ADD_FAILURE() << "warrend did not answer:\n" << Log();
    return false;
  }

  void StopDaemon(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    int status = 0;
    for (int i = 0; i < 300 && waitpid(pid_, &status, WNOHANG) == 0; ++i) std::this_thread::sleep_for(50ms);
    if (waitpid(pid_, &status, WNOHANG) == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
    }
    pid_ = 0;
  }

  std::string Log() {
    std::ifstream f(root_ + "/warrend.log");
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

  grpc::Status Exec(const std::string& id, const std::string& shell, v1::ExecResult* r) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 30s);
    v1::ExecRequest req;
    req.set_sandbox_id(id);
    req.set_shell(shell);
    return v1::Sandboxes::NewStub(channel_)->Exec(&ctx, req, r);
  }

  std::string root_, state_, socket_, image_;
  pid_t pid_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(WarrendTest, BuildCreateExecFilesRestartDestroy) {
  ASSERT_TRUE(StartDaemon());
  // A second daemon on the same state dir refuses to start.
  {
    pid_t second = Spawn();
    int status = 0;
    ASSERT_EQ(waitpid(second, &status, 0), second);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0);
    EXPECT_NE(Log().find("another warrend (pid "), std::string::npos) << Log();
  }
  {
    grpc::ClientContext ctx;
    v1::Layer layer;
    auto w = v1::Layers::NewStub(channel_)->Build(&ctx, &layer);
    v1::BuildLayerRequest m;
    m.set_name("base/busybox@1");
    m.set_source_dir(image_);
    ASSERT_TRUE(w->Write(m));
    w->WritesDone();
    grpc::Status s = w->Finish();
    ASSERT_OK(s) << Log();
    EXPECT_EQ(layer.digest().rfind("sha256:", 0), 0u);
  }
  auto stub = v1::Sandboxes::NewStub(channel_);
  v1::Sandbox sb;
  {
    grpc::ClientContext ctx;
    v1::CreateSandboxRequest req;
    req.add_layers("base/busybox@1");
    req.mutable_resources()->set_memory_mb(256);
    (*req.mutable_labels())["t"] = "e2e";
    grpc::Status s = stub->Create(&ctx, req, &sb);
    ASSERT_OK(s) << Log();
  }
  EXPECT_EQ(sb.id().rfind("e2e-", 0), 0u);
  v1::ExecResult r;
  grpc::Status s = Exec(sb.id(), "printf 'ok \\377'; echo err >&2; exit 3", &r);
  ASSERT_OK(s) << Log();
  EXPECT_EQ(r.exit_code(), 3);
  EXPECT_EQ(r.stdout(), "ok \xff");
  EXPECT_EQ(r.stderr(), "err\n");

  auto files = v1::Files::NewStub(channel_);
  {
    grpc::ClientContext ctx;
    v1::WriteFileResponse resp;
    auto w = files->Write(&ctx, &resp);
    v1::WriteFileRequest m;
    m.set_sandbox_id(sb.id());
    m.set_path("/w/a.txt");
    m.set_data("hello");
    ASSERT_TRUE(w->Write(m));
    w->WritesDone();
    grpc::Status ws = w->Finish();
    ASSERT_OK(ws);
    EXPECT_EQ(resp.bytes_written(), 5u);
  }
  ASSERT_OK(Exec(sb.id(), "cat /w/a.txt", &r));
  EXPECT_EQ(r.stdout(), "hello");

  // kill -9 the daemon: the sandbox survives, the stale socket is replaced,
  // the next daemon re-adopts it.
  StopDaemon(SIGKILL);
  ASSERT_TRUE(fs::exists(socket_));
  ASSERT_TRUE(StartDaemon());
  {
    grpc::ClientContext ctx;
    v1::GetSandboxRequest req;
    req.set_id(sb.id());
    v1::Sandbox got;
    grpc::Status gs = stub->Get(&ctx, req, &got);
    ASSERT_OK(gs) << Log();
    EXPECT_EQ(got.state(), v1::SANDBOX_STATE_RUNNING);
  }
  stub = v1::Sandboxes::NewStub(channel_);
  ASSERT_OK(Exec(sb.id(), "cat /w/a.txt", &r)) << Log();
  EXPECT_EQ(r.stdout(), "hello");
  {
    grpc::ClientContext ctx;
    v1::RemoveLayerRequest req;
    req.set_ref("base/busybox@1");
    v1::Empty e;
    EXPECT_EQ(v1::Layers::NewStub(channel_)->Remove(&ctx, req, &e).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    grpc::ClientContext ctx;
    v1::DestroySandboxRequest req;
    req.set_id(sb.id());
    v1::DestroySandboxResponse resp;
    grpc::Status ds = stub->Destroy(&ctx, req, &resp);
    ASSERT_OK(ds);
  }
  EXPECT_TRUE(fs::is_empty(state_ + "/sandboxes"));
  EXPECT_TRUE(fs::is_empty(state_ + "/run"));
  // Graceful stop removes the socket.
  StopDaemon(SIGTERM);
  EXPECT_FALSE(fs::exists(socket_));
  std::string log = Log();
  EXPECT_NE(log.find("\"msg\":\"sandbox adopted\""), std::string::npos) << log;
  EXPECT_NE(log.find("\"sandbox\":\"" + sb.id() + "\""), std::string::npos);
}

TEST_F(WarrendTest, SigtermWithLongExecLeavesSandboxRunning) {
  ASSERT_TRUE(StartDaemon());
  {
    grpc::ClientContext ctx;
    v1::Layer layer;
    auto w = v1::Layers::NewStub(channel_)->Build(&ctx, &layer);
    v1::BuildLayerRequest m;
    m.set_name("base/busybox@1");
    m.set_source_dir(image_);
    ASSERT_TRUE(w->Write(m));
    w->WritesDone();
    ASSERT_OK(w->Finish());
  }
  v1::Sandbox sb;
  {
    grpc::ClientContext ctx;
    v1::CreateSandboxRequest req;
    req.add_layers("base/busybox@1");
    ASSERT_OK(v1::Sandboxes::NewStub(channel_)->Create(&ctx, req, &sb)) << Log();
  }
  std::thread long_exec([&] {
    v1::ExecResult r;
    Exec(sb.id(), "sleep 120", &r);  // cut off by the shutdown
  });
  std::this_thread::sleep_for(500ms);
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = pid_;
  kill(pid, SIGTERM);
  int status = 0;
  bool exited = false;
  for (int i = 0; i < 600 && !exited; ++i) {
    exited = waitpid(pid, &status, WNOHANG) == pid;
    if (!exited) std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(exited) << Log();
  pid_ = 0;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 25s);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  long_exec.join();
  EXPECT_FALSE(fs::exists(socket_));
  // The sandbox was not destroyed: the next daemon adopts it and it works.
  ASSERT_TRUE(StartDaemon());
  v1::ExecResult r;
  grpc::Status s = Exec(sb.id(), "echo alive", &r);
  ASSERT_OK(s) << Log();
  EXPECT_EQ(r.stdout(), "alive\n");
}

}  // namespace
