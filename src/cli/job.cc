// warren job ls | show NAME | heartbeat NAME [--lease S] [--grace S] |
// suspend NAME | resume NAME | rm NAME: jobs (sandboxes created with --job)
// and their leases.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/client.h"
#include "cli/commands.h"
#include "cli/output.h"

namespace warren::cli {
namespace {

nlohmann::json JobToJson(const v1::Job& j) {
  return {{"name", j.name()},          {"lease_s", j.lease_s()},
          {"grace_s", j.grace_s()},    {"lease_expires_at_ns", j.lease_expires_at_ns()},
          {"lapsed", j.lapsed()},      {"lapsed_at_ns", j.lapsed_at_ns()},
          {"sandboxes", j.sandboxes()}};
}

std::vector<std::string> JobRow(const v1::Job& j) {
  std::string lease = j.lease_s() == 0 ? "-" : absl::StrCat(j.lease_s(), "s");
  std::string left = "-";
  if (j.lease_s() > 0 && !j.lapsed())
    left = absl::StrCat(std::max<int64_t>(0, (j.lease_expires_at_ns() - WallNowNs()) / 1000000000), "s");
  return {j.name(), absl::StrCat(j.sandboxes()), lease, absl::StrCat(j.grace_s(), "s"), j.lapsed() ? "lapsed" : "ok",
          left};
}

int PrintJobs(Invocation& inv, const std::vector<v1::Job>& jobs, bool one) {
  if (inv.global.json) {
    if (one) {
      PrintJson(JobToJson(jobs.at(0)));
    } else {
      nlohmann::json all = nlohmann::json::array();
      for (const v1::Job& j : jobs) all.push_back(JobToJson(j));
      PrintJson(all);
    }
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {{"JOB", "SANDBOXES", "LEASE", "GRACE", "STATE", "EXPIRES_IN"}};
  for (const v1::Job& j : jobs) rows.push_back(JobRow(j));
  PrintTable(std::cout, rows);
  return kExitOk;
}

int RunJob(Invocation& inv, const std::string& action) {
  Client client(inv.global);
  v1::Lifecycle::Stub stub(client.channel());
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::JobRequest jr;
  jr.set_job(inv.rl.name);
  grpc::Status gs;
  if (action == "ls") {
    v1::ListJobsResponse resp;
    gs = stub.ListJobs(&ctx, v1::ListJobsRequest(), &resp);
    if (Status st = FromGrpc(gs); !st.ok()) {
      PrintError(st);
      return kExitError;
    }
    return PrintJobs(inv, std::vector<v1::Job>(resp.jobs().begin(), resp.jobs().end()), false);
  }
  if (action == "show" || action == "heartbeat") {
    v1::Job job;
    if (action == "show") {
      gs = stub.GetJob(&ctx, jr, &job);
    } else {
      v1::JobHeartbeatRequest hr;
      hr.set_job(inv.rl.name);
      hr.set_lease_s(inv.rl.lease_s);
      hr.set_grace_s(inv.rl.grace_s);
      gs = stub.JobHeartbeat(&ctx, hr, &job);
    }
    if (Status st = FromGrpc(gs); !st.ok()) {
      PrintError(st);
      return kExitError;
    }
    return PrintJobs(inv, {job}, true);
  }
  v1::JobActionResponse resp;
  if (action == "suspend") {
    gs = stub.SuspendJob(&ctx, jr, &resp);
  } else if (action == "resume") {
    gs = stub.ResumeJob(&ctx, jr, &resp);
  } else {
    gs = stub.DestroyJob(&ctx, jr, &resp);
  }
  if (Status st = FromGrpc(gs); !st.ok()) {
    PrintError(st);
    return kExitError;
  }
  if (inv.global.json) {
    PrintJson({{"job", inv.rl.name}, {"action", action}, {"affected", resp.affected()}});
  } else {
    std::cout << resp.affected() << std::endl;
  }
  return kExitOk;
}

}  // namespace

void AddJobCommand(CLI::App& root, Invocation& inv) {
  CLI::App* job = root.add_subcommand("job", "Jobs: groups of sandboxes (create --job) with a lease.");
  job->fallthrough();
  job->require_subcommand(1);
  CLI::App* ls = job->add_subcommand("ls", "List jobs.");
  ls->fallthrough();
  ls->callback([&inv] {
    inv.verb = "job ls";
    inv.run = [](Invocation& i) { return RunJob(i, "ls"); };
  });
  struct Verb {
    const char* name;
    const char* help;
  };
  for (const Verb& v :
       {Verb{"show", "Show a job's lease and sandbox count."}, Verb{"heartbeat", "Renew (or start) a job's lease."},
        Verb{"suspend", "Suspend every running or paused sandbox of a job; prints how many."},
        Verb{"resume", "Resume every paused or suspended sandbox of a job; prints how many."},
        Verb{"rm", "Destroy every sandbox of a job and forget its lease; prints how many."}}) {
    CLI::App* sub = job->add_subcommand(v.name, v.help);
    sub->fallthrough();
    sub->add_option("name", inv.rl.name, "job name")->required();
    if (std::string(v.name) == "heartbeat") {
      sub->add_option("--lease", inv.rl.lease_s, "lease seconds (0 = keep; default 60)");
      sub->add_option("--grace", inv.rl.grace_s, "seconds after a lapse before destroy (0 = keep; default 300)");
    }
    std::string action = v.name;
    sub->callback([&inv, action] {
      inv.verb = "job " + action;
      inv.run = [action](Invocation& i) { return RunJob(i, action); };
    });
  }
}

}  // namespace warren::cli
