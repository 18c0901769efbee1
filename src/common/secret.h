// Comparing secrets (bearer tokens) without leaking them through timing,
// and making new ones.
#pragma once

#include <sys/random.h>

#include <cstddef>
#include <string>
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

// `bytes` bytes from the kernel's CSPRNG (getrandom, which blocks only
// until the pool is first seeded), hex-encoded: 2 * bytes characters.
inline std::string RandomHex(size_t bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes);
  unsigned char buf[64];
  while (bytes > 0) {
    const size_t want = bytes < sizeof buf ? bytes : sizeof buf;
    const ssize_t n = ::getrandom(buf, want, 0);
    if (n <= 0) continue;  // EINTR; getrandom does not otherwise fail for <= 256 bytes
    for (ssize_t i = 0; i < n; ++i) {
      out.push_back(kHex[buf[i] >> 4]);
      out.push_back(kHex[buf[i] & 0xf]);
    }
    bytes -= static_cast<size_t>(n);
  }
  return out;
}

}  // namespace warren
