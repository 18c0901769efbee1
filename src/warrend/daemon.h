// warrend's life: host setup, the sandbox manager over the container
// backend, the fncall pool with its gRPC service and optional /run_code
// server, the gRPC server; then serving until SIGTERM/SIGINT, and an orderly
// stop that leaves sandboxes running for the next daemon on the state dir.
#pragma once

#include "warrend/flags.h"

namespace warren::warrend {

// Runs the daemon with `flags` (logging already set up). Returns the exit
// code: 0 after a signalled shutdown, 1 when it cannot start (logged).
int Run(const Flags& flags);

}  // namespace warren::warrend
