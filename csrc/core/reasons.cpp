#include "core/reasons.h"

namespace grape::core {

const char* reason_kind_name(ReasonKind kind) {
  switch (kind) {
    case ReasonKind::kNone: return "none";
    case ReasonKind::kNoCuda: return "no_cuda";
    case ReasonKind::kForked: return "forked";
    case ReasonKind::kUnsupportedArgument: return "unsupported_argument";
    case ReasonKind::kHostSync: return "host_sync";
    case ReasonKind::kPageableCopy: return "pageable_copy";
    case ReasonKind::kLegacyStream: return "legacy_stream";
    case ReasonKind::kCpuTensor: return "cpu_tensor";
    case ReasonKind::kOutOfMemory: return "out_of_memory";
    case ReasonKind::kResults: return "results";
    case ReasonKind::kCaptureError: return "capture_error";
    case ReasonKind::kInstantiation: return "instantiation";
    case ReasonKind::kReplayRefused: return "replay_refused";
  }
  return "unknown";
}

bool speaks_of_capture(const std::string& text) {
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  for (const char* words : {"captur", "synchroniz", "graph replay", "cuda graph", "grape:"}) {
    if (lower.find(words) != std::string::npos) return true;
  }
  return false;
}

ReasonKind kind_of_capture_error(const std::string& text) {
  auto says = [&](const char* words) { return text.find(words) != std::string::npos; };
  // Note [Host constants] (torch/graphs/capture.cpp): a pageable copy is retried, pinned.
  if (says("unless the CPU tensor is pinned")) return ReasonKind::kPageableCopy;
  // CUDA's cudaErrorStreamCaptureImplicit: a node's work on the legacy stream (an autograd node
  // made on it, as DistributedDataParallel's gradient hooks are).
  if (says("legacy stream")) return ReasonKind::kLegacyStream;
  // The sync debug mode's error, and CUDA's own where a sync reached it.
  if (says("synchroniz") || says("stream is capturing") || says("cudaErrorStreamCapture")) {
    return ReasonKind::kHostSync;
  }
  return ReasonKind::kCaptureError;
}

}  // namespace grape::core
