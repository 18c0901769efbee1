#include "runtime/vm/key_pacer.h"

#include <algorithm>
#include <thread>

#include "common/log.h"

namespace warren::runtime::vm {

void KeyPacer::Reset() {
  probed_ = false;
  counting_ = false;
  base_ = sent_ = taken_ = 0;
}

Status KeyPacer::Send(const std::vector<KeyBatch>& batches, const ReadCount& read, const SendBatch& send) {
  using Clock = std::chrono::steady_clock;
  if (!probed_) {
    probed_ = true;
    ++reads_;
    StatusOr<uint64_t> c = read();
    counting_ = c.ok();
    if (counting_) {
      base_ = *c;
      sent_ = taken_ = 0;
    } else {
      Log(spdlog::level::info, "keys paced by a fixed gap: the guest gives no keyboard interrupt count",
          {{"reason", c.status().ToString()}});
    }
  }
  for (size_t i = 0; i < batches.size(); ++i) {
    const KeyBatch& b = batches[i];
    std::this_thread::sleep_until(last_send_ + timing_.gap);
    if (counting_ && sent_ > taken_ && sent_ - taken_ + b.scancode_bytes > kQueueBytes) {
      ++waits_;
      Clock::time_point progress = Clock::now();
      while (counting_ && sent_ > taken_ && sent_ - taken_ + b.scancode_bytes > kQueueBytes) {
        ++reads_;
        StatusOr<uint64_t> c = read();
        if (!c.ok()) {  // the agent stopped answering: the gap alone until the next Reset
          Log(spdlog::level::warn, "keys paced by a fixed gap: the guest's keyboard interrupt count failed",
              {{"reason", c.status().ToString()}});
          counting_ = false;
          break;
        }
        if (*c < base_) {  // the guest rebooted: its queue started empty
          base_ = *c;
          sent_ = taken_ = 0;
          break;
        }
        if (*c - base_ > taken_) {
          taken_ = *c - base_;
          progress = Clock::now();
        }
        if (taken_ >= sent_) {  // all read (more interrupts: the keyboard's own replies)
          base_ = *c;
          sent_ = taken_ = 0;
          break;
        }
        if (Clock::now() - progress > timing_.stall) {
          return absl::UnavailableError(
              "the guest read no key from its keyboard for " + std::to_string(timing_.stall.count()) + " ms (" +
              std::to_string(sent_ - taken_) + " scancode bytes wait in its queue): is it hung?");
        }
        std::this_thread::sleep_for(timing_.poll);
      }
    }
    RETURN_IF_ERROR(send(b.events));
    last_send_ = Clock::now();
    // QEMU drops what does not fit: a larger batch leaves the queue full.
    sent_ += std::min<uint64_t>(b.scancode_bytes, kQueueBytes - std::min<uint64_t>(kQueueBytes, sent_ - taken_));
  }
  return absl::OkStatus();
}

}  // namespace warren::runtime::vm
