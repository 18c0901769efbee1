// Jobs and their leases (DESIGN.md §5): a job is the set of sandboxes
// created with its name; its lease is renewed by the trainer's heartbeats.
// When a lease lapses the job's sandboxes are suspended; when it stays
// lapsed for grace_s they are destroyed; a heartbeat within the grace resumes
// them. Leases persist in <state_dir>/jobs.json. Thread-safe; one lock of its
// own (the leases), never held while calling into the table.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "node/sandbox_types.h"
#include "node/table/sandbox_table.h"

namespace warren::node {

class Jobs {
 public:
  // Borrows the table.
  Jobs(const std::string& state_dir, SandboxTable& table);

  // Reads the leases a previous daemon persisted.
  void Load();
  // Renews (or starts) the lease: lease_s/grace_s 0 keep the previous values
  // (defaults 60 s / 300 s). A lapsed job's sandboxes are resumed.
  StatusOr<JobInfo> Heartbeat(const std::string& job, uint32_t lease_s, uint32_t grace_s);
  // NotFound for a job with neither a lease nor sandboxes.
  StatusOr<JobInfo> Get(const std::string& job) const;
  // Every job with a lease or with sandboxes, by name.
  std::vector<JobInfo> List() const;
  // Suspend / resume / destroy every sandbox of a job; returns how many were
  // affected. Errors of single sandboxes are logged and skipped. Destroy
  // also forgets the job's lease.
  uint32_t Suspend(const std::string& job, const std::string& reason);
  uint32_t Resume(const std::string& job);
  uint32_t Destroy(const std::string& job, const std::string& reason);
  // Suspends the sandboxes of jobs whose lease lapsed, destroys those whose
  // grace expired (the reaper calls this).
  void Reap();

 private:
  void SaveLocked() const;

  const std::string path_;
  SandboxTable& table_;
  mutable std::mutex mu_;
  std::map<std::string, JobInfo> jobs_;  // guarded by mu_
};

}  // namespace warren::node
