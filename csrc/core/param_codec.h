#pragma once
// Note [Graph parameter codec]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The graphs that one function captures at different shapes mostly share a topology: the same
// nodes, in the same order, with the same edges. What differs is the parameters of some nodes (a
// kernel's grid, block, shared memory and argument bytes; a copy's addresses and size): the nodes
// whose work depends on the shape, or whose buffers sit elsewhere. A topology group keeps one
// executable (csrc/cuda/shared_executables.h) and, per shape, only what differs from the group's
// base graph (the first one captured):
//   - each distinct parameter blob of a node is stored once, as a patch against the node's base
//     blob (runs of differing bytes), in a dictionary that all shapes of the group share;
//   - a shape is the list of (node, dictionary entry) where it differs from the base, by node.
// Switching the executable from shape A to shape B touches only the nodes whose entries differ
// between A and B (changed_nodes), each rebuilt from its base blob and a patch (decode).
// A shape is added as it was read, its differing blobs held whole, and compressed later
// (compress): the first launch of a new shape needs its parameters, not their patches
// (SharedExecutables compresses once that launch is queued, on a worker thread; a table is
// never read while compress writes it).
// Blobs are opaque bytes here: this file knows neither torch nor CUDA.

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace grape::core {

using Blob = std::vector<uint8_t>;

// A 64-bit hash of `size` bytes, a word at a time (several times faster than a byte at a time):
// the dictionary's index of patches, a graph cache file's checksum, a kernel image's digest.
// Not a cryptographic hash: it tells damage and different code apart, not an attacker's bytes
// (a cache directory is trusted as a model file is).
uint64_t hash_bytes(uint64_t seed, const uint8_t* data, size_t size);

// A patch turning `base` into `value`: value's length, then (gap, length, bytes) runs, where the
// bytes past the end of `base` are compared with zero. Equal blobs give an empty-run patch.
Blob encode_patch(const Blob& base, const Blob& value);
// Rebuilds the value of `patch` (`size` bytes) against `base` into `out`.
void apply_patch(const Blob& base, const uint8_t* patch, size_t size, Blob& out);
// The length of the value apply_patch would make from `patch`, read without decoding it (to
// bound what a patch from a file may allocate). Throws std::invalid_argument where malformed.
size_t patched_size(const uint8_t* patch, size_t size);
// Whether apply_patch(base, patch, size) gives `value`, found without decoding it.
bool patch_matches(const Blob& base, const uint8_t* patch, size_t size, const Blob& value);

class ParamTable {
 public:
  using ShapeId = uint32_t;
  static constexpr ShapeId kBase = 0;  // the base graph's parameters, always present

  // `base`: every node's blob in the base graph.
  explicit ParamTable(std::vector<Blob> base);

  size_t node_count() const { return base_.size(); }
  // Appends `count` nodes whose base blob is empty (nodes a topology union added, absent in the
  // base: Note [Near topologies]). Shapes already held lack them too.
  void add_nodes(size_t count);
  // Adds a shape from every node's blob (as many as the base has): the blobs that differ from the
  // base are copied and held whole until compress(). Returns its id.
  ShapeId add(const std::vector<Blob>& blobs);
  // Encodes a shape's blobs as patches in the shared dictionary; nothing for a shape compressed
  // already or removed.
  void compress(ShapeId shape);
  // Forgets a shape. Its dictionary entries stay: other shapes may use them.
  void remove(ShapeId shape);
  bool contains(ShapeId shape) const;

  // Node `node`'s blob in `shape`.
  void decode(ShapeId shape, uint32_t node, Blob& out) const;
  // The same, without a copy where the blob is held whole (the base's, or a shape's not yet
  // compressed): a reference to it, valid until the table changes; else `scratch` decoded into.
  const Blob& view(ShapeId shape, uint32_t node, Blob& scratch) const;
  // The nodes whose blobs differ between `from` and `to`, ascending.
  void changed_nodes(ShapeId from, ShapeId to, std::vector<uint32_t>& out) const;
  // How many nodes of `shape` differ from the base.
  size_t changed_node_count(ShapeId shape) const;

  size_t shape_count() const { return live_shapes_; }  // the base included
  size_t entry_count() const { return entries_.size(); }
  // Bytes it would take to keep every live shape's blobs in full.
  size_t raw_bytes() const { return raw_bytes_; }
  // Bytes the table holds: base blobs, patches, entries, the dedup index, shape lists and the
  // blobs not compressed yet.
  size_t compressed_bytes() const;

 private:
  struct Entry {
    uint32_t node;
    uint32_t offset;  // into patches_
    uint32_t size;
  };
  static constexpr uint32_t kWhole = UINT32_MAX;  // a Change's entry while its blob is whole
  struct Change {
    uint32_t node;
    uint32_t entry;  // kWhole: the blob is Shape::whole's, at the same index
  };
  struct Shape {
    std::vector<Change> changes;  // by node
    std::vector<Blob> whole;      // until compressed: the changed nodes' blobs, as `changes`
    size_t raw_bytes = 0;
    bool live = false;
  };
  // The dictionary entry holding node `node`'s blob `value` (encoded against the node's base
  // blob); a new one where none does.
  uint32_t intern(uint32_t node, const Blob& value);
  // Whether change `i` of shape `a` and change `j` of shape `b` (of the same node) hold one blob.
  bool same_blob(ShapeId a, size_t i, ShapeId b, size_t j) const;

  std::vector<Blob> base_;
  size_t base_bytes_ = 0;
  std::vector<uint8_t> patches_;
  std::vector<Entry> entries_;
  std::unordered_multimap<uint64_t, uint32_t> index_;  // hash of (node, patch) -> entry
  std::vector<Shape> shapes_;
  size_t live_shapes_ = 0;
  size_t raw_bytes_ = 0;
};

}  // namespace grape::core
