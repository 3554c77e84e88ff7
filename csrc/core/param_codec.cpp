#include "core/param_codec.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace grape::core {

namespace {

// Two equal bytes between differing ones cost less inside a run than a new run's header.
constexpr size_t kMaxGapInRun = 2;

void put_varint(Blob& out, size_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<uint8_t>(v));
}

size_t get_varint(const uint8_t* data, size_t size, size_t& pos) {
  size_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (pos >= size) throw std::invalid_argument("grape: truncated parameter patch");
    const uint8_t byte = data[pos++];
    v |= static_cast<size_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return v;
  }
  throw std::invalid_argument("grape: malformed parameter patch");
}

// Byte `i` of `base`, zeros past its end: what a patch's value is compared with.
uint8_t base_at(const Blob& base, size_t i) { return i < base.size() ? base[i] : 0; }

// The first index from `i` on where `value` differs from `base`, or value.size(). Most of a
// shape's bytes equal the base's: they are skipped a word at a time.
size_t next_difference(const Blob& base, const Blob& value, size_t i) {
  const size_t common = std::min(base.size(), value.size());
  for (; i + sizeof(uint64_t) <= common; i += sizeof(uint64_t)) {
    uint64_t a, b;
    std::memcpy(&a, base.data() + i, sizeof a);
    std::memcpy(&b, value.data() + i, sizeof b);
    if (a != b) break;
  }
  for (; i < value.size(); ++i) {
    if (value[i] != base_at(base, i)) return i;
  }
  return i;
}

// Walks `patch` (`size` bytes) of a value of `length(n)` bytes: `run(at, bytes, count)` for each
// run at offset `at` of the value, in order. Stops where either returns false, and says so.
// Throws where the patch is malformed or runs past its value.
template <typename Length, typename Run>
bool for_each_run(const uint8_t* patch, size_t size, Length length, Run run) {
  size_t pos = 0;
  const size_t n = get_varint(patch, size, pos);
  if (!length(n)) return false;
  size_t at = 0;
  while (pos < size) {
    const size_t gap = get_varint(patch, size, pos);
    const size_t count = get_varint(patch, size, pos);
    // Compared without sums that could wrap: a patch read from a file may be damaged.
    if (gap > n - at || count > n - at - gap || count > size - pos) {
      throw std::invalid_argument("grape: parameter patch runs past its value");
    }
    at += gap;
    if (!run(at, patch + pos, count)) return false;
    pos += count;
    at += count;
  }
  return true;
}

// The end of the run that starts at `i`, where `value` differs from `base`: the run takes
// differing bytes and the equal stretches between them shorter than kMaxGapInRun, a word at a time
// where both blobs have one (equal bytes inside a differing word are taken too: garbage the host
// left in unused argument bytes differs through hundreds of bytes, which bytewise cost as much as
// reading the graph).
size_t run_end_from(const Blob& base, const Blob& value, size_t i) {
  size_t run_end = i + 1;
  size_t j = run_end;
  const size_t common = std::min(base.size(), value.size());
  for (; j + sizeof(uint64_t) <= common; j += sizeof(uint64_t)) {
    // A whole equal word is an equal stretch longer than kMaxGapInRun: the run ends.
    if (std::memcmp(base.data() + j, value.data() + j, sizeof(uint64_t)) == 0) return run_end;
    size_t last = j + sizeof(uint64_t) - 1;
    while (value[last] == base[last]) --last;
    run_end = last + 1;
  }
  while (j < value.size()) {
    if (value[j] != base_at(base, j)) {
      run_end = ++j;
    } else if (j - run_end < kMaxGapInRun) {
      ++j;
    } else {
      break;
    }
  }
  return run_end;
}

void append_patch(const Blob& base, const Blob& value, Blob& out) {
  put_varint(out, value.size());
  size_t end = 0;  // end of the previous run
  size_t i = 0;
  while ((i = next_difference(base, value, i)) < value.size()) {
    const size_t run_end = run_end_from(base, value, i);
    put_varint(out, i - end);
    put_varint(out, run_end - i);
    out.insert(out.end(), value.begin() + static_cast<std::ptrdiff_t>(i),
               value.begin() + static_cast<std::ptrdiff_t>(run_end));
    end = i = run_end;
  }
}

}  // namespace

uint64_t hash_bytes(uint64_t seed, const uint8_t* data, size_t size) {
  // xxHash64's round and final mix, in one lane: every step is one-to-one in the state and in
  // the input, so a single changed word always changes the result, and bits spread both ways.
  constexpr uint64_t kP1 = 0x9e3779b185ebca87ull, kP2 = 0xc2b2ae3d27d4eb4full;
  constexpr uint64_t kP3 = 0x165667b19e3779f9ull, kP5 = 0x27d4eb2f165667c5ull;
  const auto rotl = [](uint64_t x, int r) { return (x << r) | (x >> (64 - r)); };
  uint64_t h = seed + kP5 + size;
  size_t i = 0;
  for (; i + sizeof(uint64_t) <= size; i += sizeof(uint64_t)) {
    uint64_t w;
    std::memcpy(&w, data + i, sizeof w);
    h = rotl(h + w * kP2, 31) * kP1;
  }
  for (; i < size; ++i) h = rotl(h ^ (data[i] * kP5), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  return h ^ (h >> 32);
}

Blob encode_patch(const Blob& base, const Blob& value) {
  Blob patch;
  append_patch(base, value, patch);
  return patch;
}

size_t patched_size(const uint8_t* patch, size_t size) {
  size_t pos = 0;
  return get_varint(patch, size, pos);
}

void apply_patch(const Blob& base, const uint8_t* patch, size_t size, Blob& out) {
  for_each_run(
      patch, size,
      [&](size_t length) {
        out.assign(length, 0);
        const size_t common = std::min(length, base.size());
        if (common > 0) std::memcpy(out.data(), base.data(), common);
        return true;
      },
      [&](size_t at, const uint8_t* bytes, size_t count) {
        if (count > 0) std::memcpy(out.data() + at, bytes, count);
        return true;
      });
}

bool patch_matches(const Blob& base, const uint8_t* patch, size_t size, const Blob& value) {
  // The bytes of `value` in [from, to) against the base's (zeros past its end).
  auto base_matches = [&](size_t from, size_t to) {
    const size_t common = std::min(to, std::max(from, base.size()));
    if (common > from && std::memcmp(base.data() + from, value.data() + from, common - from) != 0) {
      return false;
    }
    for (size_t i = common; i < to; ++i) {
      if (value[i] != 0) return false;
    }
    return true;
  };
  size_t end = 0;  // of the previous run
  return for_each_run(
             patch, size, [&](size_t length) { return length == value.size(); },
             [&](size_t at, const uint8_t* bytes, size_t count) {
               const bool same = base_matches(end, at) &&
                                 std::memcmp(bytes, value.data() + at, count) == 0;
               end = at + count;
               return same;
             }) &&
         base_matches(end, value.size());
}

ParamTable::ParamTable(std::vector<Blob> base) : base_(std::move(base)) {
  for (const auto& b : base_) base_bytes_ += b.size();
  shapes_.push_back({{}, {}, base_bytes_, true});
  live_shapes_ = 1;
  raw_bytes_ = base_bytes_;
}

uint32_t ParamTable::intern(uint32_t node, const Blob& value) {
  // Encoded in place at the end of the dictionary's bytes, and taken back if an entry holds it.
  const size_t offset = patches_.size();
  try {
    append_patch(base_[node], value, patches_);
  } catch (...) {
    patches_.resize(offset);  // out of memory part-way: no entry holds those bytes
    throw;
  }
  const size_t size = patches_.size() - offset;
  const uint64_t h = hash_bytes(node, patches_.data() + offset, size);
  auto [first, last] = index_.equal_range(h);
  for (auto it = first; it != last; ++it) {
    const Entry& e = entries_[it->second];
    if (e.node == node && e.size == size &&
        std::memcmp(patches_.data() + e.offset, patches_.data() + offset, size) == 0) {
      patches_.resize(offset);
      return it->second;
    }
  }
  const auto id = static_cast<uint32_t>(entries_.size());
  entries_.push_back({node, static_cast<uint32_t>(offset), static_cast<uint32_t>(size)});
  index_.emplace(h, id);
  return id;
}

void ParamTable::add_nodes(size_t count) { base_.resize(base_.size() + count); }

ParamTable::ShapeId ParamTable::add(const std::vector<Blob>& blobs) {
  if (blobs.size() != base_.size()) {
    throw std::invalid_argument("grape: a shape of a topology group has " +
                                std::to_string(blobs.size()) + " nodes, the group " +
                                std::to_string(base_.size()));
  }
  Shape shape;
  shape.live = true;
  for (uint32_t node = 0; node < blobs.size(); ++node) {
    shape.raw_bytes += blobs[node].size();
    if (blobs[node] == base_[node]) continue;
    shape.changes.push_back({node, kWhole});
    shape.whole.push_back(blobs[node]);
  }
  shape.changes.shrink_to_fit();
  raw_bytes_ += shape.raw_bytes;
  ++live_shapes_;
  shapes_.push_back(std::move(shape));
  return static_cast<ShapeId>(shapes_.size() - 1);
}

void ParamTable::compress(ShapeId shape) {
  if (!contains(shape)) return;
  Shape& s = shapes_[shape];
  for (size_t i = 0; i < s.whole.size(); ++i) {
    const uint32_t node = s.changes[i].node;
    s.changes[i].entry = intern(node, s.whole[i]);
  }
  s.whole = {};
}

bool ParamTable::contains(ShapeId shape) const {
  return shape < shapes_.size() && shapes_[shape].live;
}

void ParamTable::remove(ShapeId shape) {
  if (shape == kBase || !contains(shape)) return;
  Shape& s = shapes_[shape];
  raw_bytes_ -= s.raw_bytes;
  s = Shape{};
  --live_shapes_;
}

void ParamTable::decode(ShapeId shape, uint32_t node, Blob& out) const {
  const Blob& blob = view(shape, node, out);
  if (&blob != &out) out = blob;
}

const Blob& ParamTable::view(ShapeId shape, uint32_t node, Blob& scratch) const {
  if (!contains(shape) || node >= base_.size()) {
    throw std::out_of_range("grape: no such shape or node in the parameter table");
  }
  const Shape& s = shapes_[shape];
  auto it = std::lower_bound(s.changes.begin(), s.changes.end(), node,
                             [](const Change& c, uint32_t n) { return c.node < n; });
  if (it == s.changes.end() || it->node != node) return base_[node];
  if (it->entry == kWhole) return s.whole[static_cast<size_t>(it - s.changes.begin())];
  const Entry& e = entries_[it->entry];
  apply_patch(base_[node], patches_.data() + e.offset, e.size, scratch);
  return scratch;
}

bool ParamTable::same_blob(ShapeId a, size_t i, ShapeId b, size_t j) const {
  const Shape& x = shapes_[a];
  const Shape& y = shapes_[b];
  const uint32_t ex = x.changes[i].entry, ey = y.changes[j].entry;
  if (ex != kWhole && ey != kWhole) return ex == ey;  // interned: equal patches, one entry
  if (ex == kWhole && ey == kWhole) return x.whole[i] == y.whole[j];
  // A shape not compressed yet (a join's, until the launch after it) against a compressed one:
  // compared by value without decoding, so that its join patches only what differs.
  const Entry& e = entries_[ex != kWhole ? ex : ey];
  return patch_matches(base_[x.changes[i].node], patches_.data() + e.offset, e.size,
                       ex == kWhole ? x.whole[i] : y.whole[j]);
}

void ParamTable::changed_nodes(ShapeId from, ShapeId to, std::vector<uint32_t>& out) const {
  out.clear();
  if (!contains(from) || !contains(to)) {
    throw std::out_of_range("grape: no such shape in the parameter table");
  }
  if (from == to) return;
  const auto& a = shapes_[from].changes;
  const auto& b = shapes_[to].changes;
  size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    if (j == b.size() || (i < a.size() && a[i].node < b[j].node)) {
      out.push_back(a[i++].node);  // back to the base blob
    } else if (i == a.size() || b[j].node < a[i].node) {
      out.push_back(b[j++].node);
    } else {
      if (!same_blob(from, i, to, j)) out.push_back(a[i].node);
      ++i;
      ++j;
    }
  }
}

size_t ParamTable::changed_node_count(ShapeId shape) const {
  return contains(shape) ? shapes_[shape].changes.size() : 0;
}

size_t ParamTable::compressed_bytes() const {
  size_t bytes = base_bytes_ + patches_.size() + entries_.size() * sizeof(Entry) +
                 index_.size() * (sizeof(uint64_t) + sizeof(uint32_t));
  for (const auto& s : shapes_) {
    bytes += sizeof(Shape) + s.changes.size() * sizeof(Change);
    for (const auto& blob : s.whole) bytes += blob.size();
  }
  return bytes;
}

}  // namespace grape::core
