#pragma once
// Note [Stored entries]
// ~~~~~~~~~~~~~~~~~~~~~
// A shape restored from the graph cache (docs/design.md) replays without having been captured, so
// what a capture records besides the graph must come from the file too: where each input goes (its
// placeholder, an arena span), how the function's result is rebuilt (each output tensor's storage
// and view, and the result's tree: containers, their types by qualified name, constant leaves by
// value), and the module tensors it reads as static state, by name. An input alias prediction
// read in place is a placeholder like any, with its kind: an earlier replay's output (chain
// prediction, `chained`) is arena memory, and an allocation site's buffer (site prediction,
// `site_buffer`) is memory the later process's sites hand out, which a replay must not write
// while a tensor holds it. A shape whose
// capture recorded anything else (gradients it replaces, an optimizer's settings, pinned host
// constants, a leaf the tree cannot name) is not stored: the runtime says why, before it builds
// one of these.
// Addresses are (lane, offset) in the arena, which a later process relocates with its own lanes.
// The bytes are decoded with every length and index checked: a damaged entry is refused whole.
// Torch-free.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/param_codec.h"

namespace grape::core {

struct ArenaSpan {
  uint32_t lane = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  friend bool operator==(const ArenaSpan& a, const ArenaSpan& b) {
    return a.lane == b.lane && a.offset == b.offset && a.bytes == b.bytes;
  }
};

// A constant leaf of the result's tree, or a dict's key.
struct StoredValue {
  // kDtype, kDevice: torch.dtype and torch.device, by their names (float16, cuda:0).
  enum class Kind : uint8_t { kNone, kBool, kInt, kFloat, kString, kDtype, kDevice };
  Kind kind = Kind::kNone;
  int64_t integer = 0;  // kBool, kInt
  double real = 0;      // kFloat
  std::string text;     // kString, kDtype, kDevice
  friend bool operator==(const StoredValue& a, const StoredValue& b) {
    return a.kind == b.kind && a.integer == b.integer && a.text == b.text &&
           (a.kind != Kind::kFloat || a.real == b.real || (a.real != a.real && b.real != b.real));
  }
};

// A node of the result's tree, in preorder; its `children` nodes follow it.
struct StoredTreeNode {
  enum class Kind : uint8_t { kTuple, kList, kDict, kNamedTuple, kDataclass, kTensor, kConstant,
                              kRecordRef };
  Kind kind = Kind::kConstant;
  std::string type;               // kNamedTuple, kDataclass: module and qualified name
  std::vector<StoredValue> keys;  // kDict: its keys; kDataclass, kNamedTuple: field names
  std::vector<bool> field_init;   // kDataclass: whether __init__ takes each field
  StoredValue constant;           // kConstant
  int32_t tensor = -1;            // kTensor: the output tensor
  int32_t record = -1;            // kRecordRef: the call's argument object returned
  uint32_t children = 0;
  friend bool operator==(const StoredTreeNode& a, const StoredTreeNode& b) {
    return a.kind == b.kind && a.type == b.type && a.keys == b.keys &&
           a.field_init == b.field_init && a.constant == b.constant && a.tensor == b.tensor &&
           a.record == b.record && a.children == b.children;
  }
};

struct StoredEntry {
  struct Placeholder {
    ArenaSpan span;
    bool mutated = false;
    bool chained = false;      // an earlier replay's output, read in place
    bool site_buffer = false;  // an allocation site's buffer (in the arena's input lane)
    friend bool operator==(const Placeholder& a, const Placeholder& b) {
      return a.span == b.span && a.mutated == b.mutated && a.chained == b.chained &&
             a.site_buffer == b.site_buffer;
    }
  };
  struct OutputStorage {
    enum class Source : uint8_t { kPool, kInput, kStatic };
    Source source = Source::kPool;
    ArenaSpan span;      // kPool
    int32_t input = -1;  // kInput: the input whose placeholder it is
    std::string tensor;  // kStatic: the module tensor, by name
    friend bool operator==(const OutputStorage& a, const OutputStorage& b) {
      return a.source == b.source && a.span == b.span && a.input == b.input &&
             a.tensor == b.tensor;
    }
  };
  struct OutputTensor {
    int32_t storage = -1;
    std::vector<int64_t> sizes;
    std::vector<int64_t> strides;
    int64_t offset = 0;  // elements
    int32_t dtype = 0;   // the runtime's scalar type number (the key pins the torch version)
    friend bool operator==(const OutputTensor& a, const OutputTensor& b) {
      return a.storage == b.storage && a.sizes == b.sizes && a.strides == b.strides &&
             a.offset == b.offset && a.dtype == b.dtype;
    }
  };
  std::vector<Placeholder> placeholders;  // one per input tensor
  std::vector<OutputStorage> output_storages;
  std::vector<OutputTensor> output_tensors;
  std::vector<StoredTreeNode> output_tree;  // preorder; the root first
  // Note [Argument objects]: attributes of the call's argument objects it rebinds, by the
  // object's place among the call's records and the attribute's name; the tree's root is then
  // (the result, the effects' values).
  struct Effect {
    int32_t record = -1;
    std::string attribute;
    friend bool operator==(const Effect& a, const Effect& b) {
      return a.record == b.record && a.attribute == b.attribute;
    }
  };
  std::vector<Effect> effects;
  std::vector<std::string> static_tensors;  // module tensors it reads, by name
  // Per arena lane, the bytes mapped when it was stored: a later process maps at least as much
  // before it replays the shape, which reads and writes its lanes up to there.
  std::vector<uint64_t> lane_extents;
};

// Whether two entries replay alike: everything but the lanes' extents equal.
bool same_replay(const StoredEntry& a, const StoredEntry& b);

Blob encode_entry(const StoredEntry& entry);
// The entry in `bytes`, or nothing with `why` set: bytes cut short or left over, a length or an
// index out of range (an output tensor's storage, a storage's input, a tree that does not close).
std::optional<StoredEntry> decode_entry(const Blob& bytes, std::string& why);

}  // namespace grape::core
