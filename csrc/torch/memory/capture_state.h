#pragma once
// Whether a capture is underway, asked in one place. Two questions, because they differ:
//   - is the current stream capturing: what CUDA knows (a compiled function's capture, a Predicate
//     body, a user's torch.cuda.graph);
//   - are allocation routes active: a grape capture is sending some thread's allocations to its
//     arena (Note [Allocator hook]), which starts before capture_begin (the placeholders) and
//     covers the autograd engine's thread.
// This header includes nothing of grape's, so any file of csrc/torch may ask.

namespace grape {

// Whether the current CUDA stream is capturing a graph.
bool current_stream_is_capturing();
// Whether some thread has an allocation route (AllocationRoute enters and leaves them).
bool allocation_routes_active();
void enter_allocation_route();
void leave_allocation_route();
// Either of the above: memory freed now may still be recorded into a graph being built.
inline bool capture_underway() {
  return current_stream_is_capturing() || allocation_routes_active();
}

}  // namespace grape
