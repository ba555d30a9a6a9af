// The unified-memory engine: one per process, shared by both integration
// paths. It owns the configuration, the registry of managed segments, the
// residency ledger (Residency.h) and the executor of its actions
// (Executor.h), and composes the admission policies of Policies.h. It knows
// nothing of how it is reached: UnifiedMemory.h (hooks, block events) and
// c_api.h (C API) call into it.
//
// Note [Engine: locks]
// ~~~~~~~~~~~~~~~~~~~~
// Lock order: the caching allocator's lock, then the engine's mu_. Segment
// allocation and release and the allocator's block events arrive with the
// allocator's lock held; the engine takes mu_ to update its ledger and decide
// actions, drops it, and only then runs them (CUDA calls) through the
// Executor. The engine never calls the caching allocator, and never calls
// into CUDA or Python while holding mu_ (device probing aside, which happens
// once per device).
#pragma once

#include <c10/core/Device.h>
#include <c10/cuda/um/Config.h>
#include <c10/cuda/um/Executor.h>
#include <c10/cuda/um/Policies.h>
#include <c10/cuda/um/Residency.h>
#include <c10/cuda/um/UnifiedMemory.h>
#include <c10/cuda/um/c_api.h>

#include <cuda_runtime_api.h>

#include <atomic>
#include <mutex>
#include <string>
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

  // Note [Event inlet]: the allocator handed out (Alloc) or took back
  // (FreeCompleted) a block. Called under the allocator's lock; cheap when
  // the block's pages are where they should be (no CUDA call then).
  void onBlockEvent(
      BlockEvent event,
      uintptr_t addr,
      size_t size,
      cudaStream_t stream);
  // Segments allocated from now on have their blocks tracked by events.
  void setEventsAttached();

  // Explicit moves (torch.cuda.um.prefetch): to a device (`location` >= 0)
  // the range is touched under the policy; to the host (-1) it is evicted.
  // Memory that is not an engine segment is prefetched as asked.
  cudaError_t prefetch(
      const void* ptr,
      size_t size,
      int location,
      cudaStream_t stream);
  // The Python layer's use signal: live [ptr, ptr+size) is about to be used
  // on `device`. Memory that is not an engine segment is ignored. Returns
  // the bytes asked to move. `read_only`: the use only reads it (Note
  // [Read-only duplicates]).
  uint64_t touch(
      const void* ptr,
      size_t size,
      int device,
      cudaStream_t stream,
      bool read_only = false);
  // True while some device's managed bytes come near its budget (Note [Near
  // the budget]): the Python layer's use-signal hooks are installed only then.
  bool underPressure() const;

  cudaError_t advise(
      const void* ptr,
      size_t size,
      cudaMemoryAdvise advice,
      int location);

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

  struct DeviceState {
    bool probed = false;
    bool managed_supported = false;
    bool concurrent_access = false;
    uint64_t total_bytes = 0;
    uint64_t managed_segments = 0;
    uint64_t managed_bytes = 0;
    uint64_t prefetches_skipped_capture = 0;
  };

  // Requires mu_; a message for the user lands in `warning`.
  DeviceState& probe(c10::DeviceIndex device, std::string& warning);
  Ledger ledger(c10::DeviceIndex device) const; // requires mu_
  // What the residency ledger may do on `device` now; requires mu_.
  DeviceLimits limits(int device, bool capturing) const;
  Policy policy() const { // requires mu_
    return cfg_.lru ? Policy::Lru : Policy::Static;
  }
  // The engine's moves of [ptr, ptr+size): to `location` >= 0 a touch under
  // the policy (`static` too when `any_policy`), to -1 an eviction. False if
  // ptr is not in a managed segment (nothing done).
  bool move(
      const void* ptr,
      size_t size,
      int location,
      cudaStream_t stream,
      bool any_policy,
      uint64_t* moved,
      bool read_only = false);

  mutable std::mutex mu_;
  Config cfg_;
  std::vector<DeviceState> devices_;
  uint64_t managed_bytes_ = 0; // including reservations in flight
  uint64_t peak_managed_bytes_ = 0;
  uint64_t cap_refusals_ = 0;
  uint64_t headroom_refusals_ = 0;
  uint64_t block_events_ = 0;
  std::atomic<int> captures_{0};
  std::atomic<bool> events_attached_{false};

  ManagedCap cap_;
  HostHeadroom headroom_;
  // The managed segments (the registry isManaged reads) and where their
  // pages are; guarded by mu_.
  Residency residency_;
  Executor executor_; // thread-safe; used outside mu_
};

} // namespace c10::cuda::um
