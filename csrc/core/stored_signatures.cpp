#include "core/stored_signatures.h"

namespace grape::core {

bool valid_stored_signature(const StoredSignature& signature) {
  if (signature.local_descriptions.size() != signature.local_positions.size()) return false;
  uint32_t previous = 0;
  for (size_t i = 0; i < signature.local_positions.size(); ++i) {
    const uint32_t at = signature.local_positions[i];
    if (at == 0 || at >= signature.words.size() || (i > 0 && at <= previous + 1)) return false;
    previous = at;
  }
  return true;
}

bool LocalWordMap::learn(const StoredSignature& stored, const StoredSignature& live) {
  if (!valid_stored_signature(stored) || !valid_stored_signature(live) ||
      stored.words.size() != live.words.size() ||
      stored.local_positions != live.local_positions) {
    return false;
  }
  std::map<Key, int64_t> learned_to_live, learned_to_stored;
  // A pair contradicts what is known, or what this call pairs elsewhere, where either side is
  // already paired with something else.
  auto contradicts = [](const std::map<Key, int64_t>& map, const Key& key, int64_t value) {
    auto it = map.find(key);
    return it != map.end() && it->second != value;
  };
  size_t local = 0;
  for (size_t i = 0; i < stored.words.size(); ++i) {
    const bool is_local = local < stored.local_positions.size() && stored.local_positions[local] == i;
    if (!is_local) {
      if (stored.words[i] != live.words[i]) return false;
      continue;
    }
    const std::string& what = stored.local_descriptions[local];
    if (what.empty() || what != live.local_descriptions[local]) return false;
    ++local;
    const int64_t tag = stored.words[i - 1];  // equal in both: a value word checked above
    const Key from{tag, stored.words[i]};
    const Key to{tag, live.words[i]};
    if (contradicts(to_live_, from, to.second) || contradicts(to_stored_, to, from.second) ||
        contradicts(learned_to_live, from, to.second) ||
        contradicts(learned_to_stored, to, from.second)) {
      return false;
    }
    learned_to_live.emplace(from, to.second);
    learned_to_stored.emplace(to, from.second);
  }
  to_live_.insert(learned_to_live.begin(), learned_to_live.end());
  to_stored_.insert(learned_to_stored.begin(), learned_to_stored.end());
  return true;
}

std::optional<std::vector<int64_t>> LocalWordMap::live_words(const StoredSignature& stored) const {
  if (!valid_stored_signature(stored)) return std::nullopt;
  std::vector<int64_t> words = stored.words;
  for (uint32_t at : stored.local_positions) {
    auto it = to_live_.find({words[at - 1], words[at]});
    if (it == to_live_.end()) return std::nullopt;
    words[at] = it->second;
  }
  return words;
}

}  // namespace grape::core
