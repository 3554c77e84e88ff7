// grape._C: the runtime behind grape.compile, and introspection used by the tests.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>

#include "core/forked.h"
#include "core/replay_plan.h"
#include "torch/call_lock.h"
#include "torch/python/module_tensors.h"
#include "torch/python/optimizer_settings.h"
#include "torch/python/pytree.h"
#include "torch/python/side_effects.h"
#include "torch/runtime.h"

#ifdef GRAPE_WITH_CUDA
#include <torch/csrc/utils/pybind.h>  // at::Tensor arguments

#include "cuda/module_images.h"
#include "torch/memory/allocator_hook.h"
#include "torch/memory/capture_state.h"
#include "torch/graphs/conditional.h"
#endif

namespace py = pybind11;
using grape::Runtime;

namespace {

// The call lock as a context manager, for tests of its contract (Note [One compiled call at a
// time]): `with _C._CallLock() as held:`.
struct CallLockContext {
  bool unless_busy = false;
  std::unique_ptr<grape::CallLock> lock;
};

// Runtime references Python objects (the function, a module that may reference the compiled
// function back); let the garbage collector see them so such cycles are collected.
void setup_gc(PyHeapTypeObject* heap_type) {
  auto* type = &heap_type->ht_type;
  type->tp_flags |= Py_TPFLAGS_HAVE_GC;
  // Not visiting Py_TYPE(self): instances are of Python subclasses (grape.CompiledFunction), whose
  // traverse already visits the type; a second visit would over-count it.
  type->tp_traverse = [](PyObject* self, visitproc visit, void* arg) -> int {
    if (!py::detail::is_holder_constructed(self)) return 0;
    return py::cast<Runtime&>(py::handle(self)).traverse(visit, arg);
  };
  type->tp_clear = [](PyObject* self) -> int {
    if (py::detail::is_holder_constructed(self)) {
      py::cast<Runtime&>(py::handle(self)).clear_references();
    }
    return 0;
  };
}

// The runtime behind grape.compile, its call lock and the fork check.
void bind_runtime(py::module_& m) {
  py::class_<Runtime>(m, "Runtime", py::custom_type_setup(setup_gc))
      .def(py::init<py::object, int, bool, py::object, bool, const std::string&,
                    std::optional<size_t>, std::optional<size_t>, py::object>(),
           py::arg("fn"), py::arg("warmup"), py::arg("warmup_each_signature"),
           py::arg("static_module"), py::arg("alias_prediction"), py::arg("sharing"),
           py::arg("executable_cache"), py::arg("memory_budget"), py::arg("hooks"))
      .def("__call__", &Runtime::call)
      .def("_runtime_stats", &Runtime::stats)
      .def("_entries", &Runtime::entries)
      .def("_save_graph_cache", &Runtime::save_graph_cache)
      .def("reset", &Runtime::reset, "Drops every captured graph; the next calls warm up again.");

  py::class_<CallLockContext>(m, "_CallLock",
                              "The lock every compiled call holds (tests of its contract).")
      .def(py::init([](bool unless_busy) { return CallLockContext{unless_busy, nullptr}; }),
           py::arg("unless_busy") = false)
      .def("__enter__",
           [](CallLockContext& c) {
             c.lock = std::make_unique<grape::CallLock>(
                 c.unless_busy ? +[] { return true; } : nullptr);
             return c.lock->held();
           })
      .def("__exit__", [](CallLockContext& c, const py::args&) { c.lock.reset(); });
  m.def("_call_lock_held", &grape::CallLock::held_by_this_thread,
        "Whether this thread holds the call lock.");
  m.def("_forked_child", &grape::core::forked_child,
        "Whether this process is a fork of one in which grape made CUDA state.");
}

#ifdef GRAPE_WITH_CUDA
// The allocator hook, conditional nodes and what a replay checks of a training step.
void bind_cuda(py::module_& m) {
  m.def(
      "allocator_hook",
      [](bool enable) {
        if (enable) {
          grape::install_allocator_hook();
          return true;
        }
        return grape::uninstall_allocator_hook();
      },
      py::arg("enable"),
      "Installs (True) or removes (False) grape's CUDA allocator hook; returns False when it "
      "cannot be removed because a capture is running. Captures install it again.");
  m.def("allocator_hook_installed", &grape::allocator_hook_installed);
  m.def("_watch_module_images", &grape::cuda::watch_module_images, py::arg("libraries"),
        "Starts watching module loads through CUPTI (Note [Kernel images]) with the first of "
        "libcupti's paths that opens; returns why not, or an empty string.");
  m.def("_stop_watching_module_images", &grape::cuda::stop_watching_module_images,
        py::arg("why"),
        "Ends the watch of module loads, where one runs, so that another tool may take CUPTI's "
        "subscriber; `why` is what grape.stats() says.");

  py::class_<grape::ConditionalBranch>(m, "ConditionalBranch",
                                       "A conditional node in the graph being captured (see "
                                       "grape.Predicate and grape.while_loop).")
      .def(py::init<const at::Tensor&, const std::string&>(), py::arg("condition"),
           py::arg("kind"))
      .def("begin_body", &grape::ConditionalBranch::begin_body, py::arg("index"))
      .def("end_body", &grape::ConditionalBranch::end_body)
      .def("set_condition", &grape::ConditionalBranch::set_condition, py::arg("condition"))
      .def_property_readonly("bodies", &grape::ConditionalBranch::bodies);
  m.def("stream_is_capturing", &grape::current_stream_is_capturing,
        "Whether the current CUDA stream is capturing a graph.");
  m.def("conditional_unsupported_reason", &grape::conditional_unsupported_reason, py::arg("kind"),
        "Why conditional nodes of `kind` cannot be captured here, or '' when they can.");

  // What a replay checks of a training step's graph (Note [Gradients of a captured step]; tests).
  m.def(
      "_grad_held_by_leaf_only",
      [](const at::Tensor& leaf) { return grape::held_by_leaf_only(leaf.grad()); },
      py::arg("leaf"), "Whether nothing but leaf.grad holds the leaf's gradient.");
}
#endif

// What a capture reads and checks of a training step's modules and optimizers (tests; every
// build).
void bind_training_checks(py::module_& m) {
  // The optimizer settings a training step's graph baked in or reads.
  m.def(
      "_optimizer_settings_hold",
      [](py::list settings) {
        std::string changed;
        const bool hold = grape::optimizer_settings_hold(settings, changed);
        return py::make_tuple(hold, changed);
      },
      py::arg("settings"),
      "Whether (param group, key, value) settings still hold, and what changed if not.");
  m.def(
      "_write_device_settings",
      [](py::list settings) {
        std::string changed;
        const bool written = grape::write_device_settings(settings, changed);
        return py::make_tuple(written, changed);
      },
      py::arg("settings"),
      "Writes DeviceSettings as before a replay: whether all are numbers, and which is not.");

  // The parameters and buffers a capture reads of a module (tests).
  m.def(
      "_module_tensors",
      [](py::handle module) {
        grape::ModuleTensors t = grape::module_tensors(module);
        return py::make_tuple(std::move(t.parameters), std::move(t.buffers));
      },
      py::arg("module"), "(parameters, buffers) of a module, as a capture reads them.");
  m.def(
      "_unwatchable_state",
      [](py::handle module, std::vector<at::Tensor> leaves) {
        return grape::unwatchable_state(grape::call_modules(module, {}), leaves);
      },
      py::arg("module"), py::arg("leaves"),
      "Why a capture cannot watch a module's parameters and buffers and the leaves, or ''.");
}

// Trees, signatures and argument objects as a capture handles them, without a graph (tests).
void bind_trees(py::module_& m) {
  // The signature words and tensors of a call, as the runtime computes them (for tests).
  m.def(
      "signature",
      [](py::args args, py::kwargs kwargs) {
        // Never destroyed: it holds Python objects, which must not outlive the interpreter.
        static auto* flattener = new grape::Flattener();
        grape::FlatCall flat;
        flattener->flatten_call(args, kwargs, flat, /*with_spec=*/false, /*with_paths=*/true);
        py::list tensors;
        for (const auto& t : flat.tensors) {
          tensors.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(t)));
        }
        py::dict d;
        d["words"] = flat.signature.words();
        py::list locals;  // Note [Signatures of stored graphs]: (position, what it stands for)
        for (uint32_t at : flat.signature.local_positions()) {
          locals.append(py::make_tuple(
              at, flattener->describe_local(flat.signature.words()[at - 1],
                                            flat.signature.words()[at])));
        }
        d["locals"] = locals;
        d["hash"] = flat.signature.hash();
        d["tensors"] = tensors;
        d["unsupported"] = flat.unsupported;
        d["path"] = flat.unsupported_path;
        return d;
      },
      "Flattens (args, kwargs) as grape.compile does and returns the signature.");

  // A capture's handling of argument objects, without a graph (for tests of Note [Argument
  // objects]): f runs on the arguments with each tensor t replaced by make_placeholder(t), and
  // the objects are put back afterwards. Returns the records, the effects as (record, attribute)
  // pairs, their values, and the reason when a replay could not repeat what f did.
  m.def(
      "_trace_effects",
      [](py::function fn, py::tuple args, py::dict kwargs, py::function make_placeholder) {
        grape::Flattener flattener;
        grape::FlatCall flat;
        flattener.flatten_call(args, kwargs, flat, /*with_spec=*/true, /*with_paths=*/false);
        std::vector<py::object> leaves;
        for (const auto& t : flat.tensors) {
          leaves.push_back(make_placeholder(py::reinterpret_steal<py::object>(THPVariable_Wrap(t))));
        }
        std::vector<grape::Effect> effects;
        py::list values;
        std::string reason;
        py::object result = py::none();
        {
          grape::CaptureEffects state(flat.records);
          grape::UnflattenLog log;
          py::tuple call = grape::rebuild_arguments(flat, leaves, state, log);
          result = fn(*call[0], **call[1]);
          if (!state.collect(log, effects, values, reason)) result = py::none();
        }
        py::list pairs;
        for (const auto& e : effects) pairs.append(py::make_tuple(e.record, e.attribute));
        py::dict d;
        d["result"] = result;
        d["records"] = py::cast(flat.records);
        d["effects"] = pairs;
        d["values"] = py::tuple(values);
        d["reason"] = reason;
        return d;
      },
      py::arg("fn"), py::arg("args"), py::arg("kwargs"), py::arg("make_placeholder"));
  // What a replay does with the effects of _trace_effects, on the objects of another call.
  m.def(
      "_apply_effects",
      [](py::tuple args, py::dict kwargs, py::list pairs, py::tuple values) {
        grape::Flattener flattener;
        grape::FlatCall flat;
        flattener.flatten_call(args, kwargs, flat, /*with_spec=*/false, /*with_paths=*/false);
        std::vector<grape::Effect> effects;
        for (py::handle p : pairs) {
          auto pair = py::reinterpret_borrow<py::tuple>(p);
          effects.push_back({pair[0].cast<int>(), py::reinterpret_borrow<py::object>(pair[1])});
        }
        grape::apply_effects(flat.records, effects, values);
      },
      py::arg("args"), py::arg("kwargs"), py::arg("effects"), py::arg("values"));

  // Flatten and rebuild a tree with every tensor leaf replaced (for tests of the tree handling).
  m.def(
      "map_tensors",
      [](py::object tree, py::function fn) {
        grape::Flattener flattener;
        grape::FlatCall flat;
        flattener.flatten_value(tree, flat);
        std::vector<py::object> leaves;
        for (const auto& t : flat.tensors) {
          leaves.push_back(fn(py::reinterpret_steal<py::object>(THPVariable_Wrap(t))));
        }
        return grape::unflatten(flat.spec, leaves);
      },
      "Rebuilds `tree` with fn(t) in place of each tensor t.");
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "Grape runtime: CUDA graphs for dynamic PyTorch workloads";
  bind_runtime(m);
#ifdef GRAPE_WITH_CUDA
  m.attr("built_with_cuda") = true;
  bind_cuda(m);
#else
  m.attr("built_with_cuda") = false;
#endif
  bind_training_checks(m);
  bind_trees(m);
}
