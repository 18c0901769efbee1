// SnapshotService::Grade (see snapshot_service.h): the grader's sandbox is
// built from pristine layers plus, per agent diff, a layer of only the
// solution paths; the agent's sandbox is only read (frozen meanwhile). The
// grade layers and the grader's sandbox are removed afterwards. A solution
// that cannot be packed because of what the agent put there (over its disk
// limit, a path longer than a layer holds) is a graded failure, not an error.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>

#include "common/file_util.h"
#include "common/log.h"
#include "common/rollback.h"
#include "common/unique_fd.h"
#include "image/layer_tree.h"
#include "node/snapshot/freeze.h"
#include "node/snapshot/snapshot_service.h"

namespace warren::node {

using image::CopyBudget;
using image::CopySolution;
using image::DiffCopyOptions;
using image::ListChanges;

namespace {

bool ValidInsidePath(const std::string& p) {
  if (p.empty() || p[0] != '/' || p.size() > 4096 || p.find('\0') != std::string::npos) return false;
  size_t i = 0;
  while (i < p.size()) {
    size_t j = p.find('/', i);
    if (j == std::string::npos) j = p.size();
    std::string c = p.substr(i, j - i);
    if (c == "..") return false;
    i = j + 1;
  }
  return true;
}

// The /etc/hosts the container backend writes into a new sandbox's upper
// when its image has none (SeedEtcHosts in runtime/container/rootfs.cc, same text):
// not a change of the agent's, so not reported as touched. Read through fds
// without following symlinks, regular files of at most 4 KiB only.
bool IsSeededEtcHosts(int upper_fd, const std::string& hostname) {
  UniqueFd etc(::openat(upper_fd, "etc", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!etc.valid()) return false;
  UniqueFd f(::openat(etc.get(), "hosts", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat st;
  if (!f.valid() || ::fstat(f.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > 4096) return false;
  std::string want = "# warren: generated for this sandbox\n127.0.0.1\tlocalhost\n";
  if (!hostname.empty()) want += "127.0.1.1\t" + hostname + "\n";
  want += "::1\tlocalhost ip6-localhost ip6-loopback\n";
  std::string got(static_cast<size_t>(st.st_size), '\0');
  return ::pread(f.get(), got.data(), got.size(), 0) == static_cast<ssize_t>(got.size()) && got == want;
}

StatusOr<std::vector<std::string>> NormalizePaths(const std::vector<std::string>& in, const char* field) {
  std::vector<std::string> out;
  for (const std::string& p : in) {
    if (!ValidInsidePath(p) || p == "/") {
      return absl::InvalidArgumentError(std::string(field) + " path " + Quote(p) +
                                        " must be absolute, not \"/\", without \"..\"");
    }
    std::string q;  // collapse "//" and "/./", drop a trailing "/"
    size_t i = 0;
    while (i < p.size()) {
      size_t j = p.find('/', i);
      if (j == std::string::npos) j = p.size();
      std::string c = p.substr(i, j - i);
      if (!c.empty() && c != ".") q += "/" + c;
      i = j + 1;
    }
    if (q.empty()) {
      return absl::InvalidArgumentError(std::string(field) + " path " + Quote(p) + " names \"/\"");
    }
    out.push_back(q);
  }
  return out;
}
}  // namespace

StatusOr<GradeResult> SnapshotService::Grade(const GradeRequest& req) {
  SandboxState state;
  ASSIGN_OR_RETURN(std::shared_ptr<Entry> e, table_.Live(req.id, &state));
  const bool paused = state != SandboxState::kRunning;
  if (req.solution.empty()) {
    return absl::InvalidArgumentError(
        "grade of sandbox " + req.id +
        ": solution is empty; name the paths where the task's solution lives (e.g. /w/repo/pkg): the "
        "agent's changes enter the grader only there");
  }
  ASSIGN_OR_RETURN(std::vector<std::string> solution, NormalizePaths(req.solution, "solution"));
  ASSIGN_OR_RETURN(std::vector<std::string> prot, NormalizePaths(req.protected_paths, "protected"));
  if (e->info.pristine_layers.empty()) {
    return absl::FailedPreconditionError(
        "grade of sandbox " + req.id +
        ": it has no pristine layers (its bottom layer was made by a sandbox, "
        "e.g. a snapshot), so there is no toolchain to grade with; create it on the layers the snapshotted "
        "sandbox was created from plus the snapshot layer (snapshot().layers)");
  }

  GradeResult res;
  const int64_t t0 = WallNowNs();
  const std::vector<std::string>& all = e->info.layer_digests;
  const std::vector<std::string>& pristine = e->info.pristine_layers;  // a prefix of `all`, never changes
  std::vector<std::unique_ptr<CopyBudget>> budget_store;               // outlives `rollback` (staging removed first)
  Rollback rollback;
  std::vector<UniqueFd> layer_fds;  // every layer of the sandbox, bottom first
  for (const std::string& d : all) {
    ASSIGN_OR_RETURN(std::string path, layers_.Acquire(d));
    rollback.Add([this, d] { layers_.Release(d); });
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd.valid()) return ErrnoToStatus(errno, "open(" + path + ")");
    layer_fds.push_back(std::move(fd));
  }
  std::vector<int> pristine_fds;
  for (size_t i = 0; i < pristine.size(); ++i) pristine_fds.push_back(layer_fds[i].get());
  ASSIGN_OR_RETURN(runtime::ChangeExporter * exporter, runtime::Require<runtime::ChangeExporter>(*e->sandbox));
  // The sandbox's own changes, walked in place (frozen meanwhile): only what
  // lies under the solution paths is copied, so whatever the agent left
  // elsewhere (a huge sparse file, a tree deeper than a layer holds) is
  // listed in `touched`, never copied.
  std::optional<FreezeGuard> freeze(std::in_place, e->sandbox.get(), !paused);
  ASSIGN_OR_RETURN(runtime::ChangeExporter::ChangeView view, exporter->OpenChanges());
  UniqueFd changes = std::move(view.dir);
  // The agent's diffs, bottom first: the layers a sandbox made, then its
  // exported changes.
  struct Diff {
    int fd;
    DiffCopyOptions options;
    std::string staging;
  };
  std::vector<Diff> diffs;
  for (size_t i = pristine.size(); i <= all.size(); ++i) {
    Diff d;
    d.fd = i < all.size() ? layer_fds[i].get() : changes.get();
    if (i == all.size()) {
      d.options.host_root_id = view.id_base;
      d.options.id_range = view.id_range;
    }
    budget_store.push_back(std::make_unique<CopyBudget>("sandbox " + req.id, CopyLimitBytes(e->info.resources),
                                                        &staging_used_, options_.max_staging_bytes));
    d.options.budget = budget_store.back().get();
    d.staging =
        options_.state_dir + "/tmp/grade-" + req.id + "-" + std::to_string(t0) + "-" + std::to_string(diffs.size());
    diffs.push_back(std::move(d));
  }
  std::vector<std::string> touched;
  for (Diff& d : diffs) {
    std::vector<std::string> t;
    const size_t room = GradeResult::kMaxTouched > touched.size() ? GradeResult::kMaxTouched - touched.size() : 0;
    Status ls = ListChanges(d.fd, solution, pristine_fds, d.options, room, &t, &res.touched_truncated);
    if (!ls.ok()) return Status(ls.code(), "grade of sandbox " + req.id + ": " + std::string(ls.message()));
    if (d.fd == changes.get() && IsSeededEtcHosts(d.fd, e->info.hostname)) {
      t.erase(std::remove(t.begin(), t.end(), "/etc/hosts"), t.end());
    }
    touched.insert(touched.end(), t.begin(), t.end());
    for (const std::string& p : prot) {
      if (image::DiffTouches(d.fd, p)) touched.push_back(p);
    }
    if (!res.rejected.empty()) continue;
    Status cs = CopySolution(d.fd, d.staging, solution, prot, pristine_fds, d.options);
    if (!cs.ok()) {
      const bool content = (cs.code() == absl::StatusCode::kResourceExhausted && !d.options.budget->node_cap_hit()) ||
                           cs.code() == absl::StatusCode::kFailedPrecondition;
      if (!content) return Status(cs.code(), "grade of sandbox " + req.id + ": " + std::string(cs.message()));
      res.rejected = std::string(cs.message());
      continue;
    }
    rollback.Add([staging = d.staging] { (void)RemoveTree(staging); });
  }
  changes.reset();
  freeze.reset();
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  if (touched.size() > GradeResult::kMaxTouched) {
    touched.resize(GradeResult::kMaxTouched);
    res.touched_truncated = true;
  }
  res.touched = std::move(touched);
  if (!res.rejected.empty()) {
    res.outcome.exit_code = 1;
    res.outcome.stderr_data = "warren: grade: the solution was not graded: " + res.rejected + "\n";
    res.outcome.stderr_total = res.outcome.stderr_data.size();
    Log(spdlog::level::info, "grade rejected", {{"sandbox", req.id}, {"reason", res.rejected}});
    return res;
  }
  CreateRequest cr = e->spec;
  cr.request_id.clear();  // the agent sandbox's create key: this is another create
  cr.layers = pristine;
  for (size_t i = 0; i < diffs.size(); ++i) {
    if (diffs[i].options.budget->used() == 0) {  // nothing under the solution paths
      (void)RemoveTree(diffs[i].staging);
      continue;
    }
    const std::string name = "workspace/grade-" + req.id + "@" + std::to_string(t0) + "." + std::to_string(i);
    StatusOr<image::LayerInfo> li = layers_.BuildFromSandboxDir(name, diffs[i].staging, req.project);
    (void)RemoveTree(diffs[i].staging);
    diffs[i].options.budget->ReleaseNode();
    if (!li.ok()) return li.status();
    rollback.Add([this, name] {
      Status s = table_.RemoveLayer(name);
      if (!s.ok()) Log(spdlog::level::warn, "removing grade layer failed", {{"layer", name}, {"error", s.ToString()}});
    });
    cr.layers.push_back(li->digest);
  }
  cr.labels["warren.grade-of"] = req.id;
  // The agent sandbox's create RPC is long gone: not its deadline, not its
  // cancellation probe (which refers to that call).
  cr.deadline = std::chrono::steady_clock::time_point::max();
  cr.cancelled = nullptr;
  cr.ttl_s = 0;
  cr.idle_timeout_s = 0;
  cr.job.clear();
  ASSIGN_OR_RETURN(SandboxInfo g, table_.Create(cr));
  res.grade_sandbox_id = g.id;
  StatusOr<runtime::ExecOutcome> out = [&]() -> StatusOr<runtime::ExecOutcome> {
    ASSIGN_OR_RETURN(std::shared_ptr<runtime::Sandbox> sb, table_.Use(g.id));
    return sb->Exec(req.grader);
  }();
  Status ds = table_.Destroy(g.id, "grade finished");
  if (!ds.ok())
    Log(spdlog::level::warn, "destroying grade sandbox failed", {{"sandbox", g.id}, {"error", ds.ToString()}});
  if (!out.ok()) return out.status();
  res.outcome = std::move(*out);
  Log(spdlog::level::info, "graded",
      {{"sandbox", req.id},
       {"exit", std::to_string(res.outcome.exit_code)},
       {"touched", std::to_string(res.touched.size())},
       {"ms", std::to_string((WallNowNs() - t0) / 1000000)}});
  return res;
}

}  // namespace warren::node
