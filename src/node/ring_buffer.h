// RingBuffer: the bounded output buffer of one stream of a background
// process. Holds the newest `capacity` bytes ever appended; older
// bytes are dropped. Positions are absolute stream offsets (bytes appended
// since the start), so a reader that comes back later learns exactly how many
// bytes it missed.
//
// Memory grows with the bytes held, up to `capacity` (allocated once full).
// Not thread-safe: the owner (node::ManagedProcess) guards it with its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace warren::node {

class RingBuffer {
 public:
  // capacity: bytes kept, > 0.
  explicit RingBuffer(size_t capacity);

  // Appends data; when the buffer is full the oldest bytes are dropped.
  void Append(std::string_view data);

  // Bytes appended since construction (the offset the next byte will have).
  uint64_t total() const { return total_; }
  // Offset of the oldest byte still held (== total() when empty).
  uint64_t first_offset() const { return total_ - size_; }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }

  struct Slice {
    std::string data;      // at most `max` bytes
    uint64_t offset = 0;   // offset of data[0]: max(asked offset, first_offset())
    uint64_t dropped = 0;  // bytes between the asked offset and `offset` no longer held
  };
  // Copies up to `max` bytes from `offset` on. An offset past total() gives
  // an empty slice at total().
  Slice Read(uint64_t offset, size_t max) const;

 private:
  std::string buf_;  // storage: size_ bytes while growing, then capacity_ bytes
  size_t capacity_;
  size_t head_ = 0;  // index in buf_ of the oldest byte
  size_t size_ = 0;  // bytes held
  uint64_t total_ = 0;
};

}  // namespace warren::node
