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

} // namespace c10::cuda::um::compat

namespace c10::cuda::um::compat {

// Prefetch a batch of ranges to one location on `stream`.
inline cudaError_t prefetchBatch(
    void** ptrs,
    size_t* sizes,
    size_t count,
    int device,
    cudaStream_t stream) {
#if CUDART_VERSION >= 13000
  cudaMemLocation loc = location(device);
  size_t first = 0;
  return cudaMemPrefetchBatchAsync(
      ptrs, sizes, count, &loc, &first, 1, 0, stream);
#else
  for (size_t i = 0; i < count; ++i) {
    cudaError_t e = prefetch(ptrs[i], sizes[i], device, stream);
    if (e != cudaSuccess) {
      return e;
    }
  }
  return cudaSuccess;
#endif
}

// True where dead pages can be dropped without a copy (CUDA >= 13).
constexpr bool kHasDiscard = CUDART_VERSION >= 13000;

// Drop the pages of dead ranges, or (before CUDA 13) move them to the host.
inline cudaError_t discardBatch(
    void** ptrs,
    size_t* sizes,
    size_t count,
    cudaStream_t stream) {
#if CUDART_VERSION >= 13000
  return cudaMemDiscardBatchAsync(ptrs, sizes, count, 0, stream);
#else
  return prefetchBatch(ptrs, sizes, count, kHost, stream);
#endif
}

// Drop the pages of dead ranges and populate them at `device` (or kHost).
inline cudaError_t discardAndPrefetchBatch(
    void** ptrs,
    size_t* sizes,
    size_t count,
    int device,
    cudaStream_t stream) {
#if CUDART_VERSION >= 13000
  cudaMemLocation loc = location(device);
  size_t first = 0;
  return cudaMemDiscardAndPrefetchBatchAsync(
      ptrs, sizes, count, &loc, &first, 1, 0, stream);
#else
  return prefetchBatch(ptrs, sizes, count, device, stream);
#endif
}

} // namespace c10::cuda::um::compat
