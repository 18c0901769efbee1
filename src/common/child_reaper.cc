#include "common/child_reaper.h"

#include <poll.h>
#include <sys/wait.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

namespace warren {

bool TryReapPidfd(int pidfd) {
  siginfo_t info;
  memset(&info, 0, sizeof info);
  if (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info, WEXITED | WNOHANG) != 0)
    return false;  // ECHILD: not our child, or reaped by its owner already
  return info.si_pid != 0;
}

struct ChildReaper::State {
  mutable std::mutex mu;
  std::condition_variable cv;
  std::vector<UniqueFd> fds;  // guarded by mu
  bool started = false;       // guarded by mu

  // Polls every pidfd (a pidfd is readable once its process exited), reaps
  // the exited ones, drops those that are not ours. Sleeps while empty; polls
  // at most 200 ms at a time so that newly adopted fds are picked up.
  void Loop() {
    for (;;) {
      std::vector<int> watch;
      {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return !fds.empty(); });
        for (const UniqueFd& f : fds) watch.push_back(f.get());
      }
      std::vector<pollfd> pfds;
      pfds.reserve(watch.size());
      for (int fd : watch) pfds.push_back({fd, POLLIN, 0});
      (void)::poll(pfds.data(), pfds.size(), 200);
      std::vector<int> done;
      for (const pollfd& p : pfds) {
        if (p.revents == 0) continue;
        siginfo_t info;
        memset(&info, 0, sizeof info);
        const int r = ::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(p.fd), &info, WEXITED | WNOHANG);
        if (r != 0 || info.si_pid != 0) done.push_back(p.fd);  // reaped, or not ours (ECHILD)
      }
      if (done.empty()) continue;
      std::lock_guard<std::mutex> l(mu);
      for (auto it = fds.begin(); it != fds.end();) {
        bool gone = false;
        for (int d : done) gone = gone || it->get() == d;
        it = gone ? fds.erase(it) : it + 1;
      }
    }
  }
};

ChildReaper& ChildReaper::Get() {
  static ChildReaper* r = new ChildReaper();  // never destroyed: its thread runs until exit
  return *r;
}

ChildReaper::State& ChildReaper::state() const {
  static State* s = new State();
  return *s;
}

void ChildReaper::Adopt(UniqueFd pidfd) {
  if (!pidfd.valid()) return;
  if (TryReapPidfd(pidfd.get())) return;
  State& s = state();
  {
    std::lock_guard<std::mutex> l(s.mu);
    s.fds.push_back(std::move(pidfd));
    if (!s.started) {
      s.started = true;
      std::thread([&s] { s.Loop(); }).detach();
    }
  }
  s.cv.notify_all();
}

size_t ChildReaper::pending() const {
  State& s = state();
  std::lock_guard<std::mutex> l(s.mu);
  return s.fds.size();
}

}  // namespace warren
