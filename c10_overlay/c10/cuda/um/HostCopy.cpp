#include <c10/cuda/um/HostCopy.h>

#include <c10/cuda/um/Engine.h>
#include <c10/cuda/um/HostMemory.h>

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace c10::cuda::um {
namespace {

// The kernel (Note [Lean copies], torch/cuda/_um_copy.py): each of 1024
// threads a block keeps eight 16-byte loads in flight, so that a few blocks
// carry the link; 16-byte words where source and destination are aligned
// alike modulo 16, bytes otherwise. No header: a word is a struct of two
// 64-bit halves, aligned to 16, which the compiler moves as one access.
constexpr const char* kKernelName = "um_lean_copy";
constexpr const char* kKernelSource = R"(
struct __align__(16) um_word { unsigned long long lo, hi; };
extern "C" __global__ void __launch_bounds__(1024, 1)
um_lean_copy(unsigned char* __restrict__ dst, const unsigned char* __restrict__ src,
             unsigned long long n) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  const unsigned long long t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned long long d0 = (unsigned long long)dst;
  if (((d0 ^ (unsigned long long)src) & 15ull) != 0ull) {
    for (unsigned long long j = t; j < n; j += stride) dst[j] = src[j];
    return;
  }
  unsigned long long head = (16ull - (d0 & 15ull)) & 15ull;
  if (head > n) head = n;
  const unsigned long long words = (n - head) / 16ull;
  const um_word* s = reinterpret_cast<const um_word*>(src + head);
  um_word* d = reinterpret_cast<um_word*>(dst + head);
  unsigned long long i = t;
  for (; i + 7ull * stride < words; i += 8ull * stride) {
    um_word v[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = s[i + k * stride];
#pragma unroll
    for (int k = 0; k < 8; ++k) d[i + k * stride] = v[k];
  }
  for (; i < words; i += stride) d[i] = s[i];
  for (unsigned long long j = t; j < head; j += stride) dst[j] = src[j];
  for (unsigned long long j = head + words * 16ull + t; j < n; j += stride) dst[j] = src[j];
}
)";

// The C signatures of the NVRTC and driver functions used, their handles as
// pointers, so that no NVRTC or driver header is needed.
using NvrtcCreateFn =
    int (*)(void**, const char*, const char*, int, const char* const*, const char* const*);
using NvrtcCompileFn = int (*)(void*, int, const char* const*);
using NvrtcSizeFn = int (*)(void*, size_t*);
using NvrtcGetFn = int (*)(void*, char*);
using NvrtcDestroyFn = int (*)(void**);
using ModuleLoadFn = int (*)(void**, const void*);
using ModuleGetFunctionFn = int (*)(void**, void*, const char*);
using LaunchFn = int (*)(
    void* function,
    unsigned grid_x,
    unsigned grid_y,
    unsigned grid_z,
    unsigned block_x,
    unsigned block_y,
    unsigned block_z,
    unsigned shared_bytes,
    void* stream,
    void** params,
    void** extra);

void* openLibrary(const std::string& name) {
  void* lib = dlopen(name.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  return lib != nullptr ? lib : dlopen(name.c_str(), RTLD_LAZY | RTLD_LOCAL);
}

void* driver() {
  static void* lib = openLibrary("libcuda.so.1");
  return lib;
}

LaunchFn launcher() {
  static const LaunchFn fn = driver() == nullptr
      ? nullptr
      : reinterpret_cast<LaunchFn>(dlsym(driver(), "cuLaunchKernel"));
  return fn;
}

template <typename Fn>
Fn symbol(void* lib, const char* name, std::string& why) {
  void* p = lib != nullptr ? dlsym(lib, name) : nullptr;
  if (p == nullptr && why.empty()) {
    why = std::string("no ") + name;
  }
  return reinterpret_cast<Fn>(p);
}

// Compiles the kernel for `device`, which is current: its CUfunction, or
// nullptr with `why`.
void* compileKernel(int device, std::string& why) {
  int major = 0;
  int minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) !=
          cudaSuccess) {
    why = "cannot read the device's compute capability";
    return nullptr;
  }
  // The NVRTC of the CUDA major version the engine was built for (torch's).
  const std::string nvrtc_name = "libnvrtc.so." + std::to_string(CUDART_VERSION / 1000);
  void* nvrtc = openLibrary(nvrtc_name);
  if (nvrtc == nullptr) {
    why = "cannot load " + nvrtc_name;
    return nullptr;
  }
  auto create = symbol<NvrtcCreateFn>(nvrtc, "nvrtcCreateProgram", why);
  auto compile = symbol<NvrtcCompileFn>(nvrtc, "nvrtcCompileProgram", why);
  auto cubin_size = symbol<NvrtcSizeFn>(nvrtc, "nvrtcGetCUBINSize", why);
  auto get_cubin = symbol<NvrtcGetFn>(nvrtc, "nvrtcGetCUBIN", why);
  auto log_size = symbol<NvrtcSizeFn>(nvrtc, "nvrtcGetProgramLogSize", why);
  auto get_log = symbol<NvrtcGetFn>(nvrtc, "nvrtcGetProgramLog", why);
  auto destroy = symbol<NvrtcDestroyFn>(nvrtc, "nvrtcDestroyProgram", why);
  auto load = symbol<ModuleLoadFn>(driver(), "cuModuleLoadData", why);
  auto get_function = symbol<ModuleGetFunctionFn>(driver(), "cuModuleGetFunction", why);
  if (!why.empty()) {
    return nullptr;
  }
  void* program = nullptr;
  if (create(&program, kKernelSource, "um_lean_copy.cu", 0, nullptr, nullptr) != 0) {
    why = "nvrtcCreateProgram failed";
    return nullptr;
  }
  const std::string arch =
      "--gpu-architecture=sm_" + std::to_string(major) + std::to_string(minor);
  const char* options[] = {arch.c_str()};
  std::string cubin;
  if (compile(program, 1, options) != 0) {
    size_t n = 0;
    std::string log;
    if (log_size(program, &n) == 0 && n > 1) {
      log.resize(n);
      get_log(program, log.data());
      log.resize(n - 1);
    }
    why = "NVRTC could not compile it with " + arch + ": " + log;
  } else {
    size_t n = 0;
    if (cubin_size(program, &n) == 0 && n > 0) {
      cubin.resize(n);
      if (get_cubin(program, cubin.data()) != 0) {
        cubin.clear();
      }
    }
    if (cubin.empty()) {
      why = "NVRTC gave no binary";
    }
  }
  destroy(&program);
  if (cubin.empty()) {
    return nullptr;
  }
  // The module is never unloaded: its kernel is used until the process ends.
  void* module = nullptr;
  void* function = nullptr;
  int rc = load(&module, cubin.data());
  if (rc == 0) {
    rc = get_function(&function, module, kKernelName);
  }
  if (rc != 0 || function == nullptr) {
    why = "the driver could not load it (CUresult " + std::to_string(rc) + ")";
    return nullptr;
  }
  return function;
}

constexpr int kMaxDevices = 64;

struct Kernels {
  std::mutex mu; // compiles
  std::array<std::atomic<void*>, kMaxDevices> function{};
  std::array<std::string, kMaxDevices> why; // under mu: why there is none
  std::array<bool, kMaxDevices> tried{};
};

Kernels& kernels() {
  static auto* k = new Kernels();
  return *k;
}

struct Counters {
  std::atomic<uint64_t> copies{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> failures{0};
  std::atomic<uint64_t> cpu_bytes{0};
  std::atomic<uint64_t> pageable_copies{0};
  std::atomic<uint64_t> pageable_cpu_bytes{0};
  std::atomic<uint64_t> pageable_staged_bytes{0};
};
Counters& counters() {
  static auto* c = new Counters();
  return *c;
}

constexpr auto kRelaxed = std::memory_order_relaxed;

// The copies under this size go to the driver: a launch and a wait cost more
// than the driver's copy.
constexpr size_t kKernelCopyMinBytes = size_t{1} << 20;

// The kinds of copy the engine takes: host-to-device and device-to-host.
bool hostAndDevice(cudaMemcpyKind kind) {
  return kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToHost;
}

// Whether a copy on `stream` must go to the driver as it is: no advice and
// no host wait while any stream captures (a capture in global mode forbids
// them on every thread), nor on a capturing stream.
bool underCapture(const Engine& engine, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  return engine.capturesUnderway() || cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone;
}

// Whether a cudaMemcpyAsync's arguments are of a kind the kernel takes, its
// host side not yet checked: host-to-device or device-to-host, at least
// kKernelCopyMinBytes, source and destination aligned alike modulo 16.
bool kernelCopyShape(const void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (!hostAndDevice(kind)) {
    return false;
  }
  const auto d = reinterpret_cast<uintptr_t>(dst);
  const auto s = reinterpret_cast<uintptr_t>(src);
  return count >= kKernelCopyMinBytes && ((d ^ s) & 15u) == 0;
}

// Note [Copies shared with the CPU]: the CPU takes no part of a copy under
// kCpuPartMinBytes (threads cost more than they bring), and each thread at
// least kCpuPartMinBytes / 4 of it.
constexpr size_t kCpuPartMinBytes = size_t{64} << 20;
constexpr size_t kCpuCopyThreads = 16;

// The bytes of a `count`-byte copy that CPU threads take: up to `share` of
// it, within the part whose both sides lie in host RAM (`host_tail` bytes at
// the end), in whole pages.
size_t cpuPart(size_t count, uint64_t host_tail, double share) {
  if (count < kCpuPartMinBytes || share <= 0) {
    return 0;
  }
  const auto want = static_cast<size_t>(static_cast<double>(count) * share);
  const size_t part = std::min<size_t>(want, host_tail) & ~size_t{4095};
  return part >= kCpuPartMinBytes / 4 ? part : 0;
}

// Note [Copies of pageable memory past the budget]: the smallest copy taken,
// and the fewest bytes of it in host RAM.
constexpr size_t kPageableMinBytes = size_t{1} << 20;

// memcpy of the bytes of `runs` (offsets into both buffers) from up to
// kCpuCopyThreads threads, the calling one included; `total` is their sum.
// The CPU's part of a kernel copy is one run (Note [Copies shared with the
// CPU]), of a pageable copy the GPU side's runs in host RAM.
void copyRunsOnCpu(
    char* dst,
    const char* src,
    const std::vector<Residency::Run>& runs,
    uint64_t total) {
  onParts(total, kCpuPartMinBytes / 4, kCpuCopyThreads, [&](size_t lo, size_t hi) {
    uint64_t start = 0; // of the run, counted over the runs' bytes
    for (const Residency::Run& run : runs) {
      const uint64_t end = start + run.bytes;
      if (lo < end && hi > start) {
        const uint64_t a = std::max<uint64_t>(lo, start) - start + run.offset;
        const uint64_t b = std::min<uint64_t>(hi, end) - start + run.offset;
        std::memcpy(dst + a, src + a, b - a);
      }
      start = end;
    }
  });
}

// Whether `ptr` is pageable memory: neither page-locked, nor managed, nor a
// device's. A failed query clears the runtime's last error it set.
bool pageable(const void* ptr) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeUnregistered;
}

// Note [Pageable bytes on the device go through page-locked buffers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The bytes of such a copy on the device must cross the link, and the
// driver's copy of pageable memory does that at about 10 GB/s on the H200
// host (bench/README.md, step 52: 4 GiB in 0.4 s) against 52 for page-locked
// memory. So they go through kBounceWorkers page-locked buffers of
// kBounceBytes per device, made at the first such copy and kept (128 MiB of
// page-locked host RAM): each worker thread takes the next piece, and either
// fills its buffer from the pageable side and queues the buffer's copy to the
// device, or queues the copy from the device into its buffer, waits for it
// and empties the buffer into the pageable side. The copies to and from the
// buffers are queued on the copy's stream, so a copy engine moves one while
// CPU threads fill or empty the others. A buffer is written again only after
// an event recorded behind its last copy has passed, across calls too. One
// copy at a time uses a device's buffers: another one meanwhile, or one
// where the buffers could not be made, hands its pieces to the driver.
constexpr size_t kBounceBytes = size_t{16} << 20;
constexpr size_t kBounceWorkers = 8;

struct Bounce {
  std::mutex mu; // held by the copy using the buffers
  bool tried = false; // under mu
  std::vector<char*> buffers; // under mu: kBounceWorkers, page-locked
  std::vector<cudaEvent_t> done; // under mu: behind each buffer's last copy
};

Bounce& bounce(int device) {
  static auto* sets = new std::array<Bounce, kMaxDevices>();
  return (*sets)[device];
}

// Makes b's buffers and events on the current device once; requires b.mu.
// False where they cannot be had (then never tried again).
bool ready(Bounce& b) {
  if (!b.tried) {
    b.tried = true;
    for (size_t i = 0; i < kBounceWorkers; ++i) {
      void* p = nullptr;
      cudaEvent_t e = nullptr;
      if (cudaHostAlloc(&p, kBounceBytes, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        break;
      }
      if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        (void)cudaFreeHost(p);
        break;
      }
      b.buffers.push_back(static_cast<char*>(p));
      b.done.push_back(e);
    }
    if (b.buffers.size() < kBounceWorkers) {
      for (size_t i = 0; i < b.buffers.size(); ++i) {
        (void)cudaFreeHost(b.buffers[i]);
        (void)cudaEventDestroy(b.done[i]);
      }
      b.buffers.clear();
      b.done.clear();
    }
  }
  return !b.buffers.empty();
}

// Note [Pageable bytes on the device go through page-locked buffers]: copies
// `pieces` between the pageable side and the device through b's buffers;
// requires b.mu and ready(b). The first error of a CUDA call, after which no
// further piece is started.
cudaError_t copyStaged(
    Bounce& b,
    int device,
    char* d,
    const char* s,
    const std::vector<Residency::Run>& pieces,
    bool to_device,
    cudaStream_t stream,
    MemcpyAsyncFn driver) {
  std::atomic<size_t> next{0};
  std::atomic<int> first_error{cudaSuccess};
  auto work = [&](size_t w) {
    cudaError_t e = cudaSetDevice(device);
    char* buf = b.buffers[w];
    cudaEvent_t done = b.done[w];
    for (size_t k = next++; e == cudaSuccess && k < pieces.size() &&
         first_error.load(kRelaxed) == cudaSuccess;
         k = next++) {
      const Residency::Run& p = pieces[k];
      if (to_device) {
        e = cudaEventSynchronize(done); // the buffer's last copy has read it
        if (e == cudaSuccess) {
          std::memcpy(buf, s + p.offset, p.bytes);
          e = driver(d + p.offset, buf, p.bytes, cudaMemcpyHostToDevice, stream);
        }
        if (e == cudaSuccess) {
          e = cudaEventRecord(done, stream);
        }
      } else {
        e = driver(buf, s + p.offset, p.bytes, cudaMemcpyDeviceToHost, stream);
        if (e == cudaSuccess) {
          e = cudaEventRecord(done, stream);
        }
        if (e == cudaSuccess) {
          e = cudaEventSynchronize(done);
        }
        if (e == cudaSuccess) {
          std::memcpy(d + p.offset, buf, p.bytes);
        }
      }
    }
    if (e != cudaSuccess) {
      int none = cudaSuccess;
      first_error.compare_exchange_strong(none, e);
    }
  };
  std::vector<std::thread> helpers;
  const size_t workers = std::min(b.buffers.size(), pieces.size());
  for (size_t w = 1; w < workers; ++w) {
    try {
      helpers.emplace_back(work, w);
    } catch (const std::system_error&) {
      break; // the others take its pieces
    }
  }
  work(0);
  for (std::thread& t : helpers) {
    t.join();
  }
  return static_cast<cudaError_t>(first_error.load());
}

} // namespace

void* copyFunction(int device, std::string& why) {
  if (device < 0 || device >= kMaxDevices) {
    why = "device index out of range";
    return nullptr;
  }
  Kernels& k = kernels();
  if (void* f = k.function[device].load()) {
    return f;
  }
  std::lock_guard<std::mutex> lock(k.mu);
  if (!k.tried[device]) {
    k.tried[device] = true;
    if (cudaSetDevice(device) != cudaSuccess) {
      k.why[device] = "cannot make the device current";
    } else {
      k.function[device].store(compileKernel(device, k.why[device]));
    }
  }
  void* f = k.function[device].load();
  if (f == nullptr) {
    why = k.why[device];
  }
  return f;
}

bool launchCopy(int device, void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  std::string why;
  void* function = copyFunction(device, why);
  const LaunchFn launch = launcher();
  if (function == nullptr || launch == nullptr) {
    return false;
  }
  unsigned long long n = bytes;
  void* d = dst;
  const void* s = src;
  void* params[] = {&d, const_cast<void**>(&s), &n};
  if (launch(function, kHostCopyBlocks, 1, 1, kCopyThreads, 1, 1, 0, stream, params, nullptr) !=
      0) {
    counters().failures.fetch_add(1, kRelaxed);
    return false;
  }
  return true;
}

bool copyByKernel(
    void* dst,
    const void* src,
    size_t count,
    cudaMemcpyKind kind,
    cudaStream_t stream,
    cudaError_t* result) {
  if (!kernelCopyShape(dst, src, count, kind)) {
    return false;
  }
  Engine& engine = Engine::get();
  if (!engine.kernelCopies()) {
    return false;
  }
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    return false;
  }
  const bool to_device = kind == cudaMemcpyHostToDevice;
  const void* host = to_device ? src : dst;
  // The GPU side's host tail is looked up only where the CPU may take a part.
  const void* other = count >= kCpuPartMinBytes ? (to_device ? dst : src) : nullptr;
  const Engine::HostRange range = engine.hostRange(host, count, device, other);
  if (!range.managed) {
    return false;
  }
  if (underCapture(engine, stream)) {
    return false;
  }
  std::string why;
  void* function = copyFunction(device, why);
  const LaunchFn launch = launcher();
  if (function == nullptr || launch == nullptr) {
    return false;
  }
  if (!range.mapped) {
    engine.mapHostFor(host, device);
  }
  // Note [Copies shared with the CPU]: the CPU's part is the copy's end, and
  // it may start only once the work queued before the copy has finished.
  size_t cpu = cpuPart(count, range.other_host_tail, range.cpu_share);
  if (cpu > 0) {
    const cudaError_t before = cudaStreamSynchronize(stream);
    if (before != cudaSuccess) {
      *result = before; // nothing queued: the error of the work before, as
      return true; // a synchronous copy reports it
    }
  }
  const size_t bytes = count - cpu;
  if (!launchCopy(device, dst, src, bytes, stream)) {
    return false; // nothing was queued
  }
  if (cpu > 0) {
    copyRunsOnCpu(
        static_cast<char*>(dst), static_cast<const char*>(src), {Residency::Run{bytes, cpu}}, cpu);
    counters().cpu_bytes.fetch_add(cpu, kRelaxed);
  }
  counters().copies.fetch_add(1, kRelaxed);
  counters().bytes.fetch_add(count, kRelaxed);
  // The pageable contract: the host buffer is free again when the call
  // returns (Note [Copies of managed host memory by kernel]).
  *result = cudaStreamSynchronize(stream);
  return true;
}

bool copyPageable(
    void* dst,
    const void* src,
    size_t count,
    cudaMemcpyKind kind,
    cudaStream_t stream,
    MemcpyAsyncFn driver,
    cudaError_t* result) {
  if (!hostAndDevice(kind) || count < kPageableMinBytes || driver == nullptr) {
    return false;
  }
  Engine& engine = Engine::get();
  if (!engine.pageableCopies()) {
    return false;
  }
  const bool to_device = kind == cudaMemcpyHostToDevice;
  const std::vector<Residency::Run> runs = engine.hostRuns(to_device ? dst : src, count);
  uint64_t cpu = 0;
  for (const Residency::Run& run : runs) {
    cpu += run.bytes;
  }
  if (cpu < kPageableMinBytes || !pageable(to_device ? src : dst)) {
    return false;
  }
  if (underCapture(engine, stream)) {
    return false;
  }
  // The work queued before the copy first, as the driver's copy would wait
  // for it; its error is what a synchronous copy reports, nothing copied.
  const cudaError_t before = cudaStreamSynchronize(stream);
  if (before != cudaSuccess) {
    *result = before;
    return true;
  }
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  auto onCpu = [&] { copyRunsOnCpu(d, s, runs, cpu); };
  // The runs by CPU threads on a helper thread, while the calling thread
  // moves the gaps between them (the bytes on the device) below.
  std::thread helper;
  if (cpu < count) {
    try {
      helper = std::thread(onCpu);
    } catch (const std::system_error&) {
      onCpu(); // no thread: the CPU's part first, then the driver's
    }
  } else {
    onCpu();
  }
  cudaError_t err = cudaSuccess;
  uint64_t staged = 0;
  if (cpu < count) {
    // Note [Pageable bytes on the device go through page-locked buffers],
    // else the driver's copy of each gap.
    int device = -1;
    Bounce* b = cudaGetDevice(&device) == cudaSuccess && device >= 0 && device < kMaxDevices
        ? &bounce(device)
        : nullptr;
    std::unique_lock<std::mutex> lock;
    if (b != nullptr) {
      lock = std::unique_lock<std::mutex>(b->mu, std::try_to_lock);
    }
    if (lock.owns_lock() && ready(*b)) {
      err = copyStaged(
          *b, device, d, s, Residency::gaps(runs, count, kBounceBytes), to_device, stream, driver);
      staged = count - cpu;
    } else {
      for (const Residency::Run& p : Residency::gaps(runs, count, count)) {
        if (err == cudaSuccess) {
          err = driver(d + p.offset, s + p.offset, p.bytes, kind, stream);
        }
      }
    }
  }
  if (helper.joinable()) {
    helper.join();
  }
  counters().pageable_copies.fetch_add(1, kRelaxed);
  counters().pageable_cpu_bytes.fetch_add(cpu, kRelaxed);
  counters().pageable_staged_bytes.fetch_add(err == cudaSuccess ? staged : 0, kRelaxed);
  *result = err;
  return true;
}

KernelCopyCounters kernelCopyCounters() {
  Counters& c = counters();
  return KernelCopyCounters{
      c.copies.load(),
      c.bytes.load(),
      c.failures.load(),
      c.cpu_bytes.load(),
      c.pageable_copies.load(),
      c.pageable_cpu_bytes.load(),
      c.pageable_staged_bytes.load()};
}

} // namespace c10::cuda::um
