#include "core/signature.h"

namespace grape::core {

namespace {
constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;

inline uint64_t avalanche(uint64_t x) {
  // splitmix64's finalizer: every input bit affects every output bit.
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}
}  // namespace

uint64_t hash_words(const int64_t* words, size_t n) {
  uint64_t h = 0x84222325CBF29CE4ull ^ (n * kMul);
  for (size_t i = 0; i < n; ++i) {
    h = avalanche(h ^ (static_cast<uint64_t>(words[i]) + kMul + (h << 6) + (h >> 2)));
  }
  return h;
}

void Signature::finish() { hash_ = hash_words(words_.data(), words_.size()); }

}  // namespace grape::core
