/* C API of the unified-memory engine.
 *
 * Exported with default visibility from the library that carries the engine
 * (libc10_cuda.so in source-path wheels, libtorch_um.so in injection-path
 * wheels). torch/cuda/um.py reads it with ctypes; C and C++ programs may use
 * it directly. Every function is safe to call without a GPU. Functions that
 * take `err`/`errlen` write a NUL-terminated message there on failure.
 */
#ifndef TORCH_UM_C_API_H
#define TORCH_UM_C_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TORCH_UM_API __attribute__((visibility("default")))
#define TORCH_UM_ABI_VERSION 1

/* Per-device and process-wide counters. Callers set struct_size to
 * sizeof(TorchUmStats); fields past it are not written. */
typedef struct TorchUmStats {
  uint64_t struct_size;
  /* this device */
  uint64_t managed_segments;
  uint64_t managed_bytes;
  uint64_t device_placed_bytes;
  uint64_t host_placed_bytes;
  uint64_t unplaced_bytes;
  uint64_t prefetches;
  uint64_t prefetch_bytes;
  uint64_t prefetches_skipped_capture;
  uint64_t device_budget_bytes; /* resolved; 0 until the device is first used */
  uint64_t device_total_bytes;
  /* whole process */
  uint64_t total_managed_bytes;
  uint64_t peak_managed_bytes;
  uint64_t cap_refusals;
  uint64_t headroom_refusals;
  /* Residency (appended in the residency engine; older callers pass a
   * smaller struct_size and never see these). "placed" above means where
   * pages are now. The counters below are process-wide. */
  uint64_t policy_lru;         /* 1: policy lru, 0: static */
  uint64_t dead_device_bytes;  /* this device: on the device, no live block or
                                  only forgotten content (torch_um_forget) */
  uint64_t events_attached;    /* 1 once the allocator's block events arrive */
  uint64_t block_events;       /* ALLOC and FREE_COMPLETED events received */
  uint64_t touches;            /* ranges about to be used that were not all on the device */
  uint64_t touch_prefetch_bytes; /* live bytes migrated to a device */
  uint64_t reuse_bytes;        /* dead bytes handed out again and placed
                                  (DiscardAndPrefetch, issued as a prefetch:
                                  Executor.h) */
  uint64_t place_bytes;        /* new segments placed on a device */
  uint64_t map_host_bytes;     /* bytes placed in host RAM, mapped in place */
  uint64_t evictions;          /* live chunks moved to host RAM */
  uint64_t evict_bytes;
  uint64_t discards;           /* dead chunks dropped without a copy */
  uint64_t discard_bytes;
  uint64_t executor_calls;     /* CUDA calls the executor issued */
  uint64_t executor_failures;  /* of which failed (hints lost, data intact) */
  uint64_t executor_ns;        /* host time spent issuing them, in the caller */
  uint64_t evictor_ns;         /* host time of the evictor thread (Executor.h) */
  uint64_t duplicate_bytes;    /* live bytes brought in as read-only copies */
  uint64_t drop_bytes;         /* read-only copies dropped, nothing written back */
  uint64_t cancelled_bytes;    /* queued evictions and discards called off by a
                                  bring-in of the same pages (Executor.h) */
  /* Managed host memory (Note [Managed host memory], HostAllocator.h),
   * process-wide: CPU tensors' allocations that are managed memory, their
   * bytes, the bytes of those a GPU adopted (torch.cuda.um.move_), and the
   * CPU allocations that asked and fell back to ordinary host memory. */
  uint64_t host_allocations;
  uint64_t host_alloc_bytes;
  uint64_t adopted_bytes;
  uint64_t host_fallbacks;
  /* Live bytes evicted, then freed before anything brought them back to a
   * device (Residency.h: ResidencyCounters::evicted_unused_bytes). */
  uint64_t evicted_unused_bytes;
  /* The evictor thread: its host time waiting for a job's stream before
   * issuing it (part of evictor_ns), and the ranges it issued. */
  uint64_t evictor_wait_ns;
  uint64_t evict_ranges;
  /* Bring-ins that waited on the host for an eviction batch to be issued
   * (Executor.h, Note [Eviction fences]), their host time, and the part of
   * it while the evictor thread was issuing a job. */
  uint64_t fence_waits;
  uint64_t fence_wait_ns;
  uint64_t fence_wait_issuing_ns;
  /* Note [Forgotten content] (Residency.h), process-wide: bytes torch_um_forget
   * marked, and of those the bytes that then left a device by discard. */
  uint64_t forget_bytes;
  uint64_t forgotten_discard_bytes;
  /* Note [Held ranges] (Residency.h), process-wide: bytes a touch with
   * TORCH_UM_TOUCH_HOLD took out of the eviction orders. */
  uint64_t hold_bytes;
  /* Note [Timing the event path] (Engine.cpp), process-wide: block events
   * timed (one in 8 per thread) and their host nanoseconds in the engine,
   * lock waits included. */
  uint64_t event_samples;
  uint64_t event_sample_ns;
  /* Note [Copies of managed host memory by kernel] (HostCopy.h), process-wide:
   * cudaMemcpyAsync calls the copy kernel took, their bytes, and launches that
   * failed (those copies went to the driver). */
  uint64_t kernel_copies;
  uint64_t kernel_copy_bytes;
  uint64_t kernel_copy_failures;
  /* Note [Copies shared with the CPU] (HostCopy.h): of kernel_copy_bytes, the
   * bytes CPU threads copied. */
  uint64_t kernel_copy_cpu_bytes;
  /* Note [Copies of pageable memory past the budget] (HostCopy.h),
   * process-wide: cudaMemcpyAsync calls of pageable memory whose GPU side's
   * bytes in host RAM CPU threads copied, and those bytes. */
  uint64_t pageable_copies;
  uint64_t pageable_cpu_bytes;
  /* Note [Pageable bytes on the device go through page-locked buffers]
   * (HostCopy.cpp): the other bytes of those copies that went that way. */
  uint64_t pageable_staged_bytes;
  /* Note [Operator use signals] (OpSignal.h) and [Learned lookahead]
   * (Lookahead.h), process-wide: 1 while the operator observer is installed,
   * the times it was installed, operators seen with a managed CUDA input, the
   * bytes their touches asked to move, ranges touched ahead of their predicted
   * use and the bytes those asked to move, uses found in the learned order,
   * predictions started, and the observer's host nanoseconds. */
  uint64_t op_signal_installed;
  uint64_t op_signal_installs;
  uint64_t op_calls;
  uint64_t op_touch_bytes;
  uint64_t op_ahead_ranges;
  uint64_t op_ahead_bytes;
  uint64_t op_matches;
  uint64_t op_paths;
  uint64_t op_signal_ns;
  /* Note [The learned eviction order] (Residency.h): bytes filed under a
   * predicted next use, and bytes that left the device chosen by it. */
  uint64_t plan_bytes;
  uint64_t plan_victim_bytes;
  /* Note [Counterparts] (Lookahead.h): of op_matches, those found by a
   * transition with one side by identity; predictions made from a
   * counterpart. */
  uint64_t op_mixed;
  uint64_t op_counterparts;
  /* Note [First evictions] (Residency.h): of evict_bytes, the bytes of chunks
   * whose pages had not been in host RAM before (or were discarded since). */
  uint64_t evict_first_bytes;
  /* Note [State one burst a period writes is staged by copy] (Stage.h),
   * process-wide: storages staged and their bytes, put back and their bytes,
   * storages that died while staged, and stagings or copies out that failed. */
  uint64_t stage_ins;
  uint64_t stage_in_bytes;
  uint64_t stage_outs;
  uint64_t stage_out_bytes;
  uint64_t stage_dropped;
  uint64_t stage_failures;
  /* Of the operators' uses, those that met every condition of staging but
   * the ledger's, and of those the ranges less than half in host RAM. */
  uint64_t stage_candidates;
  uint64_t stage_not_on_host;
} TorchUmStats;

/* Advice kinds for torch_um_advise. */
enum TorchUmAdvice {
  TORCH_UM_ADVISE_PREFERRED_LOCATION = 1,
  TORCH_UM_ADVISE_UNSET_PREFERRED_LOCATION = 2,
  TORCH_UM_ADVISE_ACCESSED_BY = 3,
  TORCH_UM_ADVISE_UNSET_ACCESSED_BY = 4,
  TORCH_UM_ADVISE_READ_MOSTLY = 5,
  TORCH_UM_ADVISE_UNSET_READ_MOSTLY = 6
};

/* Location argument meaning "host RAM" for prefetch and advice. */
#define TORCH_UM_HOST (-1)

TORCH_UM_API int torch_um_abi_version(void);

/* Apply "key:value,..." (PYTORCH_CUDA_UM_CONF syntax) over the current
 * settings; all or nothing. Returns 0, or -1 with a message in err. */
TORCH_UM_API int torch_um_configure(const char* conf, char* err, size_t errlen);

/* Writes the effective settings as "key:value,..."; returns the length the
 * full text needs (excluding the NUL), or -1 with a message in buf if the
 * environment's settings are malformed. */
TORCH_UM_API long torch_um_get_config(char* buf, size_t len);

/* 1 if new allocator segments are managed memory, else 0. */
TORCH_UM_API int torch_um_enabled(void);

/* 1 if ptr lies inside a managed segment the engine allocated. */
TORCH_UM_API int torch_um_is_managed(const void* ptr);

/* Fills *out for device (>= 0). Returns 0, or -1 for a bad argument (a
 * struct_size under 8 bytes included). */
TORCH_UM_API int torch_um_get_stats(int device, TorchUmStats* out);

/* Resets peak_managed_bytes to the current value. */
TORCH_UM_API void torch_um_reset_peak(void);

/* Prefetch [ptr, ptr+size) of managed memory to device (or TORCH_UM_HOST),
 * ordered on stream (a cudaStream_t; NULL = legacy default stream). Goes
 * through the engine: with policy lru a prefetch to the device keeps the
 * device budget (the least recently used ranges leave first) and the
 * engine's ledger follows every move. */
TORCH_UM_API int torch_um_prefetch(
    const void* ptr,
    size_t size,
    int location,
    void* stream,
    char* err,
    size_t errlen);

/* Apply one TorchUmAdvice to [ptr, ptr+size) for location. */
TORCH_UM_API int torch_um_advise(
    const void* ptr,
    size_t size,
    int advice,
    int location,
    char* err,
    size_t errlen);

/* Flags of torch_um_touch. */
enum TorchUmTouchFlags {
  /* The use only reads the range (parameters in a forward without
   * autograd): it comes back as a read-only copy, which later leaves the
   * device without a write-back. A wrong guess costs speed, never data. */
  TORCH_UM_TOUCH_READ_ONLY = 1,
  /* The range is used at every step with no further signal (a library's
   * workspace): the chunks that hold only its bytes stay on the device until
   * a block event over them (Note [Held ranges], Residency.h). */
  TORCH_UM_TOUCH_HOLD = 2
};

/* Live [ptr, ptr+size) is about to be used on device (the use signal of
 * torch.cuda.um's module hooks): with policy lru it is brought to the device
 * under the budget, least recently used ranges leaving first. `flags`:
 * TorchUmTouchFlags. Memory that is not an engine segment is ignored.
 * Returns the bytes asked to move, or -1 for a bad argument. */
TORCH_UM_API long long torch_um_touch(
    const void* ptr,
    size_t size,
    int device,
    void* stream,
    int flags);

/* The content of live [ptr, ptr+size) is dead until its next torch_um_touch
 * (Note [Forgotten content], Residency.h): with policy lru, the chunks
 * wholly its own are the first to leave the device, without a copy, and the
 * touch brings them back without one. The caller promises that nothing
 * reads the range before that touch. Memory that is not an engine segment
 * is ignored. Returns the bytes marked, or -1 on an internal error. */
TORCH_UM_API long long torch_um_forget(const void* ptr, size_t size);

/* What torch_um_where counts. */
enum TorchUmWhere {
  TORCH_UM_WHERE_DEVICE = 0, /* placed on its device */
  TORCH_UM_WHERE_HOST = 1, /* placed in host RAM, mapped for the device */
  TORCH_UM_WHERE_UNPLACED = 2, /* not placed: pages go where first touched */
  TORCH_UM_WHERE_HELD = 3 /* on the device and held (Note [Held ranges]) */
};

/* The bytes of [ptr, ptr+size), clipped to the managed segment holding ptr,
 * that the engine's ledger has where `where` (TorchUmWhere) says, by the
 * 2 MiB chunks the bytes lie in. It is where the engine placed them, not
 * pages the driver moved on its own (a fault). 0 for memory that is not an
 * engine segment; -1 for a bad argument. */
TORCH_UM_API long long torch_um_where(const void* ptr, size_t size, int where);

/* 1 while the managed bytes of some device (on it or in host RAM) exceed
 * 90 % of its device budget, else 0. */
TORCH_UM_API int torch_um_under_pressure(void);

/* Host RAM a new host-resident allocation may still take under the
 * host_headroom rule (HostHeadroom::room in Policies.h): the lower of
 * MemAvailable and the room under this process's cgroup v2 memory.max, less
 * host_headroom; 0 below it, about UINT64_MAX when neither can be read. */
TORCH_UM_API uint64_t torch_um_host_room(void);

/* Managed host memory (Note [Managed host memory] in HostAllocator.h).
 * torch_um_host_install registers the engine's CPU allocator, which wraps
 * the one in place; idempotent. Returns 0, or -1 with a message in err. */
TORCH_UM_API int torch_um_host_install(char* err, size_t errlen);

/* The engine's copy kernel for `device` (Note [Lean copies] in
 * torch/cuda/_um_copy.py, Note [Copies of managed host memory by kernel] in
 * HostCopy.h): a CUfunction taking (void* dst, const void* src, unsigned long
 * long bytes), launched with 1024 threads a block; compiled by NVRTC at the
 * first call for the device and kept. Makes the device current. NULL, with
 * why in err, where it cannot be had (tried once per device). */
TORCH_UM_API void* torch_um_copy_function(int device, char* err, size_t errlen);

/* Adds delta (+1 entering torch.cuda.um.managed_host(), -1 leaving) to this
 * thread's scope depth, inside which CPU allocations of at least
 * host_alloc_min bytes are managed memory. Returns the new depth. */
TORCH_UM_API int torch_um_host_scope(int delta);

/* A DLPack DLManagedTensor* (v0.8 ABI, for a "dltensor" capsule) of dtype
 * uint8 and shape {nbytes} over the managed memory of the c10::StorageImpl
 * `storage_impl` (torch.UntypedStorage._cdata), seen from `device`
 * (>= 0: that CUDA device; TORCH_UM_HOST: the CPU). It holds a reference to
 * the storage until its deleter runs. To a device, a managed host
 * allocation enters the device's residency ledger (placed under the
 * budget, data kept; ordered on the device's current stream). Returns NULL
 * with a message in err when the memory is not managed or belongs to
 * another device. */
TORCH_UM_API void* torch_um_alias(
    void* storage_impl,
    int device,
    char* err,
    size_t errlen);

/* Note [Pinned in place] (HostAllocator.h): page-locks the memory of the CPU
 * c10::StorageImpl `storage_impl` where it lies (cudaHostRegister) and
 * returns a DLPack DLManagedTensor* (as torch_um_alias) over it that holds
 * the storage. When torch drops it, a background thread waits for the
 * current device's queued work, unregisters the range and releases the
 * storage. Returns NULL with a message in err. */
TORCH_UM_API void* torch_um_pin_alias(void* storage_impl, char* err, size_t errlen);

/* Note [Operator use signals] (OpSignal.h): on != 0 installs the ATen
 * operator observer that reports every operator's managed inputs to the
 * engine (idempotent), 0 removes it. torch.cuda.um's pressure watcher calls
 * it as a device comes near its budget and leaves it. Returns 0, or -1 with
 * why in err (torch's observer functions not found). */
TORCH_UM_API int torch_um_op_signal(int on, char* err, size_t errlen);

/* Source path: attach the engine to the caching allocator's block events
 * (its trace tracker). Call once CUDA is initialised; the injection path
 * attaches through torch_um_inject_attach instead. Returns 0, or -1 with a
 * message in err. */
TORCH_UM_API int torch_um_attach_events(char* err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* TORCH_UM_C_API_H */
