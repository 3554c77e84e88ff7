#pragma once
// Note [Allocation-site prediction]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Chain prediction (torch/alias_prediction.cpp) covers inputs that are an earlier replay's outputs.
// Inputs that the caller's own code builds between calls (`ids = torch.cat([ids, tok], 1)`,
// `x = batch.to("cuda")`) are fresh allocations of PyTorch's caching allocator, so each replay would
// copy them into the graph's placeholder. The seeds' observation: the Python code position that
// made an input's memory once makes the next call's input too. So:
//   1. Learning. While a compiled function has inputs whose origin it does not know, the allocator
//      hook records the code position of each CUDA allocation the caller's thread makes between
//      compiled calls: (code object, bytecode offset, occurrence), the occurrence being how many
//      allocations of the same size class that position made since the thread's last compiled
//      call (counting within a class keeps it the same whether or not the hook looked at the
//      position's other allocations, which it skips once learning is over). At the next call, an
//      input whose storage one of those allocations made marks that site as feeding the function.
//      Recording stops once every input is explained, resumes when a replay has to copy an input,
//      and stops for good after a few windows that explain nothing (class LearningBudget).
//   2. Prediction. An allocation at a known site gets a buffer of the function's own: a block of
//      its arena's input lane, one of at most kBuffersPerClass per site and power-of-two size
//      class (two, because the previous input is usually still alive when the next one is made:
//      `torch.cat([ids, tok])` reads it). The first free buffer of the class is handed out.
//   3. In place. A capture whose input is such a buffer uses it as the graph's placeholder, as it
//      does for a chained output; a graph whose placeholder is another buffer gets a variant
//      (the runtime's chain variants). Buffers are reused, so the graphs of every shape a site
//      serves read the same few addresses, and later calls find their input in place.
// Every prediction is checked at replay by pointer equality. A miss copies the input into the
// placeholder, and never into a buffer that another tensor still holds (that replay runs eagerly).
// Allocations the hook cannot attribute (another thread, a stream capture, no Python frame) and
// classes no site has served are passed to PyTorch's allocator after one check each.
//
// This file holds the torch-free parts: keys, size classes, occurrence counting, the log of
// recorded allocations, the table of sites and the learning budget.
// csrc/torch/memory/site_predictor.cpp reads Python frames and hands out the buffers.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace grape::core {

struct CodePosition {
  const void* code = nullptr;  // the Python code object
  int offset = -1;             // bytecode offset of the instruction that allocated
  bool operator==(const CodePosition& o) const { return code == o.code && offset == o.offset; }
};

struct Site {
  CodePosition position;
  int occurrence = 0;  // allocations this position made earlier since the last compiled call
  bool operator==(const Site& o) const {
    return position == o.position && occurrence == o.occurrence;
  }
};

struct CodePositionHash {
  size_t operator()(const CodePosition& p) const;
};
struct SiteHash {
  size_t operator()(const Site& s) const;
};

// A compiled function's counters.
struct SiteStats {
  int64_t sites = 0;              // allocation sites the function learned
  int64_t site_allocations = 0;   // allocations served from the function's input buffers
  int64_t site_buffers_busy = 0;  // allocations at a known site that found no free buffer
  int64_t buffer_bytes = 0;       // capacity of the input buffers
};

// Buffers come in power-of-two sizes from 512 bytes.
constexpr int kMinSizeClass = 9;
constexpr int kSizeClasses = 64;
int size_class(size_t bytes);
size_t class_capacity(int size_class);

// Allocations per code position since the last compiled call of the thread.
class OccurrenceCounter {
 public:
  // The occurrence of this allocation of `size_class` at `position` (0 for the first), counting
  // it.
  int next(const CodePosition& position, int size_class);
  void reset() { counts_.clear(); }

 private:
  std::unordered_map<CodePosition, std::unordered_map<int, int>, CodePositionHash> counts_;
};

// The most recent allocations recorded while a function learns: where each storage was made.
class AllocationLog {
 public:
  static constexpr size_t kCapacity = 1024;
  void record(const void* ptr, size_t bytes, const Site& site);
  // The site of the latest allocation recorded at `ptr` with `bytes` bytes.
  std::optional<Site> find(const void* ptr, size_t bytes) const;
  void clear();
  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    const void* ptr;
    size_t bytes;
    Site site;
  };
  std::vector<Entry> entries_;  // a ring once full
  size_t next_ = 0;
};

// Which compiled function (an opaque id) each site feeds, and the size classes worth a lookup.
class SiteTable {
 public:
  // Makes `site` feed `target`, taking it from any other target (the function that saw the
  // site's allocation last is the one it feeds: a function compiled again replaces the old one).
  // Returns false when it fed `target` already.
  bool assign(const Site& site, int64_t target);
  std::optional<int64_t> target_of(const Site& site) const;
  // Forgets every site of `target`.
  void forget(int64_t target);
  // An allocation of `size_class` at a site worth looking up: the classes sites have been seen
  // with, and their neighbours (a growing input moves to the next class).
  void note_class(int size_class);
  bool worth_lookup(int size_class) const { return (class_mask_ >> size_class) & 1U; }
  uint64_t class_mask() const { return class_mask_; }
  size_t size() const { return sites_.size(); }
  bool empty() const { return sites_.empty(); }

 private:
  std::unordered_map<Site, int64_t, SiteHash> sites_;
  uint64_t class_mask_ = 0;
};

// When a function records allocations to find where its inputs come from. It starts recording.
// A call whose inputs are all explained once it learned something stops it (satisfied), and so do
// kQuietCalls calls with nothing to learn; a replay that copies an input of unknown origin resumes
// it. A function that learns nothing in kFruitlessWindows windows that had inputs of unknown
// origin stops for good: their origin is not an allocation between calls (a tensor kept across
// calls, another thread).
class LearningBudget {
 public:
  static constexpr int kFruitlessWindows = 4;
  static constexpr int kQuietCalls = 1024;
  // After a call while learning: `unexplained` inputs of unknown origin remain, `learned` sites
  // were assigned. A warm-up call (run eagerly) does not count as fruitless: its inputs include
  // the previous eager run's outputs, which no allocation site explains. Returns whether to keep
  // recording until the next call.
  bool after_call(int unexplained, int learned, bool warm_up = false);
  // A replay had to copy an input: record again, unless the budget is spent.
  bool resume();
  bool learning() const { return learning_; }
  bool exhausted() const { return fruitless_ >= kFruitlessWindows; }
  void restart() {
    fruitless_ = 0;
    quiet_ = 0;
    learning_ = true;
  }

 private:
  int fruitless_ = 0;
  int quiet_ = 0;
  bool learning_ = true;
};

// The buffer of a site and size class that the next allocation gets: the first one not `busy`,
// else a new one while there are fewer than `max_buffers`. nullopt: none (the allocation is left
// to PyTorch's allocator). Returns busy.size() for "create a new buffer".
std::optional<size_t> choose_buffer(const std::vector<bool>& busy, size_t max_buffers);

}  // namespace grape::core
