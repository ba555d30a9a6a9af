// The one place that knows which form of the managed-memory calls the CUDA
// headers we build against offer:
//   CUDA >= 13.0         cudaMemPrefetchAsync / cudaMemAdvise take a cudaMemLocation
//   CUDA 12.2 .. 12.9    the cudaMemLocation forms are the *_v2 functions
//   CUDA <  12.2         int device, cudaCpuDeviceId for the host
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace c10::cuda::um::compat {

// Where a range should live: a device index, or the host (kHost).
constexpr int kHost = -1;

#if CUDART_VERSION >= 12020
inline cudaMemLocation location(int device) {
  cudaMemLocation loc{};
  if (device == kHost) {
    loc.type = cudaMemLocationTypeHost;
    loc.id = 0;
  } else {
    loc.type = cudaMemLocationTypeDevice;
    loc.id = device;
  }
  return loc;
}
#endif

inline cudaError_t prefetch(
    const void* ptr,
    size_t size,
    int device,
    cudaStream_t stream) {
#if CUDART_VERSION >= 13000
  return cudaMemPrefetchAsync(ptr, size, location(device), 0, stream);
#elif CUDART_VERSION >= 12020
  return cudaMemPrefetchAsync_v2(ptr, size, location(device), 0, stream);
#else
  return cudaMemPrefetchAsync(
      ptr, size, device == kHost ? cudaCpuDeviceId : device, stream);
#endif
}

inline cudaError_t advise(
    const void* ptr,
    size_t size,
    cudaMemoryAdvise advice,
    int device) {
#if CUDART_VERSION >= 13000
  return cudaMemAdvise(ptr, size, advice, location(device));
#elif CUDART_VERSION >= 12020
  return cudaMemAdvise_v2(ptr, size, advice, location(device));
#else
  return cudaMemAdvise(
      ptr, size, advice, device == kHost ? cudaCpuDeviceId : device);
#endif
}

// The batch forms and discard exist from CUDA 13. Batches never take the
// legacy default stream. Before CUDA 13 the residency ledger asks for no
// discard (DeviceLimits::discard is false) and the executor prefetches one
// range at a time, so the stubs below are never reached.
constexpr bool kHasBatch = CUDART_VERSION >= 13000;
constexpr bool kHasDiscard = CUDART_VERSION >= 13000;

#if CUDART_VERSION >= 13000
inline cudaError_t prefetchBatch(
    void** ptrs,
    size_t* sizes,
    size_t count,
    int device,
    cudaStream_t stream) {
  cudaMemLocation loc = location(device);
  size_t first = 0;
  return cudaMemPrefetchBatchAsync(
      ptrs, sizes, count, &loc, &first, 1, 0, stream);
}

// Drop the pages of dead ranges (no copy).
inline cudaError_t discardBatch(
    void** ptrs,
    size_t* sizes,
    size_t count,
    cudaStream_t stream) {
  return cudaMemDiscardBatchAsync(ptrs, sizes, count, 0, stream);
}

#else
inline cudaError_t prefetchBatch(void**, size_t*, size_t, int, cudaStream_t) {
  return cudaErrorNotSupported;
}
inline cudaError_t discardBatch(void**, size_t*, size_t, cudaStream_t) {
  return cudaErrorNotSupported;
}
#endif

} // namespace c10::cuda::um::compat
