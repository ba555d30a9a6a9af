#include <c10/cuda/um/OpSignal.h>

#include <ATen/record_function.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/um/Engine.h>
#include <c10/cuda/um/Stage.h>

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace c10::cuda::um {
namespace {

// Note [Reaching ATen's observers]
using AddGlobalCallback = at::CallbackHandle (*)(at::RecordFunctionCallback);
using RemoveCallback = void (*)(at::CallbackHandle);
constexpr const char* kTorchCpu = "libtorch_cpu.so";
constexpr const char* kAddName = "_ZN2at17addGlobalCallbackENS_22RecordFunctionCallbackE";
constexpr const char* kRemoveName = "_ZN2at14removeCallbackEm";

struct AtenObservers {
  AddGlobalCallback add = nullptr;
  RemoveCallback remove = nullptr;
  std::string why; // set when either is missing
};

int findTorchCpu(struct dl_phdr_info* info, size_t, void* out) {
  const char* name = info->dlpi_name;
  const size_t n = name ? std::strlen(name) : 0;
  const size_t k = std::strlen(kTorchCpu);
  if (n >= k && std::strcmp(name + n - k, kTorchCpu) == 0) {
    *static_cast<std::string*>(out) = name;
    return 1;
  }
  return 0;
}

AtenObservers resolveObservers() {
  AtenObservers o;
  void* lib = dlopen(kTorchCpu, RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) {
    std::string path;
    dl_iterate_phdr(findTorchCpu, &path);
    if (!path.empty()) {
      lib = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    }
  }
  if (lib == nullptr) {
    o.why = "libtorch_cpu.so is not loaded in this process (import torch first)";
    return o;
  }
  o.add = reinterpret_cast<AddGlobalCallback>(dlsym(lib, kAddName));
  o.remove = reinterpret_cast<RemoveCallback>(dlsym(lib, kRemoveName));
  // The handle stays open: the library is torch's own, loaded for good.
  if (o.add == nullptr || o.remove == nullptr) {
    o.why = std::string("libtorch_cpu.so does not export ") +
        (o.add == nullptr ? "at::addGlobalCallback(RecordFunctionCallback)"
                          : "at::removeCallback(CallbackHandle)") +
        " as this engine was built to call it";
    o.add = nullptr;
    o.remove = nullptr;
  }
  return o;
}

const AtenObservers& observers() {
  static const AtenObservers o = resolveObservers();
  return o;
}

// Up to this many storages an operator are reported; the rest (a foreach op
// over many tensors) are left to the faults.
constexpr size_t kMaxRanges = 64;

struct Gathered {
  Lookahead::Range ranges[kMaxRanges];
  size_t n = 0;
  int device = -1;

  size_t slots[kMaxRanges]; // each range's place among the arguments
  bool staging = false; // op_stage: the versions below are read
  // Note [State one burst a period writes is staged by copy] (Stage.h): each
  // range's storage and the version counter of its first tensor.
  c10::StorageImpl* impls[kMaxRanges];
  uint64_t versions[kMaxRanges];

  // Note [Counterparts] (Lookahead.h): what uses the storage, not where it
  // is: the call's signature (every argument's kind, and each tensor's
  // dtype, shape and strides; the operator's name is not exported to this
  // library) and the argument's place in it. Computed only for an operator
  // with a CUDA tensor argument: the others pay nothing for it.
  static uint64_t tensorHash(uint64_t h, const at::Tensor& t) {
    if (!t.defined()) {
      return hashMix(h, 0xD0);
    }
    h = hashMix(h, static_cast<uint64_t>(t.scalar_type()));
    for (const int64_t d : t.sizes()) {
      h = hashMix(h, static_cast<uint64_t>(d));
    }
    h = hashMix(h, 0xFFFF);
    for (const int64_t d : t.strides()) {
      h = hashMix(h, static_cast<uint64_t>(d));
    }
    return h;
  }
  void identify(c10::ArrayRef<const c10::IValue> inputs) {
    uint64_t sig = inputs.size();
    for (const c10::IValue& v : inputs) {
      sig = hashMix(sig, v.isTensor() ? 1 : v.isList() ? 2 : v.isInt() ? 3 : v.isDouble() ? 4
                         : v.isBool() ? 5 : v.isNone() ? 6 : 7);
      if (v.isTensor()) {
        sig = tensorHash(sig, v.toTensor());
      } else if (v.isList()) {
        sig = hashMix(sig, v.toListRef().size());
      }
    }
    for (size_t i = 0; i < n; ++i) {
      const uint64_t id = hashMix(sig, slots[i] + 1);
      ranges[i].id = id == 0 ? 1 : id; // 0 means "unknown"
    }
  }

  void add(const at::Tensor& t, size_t slot) {
    if (n == kMaxRanges || !t.defined() || !t.is_cuda() || !t.has_storage()) {
      return;
    }
    const c10::Storage& storage = t.unsafeGetTensorImpl()->unsafe_storage();
    if (!storage) {
      return; // a wrapper without storage of its own (functorch, nested)
    }
    const void* p = nullptr;
    try {
      p = storage.unsafeGetStorageImpl()->data(); // throws for fake or COW data
    } catch (...) {
      return;
    }
    const uint64_t size = storage.nbytes();
    if (p == nullptr || size == 0) {
      return;
    }
    const int dev = t.get_device();
    if (device < 0) {
      device = dev;
    } else if (dev != device) {
      return; // one device an operator: peer accesses are left to the faults
    }
    const Lookahead::Range r{reinterpret_cast<uintptr_t>(p), size};
    for (size_t i = 0; i < n; ++i) {
      if (ranges[i] == r) {
        return;
      }
    }
    slots[n] = slot;
    impls[n] = storage.unsafeGetStorageImpl();
    versions[n] = OpSignal::kNoVersion;
    if (staging && !t.is_inference()) {
      try {
        versions[n] = t.unsafeGetTensorImpl()->version_counter().current_version();
      } catch (...) {
      }
    }
    ranges[n++] = r;
  }
};

// Operators nested in the one being observed on this thread (0: outermost).
thread_local int t_depth = 0;

// The storages an outermost operator's end puts back (Note [State one burst
// a period writes is staged by copy], Stage.h).
struct StageOuts final : at::ObserverContext {
  std::vector<c10::Storage> storages;
  int device = -1;
};

std::unique_ptr<at::ObserverContext> onOperator(const at::RecordFunction& fn) {
  const bool outermost = t_depth++ == 0;
  // Nothing may escape into the operator: a signal lost costs speed only.
  try {
    Gathered g;
    g.staging = Engine::get().stageBursts();
    size_t slot = 0;
    for (const c10::IValue& v : fn.inputs()) {
      if (v.isTensor()) {
        g.add(v.toTensor(), slot);
      } else if (v.isList()) {
        for (const c10::IValue& e : v.toListRef()) {
          if (e.isTensor()) {
            g.add(e.toTensor(), slot);
          }
          ++slot;
        }
      }
      ++slot;
    }
    if (g.n > 0) {
      g.identify(fn.inputs());
      const auto stream = c10::cuda::getCurrentCUDAStream(
          static_cast<c10::DeviceIndex>(g.device));
      bool out[kMaxRanges] = {};
      OpSignal::get().observe(g.device, stream.stream(), g.ranges, g.n,
                              OpSignal::Storages{g.impls, g.versions, outermost, out});
      std::unique_ptr<StageOuts> outs;
      for (size_t i = 0; i < g.n; ++i) {
        if (out[i]) {
          if (!outs) {
            outs = std::make_unique<StageOuts>();
            outs->device = g.device;
          }
          outs->storages.emplace_back(
              c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(g.impls[i]));
        }
      }
      return outs;
    }
  } catch (...) {
  }
  return nullptr;
}

void onOperatorEnd(const at::RecordFunction&, at::ObserverContext* ctx) {
  if (t_depth > 0) {
    --t_depth;
  }
  if (ctx == nullptr) {
    return;
  }
  try {
    auto* outs = static_cast<StageOuts*>(ctx); // only onOperator makes them
    const cudaStream_t stream =
        c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(outs->device)).stream();
    for (const c10::Storage& st : outs->storages) {
      Stage::get().stageOut(st.unsafeGetStorageImpl(), stream);
    }
  } catch (...) {
  }
}

} // namespace

OpSignal& OpSignal::get() {
  static OpSignal* s = new OpSignal(); // never destroyed: observers may run at exit
  return *s;
}

bool OpSignal::install(std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (handle_.load() != 0) {
    return true;
  }
  const AtenObservers& o = observers();
  if (o.add == nullptr) {
    why = o.why;
    return false;
  }
  at::RecordFunctionCallback cb(&onOperator, &onOperatorEnd);
  cb.needsInputs(true).scopes({at::RecordScope::FUNCTION});
  const at::CallbackHandle h = o.add(cb);
  if (h == 0) {
    why = "at::addGlobalCallback returned no handle";
    return false;
  }
  handle_.store(h, std::memory_order_release);
  installs_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void OpSignal::remove() {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t h = handle_.exchange(0);
  if (h != 0 && observers().remove != nullptr) {
    observers().remove(h);
  }
}

OpSignal::Device& OpSignal::deviceState(int index) {
  Device* d = devices_[index].load(std::memory_order_acquire);
  if (d == nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    d = devices_[index].load();
    if (d == nullptr) {
      d = new Device();
      devices_[index].store(d, std::memory_order_release);
    }
  }
  return *d;
}

namespace {

// Runs make() (a CUDA call that creates something) with `index` as the
// current device, then restores the caller's. False, with the error cleared,
// where the device cannot be made current or make() fails.
template <class Make>
bool onDevice(int index, Make&& make) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess ||
      (current != index && cudaSetDevice(index) != cudaSuccess)) {
    cudaGetLastError();
    return false;
  }
  const cudaError_t e = make();
  if (e != cudaSuccess) {
    cudaGetLastError();
  }
  if (current != index) {
    cudaSetDevice(current);
  }
  return e == cudaSuccess;
}

} // namespace

void* OpSignal::aheadStream(int index, Device& d) {
  // Requires d.mu. A stream of the signal's own, so that bringing in the
  // next operators' data never queues in front of this operator's kernels.
  if (d.ahead_stream == nullptr) {
    cudaStream_t s = nullptr;
    if (onDevice(index, [&] { return cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); })) {
      d.ahead_stream = s;
    }
  }
  return d.ahead_stream;
}

// Note [Waiting for what was brought in ahead]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The lookahead brings ranges in on a stream of its own, so that its moves
// never queue in front of the program's kernels. The ledger marks such a
// range as on the device at once, and the operator that then uses it finds
// nothing to move: nothing ordered its kernels after the bring-in, so a
// kernel could run while the prefetch still migrated its pages, and fault
// them in at the faults' speed (design notes, section 8: 15 GB/s against 50).
// The wait is for that ordering; it was not what made train-plain's steps
// take 0.26 s or 0.9 s with the same moves (that stayed with the wait in
// place, docs/notes/step-54-learned-eviction.md). So each bring-in ahead that moved bytes records an event on the stream
// after it, and the first operator to use the range makes its own stream wait
// for that event (a wait on the GPU, not on the host). Ranges handed out and
// never used keep their events until the table is full, then all are reused.
// No wait is queued while a graph is captured.
void OpSignal::markArriving(int index, Device& d, uintptr_t addr, void* side) {
  cudaEvent_t ev = nullptr;
  if (!d.spare_events.empty()) {
    ev = static_cast<cudaEvent_t>(d.spare_events.back());
    d.spare_events.pop_back();
  } else if (!onDevice(index, [&] {
               return cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
             })) {
    return;
  }
  if (cudaEventRecord(ev, static_cast<cudaStream_t>(side)) != cudaSuccess) {
    cudaGetLastError();
    d.spare_events.push_back(ev);
    return;
  }
  constexpr size_t kMostArriving = 4096;
  if (d.arriving.size() >= kMostArriving) {
    for (auto& [a, e] : d.arriving) {
      d.spare_events.push_back(e);
    }
    d.arriving.clear();
  }
  auto [it, fresh] = d.arriving.try_emplace(addr, ev);
  if (!fresh) {
    d.spare_events.push_back(it->second);
    it->second = ev;
  }
}

void OpSignal::waitArrivals(
    Device& d,
    void* stream,
    const Lookahead::Range* ranges,
    size_t n) {
  for (size_t i = 0; i < n && !d.arriving.empty(); ++i) {
    auto it = d.arriving.find(ranges[i].addr);
    if (it == d.arriving.end()) {
      continue;
    }
    if (cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                            static_cast<cudaEvent_t>(it->second), 0) != cudaSuccess) {
      cudaGetLastError();
    }
    d.spare_events.push_back(it->second);
    d.arriving.erase(it);
  }
}

void OpSignal::observe(
    int device,
    void* stream,
    Lookahead::Range* ranges,
    size_t n,
    const Storages& st) {
  if (device < 0 || device >= kDevices) {
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  n = std::min(n, kMaxRanges);
  Engine& engine = Engine::get();
  Device& d = deviceState(device);
  std::lock_guard<std::mutex> lock(d.mu);
  // Note [State one burst a period writes is staged by copy] (Stage.h): a
  // staged storage is known to the learned order by its own address, and is
  // not touched (it is on its block).
  Stage& stage = Stage::get();
  const bool staging = st.impls != nullptr && engine.stageBursts();
  bool staged[kMaxRanges] = {};
  size_t n_staged = 0;
  if (staging && stage.any()) {
    for (size_t i = 0; i < n; ++i) {
      if (const uintptr_t home = stage.homeOf(ranges[i].addr)) {
        ranges[i].addr = home;
        staged[i] = true;
        ++n_staged;
      }
    }
  }
  // Each range's predicted next use, asked before the op is recorded (Note
  // [Predicted next use]); the touches then file the ranges under it (Note
  // [The learned eviction order]), all under one engine lock.
  uint64_t dues[kMaxRanges];
  for (size_t i = 0; i < n; ++i) {
    dues[i] = d.order.due(ranges[i], i);
  }
  if (staging) {
    const bool may_swap = st.outermost && !engine.capturesUnderway() && !engine.everCaptured();
    for (size_t i = 0; i < n; ++i) {
      const bool written = st.versions[i] != kNoVersion &&
          stage.written(ranges[i].addr, st.impls[i], st.versions[i]);
      if (!may_swap) {
        continue;
      }
      const Lookahead::Burst b = d.order.burst(ranges[i], i);
      if (staged[i]) {
        st.out[i] = !b.burst || b.last;
      } else if (b.burst && !b.last && written && ranges[i].size >= kStageMinBytes) {
        // Mostly in host RAM: what is on the device of its own range is not
        // touched while it is staged, and leaves as the order's victim.
        const bool on_host =
            2 * engine.hostBytes(reinterpret_cast<const void*>(ranges[i].addr), ranges[i].size) >=
            ranges[i].size;
        stage.candidate(on_host);
        if (on_host && stage.stageIn(st.impls[i], device, static_cast<cudaStream_t>(stream))) {
          staged[i] = true;
          ++n_staged;
        }
      }
    }
  }
  // The touches leave the staged storages out.
  Lookahead::Range kept[kMaxRanges];
  uint64_t kept_dues[kMaxRanges];
  const Lookahead::Range* touch = ranges;
  const uint64_t* touch_dues = dues;
  size_t n_touch = n;
  if (n_staged > 0) {
    n_touch = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!staged[i]) {
        kept[n_touch] = ranges[i];
        kept_dues[n_touch++] = dues[i];
      }
    }
    touch = kept;
    touch_dues = kept_dues;
  }
  uint64_t moved = 0;
  if (engine.touchOp(touch, touch_dues, n_touch, device, static_cast<cudaStream_t>(stream),
                     d.order.clock(), &moved) ||
      n_staged > 0) {
    ops_.fetch_add(1, std::memory_order_relaxed);
    if (moved > 0) {
      touch_bytes_.fetch_add(moved, std::memory_order_relaxed);
    }
    const uint64_t lookahead = engine.lookaheadBytes(device);
    // No stream is made, nothing moves and nothing waits while a graph is
    // captured.
    const bool capturing = engine.capturesUnderway();
    if (!capturing) {
      waitArrivals(d, stream, ranges, n);
    }
    void* side = lookahead > 0 && !capturing ? aheadStream(device, d) : nullptr;
    const uint64_t before_ranges = d.order.counters().ahead_ranges;
    const uint64_t before_bytes = d.order.counters().ahead_bytes;
    d.order.use(ranges, n, side != nullptr ? lookahead : 0,
                [&](const Lookahead::Range& r, uint64_t due) -> uint64_t {
                  if (staging && stage.isHome(r.addr)) {
                    return 0; // staged: its own range stays in host RAM
                  }
                  const uint64_t m =
                      engine.touchAhead(reinterpret_cast<const void*>(r.addr), r.size,
                                        device, static_cast<cudaStream_t>(side), due);
                  if (m > 0) {
                    markArriving(device, d, r.addr, side);
                  }
                  return m;
                });
    ahead_ranges_.fetch_add(
        d.order.counters().ahead_ranges - before_ranges, std::memory_order_relaxed);
    ahead_bytes_.fetch_add(
        d.order.counters().ahead_bytes - before_bytes, std::memory_order_relaxed);
  }
  nanoseconds_.fetch_add(
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now() - t0)
                                .count()),
      std::memory_order_relaxed);
}

OpSignalCounters OpSignal::counters() const {
  OpSignalCounters c;
  c.installed = installed() ? 1 : 0;
  c.installs = installs_.load(std::memory_order_relaxed);
  c.ops = ops_.load(std::memory_order_relaxed);
  c.touch_bytes = touch_bytes_.load(std::memory_order_relaxed);
  c.ahead_ranges = ahead_ranges_.load(std::memory_order_relaxed);
  c.ahead_bytes = ahead_bytes_.load(std::memory_order_relaxed);
  c.nanoseconds = nanoseconds_.load(std::memory_order_relaxed);
  for (const auto& slot : devices_) {
    if (Device* d = slot.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(d->mu);
      c.matches += d->order.counters().matches;
      c.paths += d->order.counters().paths;
      c.mixed += d->order.counters().mixed;
      c.counterparts += d->order.counters().counterparts;
    }
  }
  return c;
}

} // namespace c10::cuda::um
