// The `container` backend: Linux namespaces (user, mnt, pid, uts, ipc, net,
// cgroup) + cgroups (v1 or v2, nested under the daemon's own cgroup) +
// seccomp + dropped capabilities + no_new_privs, over an overlayfs whose
// lowerdirs are the shared read-only EROFS layer mounts and whose upper is
// private to the sandbox. PID 1 is warren-init (src/init), a tiny static
// reaper. Exec goes from the daemon into the sandbox (setns + fork); there is
// no control socket inside the sandbox.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/backend.h"

namespace warren::runtime {

struct ContainerOptions {
  // Path of the static warren-init binary (bind-mounted read-only into
  // each sandbox as its PID 1).
  std::string init_path;
  // Sandboxes' cgroups are created under <the daemon's own cgroup>/<cgroup_name>/<id>
  // in every hierarchy used (v1) or in the unified one (v2).
  std::string cgroup_name = "warren";
  // Root inside each sandbox maps to host uid/gid uid_base + k*uid_range for
  // the k-th slot; slots are recorded and re-taken by Adopt.
  uint32_t uid_base = 1000000;
  uint32_t uid_range = 65536;
  uint32_t max_sandboxes = 16384;
  // Seccomp profile (JSON, see src/jail/seccomp/default.json); empty = the
  // profile compiled into the binary.
  std::string seccomp_profile;
};

// What the host kernel offers, probed once (kernel feature probing, not
// assumptions). Reported by the node status RPC.
struct HostFeatures {
  int cgroup_version = 0;        // 1 or 2
  std::string cgroup_parent;     // e.g. "/process_api/abc/warren" (v1: per controller same relative path)
  bool idmapped_mounts = false;  // mount_setattr(MOUNT_ATTR_IDMAP) works on EROFS/tmpfs
  bool user_namespaces = false;
};

StatusOr<std::unique_ptr<Backend>> NewContainerBackend(const ContainerOptions& options);
HostFeatures ProbeHostFeatures();

}  // namespace warren::runtime
