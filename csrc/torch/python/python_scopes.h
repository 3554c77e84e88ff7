#pragma once
// Calls into Python, and Python state held for the duration of a C++ scope (a capture, a warm-up
// call).

#include <pybind11/pybind11.h>

#include <utility>

namespace grape {

namespace py = pybind11;

// fn(*args, **kwargs), raising py::error_already_set as pybind11 does, without its overhead.
inline py::object call_python(const py::object& fn, const py::args& args,
                              const py::kwargs& kwargs) {
  PyObject* result = PyObject_Call(fn.ptr(), args.ptr(), kwargs.ptr());
  if (result == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(result);
}

// A Python context manager, entered for this object's lifetime.
class EnteredContext {
 public:
  explicit EnteredContext(py::object context) : context_(std::move(context)) {
    context_.attr("__enter__")();
  }
  ~EnteredContext() {
    try {
      context_.attr("__exit__")(py::none(), py::none(), py::none());
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable(__func__);
    }
  }
  EnteredContext(const EnteredContext&) = delete;
  EnteredContext& operator=(const EnteredContext&) = delete;
  const py::object& get() const { return context_; }

 private:
  py::object context_;
};

// Python's cyclic garbage collector paused for this object's lifetime: a collection during a
// capture may destroy another compiled function's graphs and memory, whose CUDA calls
// (synchronizing ones among them) would invalidate the capture. torch.cuda.graph collects
// before capturing for the same reason; a pause costs nothing per capture.
class GarbageCollectionPaused {
 public:
  GarbageCollectionPaused() : gc_(py::module_::import("gc")) {
    was_enabled_ = gc_.attr("isenabled")().cast<bool>();
    if (was_enabled_) gc_.attr("disable")();
  }
  ~GarbageCollectionPaused() {
    if (!was_enabled_) return;
    try {
      gc_.attr("enable")();
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable(__func__);
    }
  }
  GarbageCollectionPaused(const GarbageCollectionPaused&) = delete;
  GarbageCollectionPaused& operator=(const GarbageCollectionPaused&) = delete;

 private:
  py::module_ gc_;
  bool was_enabled_ = false;
};

}  // namespace grape
