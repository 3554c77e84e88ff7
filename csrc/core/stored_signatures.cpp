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
  // Learned into copies, kept only where the whole signature matches.
  auto to_live = to_live_;
  auto to_stored = to_stored_;
  // A pair where either side is paired with something else already breaks the one-to-one map.
  auto pair = [](std::map<Key, int64_t>& map, const Key& key, int64_t value) {
    const auto [it, added] = map.emplace(key, value);
    return added || it->second == value;
  };
  size_t local = 0;
  for (size_t i = 0; i < stored.words.size(); ++i) {
    if (local == stored.local_positions.size() || stored.local_positions[local] != i) {
      if (stored.words[i] != live.words[i]) return false;
      continue;
    }
    const std::string& what = stored.local_descriptions[local];
    if (what.empty() || what != live.local_descriptions[local]) return false;
    ++local;
    const int64_t tag = stored.words[i - 1];  // equal in both: a value word checked above
    if (!pair(to_live, {tag, stored.words[i]}, live.words[i]) ||
        !pair(to_stored, {tag, live.words[i]}, stored.words[i])) {
      return false;
    }
  }
  to_live_ = std::move(to_live);
  to_stored_ = std::move(to_stored);
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
