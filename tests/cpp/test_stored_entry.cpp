// Note [Stored entries]: what a restored shape needs besides its nodes, written and read back;
// damaged or inconsistent bytes are refused whole.
#include <gtest/gtest.h>

#include <cmath>

#include "core/stored_entry.h"

namespace {

using grape::core::ArenaSpan;
using grape::core::Blob;
using grape::core::decode_entry;
using grape::core::encode_entry;
using grape::core::StoredEntry;
using grape::core::StoredTreeNode;
using grape::core::StoredValue;
using Kind = StoredTreeNode::Kind;
using Source = StoredEntry::OutputStorage::Source;

StoredValue text(const std::string& s) {
  StoredValue v;
  v.kind = StoredValue::Kind::kString;
  v.text = s;
  return v;
}

// A language model's step: f(input_ids, cache) returns a dataclass (logits, the cache object
// it was given, None) and a dict {"scale": nan, "step": 3, "dtype": torch.float16, "device":
// cuda:1} beside it, in a tuple.
StoredEntry model_step() {
  StoredEntry e;
  // The ids an allocation site's buffer (site prediction), and the cache's tensor.
  e.placeholders = {{ArenaSpan{3, 0, 64}, false, false, true},
                    {ArenaSpan{2, 512, 4096}, true, true, false}};
  StoredEntry::OutputStorage pool;
  pool.source = Source::kPool;
  pool.span = {4, 1 << 20, 1 << 16};
  StoredEntry::OutputStorage input;
  input.source = Source::kInput;
  input.input = 1;
  StoredEntry::OutputStorage weight;
  weight.source = Source::kStatic;
  weight.tensor = "lm_head.weight";
  e.output_storages = {pool, input, weight};
  e.output_tensors = {{0, {1, 8, 50257}, {402056, 50257, 1}, 0, 15},
                      {1, {4096}, {1}, 0, 0},
                      {2, {50257, 768}, {768, 1}, 0, 15}};
  StoredTreeNode tuple{Kind::kTuple, "", {}, {}, {}, -1, -1, 2};
  StoredTreeNode output{Kind::kDataclass, "transformers.modeling_outputs.CausalLMOutputWithPast",
                        {text("logits"), text("past_key_values"), text("loss")},
                        {true, true, true}, {}, -1, -1, 3};
  StoredTreeNode logits{Kind::kTensor, "", {}, {}, {}, 0, -1, 0};
  StoredTreeNode cache{Kind::kRecordRef, "", {}, {}, {}, -1, 0, 0};
  StoredTreeNode none{Kind::kConstant, "", {}, {}, {}, -1, -1, 0};
  StoredValue nan;
  nan.kind = StoredValue::Kind::kFloat;
  nan.real = std::nan("");
  StoredValue three;
  three.kind = StoredValue::Kind::kInt;
  three.integer = 3;
  StoredValue half;
  half.kind = StoredValue::Kind::kDtype;
  half.text = "float16";
  StoredValue second_gpu;
  second_gpu.kind = StoredValue::Kind::kDevice;
  second_gpu.text = "cuda:1";
  StoredTreeNode dict{Kind::kDict, "", {text("scale"), text("step"), text("dtype"),
                                        text("device")}, {}, {}, -1, -1, 4};
  StoredTreeNode scale{Kind::kConstant, "", {}, {}, nan, -1, -1, 0};
  StoredTreeNode step{Kind::kConstant, "", {}, {}, three, -1, -1, 0};
  StoredTreeNode dtype{Kind::kConstant, "", {}, {}, half, -1, -1, 0};
  StoredTreeNode device{Kind::kConstant, "", {}, {}, second_gpu, -1, -1, 0};
  e.output_tree = {tuple, output, logits, cache, none, dict, scale, step, dtype, device};
  e.static_tensors = {"transformer.wte.weight", "lm_head.weight"};
  e.lane_extents = {64 << 20, 2 << 20, 0, 0, 2 << 20};
  e.effects = {{0, "keys"}, {0, "values"}};
  return e;
}

void expect_equal(const StoredEntry& a, const StoredEntry& b) {
  EXPECT_EQ(a.placeholders, b.placeholders);
  EXPECT_EQ(a.output_storages, b.output_storages);
  EXPECT_EQ(a.output_tensors, b.output_tensors);
  EXPECT_EQ(a.output_tree, b.output_tree);
  EXPECT_EQ(a.static_tensors, b.static_tensors);
  EXPECT_EQ(a.lane_extents, b.lane_extents);
  EXPECT_EQ(a.effects, b.effects);
}

TEST(StoredEntry, WhatIsWrittenIsReadBack) {
  std::string why;
  const auto read = decode_entry(encode_entry(model_step()), why);
  ASSERT_TRUE(read.has_value()) << why;
  expect_equal(*read, model_step());
  EXPECT_TRUE(read->placeholders[0].site_buffer && !read->placeholders[1].site_buffer);
  EXPECT_TRUE(read->placeholders[1].chained && !read->placeholders[0].chained);
  StoredEntry plain = model_step();
  plain.placeholders[0].site_buffer = false;
  EXPECT_FALSE(grape::core::same_replay(plain, model_step())) << "a site's buffer is not plain";
  StoredEntry both = model_step();
  both.placeholders[0].chained = true;
  EXPECT_FALSE(decode_entry(encode_entry(both), why).has_value()) << "one kind per placeholder";
  const auto empty = decode_entry(encode_entry(StoredEntry{}), why);
  EXPECT_FALSE(empty.has_value()) << "a result needs a tree";
  StoredEntry other_dtype = model_step();
  other_dtype.output_tree[8].constant.text = "bfloat16";
  EXPECT_FALSE(grape::core::same_replay(other_dtype, model_step())) << "another dtype";
  StoredEntry named_alike = model_step();
  named_alike.output_tree[8].constant.kind = StoredValue::Kind::kString;
  EXPECT_FALSE(grape::core::same_replay(named_alike, model_step())) << "a string, not a dtype";
  StoredEntry unknown_kind = model_step();
  unknown_kind.output_tree[9].constant.kind =
      static_cast<StoredValue::Kind>(static_cast<uint8_t>(StoredValue::Kind::kDevice) + 1);
  EXPECT_FALSE(decode_entry(encode_entry(unknown_kind), why).has_value()) << "a later kind";
}

TEST(StoredEntry, BytesCutShortOrLeftOverAreRefused) {
  const Blob bytes = encode_entry(model_step());
  std::string why;
  for (size_t size = 0; size < bytes.size(); ++size) {
    const Blob cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(size));
    EXPECT_FALSE(decode_entry(cut, why).has_value()) << size << " bytes";
  }
  Blob longer = bytes;
  longer.push_back(0);
  EXPECT_FALSE(decode_entry(longer, why).has_value());
  EXPECT_NE(why.find("after the entry"), std::string::npos) << why;
}

TEST(StoredEntry, AnyAlteredByteDecodesToAConsistentEntryOrIsRefused) {
  const Blob bytes = encode_entry(model_step());
  std::string why;
  for (size_t at = 0; at < bytes.size(); ++at) {
    for (uint8_t flip : {0x01, 0x80, 0xff}) {
      Blob altered = bytes;
      altered[at] ^= flip;
      const auto read = decode_entry(altered, why);
      if (!read) continue;
      for (const auto& t : read->output_tensors) {
        EXPECT_LT(static_cast<size_t>(t.storage), read->output_storages.size());
      }
      for (const auto& n : read->output_tree) {
        if (n.kind == Kind::kTensor) {
          EXPECT_LT(static_cast<size_t>(n.tensor), read->output_tensors.size());
        }
      }
    }
  }
}

TEST(StoredEntry, IndicesThatDoNotHoldTogetherAreRefused) {
  struct Case {
    const char* what;
    void (*damage)(StoredEntry&);
  };
  const Case cases[] = {
      {"an output storage's input", [](StoredEntry& e) { e.output_storages[1].input = 2; }},
      {"an output storage's tensor", [](StoredEntry& e) { e.output_storages[2].tensor.clear(); }},
      {"an output tensor's storage", [](StoredEntry& e) { e.output_tensors[0].storage = 3; }},
      {"an output tensor's strides", [](StoredEntry& e) { e.output_tensors[0].strides.pop_back(); }},
      {"an output tensor's size", [](StoredEntry& e) { e.output_tensors[1].sizes[0] = -1; }},
      {"a tree's tensor", [](StoredEntry& e) { e.output_tree[2].tensor = 3; }},
      {"a leaf with children", [](StoredEntry& e) { e.output_tree[2].children = 1; }},
      {"a container's keys", [](StoredEntry& e) { e.output_tree[5].keys.pop_back(); }},
      {"a dataclass's fields", [](StoredEntry& e) { e.output_tree[1].field_init.pop_back(); }},
      {"a container's type", [](StoredEntry& e) { e.output_tree[1].type.clear(); }},
      {"a tree's argument object", [](StoredEntry& e) { e.output_tree[3].record = -1; }},
      {"a result's tree cut short", [](StoredEntry& e) { e.output_tree.pop_back(); }},
      {"nodes after the result's tree", [](StoredEntry& e) { e.output_tree.push_back({}); }},
  };
  for (const Case& c : cases) {
    StoredEntry e = model_step();
    c.damage(e);
    std::string why;
    EXPECT_FALSE(decode_entry(encode_entry(e), why).has_value()) << c.what;
    EXPECT_EQ(why, c.what);
  }
}

}  // namespace

TEST(StoredEntry, EffectsNeedARecordAndTheirValuesInTheTree) {
  std::string why;
  StoredEntry no_record = model_step();
  no_record.effects[1].record = -1;
  EXPECT_FALSE(decode_entry(encode_entry(no_record), why));
  EXPECT_EQ(why, "an effect");
  StoredEntry flat_tree = model_step();
  flat_tree.output_tree = {flat_tree.output_tree[2]};  // a lone tensor: no effects' values
  EXPECT_FALSE(decode_entry(encode_entry(flat_tree), why));
  EXPECT_EQ(why, "a tree without the effects' values");
}
