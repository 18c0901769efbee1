// Every RPC of every warren.v1 service refuses a TCP caller without the
// bearer token (or with a wrong one) before it reads its request: the
// methods are taken from the proto descriptors, so an RPC added later is
// covered without touching this test.
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "api/auth.h"
#include "api/fncall_service.h"
#include "api/services.h"
#include "common/secret.h"
#include "fake_node.h"
#include "status_matchers.h"
#include "warren/v1/fncall.pb.h"
#include "warren/v1/image.pb.h"
#include "warren/v1/process.pb.h"
#include "warren/v1/project.pb.h"
#include "warren/v1/warren.pb.h"

namespace warren::api {
namespace {

namespace fs = std::filesystem;
namespace v1 = ::warren::v1;

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/warren-auth-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    auto world = std::make_shared<testing::FakeWorld>();
    auto layers = std::make_shared<testing::FakeLayerState>();
    layers->tmp_dir = root_ + "/layer-tmp";
    node::ManagerOptions o;
    o.state_dir = root_ + "/state";
    o.limits.cpus = 2;
    o.limits.memory_mb = 4096;
    o.sweep_interval = std::chrono::milliseconds(0);
    std::vector<std::unique_ptr<runtime::Backend>> b;
    b.push_back(std::make_unique<testing::FakeBackend>(world));
    auto m = node::SandboxManager::New(o, std::move(b), std::make_unique<testing::FakeLayers>(layers));
    ASSERT_OK(m);
    manager_ = std::move(*m);
    ASSERT_OK(manager_->Start());
    ServiceOptions so;
    so.token = "s3cret";
    services_ = std::make_unique<WarrenServices>(manager_.get(), so);
    // Refused before the front end is used: none is needed.
    fncall_ = std::make_unique<FnCallServiceImpl>(nullptr, "s3cret");
    ServerOptions sopt;
    sopt.unix_socket = root_ + "/w.sock";
    sopt.tcp_listen = "127.0.0.1:0";
    auto server = StartServer(sopt, *services_, &tcp_port_, {fncall_.get()});
    ASSERT_OK(server);
    server_ = std::move(*server);
    tcp_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(tcp_port_), grpc::InsecureChannelCredentials());
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    server_.reset();
    fncall_.reset();
    services_.reset();
    manager_.reset();
    fs::remove_all(root_);
  }

  // Calls `method` ("/pkg.Service/Method") with one empty request message,
  // then half-closes; returns the call's status.
  grpc::Status CallEmpty(const std::string& method, const std::string& authorization) {
    grpc::GenericStub stub(tcp_);
    grpc::CompletionQueue cq;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(&ctx, method, &cq);
    auto step = [&cq](intptr_t want) {
      void* tag = nullptr;
      bool ok = false;
      EXPECT_TRUE(cq.Next(&tag, &ok));
      EXPECT_EQ(reinterpret_cast<intptr_t>(tag), want);
    };
    call->StartCall(reinterpret_cast<void*>(1));
    step(1);
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1);
    call->Write(request, reinterpret_cast<void*>(2));
    step(2);
    call->WritesDone(reinterpret_cast<void*>(3));
    step(3);
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(4));
    step(4);
    cq.Shutdown();
    void* tag;
    bool ok;
    while (cq.Next(&tag, &ok)) {
    }
    return status;
  }

  std::string root_;
  int tcp_port_ = 0;
  std::unique_ptr<node::SandboxManager> manager_;
  std::unique_ptr<WarrenServices> services_;
  std::unique_ptr<FnCallServiceImpl> fncall_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> tcp_;
};

// Every method of every service the daemon serves: warren.proto,
// process.proto, fncall.proto, image.proto and project.proto.
std::vector<std::string> AllMethods() {
  std::vector<std::string> out;
  for (const google::protobuf::FileDescriptor* f :
       {v1::CreateSandboxRequest::descriptor()->file(), v1::ProcessEvent::descriptor()->file(),
        v1::FnCallRequest::descriptor()->file(), v1::PullImageRequest::descriptor()->file(),
        v1::CreateProjectRequest::descriptor()->file()}) {
    for (int s = 0; s < f->service_count(); ++s) {
      const google::protobuf::ServiceDescriptor* svc = f->service(s);
      for (int m = 0; m < svc->method_count(); ++m) {
        out.push_back("/" + std::string(svc->full_name()) + "/" + std::string(svc->method(m)->name()));
      }
    }
  }
  return out;
}

TEST_F(AuthTest, EveryRpcOfEveryServiceRefusesTcpCallersWithoutTheToken) {
  const std::vector<std::string> methods = AllMethods();
  ASSERT_GE(methods.size(), 40u);  // the seven services' methods
  for (const std::string& m : methods) {
    grpc::Status none = CallEmpty(m, "");
    EXPECT_EQ(none.error_code(), grpc::StatusCode::PERMISSION_DENIED) << m << ": " << none.error_message();
    grpc::Status wrong = CallEmpty(m, "Bearer wrong!");
    EXPECT_EQ(wrong.error_code(), grpc::StatusCode::PERMISSION_DENIED) << m << ": " << wrong.error_message();
  }
}

TEST_F(AuthTest, TheTokenIsAcceptedOverTcp) {
  // With the token the call gets past auth to its own input checks.
  grpc::Status s = CallEmpty("/warren.v1.Sandboxes/Get", "Bearer s3cret");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  s = CallEmpty("/warren.v1.Processes/Get", "Bearer s3cret");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
}

TEST(SecretTest, SameSecretComparesWholeStrings) {
  EXPECT_TRUE(SameSecret("Bearer abc", "Bearer abc"));
  EXPECT_FALSE(SameSecret("Bearer abc", "Bearer abd"));
  EXPECT_FALSE(SameSecret("Bearer ab", "Bearer abc"));
  EXPECT_FALSE(SameSecret("", "x"));
}

}  // namespace
}  // namespace warren::api
