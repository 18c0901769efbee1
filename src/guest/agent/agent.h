// The guest agent's service loop (after boot.h's setup): one thread, one
// poll(2) over the host channel, the pipes of every running command and a
// signalfd for SIGCHLD. As PID 1 it reaps every orphan of the guest.
//
// Commands (kExec, runtime/microvm/protocol.h): each runs in its own cgroup
// (/sys/fs/cgroup/warren/exec-<id>, cgroup v2) and a new session, so a
// timeout reaches the whole tree, setsid'ed and double-forked descendants
// included: SIGTERM to every process of the cgroup, then cgroup.kill after
// kill_grace; the result is sent once the foreground process was reaped and
// (after a timeout) the cgroup is empty. Output is forwarded as it comes, up
// to output_cap bytes per stream (the rest is counted and dropped); what the
// background leaves after the foreground exited is not read. oom_killed: the
// cgroup's memory.events counted an OOM kill (the guest's RAM is the limit).
//
// The channel: while the host end is not connected (the daemon restarts)
// the port reads EOF and polls HUP; the agent then sleeps 20 ms per round
// and drops what it would send (results of commands the old daemon asked
// for). A new connection starts with kHello.
#pragma once

#include <string>

namespace warren::guest {

// Serves the port at `port_path` forever. `setup_error` (non-empty: the root
// could not be set up) is reported in every kHelloReply and every exec fails.
// `root_pending`: a template boot; the root is set up by the first hello
// with setup_root (protocol.h), execs fail until then.
[[noreturn]] void Serve(const std::string& port_path, const std::string& setup_error, bool root_pending);

}  // namespace warren::guest
