// A CPU stand-in for the few CUDA runtime calls the engine's Executor makes, for
// tests/engine/executor_test.cpp. Events and streams are tokens; waiting for an event
// sleeps a little, as a GPU that lags behind its host would. Moves are logged by the
// stub's CudaCompat.h, not carried out: no address passed here is ever dereferenced.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <thread>

typedef int cudaError_t;
enum : int { cudaSuccess = 0, cudaErrorUnknown = 999 };
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamNonBlocking 0x1
#define cudaEventDisableTiming 0x2
enum cudaMemoryAdvise {
  cudaMemAdviseSetReadMostly = 1,
  cudaMemAdviseUnsetReadMostly,
  cudaMemAdviseSetPreferredLocation,
  cudaMemAdviseUnsetPreferredLocation,
  cudaMemAdviseSetAccessedBy,
  cudaMemAdviseUnsetAccessedBy
};

inline cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int) {
  return cudaSuccess;
}
inline cudaError_t cudaGetLastError() {
  return cudaSuccess;
}
inline const char* cudaGetErrorString(cudaError_t) {
  return "stub error";
}
// Events made and destroyed so far (Note [Ready events are reused]).
inline std::atomic<long>& stubEventsCreated() {
  static std::atomic<long> n{0};
  return n;
}
inline std::atomic<long>& stubEventsDestroyed() {
  static std::atomic<long> n{0};
  return n;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = reinterpret_cast<cudaEvent_t>(new int(0));
  stubEventsCreated().fetch_add(1);
  return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<int*>(e);
  stubEventsDestroyed().fetch_add(1);
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) {
  return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t) {
  std::this_thread::sleep_for(std::chrono::microseconds(50));
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) {
  return cudaSuccess;
}
inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) {
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = reinterpret_cast<cudaStream_t>(new int(0));
  return cudaSuccess;
}
