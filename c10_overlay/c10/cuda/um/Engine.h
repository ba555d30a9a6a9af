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
#include <c10/cuda/um/LedgerTrace.h>
#include <c10/cuda/um/Lookahead.h>
#include <c10/cuda/um/Policies.h>
#include <c10/cuda/um/Residency.h>
#include <c10/cuda/um/UnifiedMemory.h>
#include <c10/cuda/um/c_api.h>

#include <cuda_runtime_api.h>

#include <atomic>
#include <map>
#include <memory>
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
      cudaStream_t stream,
      BlockPool pool);
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
  // [Read-only duplicates]). `hold`: it stays on the device until a block
  // event over it (Note [Held ranges]).
  uint64_t touch(
      const void* ptr,
      size_t size,
      int device,
      cudaStream_t stream,
      bool read_only = false,
      bool hold = false);
  // Note [Operator use signals] (OpSignal.h): an operator is about to use
  // `ranges` on `device`, its kernels queued on `stream`. Each is touched as
  // by touch, all under one lock and one executor ticket; then each is filed
  // under its predicted next use `dues[i]` (0: none), at the signal's
  // positions `clock` (Note [The learned eviction order], Residency.h).
  // False when no range is an engine segment. `moved`: bytes asked to move.
  bool touchOp(
      const Lookahead::Range* ranges,
      const uint64_t* dues,
      size_t n,
      int device,
      cudaStream_t stream,
      PlanClock clock,
      uint64_t* moved);
  // Note [Learned lookahead] (Lookahead.h): [ptr, ptr+size) is predicted to
  // be used at position `due`; touched on `stream` (the signal's own) if the
  // chunk at ptr holds live bytes (dead content is placed by the allocation
  // that revives it, Note [Event inlet]), then filed under `due`. Returns the
  // bytes asked to move.
  uint64_t touchAhead(
      const void* ptr,
      size_t size,
      int device,
      cudaStream_t stream,
      uint64_t due);
  // The bytes the learned lookahead may have in flight on `device`: the
  // op_lookahead setting, at most an eighth of the device budget; 0 when the
  // device is not known yet.
  uint64_t lookaheadBytes(int device) const;
  // Note [Forgotten content] (Residency.h): the content of live
  // [ptr, ptr+size) is dead until its next touch. Policy lru only (elsewhere
  // no touch ends it); memory that is not an engine segment is ignored.
  // Returns the bytes marked.
  uint64_t forget(const void* ptr, size_t size);
  // Where the ledger has [ptr, ptr+size) (Residency::placement).
  Residency::Placement placement(const void* ptr, size_t size);
  // The bytes of [ptr, ptr+size) the ledger has in host RAM.
  uint64_t hostBytes(const void* ptr, size_t size) {
    return placement(ptr, size).bytes[static_cast<int>(Where::Host)];
  }
  // Note [Managed host memory] (HostAllocator.h). A managed allocation of
  // `size` bytes placed in host RAM (PreferredLocation=host), counted under
  // max_managed; nullptr when the engine declines (UM off, a fork()ed child
  // of the process that made the engine, the cap, host_headroom, a CUDA
  // error): the caller then uses ordinary host memory.
  void* allocHost(size_t size);
  // Releases allocHost memory; a device that adopted it drops it from its
  // ledger first. Does nothing in a fork()ed child (the mapping is not its).
  void freeHost(void* ptr);
  // The managed memory starting at `ptr` is from now on a tensor of
  // `device` (torch.cuda.um.move_). An allocHost allocation enters the
  // device's residency ledger as an untracked segment (always live: no block
  // events describe it), placed under the budget like a new segment with its
  // data kept; a block of the device's own segments needs nothing. Returns ""
  // or, when the memory cannot be used there, why.
  std::string adoptHost(const void* ptr, int device, cudaStream_t stream);
  // Whether a CPU allocation of `size` bytes should come from allocHost: the
  // host_alloc settings, this thread's managed_host() scope depth, and
  // whether the process has used CUDA. Lock-free.
  bool wantsHost(size_t size, int scope_depth) const;

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
  // Note [Copies of managed host memory by kernel] (HostCopy.h): whether
  // copies of managed host memory may run as a kernel now (UM on and
  // host_copy_kernel; lock-free), and, in one lookup, whether [ptr,
  // ptr+size) lies wholly inside one allocHost allocation of this process,
  // whether mapHostFor has mapped that allocation for `device`, and how
  // many bytes at the end of the copy's other side [other, other+size) lie
  // in host RAM by the residency ledger (0 for a null `other` or a share of
  // 0), with the share of a copy CPU threads may take there (Note [Copies
  // shared with the CPU]).
  bool kernelCopies() const {
    return kernel_copies_.load(std::memory_order_relaxed);
  }
  // The op_stage setting (Note [State one burst a period writes is staged by
  // copy], Stage.h), and whether any stream of the process was ever captured
  // into a CUDA graph (a graph keeps the pointers it captured).
  bool stageBursts() const {
    return stage_bursts_.load(std::memory_order_relaxed);
  }
  bool everCaptured() const {
    return captured_.load();
  }
  struct HostRange {
    bool managed = false;
    bool mapped = false;
    uint64_t other_host_tail = 0;
    double cpu_share = 0;
  };
  HostRange hostRange(const void* ptr, size_t size, int device, const void* other) const;
  // Note [Copies of pageable memory past the budget] (HostCopy.h): whether
  // such copies may take CPU threads now (UM on and pageable_copy_cpu;
  // lock-free), and the parts of [ptr, ptr+size) the residency ledger places
  // in host RAM (Residency::hostRuns; empty outside one engine segment, or
  // in a fork()ed child).
  bool pageableCopies() const {
    return pageable_copies_.load(std::memory_order_relaxed);
  }
  std::vector<Residency::Run> hostRuns(const void* ptr, size_t size) const;
  // Whether some stream of the process is being captured (captureBegin and
  // captureEnd): CUDA then forbids advice and waits on other streams too.
  bool capturesUnderway() const {
    return captures_.load() > 0;
  }
  // Maps the whole allocHost allocation holding `ptr` into `device`'s page
  // tables (AccessedBy), once per allocation and device, so that a kernel's
  // first access of its pages, populated by the CPU, does not fault each one
  // into the GPU's page tables (Note [Copies of managed host memory by
  // kernel]). A failure is left to the faults.
  void mapHostFor(const void* ptr, int device);
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
      bool read_only = false,
      bool hold = false);

  mutable std::mutex mu_;
  Config cfg_;
  std::vector<DeviceState> devices_;
  uint64_t managed_bytes_ = 0; // including reservations in flight
  uint64_t peak_managed_bytes_ = 0;
  uint64_t cap_refusals_ = 0;
  uint64_t headroom_refusals_ = 0;
  uint64_t block_events_ = 0;
  // Note [Timing the event path]: every kEventSampleEvery-th block event of
  // each thread is timed, from onBlockEvent's entry (before the lock) to its
  // return; the samples and their host nanoseconds.
  static constexpr uint32_t kEventSampleEvery = 8;
  std::atomic<uint64_t> event_samples_{0};
  std::atomic<uint64_t> event_sample_ns_{0};
  std::atomic<int> captures_{0};
  // A capture has begun in this process: from then on, a block event whose
  // pool is Unknown (torch 2.6, 2.7) may be a graph pool's.
  std::atomic<bool> captured_{false};
  std::atomic<bool> events_attached_{false};

  struct HostAllocation {
    uint64_t size = 0;
    int device = -1; // the device that adopted it, or -1
    uint64_t mapped_for = 0; // devices (bit i: device i) mapHostFor advised
  };
  static constexpr int kMappedDevices = 64; // the bits of mapped_for
  // allocHost allocations by base address; guarded by mu_.
  std::map<uintptr_t, HostAllocation> host_;
  uint64_t host_bytes_ = 0;
  uint64_t adopted_bytes_ = 0;
  uint64_t host_fallbacks_ = 0;
  // Mirrors of cfg_'s host_alloc settings for wantsHost, which runs on every
  // CPU allocation and must not take mu_.
  std::atomic<bool> host_managed_{false};
  std::atomic<bool> kernel_copies_{true}; // enabled && host_copy_kernel
  std::atomic<bool> stage_bursts_{false}; // enabled && op_stage
  std::atomic<bool> pageable_copies_{true}; // enabled && pageable_copy_cpu
  std::atomic<uint64_t> host_min_{1ull << 20};
  std::atomic<bool> used_cuda_{false}; // a managed segment was made
  const int owner_pid_; // the process whose CUDA context the engine uses
  // The allocHost allocation containing ptr, or host_.end(); requires mu_.
  std::map<uintptr_t, HostAllocation>::const_iterator hostFind(uintptr_t p) const;
  void syncHostSettings(); // requires mu_

  ManagedCap cap_;
  HostHeadroom headroom_;
  // The managed segments (the registry isManaged reads) and where their
  // pages are; guarded by mu_.
  Residency residency_;
  // Note [Ledger traces] (Residency.h): set from TORCH_UM_LEDGER_TRACE.
  std::unique_ptr<TraceFile> trace_;
  Executor executor_; // thread-safe; used outside mu_
};

} // namespace c10::cuda::um
