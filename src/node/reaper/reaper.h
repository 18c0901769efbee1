// The reaper: a thread that every reap_interval destroys sandboxes whose TTL
// or idle timeout expired (with the reason recorded) and lets jobs act on
// lapsed leases, and a thread that every sweep_interval sweeps unused layer
// mounts. Stopped (joined) on destruction; sandboxes keep running.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "node/jobs/jobs.h"
#include "node/layer_provider.h"
#include "node/table/sandbox_table.h"

namespace warren::node {

class Reaper {
 public:
  // Borrows everything. An interval of 0 starts no thread.
  Reaper(SandboxTable& table, Jobs& jobs, LayerProvider& layers, std::chrono::milliseconds reap_interval,
         std::chrono::milliseconds sweep_interval);
  ~Reaper();
  void Start();
  // One pass: jobs' leases, then TTL/idle; returns the ids destroyed for
  // TTL/idle.
  std::vector<std::string> ReapOnce();

 private:
  void Loop(std::chrono::milliseconds interval, void (Reaper::*pass)());
  void Reap() { (void)ReapOnce(); }
  void Sweep() { layers_.Sweep(); }

  SandboxTable& table_;
  Jobs& jobs_;
  LayerProvider& layers_;
  const std::chrono::milliseconds reap_interval_, sweep_interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
  std::thread reap_thread_, sweep_thread_;
};

}  // namespace warren::node
