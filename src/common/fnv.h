// FNV-1a, 64 bits (Fowler/Noll/Vo, http://www.isthe.com/chongo/tech/comp/fnv/):
// short, stable names derived from strings (a run dir per state dir, an
// lxcfs dir per run dir, template keys). Stable across builds and hosts, so
// a restarted daemon finds what the previous one named. Not collision
// resistant against an adversary: never a security boundary.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace warren {

inline constexpr uint64_t kFnv1a64Offset = 1469598103934665603ULL;
inline constexpr uint64_t kFnv1a64Prime = 1099511628211ULL;

// The hash of `s` continued from `h` (the offset basis for a new hash), so
// several strings hash as their concatenation.
inline uint64_t Fnv1a64(std::string_view s, uint64_t h = kFnv1a64Offset) {
  for (unsigned char c : s) h = (h ^ c) * kFnv1a64Prime;
  return h;
}

// `h` as 16 lower-case hex digits.
inline std::string Hex16(uint64_t h) {
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

}  // namespace warren
