// warren.v1.Files: streamed write and read, stat, list, mkdir, remove,
// rename of files inside a running sandbox (a paused one resumes). Every call
// is recorded in the sandbox's audit log, failed ones with their error.
//
// Thread-safe: handlers run concurrently on the server's thread pool.
#pragma once

#include <cstdint>
#include <string>

#include "api/service_deps.h"
#include "warren/v1/warren.grpc.pb.h"

namespace warren::api {

class FilesService final : public warren::v1::Files::Service {
 public:
  explicit FilesService(ServiceDeps deps) : deps_(deps) {}

  // Idempotent by request_id (a replay is audited as such); chunks of at
  // most 16 MiB.
  grpc::Status Write(grpc::ServerContext* ctx, grpc::ServerReader<warren::v1::WriteFileRequest>* reader,
                     warren::v1::WriteFileResponse* resp) override;
  grpc::Status Read(grpc::ServerContext* ctx, const warren::v1::ReadFileRequest* req,
                    grpc::ServerWriter<warren::v1::ReadFileChunk>* writer) override;
  grpc::Status Stat(grpc::ServerContext* ctx, const warren::v1::StatRequest* req, warren::v1::FileInfo* resp) override;
  grpc::Status ListDir(grpc::ServerContext* ctx, const warren::v1::ListDirRequest* req,
                       warren::v1::ListDirResponse* resp) override;
  grpc::Status Mkdir(grpc::ServerContext* ctx, const warren::v1::MkdirRequest* req, warren::v1::Empty*) override;
  grpc::Status Remove(grpc::ServerContext* ctx, const warren::v1::RemoveRequest* req, warren::v1::Empty*) override;
  grpc::Status Rename(grpc::ServerContext* ctx, const warren::v1::RenameRequest* req, warren::v1::Empty*) override;

 private:
  // Records a file call in the sandbox's audit log; returns `st`.
  grpc::Status Audited(const std::string& id, const char* op, const std::string& path, int64_t t0, grpc::Status st,
                       uint64_t bytes = 0, const std::string& to = std::string());

  const ServiceDeps deps_;
};

}  // namespace warren::api
