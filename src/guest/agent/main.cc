// warren-agent: PID 1 of a microvm sandbox's guest (boot.h, agent.h), or,
// with --service, a service of a full guest system (the vm backend: its
// init mounted the root and cgroup2 already; the agent only serves).
#include <sys/reboot.h>
#include <unistd.h>

#include <string>

#include "guest/agent/agent.h"
#include "guest/agent/boot.h"
#include "guest/agent/net.h"

int main(int argc, char** argv) {
  using namespace warren::guest;
  if (argc == 2 && std::string(argv[1]) == "--service") {
    std::string port = FindPort("warren.agent");
    if (port.empty()) {
      LogLine("no virtio-serial port named warren.agent");
      return 1;  // the service manager restarts it
    }
    // Snapshots and forks export the changes (the upper dir of the root);
    // memory overcommitted as in a microVM.
    if (std::string err = ServiceSetup(); !err.empty()) LogLine("service setup: " + err);
    Serve(port, "", /*root_pending=*/false);
  }
  if (::getpid() != 1) {
    LogLine("must run as PID 1 of the guest");
    return 2;
  }
  bool template_boot = false;
  std::string err = EarlySetup(&template_boot);
  std::string port = err.empty() ? FindPort("warren.agent") : "";
  if (err.empty() && port.empty()) err = "no virtio-serial port named warren.agent";
  if (port.empty()) {
    // Nothing to report to: say it on the console and power off (the host
    // sees QEMU exit and reads the console log).
    LogLine(err);
    ::reboot(RB_POWER_OFF);
    return 1;
  }
  // A server on the guest's loopback works as in a container (a template's
  // clones inherit it up). Not fatal: only loopback servers need it.
  if (std::string lo = LoopbackUp(); !lo.empty()) LogLine("loopback: " + lo);
  // A template's root is set up by its clones, after their restore.
  if (err.empty() && template_boot) err = PrepareTemplate();
  if (err.empty() && !template_boot) err = SetUpRoot(CmdlineRootParams());
  if (!err.empty()) LogLine("setup failed: " + err);
  Serve(port, err, /*root_pending=*/err.empty() && template_boot);
}
