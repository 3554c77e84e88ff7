#include "core/graph_store_file.h"

#include "core/byte_io.h"
#include "core/kernel_images.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace grape::core {
namespace {

constexpr char kMagic[] = "GRAPECACHE";  // its 10 characters, no terminator
constexpr size_t kMagicSize = sizeof(kMagic) - 1;
constexpr uint32_t kFormatVersion = 10;
// No node's parameters come near this (a kernel's arguments are at most 32 KiB): a larger
// length read from a file is damage, refused before anything is allocated for it.
constexpr uint64_t kMaxBlobBytes = 1 << 20;
// Nor does a file's whole decoding (a generation's shapes take tens of MB): patches expand, so a
// small file could otherwise ask for any amount of memory.
constexpr uint64_t kMaxDecodedBytes = uint64_t{1} << 30;

void write_names(ByteWriter& w, const std::vector<std::string>& names) {
  w.u64(names.size());
  for (const auto& n : names) w.text(n);
}

std::vector<std::string> read_names(ByteReader& r) {
  std::vector<std::string> names(r.count(sizeof(uint64_t)));
  for (auto& n : names) n = r.text();
  return names;
}

bool same_layout(const StoredNode& a, const StoredNode& b) {
  return a.layout == b.layout && a.kinds == b.kinds;
}

void write_layout(ByteWriter& w, const StoredNode& node) {
  w.u64(node.layout.address_words.size());
  for (uint32_t at : node.layout.address_words) w.u32(at);
  w.u64(node.layout.handle_words.size());
  for (uint32_t at : node.layout.handle_words) w.u32(at);
  w.u8(node.layout.kernel_word.has_value());
  w.u32(node.layout.kernel_word.value_or(0));
  w.u32(node.layout.arguments_begin);
  w.u64(node.kinds.size());
  for (WordKind k : node.kinds) w.u8(static_cast<uint8_t>(k));
}

void read_layout(ByteReader& r, StoredNode& node) {
  node.layout.address_words.resize(r.count(sizeof(uint32_t)));
  for (uint32_t& at : node.layout.address_words) at = r.u32();
  node.layout.handle_words.resize(r.count(sizeof(uint32_t)));
  for (uint32_t& at : node.layout.handle_words) at = r.u32();
  const bool has_kernel = r.u8() != 0;
  const uint32_t kernel_word = r.u32();
  if (has_kernel) node.layout.kernel_word = kernel_word;
  node.layout.arguments_begin = r.u32();
  node.kinds.resize(r.count(1));
  for (WordKind& k : node.kinds) {
    const uint8_t v = r.u8();
    if (v > static_cast<uint8_t>(WordKind::kLeftover)) throw std::invalid_argument("a word kind");
    k = static_cast<WordKind>(v);
  }
}

void write_group(ByteWriter& w, const StoredGroup& g) {
  w.u64(g.topology);
  write_names(w, g.names.tensors);
  write_names(w, g.names.kernels);
  w.u64(g.names.images.size());
  for (const auto& [digest, image] : g.names.images) {
    w.u64(digest);
    w.bytes(image.data(), image.size());
  }
  w.u64(g.host.stack.begin);
  w.u64(g.host.stack.end);
  w.u64(g.host.high_halves.size());
  for (uint32_t high : g.host.high_halves) w.u32(high);
  w.u64(g.shapes.size());
  for (const StoredShape& shape : g.shapes) {
    const StoredSignature& signature = shape.signature;
    w.u64(signature.words.size());
    for (int64_t word : signature.words) w.u64(static_cast<uint64_t>(word));
    w.u64(signature.local_positions.size());
    for (size_t i = 0; i < signature.local_positions.size(); ++i) {
      w.u32(signature.local_positions[i]);
      w.text(signature.local_descriptions[i]);
    }
    w.bytes(shape.entry.data(), shape.entry.size());
    w.u64(shape.nodes.size());
    for (size_t i = 0; i < shape.nodes.size(); ++i) {
      const StoredNode& node = shape.nodes[i];
      const bool base = &shape == &g.shapes.front() || i >= g.shapes.front().nodes.size();
      // A layout and kinds the first shape's node has too (most of them) are not written again.
      const bool first_layout = !base && same_layout(node, g.shapes.front().nodes[i]);
      w.u8(first_layout);
      if (!first_layout) write_layout(w, node);
      // The first shape's words whole, the others' as patches against them.
      const Blob words =
          base ? node.words : encode_patch(g.shapes.front().nodes[i].words, node.words);
      w.u8(base);
      w.bytes(words.data(), words.size());
    }
  }
}

StoredGroup read_group(ByteReader& r, uint64_t& decoded) {
  StoredGroup g;
  g.topology = r.u64();
  g.names.tensors = read_names(r);
  g.names.kernels = read_names(r);
  const uint64_t images = r.count(2 * sizeof(uint64_t));
  for (uint64_t i = 0; i < images; ++i) {
    const uint64_t digest = r.u64();
    uint64_t size = 0;
    const uint8_t* image = r.bytes(size);
    // A later process loads it as code: it must be the image its kernels' names say.
    if (image_digest(image, size) != digest) throw std::invalid_argument("a kernel image");
    decoded += size;
    g.names.images.emplace(digest, Blob(image, image + size));
  }
  g.host.stack.begin = static_cast<uintptr_t>(r.u64());
  g.host.stack.end = static_cast<uintptr_t>(r.u64());
  g.host.high_halves.resize(r.count(sizeof(uint32_t)));
  for (uint32_t& high : g.host.high_halves) high = r.u32();
  if (!std::is_sorted(g.host.high_halves.begin(), g.host.high_halves.end())) {
    throw std::invalid_argument("the host's high halves");
  }
  g.shapes.resize(r.count(2 * sizeof(uint64_t)));
  for (StoredShape& shape : g.shapes) {
    StoredSignature& signature = shape.signature;
    signature.words.resize(r.count(sizeof(uint64_t)));
    for (int64_t& word : signature.words) word = static_cast<int64_t>(r.u64());
    const uint64_t locals = r.count(sizeof(uint32_t) + sizeof(uint64_t));
    signature.local_positions.resize(locals);
    signature.local_descriptions.resize(locals);
    for (uint64_t i = 0; i < locals; ++i) {
      signature.local_positions[i] = r.u32();
      signature.local_descriptions[i] = r.text();
    }
    if (!valid_stored_signature(signature)) throw std::invalid_argument("a signature");
    uint64_t entry_bytes = 0;
    const uint8_t* entry = r.bytes(entry_bytes);
    decoded += entry_bytes;
    if (entry_bytes > kMaxBlobBytes || decoded > kMaxDecodedBytes) {
      throw std::invalid_argument("a shape's entry too long");
    }
    shape.entry.assign(entry, entry + entry_bytes);
    shape.nodes.resize(r.count(2 + sizeof(uint64_t)));  // two flags and a length at least
    const StoredShape& first = g.shapes.front();
    for (size_t i = 0; i < shape.nodes.size(); ++i) {
      StoredNode& node = shape.nodes[i];
      const bool first_layout = r.u8() != 0;
      if (first_layout) {  // the first shape's node's layout and kinds
        if (&shape == &first || i >= first.nodes.size()) throw std::invalid_argument("a layout");
        node.layout = first.nodes[i].layout;
        node.kinds = first.nodes[i].kinds;
      } else {
        read_layout(r, node);
      }
      const bool whole = r.u8() != 0;
      uint64_t size = 0;
      const uint8_t* words = r.bytes(size);
      if (size > kMaxBlobBytes) throw std::invalid_argument("a node's parameters too long");
      const uint64_t value_bytes = whole ? size : patched_size(words, size);
      decoded += value_bytes;
      if (value_bytes > kMaxBlobBytes || decoded > kMaxDecodedBytes) {
        throw std::invalid_argument("parameters too long");
      }
      if (whole) {
        node.words.assign(words, words + size);
      } else {
        if (&shape == &first || i >= first.nodes.size()) throw std::invalid_argument("a patch");
        apply_patch(first.nodes[i].words, words, size, node.words);
      }
      // The first shape's layout was checked with a blob of its size.
      if (first_layout && node.words.size() == first.nodes[i].words.size()) continue;
      const size_t expected = node.layout.address_words.size() +
                              node.layout.handle_words.size() +
                              (node.layout.kernel_word ? 1 : 0);
      if (node.kinds.size() != expected || !valid_layout(node.layout, node.words.size())) {
        throw std::invalid_argument("a node's layout");
      }
    }
  }
  return g;
}

// The first line of `a` that differs from `b`'s line of the same name, or one only `b` has.
std::string first_difference(const std::string& stored, const std::string& here) {
  std::istringstream s(stored), h(here);
  std::string a, b;
  while (true) {
    const bool more_a = static_cast<bool>(std::getline(s, a));
    const bool more_b = static_cast<bool>(std::getline(h, b));
    if (!more_a && !more_b) return "the keys differ";
    if (a != b) {
      return "stored with '" + (more_a ? a : std::string("(nothing)")) + "', here '" +
             (more_b ? b : std::string("(nothing)")) + "'";
    }
  }
}

}  // namespace

Blob encode_graph_file(const std::string& key, const std::vector<StoredGroup>& groups) {
  ByteWriter payload;
  payload.u64(groups.size());
  for (const StoredGroup& g : groups) write_group(payload, g);
  ByteWriter file;
  file.raw(kMagic, kMagicSize);
  file.u32(kFormatVersion);
  file.text(key);
  file.bytes(payload.out.data(), payload.out.size());
  file.u64(hash_bytes(0, file.out.data(), file.out.size()));
  return std::move(file.out);
}

DecodedGraphFile decode_graph_file(const Blob& bytes, const std::string& key) {
  DecodedGraphFile result;
  if (bytes.size() < kMagicSize + sizeof(uint32_t) + sizeof(uint64_t) ||
      std::memcmp(bytes.data(), kMagic, kMagicSize) != 0) {
    result.why = "not a grape graph cache file";
    return result;
  }
  // The version first: another format's checksum may be another hash's.
  uint32_t version = 0;
  std::memcpy(&version, bytes.data() + kMagicSize, sizeof version);
  if (version != kFormatVersion) {
    result.why =
        "format version " + std::to_string(version) + ", not " + std::to_string(kFormatVersion);
    return result;
  }
  const size_t body = bytes.size() - sizeof(uint64_t);
  uint64_t checksum = 0;
  std::memcpy(&checksum, bytes.data() + body, sizeof checksum);
  if (hash_bytes(0, bytes.data(), body) != checksum) {
    result.why = "its checksum does not match (cut short or altered)";
    return result;
  }
  try {
    ByteReader r(bytes.data() + kMagicSize + sizeof version, body - kMagicSize - sizeof version);
    const std::string stored_key = r.text();
    if (stored_key != key) {
      result.status = DecodedGraphFile::Status::kMiss;
      result.why = first_difference(stored_key, key);
      return result;
    }
    uint64_t size = 0;
    const uint8_t* payload = r.bytes(size);
    if (r.left() != 0) throw std::invalid_argument("bytes after the payload");
    ByteReader p(payload, size);
    result.groups.resize(p.count(4 * sizeof(uint64_t)));
    uint64_t decoded = 0;
    for (StoredGroup& g : result.groups) g = read_group(p, decoded);
    if (p.left() != 0) throw std::invalid_argument("bytes after the groups");
  } catch (const std::exception& e) {
    result.groups.clear();
    result.why = std::string("unreadable: ") + e.what();
    return result;
  }
  result.status = DecodedGraphFile::Status::kRead;
  return result;
}

std::string write_file_atomically(const std::string& path, const Blob& bytes) {
  // A name no other writer, in this process or another, can be using.
  std::string temporary = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(temporary.data());
  if (fd < 0) {
    return "creating a temporary file beside " + path + " failed: " + std::strerror(errno);
  }
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  // On disk before the rename makes it the file, so a crash cannot leave a named partial file.
  const bool whole = written == bytes.size() && ::fsync(fd) == 0;
  const std::string why = std::strerror(errno);
  ::close(fd);
  if (!whole) {
    std::remove(temporary.c_str());
    return "writing " + temporary + " failed: " + why;
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string failed = std::strerror(errno);
    std::remove(temporary.c_str());
    return "renaming it to " + path + " failed: " + failed;
  }
  return {};
}

Blob read_whole_file(const std::string& path, std::string& error) {
  error.clear();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) error = "opening " + path + " failed: " + std::strerror(errno);
    return {};  // no file: a miss, not an error
  }
  // Read whole at the size fstat gives (a stream's bytes one by one cost more than decoding
  // them); what follows, where the file grew, in small reads up to its end.
  struct stat about {};
  Blob bytes(::fstat(fd, &about) == 0 && about.st_size > 0 ? static_cast<size_t>(about.st_size)
                                                             : 0);
  size_t got = 0;
  uint8_t more[4096];
  while (true) {
    const bool at_size = got == bytes.size();
    const ssize_t n = at_size ? ::read(fd, more, sizeof more)
                              : ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) error = "reading " + path + " failed: " + std::strerror(errno);
    if (n <= 0) break;
    if (at_size) bytes.insert(bytes.end(), more, more + n);
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  bytes.resize(error.empty() ? got : 0);
  return bytes;
}

}  // namespace grape::core
