// Tests of the `warren` CLI: argument parsing into requests (no daemon), the
// output helpers, and whole invocations of RunCli() against an in-process
// fake warrend on a unix socket, which records what the CLI sent (requests,
// stream message counts, metadata) so the tests can assert on the wire.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/output.h"
#include "status_matchers.h"
#include "warren/v1/warren.grpc.pb.h"

namespace warren::cli {
namespace {

using ::testing::internal::CaptureStderr;
using ::testing::internal::CaptureStdout;
using ::testing::internal::GetCapturedStderr;
using ::testing::internal::GetCapturedStdout;

// Parses argv (without running) into `inv`; returns 0 or the CLI11 exit code.
int Parse(Invocation& inv, std::vector<std::string> args) {
  args.insert(args.begin(), "warren");
  std::vector<const char*> argv;
  argv.reserve(args.size());
  for (const auto& a : args) argv.push_back(a.c_str());
  std::unique_ptr<CLI::App> app = MakeApp(inv);
  CaptureStdout();
  CaptureStderr();
  int rc = ParseArgs(*app, inv, static_cast<int>(argv.size()), argv.data());
  GetCapturedStdout();
  GetCapturedStderr();
  return rc;
}

// ------------------------------------------------------------ parsing

TEST(ParseTest, CreateBuildsFullRequest) {
  Invocation inv;
  ASSERT_EQ(Parse(inv, {"create",
                        "--layer",
                        "base/debian-12",
                        "--layer",
                        "workspace/demo@1",
                        "--cpu",
                        "500",
                        "--memory",
                        "256",
                        "--disk",
                        "2048",
                        "--pids",
                        "64",
                        "--env",
                        "A=1",
                        "--env",
                        "B=x=y",
                        "--env",
                        "EMPTY=",
                        "--label",
                        "team=rl",
                        "--workdir",
                        "/w",
                        "--ttl",
                        "60",
                        "--job",
                        "run-1",
                        "--user",
                        "1000:1000",
                        "--json"}),
            0);
  EXPECT_EQ(inv.verb, "create");
  EXPECT_TRUE(inv.global.json);
  StatusOr<v1::CreateSandboxRequest> req = BuildCreateRequest(inv.create);
  ASSERT_OK(req);
  EXPECT_EQ(req->backend(), "container");
  ASSERT_EQ(req->layers_size(), 2);
  EXPECT_EQ(req->layers(0), "base/debian-12");
  EXPECT_EQ(req->layers(1), "workspace/demo@1");
  EXPECT_EQ(req->resources().cpu_millis(), 500u);
  EXPECT_EQ(req->resources().memory_mb(), 256u);
  EXPECT_EQ(req->resources().disk_mb(), 2048u);
  EXPECT_EQ(req->resources().pids(), 64u);
  EXPECT_EQ(req->env().at("A"), "1");
  EXPECT_EQ(req->env().at("B"), "x=y");
  EXPECT_EQ(req->env().at("EMPTY"), "");
  EXPECT_EQ(req->labels().at("team"), "rl");
  EXPECT_EQ(req->workdir(), "/w");
  EXPECT_EQ(req->ttl_s(), 60u);
  EXPECT_EQ(req->job(), "run-1");
  EXPECT_EQ(req->user(), "1000:1000");
}

TEST(ParseTest, RepeatableOptionsTakeOneValueEach) {
  Invocation inv;
  // "echo" must not be swallowed by --env.
  ASSERT_EQ(Parse(inv, {"exec", "sb1", "--env", "A=1", "echo hi"}), 0);
  EXPECT_EQ(inv.exec.env, std::vector<std::string>{"A=1"});
  EXPECT_EQ(inv.exec.cmd, std::vector<std::string>{"echo hi"});
}

TEST(ParseTest, CreateRejectsMalformedKeyValue) {
  for (const char* bad : {"NOEQUALS", "=v"}) {
    Invocation inv;
    ASSERT_EQ(Parse(inv, {"create", "--env", bad}), 0);
    StatusOr<v1::CreateSandboxRequest> req = BuildCreateRequest(inv.create);
    EXPECT_THAT(req, StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
  Invocation inv;
  ASSERT_EQ(Parse(inv, {"create", "--label", "x"}), 0);
  EXPECT_THAT(BuildCreateRequest(inv.create), ::testing::Not(IsOk()));
  EXPECT_NE(Parse(inv, {"create", "--cpu", "lots"}), 0);
}

TEST(ParseTest, ExecSingleWordIsShellSeveralAreArgv) {
  Invocation inv;
  ASSERT_EQ(Parse(inv, {"exec", "sb1", "--", "echo a; exit 3"}), 0);
  StatusOr<v1::ExecRequest> req = BuildExecRequest(inv.exec);
  ASSERT_OK(req);
  EXPECT_EQ(req->sandbox_id(), "sb1");
  EXPECT_EQ(req->shell(), "echo a; exit 3");
  EXPECT_EQ(req->argv_size(), 0);

  Invocation inv2;
  ASSERT_EQ(Parse(inv2, {"exec", "sb1", "--timeout", "1.5", "--cwd", "/w", "--user", "nobody", "--env", "K=V", "--",
                         "ls", "-la", "--json", "/"}),
            0);
  req = BuildExecRequest(inv2.exec);
  ASSERT_OK(req);
  EXPECT_TRUE(req->shell().empty());
  ASSERT_EQ(req->argv_size(), 4);
  EXPECT_EQ(req->argv(0), "ls");
  EXPECT_EQ(req->argv(1), "-la");
  EXPECT_EQ(req->argv(2), "--json");  // after --, not our flag
  EXPECT_FALSE(inv2.global.json);
  EXPECT_EQ(req->timeout_ms(), 1500u);
  EXPECT_EQ(req->cwd(), "/w");
  EXPECT_EQ(req->user(), "nobody");
  EXPECT_EQ(req->env().at("K"), "V");

  Invocation inv3;
  ASSERT_EQ(Parse(inv3, {"exec", "--argv", "sb1", "--", "/bin/true"}), 0);
  req = BuildExecRequest(inv3.exec);
  ASSERT_OK(req);
  ASSERT_EQ(req->argv_size(), 1);
  EXPECT_EQ(req->argv(0), "/bin/true");
}

TEST(ParseTest, ExecCommandWordsNeedNoDoubleDash) {
  Invocation inv;
  ASSERT_EQ(Parse(inv, {"exec", "--timeout", "2", "sb1", "ls", "-la", "--json", "/"}), 0);
  EXPECT_EQ(inv.verb, "exec");
  EXPECT_FALSE(inv.global.json);  // the command's flag, not ours
  EXPECT_EQ(inv.exec.cmd, (std::vector<std::string>{"ls", "-la", "--json", "/"}));
  EXPECT_EQ(inv.exec.timeout_s, 2);

  // Our flags between ID and CMD are still ours; a verb name as CMD is a CMD.
  Invocation inv2;
  ASSERT_EQ(Parse(inv2, {"exec", "sb1", "--json", "--cwd", "/w", "status"}), 0);
  EXPECT_EQ(inv2.verb, "exec");
  EXPECT_TRUE(inv2.global.json);
  EXPECT_EQ(inv2.exec.cwd, "/w");
  EXPECT_EQ(inv2.exec.cmd, std::vector<std::string>{"status"});

  Invocation inv3;
  ASSERT_EQ(Parse(inv3, {"exec", "sb1", "--", "--weird-name", "x"}), 0);
  EXPECT_EQ(inv3.exec.cmd, (std::vector<std::string>{"--weird-name", "x"}));

  Invocation inv4;
  ASSERT_EQ(Parse(inv4, {"--addr", "exec", "exec", "sb1", "git", "--", "x", "--", "y"}), 0);
  EXPECT_EQ(inv4.global.addr, "exec");
  EXPECT_EQ(inv4.exec.cmd, (std::vector<std::string>{"git", "--", "x", "--", "y"}));
}

TEST(ParseTest, ExecValidation) {
  Invocation inv;
  ASSERT_EQ(Parse(inv, {"exec", "sb1"}), 0);
  EXPECT_THAT(BuildExecRequest(inv.exec), StatusIs(absl::StatusCode::kInvalidArgument));

  Invocation neg;
  ASSERT_EQ(Parse(neg, {"exec", "sb1", "--timeout", "-1", "--", "true"}), 0);
  EXPECT_THAT(BuildExecRequest(neg.exec), ::testing::Not(IsOk()));

  Invocation tiny;
  ASSERT_EQ(Parse(tiny, {"exec", "sb1", "--timeout", "0.0001", "--", "true"}), 0);
  ASSERT_OK(BuildExecRequest(tiny.exec));
  EXPECT_EQ(BuildExecRequest(tiny.exec)->timeout_ms(), 1u);

  Invocation both;
  EXPECT_NE(Parse(both, {"exec", "sb1", "-i", "--stdin-file", "/etc/hostname", "--", "cat"}), 0);
  Invocation none;
  EXPECT_NE(Parse(none, {"exec"}), 0);
}

TEST(ParseTest, GlobalFlagsBeforeOrAfterVerbAndFromEnv) {
  ::setenv("WARREN_ADDR", "10.0.0.1:7000", 1);
  ::setenv("WARREN_TOKEN", "from-env", 1);
  Invocation inv;
  ASSERT_EQ(Parse(inv, {"ls", "--json", "--label", "a=b", "--job", "j"}), 0);
  EXPECT_TRUE(inv.global.json);
  EXPECT_EQ(inv.global.addr, "10.0.0.1:7000");
  EXPECT_EQ(inv.global.token, "from-env");
  StatusOr<v1::ListSandboxesRequest> req = BuildListRequest(inv.ls);
  ASSERT_OK(req);
  EXPECT_EQ(req->labels().at("a"), "b");
  EXPECT_EQ(req->job(), "j");

  Invocation flag;
  ASSERT_EQ(Parse(flag, {"--addr", "/tmp/x.sock", "--token", "t", "status"}), 0);
  EXPECT_EQ(flag.global.addr, "/tmp/x.sock");
  EXPECT_EQ(flag.global.token, "t");
  ::unsetenv("WARREN_ADDR");
  ::unsetenv("WARREN_TOKEN");

  Invocation def;
  ASSERT_EQ(Parse(def, {"status"}), 0);
  EXPECT_EQ(def.global.addr, kDefaultAddr);
  EXPECT_TRUE(def.global.token.empty());
}

TEST(ParseTest, VerbsAndUsageErrors) {
  Invocation rm;
  ASSERT_EQ(Parse(rm, {"rm", "a", "b", "c"}), 0);
  EXPECT_EQ(rm.rm_ids, (std::vector<std::string>{"a", "b", "c"}));
  Invocation rm0;
  EXPECT_NE(Parse(rm0, {"rm"}), 0);
  Invocation layer;
  EXPECT_NE(Parse(layer, {"layer"}), 0);
  Invocation lb;
  EXPECT_NE(Parse(lb, {"layer", "build", "base/x", "--dir", "/a", "--tar", "-"}), 0);
  Invocation lg;
  ASSERT_EQ(Parse(lg, {"layer", "get", "base/x@1"}), 0);
  EXPECT_EQ(lg.verb, "layer get");
  EXPECT_EQ(lg.layer_ref, "base/x@1");
  Invocation bogus;
  {
    std::vector<std::string> args = {"warren", "--json", "frobnicate", "x"};
    std::vector<const char*> argv;
    argv.reserve(args.size());
    for (const auto& a : args) argv.push_back(a.c_str());
    std::unique_ptr<CLI::App> app = MakeApp(bogus);
    CaptureStderr();
    EXPECT_EQ(ParseArgs(*app, bogus, static_cast<int>(argv.size()), argv.data()), kExitUsage);
    EXPECT_NE(GetCapturedStderr().find("unknown command \"frobnicate\""), std::string::npos);
  }
  Invocation help;
  EXPECT_EQ(Parse(help, {"--help"}), -1);
}

TEST(ParseTest, ResolveTarget) {
  EXPECT_EQ(ResolveTarget(""), kDefaultAddr);
  EXPECT_EQ(ResolveTarget("unix:/run/w.sock"), "unix:/run/w.sock");
  EXPECT_EQ(ResolveTarget("/run/w.sock"), "unix:/run/w.sock");
  EXPECT_EQ(ResolveTarget("localhost:7000"), "localhost:7000");
  EXPECT_EQ(ResolveTarget("dns:///h:1"), "dns:///h:1");
}

TEST(ParseTest, CpEndpoints) {
  CpEndpoint r = ParseCpEndpoint("n0-abc:/w/a.txt");
  EXPECT_TRUE(r.remote);
  EXPECT_EQ(r.sandbox_id, "n0-abc");
  EXPECT_EQ(r.path, "/w/a.txt");
  EXPECT_FALSE(ParseCpEndpoint("./a:b").remote);
  EXPECT_FALSE(ParseCpEndpoint("/x/a:b").remote);
  EXPECT_FALSE(ParseCpEndpoint("-").remote);
  EXPECT_FALSE(ParseCpEndpoint(":x").remote);
  EXPECT_OK(ParseCpArgs("f", "id:/x"));
  EXPECT_OK(ParseCpArgs("id:/x", "-"));
  EXPECT_THAT(ParseCpArgs("a", "b"), ::testing::Not(IsOk()));
  EXPECT_THAT(ParseCpArgs("i:/a", "j:/b"), ::testing::Not(IsOk()));
  EXPECT_THAT(ParseCpArgs("f", "id:"), ::testing::Not(IsOk()));
}

// ------------------------------------------------------------ output helpers

TEST(OutputTest, Base64) {
  EXPECT_EQ(Base64Encode(""), "");
  EXPECT_EQ(Base64Encode("f"), "Zg==");
  EXPECT_EQ(Base64Encode("fo"), "Zm8=");
  EXPECT_EQ(Base64Encode("foo"), "Zm9v");
  EXPECT_EQ(Base64Encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(Base64Encode(std::string("\xff\xfe\x00", 3)), "//4A");
}

TEST(OutputTest, ExecResultJsonIsLossyTextPlusExactBase64) {
  v1::ExecResult r;
  r.set_exit_code(3);
  r.set_stdout(std::string("ok \xff\xfe\x8d end\n", 11));
  r.set_stderr(std::string("a\0b", 3));
  std::string doc = DumpJson(ExecResultToJson(r));
  nlohmann::json j = nlohmann::json::parse(doc);
  EXPECT_EQ(j["exit_code"], 3);
  EXPECT_EQ(j["stdout"], "ok \xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD end\n");
  EXPECT_EQ(j["stdout_b64"], Base64Encode(r.stdout()));
  EXPECT_EQ(j["stderr"].get<std::string>(), std::string("a\0b", 3));
  EXPECT_EQ(doc.back(), '\n');
}

TEST(OutputTest, AgeBytesTable) {
  const int64_t s = 1000000000;
  EXPECT_EQ(FormatAge(0, 5 * s), "-");
  EXPECT_EQ(FormatAge(1 * s, 43 * s), "42s");
  EXPECT_EQ(FormatAge(1, 1 + 300 * s), "5m");
  EXPECT_EQ(FormatAge(1, 1 + 3 * (3600 * s)), "3h");
  EXPECT_EQ(FormatAge(1, 1 + 3 * (86400 * s)), "3d");
  EXPECT_EQ(FormatBytes(0), "0B");
  EXPECT_EQ(FormatBytes(1536), "1.5KiB");
  EXPECT_EQ(ShortDigest("sha256:0123456789abcdef"), "sha256:0123456789ab");
  std::ostringstream out;
  PrintTable(out, {{"ID", "STATE"}, {"long-id", "running"}});
  EXPECT_EQ(out.str(), "ID       STATE\nlong-id  running\n");
}

// ------------------------------------------------------------ fake daemon

struct FakeFile {
  uint32_t mode = 0;
  std::string data;
};

class FakeDaemon final : public v1::Sandboxes::Service,
                         public v1::Files::Service,
                         public v1::Layers::Service,
                         public v1::Node::Service {
 public:
  std::mutex mu;
  std::string last_auth;
  v1::CreateSandboxRequest last_create;
  v1::ExecRequest last_exec;
  std::vector<std::string> destroyed;
  std::map<std::string, FakeFile> files;  // remote path -> file
  std::set<std::string> dirs{"/", "/w"};
  int last_write_messages = 0;
  bool last_write_make_parents = false;
  int last_build_messages = 0;
  v1::BuildLayerRequest last_build_header;
  std::string last_build_tar;

  void Auth(grpc::ServerContext* ctx) {
    auto it = ctx->client_metadata().find("authorization");
    last_auth = it == ctx->client_metadata().end() ? "" : std::string(it->second.data(), it->second.size());
  }
  static v1::Sandbox MakeSandbox(const std::string& id) {
    v1::Sandbox s;
    s.set_id(id);
    s.set_backend("container");
    s.set_state(v1::SANDBOX_STATE_RUNNING);
    s.add_layers("sha256:aaaaaaaaaaaaaaaaaaaaaaaa");
    s.add_layer_names("base/debian-12@1");
    s.mutable_resources()->set_cpu_millis(1000);
    s.mutable_resources()->set_memory_mb(1024);
    (*s.mutable_labels())["team"] = "rl";
    s.set_job("run-1");
    s.set_created_at_ns(WallNowNs() - 5000000000LL);
    return s;
  }

  grpc::Status Create(grpc::ServerContext* ctx, const v1::CreateSandboxRequest* req, v1::Sandbox* resp) override {
    std::lock_guard lock(mu);
    Auth(ctx);
    last_create = *req;
    *resp = MakeSandbox("n0-new");
    return grpc::Status::OK;
  }
  grpc::Status Get(grpc::ServerContext* ctx, const v1::GetSandboxRequest* req, v1::Sandbox* resp) override {
    std::lock_guard lock(mu);
    Auth(ctx);
    if (req->id() == "missing") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "sandbox missing not found");
    }
    *resp = MakeSandbox(req->id());
    return grpc::Status::OK;
  }
  grpc::Status List(grpc::ServerContext*, const v1::ListSandboxesRequest*, v1::ListSandboxesResponse* resp) override {
    *resp->add_sandboxes() = MakeSandbox("n0-first");
    *resp->add_sandboxes() = MakeSandbox("n0-second-longer");
    return grpc::Status::OK;
  }
  grpc::Status Destroy(grpc::ServerContext*, const v1::DestroySandboxRequest* req,
                       v1::DestroySandboxResponse*) override {
    std::lock_guard lock(mu);
    if (req->id() == "bad") return grpc::Status(grpc::StatusCode::NOT_FOUND, "no sandbox bad");
    destroyed.push_back(req->id());
    return grpc::Status::OK;
  }
  grpc::Status Exec(grpc::ServerContext* ctx, const v1::ExecRequest* req, v1::ExecResult* r) override {
    std::lock_guard lock(mu);
    Auth(ctx);
    last_exec = *req;
    if (req->shell() == "slow") {
      r->set_timed_out(true);
      r->set_exit_code(143);
      r->set_signal(15);
      r->set_stdout("start\n");
      r->set_stdout_truncated(true);
      r->set_stdout_total_bytes(999);
      return grpc::Status::OK;
    }
    if (req->shell() == "echo-stdin") {
      r->set_stdout(req->stdin());
      return grpc::Status::OK;
    }
    r->set_exit_code(3);
    r->set_stdout(std::string("ok \xff\xfe\x8d end\n", 11));
    r->set_stderr(std::string("err \xc3\x28\n", 7));
    r->set_stdout_total_bytes(11);
    r->set_stderr_total_bytes(7);
    return grpc::Status::OK;
  }

  static std::string Parent(const std::string& p) {
    size_t slash = p.rfind('/');
    return slash == 0 ? "/" : p.substr(0, slash);
  }
  grpc::Status Write(grpc::ServerContext*, grpc::ServerReader<v1::WriteFileRequest>* reader,
                     v1::WriteFileResponse* resp) override {
    v1::WriteFileRequest msg, header;
    std::string data;
    int n = 0;
    while (reader->Read(&msg)) {
      if (n++ == 0) header = msg;
      data += msg.data();
    }
    std::lock_guard lock(mu);
    last_write_messages = n;
    last_write_make_parents = header.make_parents();
    if (!dirs.count(Parent(header.path()))) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no parent for " + header.path());
    }
    files[header.path()] = FakeFile{header.mode(), data};
    resp->set_bytes_written(data.size());
    return grpc::Status::OK;
  }
  grpc::Status Read(grpc::ServerContext*, const v1::ReadFileRequest* req,
                    grpc::ServerWriter<v1::ReadFileChunk>* writer) override {
    std::string data;
    {
      std::lock_guard lock(mu);
      auto it = files.find(req->path());
      if (it == files.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no file");
      data = it->second.data;
    }
    for (size_t off = 0; off < data.size(); off += kChunkBytes) {
      v1::ReadFileChunk c;
      c.set_data(data.substr(off, kChunkBytes));
      writer->Write(c);
      if (req->path() == "/w/fails-midway") {
        return grpc::Status(grpc::StatusCode::INTERNAL, "read(/w/fails-midway): EIO");
      }
    }
    return grpc::Status::OK;
  }
  grpc::Status Stat(grpc::ServerContext*, const v1::StatRequest* req, v1::FileInfo* info) override {
    std::lock_guard lock(mu);
    info->set_path(req->path());
    if (dirs.count(req->path())) {
      info->set_type(v1::FILE_TYPE_DIRECTORY);
      info->set_mode(0755);
      return grpc::Status::OK;
    }
    auto it = files.find(req->path());
    if (it == files.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such path");
    info->set_type(v1::FILE_TYPE_REGULAR);
    info->set_mode(it->second.mode);
    info->set_size(it->second.data.size());
    return grpc::Status::OK;
  }
  grpc::Status ListDir(grpc::ServerContext*, const v1::ListDirRequest* req, v1::ListDirResponse* resp) override {
    std::lock_guard lock(mu);
    auto add = [&](const std::string& p, v1::FileType t, uint32_t mode) {
      if (p == req->path() || Parent(p) != req->path()) return;
      v1::FileInfo* e = resp->add_entries();
      e->set_name(p.substr(p.rfind('/') + 1));
      e->set_path(p);
      e->set_type(t);
      e->set_mode(mode);
    };
    for (const auto& d : dirs) add(d, v1::FILE_TYPE_DIRECTORY, 0750);
    for (const auto& [p, f] : files) add(p, v1::FILE_TYPE_REGULAR, f.mode);
    return grpc::Status::OK;
  }
  grpc::Status Mkdir(grpc::ServerContext*, const v1::MkdirRequest* req, v1::Empty*) override {
    std::lock_guard lock(mu);
    dirs.insert(req->path());
    return grpc::Status::OK;
  }
  grpc::Status Build(grpc::ServerContext*, grpc::ServerReader<v1::BuildLayerRequest>* reader,
                     v1::Layer* layer) override {
    v1::BuildLayerRequest msg;
    std::lock_guard lock(mu);
    last_build_messages = 0;
    last_build_tar.clear();
    while (reader->Read(&msg)) {
      if (last_build_messages++ == 0) last_build_header = msg;
      last_build_tar += msg.tar_chunk();
    }
    layer->set_name(last_build_header.name() + "@1");
    layer->set_digest("sha256:bbbbbbbbbbbbbbbbbbbbbbbb");
    layer->set_size_bytes(last_build_tar.size());
    return grpc::Status::OK;
  }
  grpc::Status Status(grpc::ServerContext*, const v1::NodeStatusRequest*, v1::NodeStatus* n) override {
    n->set_node_id("n0");
    n->set_version("0.1.0");
    n->add_backends("container");
    n->set_sandboxes(2);
    n->set_cgroup_version("v1");
    return grpc::Status::OK;
  }
};

class CliE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/warren-cli-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    addr_ = "unix:" + dir_ + "/d.sock";
    grpc::ServerBuilder b;
    b.AddListeningPort(addr_, grpc::InsecureServerCredentials());
    b.RegisterService(static_cast<v1::Sandboxes::Service*>(&fake_));
    b.RegisterService(static_cast<v1::Files::Service*>(&fake_));
    b.RegisterService(static_cast<v1::Layers::Service*>(&fake_));
    b.RegisterService(static_cast<v1::Node::Service*>(&fake_));
    b.SetMaxReceiveMessageSize(kMaxMessageBytes);
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    std::filesystem::remove_all(dir_);
  }

  struct Out {
    int rc;
    std::string out;
    std::string err;
  };
  Out Run(std::vector<std::string> args) {
    args.insert(args.begin(), {"warren", "--addr", addr_});
    std::vector<const char*> argv;
    argv.reserve(args.size());
    for (const auto& a : args) argv.push_back(a.c_str());
    CaptureStdout();
    CaptureStderr();
    int rc = RunCli(static_cast<int>(argv.size()), argv.data());
    Out o{rc, GetCapturedStdout(), ""};
    o.err = GetCapturedStderr();
    return o;
  }
  void WriteHostFile(const std::string& path, const std::string& data, mode_t mode) {
    std::ofstream(path, std::ios::binary) << data;
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
  }
  static std::string ReadHostFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static std::string RandomBytes(size_t n) {
    std::mt19937 rng(42);
    std::string s(n, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    return s;
  }

  FakeDaemon fake_;
  std::unique_ptr<grpc::Server> server_;
  std::string dir_;
  std::string addr_;
};

TEST_F(CliE2eTest, CreatePrintsIdAndSendsToken) {
  Out o = Run({"--token", "sekret", "create", "--layer", "base/debian-12", "--memory", "256"});
  EXPECT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(o.out, "n0-new\n");
  EXPECT_EQ(fake_.last_auth, "Bearer sekret");
  EXPECT_EQ(fake_.last_create.resources().memory_mb(), 256u);

  o = Run({"create", "--json", "--layer", "base/debian-12"});
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(fake_.last_auth, "");
  nlohmann::json j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j["id"], "n0-new");
  EXPECT_EQ(j["state"], "running");
  EXPECT_EQ(j["resources"]["memory_mb"], 1024);
  EXPECT_EQ(j["labels"]["team"], "rl");
  EXPECT_EQ(j["layer_names"][0], "base/debian-12@1");
}

TEST_F(CliE2eTest, ExecRelaysRawBytesAndExitCode) {
  Out o = Run({"exec", "sb1", "--", "anything"});
  EXPECT_EQ(o.rc, 3);
  EXPECT_EQ(o.out, std::string("ok \xff\xfe\x8d end\n", 11));
  EXPECT_EQ(o.err, std::string("err \xc3\x28\n", 7));

  o = Run({"exec", "--json", "sb1", "--", "anything"});
  EXPECT_EQ(o.rc, 3);
  nlohmann::json j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j["exit_code"], 3);
  EXPECT_EQ(j["stdout_b64"], Base64Encode(std::string("ok \xff\xfe\x8d end\n", 11)));
  EXPECT_FALSE(j["timed_out"].get<bool>());
}

TEST_F(CliE2eTest, ExecNotesTimeoutAndTruncation) {
  Out o = Run({"exec", "sb1", "--timeout", "1", "slow"});
  EXPECT_EQ(o.rc, 143);
  EXPECT_EQ(fake_.last_exec.timeout_ms(), 1000u);
  EXPECT_EQ(o.out, "start\n");
  EXPECT_NE(o.err.find("warren: timed out after 1s"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("warren: stdout truncated: kept 6 of 999 bytes"), std::string::npos);
}

TEST_F(CliE2eTest, ExecSendsStdinFileAndStdin) {
  std::string bytes = RandomBytes(3000);
  WriteHostFile(dir_ + "/in", bytes, 0600);
  Out o = Run({"exec", "sb1", "--stdin-file", dir_ + "/in", "echo-stdin"});
  EXPECT_EQ(o.rc, 0);
  EXPECT_EQ(o.out, bytes);

  int saved = ::dup(STDIN_FILENO);
  int in = ::open((dir_ + "/in").c_str(), O_RDONLY);
  ASSERT_GE(in, 0);
  ::dup2(in, STDIN_FILENO);
  ::close(in);
  o = Run({"exec", "-i", "sb1", "echo-stdin"});
  ::dup2(saved, STDIN_FILENO);
  ::close(saved);
  EXPECT_EQ(o.out, bytes);
}

TEST_F(CliE2eTest, ErrorsCarryCodeNameAndExitOne) {
  Out o = Run({"get", "missing"});
  EXPECT_EQ(o.rc, 1);
  EXPECT_EQ(o.err, "error: NOT_FOUND: sandbox missing not found\n");
  o = Run({"create", "--env", "=x"});
  EXPECT_EQ(o.rc, 2);
  std::string dead_addr = "unix:" + dir_ + "/nobody.sock";
  std::vector<const char*> argv = {"warren", "--addr", dead_addr.c_str(), "status"};
  CaptureStderr();
  EXPECT_EQ(RunCli(4, argv.data()), 1);
  EXPECT_EQ(GetCapturedStderr().rfind("error: UNAVAILABLE: ", 0), 0u);
}

TEST_F(CliE2eTest, RmContinuesPastFailures) {
  Out o = Run({"rm", "a", "bad", "c"});
  EXPECT_EQ(o.rc, 1);
  EXPECT_EQ(fake_.destroyed, (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(o.out, "a\nc\n");
  EXPECT_NE(o.err.find("error: NOT_FOUND: bad: no sandbox bad"), std::string::npos);
  o = Run({"rm", "--json", "x"});
  EXPECT_EQ(o.rc, 0);
  nlohmann::json j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j["destroyed"][0], "x");
  EXPECT_TRUE(j["failed"].empty());
}

TEST_F(CliE2eTest, LsTableAndJson) {
  Out o = Run({"ls"});
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(o.out.substr(0, o.out.find('\n')),
            "ID                BACKEND    STATE    AGE  LAYERS            CPU    MEM");
  EXPECT_NE(o.out.find("n0-first          container  running  5s   base/debian-12@1  1000m  1024MiB\n"),
            std::string::npos)
      << o.out;
  o = Run({"ls", "--json"});
  nlohmann::json j = nlohmann::json::parse(o.out);
  ASSERT_EQ(j["sandboxes"].size(), 2u);
  EXPECT_EQ(j["sandboxes"][1]["id"], "n0-second-longer");
}

TEST_F(CliE2eTest, CpUploadStreamsChunksAndKeepsMode) {
  std::string bytes = RandomBytes(2 * kChunkBytes + 17);
  WriteHostFile(dir_ + "/big.bin", bytes, 0751);
  Out o = Run({"cp", dir_ + "/big.bin", "sb1:/w/big.bin"});
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(fake_.files["/w/big.bin"].data, bytes);
  EXPECT_EQ(fake_.files["/w/big.bin"].mode, 0751u);
  EXPECT_EQ(fake_.last_write_messages, 3);

  // Into an existing directory: the basename is appended.
  WriteHostFile(dir_ + "/empty", "", 0644);
  o = Run({"cp", "--json", dir_ + "/empty", "sb1:/w"});
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_TRUE(fake_.files.count("/w/empty"));
  EXPECT_EQ(fake_.last_write_messages, 1);
  nlohmann::json j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j["dst"], "sb1:/w/empty");
  EXPECT_EQ(j["bytes"], 0);
  EXPECT_EQ(j["files"], 1);

  o = Run({"cp", "-p", dir_ + "/empty", "sb1:/w/x"});
  EXPECT_TRUE(fake_.last_write_make_parents);
}

TEST_F(CliE2eTest, CpDownloadIsAtomic) {
  std::string bytes = RandomBytes(kChunkBytes + 5);
  fake_.files["/w/f"] = FakeFile{04755, bytes};
  Out o = Run({"cp", "sb1:/w/f", dir_ + "/got"});
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(ReadHostFile(dir_ + "/got"), bytes);
  struct stat st;
  ASSERT_EQ(::stat((dir_ + "/got").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);  // no set-id bits onto the host

  o = Run({"cp", "sb1:/w/f", "-"});
  EXPECT_EQ(o.out, bytes);
  o = Run({"cp", "--json", "sb1:/w/f", "-"});  // no JSON after the data
  EXPECT_EQ(o.out, bytes);

  fake_.files["/w/fails-midway"] = FakeFile{0644, RandomBytes(3 * kChunkBytes)};
  std::filesystem::create_directory(dir_ + "/dl");
  o = Run({"cp", "sb1:/w/fails-midway", dir_ + "/dl/out"});
  EXPECT_EQ(o.rc, 1);
  EXPECT_EQ(o.err.rfind("error: INTERNAL: ", 0), 0u) << o.err;
  EXPECT_TRUE(std::filesystem::is_empty(dir_ + "/dl"));  // no partial, no temp
}

TEST_F(CliE2eTest, CpDirectoriesNeedRecursive) {
  std::filesystem::create_directories(dir_ + "/tree/sub");
  WriteHostFile(dir_ + "/tree/a", "A", 0600);
  WriteHostFile(dir_ + "/tree/sub/b", "BB", 0644);
  Out o = Run({"cp", dir_ + "/tree", "sb1:/w/t"});
  EXPECT_EQ(o.rc, 1);
  EXPECT_NE(o.err.find("directories: use -r or tar"), std::string::npos);
  o = Run({"cp", "sb1:/w", dir_ + "/x"});
  EXPECT_EQ(o.rc, 1);
  EXPECT_NE(o.err.find("directories: use -r or tar"), std::string::npos);

  o = Run({"cp", "-r", dir_ + "/tree", "sb1:/w/t"});
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_TRUE(fake_.dirs.count("/w/t/sub"));
  EXPECT_EQ(fake_.files["/w/t/a"].data, "A");
  EXPECT_EQ(fake_.files["/w/t/a"].mode, 0600u);
  EXPECT_EQ(fake_.files["/w/t/sub/b"].data, "BB");

  o = Run({"cp", "-r", "sb1:/w/t", dir_ + "/back"});
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(ReadHostFile(dir_ + "/back/a"), "A");
  EXPECT_EQ(ReadHostFile(dir_ + "/back/sub/b"), "BB");
}

TEST_F(CliE2eTest, LayerBuildStreamsTar) {
  std::string tar = RandomBytes(2 * kChunkBytes + 1);
  WriteHostFile(dir_ + "/l.tar", tar, 0644);
  Out o = Run({"layer", "build", "base/x", "--tar", dir_ + "/l.tar"});
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(o.out, "base/x@1 sha256:bbbbbbbbbbbbbbbbbbbbbbbb\n");
  EXPECT_EQ(fake_.last_build_messages, 4);  // header + 3 chunks
  EXPECT_EQ(fake_.last_build_header.name(), "base/x");
  EXPECT_TRUE(fake_.last_build_header.tar_chunk().empty());
  EXPECT_EQ(fake_.last_build_tar, tar);

  o = Run({"layer", "build", "--json", "base/y", "--dir", "some/rel/dir"});
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(fake_.last_build_header.source_dir(), (std::filesystem::current_path() / "some/rel/dir").string());
  EXPECT_EQ(fake_.last_build_messages, 1);
  EXPECT_EQ(nlohmann::json::parse(o.out)["name"], "base/y@1");
}

TEST_F(CliE2eTest, StatusHumanAndJson) {
  Out o = Run({"status"});
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("node_id:            n0\n"), std::string::npos) << o.out;
  o = Run({"status", "--json"});
  nlohmann::json j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j["node_id"], "n0");
  EXPECT_EQ(j["backends"][0], "container");
  EXPECT_EQ(j["cgroup_version"], "v1");
}

// ------------------------------------------------------------ eval

TEST(ParseTest, EvalPassesEveryWordToTheRunner) {
  Invocation inv;
  ASSERT_EQ(Parse(inv, {"--addr", "unix:/x.sock", "eval", "--tasks", "t.jsonl", "-n", "200", "-c", "8", "--help",
                        "--json", "--addr", "y"}),
            0);
  EXPECT_EQ(inv.verb, "eval");
  EXPECT_EQ(inv.global.addr, "unix:/x.sock");
  EXPECT_EQ(inv.eval_args, (std::vector<std::string>{"--tasks", "t.jsonl", "-n", "200", "-c", "8", "--help", "--json",
                                                     "--addr", "y"}));
  ASSERT_TRUE(inv.run);
}

TEST(ParseTest, EvalWithoutArgumentsStillRunsTheRunner) {
  Invocation inv;
  ASSERT_EQ(Parse(inv, {"eval"}), 0);
  EXPECT_EQ(inv.verb, "eval");
  EXPECT_TRUE(inv.eval_args.empty());
}

TEST(ParseTest, LifecycleVerbs) {
  {
    Invocation inv;
    ASSERT_EQ(Parse(inv, {"grade", "sb1", "--solution", "/w/pkg", "--protected", "/task/tests", "--protected", "/t2",
                          "--timeout", "30", "--json", "--", "bash", "-c", "exit 3"}),
              0);
    EXPECT_EQ(inv.verb, "grade");
    EXPECT_TRUE(inv.global.json);
    StatusOr<v1::GradeRequest> req = BuildGradeRequest(inv.rl, inv.exec_tail);
    ASSERT_OK(req);
    EXPECT_EQ(req->id(), "sb1");
    EXPECT_EQ(req->protected_paths_size(), 2);
    ASSERT_EQ(req->solution_size(), 1);
    EXPECT_EQ(req->solution(0), "/w/pkg");
    EXPECT_EQ(req->grader().argv_size(), 3);
    EXPECT_EQ(req->grader().argv(2), "exit 3");
    EXPECT_EQ(req->grader().timeout_ms(), 30000u);
  }
  {
    Invocation inv;
    ASSERT_EQ(Parse(inv, {"grade", "sb1", "--solution", "/w", "--", "sh /g.sh"}), 0);
    StatusOr<v1::GradeRequest> req = BuildGradeRequest(inv.rl, inv.exec_tail);
    ASSERT_OK(req);
    EXPECT_EQ(req->grader().shell(), "sh /g.sh");
    Invocation no_solution;  // grading needs the solution paths
    ASSERT_EQ(Parse(no_solution, {"grade", "sb1", "--", "sh /g.sh"}), 0);
    EXPECT_THAT(BuildGradeRequest(no_solution.rl, no_solution.exec_tail), StatusIs(absl::StatusCode::kInvalidArgument));
    Invocation none;
    ASSERT_EQ(Parse(none, {"grade", "sb1"}), 0);
    EXPECT_THAT(BuildGradeRequest(none.rl, none.exec_tail), StatusIs(absl::StatusCode::kInvalidArgument));
  }
  {
    Invocation inv;
    ASSERT_EQ(Parse(inv, {"snapshot", "sb1", "--exclude", "/a*", "--exclude", "/b", "--name", "w/x@1"}), 0);
    EXPECT_EQ(inv.verb, "snapshot");
    EXPECT_EQ(inv.rl.exclude, (std::vector<std::string>{"/a*", "/b"}));
    EXPECT_EQ(inv.rl.name, "w/x@1");
  }
  {
    Invocation inv;
    ASSERT_EQ(Parse(inv, {"fork", "sb1", "-n", "8"}), 0);
    EXPECT_EQ(inv.verb, "fork");
    EXPECT_EQ(inv.rl.n, 8u);
  }
  {
    Invocation inv;
    ASSERT_EQ(Parse(inv, {"job", "heartbeat", "run-1", "--lease", "60", "--grace", "5"}), 0);
    EXPECT_EQ(inv.verb, "job heartbeat");
    EXPECT_EQ(inv.rl.name, "run-1");
    EXPECT_EQ(inv.rl.lease_s, 60u);
    EXPECT_EQ(inv.rl.grace_s, 5u);
  }
  {
    Invocation inv;
    ASSERT_EQ(Parse(inv, {"ttl", "sb1", "600"}), 0);
    EXPECT_EQ(inv.verb, "ttl");
    EXPECT_EQ(inv.rl.ttl_s, 600u);
  }
  for (auto args : std::vector<std::vector<std::string>>{{"job"}, {"ttl", "sb1"}, {"fork", "sb1"}, {"suspend"}}) {
    Invocation inv;
    EXPECT_EQ(Parse(inv, args), kExitUsage) << args[0];
  }
}

TEST(NodeSummaryTest, PrometheusStyleSamplesPerNodeAndClassBesideTheRecords) {
  v1::ClusterNode a;
  a.set_id("n1");
  a.set_address("127.0.0.1:7001");
  a.set_sandboxes(3);
  a.set_free_cpu_millis(-500);
  a.set_free_memory_mb(2);
  a.set_drain(true);
  a.set_updated_ns(1500000000);
  v1::QosClassCapacity* be = a.add_qos();
  be->set_qos("best-effort");
  be->set_overcommit(4);
  be->set_cpu_millis(3000);
  be->set_free_cpu_millis(5000);
  v1::QosClassCapacity* lat = a.add_qos();
  lat->set_qos("latency");  // overcommit 0: not counted, no free_* sample
  v1::ClusterNode b;
  b.set_id("n2");
  const nlohmann::json out = NodesSummaryJson({a, b});
  auto value = [&](const std::string& name, const nlohmann::json& labels) -> std::optional<double> {
    for (const nlohmann::json& m : out.at("metrics")) {
      if (m.at("name") == name && m.at("labels") == labels) return m.at("value").get<double>();
    }
    return std::nullopt;
  };
  EXPECT_EQ(value("warren_node_sandboxes", {{"node", "n1"}}), 3);
  EXPECT_EQ(value("warren_node_sandboxes", {{"node", "n2"}}), 0);
  EXPECT_EQ(value("warren_node_cpu_free_millis", {{"node", "n1"}}), -500);
  EXPECT_EQ(value("warren_node_memory_free_bytes", {{"node", "n1"}}), 2 << 20);
  EXPECT_EQ(value("warren_node_draining", {{"node", "n1"}}), 1);
  EXPECT_EQ(value("warren_node_updated_timestamp_seconds", {{"node", "n1"}}), 1.5);
  EXPECT_EQ(value("warren_node_qos_cpu_free_millis", {{"node", "n1"}, {"qos", "best-effort"}}), 5000);
  EXPECT_EQ(value("warren_node_qos_overcommit_ratio", {{"node", "n1"}, {"qos", "best-effort"}}), 4);
  EXPECT_EQ(value("warren_node_qos_cpu_requested_millis", {{"node", "n1"}, {"qos", "best-effort"}}), 3000);
  EXPECT_FALSE(value("warren_node_qos_cpu_free_millis", {{"node", "n1"}, {"qos", "latency"}}).has_value());
  for (const nlohmann::json& m : out.at("metrics")) {
    const std::string name = m.at("name");
    EXPECT_EQ(name.rfind("warren_node_", 0), 0u) << name;
    EXPECT_EQ(name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_"), std::string::npos) << name;
  }
  // The records stay, every field.
  ASSERT_EQ(out.at("nodes").size(), 2u);
  EXPECT_EQ(out.at("nodes")[0].at("address"), "127.0.0.1:7001");
  EXPECT_EQ(out.at("nodes")[0].at("free_cpu_millis"), -500);
  EXPECT_EQ(out.at("nodes")[0].at("qos").at("best-effort").at("overcommit"), 4);
}

}  // namespace
}  // namespace warren::cli
