// warren.v1.Lifecycle: TTL, pause/resume, suspend, snapshot, fork, grade,
// jobs and their leases, the audit log.
//
// Thread-safe: handlers run concurrently on the server's thread pool; a
// Grade or Snapshot blocks its thread for its duration.
#pragma once

#include "api/service_deps.h"
#include "warren/v1/warren.grpc.pb.h"

namespace warren::api {

class LifecycleService final : public warren::v1::Lifecycle::Service {
 public:
  explicit LifecycleService(ServiceDeps deps) : deps_(deps) {}

  grpc::Status JobHeartbeat(grpc::ServerContext* ctx, const warren::v1::JobHeartbeatRequest* req,
                            warren::v1::Job* resp) override;
  grpc::Status GetJob(grpc::ServerContext* ctx, const warren::v1::JobRequest* req, warren::v1::Job* resp) override;
  grpc::Status SuspendJob(grpc::ServerContext* ctx, const warren::v1::JobRequest* req,
                          warren::v1::JobActionResponse* resp) override;
  grpc::Status ResumeJob(grpc::ServerContext* ctx, const warren::v1::JobRequest* req,
                         warren::v1::JobActionResponse* resp) override;
  grpc::Status DestroyJob(grpc::ServerContext* ctx, const warren::v1::JobRequest* req,
                          warren::v1::JobActionResponse* resp) override;
  grpc::Status ListJobs(grpc::ServerContext* ctx, const warren::v1::ListJobsRequest* req,
                        warren::v1::ListJobsResponse* resp) override;
  grpc::Status ExtendTtl(grpc::ServerContext* ctx, const warren::v1::ExtendTtlRequest* req,
                         warren::v1::Sandbox* resp) override;
  grpc::Status Pause(grpc::ServerContext* ctx, const warren::v1::PauseRequest* req, warren::v1::Sandbox* resp) override;
  grpc::Status Resume(grpc::ServerContext* ctx, const warren::v1::ResumeRequest* req,
                      warren::v1::Sandbox* resp) override;
  grpc::Status Suspend(grpc::ServerContext* ctx, const warren::v1::SuspendRequest* req,
                       warren::v1::Sandbox* resp) override;
  grpc::Status Snapshot(grpc::ServerContext* ctx, const warren::v1::SnapshotRequest* req,
                        warren::v1::SnapshotResponse* resp) override;
  grpc::Status Fork(grpc::ServerContext* ctx, const warren::v1::ForkRequest* req,
                    warren::v1::ForkResponse* resp) override;
  grpc::Status Grade(grpc::ServerContext* ctx, const warren::v1::GradeRequest* req,
                     warren::v1::GradeResponse* resp) override;
  grpc::Status AuditLog(grpc::ServerContext* ctx, const warren::v1::AuditLogRequest* req,
                        warren::v1::AuditLogResponse* resp) override;

 private:
  const ServiceDeps deps_;
};

}  // namespace warren::api
