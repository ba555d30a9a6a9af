// Injection path: reaches the caching allocator of an official libc10_cuda.so
// without its source.
//
// libtorch_um.so is loaded RTLD_GLOBAL before any CUDA library (torch's
// loading patch, or LD_PRELOAD), so the process-wide cudaMalloc, cudaFree,
// cudaStreamBeginCapture, cudaStreamEndCapture and cudaIpcGetMemHandle are
// the ones defined here. Each looks at its caller: calls made from
// libc10_cuda.so (the caching allocator) go to the engine's hooks
// (UnifiedMemory.h); calls from anywhere else (NCCL, cuBLAS, cuDNN, user
// extensions, the engine itself) go unchanged to libcudart. The allocator's
// block events come from its trace tracker, attached once CUDA initialised.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/um/ErrorText.h>
#include <c10/cuda/um/HostCopy.h>
#include <c10/cuda/um/UnifiedMemory.h>
#include <c10/util/Exception.h>
#include <c10/util/env.h>

#include "inject_api.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#ifndef UM_CUDART_SONAME
#error "UM_CUDART_SONAME (e.g. libcudart.so.13) must be defined by the build"
#endif

namespace {

// ---- who is calling ---------------------------------------------------------

struct Range {
  uintptr_t lo;
  uintptr_t hi;
};

struct ObjectRanges {
  std::vector<Range> text;
  std::string path;
  bool contains(uintptr_t a) const {
    for (const Range& r : text) {
      if (a >= r.lo && a < r.hi) {
        return true;
      }
    }
    return false;
  }
};

struct PhdrQuery {
  uintptr_t base;
  ObjectRanges* out;
};

int collectRanges(struct dl_phdr_info* info, size_t, void* data) {
  auto* q = static_cast<PhdrQuery*>(data);
  bool mine = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) {
      continue;
    }
    uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    if (q->base >= lo && q->base < lo + ph.p_memsz) {
      mine = true;
    }
  }
  if (!mine) {
    return 0;
  }
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X)) {
      uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
      q->out->text.push_back(Range{lo, lo + ph.p_memsz});
    }
  }
  q->out->path = info->dlpi_name ? info->dlpi_name : "";
  return 1;
}

// The executable ranges of the object that holds `addr`.
ObjectRanges rangesOf(const void* addr) {
  ObjectRanges r;
  Dl_info di{};
  if (dladdr(addr, &di) == 0 || di.dli_fbase == nullptr) {
    return r;
  }
  PhdrQuery q{reinterpret_cast<uintptr_t>(addr), &r};
  dl_iterate_phdr(collectRanges, &q);
  return r;
}

void selfMarker() {}

// libc10_cuda.so: the caching allocator's library (a NEEDED of ours). Both
// range lists are leaked on purpose: a cudaFree made while the process's
// static objects are destroyed (the allocator's own teardown) still asks
// where its caller is, and must not read a destroyed vector.
const ObjectRanges& allocatorLib() {
  static const ObjectRanges* r = new ObjectRanges(rangesOf(
      reinterpret_cast<const void*>(&c10::cuda::getCurrentCUDAStream)));
  return *r;
}

const ObjectRanges& selfLib() {
  static const ObjectRanges* r =
      new ObjectRanges(rangesOf(reinterpret_cast<const void*>(&selfMarker)));
  return *r;
}

inline bool fromAllocator(const void* ret) {
  return allocatorLib().contains(reinterpret_cast<uintptr_t>(ret));
}

inline bool fromSelf(const void* ret) {
  return selfLib().contains(reinterpret_cast<uintptr_t>(ret));
}

// ---- the real CUDA runtime --------------------------------------------------

void* realSymbol(const char* name) {
  static void* cudart = dlopen(UM_CUDART_SONAME, RTLD_LAZY | RTLD_NOLOAD);
  void* p = cudart != nullptr ? dlsym(cudart, name) : nullptr;
  if (p == nullptr) {
    p = dlsym(RTLD_NEXT, name);
  }
  if (p == nullptr) {
    // Nothing sensible can run without the runtime; say what is missing.
    fprintf(
        stderr,
        "libtorch_um: cannot find %s in %s: %s\n",
        name,
        UM_CUDART_SONAME,
        dlerror());
    abort();
  }
  return p;
}

// The C signatures (cuda_runtime.h adds C++ template overloads of some).
using MallocFn = cudaError_t (*)(void**, size_t);
using FreeFn = cudaError_t (*)(void*);
using BeginCaptureFn = cudaError_t (*)(cudaStream_t, cudaStreamCaptureMode);
using EndCaptureFn = cudaError_t (*)(cudaStream_t, cudaGraph_t*);
using IpcGetMemHandleFn = cudaError_t (*)(cudaIpcMemHandle_t*, void*);
using MemcpyAsyncFn =
    cudaError_t (*)(void*, const void*, size_t, cudaMemcpyKind, cudaStream_t);

#define UM_REAL(type, fn) \
  static const auto real_##fn = reinterpret_cast<type>(realSymbol(#fn));

// ---- counters ---------------------------------------------------------------

struct Counters {
  std::atomic<uint64_t> attached{0};
  std::atomic<uint64_t> segment_allocs{0};
  std::atomic<uint64_t> segment_frees{0};
  std::atomic<uint64_t> passthrough_mallocs{0};
  std::atomic<uint64_t> passthrough_frees{0};
  std::atomic<uint64_t> block_allocs{0};
  std::atomic<uint64_t> block_frees{0};
  std::atomic<uint64_t> segment_alloc_events{0};
  std::atomic<uint64_t> segment_free_events{0};
  std::atomic<uint64_t> oom_events{0};
  std::atomic<uint64_t> ipc_refusals{0};
};

Counters& counters() {
  static Counters* c = new Counters();
  return *c;
}

constexpr auto kRelaxed = std::memory_order_relaxed;

// Streams being captured into a CUDA graph (begun through this process's
// cudaStreamBeginCapture): while any is, the engine issues no prefetch or
// advice, which would invalidate the capture.
std::mutex& captureMutex() {
  static std::mutex* m = new std::mutex();
  return *m;
}
std::unordered_set<cudaStream_t>& capturingStreams() {
  static auto* s = new std::unordered_set<cudaStream_t>();
  return *s;
}

// Depth of engine calls on this thread. The engine itself calls cudaMalloc
// and cudaFree (UM off, plain fallbacks, releasing a segment); those calls
// land here again and must pass through. The return address cannot tell:
// with tail calls (interposer -> engine -> cudaFree compiled as jumps) it is
// still the allocator's, which once made cudaFree loop forever.
thread_local int t_engine_depth = 0;

struct EngineCall {
  EngineCall() {
    ++t_engine_depth;
  }
  ~EngineCall() {
    --t_engine_depth;
  }
  EngineCall(const EngineCall&) = delete;
  EngineCall& operator=(const EngineCall&) = delete;
};

// PYTORCH_NO_CUDA_MEMORY_CACHING makes the allocator call cudaMalloc per
// tensor; the source path leaves those allocations plain, and so do we.
// Mirrors c10's forceUncachedAllocator().
bool uncachedAllocator() {
  static const bool v = [] {
    auto cuda = c10::utils::check_env("PYTORCH_NO_CUDA_MEMORY_CACHING");
    auto hip = c10::utils::check_env("PYTORCH_NO_HIP_MEMORY_CACHING");
    return cuda.value_or(false) || hip.value_or(false);
  }();
  return v;
}

} // namespace

// ---- the interposed CUDA runtime functions --------------------------------
//
// Exported in the version node of the CUDA runtime (exports.map.in), so that
// libc10_cuda.so's versioned references (cudaMalloc@libcudart.so.N) bind here.

#pragma GCC visibility push(default)
extern "C" {

__attribute__((noinline)) cudaError_t cudaMalloc(void** devPtr, size_t size) {
  UM_REAL(MallocFn, cudaMalloc);
  const void* ret = __builtin_return_address(0);
  if (t_engine_depth > 0 || !fromAllocator(ret) || uncachedAllocator()) {
    if (t_engine_depth == 0 && !fromSelf(ret)) {
      counters().passthrough_mallocs.fetch_add(1, kRelaxed);
    }
    return real_cudaMalloc(devPtr, size);
  }
  counters().segment_allocs.fetch_add(1, kRelaxed);
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) {
    return e;
  }
  auto device = static_cast<c10::DeviceIndex>(dev);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  // As on the source path: whether this stream captures; captures on other
  // streams reach the engine through captureBegin/captureEnd below.
  bool capturing = at::cuda::currentStreamCaptureStatusMayInitCtx() !=
      at::cuda::CaptureStatus::None;
  EngineCall scope;
  cudaError_t result =
      c10::cuda::um::allocSegment(devPtr, size, device, stream, capturing);
  return result;
}

__attribute__((noinline)) cudaError_t cudaFree(void* devPtr) {
  UM_REAL(FreeFn, cudaFree);
  const void* ret = __builtin_return_address(0);
  if (t_engine_depth > 0 || !fromAllocator(ret)) {
    if (t_engine_depth == 0 && !fromSelf(ret)) {
      counters().passthrough_frees.fetch_add(1, kRelaxed);
    }
    return real_cudaFree(devPtr);
  }
  counters().segment_frees.fetch_add(1, kRelaxed);
  // The engine forgets the segment if it is managed and calls cudaFree,
  // which comes back here inside the EngineCall scope and passes through.
  EngineCall scope;
  cudaError_t result = c10::cuda::um::freeSegment(devPtr);
  return result;
}

cudaError_t cudaStreamBeginCapture(
    cudaStream_t stream,
    enum cudaStreamCaptureMode mode) {
  UM_REAL(BeginCaptureFn, cudaStreamBeginCapture);
  // Counted before the capture starts, so that no allocation racing with it
  // on another thread prefetches into it.
  {
    std::lock_guard<std::mutex> lock(captureMutex());
    if (capturingStreams().insert(stream).second) {
      c10::cuda::um::captureBegin();
    }
  }
  cudaError_t e = real_cudaStreamBeginCapture(stream, mode);
  if (e != cudaSuccess) {
    std::lock_guard<std::mutex> lock(captureMutex());
    if (capturingStreams().erase(stream) > 0) {
      c10::cuda::um::captureEnd();
    }
  }
  return e;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  UM_REAL(EndCaptureFn, cudaStreamEndCapture);
  cudaError_t e = real_cudaStreamEndCapture(stream, pGraph);
  // The capture is over whether it succeeded or was invalidated.
  std::lock_guard<std::mutex> lock(captureMutex());
  if (capturingStreams().erase(stream) > 0) {
    c10::cuda::um::captureEnd();
  }
  return e;
}

__attribute__((noinline)) cudaError_t cudaIpcGetMemHandle(
    cudaIpcMemHandle_t* handle,
    void* devPtr) {
  UM_REAL(IpcGetMemHandleFn, cudaIpcGetMemHandle);
  // Only the caching allocator's call (C++ with unwind tables) may receive
  // the engine's c10::Error; anyone else gets CUDA's own error code.
  if (t_engine_depth == 0 && fromAllocator(__builtin_return_address(0)) &&
      torch_um_is_managed(devPtr)) {
    counters().ipc_refusals.fetch_add(1, kRelaxed);
    c10::cuda::um::checkIpcExportable(devPtr); // throws
  }
  return real_cudaIpcGetMemHandle(handle, devPtr);
}

// Note [Copies of managed host memory by kernel] (HostCopy.h): torch's copies
// of a CPU tensor in managed host memory run as the engine's copy kernel, and
// copies of pageable memory leave the GPU side's bytes in host RAM to CPU
// threads (Note [Copies of pageable memory past the budget]); every other
// copy, from any caller, goes to the runtime unchanged.
__attribute__((noinline)) cudaError_t cudaMemcpyAsync(
    void* dst,
    const void* src,
    size_t count,
    enum cudaMemcpyKind kind,
    cudaStream_t stream) {
  UM_REAL(MemcpyAsyncFn, cudaMemcpyAsync);
  cudaError_t result = cudaSuccess;
  if (t_engine_depth == 0 &&
      (c10::cuda::um::copyByKernel(dst, src, count, kind, stream, &result) ||
       c10::cuda::um::copyPageable(
           dst, src, count, kind, stream, real_cudaMemcpyAsync, &result))) {
    return result;
  }
  return real_cudaMemcpyAsync(dst, src, count, kind, stream);
}

} // extern "C"
#pragma GCC visibility pop

// ---- C API of the injection path --------------------------------------------

namespace {

using c10::cuda::um::writeError;

// Compatibility (trace tracker): TraceEntry by the name every version has
// (2.10+ moved it to c10::CachingDeviceAllocator, with a using-declaration here).
void onTrace(const c10::cuda::CUDACachingAllocator::TraceEntry& e) {
  using A = c10::cuda::CUDACachingAllocator::TraceEntry::Action;
  // Called with the allocator's device lock held: counters only (the
  // engine's inlet is a tracker of its own, Events.cpp).
  switch (e.action_) {
    case A::ALLOC:
      counters().block_allocs.fetch_add(1, kRelaxed);
      break;
    case A::FREE_COMPLETED:
      counters().block_frees.fetch_add(1, kRelaxed);
      break;
    case A::SEGMENT_ALLOC:
      counters().segment_alloc_events.fetch_add(1, kRelaxed);
      break;
    case A::SEGMENT_FREE:
      counters().segment_free_events.fetch_add(1, kRelaxed);
      break;
    default:
      break;
  }
}

void onOutOfMemory(int64_t device, size_t, size_t, size_t) {
  // Called without the allocator lock, just before OutOfMemoryError is
  // raised. The injection path cannot change that error's text, so the
  // engine's numbers (why the cap or headroom refused) come as a warning.
  counters().oom_events.fetch_add(1, kRelaxed);
  std::string report =
      c10::cuda::um::oomReport(static_cast<c10::DeviceIndex>(device));
  if (!report.empty()) {
    TORCH_WARN("CUDA out of memory under unified memory.", report);
  }
}

} // namespace

extern "C" {

TORCH_UM_API int torch_um_inject_attach(char* err, size_t errlen) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (counters().attached.load() != 0) {
    return 0;
  }
  try {
    auto* alloc = c10::cuda::CUDACachingAllocator::get();
    if (alloc == nullptr) {
      return writeError(err, errlen, "the CUDA caching allocator is not set up");
    }
    std::string name = alloc->name();
    if (name != "native") {
      writeError(
          err,
          errlen,
          "the CUDA allocator backend is '" + name +
              "', not the native caching allocator: unified memory does not "
              "apply to it");
      return 1;
    }
    alloc->attachAllocatorTraceTracker(onTrace);
    alloc->attachOutOfMemoryObserver(onOutOfMemory);
    // The engine's own inlet: ALLOC and FREE_COMPLETED drive residency.
    c10::cuda::um::attachBlockEvents();
    counters().attached.store(1);
    return 0;
  } catch (const c10::Error& e) {
    return writeError(err, errlen, e.what_without_backtrace());
  } catch (const std::exception& e) {
    return writeError(err, errlen, e.what());
  }
}

TORCH_UM_API const char* torch_um_inject_library_path(void) {
  void* sym = dlsym(RTLD_DEFAULT, "cudaMalloc");
  if (sym == nullptr || !selfLib().contains(reinterpret_cast<uintptr_t>(sym))) {
    return nullptr;
  }
  return selfLib().path.c_str();
}

TORCH_UM_API int torch_um_inject_info(TorchUmInjectInfo* out) {
  // struct_size itself is written back: a caller's struct holds at least it.
  if (out == nullptr || out->struct_size < sizeof(uint64_t)) {
    return -1;
  }
  Counters& c = counters();
  TorchUmInjectInfo s{};
  s.struct_size = sizeof(s);
  s.interposed = torch_um_inject_library_path() != nullptr ? 1 : 0;
  s.attached = c.attached.load();
  s.segment_allocs = c.segment_allocs.load();
  s.segment_frees = c.segment_frees.load();
  s.passthrough_mallocs = c.passthrough_mallocs.load();
  s.passthrough_frees = c.passthrough_frees.load();
  s.block_allocs = c.block_allocs.load();
  s.block_frees = c.block_frees.load();
  s.segment_alloc_events = c.segment_alloc_events.load();
  s.segment_free_events = c.segment_free_events.load();
  s.oom_events = c.oom_events.load();
  {
    std::lock_guard<std::mutex> lock(captureMutex());
    s.captures_underway = capturingStreams().size();
  }
  s.ipc_refusals = c.ipc_refusals.load();
  uint64_t caller = out->struct_size;
  std::memcpy(out, &s, std::min<size_t>(caller, sizeof(s)));
  out->struct_size = caller;
  return 0;
}

} // extern "C"
