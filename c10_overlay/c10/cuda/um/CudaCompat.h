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
