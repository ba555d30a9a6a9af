// The unified-memory engine: one per process, shared by both integration
// paths. It owns the configuration, the registry of managed segments, the
// counters, and composes the policies of Policies.h. It knows nothing of how
// it is reached: UnifiedMemory.h (hooks) and c_api.h (C API) call into it.
#pragma once

#include <c10/core/Device.h>
#include <c10/cuda/um/Config.h>
#include <c10/cuda/um/Policies.h>
#include <c10/cuda/um/c_api.h>

#include <cuda_runtime_api.h>

#include <atomic>
#include <mutex>
#include <string>
#include <map>
#include <vector>

namespace c10::cuda::um {

class Engine {
 public:
  // The process's engine; reads PYTORCH_CUDA_UM_CONF on first use and throws
  // c10::Error (naming the bad key or value) if it is malformed.
  static Engine& get();

  cudaError_t allocSegment(
      void** ptr,
      size_t size,
      c10::DeviceIndex device,
      cudaStream_t stream,
      bool capturing);
  cudaError_t freeSegment(void* ptr);

  void captureBegin();
  void captureEnd();

  Config config() const;
  void configure(std::string_view text, std::string_view source);
  bool enabled() const;
  bool isManaged(const void* ptr) const;
  TorchUmStats stats(c10::DeviceIndex device) const;
  void resetPeak();
  std::string oomReport(c10::DeviceIndex device) const;

  // Why this thread's last segment request was refused ("" if it was not, or
  // once an OOM report has told it): an OutOfMemoryError that no refusal
  // caused (a memory fraction, a real cudaMallocManaged failure) must not
  // carry an earlier refusal's reason.
  static std::string& last_refusal();

 private:
  Engine();

  struct Segment {
    size_t size;
    c10::DeviceIndex device;
    Placement placement;
  };

  struct DeviceState {
    bool probed = false;
    bool managed_supported = false;
    bool concurrent_access = false;
    uint64_t total_bytes = 0;
    uint64_t managed_segments = 0;
    uint64_t managed_bytes = 0;
    uint64_t placed_bytes[3] = {0, 0, 0}; // indexed by Placement
    uint64_t prefetches = 0;
    uint64_t prefetch_bytes = 0;
    uint64_t prefetches_skipped_capture = 0;
  };

  // Requires mu_; a message for the user lands in `warning`.
  DeviceState& probe(c10::DeviceIndex device, std::string& warning);
  Ledger ledger(c10::DeviceIndex device) const; // requires mu_

  mutable std::mutex mu_;
  Config cfg_;
  // Ordered by base address, so that isManaged finds the enclosing segment.
  std::map<const void*, Segment, std::less<>> segments_;
  std::vector<DeviceState> devices_;
  uint64_t managed_bytes_ = 0; // including reservations in flight
  uint64_t peak_managed_bytes_ = 0;
  uint64_t cap_refusals_ = 0;
  uint64_t headroom_refusals_ = 0;
  std::atomic<int> captures_{0};

  ManagedCap cap_;
  HostHeadroom headroom_;
  BudgetPlacement placement_;
};

} // namespace c10::cuda::um
