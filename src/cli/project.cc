// warren project create PATH [--sandboxes N] [--cpu-millis N] [--memory-mb N]
//   [--creates-per-second R [--create-burst N]] | update PATH [the same quota flags]
// | ls | get PATH | rm PATH: the cluster's projects (README "Projects and
// quotas"). FAILED_PRECONDITION from a node that is not in a cluster.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/client.h"
#include "cli/commands.h"
#include "cli/output.h"
#include "common/time.h"
#include "warren/v1/project.grpc.pb.h"

namespace warren::cli {
namespace {

nlohmann::json ProjectToJson(const v1::Project& p) {
  return {{"path", p.path()},
          {"quota",
           {{"sandboxes", p.quota().sandboxes()},
            {"cpu_millis", p.quota().cpu_millis()},
            {"memory_mb", p.quota().memory_mb()},
            {"creates_per_second", p.quota().creates_per_second()},
            {"create_burst", p.quota().create_burst()}}},
          {"usage",
           {{"sandboxes", p.usage().sandboxes()},
            {"cpu_millis", p.usage().cpu_millis()},
            {"memory_mb", p.usage().memory_mb()}}},
          {"created_ns", p.created_ns()}};
}

// "used/quota", "used" when there is no limit of its own.
std::string OfQuota(uint64_t used, uint64_t quota) {
  return quota == 0 ? absl::StrCat(used) : absl::StrCat(used, "/", quota);
}

// The quota the flags of create/update name.
v1::ProjectQuota QuotaOf(const ProjectArgs& a) {
  v1::ProjectQuota q;
  q.set_sandboxes(a.sandboxes);
  q.set_cpu_millis(a.cpu_millis);
  q.set_memory_mb(a.memory_mb);
  q.set_creates_per_second(a.creates_per_second);
  q.set_create_burst(a.create_burst);
  return q;
}

int RunProject(Invocation& inv, const std::string& action) {
  Client client(inv.global);
  std::unique_ptr<v1::Projects::Stub> stub = v1::Projects::NewStub(client.channel());
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  const ProjectArgs& a = inv.project;
  std::vector<v1::Project> projects;
  grpc::Status gs;
  if (action == "create") {
    v1::CreateProjectRequest req;
    req.set_path(a.path);
    *req.mutable_quota() = QuotaOf(a);
    v1::CreateProjectResponse resp;
    gs = stub->Create(&ctx, req, &resp);
    if (Status st = FromGrpc(gs); !st.ok()) {
      PrintError(st);
      return kExitError;
    }
    if (inv.global.json) {
      PrintJson({{"project", ProjectToJson(resp.project())}, {"token", resp.token()}});
    } else {
      std::cout << "project " << resp.project().path() << " created; its token (shown only now):\n"
                << resp.token() << "\n";
    }
    return kExitOk;
  }
  if (action == "update") {
    v1::UpdateProjectRequest req;
    req.set_path(a.path);
    *req.mutable_quota() = QuotaOf(a);
    v1::Project p;
    gs = stub->Update(&ctx, req, &p);
    if (Status st = FromGrpc(gs); !st.ok()) {
      PrintError(st);
      return kExitError;
    }
    projects.push_back(p);
  } else if (action == "rm") {
    v1::DeleteProjectRequest req;
    req.set_path(a.path);
    v1::DeleteProjectResponse resp;
    gs = stub->Delete(&ctx, req, &resp);
    if (Status st = FromGrpc(gs); !st.ok()) {
      PrintError(st);
      return kExitError;
    }
    if (inv.global.json) PrintJson({{"path", a.path}, {"deleted", true}});
    return kExitOk;
  }
  if (action == "get") {
    v1::GetProjectRequest req;
    req.set_path(a.path);
    v1::Project p;
    gs = stub->Get(&ctx, req, &p);
    projects.push_back(p);
  } else if (action == "ls") {
    v1::ListProjectsResponse resp;
    gs = stub->List(&ctx, v1::ListProjectsRequest(), &resp);
    projects.assign(resp.projects().begin(), resp.projects().end());
  }
  if (Status st = FromGrpc(gs); !st.ok()) {
    PrintError(st);
    return kExitError;
  }
  if (inv.global.json) {
    if (action != "ls") {
      PrintJson(ProjectToJson(projects.at(0)));
    } else {
      nlohmann::json all = nlohmann::json::array();
      for (const v1::Project& p : projects) all.push_back(ProjectToJson(p));
      PrintJson(all);
    }
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {
      {"PROJECT", "SANDBOXES", "MILLICPUS", "MEMORY_MB", "CREATES/S", "CREATED"}};
  for (const v1::Project& p : projects) {
    rows.push_back({p.path(), OfQuota(p.usage().sandboxes(), p.quota().sandboxes()),
                    OfQuota(p.usage().cpu_millis(), p.quota().cpu_millis()),
                    OfQuota(p.usage().memory_mb(), p.quota().memory_mb()),
                    p.quota().creates_per_second() > 0 ? absl::StrCat(p.quota().creates_per_second()) : "-",
                    FormatAge(p.created_ns(), WallNowNs())});
  }
  PrintTable(std::cout, rows);
  return kExitOk;
}

}  // namespace

void AddProjectCommands(CLI::App& root, Invocation& inv) {
  CLI::App* project = root.add_subcommand(
      "project", "Cluster projects: nested (team/run-7/eval), each with a token and cluster-wide quotas.");
  project->require_subcommand(1);
  CLI::App* create = project->add_subcommand("create", "Create a project (its parent must exist); prints its token.");
  create->fallthrough();
  create->add_option("path", inv.project.path, "project path, e.g. team/run-7")->required();
  auto quota_options = [&inv](CLI::App* c) {
    c->add_option("--sandboxes", inv.project.sandboxes, "quota: sandboxes at once (0 = no limit of its own)");
    c->add_option("--cpu-millis", inv.project.cpu_millis, "quota: millicpus asked for at once (0 = none)");
    c->add_option("--memory-mb", inv.project.memory_mb, "quota: MiB of memory asked for at once (0 = none)");
    c->add_option("--creates-per-second", inv.project.creates_per_second,
                  "quota: creates admitted per second, cluster-wide (GCRA; 0 = none)");
    c->add_option("--create-burst", inv.project.create_burst,
                  "quota: creates at once before the rate applies (0 = max(1, the rate))");
  };
  quota_options(create);
  create->callback([&inv] {
    inv.verb = "project create";
    inv.run = [](Invocation& i) { return RunProject(i, "create"); };
  });
  CLI::App* update = project->add_subcommand(
      "update", "Replace a project's quota as a whole (flags left out are no limit of its own).");
  update->fallthrough();
  update->add_option("path", inv.project.path, "project path")->required();
  quota_options(update);
  update->callback([&inv] {
    inv.verb = "project update";
    inv.run = [](Invocation& i) { return RunProject(i, "update"); };
  });
  CLI::App* ls = project->add_subcommand("ls", "List the projects this caller may see, with usage/quota.");
  ls->fallthrough();
  ls->callback([&inv] {
    inv.verb = "project ls";
    inv.run = [](Invocation& i) { return RunProject(i, "ls"); };
  });
  CLI::App* get = project->add_subcommand("get", "Show one project with its usage.");
  get->fallthrough();
  get->add_option("path", inv.project.path, "project path")->required();
  get->callback([&inv] {
    inv.verb = "project get";
    inv.run = [](Invocation& i) { return RunProject(i, "get"); };
  });
  CLI::App* rm = project->add_subcommand("rm", "Delete a project (none below it); its token stops working.");
  rm->fallthrough();
  rm->add_option("path", inv.project.path, "project path")->required();
  rm->callback([&inv] {
    inv.verb = "project rm";
    inv.run = [](Invocation& i) { return RunProject(i, "rm"); };
  });
}

}  // namespace warren::cli
