// CPU stand-in for c10_overlay's CudaCompat.h (tests/engine/executor_test.cpp): the
// same calls, which log each range moved, with a global sequence number, instead of
// moving it. The test reads the log to check the executor's order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace c10::cuda::um::compat {

constexpr int kHost = -1;
constexpr bool kHasBatch = true;

struct Moved {
  uint64_t seq; // order of issue, over all threads
  uintptr_t addr;
  int to; // a device, or kHost
  bool discard;
};

inline std::mutex& logMutex() {
  static std::mutex m;
  return m;
}
inline std::vector<Moved>& moveLog() {
  static std::vector<Moved> log;
  return log;
}
inline void logMoves(void** ptrs, size_t n, int to, bool discard) {
  std::lock_guard<std::mutex> lock(logMutex());
  const uint64_t seq = moveLog().size();
  for (size_t i = 0; i < n; ++i) {
    moveLog().push_back(Moved{seq, reinterpret_cast<uintptr_t>(ptrs[i]), to, discard});
  }
}

inline cudaError_t prefetch(const void* p, size_t, int to, cudaStream_t) {
  void* ptr = const_cast<void*>(p);
  logMoves(&ptr, 1, to, false);
  return cudaSuccess;
}
inline cudaError_t advise(const void*, size_t, cudaMemoryAdvise, int) {
  return cudaSuccess;
}
inline cudaError_t prefetchBatch(void** ptrs, size_t*, size_t n, int to, cudaStream_t) {
  logMoves(ptrs, n, to, false);
  return cudaSuccess;
}
inline cudaError_t discardBatch(void** ptrs, size_t*, size_t n, cudaStream_t) {
  logMoves(ptrs, n, kHost, true);
  return cudaSuccess;
}

} // namespace c10::cuda::um::compat
