#include "api/lifecycle_service.h"

#include <algorithm>
#include <vector>

#include "api/convert.h"
#include "api/projects.h"
#include "api/status_map.h"

namespace warren::api {

namespace v1 = ::warren::v1;

grpc::Status LifecycleService::JobHeartbeat(grpc::ServerContext* ctx, const v1::JobHeartbeatRequest* req,
                                            v1::Job* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckJobAccess(deps_, *ctx, req->job()));
  ASSIGN_OR_RETURN_GRPC(node::JobInfo j, deps_.manager->JobHeartbeat(req->job(), req->lease_s(), req->grace_s()));
  ToProto(j, resp);
  // In a cluster the job's lease is kept on every node (each holds some of
  // its sandboxes, or may).
  std::vector<v1::Job> peers;
  RETURN_IF_GRPC_ERROR(FanOut<v1::Lifecycle>(deps_.forward, *ctx, &peers,
                                             [&](auto& s, auto* c, auto* r) { return s.JobHeartbeat(c, *req, r); }));
  for (const v1::Job& p : peers) resp->set_sandboxes(resp->sandboxes() + p.sandboxes());
  return grpc::Status::OK;
}

grpc::Status LifecycleService::GetJob(grpc::ServerContext* ctx, const v1::JobRequest* req, v1::Job* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  if (req->job().empty()) return Invalid("job is empty");
  RETURN_IF_GRPC_ERROR(CheckJobAccess(deps_, *ctx, req->job()));
  StatusOr<node::JobInfo> j = deps_.manager->GetJob(req->job());
  if (j.ok()) {
    ToProto(*j, resp);
  } else if (deps_.forward == nullptr || j.status().code() != absl::StatusCode::kNotFound) {
    return ToGrpcStatus(j.status());
  }
  // In a cluster: the job as the nodes that know it see it, sandboxes summed.
  bool found = j.ok();
  std::vector<v1::Job> peers;
  RETURN_IF_GRPC_ERROR(FanOut<v1::Lifecycle>(deps_.forward, *ctx, &peers, [&](auto& s, auto* c, auto* r) {
    grpc::Status g = s.GetJob(c, *req, r);
    return g.error_code() == grpc::StatusCode::NOT_FOUND ? grpc::Status::OK : g;
  }));
  for (const v1::Job& p : peers) {
    if (p.name().empty()) continue;  // not known there
    if (!found) {
      *resp = p;
      found = true;
    } else {
      resp->set_sandboxes(resp->sandboxes() + p.sandboxes());
      // Each node lapses its part of the job: lapsed where any did, since
      // the first.
      if (p.lapsed() && (!resp->lapsed() || p.lapsed_at_ns() < resp->lapsed_at_ns())) {
        resp->set_lapsed(true);
        resp->set_lapsed_at_ns(p.lapsed_at_ns());
      }
    }
  }
  if (!found) return ToGrpcStatus(j.status());
  return grpc::Status::OK;
}

grpc::Status LifecycleService::SuspendJob(grpc::ServerContext* ctx, const v1::JobRequest* req,
                                          v1::JobActionResponse* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  if (req->job().empty()) return Invalid("job is empty");
  RETURN_IF_GRPC_ERROR(CheckJobAccess(deps_, *ctx, req->job()));
  resp->set_affected(deps_.manager->SuspendJob(req->job(), "job suspend requested"));
  std::vector<v1::JobActionResponse> peers;
  RETURN_IF_GRPC_ERROR(FanOut<v1::Lifecycle>(deps_.forward, *ctx, &peers,
                                             [&](auto& s, auto* c, auto* r) { return s.SuspendJob(c, *req, r); }));
  for (const v1::JobActionResponse& p : peers) resp->set_affected(resp->affected() + p.affected());
  return grpc::Status::OK;
}

grpc::Status LifecycleService::ResumeJob(grpc::ServerContext* ctx, const v1::JobRequest* req,
                                         v1::JobActionResponse* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  if (req->job().empty()) return Invalid("job is empty");
  RETURN_IF_GRPC_ERROR(CheckJobAccess(deps_, *ctx, req->job()));
  resp->set_affected(deps_.manager->ResumeJob(req->job()));
  std::vector<v1::JobActionResponse> peers;
  RETURN_IF_GRPC_ERROR(FanOut<v1::Lifecycle>(deps_.forward, *ctx, &peers,
                                             [&](auto& s, auto* c, auto* r) { return s.ResumeJob(c, *req, r); }));
  for (const v1::JobActionResponse& p : peers) resp->set_affected(resp->affected() + p.affected());
  return grpc::Status::OK;
}

grpc::Status LifecycleService::DestroyJob(grpc::ServerContext* ctx, const v1::JobRequest* req,
                                          v1::JobActionResponse* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  if (req->job().empty()) return Invalid("job is empty");
  RETURN_IF_GRPC_ERROR(CheckJobAccess(deps_, *ctx, req->job()));
  resp->set_affected(deps_.manager->DestroyJob(req->job(), "job destroy requested"));
  std::vector<v1::JobActionResponse> peers;
  RETURN_IF_GRPC_ERROR(FanOut<v1::Lifecycle>(deps_.forward, *ctx, &peers,
                                             [&](auto& s, auto* c, auto* r) { return s.DestroyJob(c, *req, r); }));
  for (const v1::JobActionResponse& p : peers) resp->set_affected(resp->affected() + p.affected());
  return grpc::Status::OK;
}

grpc::Status LifecycleService::ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                                        v1::ListJobsResponse* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  // A project sees the jobs whose sandboxes here are all its own.
  const std::string project = deps_.auth->Project(*ctx);
  for (const node::JobInfo& j : deps_.manager->ListJobs()) {
    if (project.empty() || (!deps_.manager->List({}, j.name).empty() && CheckJobAccess(deps_, *ctx, j.name).ok())) {
      ToProto(j, resp->add_jobs());
    }
  }
  // In a cluster: every node's jobs, one entry per name, sandboxes summed.
  std::vector<v1::ListJobsResponse> peers;
  RETURN_IF_GRPC_ERROR(FanOut<v1::Lifecycle>(deps_.forward, *ctx, &peers,
                                             [&](auto& s, auto* c, auto* r) { return s.ListJobs(c, *req, r); }));
  for (const v1::ListJobsResponse& p : peers) {
    for (const v1::Job& job : p.jobs()) {
      auto same = std::find_if(resp->mutable_jobs()->begin(), resp->mutable_jobs()->end(),
                               [&](const v1::Job& x) { return x.name() == job.name(); });
      if (same == resp->mutable_jobs()->end()) {
        *resp->add_jobs() = job;
      } else {
        same->set_sandboxes(same->sandboxes() + job.sandboxes());
      }
    }
  }
  return grpc::Status::OK;
}

grpc::Status LifecycleService::ExtendTtl(grpc::ServerContext* ctx, const v1::ExtendTtlRequest* req, v1::Sandbox* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->id()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->id(), v1::Lifecycle, ExtendTtl, *req, resp);
  ASSIGN_OR_RETURN_GRPC(node::SandboxInfo info, deps_.manager->ExtendTtl(req->id(), req->ttl_s()));
  ToProto(info, resp);
  return grpc::Status::OK;
}

grpc::Status LifecycleService::Pause(grpc::ServerContext* ctx, const v1::PauseRequest* req, v1::Sandbox* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->id()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->id(), v1::Lifecycle, Pause, *req, resp);
  RETURN_IF_GRPC_ERROR(ToGrpcStatus(deps_.manager->Pause(req->id())));
  ASSIGN_OR_RETURN_GRPC(node::SandboxInfo info, deps_.manager->Get(req->id()));
  ToProto(info, resp);
  return grpc::Status::OK;
}

grpc::Status LifecycleService::Resume(grpc::ServerContext* ctx, const v1::ResumeRequest* req, v1::Sandbox* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->id()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->id(), v1::Lifecycle, Resume, *req, resp);
  RETURN_IF_GRPC_ERROR(ToGrpcStatus(deps_.manager->Resume(req->id(), !req->no_prefetch())));
  ASSIGN_OR_RETURN_GRPC(node::SandboxInfo info, deps_.manager->Get(req->id()));
  ToProto(info, resp);
  return grpc::Status::OK;
}

grpc::Status LifecycleService::Suspend(grpc::ServerContext* ctx, const v1::SuspendRequest* req, v1::Sandbox* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->id()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->id(), v1::Lifecycle, Suspend, *req, resp);
  RETURN_IF_GRPC_ERROR(ToGrpcStatus(deps_.manager->Suspend(req->id())));
  ASSIGN_OR_RETURN_GRPC(node::SandboxInfo info, deps_.manager->Get(req->id()));
  ToProto(info, resp);
  if (StatusOr<node::SandboxMemory> m = deps_.manager->Memory(req->id()); m.ok()) {
    resp->set_memory_bytes(m->memory_bytes);
    resp->set_swap_bytes(m->swap_bytes);
  }
  return grpc::Status::OK;
}

grpc::Status LifecycleService::Snapshot(grpc::ServerContext* ctx, const v1::SnapshotRequest* req,
                                        v1::SnapshotResponse* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->id()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->id(), v1::Lifecycle, Snapshot, *req, resp);
  if (!req->name().empty() && !deps_.auth->Project(*ctx).empty()) {
    // Layer names are node-wide: a project's would take one from everyone.
    return Invalid("snapshot name " + Quote(req->name()) +
                   ": a project's snapshot is named by the node (workspace/snap-<id>@<unix ns>); leave it empty");
  }
  node::SnapshotRequest r;
  r.id = req->id();
  r.name = req->name();
  r.exclude.assign(req->exclude().begin(), req->exclude().end());
  for (const auto& x : r.exclude) {
    if (x.empty() || x.find('\0') != std::string::npos) {
      return Invalid("exclude entry " + Quote(x) + " is empty or has NUL");
    }
  }
  r.pause = !req->no_pause();
  ASSIGN_OR_RETURN_GRPC(node::SandboxInfo info, deps_.manager->Get(req->id()));
  r.project = ProjectOf(info);  // the layer is that project's (image::LayerInfo::projects)
  ASSIGN_OR_RETURN_GRPC(image::LayerInfo li, deps_.manager->Snapshot(r));
  ToProto(li, resp->mutable_layer());
  for (const auto& d : info.layer_digests) resp->add_layers(d);
  resp->add_layers(li.digest);
  return grpc::Status::OK;
}

grpc::Status LifecycleService::Fork(grpc::ServerContext* ctx, const v1::ForkRequest* req, v1::ForkResponse* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->id()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->id(), v1::Lifecycle, Fork, *req, resp);
  if (req->labels().count(kProjectLabel) != 0 && !deps_.auth->Project(*ctx).empty()) {
    return {grpc::StatusCode::PERMISSION_DENIED,
            std::string("fork: label ") + kProjectLabel + " is set by the node (the forks are the source's project's)"};
  }
  node::ForkRequest r;
  r.id = req->id();
  r.count = req->count();
  r.labels = std::map<std::string, std::string>(req->labels().begin(), req->labels().end());
  r.ttl_s = req->ttl_s();
  r.exclude.assign(req->exclude().begin(), req->exclude().end());
  for (const auto& x : r.exclude) {
    if (x.empty() || x.find('\0') != std::string::npos) {
      return Invalid("exclude entry " + Quote(x) + " is empty or has NUL");
    }
  }
  r.pause = !req->no_pause();
  ASSIGN_OR_RETURN_GRPC(node::SandboxInfo info, deps_.manager->Get(req->id()));
  r.project = ProjectOf(info);
  // The forks are creates of the source's project: each takes its share of
  // the project's quotas (cluster-wide) before any is made; all or none.
  std::vector<std::unique_ptr<QuotaHold>> holds;
  if (!r.project.empty() && deps_.auth->projects() != nullptr && r.count <= node::SnapshotService::kMaxForks) {
    node::CreateRequest share;  // a fork's: the source's resources, no layers of its own to check
    share.resources = info.resources;
    for (uint32_t i = 0; i < r.count; ++i) {
      StatusOr<std::unique_ptr<QuotaHold>> h = AdmitCreate(deps_.auth->projects(), *deps_.manager, r.project, &share);
      if (!h.ok()) {
        grpc::Status g = ToGrpcStatus(h.status());
        return {g.error_code(), "fork of " + std::to_string(r.count) + ": " + g.error_message()};
      }
      holds.push_back(*std::move(h));
    }
  }
  ASSIGN_OR_RETURN_GRPC(node::ForkResult res, deps_.manager->Fork(r));
  ToProto(res.layer, resp->mutable_layer());
  for (const node::SandboxInfo& f : res.sandboxes) ToProto(f, resp->add_sandboxes());
  return grpc::Status::OK;
}

grpc::Status LifecycleService::Grade(grpc::ServerContext* ctx, const v1::GradeRequest* req, v1::GradeResponse* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->id()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->id(), v1::Lifecycle, Grade, *req, resp);
  node::GradeRequest g;
  g.id = req->id();
  ASSIGN_OR_RETURN_GRPC(node::SandboxInfo info, deps_.manager->Get(req->id()));
  g.project = ProjectOf(info);  // the grade layers hold the agent's solution: its project's
  RETURN_IF_GRPC_ERROR(ToExecSpec(req->grader(), &g.grader));
  g.protected_paths.assign(req->protected_paths().begin(), req->protected_paths().end());
  g.solution.assign(req->solution().begin(), req->solution().end());
  ASSIGN_OR_RETURN_GRPC(node::GradeResult res, deps_.manager->Grade(g));
  ToProto(std::move(res.outcome), resp->mutable_result());
  for (const auto& t : res.touched) resp->add_touched(t);
  resp->set_grade_sandbox_id(res.grade_sandbox_id);
  resp->set_touched_truncated(res.touched_truncated);
  resp->set_rejected(res.rejected);
  return grpc::Status::OK;
}

grpc::Status LifecycleService::AuditLog(grpc::ServerContext* ctx, const v1::AuditLogRequest* req,
                                        v1::AuditLogResponse* resp) {
  RETURN_IF_GRPC_ERROR(deps_.auth->Check(*ctx));
  RETURN_IF_GRPC_ERROR(CheckId(req->id()));
  WARREN_FORWARD_UNARY(deps_, ctx, req->id(), v1::Lifecycle, AuditLog, *req, resp);
  ASSIGN_OR_RETURN_GRPC(std::vector<nlohmann::json> entries, deps_.manager->AuditLog(req->id()));
  for (const auto& e : entries) resp->add_entries(e.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  return grpc::Status::OK;
}

}  // namespace warren::api
