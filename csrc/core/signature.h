#pragma once
// Note [Call signatures]
// ~~~~~~~~~~~~~~~~~~~~~~
// A compiled function keeps one graph per call signature. The signature is everything that can
// change what a capture records: the tree structure of the arguments, every tensor's dtype,
// device, sizes, strides and requires_grad, the values of non-tensor leaves, and the global state
// that changes which kernels run (grad mode, autocast). The Python layer
// (csrc/torch/python/pytree.cpp) encodes all of it as a flat sequence of 64-bit words; this file
// only stores, hashes and compares such sequences, so it has no dependency on torch or Python and
// is tested on its own.
//
// Values that do not fit a word (strings, enums, large ints, other hashable objects) are interned
// by the Python layer into small integers that are unique for the lifetime of the compiled function,
// so two signatures are equal exactly when their words are equal: there is no hash-only match.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace grape::core {

// The first word of each node of the argument tree.
enum class Tag : int64_t {
  kTuple = 1,
  kList,
  kDict,
  kDataclass,
  kNamedTuple,
  kTensor,
  kNone,
  kBool,
  kInt,
  kFloat,
  kInterned,  // a hashable constant, by interned id
  kObject,    // an object keyed by identity (held alive by the compiled function)
  kModule,    // an nn.Module keyed by identity; its parameters and buffers are static
  kGlobalState,
  kRecord,     // an argument object that holds tensors, by type and attributes
  kRecordRef,  // an argument object seen earlier in the same call, by its index
  kStaticTensor,  // a leaf tensor that requires grad (a parameter), by identity; static state
};

class Signature {
 public:
  void clear() {
    words_.clear();
    local_positions_.clear();
    hash_ = 0;
  }
  void reserve(size_t n) { words_.reserve(n); }
  void push(int64_t word) { words_.push_back(word); }
  void push(Tag tag) { words_.push_back(static_cast<int64_t>(tag)); }
  // A word that names something by an id of this process (an interned constant's, an object's
  // identity): another process may number it otherwise (Note [Signatures of stored graphs]).
  // It follows its tag.
  void push_local(int64_t id) {
    local_positions_.push_back(static_cast<uint32_t>(words_.size()));
    words_.push_back(id);
  }
  // Drops the words after the first `n` (before finish()).
  void truncate(size_t n) {
    words_.resize(n < words_.size() ? n : words_.size());
    while (!local_positions_.empty() && local_positions_.back() >= words_.size()) {
      local_positions_.pop_back();
    }
  }
  // Must be called once all words are pushed; equality and hashing use the cached hash.
  void finish();

  uint64_t hash() const { return hash_; }
  const std::vector<int64_t>& words() const { return words_; }
  // The positions of the words pushed with push_local, ascending.
  const std::vector<uint32_t>& local_positions() const { return local_positions_; }
  size_t size() const { return words_.size(); }

  friend bool operator==(const Signature& a, const Signature& b) {
    return a.hash_ == b.hash_ && a.words_ == b.words_;
  }
  friend bool operator!=(const Signature& a, const Signature& b) { return !(a == b); }

 private:
  std::vector<int64_t> words_;
  std::vector<uint32_t> local_positions_;  // not part of equality: the words decide
  uint64_t hash_ = 0;
};

struct SignatureHash {
  size_t operator()(const Signature& s) const { return static_cast<size_t>(s.hash()); }
};

// 64-bit mixing of a word sequence (multiply-xorshift per word, then a final avalanche).
uint64_t hash_words(const int64_t* words, size_t n);

}  // namespace grape::core
