#pragma once
// Note [Graph cache files]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// What a compiled function stores for later processes (its topology groups' shapes in the stored
// form of Note [Relocating stored graphs]) goes to one file, laid out as:
//   magic "GRAPECACHE", format version, the key (text), the payload's length, the payload, and a
//   checksum (hash_bytes) of everything before it.
// The key is the caller's: lines "name=value" for everything that must be equal for a stored graph
// to be right here (versions of torch, CUDA, cuDNN and the driver, the GPU, the rank, the
// function's code and its modules' structure). A file whose key differs is a miss, and the first
// line that differs says why; a file cut short, altered, or of another format version is
// unreadable, with the reason, and is ignored. Nothing in a file is host code: the payload is
// numbers, names and parameter bytes, read with every length checked, and the device code of
// generated kernels (Note [Kernel images]), each checked against its digest, which a later
// process loads as the library that generated it would: a cache directory is trusted as a model
// file is.
// A file is written to a temporary name in its directory (mkstemp), flushed to disk and renamed
// over the old one, so a reader sees a whole file, old or new, and two processes may write one
// directory at once. A file decoding to more than 1 GiB is refused: its lengths are damage.
// Within the payload a shape's node words are patches against the group's first shape (the
// parameter codec's), since most of a node's words are equal from shape to shape, and a node
// whose layout and word kinds are the first shape's node's says so in a byte instead.
// This file is torch-free and CUDA-free.

#include <cstdint>
#include <string>
#include <vector>

#include "core/graph_relocation.h"
#include "core/param_codec.h"
#include "core/stored_signatures.h"

namespace grape::core {

struct StoredShape {
  StoredSignature signature;  // Note [Signatures of stored graphs]
  std::vector<StoredNode> nodes;
  // What a replay needs beyond the nodes (where the inputs go, how the outputs are rebuilt), in
  // the runtime's encoding: bytes to this file.
  Blob entry;
};

struct StoredGroup {
  uint64_t topology = 0;  // the live capture's must be equal
  StoredNames names;
  std::vector<StoredShape> shapes;  // the first is every other's patch base
  HostAddresses host;  // the storing process's: halves of them in its bytes are leftovers
};

// The file's bytes for `groups` under `key`.
Blob encode_graph_file(const std::string& key, const std::vector<StoredGroup>& groups);

struct DecodedGraphFile {
  enum class Status { kRead, kMiss, kUnreadable };
  Status status = Status::kUnreadable;
  std::string why;  // kMiss: the first key line that differs; kUnreadable: what is wrong
  std::vector<StoredGroup> groups;
};
DecodedGraphFile decode_graph_file(const Blob& bytes, const std::string& key);

// Writes `bytes` to `path` through a temporary file in the same directory and a rename; returns
// what failed, or nothing.
std::string write_file_atomically(const std::string& path, const Blob& bytes);
// The bytes of `path`; `error` says why not (nothing where the file does not exist: a miss).
Blob read_whole_file(const std::string& path, std::string& error);

}  // namespace grape::core
