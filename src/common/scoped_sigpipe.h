// ScopedSigpipeBlock: blocks SIGPIPE in the calling thread for a scope, so
// that writing to a pipe whose reader is gone fails with EPIPE instead of
// killing the daemon; on exit, a SIGPIPE left pending by such a write is
// discarded (bounded: at most 64) and the previous mask restored.
#pragma once

#include <pthread.h>
#include <signal.h>
#include <time.h>

namespace warren {

class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &s, &old_);
  }
  ~ScopedSigpipeBlock() {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    timespec zero{0, 0};
    for (int i = 0; i < 64 && sigtimedwait(&s, nullptr, &zero) > 0; ++i) {
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t old_;
};

}  // namespace warren
