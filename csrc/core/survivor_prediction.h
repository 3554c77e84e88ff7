#pragma once
// Note [Outputs apart from temporaries]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A capture's small allocations would share one lane of the function's arena (csrc/torch/
// graph_arena.h), placed first fit (Note [Capture arena layout]), its outputs among its
// temporaries. Then an output that grows with the shape (the key/value cache a decode step extends
// by a token) moves every temporary placed after it, and with them the parameters of every kernel
// that touches one: consecutive decode shapes differ in most nodes, which each new shape's join
// patches into the shared executable and its first launch uploads (Note [Shared executables]). A
// temporary that grows with the shape (the cache repeated over grouped heads, an attention mask)
// does the same. The n-th small allocation of a capture is mostly the n-th of the function's next
// capture (the same code at another shape), so a small allocation goes to a lane of its own
// (kOutput) where the last capture's n-th outlived it or had another size; the temporaries left
// in the small lane, of one size at every shape, then take the same offsets from shape to shape.
// A wrong prediction costs placement, never correctness: every lane is the function's memory.
//
// This file keeps the prediction; it is torch-free and unit-tested.

#include <cstddef>
#include <optional>
#include <vector>

namespace grape::core {

class SurvivorPrediction {
 public:
  // A capture begins: it is predicted from the last capture that ended and was not forgotten.
  void begin();
  // Whether the capture's next small allocation, of `bytes`, goes apart: the last capture's
  // allocation of the same rank outlived it or had another size.
  bool next_apart(size_t bytes);
  // The capture ended: the size of each small allocation it made, in order, and whether it was
  // still allocated.
  struct Allocation {
    size_t bytes = 0;
    bool survived = false;
  };
  void end(std::vector<Allocation> allocations);
  // The capture that just ended was dropped, to be taken again along its plan (Note [Planned
  // capture layouts]): the next capture is predicted as that one was, so that it allocates in
  // each lane what the plan expects there.
  void forget() { ended_.reset(); }

 private:
  std::vector<Allocation> last_;
  std::optional<std::vector<Allocation>> ended_;
  size_t next_ = 0;
};

}  // namespace grape::core
