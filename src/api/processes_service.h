// warren.v1.Processes: interactive execs (ExecStream: stdin, signals and
// resizes in, output and the exit out, over one bidi stream) and background
// processes (spawn, list, get, wait, signal, input, resize, output replay).
//
// Thread-safe: handlers run concurrently on the server's thread pool; an
// ExecStream holds two threads (output and client messages) for its duration.
#pragma once

#include "api/service_deps.h"
#include "node/process_table.h"
#include "warren/v1/process.grpc.pb.h"

namespace warren::api {

class ProcessesService final : public warren::v1::Processes::Service {
 public:
  explicit ProcessesService(ServiceDeps deps) : deps_(deps) {}

  // The process lives as long as the stream: a client that goes away kills
  // its whole tree (CANCELLED). Output is lossless (back-pressure).
  grpc::Status ExecStream(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<warren::v1::ProcessEvent, warren::v1::ExecStreamRequest>* stream) override;
  grpc::Status Spawn(grpc::ServerContext* ctx, const warren::v1::SpawnRequest* req,
                     warren::v1::ProcessInfo* resp) override;
  grpc::Status List(grpc::ServerContext* ctx, const warren::v1::ListProcessesRequest* req,
                    warren::v1::ListProcessesResponse* resp) override;
  grpc::Status Get(grpc::ServerContext* ctx, const warren::v1::ProcessRef* req, warren::v1::ProcessInfo* resp) override;
  grpc::Status Wait(grpc::ServerContext* ctx, const warren::v1::WaitProcessRequest* req,
                    warren::v1::ProcessInfo* resp) override;
  grpc::Status Signal(grpc::ServerContext* ctx, const warren::v1::SignalProcessRequest* req,
                      warren::v1::Empty*) override;
  grpc::Status Input(grpc::ServerContext* ctx, const warren::v1::ProcessInputRequest* req, warren::v1::Empty*) override;
  grpc::Status Resize(grpc::ServerContext* ctx, const warren::v1::ResizeRequest* req, warren::v1::Empty*) override;
  grpc::Status Output(grpc::ServerContext* ctx, const warren::v1::ProcessOutputRequest* req,
                      grpc::ServerWriter<warren::v1::ProcessEvent>* writer) override;

 private:
  const ServiceDeps deps_;
};

}  // namespace warren::api
