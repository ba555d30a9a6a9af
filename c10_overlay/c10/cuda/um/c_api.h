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

/* Fills *out for device (>= 0). Returns 0, or -1 for a bad argument. */
TORCH_UM_API int torch_um_get_stats(int device, TorchUmStats* out);

/* Resets peak_managed_bytes to the current value. */
TORCH_UM_API void torch_um_reset_peak(void);

/* Prefetch [ptr, ptr+size) of managed memory to device (or TORCH_UM_HOST),
 * ordered on stream (a cudaStream_t; NULL = legacy default stream). */
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

#ifdef __cplusplus
}
#endif

#endif /* TORCH_UM_C_API_H */
