// splitmix64's finalizer: a well-mixed 64-bit function of a 64-bit value,
// for hash chains (the prefix cache's block keys, image hashes) and the
// synthetic weights' generator.
#pragma once

#include <cstdint>

namespace tandem {

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace tandem
