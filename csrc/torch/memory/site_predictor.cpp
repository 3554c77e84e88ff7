#include "torch/memory/site_predictor.h"

#include <Python.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <frameobject.h>

#include "torch/memory/capture_state.h"
#include "torch/memory/graph_pool.h"

namespace grape {

namespace {

// What every thread shares; touched with the GIL held only.
struct Sites {
  core::SiteTable table;
  std::unordered_map<int64_t, InputSites*> functions;
  int64_t next_id = 1;
  int learners = 0;  // functions recording where their inputs come from
};
Sites& sites() {
  static auto* s = new Sites();  // never destroyed: hand-outs may be freed during exit
  return *s;
}

// Read by the allocator hook without the GIL.
std::atomic<bool> hook_wanted{false};
std::atomic<bool> recording{false};
std::atomic<uint64_t> class_mask{0};

thread_local bool caller_thread = false;
thread_local int call_depth = 0;
thread_local core::OccurrenceCounter occurrences;
thread_local core::AllocationLog allocation_log;

void publish() {
  const Sites& s = sites();
  recording.store(s.learners > 0, std::memory_order_relaxed);
  class_mask.store(s.table.class_mask(), std::memory_order_relaxed);
  hook_wanted.store(s.learners > 0 || !s.table.empty(), std::memory_order_relaxed);
}

struct HandOut {
  std::shared_ptr<InputBuffer> buffer;
};

class GilGuard {
 public:
  GilGuard() : state_(PyGILState_Ensure()) {}
  ~GilGuard() { PyGILState_Release(state_); }
  GilGuard(const GilGuard&) = delete;
  GilGuard& operator=(const GilGuard&) = delete;

 private:
  PyGILState_STATE state_;
};

// The Python code position running on this thread (the GIL held).
std::optional<core::CodePosition> current_position() {
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  if (frame == nullptr) return std::nullopt;
  PyCodeObject* code = PyFrame_GetCode(frame);
#if PY_VERSION_HEX >= 0x030B0000
  const int offset = PyFrame_GetLasti(frame);
#else
  const int offset = frame->f_lasti;
#endif
  Py_DECREF(code);  // the table keeps the code objects of its sites alive
  return core::CodePosition{code, offset};
}

}  // namespace

InputSites::InputSites() : id_(sites().next_id++) { sites().functions[id_] = this; }

InputSites::~InputSites() {
  set_learning(false);
  Sites& s = sites();
  s.functions.erase(id_);
  s.table.forget(id_);
  if (Py_IsInitialized()) {
    for (const auto& site : own_sites_) Py_DECREF(static_cast<PyObject*>(const_cast<void*>(site.position.code)));
  }
  publish();
}

void InputSites::attach(std::shared_ptr<GraphPool> pool) { pool_ = std::move(pool); }

void InputSites::set_learning(bool on) {
  if (on == counted_as_learner_) return;
  counted_as_learner_ = on;
  Sites& s = sites();
  s.learners += on ? 1 : -1;
  if (s.learners == 0) allocation_log.clear();
  publish();
}

void InputSites::restart_learning() {
  budget_.restart();
  set_learning(true);
}

bool InputSites::learn(const std::vector<at::Tensor>& inputs, const std::vector<bool>& explained,
                       bool warm_up) {
  if (!budget_.learning()) return false;
  Sites& s = sites();
  int unexplained = 0;
  int learned = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    if (explained[i] || !t.is_cuda() || t.numel() == 0) continue;
    const auto site = allocation_log.find(t.storage().data(), t.storage().nbytes());
    const int size_class = core::size_class(t.storage().nbytes());
    if (!site) {
      ++unexplained;
    } else if (!s.table.assign(*site, id_)) {
      s.table.note_class(size_class);  // a known site whose allocation got no buffer
    } else {
      Py_INCREF(static_cast<PyObject*>(const_cast<void*>(site->position.code)));
      own_sites_.push_back(*site);
      s.table.note_class(size_class);
      ++learned;
      ++stats_.sites;
    }
  }
  inputs_explained_ = unexplained == 0;
  set_learning(budget_.after_call(unexplained, learned, warm_up));
  publish();
  return learned > 0;
}

std::shared_ptr<InputBuffer> InputSites::buffer_of(const at::Tensor& t) const {
  const c10::DataPtr& data = t.storage().data_ptr();
  if (data.get_deleter() != &release_hand_out) return nullptr;
  const auto& buffer = static_cast<HandOut*>(data.get_context())->buffer;
  return buffer->owner == id_ ? buffer : nullptr;
}

bool InputSites::holds(const void* ptr, size_t bytes) const {
  const auto begin = reinterpret_cast<uintptr_t>(ptr);
  for (const auto& [site, classes] : buffers_) {
    for (const auto& [size_class, buffers] : classes) {
      for (const auto& b : buffers) {
        const auto at = reinterpret_cast<uintptr_t>(b->block.get());
        if (b->in_use.load() && at < begin + bytes && begin < at + b->capacity) return true;
      }
    }
  }
  return false;
}

std::optional<c10::DataPtr> InputSites::hand_out(const core::Site& site, size_t bytes) {
  if (!pool_) return std::nullopt;
  GraphArena& arena = pool_->arena();
  if (c10::cuda::current_device() != arena.device()) return std::nullopt;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(arena.device()).stream();
  const int size_class = core::size_class(bytes);
  auto& buffers = buffers_[site][size_class];
  std::vector<bool> busy;
  for (const auto& b : buffers) busy.push_back(b->in_use.load() || b->retired.load() || b->stream != stream);
  const auto choice = core::choose_buffer(busy, kBuffersPerClass);
  if (!choice) {
    ++stats_.site_buffers_busy;
    return std::nullopt;
  }
  if (*choice == buffers.size()) {
    auto buffer = std::make_shared<InputBuffer>();
    buffer->capacity = core::class_capacity(size_class);
    try {
      buffer->block = arena.allocate(ArenaLane::kInput, buffer->capacity);
    } catch (const c10::OutOfMemoryError&) {
      return std::nullopt;  // PyTorch's allocator may still find memory
    }
    buffer->stream = stream;
    buffer->owner = id_;
    buffers.push_back(std::move(buffer));
    stats_.buffer_bytes += static_cast<int64_t>(core::class_capacity(size_class));
  }
  const auto& buffer = buffers[*choice];
  buffer->in_use.store(true);
  ++stats_.site_allocations;
  sites().table.note_class(size_class);  // a growing input looks up the next class too
  publish();
  return c10::DataPtr(buffer->block.get(), new HandOut{buffer}, &release_hand_out,
                      c10::Device(c10::DeviceType::CUDA, arena.device()));
}

CallScope::CallScope() {
  if (call_depth++ == 0) {
    caller_thread = true;
    occurrences.reset();
  }
}

CallScope::~CallScope() { --call_depth; }

bool site_prediction_wanted() {
  return hook_wanted.load(std::memory_order_relaxed) && caller_thread && call_depth == 0;
}

c10::DataPtr allocate_at_site(c10::cuda::CUDACachingAllocator::CUDAAllocator& inner,
                              size_t bytes) {
  const int size_class = core::size_class(bytes);
  const bool record = recording.load(std::memory_order_relaxed);
  if (bytes == 0 ||
      (!record && !((class_mask.load(std::memory_order_relaxed) >> size_class) & 1U))) {
    return inner.allocate(bytes);
  }
  if (!Py_IsInitialized()) return inner.allocate(bytes);

  std::optional<core::Site> site;
  {
    GilGuard gil;
    if (auto position = current_position()) {
      site = core::Site{*position, occurrences.next(*position, size_class)};
      Sites& s = sites();
      if (auto target = s.table.target_of(*site)) {
        auto it = s.functions.find(*target);
        // Memory allocated under a stream capture (a user's torch.cuda.graph) is its pool's.
        if (it != s.functions.end() && !current_stream_is_capturing()) {
          if (auto data = it->second->hand_out(*site, bytes)) {
            // Recorded too: a function compiled again learns the site from its old owner.
            if (record) allocation_log.record(data->get(), bytes, *site);
            return std::move(*data);
          }
        }
      }
    }
  }
  c10::DataPtr data = inner.allocate(bytes);
  if (record && site) allocation_log.record(data.get(), bytes, *site);
  return data;
}

void release_hand_out(void* context) {
  auto* hand_out = static_cast<HandOut*>(context);
  hand_out->buffer->in_use.store(false);
  delete hand_out;
}

void retire_hand_out(const c10::DataPtr& data) {
  if (data.get_deleter() != &release_hand_out) return;
  static_cast<HandOut*>(data.get_context())->buffer->retired.store(true);
}

}  // namespace grape
