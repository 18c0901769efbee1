#include "cli/client.h"

#include "absl/strings/match.h"

namespace warren::cli {

std::string ResolveTarget(const std::string& addr) {
  if (addr.empty()) return kDefaultAddr;
  for (const char* scheme : {"unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:", "vsock:"}) {
    if (absl::StartsWith(addr, scheme)) return addr;
  }
  if (addr.find("://") != std::string::npos) return addr;
  if (addr.front() == '/') return "unix:" + addr;
  return addr;
}

Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

Client::Client(const GlobalOptions& opts) : token_(opts.token) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  channel_ = grpc::CreateCustomChannel(ResolveTarget(opts.addr), grpc::InsecureChannelCredentials(), args);
  sandboxes_ = v1::Sandboxes::NewStub(channel_);
  files_ = v1::Files::NewStub(channel_);
  layers_ = v1::Layers::NewStub(channel_);
  node_ = v1::Node::NewStub(channel_);
}

void Client::Prepare(grpc::ClientContext* ctx) const {
  if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
}

}  // namespace warren::cli
