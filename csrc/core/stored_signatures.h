#pragma once
// Note [Signatures of stored graphs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A stored shape (the graph cache, docs/design.md) replays for calls that bring the signature it
// was captured with (Note [Call signatures]). Most of a signature's words are values, the same in
// every process: tags, dtypes, sizes, strides, numbers. The rest are local (Signature::push_local):
// ids the Flattener hands out in order of first sight to interned constants (a dict's keys, a
// record's type) and to objects keyed by identity (a module, a parameter), which another process
// may number otherwise. So a stored signature keeps its words, its local words' positions, and
// what each local word stands for in words another process can compare (Flattener::describe_local:
// an interned constant's type and repr, an identity-keyed object's type).
// A later process learns its own ids from its live calls: a live signature whose value words equal
// a stored one's, with local words at the same positions that stand for the same things, maps each
// stored local word to the live one at its position. The map is one to one per tag: two stored
// words never become one live word, nor one stored word two. A stored signature whose local words
// are all mapped has a live form, the signature of the calls its restored shape serves; one with
// a local word no live call showed is not restored yet.
// This file is torch-free.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace grape::core {

struct StoredSignature {
  std::vector<int64_t> words;
  std::vector<uint32_t> local_positions;         // ascending, each after its tag word
  std::vector<std::string> local_descriptions;   // per local position; empty: unknown
};

// Whether `signature`'s local positions are ascending, each after a word that is not local (its
// tag) and within the words, with one description each.
bool valid_stored_signature(const StoredSignature& signature);

// What a process has learned of the local words of stored signatures (one storing process's).
class LocalWordMap {
 public:
  // Whether `live` (this process's signature of a call, with its descriptions) is `stored`: equal
  // value words, local words at the same positions that stand for the same things (known,
  // equal descriptions), and none that contradicts what was learned. Where it is, learns the
  // stored local words' live ids; where not, learns nothing.
  bool learn(const StoredSignature& stored, const StoredSignature& live);
  // `stored`'s words with this process's ids, or nothing where one of its local words was never
  // learned.
  std::optional<std::vector<int64_t>> live_words(const StoredSignature& stored) const;
  size_t size() const { return to_live_.size(); }

 private:
  using Key = std::pair<int64_t, int64_t>;  // (tag, id)
  std::map<Key, int64_t> to_live_;
  std::map<Key, int64_t> to_stored_;
};

}  // namespace grape::core
