#include "node/ring_buffer.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace warren::node {
namespace {

TEST(RingBufferTest, KeepsEverythingBelowCapacity) {
  RingBuffer r(16);
  r.Append("hello ");
  r.Append("world");
  EXPECT_EQ(r.total(), 11u);
  EXPECT_EQ(r.first_offset(), 0u);
  RingBuffer::Slice s = r.Read(0, 100);
  EXPECT_EQ(s.data, "hello world");
  EXPECT_EQ(s.offset, 0u);
  EXPECT_EQ(s.dropped, 0u);
  s = r.Read(6, 3);
  EXPECT_EQ(s.data, "wor");
  EXPECT_EQ(s.offset, 6u);
}

TEST(RingBufferTest, DropsOldestAndReportsHowMuchWasMissed) {
  RingBuffer r(8);
  r.Append("0123456789");  // larger than the capacity in one go
  EXPECT_EQ(r.total(), 10u);
  EXPECT_EQ(r.first_offset(), 2u);
  RingBuffer::Slice s = r.Read(0, 100);
  EXPECT_EQ(s.data, "23456789");
  EXPECT_EQ(s.offset, 2u);
  EXPECT_EQ(s.dropped, 2u);
  r.Append("abc");  // wraps around
  s = r.Read(0, 100);
  EXPECT_EQ(s.data, "56789abc");
  EXPECT_EQ(s.offset, 5u);
  EXPECT_EQ(s.dropped, 5u);
  // A reader that kept up loses nothing.
  s = r.Read(10, 100);
  EXPECT_EQ(s.data, "abc");
  EXPECT_EQ(s.dropped, 0u);
}

TEST(RingBufferTest, ReadPastTheEndIsEmptyAtTotal) {
  RingBuffer r(4);
  r.Append("ab");
  RingBuffer::Slice s = r.Read(99, 10);
  EXPECT_TRUE(s.data.empty());
  EXPECT_EQ(s.offset, 2u);
  EXPECT_EQ(s.dropped, 0u);
}

TEST(RingBufferTest, EmptyAppendChangesNothing) {
  RingBuffer r(4);
  r.Append("");
  EXPECT_EQ(r.total(), 0u);
  EXPECT_EQ(r.Read(0, 10).data, "");
}

// Every byte sequence and capacity: the ring holds exactly the newest
// min(total, capacity) bytes of what was appended, readable from any offset.
TEST(RingBufferTest, MatchesAReferenceModel) {
  std::mt19937 rng(42);
  for (size_t cap : {1u, 2u, 7u, 64u, 1000u}) {
    RingBuffer r(cap);
    std::string all;
    for (int i = 0; i < 300; ++i) {
      std::string chunk(rng() % (cap * 2 + 3), '\0');
      for (auto& c : chunk) c = static_cast<char>(rng() & 0xff);
      r.Append(chunk);
      all += chunk;
      ASSERT_EQ(r.total(), all.size());
      const size_t held = std::min(all.size(), cap);
      ASSERT_EQ(r.size(), held);
      const uint64_t off = rng() % (all.size() + 2);
      const size_t max = rng() % (cap + 5);
      RingBuffer::Slice s = r.Read(off, max);
      const uint64_t first = all.size() - held;
      const uint64_t want_off = std::min<uint64_t>(std::max<uint64_t>(off, first), all.size());
      ASSERT_EQ(s.offset, want_off);
      ASSERT_EQ(s.dropped, off < first ? first - off : 0);
      ASSERT_EQ(s.data, all.substr(want_off, max)) << "cap " << cap << " step " << i;
    }
  }
}

}  // namespace
}  // namespace warren::node
