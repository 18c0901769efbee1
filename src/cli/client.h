// The one place the CLI sets up its gRPC channel: target resolution (unix
// socket vs TCP), bearer token, message size limits. Every verb goes through
// Client.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "cli/commands.h"
#include "common/status.h"
#include "warren/v1/warren.grpc.pb.h"

namespace warren::cli {

// Largest message either way (exec output, file chunks): 600 MiB.
inline constexpr int kMaxMessageBytes = 600 << 20;
// Chunk size of streamed uploads (files, layer tars).
inline constexpr size_t kChunkBytes = 1 << 20;

// Maps --addr to a gRPC target: "unix:..."/"unix-abstract:..."/"dns:..."/
// "ipv4:"/"ipv6:" and anything with "://" pass through; "/abs/path" becomes
// "unix:/abs/path"; anything else ("host:port") is TCP.
std::string ResolveTarget(const std::string& addr);

// gRPC and absl share code numbers; the message is kept.
Status FromGrpc(const grpc::Status& s);

class Client {
 public:
  // Creates the channel lazily connecting; never blocks.
  explicit Client(const GlobalOptions& opts);

  // Adds the bearer token (if any) to a fresh context. Call once per RPC.
  void Prepare(grpc::ClientContext* ctx) const;

  v1::Sandboxes::Stub& sandboxes() { return *sandboxes_; }
  v1::Files::Stub& files() { return *files_; }
  v1::Layers::Stub& layers() { return *layers_; }
  v1::Node::Stub& node() { return *node_; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }

 private:
  std::string token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Sandboxes::Stub> sandboxes_;
  std::unique_ptr<v1::Files::Stub> files_;
  std::unique_ptr<v1::Layers::Stub> layers_;
  std::unique_ptr<v1::Node::Stub> node_;
};

}  // namespace warren::cli
