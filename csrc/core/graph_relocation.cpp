#include "core/graph_relocation.h"

#include "core/kernel_images.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <unordered_set>

namespace grape::core {
namespace {

constexpr int kOffsetBits = 40;  // a stored (index, offset) word: offsets below 1 TiB
constexpr uint64_t kOffsetMask = (uint64_t{1} << kOffsetBits) - 1;
constexpr uint64_t kMaxIndex = (uint64_t{1} << (64 - kOffsetBits)) - 1;

uint64_t read_word(const Blob& blob, uint32_t at) {
  uint64_t word = 0;
  std::memcpy(&word, blob.data() + at, sizeof(word));
  return word;
}

void write_word(Blob& blob, uint32_t at, uint64_t word) {
  std::memcpy(blob.data() + at, &word, sizeof(word));
}

uint64_t index_and_offset(uint64_t index, uint64_t offset) {
  return (index << kOffsetBits) | offset;
}

// Ranges by begin, for finding the one holding an address (ranges do not overlap).
class RangeIndex {
 public:
  explicit RangeIndex(const std::vector<AddressRange>& ranges) {
    for (size_t i = 0; i < ranges.size(); ++i) sorted_.push_back({ranges[i], i});
    std::sort(sorted_.begin(), sorted_.end(),
              [](const Entry& a, const Entry& b) { return a.range.begin < b.range.begin; });
  }
  // The index (as given) of the range holding `address`.
  std::optional<size_t> find(uint64_t address) const {
    auto after = std::upper_bound(sorted_.begin(), sorted_.end(), address,
                                  [](uint64_t a, const Entry& e) { return a < e.range.begin; });
    if (after == sorted_.begin()) return std::nullopt;
    const Entry& e = *(after - 1);
    if (address >= e.range.end) return std::nullopt;
    return e.index;
  }

 private:
  struct Entry {
    AddressRange range;
    size_t index;
  };
  std::vector<Entry> sorted_;
};

// Every layout word of a node, in the order of StoredNode::kinds, in `words`' storage (a loop
// over nodes passes its buffer back: a shape's relocation asks for every node's).
std::vector<uint32_t> layout_words(const NodeLayout& layout, std::vector<uint32_t> words = {}) {
  words.assign(layout.address_words.begin(), layout.address_words.end());
  words.insert(words.end(), layout.handle_words.begin(), layout.handle_words.end());
  if (layout.kernel_word) words.push_back(*layout.kernel_word);
  return words;
}

// Whether layout word `i` (in layout_words' order) is one of the handle words.
bool is_handle_word(const NodeLayout& layout, size_t i) {
  return i >= layout.address_words.size() &&
         i < layout.address_words.size() + layout.handle_words.size();
}

// What an address word's value is, by this process's memory: in a lane or a module tensor (by
// its position in the ranges given), another address the driver knows, or a literal.
struct ClassifiedWord {
  WordKind kind;
  size_t index = 0;     // kArena: the lane; kTensor: the tensor's position
  uint64_t offset = 0;  // kArena, kTensor: into it; otherwise the value itself
};

class AddressClassifier {
 public:
  AddressClassifier(const std::vector<AddressRange>& lanes, std::vector<AddressRange> tensors,
                    const std::function<bool(uint64_t)>& is_device_address)
      : lanes_(lanes), tensors_(std::move(tensors)), lane_index_(lanes_),
        tensor_index_(tensors_), is_device_address_(is_device_address) {}

  ClassifiedWord classify(uint64_t value) const {
    if (auto lane = lane_index_.find(value)) {
      return {WordKind::kArena, *lane, value - lanes_[*lane].begin};
    }
    if (auto tensor = tensor_index_.find(value)) {
      return {WordKind::kTensor, *tensor, value - tensors_[*tensor].begin};
    }
    if (value != 0 && is_device_address_ && is_device_address_(value)) {
      return {WordKind::kForeign, 0, value};
    }
    return {WordKind::kLiteral, 0, value};
  }

 private:
  const std::vector<AddressRange>& lanes_;
  std::vector<AddressRange> tensors_;
  RangeIndex lane_index_, tensor_index_;
  const std::function<bool(uint64_t)>& is_device_address_;
};

// The stored word of a classified value; `stored_index`: a tensor's name index (kTensor) or the
// lane (kArena). Nothing where an index or offset does not fit the stored word.
std::optional<uint64_t> stored_word(const ClassifiedWord& c, uint64_t stored_index) {
  if (c.kind != WordKind::kArena && c.kind != WordKind::kTensor) return c.offset;
  if (c.offset > kOffsetMask || stored_index > kMaxIndex) return std::nullopt;
  return index_and_offset(stored_index, c.offset);
}

std::optional<std::string> name_kernel(
    const std::function<std::optional<std::string>(uint64_t, uint32_t)>& kernel_name,
    uint64_t handle, uint32_t at) {
  return kernel_name ? kernel_name(handle, at) : std::nullopt;
}

std::string hex(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(value));
  return text;
}

uint32_t intern(std::vector<std::string>& table, const std::string& name) {
  const auto found = std::find(table.begin(), table.end(), name);
  if (found != table.end()) return static_cast<uint32_t>(found - table.begin());
  table.push_back(name);
  return static_cast<uint32_t>(table.size() - 1);
}

}  // namespace

uint32_t StoredNames::intern_tensor(const std::string& name) { return intern(tensors, name); }
uint32_t StoredNames::intern_kernel(const std::string& name) { return intern(kernels, name); }

bool valid_layout(const NodeLayout& layout, size_t blob_bytes) {
  if (blob_bytes == 0) return true;
  if (layout.arguments_begin > blob_bytes) return false;
  // Without a sorted copy: it is checked for every node of every shape read or restored.
  const std::vector<uint32_t>& address = layout.address_words;
  auto fits = [&](uint32_t at) { return size_t{at} + sizeof(uint64_t) <= blob_bytes; };
  auto apart = [](uint32_t a, uint32_t b) {
    return (a > b ? a - b : b - a) >= sizeof(uint64_t);
  };
  for (size_t i = 0; i < address.size(); ++i) {
    if (!fits(address[i]) || (i > 0 && (address[i] <= address[i - 1] ||
                                        !apart(address[i], address[i - 1])))) {
      return false;
    }
  }
  std::vector<uint32_t> others = layout.handle_words;  // a few, apart from all the rest
  if (layout.kernel_word) others.push_back(*layout.kernel_word);
  for (size_t i = 0; i < others.size(); ++i) {
    const uint32_t at = others[i];
    if (!fits(at)) return false;
    const auto next = std::lower_bound(address.begin(), address.end(), at);
    if (next != address.end() && !apart(*next, at)) return false;
    if (next != address.begin() && !apart(*(next - 1), at)) return false;
    for (size_t j = 0; j < i; ++j) {
      if (!apart(others[j], at)) return false;
    }
  }
  return true;
}

namespace {

// Takes the stored bytes of each 4-byte unit from `from` on where `live` differs from `stored`
// and both hold the same half of a host address of their process (Note [Relocating stored
// graphs]); returns how many.
size_t take_leftover_halves(Blob& live, const Blob& stored, size_t from,
                            const HostAddresses& stored_host, const HostAddresses& live_host) {
  size_t taken = 0;
  for (size_t at = from & ~size_t{3}; at + 4 <= live.size(); at += 4) {
    uint32_t l = 0, s = 0;
    std::memcpy(&l, live.data() + at, 4);
    std::memcpy(&s, stored.data() + at, 4);
    if (l == s) continue;
    const bool high = stored_host.is_high_half(s) && live_host.is_high_half(l);
    const bool low = stored_host.is_stack_low_half(s) && live_host.is_stack_low_half(l);
    if (!high && !low) continue;
    std::memcpy(live.data() + at, &s, 4);
    ++taken;
  }
  return taken;
}

// `from`'s bytes into `to` where `mask` (of their size) is set; how many of them changed `to`.
size_t take_masked(const Blob& mask, const Blob& from, Blob& to) {
  static constexpr uint8_t kNone[sizeof(uint64_t)] = {};
  size_t changed = 0;
  for (size_t at = 0; at < to.size(); ++at) {
    // Whole words where nothing is to take: most of a restored node's group bytes are equal.
    const bool word = at % 8 == 0 && at + 8 <= to.size();
    if (word && (!std::memcmp(mask.data() + at, kNone, 8) ||
                 !std::memcmp(from.data() + at, to.data() + at, 8))) {
      at += 7;
      continue;
    }
    if (!mask[at] || to[at] == from[at]) continue;
    to[at] = from[at];
    ++changed;
  }
  return changed;
}

// Node `node`'s group bytes in `context`, where it has them for a blob of `bytes`.
const Blob* group_bytes_of(const RestoreContext& context, size_t node, size_t bytes) {
  if (node >= context.group_bytes.size() || context.group_bytes[node].size() != bytes) {
    return nullptr;
  }
  return &context.group_bytes[node];
}

// A stored kernel name (the driver's, then its parameters' sizes) short enough for a message: a
// mangled name's function, without its template arguments and parameters; another name (a
// generated kernel's) cut short.
std::string short_kernel_name(const std::string& stored) {
  const std::string name = stored.substr(0, stored.find('('));
  int status = 0;
  const std::unique_ptr<char, void (*)(void*)> demangled(
      abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status), std::free);
  std::string shown = status == 0 && demangled ? demangled.get() : name;
  if (shown.rfind("void ", 0) == 0) shown.erase(0, 5);
  shown = shown.substr(0, shown.find_first_of("<("));
  constexpr size_t kMostChars = 60;
  return shown.size() > kMostChars ? shown.substr(0, kMostChars) + "..." : shown;
}

// "node 5", with its kernel's short name where it is a kernel node of a known name.
std::string node_label(size_t node, const StoredNode& s, const StoredNames& names) {
  std::string label = "node " + std::to_string(node);
  if (!s.layout.kernel_word || s.words.size() < *s.layout.kernel_word + sizeof(uint64_t)) {
    return label;
  }
  const uint64_t index = read_word(s.words, *s.layout.kernel_word);
  if (index < names.kernels.size()) label += " (" + short_kernel_name(names.kernels[index]) + ")";
  return label;
}

// Appends the runs of bytes where `live` and `stored` (the node `label` names) differ to `out`,
// each with the 8-byte word it starts in, live and stored; `runs` counts them over all nodes, a
// few at most.
void describe_differences(const std::string& label, const Blob& live, const Blob& stored,
                          std::string& out, size_t& runs) {
  constexpr size_t kMostRuns = 12;
  for (size_t at = 0; at < live.size() && runs < kMostRuns;) {
    if (live[at] == stored[at]) {
      ++at;
      continue;
    }
    size_t end = at;
    while (end < live.size() && live[end] != stored[end]) ++end;
    const auto word_at = static_cast<uint32_t>(live.size() >= 8 ? std::min(at & ~size_t{7},
                                                                           live.size() - 8)
                                                                : 0);
    out += label + " bytes " + std::to_string(at) + "-" +
           std::to_string(end - 1);
    if (live.size() >= 8) {
      out += " (word at " + std::to_string(word_at) + ": " + hex(read_word(live, word_at)) +
             ", stored " + hex(read_word(stored, word_at)) + ")";
    }
    out += "; ";
    ++runs;
    at = end;
  }
}

// Clears `alike` wherever `other` differs from `first` (blobs of one size), a word at a time
// where they agree: most of a group's bytes do.
void mark_alike(const Blob& first, const Blob& other, Blob& alike) {
  for (size_t at = 0; at < alike.size(); ++at) {
    if (at % 8 == 0 && at + 8 <= alike.size() && !std::memcmp(&first[at], &other[at], 8)) {
      at += 7;
    } else {
      alike[at] &= first[at] == other[at];
    }
  }
}

}  // namespace

std::vector<Blob> group_bytes(const std::vector<const std::vector<StoredNode>*>& shapes) {
  size_t nodes = 0;
  for (const auto* shape : shapes) nodes = std::max(nodes, shape->size());
  std::vector<Blob> masks(nodes);
  for (size_t node = 0; node < nodes; ++node) {
    std::vector<const StoredNode*> holding;
    for (const auto* shape : shapes) {
      if (node < shape->size() && !(*shape)[node].words.empty()) holding.push_back(&(*shape)[node]);
    }
    if (holding.size() < 2) continue;
    const StoredNode& first = *holding.front();
    const std::vector<uint32_t> words = layout_words(first.layout);
    if (!valid_layout(first.layout, first.words.size()) || first.kinds.size() != words.size()) {
      continue;
    }
    Blob alike(first.words.size(), 1);
    bool same_layout = true;
    bool same_kinds = true;  // then a word's kind is the first's in every shape
    for (const StoredNode* other : holding) {
      same_layout = same_layout && other->words.size() == first.words.size() &&
                    other->layout == first.layout && other->kinds.size() == first.kinds.size();
      if (!same_layout) break;
      same_kinds = same_kinds && other->kinds == first.kinds;
      mark_alike(first.words, other->words, alike);
    }
    if (!same_layout) continue;
    Blob mask(alike.size(), 0), in_layout(alike.size(), 0);
    // A layout word whole: never the kernel (matched by name), never an arena or tensor word
    // (relocated exactly, and read where the tensor is at each restore).
    for (size_t i = 0; i < words.size(); ++i) {
      const WordKind kind = first.kinds[i];
      bool whole = !(first.layout.kernel_word && words[i] == *first.layout.kernel_word) &&
                   kind != WordKind::kArena && kind != WordKind::kTensor;
      for (const StoredNode* other : holding) {
        if (same_kinds || !whole) break;
        whole = other->kinds[i] == kind;
      }
      for (uint32_t b = words[i]; b < words[i] + sizeof(uint64_t); ++b) {
        whole = whole && alike[b];
        in_layout[b] = 1;
      }
      if (whole) std::fill_n(mask.begin() + words[i], sizeof(uint64_t), 1);
    }
    // Other bytes by 8-byte units, so that no field is taken in part.
    for (size_t unit = 0; unit < mask.size(); unit += sizeof(uint64_t)) {
      const size_t end = std::min(mask.size(), unit + sizeof(uint64_t));
      bool whole = true;
      for (size_t b = unit; b < end; ++b) whole = whole && (in_layout[b] || alike[b]);
      for (size_t b = unit; b < end && whole; ++b) {
        if (!in_layout[b]) mask[b] = 1;
      }
    }
    masks[node] = std::move(mask);
  }
  return masks;
}

const char* word_kind_name(WordKind kind) {
  switch (kind) {
    case WordKind::kLiteral: return "literal";
    case WordKind::kArena: return "arena";
    case WordKind::kTensor: return "tensor";
    case WordKind::kForeign: return "foreign";
    case WordKind::kKernel: return "kernel";
    case WordKind::kLeftover: return "leftover";
  }
  return "unknown";
}

StoreResult store_shape(const std::vector<Blob>& blobs, const std::vector<NodeLayout>& layouts,
                        const StoreContext& context, StoredNames& names) {
  StoreResult result;
  if (blobs.size() != layouts.size()) {
    result.why_not = "a layout per node is needed";
    return result;
  }
  std::vector<AddressRange> tensors;
  for (const auto& t : context.tensors) tensors.push_back(t.second);
  const AddressClassifier classifier(context.lanes, std::move(tensors), context.is_device_address);
  result.nodes.reserve(blobs.size());
  for (size_t node = 0; node < blobs.size(); ++node) {
    StoredNode stored{layouts[node], {}, blobs[node]};
    if (!valid_layout(layouts[node], blobs[node].size())) {
      result.why_not = "node " + std::to_string(node) + ": layout words that overlap or overrun";
      return result;
    }
    const std::vector<uint32_t> words = layout_words(layouts[node]);
    for (size_t i = 0; i < words.size(); ++i) {
      const uint32_t at = words[i];
      if (stored.words.empty()) {
        // A node the shape lacks (Note [Near topologies]): an empty blob, nothing to store.
        stored.kinds.push_back(WordKind::kLiteral);
        continue;
      }
      const uint64_t value = read_word(stored.words, at);
      if (is_handle_word(layouts[node], i)) {
        stored.kinds.push_back(value != 0 ? WordKind::kForeign : WordKind::kLiteral);
        continue;
      }
      if (layouts[node].kernel_word && at == *layouts[node].kernel_word) {
        const std::optional<std::string> name = name_kernel(context.kernel_name, value, at);
        if (!name) {
          result.why_not = "node " + std::to_string(node) + ": a kernel the driver does not name";
          return result;
        }
        const uint32_t index = names.intern_kernel(*name);
        names.kernel_handles.resize(names.kernels.size(), 0);
        if (names.kernel_handles[index] != 0 && names.kernel_handles[index] != value &&
            !image_of(*name)) {
          result.why_not = "two kernels are named " + *name;
          return result;
        }
        names.kernel_handles[index] = value;
        stored.kinds.push_back(WordKind::kKernel);
        write_word(stored.words, at, index);
        continue;
      }
      ClassifiedWord c = classifier.classify(value);
      // Only where nothing else names the word: a pinned buffer or a named tensor stays what it
      // is, even where host memory can read it.
      if ((c.kind == WordKind::kLiteral || c.kind == WordKind::kArena) && context.is_leftover &&
          context.is_leftover(value)) {
        c = {WordKind::kLeftover, 0, value};
      }
      const std::optional<uint64_t> word = stored_word(
          c, c.kind == WordKind::kTensor ? names.intern_tensor(context.tensors[c.index].first)
                                         : c.index);
      if (!word) {
        result.why_not = "node " + std::to_string(node) + ": an offset too large to store";
        return result;
      }
      stored.kinds.push_back(c.kind);
      write_word(stored.words, at, *word);
    }
    result.nodes.push_back(std::move(stored));
  }
  return result;
}

namespace {

struct LiteralTally {
  size_t runs = 0, halves = 0, taken = 0, unread = 0;
  bool runnable = true;  // whether a run with the stored bytes may tell what differs
};

// Node `node`'s bytes in `rewritten` (the live blob, its matched layout words in the stored
// form) against the stored ones: the group's are the live capture's, halves of host addresses
// and bytes a run showed unread are leftovers; what still differs is described and marked in
// `differing[node]`. A run may tell only bytes of a kernel's arguments (what precedes them is
// the launch's own) none of whose stored words is an address here.
void compare_literal_bytes(size_t node, const StoredNode& s, const StoredNames& names,
                           const Blob* group, const RestoreContext& context, Blob& rewritten,
                           LiteralTally& tally, std::string& differences,
                           std::vector<Blob>& differing) {
  // The group's bytes are this process's, whatever they hold.
  if (group) tally.taken += take_masked(*group, s.words, rewritten);
  const bool arguments = s.layout.kernel_word && s.layout.arguments_begin > 0;
  // Halves only from the first address word on: an int before it is a size, not a slot.
  if (rewritten != s.words && context.stored_host && context.live_host && arguments &&
      !s.layout.address_words.empty()) {
    tally.halves += take_leftover_halves(rewritten, s.words, s.layout.address_words.front(),
                                         *context.stored_host, *context.live_host);
  }
  if (node < context.unread.size() && context.unread[node].size() == rewritten.size()) {
    tally.unread += take_masked(context.unread[node], s.words, rewritten);
  }
  if (rewritten == s.words) return;
  // Literal bytes that differ are gathered over every node, so that the reason says all of them.
  describe_differences(node_label(node, s, names), rewritten, s.words, differences, tally.runs);
  Blob& marked = differing[node];
  marked.assign(rewritten.size(), 0);
  for (size_t at = 0; at < rewritten.size(); ++at) {
    if (rewritten[at] == s.words[at]) continue;
    marked[at] = 1;
    tally.runnable = tally.runnable && arguments && at >= s.layout.arguments_begin;
  }
  for (uint32_t at : s.layout.address_words) {
    bool differs = false;
    for (uint32_t b = at; b < at + sizeof(uint64_t); ++b) differs = differs || marked[b];
    const uint64_t stored_value = read_word(s.words, at);
    if (differs && context.is_device_address && context.is_device_address(stored_value)) {
      tally.runnable = false;  // a stored address could be read here: not run
    }
  }
}

}  // namespace

std::string match_live_shape(const std::vector<StoredNode>& stored, const StoredNames& names,
                             const std::vector<Blob>& live, RestoreContext& context) {
  context.differing.clear();
  if (stored.size() != live.size()) {
    return "the live graph has " + std::to_string(live.size()) + " nodes, the stored one " +
           std::to_string(stored.size());
  }
  // Learned into copies, kept only where the whole shape matches.
  auto kernels = context.kernels;
  auto foreign = context.foreign;
  std::unordered_set<uint64_t> live_foreign;
  for (const auto& [stored_value, live_value] : foreign) live_foreign.insert(live_value);
  // This process's tensors, each by the index of its name among the stored names (past the end
  // for a name not stored: its words then differ from every stored one).
  std::vector<AddressRange> tensors;
  std::vector<uint64_t> stored_index;
  for (const auto& [name, range] : context.tensors) {
    tensors.push_back(range);
    stored_index.push_back(static_cast<uint64_t>(
        std::find(names.tensors.begin(), names.tensors.end(), name) - names.tensors.begin()));
  }
  const AddressClassifier classifier(context.lanes, std::move(tensors), context.is_device_address);
  std::string differences;
  LiteralTally tally;
  std::vector<Blob> differing(stored.size());
  for (size_t node = 0; node < stored.size(); ++node) {
    const StoredNode& s = stored[node];
    // Named only for a message: demangling every node's kernel would cost each match.
    const auto where = [&] { return node_label(node, s, names); };
    if (s.words.size() != live[node].size()) return where() + ": another parameter size";
    if (!valid_layout(s.layout, s.words.size()) ||
        s.kinds.size() != layout_words(s.layout).size()) {
      return where() + ": a damaged layout";
    }
    if (s.words.empty()) continue;  // a node the shape lacks, in both
    const Blob* group = group_bytes_of(context, node, s.words.size());
    Blob rewritten = live[node];
    const std::vector<uint32_t> words = layout_words(s.layout);
    for (size_t i = 0; i < words.size(); ++i) {
      const uint32_t at = words[i];
      const uint64_t value = read_word(rewritten, at);
      const uint64_t kept = read_word(s.words, at);  // the stored word
      if (s.kinds[i] == WordKind::kKernel) {
        const std::optional<std::string> name = name_kernel(context.kernel_name, value, at);
        if (!name || kept >= names.kernels.size() || *name != names.kernels[kept]) {
          return where() + ": another kernel";
        }
        const auto [known, added] = kernels.emplace(*name, value);
        if (!added && known->second != value && !image_of(*name)) {
          return where() + ": two live kernels named " + *name;
        }
        write_word(rewritten, at, kept);
        continue;
      }
      if (s.kinds[i] == WordKind::kLeftover) {  // no code set it: whatever the live capture holds
        write_word(rewritten, at, kept);
        continue;
      }
      const ClassifiedWord c =
          is_handle_word(s.layout, i)
              ? ClassifiedWord{value != 0 ? WordKind::kForeign : WordKind::kLiteral, 0, value}
              : classifier.classify(value);
      const uint64_t index = c.kind == WordKind::kTensor ? stored_index[c.index] : c.index;
      if (group && (*group)[at]) {  // the group's: the live capture's, counted where it differs
        const bool same = c.kind == s.kinds[i] &&
                          (c.kind == WordKind::kForeign || stored_word(c, index) == kept);
        // A foreign value is still learned where it maps one to one: nodes whose layout differs
        // from shape to shape have no group bytes, and map theirs.
        if (same && c.kind == WordKind::kForeign && !foreign.count(kept) &&
            live_foreign.insert(value).second) {
          foreign.emplace(kept, value);
        }
        write_word(rewritten, at, same ? kept : value);
        continue;
      }
      if (c.kind != s.kinds[i]) {
        return where() + ": the word at byte " + std::to_string(at) + " is " +
               word_kind_name(c.kind) + " " + hex(value) + ", stored " +
               word_kind_name(s.kinds[i]) + " " + hex(kept);
      }
      if (c.kind == WordKind::kForeign) {
        const auto [it, inserted] = foreign.emplace(kept, value);
        if (!inserted && it->second != value) return where() + ": a foreign address maps twice";
        // Two objects the storing process kept apart must not become one here.
        if (inserted && !live_foreign.insert(value).second) {
          return where() + ": two foreign addresses map to one";
        }
        write_word(rewritten, at, kept);
        continue;
      }
      if (c.kind == WordKind::kLiteral) continue;  // compared with the bytes outside the layout
      const std::optional<uint64_t> word = stored_word(c, index);
      if (word != kept) {
        return where() + ": the " + word_kind_name(c.kind) + " word at byte " +
               std::to_string(at) + " is " + (word ? hex(*word) : "too large") + ", stored " +
               hex(kept);
      }
      write_word(rewritten, at, *word);
    }
    compare_literal_bytes(node, s, names, group, context, rewritten, tally, differences,
                          differing);
  }
  if (!differences.empty()) {
    if (tally.runnable) context.differing = std::move(differing);
    return "other parameters: " + differences;
  }
  context.unread_bytes = tally.unread;
  context.leftover_halves = tally.halves;
  context.taken_from_live = tally.taken;
  context.live_blobs = live;
  context.kernels = std::move(kernels);
  context.foreign = std::move(foreign);
  return {};
}

std::vector<Blob> with_stored_bytes(std::vector<Blob> live, const std::vector<StoredNode>& stored,
                                    const std::vector<Blob>& differing) {
  for (size_t node = 0; node < live.size() && node < stored.size() && node < differing.size();
       ++node) {
    if (differing[node].size() != live[node].size() ||
        stored[node].words.size() != live[node].size()) {
      continue;
    }
    take_masked(differing[node], stored[node].words, live[node]);
  }
  return live;
}

RelocateResult relocate_shape(const std::vector<StoredNode>& stored, const StoredNames& names,
                              RestoreContext& context) {
  RelocateResult result;
  result.blobs.reserve(stored.size());
  std::vector<uint32_t> words;
  for (size_t node = 0; node < stored.size(); ++node) {
    const StoredNode& s = stored[node];
    const std::string where = "node " + std::to_string(node);  // short: no allocation
    Blob blob = s.words;
    words = layout_words(s.layout, std::move(words));
    if (!valid_layout(s.layout, blob.size()) || s.kinds.size() != words.size()) {
      result.why_not = where + ": a damaged layout";
      return result;
    }
    if (blob.empty()) {
      result.blobs.push_back(std::move(blob));
      continue;
    }
    // The group's bytes come from the live capture, where it held the node.
    const Blob* group = group_bytes_of(context, node, blob.size());
    const Blob* live = node < context.live_blobs.size() &&
                               context.live_blobs[node].size() == blob.size()
                           ? &context.live_blobs[node]
                           : nullptr;
    if (!live) group = nullptr;
    for (size_t i = 0; i < words.size(); ++i) {
      const uint32_t at = words[i];
      if (group && (*group)[at]) continue;
      const uint64_t word = read_word(blob, at);
      const uint64_t index = word >> kOffsetBits, offset = word & kOffsetMask;
      switch (s.kinds[i]) {
        case WordKind::kLiteral:
        case WordKind::kLeftover:
          break;
        case WordKind::kArena: {
          if (index >= context.lanes.size() || offset >= context.lanes[index].bytes()) {
            result.why_not = where + ": an address beyond the arena's lanes";
            return result;
          }
          write_word(blob, at, context.lanes[index].begin + offset);
          break;
        }
        case WordKind::kTensor: {
          const auto found =
              index < names.tensors.size() ? context.tensors.find(names.tensors[index])
                                           : context.tensors.end();
          if (found == context.tensors.end() || offset >= found->second.bytes()) {
            result.why_not = where + ": a module tensor that is not there, or is shorter";
            return result;
          }
          write_word(blob, at, found->second.begin + offset);
          break;
        }
        case WordKind::kForeign: {
          const auto found = context.foreign.find(word);
          if (found == context.foreign.end()) {
            result.why_not = where + ": an address no live capture showed";
            return result;
          }
          write_word(blob, at, found->second);
          break;
        }
        case WordKind::kKernel: {
          if (word >= names.kernels.size()) {
            result.why_not = where + ": a damaged kernel name";
            return result;
          }
          const std::string& name = names.kernels[word];
          const auto known = context.kernels.find(name);
          std::optional<uint64_t> handle;
          if (known != context.kernels.end()) {
            handle = known->second;
          } else if (context.find_kernel) {
            const auto [found, added] = context.found_kernels.try_emplace({name, at});
            if (added) found->second = context.find_kernel(name, at);
            handle = found->second;
          }
          if (!handle) {
            result.why_not = where + ": a kernel no live capture ran nor is found: " + name;
            return result;
          }
          write_word(blob, at, *handle);
          break;
        }
      }
    }
    if (group) take_masked(*group, *live, blob);
    result.blobs.push_back(std::move(blob));
  }
  return result;
}

}  // namespace grape::core
