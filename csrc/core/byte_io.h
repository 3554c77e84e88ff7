#pragma once
// Little-endian, length-prefixed bytes for what grape writes to disk (Note [Graph cache files],
// Note [Stored entries]). ByteReader checks every length against the bytes left, so damaged input
// throws std::invalid_argument before anything is allocated for it. Torch-free.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/param_codec.h"

namespace grape::core {

class ByteWriter {
 public:
  void u8(uint8_t v) { out.push_back(v); }
  void u32(uint32_t v) { raw(&v, sizeof v); }
  void u64(uint64_t v) { raw(&v, sizeof v); }
  void bytes(const uint8_t* data, size_t size) {
    u64(size);
    raw(data, size);
  }
  void text(const std::string& s) { bytes(reinterpret_cast<const uint8_t*>(s.data()), s.size()); }
  void raw(const void* data, size_t size) {
    const auto* p = static_cast<const uint8_t*>(data);
    out.insert(out.end(), p, p + size);
  }
  Blob out;
};

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t u8() { return take<uint8_t>(); }
  uint32_t u32() { return take<uint32_t>(); }
  uint64_t u64() { return take<uint64_t>(); }
  // A count of items each at least `item_bytes` long: no more than the bytes left could hold.
  uint64_t count(size_t item_bytes) {
    const uint64_t n = u64();
    if (n > left() / std::max<size_t>(1, item_bytes)) {
      throw std::invalid_argument("a count too large");
    }
    return n;
  }
  const uint8_t* bytes(uint64_t& size) {
    size = u64();
    if (size > left()) throw std::invalid_argument("a length past the end");
    const uint8_t* at = data_ + pos_;
    pos_ += size;
    return at;
  }
  std::string text() {
    uint64_t size = 0;
    const uint8_t* at = bytes(size);
    return std::string(reinterpret_cast<const char*>(at), size);
  }
  size_t left() const { return size_ - pos_; }

 private:
  template <typename T>
  T take() {
    if (left() < sizeof(T)) throw std::invalid_argument("cut short");
    T v;
    std::memcpy(&v, data_ + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace grape::core
