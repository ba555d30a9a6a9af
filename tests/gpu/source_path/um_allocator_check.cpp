// GPU check of the source path: c10's CUDA caching allocator from a rebuilt
// libc10_cuda.so (patched upstream c10/cuda + engine), driven through c10's
// own allocator API, no torch install needed. Built against the official
// wheel's headers; see run_on_device.sh for how it is built and run.
//
//   um_allocator_check on    unified memory on (the UM wheel's default)
//   um_allocator_check off   PYTORCH_CUDA_UM_CONF=enabled:False must be set
//
// Safety (docs/design.md, "Safety rule for every GPU run"): before the first allocation the total
// managed cap is set to min(80 % of free GPU memory, 4 GiB) and the device
// budget to 1 GiB; no step asks for more than 2.5 GiB of managed memory.
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../../../c10_overlay/c10/cuda/um/c_api.h"

namespace alloc = c10::cuda::CUDACachingAllocator;

static int failures = 0;

#define CHECK(cond, ...)                                              \
  do {                                                                \
    bool ok_ = (cond);                                                \
    std::printf("%s  %s:%d  ", ok_ ? "PASS" : "FAIL", __FILE__, __LINE__); \
    std::printf(__VA_ARGS__);                                         \
    std::printf("\n");                                                \
    std::fflush(stdout);                                              \
    if (!ok_)                                                         \
      ++failures;                                                     \
  } while (0)

#define CUDA_OK(expr)                                                   \
  do {                                                                  \
    cudaError_t e_ = (expr);                                            \
    if (e_ != cudaSuccess) {                                            \
      std::printf("FAIL  %s:%d  %s -> %s\n", __FILE__, __LINE__, #expr, \
                  cudaGetErrorString(e_));                              \
      ++failures;                                                       \
    }                                                                   \
  } while (0)

static constexpr uint64_t MiB = 1ull << 20;

// In a torch process libtorch_cuda registers this hook (it asks the driver
// whether the device's primary context exists). This program has no
// libtorch_cuda; main() creates the context of device 0 before any use.
static bool primaryContextExists(c10::DeviceIndex device) {
  return device == 0;
}
namespace c10::cuda::_internal {
// Exported by libc10_cuda.so; declared in no shipped header.
C10_CUDA_API void setHasPrimaryContext(bool (*func)(c10::DeviceIndex));
} // namespace c10::cuda::_internal

static cudaMemoryType memoryType(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return cudaMemoryTypeUnregistered;
  }
  return a.type;
}

static TorchUmStats umStats() {
  TorchUmStats s{};
  s.struct_size = sizeof(s);
  torch_um_get_stats(0, &s);
  return s;
}

// Fill `bytes` at p with `value` on `stream`, read it back, check every byte.
static bool fillAndCheck(void* p, size_t bytes, int value, cudaStream_t stream) {
  std::vector<unsigned char> host(bytes, 0);
  if (cudaMemsetAsync(p, value, bytes, stream) != cudaSuccess ||
      cudaMemcpyAsync(host.data(), p, bytes, cudaMemcpyDeviceToHost, stream) !=
          cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess) {
    return false;
  }
  for (unsigned char b : host) {
    if (b != static_cast<unsigned char>(value)) {
      return false;
    }
  }
  return true;
}

static int64_t reserved() {
  return alloc::getDeviceStats(0)
      .reserved_bytes[static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)]
      .current;
}

static void checkOff() {
  // UM off: the allocator must behave as stock torch, plain device memory.
  void* p = alloc::raw_alloc(64 * MiB);
  CHECK(memoryType(p) == cudaMemoryTypeDevice,
        "UM off: allocator block is device memory (type %d)", memoryType(p));
  CHECK(torch_um_enabled() == 0, "UM off: engine reports disabled");
  CHECK(umStats().managed_segments == 0, "UM off: no managed segments");
  CHECK(fillAndCheck(p, 64 * MiB, 0x5a, nullptr), "UM off: data round trip");
  alloc::raw_delete(p);
  alloc::emptyCache();
  CHECK(reserved() == 0, "UM off: emptyCache returned all segments");
}

static void checkOn(uint64_t cap) {
  CHECK(torch_um_enabled() == 1, "UM on: engine reports enabled");

  // 1. Managed pointers, counted by the engine, consistent with c10's stats.
  void* a = alloc::raw_alloc(64 * MiB);
  CHECK(memoryType(a) == cudaMemoryTypeManaged,
        "UM on: allocator block is managed memory (type %d)", memoryType(a));
  CHECK(torch_um_is_managed(a) == 1, "engine knows the block is managed");
  TorchUmStats s = umStats();
  CHECK(s.managed_segments >= 1 && s.managed_bytes >= 64 * MiB,
        "engine counts managed segments (%llu segs, %llu bytes)",
        (unsigned long long)s.managed_segments,
        (unsigned long long)s.managed_bytes);
  CHECK((int64_t)s.managed_bytes == reserved(),
        "engine managed bytes (%llu) == allocator reserved bytes (%lld)",
        (unsigned long long)s.managed_bytes, (long long)reserved());
  CHECK(s.prefetches >= 1, "segment was prefetched to the device (%llu)",
        (unsigned long long)s.prefetches);
  CHECK(fillAndCheck(a, 64 * MiB, 0x11, nullptr), "managed block data round trip");

  // 2. Allocate, free and reuse across two streams with data checked.
  cudaStream_t s1 = nullptr, s2 = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  void* b1 = alloc::raw_alloc_with_stream(32 * MiB, s1);
  CHECK(fillAndCheck(b1, 32 * MiB, 0x22, s1), "stream 1 block data");
  alloc::raw_delete(b1);
  void* b1again = alloc::raw_alloc_with_stream(32 * MiB, s1);
  CHECK(b1again == b1, "freed block reused on the same stream");
  CHECK(fillAndCheck(b1again, 32 * MiB, 0x33, s1), "reused block data");
  void* b2 = alloc::raw_alloc_with_stream(32 * MiB, s2);
  CHECK(b2 != b1again, "a live block is not handed to another stream");
  CHECK(memoryType(b2) == cudaMemoryTypeManaged, "stream 2 block is managed");
  CHECK(fillAndCheck(b2, 32 * MiB, 0x44, s2), "stream 2 block data");
  CHECK(fillAndCheck(b1again, 32 * MiB, 0x33, s1) , "stream 1 data intact");
  alloc::raw_delete(b1again);
  alloc::raw_delete(b2);
  alloc::raw_delete(a);

  // 3. emptyCache returns managed segments.
  alloc::emptyCache();
  s = umStats();
  CHECK(s.managed_segments == 0 && s.managed_bytes == 0 && reserved() == 0,
        "emptyCache released every managed segment (%llu left, reserved %lld)",
        (unsigned long long)s.managed_segments, (long long)reserved());

  // 4. Device budget: 1 GiB on the device, the rest placed in host RAM.
  std::vector<void*> big;
  for (int i = 0; i < 3; ++i) {
    big.push_back(alloc::raw_alloc(512 * MiB));
  }
  s = umStats();
  CHECK(s.device_placed_bytes == 1024 * MiB && s.host_placed_bytes == 512 * MiB,
        "budget 1 GiB: %llu MiB placed on device, %llu MiB in host RAM",
        (unsigned long long)(s.device_placed_bytes / MiB),
        (unsigned long long)(s.host_placed_bytes / MiB));
  int preferred = -99;
  CUDA_OK(cudaMemRangeGetAttribute(&preferred, sizeof(preferred),
                                   cudaMemRangeAttributePreferredLocation,
                                   big[2], 512 * MiB));
  CHECK(preferred == cudaCpuDeviceId,
        "segment past the budget prefers host RAM (preferred location %d)",
        preferred);
  CHECK(fillAndCheck(big[2], 512 * MiB, 0x66, nullptr),
        "GPU writes and reads the host-placed segment");
  for (void* p : big) {
    alloc::raw_delete(p);
  }
  alloc::emptyCache();

  // 5. The cap raises OutOfMemoryError with UM numbers; the process goes on.
  char err[512];
  std::string conf = "max_managed:" + std::to_string(512 * MiB);
  CHECK(torch_um_configure(conf.c_str(), err, sizeof(err)) == 0,
        "set max_managed to 512 MiB at run time");
  bool oom = false;
  std::string msg;
  try {
    void* p = alloc::raw_alloc(768 * MiB);
    alloc::raw_delete(p);
  } catch (const c10::OutOfMemoryError& e) {
    oom = true;
    msg = e.what_without_backtrace();
  }
  CHECK(oom, "allocation past max_managed raised OutOfMemoryError");
  CHECK(msg.find("max_managed") != std::string::npos &&
            msg.find("Unified memory") != std::string::npos,
        "OOM message carries the UM numbers: ...%s",
        msg.substr(msg.size() > 400 ? msg.size() - 400 : 0).c_str());
  CHECK(umStats().cap_refusals >= 1, "engine counted the cap refusal");
  void* after = alloc::raw_alloc(64 * MiB);
  CHECK(after != nullptr && fillAndCheck(after, 64 * MiB, 0x77, nullptr),
        "allocations work again after the OOM");
  alloc::raw_delete(after);
  conf = "max_managed:" + std::to_string(cap);
  CHECK(torch_um_configure(conf.c_str(), err, sizeof(err)) == 0,
        "restore the safety cap");
  // An OOM no refusal caused (a stock memory fraction) must not repeat the
  // earlier refusal's reason.
  size_t total_mem = 0, free_mem = 0;
  CUDA_OK(cudaMemGetInfo(&free_mem, &total_mem));
  alloc::setMemoryFraction(double(128 * MiB) / double(total_mem), 0);
  msg.clear();
  try {
    void* p = alloc::raw_alloc(1024 * MiB);
    alloc::raw_delete(p);
  } catch (const c10::OutOfMemoryError& e) {
    msg = e.what_without_backtrace();
  }
  alloc::setMemoryFraction(1.0, 0);
  CHECK(!msg.empty() && msg.find("Unified memory") != std::string::npos &&
            msg.find("Refused by unified memory") == std::string::npos,
        "an OOM from the memory fraction carries no stale refusal: ...%s",
        msg.substr(msg.size() > 300 ? msg.size() - 300 : 0).c_str());

  // 6. IPC export of a managed block is refused with a clear error.
  void* shared = alloc::raw_alloc(4 * MiB);
  std::string ipc;
  try {
    (void)alloc::shareIpcHandle(shared);
  } catch (const c10::Error& e) {
    ipc = e.what_without_backtrace();
  }
  CHECK(ipc.find("unified (managed) memory") != std::string::npos &&
            ipc.find("enabled:False") != std::string::npos,
        "IPC handle request refused: %s", ipc.substr(0, 160).c_str());
  alloc::raw_delete(shared);

  // 7. Graph capture with an allocation inside succeeds and replays.
  {
    cudaStream_t cs = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    c10::cuda::CUDAStream stream = c10::cuda::getStreamFromExternal(cs, 0);
    c10::cuda::CUDAStreamGuard guard(stream);
    c10::cuda::MempoolId_t pool{0, 4242};
    uint64_t skipped_before = umStats().prefetches_skipped_capture;
    unsigned char* pinned = nullptr;
    CUDA_OK(cudaMallocHost(reinterpret_cast<void**>(&pinned), 8 * MiB));
    alloc::beginAllocateToPool(0, pool, [cs](cudaStream_t s) { return s == cs; });
    CUDA_OK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
    void* g = alloc::raw_alloc_with_stream(8 * MiB, cs);
    CUDA_OK(cudaMemsetAsync(g, 0x5c, 8 * MiB, cs));
    CUDA_OK(cudaMemcpyAsync(pinned, g, 8 * MiB, cudaMemcpyDeviceToHost, cs));
    cudaGraph_t graph = nullptr;
    cudaError_t end = cudaStreamEndCapture(cs, &graph);
    CHECK(end == cudaSuccess, "capture with an allocation inside ended cleanly (%s)",
          cudaGetErrorString(end));
    alloc::endAllocateToPool(0, pool);
    CHECK(memoryType(g) == cudaMemoryTypeManaged, "captured allocation is managed");
    CHECK(umStats().prefetches_skipped_capture > skipped_before,
          "no prefetch was issued inside the capture");
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    std::memset(pinned, 0, 8 * MiB);
    CUDA_OK(cudaGraphLaunch(exec, cs));
    CUDA_OK(cudaStreamSynchronize(cs));
    bool good = true;
    for (size_t i = 0; i < 8 * MiB; ++i) {
      good = good && pinned[i] == 0x5c;
    }
    CHECK(good, "graph replay wrote the captured allocation and copied it back");
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
    alloc::raw_delete(g);
    alloc::releasePool(0, pool);
    CUDA_OK(cudaFreeHost(pinned));
  }

  // 8. Expandable segments are dropped in UM mode.
  c10::cuda::CUDACachingAllocator::setAllocatorSettings("expandable_segments:True");
  CHECK(!alloc::CUDAAllocatorConfig::expandable_segments(),
        "expandable_segments:True is ignored while UM is on");
  void* e = alloc::raw_alloc(64 * MiB);
  CHECK(memoryType(e) == cudaMemoryTypeManaged, "segments stay managed");
  alloc::raw_delete(e);
  alloc::emptyCache();
  CHECK(umStats().managed_segments == 0, "all managed segments released at exit");
  CUDA_OK(cudaStreamDestroy(s1));
  CUDA_OK(cudaStreamDestroy(s2));
}

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "on";
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("SKIP  no CUDA device\n");
    return 0;
  }
  CUDA_OK(cudaSetDevice(0));
  size_t free_b = 0, total_b = 0;
  CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("device %s, %.1f GiB total, %.1f GiB free, driver API %d, runtime %d, mode %s\n",
              prop.name, total_b / 1073741824.0, free_b / 1073741824.0, driver,
              runtime, mode.c_str());
  // Safety first: cap managed memory before anything is allocated.
  uint64_t cap = std::min<uint64_t>(free_b / 10 * 8, 4096 * MiB);
  std::string conf = "max_managed:" + std::to_string(cap) + ",device_budget:1GiB";
  char err[512] = {0};
  if (torch_um_configure(conf.c_str(), err, sizeof(err)) != 0) {
    std::printf("FAIL  cannot set the safety cap: %s\n", err);
    return 1;
  }
  char cfg[256];
  torch_um_get_config(cfg, sizeof(cfg));
  std::printf("engine config: %s\n", cfg);
  c10::cuda::_internal::setHasPrimaryContext(primaryContextExists);
  alloc::init(count);
  try {
    if (mode == "off") {
      checkOff();
    } else {
      checkOn(cap);
    }
  } catch (const std::exception& e) {
    std::printf("FAIL  uncaught exception: %s\n", e.what());
    ++failures;
  }
  std::printf("%s: %d failed\n", failures == 0 ? "OK" : "FAILED", failures);
  return failures == 0 ? 0 : 1;
}
