#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "api/services.h"
#include "api/status_map.h"
#include "fake_node.h"
#include "status_matchers.h"
#include "warren/v1/warren.grpc.pb.h"

namespace warren::api {
namespace {

namespace fs = std::filesystem;
namespace v1 = ::warren::v1;

TEST(StatusMapTest, InvalidUtf8InMessagesIsEscaped) {
  // A sandbox path with non-UTF-8 bytes must not make gRPC drop the message.
  grpc::Status g = ToGrpcStatus(absl::NotFoundError("stat(/w/\xfe.txt): gone \xc3\xa9 \xed\xa0\x80"));
  EXPECT_EQ(g.error_message(), "stat(/w/\\xfe.txt): gone \xc3\xa9 \\xed\\xa0\\x80");
}

TEST(StatusMapTest, CodesAndMessagesMapOneToOne) {
  EXPECT_OK(ToGrpcStatus(absl::OkStatus()));
  struct Case {
    Status in;
    grpc::StatusCode want;
  };
  std::vector<Case> cases = {
      {absl::InvalidArgumentError("bad x"), grpc::StatusCode::INVALID_ARGUMENT},
      {absl::NotFoundError("no x"), grpc::StatusCode::NOT_FOUND},
      {absl::AlreadyExistsError("x"), grpc::StatusCode::ALREADY_EXISTS},
      {absl::FailedPreconditionError("x"), grpc::StatusCode::FAILED_PRECONDITION},
      {absl::ResourceExhaustedError("x"), grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::PermissionDeniedError("x"), grpc::StatusCode::PERMISSION_DENIED},
      {absl::UnavailableError("x"), grpc::StatusCode::UNAVAILABLE},
      {absl::InternalError("x"), grpc::StatusCode::INTERNAL},
      {absl::DeadlineExceededError("x"), grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::CancelledError("x"), grpc::StatusCode::CANCELLED},
      {absl::UnauthenticatedError("x"), grpc::StatusCode::UNAUTHENTICATED},
      {absl::DataLossError("x"), grpc::StatusCode::DATA_LOSS},
      {ErrnoToStatus(ENOSPC, "write(/a)"), grpc::StatusCode::RESOURCE_EXHAUSTED},
      {ErrnoToStatus(ENOENT, "open(/a)"), grpc::StatusCode::NOT_FOUND},
  };
  for (const Case& c : cases) {
    grpc::Status g = ToGrpcStatus(c.in);
    EXPECT_EQ(g.error_code(), c.want) << c.in;
    EXPECT_EQ(g.error_message(), std::string(c.in.message()));
  }
}

class ApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/warren-api-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    world_ = std::make_shared<testing::FakeWorld>();
    layers_ = std::make_shared<testing::FakeLayerState>();
    layers_->Add("base/debian@12", std::string(64, 'a'));
    layers_->tmp_dir = root_ + "/layer-tmp";
    node::ManagerOptions o;
    o.state_dir = root_ + "/state";
    o.limits.cpus = 2;
    o.limits.memory_mb = 4096;
    o.sweep_interval = std::chrono::milliseconds(0);
    std::vector<std::unique_ptr<runtime::Backend>> b;
    b.push_back(std::make_unique<testing::FakeBackend>(world_));
    auto m = node::SandboxManager::New(o, std::move(b), std::make_unique<testing::FakeLayers>(layers_));
    ASSERT_OK(m);
    manager_ = std::move(*m);
    ASSERT_OK(manager_->Start());
    ServiceOptions so;
    so.token = "s3cret";
    so.facts.cgroup_version = 1;
    services_ = std::make_unique<WarrenServices>(manager_.get(), so);
    ServerOptions sopt;
    sopt.unix_socket = root_ + "/w.sock";
    sopt.tcp_listen = "127.0.0.1:0";
    auto server = StartServer(sopt, *services_, &tcp_port_);
    ASSERT_OK(server);
    server_ = std::move(*server);
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(600 << 20);
    unix_ = grpc::CreateCustomChannel("unix:" + sopt.unix_socket, grpc::InsecureChannelCredentials(), args);
    tcp_ =
        grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(tcp_port_), grpc::InsecureChannelCredentials(), args);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    server_.reset();
    services_.reset();
    manager_.reset();
    fs::remove_all(root_);
  }

  v1::Sandbox CreateOne() {
    auto stub = v1::Sandboxes::NewStub(unix_);
    grpc::ClientContext ctx;
    v1::CreateSandboxRequest req;
    req.add_layers("base/debian@12");
    (*req.mutable_labels())["k"] = "v";
    v1::Sandbox sb;
    grpc::Status s = stub->Create(&ctx, req, &sb);
    EXPECT_OK(s);
    return sb;
  }

  std::string root_;
  int tcp_port_ = 0;
  std::shared_ptr<testing::FakeWorld> world_;
  std::shared_ptr<testing::FakeLayerState> layers_;
  std::unique_ptr<node::SandboxManager> manager_;
  std::unique_ptr<WarrenServices> services_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> unix_, tcp_;
};

TEST_F(ApiTest, SocketIs0660) {
  struct stat st;
  ASSERT_EQ(stat((root_ + "/w.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
}

TEST_F(ApiTest, SandboxLifecycleOverUnixSocket) {
  v1::Sandbox sb = CreateOne();
  EXPECT_EQ(sb.state(), v1::SANDBOX_STATE_RUNNING);
  EXPECT_EQ(sb.layers(0), "sha256:" + std::string(64, 'a'));
  EXPECT_EQ(sb.layer_names(0), "base/debian@12");
  EXPECT_EQ(sb.resources().memory_mb(), 2048u);
  auto stub = v1::Sandboxes::NewStub(unix_);
  {
    grpc::ClientContext ctx;
    v1::ListSandboxesRequest req;
    (*req.mutable_labels())["k"] = "v";
    v1::ListSandboxesResponse resp;
    ASSERT_OK(stub->List(&ctx, req, &resp));
    EXPECT_EQ(resp.sandboxes_size(), 1);
  }
  {
    grpc::ClientContext ctx;
    v1::ExecRequest req;
    req.set_sandbox_id(sb.id());
    req.set_shell(std::string("printf '\xff\x00'", 11));
    v1::ExecResult r;
    grpc::Status s = stub->Exec(&ctx, req, &r);
    // NUL in the shell string is refused; without it the command runs.
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext ctx;
    v1::ExecRequest req;
    req.set_sandbox_id(sb.id());
    req.set_shell("printf '\xff'");
    req.set_stdin(std::string("in\0put", 6));
    v1::ExecResult r;
    ASSERT_OK(stub->Exec(&ctx, req, &r));
    EXPECT_EQ(r.exit_code(), 3);
    EXPECT_EQ(r.stdout(), "printf '\xff'");
    EXPECT_EQ(r.stderr(), std::string("in\0put", 6));
    EXPECT_EQ(r.stderr_total_bytes(), 6u);
  }
  {
    grpc::ClientContext ctx;
    v1::DestroySandboxRequest req;
    req.set_id(sb.id());
    v1::DestroySandboxResponse r;
    ASSERT_OK(stub->Destroy(&ctx, req, &r));
  }
  {
    grpc::ClientContext ctx;
    v1::GetSandboxRequest req;
    req.set_id(sb.id());
    v1::Sandbox r;
    EXPECT_EQ(stub->Get(&ctx, req, &r).error_code(), grpc::StatusCode::NOT_FOUND);
  }
}

TEST_F(ApiTest, ErrorsMapToTypedCodes) {
  auto stub = v1::Sandboxes::NewStub(unix_);
  {
    grpc::ClientContext ctx;
    v1::CreateSandboxRequest req;
    req.add_layers("base/debian@12");
    req.mutable_resources()->set_pids(9999999);
    v1::Sandbox sb;
    grpc::Status s = stub->Create(&ctx, req, &sb);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("resources.pids=9999999"), std::string::npos);
  }
  {
    grpc::ClientContext ctx;
    v1::CreateSandboxRequest req;
    req.add_layers("base/nope@1");
    v1::Sandbox sb;
    grpc::Status s = stub->Create(&ctx, req, &sb);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_NE(s.error_message().find("base/nope@1"), std::string::npos);
  }
  v1::Sandbox sb = CreateOne();
  struct ExecCase {
    std::function<void(v1::ExecRequest&)> mutate;
    std::string want;
  };
  std::vector<ExecCase> cases = {
      {[](v1::ExecRequest& r) { r.clear_shell(); }, "exactly one of argv or shell"},
      {[](v1::ExecRequest& r) { r.add_argv("ls"); }, "exactly one of argv or shell"},
      {[](v1::ExecRequest& r) { (*r.mutable_env())["A=B"] = "x"; }, "env key"},
      {[](v1::ExecRequest& r) { r.set_output_cap_bytes((256ull << 20) + 1); }, "output_cap_bytes"},
      {[](v1::ExecRequest& r) { r.set_cwd("rel"); }, "cwd="},
      {[](v1::ExecRequest& r) { r.set_user("no body"); }, "user="},
  };
  for (const auto& c : cases) {
    grpc::ClientContext ctx;
    v1::ExecRequest req;
    req.set_sandbox_id(sb.id());
    req.set_shell("true");
    c.mutate(req);
    v1::ExecResult r;
    grpc::Status s = stub->Exec(&ctx, req, &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.want;
    EXPECT_NE(s.error_message().find(c.want), std::string::npos) << s.error_message();
  }
  grpc::ClientContext ctx;
  v1::ExecRequest req;
  req.set_sandbox_id("n0-ffffffffffff");
  req.set_shell("true");
  v1::ExecResult r;
  EXPECT_EQ(stub->Exec(&ctx, req, &r).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ApiTest, TcpNeedsTheBearerToken) {
  auto stub = v1::Node::NewStub(tcp_);
  v1::NodeStatusRequest req;
  v1::NodeStatus st;
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(stub->Status(&ctx, req, &st).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer wrong!");
    EXPECT_EQ(stub->Status(&ctx, req, &st).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer s3cret");
    grpc::Status s = stub->Status(&ctx, req, &st);
    ASSERT_OK(s);
    EXPECT_EQ(st.node_id(), "n0");
    EXPECT_EQ(st.cgroup_version(), "v1");
    EXPECT_EQ(st.cpus(), 2u);
    EXPECT_EQ(st.backends(0), "container");
    EXPECT_EQ(st.layers(), 1u);
    EXPECT_GT(st.memory_total_bytes(), 0u);
  }
  // The unix socket needs no token.
  grpc::ClientContext ctx;
  EXPECT_OK(v1::Node::NewStub(unix_)->Status(&ctx, req, &st));
}

TEST_F(ApiTest, FilesWriteAndReadStreamInChunks) {
  v1::Sandbox sb = CreateOne();
  auto stub = v1::Files::NewStub(unix_);
  std::string payload;
  for (int i = 0; i < (3 << 20) + 17; ++i) payload.push_back(static_cast<char>(i * 7));
  {
    grpc::ClientContext ctx;
    v1::WriteFileResponse resp;
    auto w = stub->Write(&ctx, &resp);
    v1::WriteFileRequest m;
    m.set_sandbox_id(sb.id());
    m.set_path("/w/blob");
    ASSERT_TRUE(w->Write(m));
    for (size_t off = 0; off < payload.size(); off += 1 << 20) {
      v1::WriteFileRequest d;
      d.set_data(payload.substr(off, 1 << 20));
      ASSERT_TRUE(w->Write(d));
    }
    w->WritesDone();
    grpc::Status s = w->Finish();
    ASSERT_OK(s);
    EXPECT_EQ(resp.bytes_written(), payload.size());
  }
  {
    grpc::ClientContext ctx;
    v1::ReadFileRequest req;
    req.set_sandbox_id(sb.id());
    req.set_path("/w/blob");
    auto r = stub->Read(&ctx, req);
    v1::ReadFileChunk c;
    std::string got;
    int chunks = 0;
    while (r->Read(&c)) {
      EXPECT_LE(c.data().size(), 1u << 20);
      got += c.data();
      ++chunks;
    }
    ASSERT_OK(r->Finish());
    EXPECT_EQ(chunks, 4);
    EXPECT_TRUE(got == payload);
  }
  {
    grpc::ClientContext ctx;
    v1::StatRequest req;
    req.set_sandbox_id(sb.id());
    req.set_path("/w/missing");
    v1::FileInfo fi;
    EXPECT_EQ(stub->Stat(&ctx, req, &fi).error_code(), grpc::StatusCode::NOT_FOUND);
  }
}

TEST_F(ApiTest, LayerBuildFromTarSpoolsAndRemoveRefusesInUse) {
  auto stub = v1::Layers::NewStub(unix_);
  {
    grpc::ClientContext ctx;
    v1::Layer layer;
    auto w = stub->Build(&ctx, &layer);
    v1::BuildLayerRequest m;
    m.set_name("workspace/demo@1");
    m.set_tar_chunk(std::string(1000, 't'));
    ASSERT_TRUE(w->Write(m));
    v1::BuildLayerRequest m2;
    m2.set_tar_chunk(std::string(500, 'u'));
    ASSERT_TRUE(w->Write(m2));
    w->WritesDone();
    grpc::Status s = w->Finish();
    ASSERT_OK(s);
    EXPECT_EQ(layer.name(), "workspace/demo@1");
  }
  ASSERT_EQ(layers_->builds.size(), 1u);
  EXPECT_EQ(layers_->builds[0], "tar:workspace/demo@1:1500");
  EXPECT_TRUE(fs::is_empty(layers_->tmp_dir));  // spool file removed
  {
    // source_dir over TCP is refused.
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer s3cret");
    v1::Layer layer;
    auto w = v1::Layers::NewStub(tcp_)->Build(&ctx, &layer);
    v1::BuildLayerRequest m;
    m.set_name("base/x@1");
    m.set_source_dir("/etc");
    w->Write(m);
    w->WritesDone();
    EXPECT_EQ(w->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  v1::Sandbox sb = CreateOne();
  {
    grpc::ClientContext ctx;
    v1::GetLayerRequest req;
    req.set_ref("base/debian@12");
    v1::Layer l;
    ASSERT_OK(stub->Get(&ctx, req, &l));
    EXPECT_EQ(l.in_use(), 1u);
    EXPECT_TRUE(l.mounted());
  }
  {
    grpc::ClientContext ctx;
    v1::RemoveLayerRequest req;
    req.set_ref("base/debian@12");
    v1::Empty e;
    EXPECT_EQ(stub->Remove(&ctx, req, &e).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
}

}  // namespace
}  // namespace warren::api
