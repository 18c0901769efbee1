// Comparing secrets (bearer tokens) without leaking them through timing.
#pragma once

#include <cstddef>
#include <string_view>

namespace warren {

// True when `a` and `b` are equal. Takes time depending only on their
// lengths, not on where they first differ.
inline bool SameSecret(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace warren
