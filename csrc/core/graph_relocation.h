#pragma once
// Note [Relocating stored graphs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A graph's parameters hold this process's addresses and kernel handles. A graph stored for a
// later process (the graph cache: docs/design.md) keeps each node's blob with every word that may
// hold one of them written as what it points to, not where:
//   - an address inside the arena: (lane, offset). The arena is the only memory a graph writes,
//     and its layout is grape's own, so it moves with the lanes' bases;
//   - an address inside a module tensor: (tensor name, offset), moved with the tensor;
//   - any other device address (a library's workspace or handle, a constant's storage):
//     kept as it was, and matched in the later process against a live capture of a stored shape
//     of the group, which must hold a word of that value at a place where the live graph holds
//     the same kind of address: this process's value then replaces it wherever it occurs;
//   - a kernel handle: the kernel's name (its mangled name and parameters' sizes, from the driver;
//     with its module's image's digest where that was seen: Note [Kernel images]), looked
//     up among the kernels that the later process's live captures ran, and else by the caller
//     (RestoreContext::find_kernel: cuBLAS runs another GEMM at another length, from a library
//     whose other kernels the live capture showed);
//   - another driver handle (a kernel's context): kept, and mapped as a foreign address is;
//   - a leftover (kLeftover): kernel arguments carry bytes no code set (struct padding, unused
//     slots copied from the launching code's stack or heap), which differ from process to
//     process and capture to capture. Where such a word is one no kernel can read through (the
//     caller says which: a pageable host address, an address in the arena beyond what it maps),
//     it is kept as it was and never compared. Halves of host addresses in 4-byte fields
//     (HostAddresses) are found where a live capture differs: a 4-byte unit that is the same
//     half of a host address in the storing process's bytes and in the live ones is not a
//     difference (the storing process's HostAddresses are stored with the group);
//   - anything else: a literal (sizes, strides, scalars, grid and block), kept as it was. Where
//     a live capture differs from the stored shape in literal bytes only, the caller may run the
//     live capture with the stored bytes there: the same outputs show bytes no kernel reads
//     (struct padding, unused slots a launching function left uninitialized), which a second
//     match then takes as they are (RestoreContext::unread).
// A group's bytes (group_bytes): a byte that every stored shape of a group holds alike belongs
// to the group, not to a shape: a workspace's address, a constant, a leftover the launching code
// left the same. A later process takes such bytes from the group's live capture for every shape
// it restores, and does not compare them; validation compares the bytes that differ from shape
// to shape, which must relocate. Arena and tensor words are never the group's: they relocate
// exactly, and a weight is read where it is at each restore.
// Which words may hold an address is the node's layout (the caller's: csrc/cuda knows where a
// kernel's arguments are); a word of a layout that holds none of the above is a literal, and a
// word outside every layout is a literal byte run.
//
// A later process restores a group only after one of its stored shapes was captured live and its
// blobs, written the stored way with this process's lanes, tensors and kernel names, equal the
// stored ones word for word outside the group's bytes (lanes and offsets, tensor names and
// offsets, kernel names and literals; the foreign words give the value map). A shape none of
// whose words is left unresolved is then rebuilt from the stored words; one that is (a foreign
// value or kernel no live capture showed, a tensor not there) is not restored, and captures when
// it is called.
// This file is torch-free and CUDA-free: the caller says what is an address and names kernels.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/address_ranges.h"
#include "core/host_memory.h"
#include "core/param_codec.h"

namespace grape::core {

// Where a node's blob may hold addresses and kernel handles: 8-byte words at these byte offsets,
// apart from each other (valid_layout).
struct NodeLayout {
  std::vector<uint32_t> address_words;         // ascending
  // Driver handles of the capturing process (a kernel's context): stored as they were and
  // mapped from the live capture, as foreign addresses are.
  std::vector<uint32_t> handle_words;
  std::optional<uint32_t> kernel_word;         // a kernel node's function or kernel handle
  // Where a kernel node's arguments begin (0: a node without any). Bytes before it are the
  // launch's own (grid, block), which a run with stored bytes must never change.
  uint32_t arguments_begin = 0;
  friend bool operator==(const NodeLayout& a, const NodeLayout& b) {
    return a.address_words == b.address_words && a.handle_words == b.handle_words &&
           a.kernel_word == b.kernel_word && a.arguments_begin == b.arguments_begin;
  }
};

// Whether `layout`'s words are ascending, do not overlap each other or the kernel word, and lie
// (as its arguments' beginning does) in a blob of `blob_bytes` (an empty blob: a node the shape
// lacks, which has none).
bool valid_layout(const NodeLayout& layout, size_t blob_bytes);

enum class WordKind : uint8_t { kLiteral, kArena, kTensor, kForeign, kKernel, kLeftover };
const char* word_kind_name(WordKind kind);  // for messages

// What the storing process knows about its memory and kernels.
struct StoreContext {
  std::vector<AddressRange> lanes;                      // the arena's, by lane index
  std::vector<std::pair<std::string, AddressRange>> tensors;  // module tensors by name
  std::function<bool(uint64_t)> is_device_address;      // any other memory a graph may read
  // The name of the kernel handle `handle` found at byte `at` of a node's blob.
  std::function<std::optional<std::string>(uint64_t handle, uint32_t at)> kernel_name;
  // Whether an address word's value is one no kernel reads through (may be empty: none); asked
  // of words the lanes and tensors do not name otherwise, and of arena words.
  std::function<bool(uint64_t)> is_leftover;
};

// A node's blob in the stored form: the blob with each layout word replaced by its stored word,
// and per layout word its kind.
struct StoredNode {
  NodeLayout layout;
  std::vector<WordKind> kinds;  // per layout word: address_words, handle_words, the kernel word
  Blob words;                   // the blob, layout words rewritten (kArena: lane << 40 | offset;
                                // kTensor: name index << 40 | offset; kKernel: name index)
  friend bool operator==(const StoredNode& a, const StoredNode& b) {
    return a.layout == b.layout && a.kinds == b.kinds && a.words == b.words;
  }
};

// Names the stored words refer to, shared by a group's shapes.
struct StoredNames {
  std::vector<std::string> tensors;
  std::vector<std::string> kernels;
  uint32_t intern_tensor(const std::string& name);
  uint32_t intern_kernel(const std::string& name);
  // While storing: the handle each kernel name stood for, so that two kernels of one plain name
  // (a generated kernel's, say) make the group unstorable instead of one standing for the other.
  std::vector<uint64_t> kernel_handles;
  // The images of kernels named with one (Note [Kernel images]), by digest: those the storing
  // process kept, which a later process may load.
  std::map<uint64_t, Blob> images;
};

// A shape's blobs (one per node, with its layout) in the stored form, or why they cannot be stored
// (a kernel without a name, an offset beyond what a stored word holds).
struct StoreResult {
  std::vector<StoredNode> nodes;
  std::string why_not;  // empty where stored
};
StoreResult store_shape(const std::vector<Blob>& blobs, const std::vector<NodeLayout>& layouts,
                        const StoreContext& context, StoredNames& names);

// What a later process knows: its lanes (by the stored lane index), its module tensors by name,
// and the kernels (name -> handle) and foreign values (stored -> live) its live captures showed.
// One per stored group: a foreign value is an address of the storing process, and only within
// one group (one storing process) does a value name one object.
struct RestoreContext {
  std::vector<AddressRange> lanes;
  std::unordered_map<std::string, AddressRange> tensors;
  std::unordered_map<std::string, uint64_t> kernels;
  std::unordered_map<uint64_t, uint64_t> foreign;
  std::function<bool(uint64_t)> is_device_address;
  std::function<std::optional<std::string>(uint64_t handle, uint32_t at)> kernel_name;
  // A kernel no live capture ran, by its stored name and the byte of the blob its handle sits
  // at; nothing where there is none (may be empty).
  std::function<std::optional<uint64_t>(const std::string& name, uint32_t at)> find_kernel;
  // What find_kernel answered, by name and byte (relocate_shape's): each is asked once per
  // group, not once per shape (a search through driver modules, at every decode length). A miss
  // is remembered too, a driver's passing failure among them: its shapes are captured.
  std::map<std::pair<std::string, uint32_t>, std::optional<uint64_t>> found_kernels;
  // The storing process's host addresses and this one's (both null: none are looked for), and
  // how many 4-byte units the last match took for halves of them.
  const HostAddresses* stored_host = nullptr;
  const HostAddresses* live_host = nullptr;
  size_t leftover_halves = 0;
  // Per node, the group's bytes (group_bytes; none where empty), and the live capture's blobs,
  // whose bytes there every restored shape takes (set by match_live_shape, which may be given
  // them as its `live`; with how many of them differed from the stored shape's).
  std::vector<Blob> group_bytes;
  std::vector<Blob> live_blobs;
  size_t taken_from_live = 0;
  // Per node, literal bytes a run showed no kernel reads (given; none where empty): the live
  // capture's may differ there, and restored shapes keep the stored ones. A match that fails
  // on literal bytes only says which in `differing` (per node; else empty).
  std::vector<Blob> unread;
  std::vector<Blob> differing;
  size_t unread_bytes = 0;  // of `unread`, where the live capture differed
};

// Per node, 1 at each byte that every one of `shapes` (a group's stored shapes) holding the node
// holds alike, 0 elsewhere: layout words whole or not at all, the kernel word never (a kernel is
// always matched by name), and none of a node fewer than two shapes hold.
std::vector<Blob> group_bytes(const std::vector<const std::vector<StoredNode>*>& shapes);

// Matches a live capture's blobs against the stored form of the same shape: empty where they
// agree, and then `context` has learned the live capture's kernels and foreign values; else what
// differs first (the group is then dropped).
std::string match_live_shape(const std::vector<StoredNode>& stored, const StoredNames& names,
                             const std::vector<Blob>& live, RestoreContext& context);

// `live` (a live capture's blobs) with the stored shape's bytes where `differing` (a failed
// match's RestoreContext::differing) says: the run that tells bytes no kernel reads.
std::vector<Blob> with_stored_bytes(std::vector<Blob> live, const std::vector<StoredNode>& stored,
                                    const std::vector<Blob>& differing);

// A stored shape's blobs for this process, or why not (`why_not`: a name or value that no live
// capture resolved, a lane or tensor too short). Learns `context.found_kernels`.
struct RelocateResult {
  std::vector<Blob> blobs;
  std::string why_not;
};
RelocateResult relocate_shape(const std::vector<StoredNode>& stored, const StoredNames& names,
                              RestoreContext& context);

}  // namespace grape::core
