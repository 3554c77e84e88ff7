#pragma once
// Note [Typed reasons]
// ~~~~~~~~~~~~~~~~~~~~
// Why a signature runs eagerly, why a capture failed or why a replay was refused. The kind is set
// where the reason arises, so that the retry policy (core/capture_policy.h) and the advice the
// Python side adds to a fallback warning (grape/_compile.py) read the kind, never the text. The
// text stays for people: it names the argument, the exception, the line.

#include <string>

namespace grape::core {

enum class ReasonKind {
  kNone,                 // no reason: nothing failed
  kNoCuda,               // no CUDA device, or grape built without CUDA
  kForked,               // a process forked from one that used CUDA: its CUDA state is the parent's
  kUnsupportedArgument,  // an argument no graph can take (a type, tensors on several devices)
  kHostSync,             // a host synchronization under capture (.item(), a data-dependent shape,
                         // a tensor condition the rewriter left to the host)
  kPageableCopy,         // a copy from pageable host memory under capture
  kLegacyStream,         // work on the legacy default stream, which no capture can join
  kCpuTensor,            // a result on the CPU, computed once while capturing
  kOutOfMemory,          // device memory ran out while capturing (or the memory budget)
  kResults,              // results a replay cannot repeat (requires grad, a view of another dtype)
  kCaptureError,         // the function raised under capture for another reason
  kInstantiation,        // the driver refused to instantiate the captured graph
  kReplayRefused,        // a replay would overwrite memory the caller holds
};

// A stable lower-case name of the kind ("host_sync"), as Python and grape.stats see it.
const char* reason_kind_name(ReasonKind kind);

struct Reason {
  ReasonKind kind = ReasonKind::kNone;
  std::string text;
  bool empty() const { return kind == ReasonKind::kNone; }
};

// The kind of a capture that failed with an exception whose message is `text`: PyTorch reports a
// host synchronization and a pageable copy under capture only in words, so this file is the one
// place that reads them.
ReasonKind kind_of_capture_error(const std::string& text);
// Whether a RuntimeError's text is about the capture (Note [Exceptions under capture]): PyTorch's
// and CUDA's errors under capture say so ("operation not permitted when stream is capturing",
// "during CUDA graph capture", "called a synchronizing CUDA operation", "dependency created on
// uncaptured work in another stream"), and so do grape's own, raised only under capture (a
// misplaced otherwise(), a conditional node the driver lacks: "grape: ..."); an error of f's own
// rarely does.
bool speaks_of_capture(const std::string& text);

}  // namespace grape::core
