// Graph cache files (Note [Graph cache files]): what is written is read back, and a file of
// another key, cut short, altered or of another format is a miss or unreadable, never wrong.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "core/graph_store_file.h"
#include "core/kernel_images.h"

using grape::core::Blob;
using grape::core::decode_graph_file;
using grape::core::DecodedGraphFile;
using grape::core::encode_graph_file;
using grape::core::read_whole_file;
using grape::core::StoredGroup;
using grape::core::StoredNode;
using grape::core::StoredShape;
using grape::core::StoredSignature;
using grape::core::WordKind;
using grape::core::write_file_atomically;

namespace {

const std::string kKey = "grape=1\ntorch=2.11.0+cu130\ngpu=NVIDIA H200\ncode=5f2a\n";

StoredNode node(uint64_t arena_word, uint32_t grid, bool kernel) {
  StoredNode n;
  n.layout.address_words = {8};
  if (kernel) n.layout.handle_words = {24};
  if (kernel) n.layout.kernel_word = 0;
  if (kernel) n.layout.arguments_begin = 8;
  n.words.assign(32, 0);
  std::memcpy(n.words.data() + 8, &arena_word, sizeof arena_word);
  std::memcpy(n.words.data() + 16, &grid, sizeof grid);
  n.kinds = {kernel ? WordKind::kArena : WordKind::kLeftover};  // a word no code set
  if (kernel) n.kinds.push_back(WordKind::kForeign);
  if (kernel) n.kinds.push_back(WordKind::kKernel);
  return n;
}

// Two groups: one of three shapes of two nodes (the second node's words differ by shape), one of
// a single shape with an empty (absent) node.
std::vector<StoredGroup> groups() {
  StoredGroup a;
  a.topology = 0x1234;
  a.names.kernels = {"m:gemm", "m:softmax"};
  a.names.tensors = {"model.wte.weight"};
  const Blob image = {0x7f, 'E', 'L', 'F', 2, 1, 0, 9};
  a.names.images.emplace(grape::core::image_digest(image.data(), image.size()), image);
  a.host.stack = {0x7ffd'2236'0000, 0x7ffd'2238'1000};
  a.host.high_halves = {0x55d2, 0x7f3a, 0x7ffd};
  for (uint32_t n : {3u, 4u, 9u}) {
    // A module by identity (id 0, a local word), then a size; the entry's bytes are the runtime's.
    StoredSignature signature{{13, 0, 6, n}, {1}, {"identity torch.nn.Linear"}};
    a.shapes.push_back({signature, {node(4096, 8, true), node(4096 * n, n, true)},
                        {static_cast<uint8_t>(n), 0xEE}});
  }
  // A shape whose second node's word is of another kind than the first shape's: its layout and
  // kinds are written whole, the others' by a byte.
  a.shapes.push_back(a.shapes.back());
  a.shapes.back().nodes[1].kinds[0] = WordKind::kLiteral;
  StoredGroup b;
  b.topology = 0x99;
  StoredNode absent = node(0, 0, false);
  absent.words.clear();
  b.shapes.push_back({StoredSignature{{7}, {}, {}}, {node(64, 1, false), absent}, {}});
  return {a, b};
}

void expect_equal(const std::vector<StoredGroup>& got, const std::vector<StoredGroup>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t g = 0; g < got.size(); ++g) {
    EXPECT_EQ(got[g].topology, want[g].topology);
    EXPECT_EQ(got[g].host, want[g].host);
    EXPECT_EQ(got[g].names.kernels, want[g].names.kernels);
    EXPECT_EQ(got[g].names.tensors, want[g].names.tensors);
    EXPECT_EQ(got[g].names.images, want[g].names.images);
    ASSERT_EQ(got[g].shapes.size(), want[g].shapes.size());
    for (size_t s = 0; s < got[g].shapes.size(); ++s) {
      EXPECT_EQ(got[g].shapes[s].signature.words, want[g].shapes[s].signature.words);
      EXPECT_EQ(got[g].shapes[s].signature.local_positions,
                want[g].shapes[s].signature.local_positions);
      EXPECT_EQ(got[g].shapes[s].signature.local_descriptions,
                want[g].shapes[s].signature.local_descriptions);
      EXPECT_EQ(got[g].shapes[s].entry, want[g].shapes[s].entry);
      EXPECT_EQ(got[g].shapes[s].nodes, want[g].shapes[s].nodes) << "group " << g << " shape " << s;
    }
  }
}

std::string temporary_directory(const char* name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("grape-test-" + std::string(name) + "-" + std::to_string(::testing::UnitTest::
                                                        GetInstance()->random_seed()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace

TEST(GraphStoreFile, WhatIsWrittenIsReadBack) {
  const Blob bytes = encode_graph_file(kKey, groups());
  const DecodedGraphFile read = decode_graph_file(bytes, kKey);
  ASSERT_EQ(read.status, DecodedGraphFile::Status::kRead) << read.why;
  expect_equal(read.groups, groups());
}

TEST(GraphStoreFile, AnotherKeyIsAMissNamingTheLineThatDiffers) {
  const Blob bytes = encode_graph_file(kKey, groups());
  std::string other = kKey;
  other.replace(other.find("2.11.0+cu130"), 12, "2.14.1+cu130");
  const DecodedGraphFile read = decode_graph_file(bytes, other);
  EXPECT_EQ(read.status, DecodedGraphFile::Status::kMiss);
  EXPECT_NE(read.why.find("torch=2.11.0+cu130"), std::string::npos) << read.why;
  EXPECT_NE(read.why.find("torch=2.14.1+cu130"), std::string::npos) << read.why;
  EXPECT_TRUE(read.groups.empty());
}

TEST(GraphStoreFile, AFileCutShortOrAlteredAnywhereIsUnreadable) {
  const Blob bytes = encode_graph_file(kKey, groups());
  for (size_t size = 0; size < bytes.size(); size += 7) {
    const Blob cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(size));
    const DecodedGraphFile read = decode_graph_file(cut, kKey);
    EXPECT_EQ(read.status, DecodedGraphFile::Status::kUnreadable) << size << " bytes";
    EXPECT_TRUE(read.groups.empty());
  }
  for (size_t at = 0; at < bytes.size(); at += 5) {
    Blob altered = bytes;
    altered[at] ^= 0x10;
    const DecodedGraphFile read = decode_graph_file(altered, kKey);
    EXPECT_EQ(read.status, DecodedGraphFile::Status::kUnreadable) << "byte " << at;
    EXPECT_FALSE(read.why.empty());
  }
}

// `bytes` with its checksum made right again after an edit: damage the checksum cannot see.
Blob with_checksum(Blob bytes) {
  const size_t body = bytes.size() - sizeof(uint64_t);
  const uint64_t h = grape::core::hash_bytes(0, bytes.data(), body);
  std::memcpy(bytes.data() + body, &h, sizeof h);
  return bytes;
}

TEST(GraphStoreFile, AnotherFormatOrBadLengthsBehindAGoodChecksumAreUnreadable) {
  const Blob bytes = encode_graph_file(kKey, groups());
  Blob version = bytes;
  version[10] = 99;  // the format version follows the 10-byte magic
  DecodedGraphFile read = decode_graph_file(with_checksum(version), kKey);
  EXPECT_EQ(read.status, DecodedGraphFile::Status::kUnreadable);
  EXPECT_NE(read.why.find("format version 99"), std::string::npos) << read.why;
  // Huge values written at every byte of the payload, one place at a time: each either reads
  // (it hit a literal) or is refused, never allocated or read past the end.
  const size_t payload = 10 + 4 + 8 + kKey.size() + 8;
  for (size_t at = payload; at + 8 <= bytes.size() - 8; ++at) {
    for (uint64_t huge : {uint64_t{1} << 60, uint64_t{0xffffffffffffffff}}) {
      Blob damaged = bytes;
      std::memcpy(damaged.data() + at, &huge, sizeof huge);
      read = decode_graph_file(with_checksum(damaged), kKey);
      if (read.status == DecodedGraphFile::Status::kRead) continue;
      EXPECT_EQ(read.status, DecodedGraphFile::Status::kUnreadable) << "byte " << at;
      EXPECT_TRUE(read.groups.empty());
    }
  }
}

TEST(GraphStoreFile, AKernelImageThatIsNotItsDigestsIsUnreadable) {
  // A later process would load it as code: behind a good checksum it must still be what its
  // kernels' names say.
  std::vector<StoredGroup> stored = groups();
  const Blob image = stored[0].names.images.begin()->second;
  const Blob bytes = encode_graph_file(kKey, stored);
  const auto at = std::search(bytes.begin(), bytes.end(), image.begin(), image.end());
  ASSERT_NE(at, bytes.end());
  Blob damaged = bytes;
  damaged[static_cast<size_t>(at - bytes.begin()) + image.size() - 1] ^= 1;
  const DecodedGraphFile read = decode_graph_file(with_checksum(damaged), kKey);
  EXPECT_EQ(read.status, DecodedGraphFile::Status::kUnreadable);
  EXPECT_NE(read.why.find("a kernel image"), std::string::npos) << read.why;
}

TEST(GraphStoreFile, WritesAreWholeEvenWhenTwoWritersRace) {
  const std::string dir = temporary_directory("race");
  const std::string path = dir + "/f.grape";
  std::string error;
  EXPECT_TRUE(read_whole_file(path, error).empty());
  EXPECT_EQ(error, "") << "no file is a miss, not an error";
  std::vector<StoredGroup> small = groups();
  small.pop_back();
  const Blob one = encode_graph_file(kKey, groups()), other = encode_graph_file(kKey, small);
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t) {
    writers.emplace_back([&, t] {
      std::string read_error;
      for (int i = 0; i < 50; ++i) {
        EXPECT_EQ(write_file_atomically(path, t % 2 ? one : other), "");
        const Blob read = read_whole_file(path, read_error);
        EXPECT_EQ(read_error, "");
        EXPECT_EQ(decode_graph_file(read, kKey).status, DecodedGraphFile::Status::kRead);
      }
    });
  }
  for (auto& w : writers) w.join();
  const Blob last = read_whole_file(path, error);
  EXPECT_TRUE(last == one || last == other);
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    (void)entry;
    ++files;
  }
  EXPECT_EQ(files, 1u) << "a temporary file was left behind";
  std::filesystem::remove_all(dir);
}
