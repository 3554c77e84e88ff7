#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "core/param_codec.h"

using namespace grape::core;

namespace {

// A kernel node's blob as the CUDA layer lays it out: a header (function, grid, block, shared
// memory) and argument bytes holding pointers and sizes.
Blob kernel_blob(uint64_t func, uint32_t grid, uint64_t ptr, int64_t length) {
  Blob b(64, 0);
  std::memcpy(b.data(), &func, 8);
  std::memcpy(b.data() + 8, &grid, 4);
  const uint32_t block = 256;
  std::memcpy(b.data() + 20, &block, 4);
  std::memcpy(b.data() + 40, &ptr, 8);
  std::memcpy(b.data() + 48, &length, 8);
  return b;
}

Blob random_blob(std::mt19937& rng, size_t size) {
  Blob b(size);
  for (auto& byte : b) byte = static_cast<uint8_t>(rng());
  return b;
}

}  // namespace

TEST(ParamPatch, RoundTripsEqualChangedLongerAndShorterValues) {
  std::mt19937 rng(7);
  const Blob base = random_blob(rng, 300);
  std::vector<Blob> values = {base, Blob{}, Blob(base.begin(), base.begin() + 100)};
  Blob sparse = base;
  sparse[0] ^= 1;
  sparse[17] ^= 0xff;
  sparse[18] ^= 0x10;
  sparse[299] ^= 3;
  values.push_back(sparse);
  Blob longer = base;
  longer.resize(420, 0);
  longer[350] = 9;  // past the base's end, compared with zero
  values.push_back(longer);
  values.push_back(random_blob(rng, 300));  // dense: every byte may differ
  for (const auto& value : values) {
    const Blob patch = encode_patch(base, value);
    Blob out;
    apply_patch(base, patch.data(), patch.size(), out);
    EXPECT_EQ(out, value);
  }
}

TEST(ParamPatch, MatchesExactlyTheValueItDecodesTo) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const Blob base = random_blob(rng, 1 + rng() % 200);
    Blob value = base;
    value.resize(1 + rng() % 240, 0);  // shorter, or longer with zeros (as decoding pads)
    for (int k = static_cast<int>(rng() % 6); k > 0; --k) value[rng() % value.size()] ^= 1 + rng() % 255;
    const Blob patch = encode_patch(base, value);
    Blob decoded;
    apply_patch(base, patch.data(), patch.size(), decoded);
    ASSERT_EQ(decoded, value);
    EXPECT_TRUE(patch_matches(base, patch.data(), patch.size(), value));
    // Any one byte else, in a run or in what the patch leaves to the base (or past its end).
    Blob other = value;
    other[rng() % other.size()] ^= 0x40;
    EXPECT_FALSE(patch_matches(base, patch.data(), patch.size(), other));
    Blob longer = value;
    longer.push_back(0);
    EXPECT_FALSE(patch_matches(base, patch.data(), patch.size(), longer));
  }
}

TEST(ParamPatch, RoundTripsLongDifferingStretchesAtEveryAlignment) {
  // Argument bytes the host left unset differ through long stretches, which the encoder takes a
  // word at a time: runs starting and ending at every offset within a word, equal gaps of every
  // length between them, and values shorter or longer than the base.
  std::mt19937 rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    const Blob base = random_blob(rng, rng() % 700);
    Blob value = base;
    value.resize(rng() % 2 ? base.size() : rng() % 760, 0);
    if (value.empty()) value.push_back(1);
    for (int k = static_cast<int>(rng() % 5); k > 0; --k) {
      const size_t at = rng() % value.size();
      const size_t length = std::min<size_t>(value.size() - at, 1 + rng() % 300);
      for (size_t i = at; i < at + length; ++i) {
        if (rng() % 4 != 0) value[i] = static_cast<uint8_t>(rng());  // some equal bytes inside
      }
    }
    const Blob patch = encode_patch(base, value);
    Blob decoded;
    apply_patch(base, patch.data(), patch.size(), decoded);
    ASSERT_EQ(decoded, value) << "trial " << trial;
    ASSERT_TRUE(patch_matches(base, patch.data(), patch.size(), value));
    Blob other = value;
    other[rng() % other.size()] ^= 0x08;
    ASSERT_FALSE(patch_matches(base, patch.data(), patch.size(), other));
    // Never much more than the value itself: a run header per word at worst.
    EXPECT_LE(patch.size(), value.size() + value.size() / 4 + 8);
  }
}

TEST(ParamPatch, SparseChangesGiveSmallPatches) {
  std::mt19937 rng(3);
  const Blob base = random_blob(rng, 4096);
  Blob value = base;
  value[100] ^= 1;
  value[2000] ^= 1;
  value[2002] ^= 1;  // close to the previous change: one run
  const Blob patch = encode_patch(base, value);
  EXPECT_LE(patch.size(), 16u);
  EXPECT_EQ(encode_patch(base, base).size(), 2u);  // just the length
}

TEST(ParamPatch, RejectsTruncatedAndOverlongPatches) {
  const Blob base(8, 1);
  Blob value = base;
  value[5] = 7;
  Blob patch = encode_patch(base, value);
  Blob out;
  Blob truncated(patch.begin(), patch.end() - 1);
  EXPECT_THROW(apply_patch(base, truncated.data(), truncated.size(), out), std::invalid_argument);
  Blob overlong = patch;
  overlong[0] = 2;  // the value is shorter than the run
  EXPECT_THROW(apply_patch(base, overlong.data(), overlong.size(), out), std::invalid_argument);
}

TEST(ParamTable, DecodesEveryShapeAndNodeAsAdded) {
  std::mt19937 rng(11);
  const size_t nodes = 40;
  std::vector<Blob> base;
  for (size_t n = 0; n < nodes; ++n) base.push_back(kernel_blob(n, 1, 0x7f0000000000 + n * 4096, 8));
  ParamTable table(base);
  std::vector<std::vector<Blob>> shapes;
  std::vector<ParamTable::ShapeId> ids;
  for (int s = 0; s < 50; ++s) {
    std::vector<Blob> blobs = base;
    // A few nodes depend on the shape; one has a new function; one a longer argument list.
    for (size_t n : {3u, 4u, 17u}) blobs[n] = kernel_blob(n, 1 + s, 0x7f0000100000 + s * 512, s);
    if (s % 5 == 0) blobs[9] = kernel_blob(999, 1, 0x7f0000000000 + 9 * 4096, 8);
    if (s % 7 == 0) blobs[30].resize(96, static_cast<uint8_t>(s));
    shapes.push_back(blobs);
    ids.push_back(table.add(blobs));
  }
  // As added (the blobs held whole), then with every other shape compressed, then all.
  Blob out, scratch;
  for (int pass = 0; pass < 3; ++pass) {
    for (size_t s = 0; s < shapes.size(); ++s) {
      for (uint32_t n = 0; n < nodes; ++n) {
        table.decode(ids[s], n, out);
        ASSERT_EQ(out, shapes[s][n]) << "pass " << pass << " shape " << s << " node " << n;
        ASSERT_EQ(table.view(ids[s], n, scratch), shapes[s][n]);
      }
    }
    for (size_t s = 0; s < shapes.size(); ++s) {
      if (pass == 1 || s % 2 == 0) table.compress(ids[s]);
    }
  }
  for (uint32_t n = 0; n < nodes; ++n) {
    table.decode(ParamTable::kBase, n, out);
    EXPECT_EQ(out, base[n]);
  }
  EXPECT_EQ(table.shape_count(), 51u);
}

TEST(ParamTable, ChangedNodesAreExactlyTheNodesThatDiffer) {
  std::mt19937 rng(5);
  const size_t nodes = 30;
  std::vector<Blob> base;
  for (size_t n = 0; n < nodes; ++n) base.push_back(random_blob(rng, 48));
  ParamTable table(base);
  std::vector<std::vector<Blob>> shapes = {base};
  std::vector<ParamTable::ShapeId> ids = {ParamTable::kBase};
  for (int s = 0; s < 20; ++s) {
    std::vector<Blob> blobs = base;
    for (size_t n = 0; n < nodes; ++n) {
      const auto pick = rng() % 4;
      if (pick == 1) blobs[n][0] ^= 1;                     // a value shared by many shapes
      if (pick == 2) blobs[n][5] = static_cast<uint8_t>(s);  // a value of its own
    }
    shapes.push_back(blobs);
    ids.push_back(table.add(blobs));
  }
  // Exactly the nodes that differ, whether the shapes are compressed (patches compared by their
  // entries), not yet (whole blobs, as a join's are until the next launch) or one of each.
  std::vector<uint32_t> changed;
  for (const char* state : {"none compressed", "every other compressed", "all compressed"}) {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (state[0] == 'a' || (state[0] == 'e' && i % 2 == 0)) table.compress(ids[i]);
    }
    for (size_t a = 0; a < ids.size(); ++a) {
      for (size_t b = 0; b < ids.size(); ++b) {
        table.changed_nodes(ids[a], ids[b], changed);
        std::vector<uint32_t> expected;
        for (uint32_t n = 0; n < nodes; ++n) {
          if (shapes[a][n] != shapes[b][n]) expected.push_back(n);
        }
        ASSERT_EQ(changed, expected) << a << " -> " << b << ", " << state;
      }
    }
  }
}

TEST(ParamTable, ViewsHeldBlobsInPlaceAndDecodesPatchesIntoScratch) {
  const Blob a = kernel_blob(1, 8, 0x1000, 64), b = kernel_blob(2, 8, 0x2000, 64);
  ParamTable table({a, b});
  const Blob changed = kernel_blob(2, 16, 0x2400, 64);
  const auto shape = table.add({a, changed});
  Blob scratch;
  EXPECT_EQ(&table.view(shape, 0, scratch), &table.view(ParamTable::kBase, 0, scratch));
  const Blob& whole = table.view(shape, 1, scratch);
  EXPECT_NE(&whole, &scratch);  // held whole: no copy
  EXPECT_EQ(whole, changed);
  const size_t held_whole = table.compressed_bytes();
  table.compress(shape);
  EXPECT_LT(table.compressed_bytes(), held_whole);
  const Blob& decoded = table.view(shape, 1, scratch);
  EXPECT_EQ(&decoded, &scratch);
  EXPECT_EQ(decoded, changed);
  table.compress(shape);  // again: nothing to do
  table.remove(shape);
  table.compress(shape);  // removed: nothing to do
  EXPECT_FALSE(table.contains(shape));
}

TEST(ParamTable, SharesEqualValuesAndCompressesRedundantShapes) {
  // A GPT-2-like step: 200 kernel nodes of 80 bytes, of which 36 depend on the sequence length.
  const size_t nodes = 200;
  std::vector<Blob> base;
  for (size_t n = 0; n < nodes; ++n) base.push_back(kernel_blob(n, 4, 0x7f0000000000 + n * 256, 64));
  ParamTable table(base);
  const size_t shapes = 1024;
  for (size_t s = 1; s < shapes; ++s) {
    std::vector<Blob> blobs = base;
    for (size_t n = 0; n < 36; ++n) {
      blobs[n * 5] = kernel_blob(n * 5, static_cast<uint32_t>(1 + s / 64),
                                 0x7f0000000000 + n * 5 * 256, static_cast<int64_t>(s));
    }
    table.compress(table.add(blobs));
  }
  EXPECT_EQ(table.shape_count(), shapes);
  EXPECT_EQ(table.raw_bytes(), shapes * nodes * 64);
  // Raw: 12.8 KB per shape. Compressed: a short patch and a list entry per changed node.
  EXPECT_LT(table.compressed_bytes() * 5, table.raw_bytes());
  EXPECT_LT(table.compressed_bytes() / shapes, 36u * 64);
  // Equal values are stored once: a shape seen again adds no entries.
  const size_t entries = table.entry_count();
  std::vector<Blob> again = base;
  again[5] = kernel_blob(5, 1 + 7 / 64, 0x7f0000000000 + 5 * 256, 7);
  table.compress(table.add(again));
  EXPECT_EQ(table.entry_count(), entries);
}

TEST(ParamTable, RemovedShapesAreGoneAndTheirBytesReleased) {
  std::vector<Blob> base = {Blob(16, 0), Blob(16, 1)};
  ParamTable table(base);
  std::vector<Blob> blobs = base;
  blobs[1][3] = 9;
  const auto id = table.add(blobs);
  const size_t raw = table.raw_bytes();
  table.remove(id);
  EXPECT_FALSE(table.contains(id));
  EXPECT_LT(table.raw_bytes(), raw);
  Blob out;
  EXPECT_THROW(table.decode(id, 0, out), std::out_of_range);
  table.remove(ParamTable::kBase);  // the base stays
  EXPECT_TRUE(table.contains(ParamTable::kBase));
  EXPECT_THROW(table.add({Blob(16, 0)}), std::invalid_argument);  // wrong node count
}

TEST(ParamTable, AddedNodesAreAbsentFromShapesHeldBeforeAndPresentInLaterOnes) {
  // A topology union appends nodes (Note [Near topologies]): absent (an empty blob) in every
  // shape held so far; a later shape may hold them, or lack one of the older nodes.
  const Blob a = kernel_blob(1, 8, 0x1000, 64), b = kernel_blob(2, 8, 0x2000, 64);
  ParamTable table({a, b});
  const auto old_shape = table.add({a, kernel_blob(2, 16, 0x2000, 128)});
  table.add_nodes(1);
  EXPECT_EQ(table.node_count(), 3u);
  const Blob extra = kernel_blob(3, 4, 0x3000, 32);
  const auto new_shape = table.add({Blob{}, b, extra});
  Blob out;
  for (auto shape : {ParamTable::kBase, old_shape}) {
    table.decode(shape, 2, out);
    EXPECT_TRUE(out.empty());
  }
  table.decode(new_shape, 0, out);
  EXPECT_TRUE(out.empty());
  table.decode(new_shape, 2, out);
  EXPECT_EQ(out, extra);
  std::vector<uint32_t> changed;
  table.changed_nodes(old_shape, new_shape, changed);
  EXPECT_EQ(changed, (std::vector<uint32_t>{0, 1, 2}));
  table.changed_nodes(ParamTable::kBase, new_shape, changed);
  EXPECT_EQ(changed, (std::vector<uint32_t>{0, 2}));
}
