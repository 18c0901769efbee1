#include "runtime/vm/key_pacer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <deque>

#include "runtime/vm/input.h"

namespace warren::runtime::vm {
namespace {

using std::chrono::milliseconds;

// QEMU's PS/2 keyboard queue as hw/input/ps2.c keeps it: at most 16 bytes,
// what comes while it is full is dropped. The guest reads `drain` bytes
// each time the pacer looks (after `stall_reads` looks in which it reads
// none), one interrupt per byte read.
struct FakeGuest {
  std::deque<int> queue;  // the batch index of each queued byte
  std::vector<int> read_bytes;
  uint64_t irqs = 1000;  // the count is not 0 at boot
  int dropped = 0, stall_reads = 0, drain = 2;

  Status Send(const std::string& events) {
    // A test batch's events are "index:bytes".
    const int index = std::stoi(events.substr(0, events.find(':')));
    const int bytes = std::stoi(events.substr(events.find(':') + 1));
    for (int i = 0; i < bytes; ++i) {
      if (queue.size() >= KeyPacer::kQueueBytes) {
        ++dropped;
      } else {
        queue.push_back(index);
      }
    }
    return absl::OkStatus();
  }
  StatusOr<uint64_t> Read() {
    if (stall_reads > 0) {
      --stall_reads;
      return irqs;
    }
    for (int i = 0; i < drain && !queue.empty(); ++i) {
      read_bytes.push_back(queue.front());
      queue.pop_front();
      ++irqs;
    }
    return irqs;
  }
};

std::vector<KeyBatch> Batches(int n, uint32_t bytes) {
  std::vector<KeyBatch> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i) out.push_back({std::to_string(i) + ":" + std::to_string(bytes), bytes});
  return out;
}

KeyPacer::Timing Fast() {
  KeyPacer::Timing t;
  t.gap = milliseconds(0);
  t.poll = milliseconds(0);
  t.stall = milliseconds(2000);
  return t;
}

TEST(KeyPacer, TheQueueNeverOverflowsWhileTheGuestStalls) {
  FakeGuest g;
  g.stall_reads = 50;  // descheduled for a while, then slow
  KeyPacer p(Fast());
  Status s = p.Send(
      Batches(100, 4), [&] { return g.Read(); }, [&](const std::string& e) { return g.Send(e); });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(g.dropped, 0);
  while (!g.queue.empty()) (void)g.Read();
  ASSERT_EQ(g.read_bytes.size(), 400u);
  for (size_t i = 0; i < g.read_bytes.size(); ++i) ASSERT_EQ(g.read_bytes[i], static_cast<int>(i / 4)) << i;
  EXPECT_GT(p.waits(), 0u);
}

TEST(KeyPacer, TheFakeDropsWhatAnUnpacedSenderSends) {
  // What the pacer guards against: the same keys sent as fast as they
  // come lose all but the queue's 16 bytes while the guest reads none.
  FakeGuest g;
  for (const KeyBatch& b : Batches(100, 4)) ASSERT_TRUE(g.Send(b.events).ok());
  EXPECT_EQ(g.dropped, 400 - static_cast<int>(KeyPacer::kQueueBytes));
}

TEST(KeyPacer, ABatchLargerThanTheQueueGoesAloneOnAnEmptyQueue) {
  FakeGuest g;
  g.drain = 100;
  KeyPacer p(Fast());
  std::vector<KeyBatch> b = {{"0:2", 2}, {"1:20", 20}, {"2:2", 2}};
  ASSERT_TRUE(p.Send(
                   b, [&] { return g.Read(); }, [&](const std::string& e) { return g.Send(e); })
                  .ok());
  EXPECT_EQ(g.dropped, 4);  // what QEMU drops of it: nothing the pacer can do
  // The pacer counts what the queue could take, not what was dropped: the
  // batches after it are not held back by 4 bytes that never came.
  std::vector<KeyBatch> more = Batches(40, 2);
  g.drain = 2;
  ASSERT_TRUE(p.Send(
                   more, [&] { return g.Read(); }, [&](const std::string& e) { return g.Send(e); })
                  .ok());
  EXPECT_EQ(g.dropped, 4);
  EXPECT_EQ(g.queue.size(), 16u);  // sent while 14 bytes were in flight: as full as it can be
}

TEST(KeyPacer, AGuestWithoutACountIsPacedByTheGapAndAskedOnce) {
  FakeGuest g;
  KeyPacer p(Fast());
  int reads = 0;
  auto none = [&]() -> StatusOr<uint64_t> {
    ++reads;
    return absl::NotFoundError("no i8042");
  };
  auto send = [&](const std::string& e) { return g.Send(e); };
  ASSERT_TRUE(p.Send(Batches(3, 2), none, send).ok());
  ASSERT_TRUE(p.Send(Batches(3, 2), none, send).ok());
  EXPECT_EQ(reads, 1);
  p.Reset();
  ASSERT_TRUE(p.Send(Batches(1, 2), none, send).ok());
  EXPECT_EQ(reads, 2);
}

TEST(KeyPacer, ACountThatFailsMidwayLeavesTheGapAlone) {
  FakeGuest g;
  g.drain = 100;
  KeyPacer p(Fast());
  int reads = 0;
  auto flaky = [&]() -> StatusOr<uint64_t> {
    if (++reads > 1) return absl::UnavailableError("agent gone");
    return g.Read();
  };
  std::vector<std::string> sent;
  auto send = [&](const std::string& e) {
    sent.push_back(e);
    return absl::OkStatus();
  };
  ASSERT_TRUE(p.Send(Batches(20, 4), flaky, send).ok());
  EXPECT_EQ(sent.size(), 20u);
  EXPECT_EQ(reads, 2);  // the probe, then the one that failed
}

TEST(KeyPacer, AGuestThatReadsNothingFailsTheCallNamingWhatWaits) {
  FakeGuest g;
  g.stall_reads = 1 << 30;
  KeyPacer::Timing t = Fast();
  t.stall = milliseconds(50);
  KeyPacer p(t);
  Status s = p.Send(
      Batches(10, 4), [&] { return g.Read(); }, [&](const std::string& e) { return g.Send(e); });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), testing::HasSubstr("16 scancode bytes wait"));
  EXPECT_EQ(g.dropped, 0);
}

TEST(KeyPacer, ARebootedGuestOrTheKeyboardsOwnRepliesResetTheCount) {
  FakeGuest g;
  g.drain = 100;
  KeyPacer p(Fast());
  auto read = [&] { return g.Read(); };
  auto send = [&](const std::string& e) { return g.Send(e); };
  ASSERT_TRUE(p.Send(Batches(8, 2), read, send).ok());
  g.irqs += 5;  // replies to LED commands: interrupts no typed byte caused
  ASSERT_TRUE(p.Send(Batches(20, 2), read, send).ok());
  g.irqs = 3;  // rebooted
  ASSERT_TRUE(p.Send(Batches(20, 2), read, send).ok());
  EXPECT_EQ(g.dropped, 0);
}

TEST(I8042KeyboardInterrupts, SumsIrq1OverCpus) {
  const std::string two_cpus =
      "           CPU0       CPU1       \n"
      "  0:         45          0   IO-APIC   2-edge      timer\n"
      "  1:        120         37   IO-APIC   1-edge      i8042\n"
      " 12:          0        144   IO-APIC  12-edge      i8042\n"
      "NMI:          0          0   Non-maskable interrupts\n";
  auto n = I8042KeyboardInterrupts(two_cpus);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 157u);
  EXPECT_EQ(I8042KeyboardInterrupts("  1:  9  IO-APIC 1-edge  usbkbd\n").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(I8042KeyboardInterrupts("").status().code(), absl::StatusCode::kNotFound);
}

TEST(ScancodeBytes, SetOneAsQemuTranslatesIt) {
  EXPECT_EQ(ScancodeBytes("a", true), 1u);
  EXPECT_EQ(ScancodeBytes("shift", false), 1u);
  EXPECT_EQ(ScancodeBytes("up", true), 2u);
  EXPECT_EQ(ScancodeBytes("ctrl_r", false), 2u);
  EXPECT_EQ(ScancodeBytes("print", true), 4u);
  EXPECT_EQ(ScancodeBytes("pause", true), 6u);
  EXPECT_EQ(ScancodeBytes("pause", false), 0u);
  auto combo = ComboEvents("ctrl+alt+delete");
  ASSERT_TRUE(combo.ok());
  EXPECT_EQ(combo->scancode_bytes, 8u);
  auto text = TextEvents("aB");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ((*text)[0].scancode_bytes, 2u);
  EXPECT_EQ((*text)[1].scancode_bytes, 4u);
}

}  // namespace
}  // namespace warren::runtime::vm
