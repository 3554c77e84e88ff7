#include "core/stored_entry.h"

#include <stdexcept>

#include "core/byte_io.h"

namespace grape::core {
namespace {

constexpr uint64_t kMaxDims = 64;

void write_span(ByteWriter& w, const ArenaSpan& s) {
  w.u32(s.lane);
  w.u64(s.offset);
  w.u64(s.bytes);
}

ArenaSpan read_span(ByteReader& r) {
  ArenaSpan s;
  s.lane = r.u32();
  s.offset = r.u64();
  s.bytes = r.u64();
  return s;
}

void write_value(ByteWriter& w, const StoredValue& v) {
  w.u8(static_cast<uint8_t>(v.kind));
  switch (v.kind) {
    case StoredValue::Kind::kBool:
    case StoredValue::Kind::kInt: w.u64(static_cast<uint64_t>(v.integer)); break;
    case StoredValue::Kind::kFloat: w.raw(&v.real, sizeof v.real); break;
    case StoredValue::Kind::kString:
    case StoredValue::Kind::kDtype:
    case StoredValue::Kind::kDevice: w.text(v.text); break;
    case StoredValue::Kind::kNone: break;
  }
}

StoredValue read_value(ByteReader& r) {
  StoredValue v;
  const uint8_t kind = r.u8();
  if (kind > static_cast<uint8_t>(StoredValue::Kind::kDevice)) {
    throw std::invalid_argument("a value");
  }
  v.kind = static_cast<StoredValue::Kind>(kind);
  switch (v.kind) {
    case StoredValue::Kind::kBool:
    case StoredValue::Kind::kInt: v.integer = static_cast<int64_t>(r.u64()); break;
    case StoredValue::Kind::kFloat: {
      const uint64_t bits = r.u64();
      std::memcpy(&v.real, &bits, sizeof bits);
      break;
    }
    case StoredValue::Kind::kString:
    case StoredValue::Kind::kDtype:
    case StoredValue::Kind::kDevice: v.text = r.text(); break;
    case StoredValue::Kind::kNone: break;
  }
  return v;
}

void write_ints(ByteWriter& w, const std::vector<int64_t>& v) {
  w.u64(v.size());
  for (int64_t x : v) w.u64(static_cast<uint64_t>(x));
}

std::vector<int64_t> read_ints(ByteReader& r) {
  std::vector<int64_t> v(r.count(sizeof(uint64_t)));
  if (v.size() > kMaxDims) throw std::invalid_argument("too many dimensions");
  for (int64_t& x : v) x = static_cast<int64_t>(r.u64());
  return v;
}

void write_node(ByteWriter& w, const StoredTreeNode& n) {
  w.u8(static_cast<uint8_t>(n.kind));
  w.text(n.type);
  w.u64(n.keys.size());
  for (const StoredValue& k : n.keys) write_value(w, k);
  w.u64(n.field_init.size());
  for (bool b : n.field_init) w.u8(b);
  write_value(w, n.constant);
  w.u32(static_cast<uint32_t>(n.tensor));
  w.u32(static_cast<uint32_t>(n.record));
  w.u32(n.children);
}

StoredTreeNode read_node(ByteReader& r) {
  StoredTreeNode n;
  const uint8_t kind = r.u8();
  if (kind > static_cast<uint8_t>(StoredTreeNode::Kind::kRecordRef)) {
    throw std::invalid_argument("a tree node's kind");
  }
  n.kind = static_cast<StoredTreeNode::Kind>(kind);
  n.type = r.text();
  n.keys.resize(r.count(1));
  for (StoredValue& k : n.keys) k = read_value(r);
  n.field_init.resize(r.count(1));
  for (size_t i = 0; i < n.field_init.size(); ++i) n.field_init[i] = r.u8() != 0;
  n.constant = read_value(r);
  n.tensor = static_cast<int32_t>(r.u32());
  n.record = static_cast<int32_t>(r.u32());
  n.children = r.u32();
  return n;
}

// Why `entry`'s indices do not hold together, or "".
std::string inconsistency(const StoredEntry& e) {
  for (const auto& s : e.output_storages) {
    using Source = StoredEntry::OutputStorage::Source;
    if (s.source == Source::kInput &&
        (s.input < 0 || static_cast<size_t>(s.input) >= e.placeholders.size())) {
      return "an output storage's input";
    }
    if (s.source == Source::kStatic && s.tensor.empty()) return "an output storage's tensor";
  }
  for (const auto& t : e.output_tensors) {
    if (t.storage < 0 || static_cast<size_t>(t.storage) >= e.output_storages.size()) {
      return "an output tensor's storage";
    }
    if (t.sizes.size() != t.strides.size()) return "an output tensor's strides";
    for (int64_t size : t.sizes) {
      if (size < 0) return "an output tensor's size";
    }
  }
  for (const auto& effect : e.effects) {
    if (effect.record < 0 || effect.attribute.empty()) return "an effect";
  }
  // With effects, the root is (the result, the effects' values).
  if (!e.effects.empty() && (e.output_tree.empty() ||
                             e.output_tree.front().kind != StoredTreeNode::Kind::kTuple ||
                             e.output_tree.front().children != 2)) {
    return "a tree without the effects' values";
  }
  // A preorder tree: one root, each node's children after it, nothing left over.
  size_t open = 1;
  for (const StoredTreeNode& n : e.output_tree) {
    if (open == 0) return "nodes after the result's tree";
    --open;
    using Kind = StoredTreeNode::Kind;
    const bool leaf = n.kind == Kind::kTensor || n.kind == Kind::kConstant ||
                      n.kind == Kind::kRecordRef;
    if (leaf && n.children != 0) return "a leaf with children";
    const bool keyed = n.kind == Kind::kDict || n.kind == Kind::kDataclass ||
                       n.kind == Kind::kNamedTuple;
    if (keyed && n.keys.size() != n.children) return "a container's keys";
    if (n.kind == Kind::kDataclass && n.field_init.size() != n.keys.size()) {
      return "a dataclass's fields";
    }
    if (n.kind == Kind::kTensor &&
        (n.tensor < 0 || static_cast<size_t>(n.tensor) >= e.output_tensors.size())) {
      return "a tree's tensor";
    }
    if (n.kind == Kind::kRecordRef && n.record < 0) return "a tree's argument object";
    if ((n.kind == Kind::kNamedTuple || n.kind == Kind::kDataclass) && n.type.empty()) {
      return "a container's type";
    }
    open += n.children;
  }
  if (open != 0) return "a result's tree cut short";
  return "";
}

}  // namespace

bool same_replay(const StoredEntry& a, const StoredEntry& b) {
  return a.placeholders == b.placeholders && a.output_storages == b.output_storages &&
         a.output_tensors == b.output_tensors && a.output_tree == b.output_tree &&
         a.effects == b.effects && a.static_tensors == b.static_tensors;
}

Blob encode_entry(const StoredEntry& e) {
  ByteWriter w;
  w.u64(e.placeholders.size());
  for (const auto& p : e.placeholders) {
    write_span(w, p.span);
    w.u8(p.mutated);
    w.u8(p.chained);
    w.u8(p.site_buffer);
  }
  w.u64(e.output_storages.size());
  for (const auto& s : e.output_storages) {
    w.u8(static_cast<uint8_t>(s.source));
    write_span(w, s.span);
    w.u32(static_cast<uint32_t>(s.input));
    w.text(s.tensor);
  }
  w.u64(e.output_tensors.size());
  for (const auto& t : e.output_tensors) {
    w.u32(static_cast<uint32_t>(t.storage));
    write_ints(w, t.sizes);
    write_ints(w, t.strides);
    w.u64(static_cast<uint64_t>(t.offset));
    w.u32(static_cast<uint32_t>(t.dtype));
  }
  w.u64(e.output_tree.size());
  for (const auto& n : e.output_tree) write_node(w, n);
  w.u64(e.effects.size());
  for (const auto& effect : e.effects) {
    w.u32(static_cast<uint32_t>(effect.record));
    w.text(effect.attribute);
  }
  w.u64(e.static_tensors.size());
  for (const auto& name : e.static_tensors) w.text(name);
  w.u64(e.lane_extents.size());
  for (uint64_t extent : e.lane_extents) w.u64(extent);
  return std::move(w.out);
}

std::optional<StoredEntry> decode_entry(const Blob& bytes, std::string& why) {
  StoredEntry e;
  try {
    ByteReader r(bytes.data(), bytes.size());
    e.placeholders.resize(r.count(23));
    for (auto& p : e.placeholders) {
      p.span = read_span(r);
      p.mutated = r.u8() != 0;
      p.chained = r.u8() != 0;
      p.site_buffer = r.u8() != 0;
      if (p.chained && p.site_buffer) throw std::invalid_argument("a placeholder of two kinds");
    }
    e.output_storages.resize(r.count(33));
    for (auto& s : e.output_storages) {
      const uint8_t source = r.u8();
      if (source > static_cast<uint8_t>(StoredEntry::OutputStorage::Source::kStatic)) {
        throw std::invalid_argument("an output storage's source");
      }
      s.source = static_cast<StoredEntry::OutputStorage::Source>(source);
      s.span = read_span(r);
      s.input = static_cast<int32_t>(r.u32());
      s.tensor = r.text();
    }
    e.output_tensors.resize(r.count(32));
    for (auto& t : e.output_tensors) {
      t.storage = static_cast<int32_t>(r.u32());
      t.sizes = read_ints(r);
      t.strides = read_ints(r);
      t.offset = static_cast<int64_t>(r.u64());
      t.dtype = static_cast<int32_t>(r.u32());
    }
    e.output_tree.resize(r.count(38));
    for (auto& n : e.output_tree) n = read_node(r);
    e.effects.resize(r.count(4 + sizeof(uint64_t)));
    for (auto& effect : e.effects) {
      effect.record = static_cast<int32_t>(r.u32());
      effect.attribute = r.text();
    }
    e.static_tensors.resize(r.count(sizeof(uint64_t)));
    for (auto& name : e.static_tensors) name = r.text();
    e.lane_extents.resize(r.count(sizeof(uint64_t)));
    for (auto& extent : e.lane_extents) extent = r.u64();
    if (r.left() != 0) throw std::invalid_argument("bytes after the entry");
  } catch (const std::exception& ex) {
    why = std::string("unreadable: ") + ex.what();
    return std::nullopt;
  }
  why = inconsistency(e);
  if (!why.empty()) return std::nullopt;
  return e;
}

}  // namespace grape::core
