#include "node/ring_buffer.h"

#include <algorithm>
#include <cstring>

namespace warren::node {

RingBuffer::RingBuffer(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

void RingBuffer::Append(std::string_view data) {
  total_ += data.size();
  if (data.size() >= capacity_) {
    // Only the newest capacity_ bytes survive.
    buf_.assign(data.data() + (data.size() - capacity_), capacity_);
    head_ = 0;
    size_ = capacity_;
    return;
  }
  if (buf_.size() < capacity_) {
    // Growing: memory follows the bytes held (head_ == 0, buf_ holds size_ bytes).
    if (size_ + data.size() <= capacity_) {
      buf_.append(data.data(), data.size());
      size_ += data.size();
      return;
    }
    buf_.resize(capacity_);  // full from now on: a ring
  }
  const size_t overflow = size_ + data.size() > capacity_ ? size_ + data.size() - capacity_ : 0;
  head_ = (head_ + overflow) % capacity_;
  size_ -= overflow;
  size_t tail = (head_ + size_) % capacity_;
  size_t first = std::min(data.size(), capacity_ - tail);
  std::memcpy(buf_.data() + tail, data.data(), first);
  std::memcpy(buf_.data(), data.data() + first, data.size() - first);
  size_ += data.size();
}

RingBuffer::Slice RingBuffer::Read(uint64_t offset, size_t max) const {
  Slice s;
  const uint64_t first = first_offset();
  if (offset > total_) offset = total_;
  if (offset < first) {
    s.dropped = first - offset;
    offset = first;
  }
  s.offset = offset;
  const size_t skip = static_cast<size_t>(offset - first);
  const size_t n = std::min(max, size_ - skip);
  s.data.resize(n);
  const size_t start = (head_ + skip) % capacity_;
  const size_t part = std::min(n, capacity_ - start);
  std::memcpy(s.data.data(), buf_.data() + start, part);
  std::memcpy(s.data.data() + part, buf_.data(), n - part);
  return s;
}

}  // namespace warren::node
