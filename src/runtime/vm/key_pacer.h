// Keys typed into a VM are paced to what the guest can take, so that none
// is dropped on the way to the application.
//
// Two queues drop keys when the guest falls behind. QEMU's PS/2 keyboard
// (hw/input/ps2.c, PS2_QUEUE_SIZE) queues at most 16 bytes of scancodes and
// silently drops what comes while they are unread: a guest descheduled on a
// loaded host (TCG) for longer than those bytes take to send loses keys. A
// Linux guest counts one i8042 interrupt (IRQ 1) per byte it reads from
// that queue (/proc/interrupts, read through the guest agent; measured
// here: 16 interrupts for 8 plain characters, 32 for 8 shifted ones): the
// pacer sends a batch only while the bytes sent and not yet read, plus the
// batch's, fit the queue (a batch larger than the queue goes alone). Then
// the guest kernel's evdev buffer of the X server (64 events, about 10
// characters) drops what the X server has not read when the guest took the
// bytes faster than the X server runs: measured here, a line released all at
// once after the guest stalled lost its last 20 characters. So batches are
// also at least `gap` apart, at any pace the kernel takes them: a stall of
// the X server of about 10 gaps loses nothing. A guest without the count
// (not Linux, no agent) is paced by the gap alone and can lose keys when
// its vCPU stalls.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/vm/input.h"

namespace warren::runtime::vm {

class KeyPacer {
 public:
  // The guest's i8042 keyboard interrupts so far (I8042KeyboardInterrupts);
  // an error means the guest gives no count.
  using ReadCount = std::function<StatusOr<uint64_t>()>;
  // Sends one batch (QMP input-send-event).
  using SendBatch = std::function<Status(const std::string& events)>;

  static constexpr uint32_t kQueueBytes = 16;  // QEMU's PS2_QUEUE_SIZE

  struct Timing {
    // At least this between two batches (characters), also across calls.
    std::chrono::milliseconds gap{20};
    // The guest reading no byte for this long fails the call: Unavailable,
    // naming how many bytes wait (a hung or crashed guest).
    std::chrono::milliseconds stall{30000};
    // Between reads of the count while the queue is full.
    std::chrono::milliseconds poll{5};
  };
  KeyPacer() = default;
  explicit KeyPacer(Timing timing) : timing_(timing) {}

  // Sends every batch in order, paced. Not thread-safe: the caller
  // serializes (one typing at a time per VM).
  Status Send(const std::vector<KeyBatch>& batches, const ReadCount& read, const SendBatch& send);
  // Forgets what is in flight and whether the guest counts (a restored,
  // cloned or rebooted guest): the next Send reads the count afresh.
  void Reset();

  // Counters for tests and logs: reads of the count, and the batches that
  // waited for the guest.
  uint64_t reads() const { return reads_; }
  uint64_t waits() const { return waits_; }

 private:
  Timing timing_;
  bool probed_ = false;    // the count was read once since the last Reset
  bool counting_ = false;  // the guest gives a count
  uint64_t base_ = 0;      // the count when sent_ was last 0
  uint64_t sent_ = 0;      // bytes sent since base_
  uint64_t taken_ = 0;     // bytes of those the guest read, as last read
  uint64_t reads_ = 0, waits_ = 0;
  std::chrono::steady_clock::time_point last_send_{};
};

}  // namespace warren::runtime::vm
