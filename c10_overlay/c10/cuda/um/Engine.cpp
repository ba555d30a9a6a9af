#include <c10/cuda/um/Engine.h>

#include <c10/cuda/um/CudaCompat.h>
#include <c10/cuda/um/HostCopy.h>
#include <c10/cuda/um/HostMemory.h>
#include <c10/cuda/um/UnifiedMemory.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <unistd.h>
#include <cstdlib>
#include <optional>
#include <utility>

namespace c10::cuda::um {

std::string& Engine::last_refusal() {
  thread_local std::string why;
  return why;
}

Engine& Engine::get() {
  // Leaked on purpose: segments may be freed from static destructors.
  static Engine* engine = new Engine();
  return *engine;
}

Engine::Engine() : owner_pid_(static_cast<int>(getpid())) {
  const char* env = std::getenv(kConfigEnvVar);
  if (env != nullptr) {
    cfg_ = parseConfig(env, Config{}, kConfigEnvVar);
  }
  syncHostSettings();
  if (const char* path = std::getenv(kLedgerTraceEnvVar); path && *path) {
    std::string why;
    trace_ = TraceFile::open(path, why);
    if (trace_) {
      residency_.setTrace(trace_.get());
    } else {
      TORCH_WARN("unified memory: ", kLedgerTraceEnvVar, " is ignored: ", why);
    }
  }
}

void Engine::syncHostSettings() {
  host_managed_.store(cfg_.host_alloc_managed);
  kernel_copies_.store(cfg_.enabled && cfg_.host_copy_kernel);
  stage_bursts_.store(cfg_.enabled && cfg_.op_stage);
  pageable_copies_.store(cfg_.enabled && cfg_.pageable_copy_cpu);
  host_min_.store(cfg_.host_alloc_min);
}

Engine::DeviceState& Engine::probe(
    c10::DeviceIndex device,
    std::string& warning) {
  TORCH_INTERNAL_ASSERT(device >= 0, "unified memory: bad device ", device);
  if (devices_.size() <= static_cast<size_t>(device)) {
    devices_.resize(static_cast<size_t>(device) + 1);
  }
  DeviceState& st = devices_[device];
  if (!st.probed) {
    int managed = 0;
    int concurrent = 0;
    if (cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, device) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(
            &concurrent, cudaDevAttrConcurrentManagedAccess, device) !=
            cudaSuccess) {
      (void)cudaGetLastError();
      managed = concurrent = 0;
    }
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
      st.total_bytes = prop.totalGlobalMem;
    } else {
      (void)cudaGetLastError();
    }
    st.managed_supported = managed != 0;
    st.concurrent_access = concurrent != 0;
    st.probed = true;
    std::string dev = std::to_string(static_cast<int>(device));
    if (!st.managed_supported) {
      warning = "unified memory: device " + dev +
          " does not support managed memory; its allocations use cudaMalloc.";
    } else if (!st.concurrent_access) {
      warning = "unified memory: device " + dev +
          " lacks concurrent managed access (Windows, WSL, Jetson, "
          "pre-Pascal): segments are managed but neither advised nor "
          "prefetched, and the device budget cannot be enforced.";
    }
  }
  return st;
}

Ledger Engine::ledger(c10::DeviceIndex device) const {
  const DeviceState& st = devices_[device];
  Ledger l;
  l.managed_bytes = managed_bytes_;
  l.device_resident_bytes = residency_.bytesOn(device, Where::Device) +
      residency_.bytesOn(device, Where::Unplaced);
  l.device_budget_bytes = cfg_.device_budget.resolve(st.total_bytes);
  return l;
}

DeviceLimits Engine::limits(int device, bool capturing) const {
  DeviceLimits lim;
  const bool concurrent = static_cast<size_t>(device) < devices_.size() &&
      devices_[device].concurrent_access;
  lim.can_act = concurrent && !capturing && captures_.load() == 0;
  lim.budget = static_cast<size_t>(device) < devices_.size()
      ? cfg_.device_budget.resolve(devices_[device].total_bytes)
      : 0;
  lim.discard = cfg_.discard && compat::kHasDiscard;
  lim.read_copies = cfg_.read_copies;
  lim.warm_first = cfg_.evict_warm_first;
  return lim;
}

bool Engine::underPressure() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t d = 0; d < devices_.size(); ++d) {
    const uint64_t budget =
        cfg_.device_budget.resolve(devices_[d].total_bytes);
    if (cfg_.lru && residency_.nearBudget(static_cast<int>(d), budget, 0)) {
      return true;
    }
  }
  return false;
}

bool Engine::move(
    const void* ptr,
    size_t size,
    int location,
    cudaStream_t stream,
    bool any_policy,
    uint64_t* moved,
    bool read_only,
    bool hold) {
  std::vector<Action> actions;
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto addr = reinterpret_cast<uintptr_t>(ptr);
    const int device = residency_.deviceOf(addr);
    if (device < 0) {
      return false;
    }
    const DeviceLimits lim = limits(device, false);
    if (location == compat::kHost) {
      *moved = residency_.evict(addr, size, stream, lim, actions);
    } else if (any_policy || cfg_.lru) {
      *moved = residency_.touch(
          addr, size, location, stream, policy(), lim, actions, read_only, hold);
    }
    if (actions.empty()) {
      return true;
    }
    ticket = executor_.take();
  }
  executor_.run(ticket, actions, true);
  if (location == compat::kHost) {
    // An explicit eviction is issued on its stream when the call returns,
    // also when the evictor thread issues it.
    executor_.drain(actions.front().device);
  }
  return true;
}

uint64_t Engine::touch(
    const void* ptr,
    size_t size,
    int device,
    cudaStream_t stream,
    bool read_only,
    bool hold) {
  uint64_t moved = 0;
  move(ptr, size, device, stream, /*any_policy=*/false, &moved, read_only, hold);
  return moved;
}

bool Engine::touchOp(
    const Lookahead::Range* ranges,
    const uint64_t* dues,
    size_t n,
    int device,
    cudaStream_t stream,
    PlanClock clock,
    uint64_t* moved) {
  *moved = 0;
  std::vector<Action> actions;
  uint64_t ticket = 0;
  bool managed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!cfg_.lru) {
      return false;
    }
    bool clocked = false;
    for (size_t i = 0; i < n; ++i) {
      const uintptr_t addr = ranges[i].addr;
      const int owner = residency_.deviceOf(addr);
      if (owner < 0) {
        continue;
      }
      managed = true;
      if (owner == device && !clocked) {
        residency_.setPlanClock(device, clock);
        clocked = true;
      }
      *moved += residency_.touch(addr, ranges[i].size, device, stream, policy(),
                                 limits(owner, false), actions);
    }
    // Filed only now: the operator's ranges, touched last, are the newest,
    // and no touch of the operator evicts another's (Note [The learned
    // eviction order]).
    for (size_t i = 0; i < n && clocked; ++i) {
      if (residency_.deviceOf(ranges[i].addr) == device) {
        residency_.plan(ranges[i].addr, ranges[i].size, dues[i]);
      }
    }
    if (actions.empty()) {
      return managed;
    }
    ticket = executor_.take();
  }
  executor_.run(ticket, actions, true);
  return managed;
}

uint64_t Engine::touchAhead(
    const void* ptr,
    size_t size,
    int device,
    cudaStream_t stream,
    uint64_t due) {
  std::vector<Action> actions;
  uint64_t ticket = 0;
  uint64_t moved = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto addr = reinterpret_cast<uintptr_t>(ptr);
    // Live data only: dead content is placed by the allocation that revives
    // it (Note [Event inlet]).
    if (!cfg_.lru || residency_.deviceOf(addr) != device ||
        residency_.liveBytesAt(addr) == 0) {
      return 0;
    }
    moved = residency_.touch(addr, size, device, stream, policy(),
                             limits(device, false), actions, false, false,
                             /*needed_at=*/due);
    residency_.plan(addr, size, due);
    if (actions.empty()) {
      return moved;
    }
    ticket = executor_.take();
  }
  executor_.run(ticket, actions, true);
  return moved;
}

uint64_t Engine::lookaheadBytes(int device) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (device < 0 || static_cast<size_t>(device) >= devices_.size() ||
      !devices_[device].probed) {
    return 0;
  }
  const uint64_t budget = cfg_.device_budget.resolve(devices_[device].total_bytes);
  return std::min<uint64_t>(cfg_.op_lookahead, budget / 8);
}

uint64_t Engine::forget(const void* ptr, size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!cfg_.lru) {
    return 0;
  }
  return residency_.forget(reinterpret_cast<uintptr_t>(ptr), size);
}

Residency::Placement Engine::placement(const void* ptr, size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  return residency_.placement(reinterpret_cast<uintptr_t>(ptr), size);
}

// Note [Segments made during a capture are plain]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A segment the allocator makes on a stream that is being captured belongs
// to the graph's private pool (torch.cuda.graph, torch.compile's
// reduce-overhead): its blocks are written by replays the allocator never
// sees, so the engine cannot take them for dead, and while the capture is
// under way it can neither advise nor place the new pages (DeviceLimits::
// can_act), so the replay faults them in one by one. Managed memory gives
// such a segment nothing, and costs device memory the program cannot see:
// torch.cuda.graph empties the cache before every capture, so a program that
// captures into new graphs makes and frees one managed segment a capture, and
// the driver gives the device pages of freed managed memory back in batches
// (tests/gpu/test_reliability.py: +40, +40, -88, +40 MiB of device memory in
// use over four batches of 100 captures of one torch.mm, where stock stays
// flat; upstream's test_repeat_graph_capture_cublas_workspace_memory allows
// 0.1 GB). In that loop those segments are the only ones made, so making
// them with plain cudaMalloc leaves the loop exactly as stock runs it. The
// cost: a graph pool is device memory, outside the budget and the cap, as in
// stock torch; a segment made on another stream while some capture is under
// way stays managed (unplaced, as before).
cudaError_t Engine::allocSegment(
    void** ptr,
    size_t size,
    c10::DeviceIndex device,
    cudaStream_t stream,
    bool capturing) {
  last_refusal().clear();
  Config cfg;
  // Warnings may call into Python: emit them only after mu_ is released.
  std::string warning;
  std::optional<std::string> refusal;
  bool use_plain = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cfg = cfg_;
    if (!cfg.enabled) {
      use_plain = true; // UM off: exactly the stock call, outside the lock
    } else if (capturing) {
      use_plain = true; // Note [Segments made during a capture are plain]
    } else if (DeviceState& st = probe(device, warning); !st.managed_supported) {
      use_plain = true;
    } else {
      Ledger l = ledger(device);
      refusal = cap_.refuse(cfg, l, size);
      if (refusal) {
        ++cap_refusals_;
      } else if (st.concurrent_access &&
                 (refusal = headroom_.refuse(cfg, l, size))) {
        ++headroom_refusals_;
      } else {
        // Reserve before dropping the lock so that concurrent allocations
        // cannot overshoot the cap together.
        managed_bytes_ += size;
      }
    }
  }
  if (!warning.empty()) {
    TORCH_WARN(warning);
  }
  if (use_plain) {
    return cudaMalloc(ptr, size);
  }
  if (refusal) {
    // Reported in the OutOfMemoryError the allocator raises if its
    // release-and-retry does not make room (oomReport).
    last_refusal() = std::move(*refusal);
    return cudaErrorMemoryAllocation;
  }

  cudaError_t err = cudaMallocManaged(ptr, size, cudaMemAttachGlobal);
  std::vector<Action> actions;
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    DeviceState& st = devices_[device];
    if (err != cudaSuccess) {
      managed_bytes_ -= size;
      return err;
    }
    st.managed_segments += 1;
    st.managed_bytes += size;
    used_cuda_.store(true);
    const bool quiet = capturing || captures_.load() > 0;
    if (quiet && st.concurrent_access) {
      ++st.prefetches_skipped_capture;
    }
    residency_.addSegment(
        reinterpret_cast<uintptr_t>(*ptr),
        size,
        device,
        stream,
        events_attached_.load(),
        /*adopted=*/false,
        policy(),
        limits(device, capturing),
        actions);
    peak_managed_bytes_ = std::max(peak_managed_bytes_, managed_bytes_);
    if (actions.empty()) {
      return cudaSuccess;
    }
    ticket = executor_.take();
  }
  executor_.run(ticket, actions, cfg.prefetch);
  return cudaSuccess;
}

cudaError_t Engine::freeSegment(void* ptr) {
  int device = -1;
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto seg = residency_.removeSegment(reinterpret_cast<uintptr_t>(ptr))) {
      DeviceState& st = devices_[seg->device];
      st.managed_segments -= 1;
      st.managed_bytes -= seg->size;
      managed_bytes_ -= seg->size;
      device = seg->device;
      ticket = executor_.take();
    }
  }
  if (device >= 0) {
    // Every action decided on the segment so far is issued before its memory
    // goes (a discard queued for the evictor and issued after the address
    // came back as a new segment would drop the new segment's data);
    // cudaFree then waits for the device.
    executor_.run(ticket, {}, false);
    executor_.drain(device);
  }
  // cudaFree releases managed and device memory alike.
  return cudaFree(ptr);
}

// Note [Timing the event path]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With the data fitting, the engine's only work in a step is its block
// events (a small GPT's step has about 865), and the GPU suite's time bar
// failed on the hosts' slow CPU state with UM's steps 7-24 % longer than
// stock's (bench/README.md, prediction steps 31 and 41). Whether that time is
// spent here, waiting for the engine's lock or in the ledger, or elsewhere on
// the allocator's path (its trace entry, the interposer) is answered by
// timing a sample of the events here: one in kEventSampleEvery per thread,
// so that the clock reads cost a few nanoseconds an event on average.
namespace {
struct EventTimer {
  std::atomic<uint64_t>* samples = nullptr; // null: this event is not timed
  std::atomic<uint64_t>* ns = nullptr;
  std::chrono::steady_clock::time_point t0;
  ~EventTimer() {
    if (samples != nullptr) {
      const auto dt = std::chrono::steady_clock::now() - t0;
      samples->fetch_add(1, std::memory_order_relaxed);
      ns->fetch_add(
          static_cast<uint64_t>(
              std::chrono::duration_cast<std::chrono::nanoseconds>(dt).count()),
          std::memory_order_relaxed);
    }
  }
};
thread_local uint32_t t_events = 0;
} // namespace

void Engine::onBlockEvent(
    BlockEvent event,
    uintptr_t addr,
    size_t size,
    cudaStream_t stream,
    BlockPool pool) {
  EventTimer timer;
  if (++t_events % kEventSampleEvery == 0) {
    timer.samples = &event_samples_;
    timer.ns = &event_sample_ns_;
    timer.t0 = std::chrono::steady_clock::now();
  }
  // Note [Graph pools: a free is not a death] (Residency.h). Where torch
  // does not name the pool, every event after the first capture may be a
  // graph pool's.
  const bool replayed = pool == BlockPool::Private ||
      (pool == BlockPool::Unknown && captured_.load());
  std::vector<Action> actions;
  bool prefetch = true;
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++block_events_;
    if (event == BlockEvent::FreeCompleted) {
      // ignores plain cudaMalloc segments
      residency_.onFree(addr, size, replayed);
      return;
    }
    const int device = residency_.deviceOf(addr);
    if (device < 0) {
      return; // a plain cudaMalloc segment (UM off when it was made)
    }
    const bool revived = residency_.onAlloc(
        addr, size, stream, policy(), limits(device, false), actions, replayed);
    // Reviving a dead chunk while earlier actions are still being issued:
    // run() with no actions waits until they are (Note [Reviving a dead
    // chunk]). With nothing outstanding, the allocation returns at once.
    if (actions.empty() && !(revived && executor_.behind())) {
      return;
    }
    prefetch = cfg_.prefetch;
    ticket = executor_.take();
  }
  executor_.run(ticket, actions, prefetch);
}

void Engine::setEventsAttached() {
  events_attached_.store(true);
}

cudaError_t Engine::prefetch(
    const void* ptr,
    size_t size,
    int location,
    cudaStream_t stream) {
  uint64_t moved = 0;
  if (!move(ptr, size, location, stream, /*any_policy=*/true, &moved)) {
    return compat::prefetch(ptr, size, location, stream);
  }
  return cudaSuccess;
}

cudaError_t Engine::advise(
    const void* ptr,
    size_t size,
    cudaMemoryAdvise advice,
    int location) {
  // Advice moves no page, so the ledger does not change: with policy lru,
  // PreferredLocation and AccessedBy are the engine's own (set on every
  // segment when it is made); changing them makes GPU touches of evicted
  // pages migrate them instead of reading them in place.
  return compat::advise(ptr, size, advice, location);
}

// Note [Captures wait for the evictor]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// While a stream is captured in global mode (torch.cuda.graph's default),
// CUDA forbids potentially unsafe calls from every thread, and one made
// anyway can invalidate the capture. The engine decides nothing while a
// capture is under way (DeviceLimits::can_act), but the evictor thread and
// other threads' executors may still be issuing what was decided before it.
// That is the common case, not a corner: torch.cuda.graph's preparation can
// make a new segment just before the capture begins, and under the budget
// placing it queues evictions (seen in the GPU suite's capture test). So a
// capture begins only after every action decided so far has been issued and
// every eviction job queued has been finished. The waits are for the GPU to
// reach events recorded before the capture, never for the capturing thread.
void Engine::captureBegin() {
  captured_.store(true);
  captures_.fetch_add(1);
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ticket = executor_.take();
  }
  executor_.run(ticket, {}, false);
  executor_.drainAll();
}

void Engine::captureEnd() {
  captures_.fetch_sub(1);
}

Config Engine::config() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cfg_;
}

void Engine::configure(std::string_view text, std::string_view source) {
  std::lock_guard<std::mutex> lock(mu_);
  cfg_ = parseConfig(text, cfg_, source);
  syncHostSettings();
}

bool Engine::enabled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cfg_.enabled;
}

bool Engine::isManaged(const void* ptr) const {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mu_);
  return residency_.deviceOf(p) >= 0 || hostFind(p) != host_.end();
}

Engine::HostRange Engine::hostRange(
    const void* ptr,
    size_t size,
    int device,
    const void* other) const {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  if (static_cast<int>(getpid()) != owner_pid_) {
    return {}; // a fork()ed child: the mapping is not its
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = hostFind(p);
  if (it == host_.end() || size > it->first + it->second.size - p) {
    return {};
  }
  const bool mapped = device >= 0 && device < kMappedDevices &&
      (it->second.mapped_for >> device & 1u) != 0;
  const double share = cfg_.host_copy_cpu_share;
  const uint64_t tail = other != nullptr && share > 0
      ? residency_.hostTail(reinterpret_cast<uintptr_t>(other), size)
      : 0;
  return {true, mapped, tail, share};
}

std::vector<Residency::Run> Engine::hostRuns(const void* ptr, size_t size) const {
  if (static_cast<int>(getpid()) != owner_pid_) {
    return {};
  }
  std::lock_guard<std::mutex> lock(mu_);
  return residency_.hostRuns(reinterpret_cast<uintptr_t>(ptr), size);
}

void Engine::mapHostFor(const void* ptr, int device) {
  if (device < 0 || device >= kMappedDevices) {
    return;
  }
  const uint64_t bit = uint64_t{1} << device;
  uintptr_t base = 0;
  uint64_t size = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = hostFind(reinterpret_cast<uintptr_t>(ptr));
    if (it == host_.end() || (it->second.mapped_for & bit) != 0) {
      return;
    }
    base = it->first;
    size = it->second.size;
  }
  // Outside the lock: advice over gigabytes takes milliseconds. Two threads
  // may both advise; the advice is the same.
  const cudaError_t e = compat::advise(
      reinterpret_cast<void*>(base), size, cudaMemAdviseSetAccessedBy, device);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = host_.find(base);
  if (it != host_.end() && it->second.size == size) {
    it->second.mapped_for |= bit; // a failure is not tried again either
  }
}

std::map<uintptr_t, Engine::HostAllocation>::const_iterator Engine::hostFind(
    uintptr_t p) const {
  auto it = host_.upper_bound(p);
  if (it == host_.begin()) {
    return host_.end();
  }
  --it;
  return p < it->first + it->second.size ? it : host_.end();
}

bool Engine::wantsHost(size_t size, int scope_depth) const {
  if (size == 0 || size < host_min_.load(std::memory_order_relaxed)) {
    return false;
  }
  return scope_depth > 0 ||
      (host_managed_.load(std::memory_order_relaxed) &&
       used_cuda_.load(std::memory_order_relaxed));
}

void* Engine::allocHost(size_t size) {
  if (static_cast<int>(getpid()) != owner_pid_) {
    return nullptr;
  }
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    std::lock_guard<std::mutex> lock(mu_);
    ++host_fallbacks_; // no CUDA device in this process
    return nullptr;
  }
  std::string warning;
  bool declined = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    declined = !cfg_.enabled ||
        !probe(static_cast<c10::DeviceIndex>(device), warning).managed_supported ||
        cap_.refuse(cfg_, ledger(static_cast<c10::DeviceIndex>(device)), size) ||
        !headroom_.fits(cfg_, size);
    if (declined) {
      ++host_fallbacks_;
    } else {
      managed_bytes_ += size; // reserved, as in allocSegment
    }
  }
  if (!warning.empty()) {
    TORCH_WARN(warning);
  }
  if (declined) {
    return nullptr;
  }
  void* ptr = nullptr;
  cudaError_t err = cudaMallocManaged(&ptr, size, cudaMemAttachGlobal);
  if (err == cudaSuccess) {
    // Host RAM is where CPU code writes it: first touches populate host
    // pages instead of migrating anything.
    err = compat::advise(ptr, size, cudaMemAdviseSetPreferredLocation, compat::kHost);
    if (err != cudaSuccess) {
      (void)cudaFree(ptr);
    }
  }
  uint64_t mapped_for = 0;
  if (err == cudaSuccess && size >= kPopulateMinHostAlloc) {
    // Nobody holds it yet (Note [Host pages are populated by CPU threads]).
    // The current device's mappings first, made with the pages for nothing
    // (Note [A host allocation is mapped before its pages are made]).
    if (device < kMappedDevices &&
        compat::advise(ptr, size, cudaMemAdviseSetAccessedBy, device) ==
            cudaSuccess) {
      mapped_for = uint64_t{1} << device;
    } else {
      (void)cudaGetLastError(); // left to mapHostFor at the first copy
    }
    populateOnHost({ptr}, {size});
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    managed_bytes_ -= size;
    ++host_fallbacks_;
    return nullptr;
  }
  host_[reinterpret_cast<uintptr_t>(ptr)] = HostAllocation{size, -1, mapped_for};
  host_bytes_ += size;
  peak_managed_bytes_ = std::max(peak_managed_bytes_, managed_bytes_);
  return ptr;
}

void Engine::freeHost(void* ptr) {
  if (static_cast<int>(getpid()) != owner_pid_) {
    return;
  }
  int device = -1;
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = host_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == host_.end()) {
      return;
    }
    const uint64_t size = it->second.size;
    device = it->second.device;
    if (device >= 0) {
      residency_.removeSegment(it->first);
      DeviceState& st = devices_[device];
      st.managed_segments -= 1;
      st.managed_bytes -= size;
      adopted_bytes_ -= size;
      ticket = executor_.take();
    }
    host_bytes_ -= size;
    managed_bytes_ -= size;
    host_.erase(it);
  }
  if (device >= 0) {
    // As in freeSegment: every action decided on these pages is issued
    // before the memory goes.
    executor_.run(ticket, {}, false);
    executor_.drain(device);
  }
  if (cudaFree(ptr) != cudaSuccess) {
    (void)cudaGetLastError(); // at exit the runtime may be gone already
  }
}

std::string Engine::adoptHost(
    const void* ptr,
    int device,
    cudaStream_t stream) {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::vector<Action> actions;
  std::string warning;
  uint64_t ticket = 0;
  bool prefetch = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int owner = residency_.deviceOf(p);
    auto it = host_.find(p);
    if (it == host_.end()) {
      if (owner == device) {
        return ""; // memory of the device's own segments
      }
      if (owner >= 0) {
        return "it is managed memory of cuda:" + std::to_string(owner) +
            ", not of cuda:" + std::to_string(device);
      }
      return hostFind(p) != host_.end()
          ? "it does not start a managed host allocation (a view into one)"
          : "it is not managed memory (allocate it inside "
            "torch.cuda.um.managed_host(), or with host_alloc:managed)";
    }
    if (it->second.device == device) {
      return "";
    }
    if (it->second.device >= 0) {
      return "it is already used by cuda:" + std::to_string(it->second.device);
    }
    DeviceState& st = probe(static_cast<c10::DeviceIndex>(device), warning);
    if (!st.managed_supported) {
      return "cuda:" + std::to_string(device) + " has no managed memory";
    }
    const uint64_t size = it->second.size;
    it->second.device = device;
    st.managed_segments += 1;
    st.managed_bytes += size;
    adopted_bytes_ += size;
    residency_.addSegment(
        p, size, device, stream, /*tracked=*/false, /*adopted=*/true, policy(),
        limits(device, false), actions);
    prefetch = cfg_.prefetch;
    if (!actions.empty()) {
      ticket = executor_.take();
    }
  }
  if (!warning.empty()) {
    TORCH_WARN(warning);
  }
  if (!actions.empty()) {
    executor_.run(ticket, actions, prefetch);
  }
  return "";
}

TorchUmStats Engine::stats(c10::DeviceIndex device) const {
  const ExecutorCounters ex = executor_.counters();
  std::lock_guard<std::mutex> lock(mu_);
  TorchUmStats s{};
  s.struct_size = sizeof(TorchUmStats);
  const ResidencyCounters& rc = residency_.counters();
  if (device >= 0 && static_cast<size_t>(device) < devices_.size()) {
    const DeviceState& st = devices_[device];
    s.managed_segments = st.managed_segments;
    s.managed_bytes = st.managed_bytes;
    s.device_placed_bytes = residency_.bytesOn(device, Where::Device);
    s.host_placed_bytes = residency_.bytesOn(device, Where::Host);
    s.unplaced_bytes = residency_.bytesOn(device, Where::Unplaced);
    s.prefetches_skipped_capture = st.prefetches_skipped_capture;
    s.device_total_bytes = st.total_bytes;
    s.device_budget_bytes = cfg_.device_budget.resolve(st.total_bytes);
    s.dead_device_bytes = residency_.deadOnDevice(device);
  }
  s.prefetches = rc.touches;
  s.prefetch_bytes = rc.place_bytes + rc.prefetch_bytes + rc.reuse_bytes;
  s.total_managed_bytes = managed_bytes_;
  s.peak_managed_bytes = peak_managed_bytes_;
  s.cap_refusals = cap_refusals_;
  s.headroom_refusals = headroom_refusals_;
  s.policy_lru = cfg_.lru ? 1 : 0;
  s.events_attached = events_attached_.load() ? 1 : 0;
  s.block_events = block_events_;
  s.touches = rc.touches;
  s.touch_prefetch_bytes = rc.prefetch_bytes;
  s.reuse_bytes = rc.reuse_bytes;
  s.place_bytes = rc.place_bytes;
  s.map_host_bytes = rc.map_host_bytes;
  s.evictions = rc.evictions;
  s.evict_bytes = rc.evict_bytes;
  s.discards = rc.discards;
  s.discard_bytes = rc.discard_bytes;
  s.executor_calls = ex.calls;
  s.executor_failures = ex.failures;
  s.executor_ns = ex.nanoseconds;
  s.evictor_ns = ex.evictor_nanoseconds;
  s.duplicate_bytes = rc.duplicate_bytes;
  s.drop_bytes = rc.drop_bytes;
  s.cancelled_bytes = ex.cancelled_bytes;
  s.host_allocations = host_.size();
  s.host_alloc_bytes = host_bytes_;
  s.adopted_bytes = adopted_bytes_;
  s.host_fallbacks = host_fallbacks_;
  s.evicted_unused_bytes = rc.evicted_unused_bytes;
  s.evictor_wait_ns = ex.evictor_wait_nanoseconds;
  s.fence_waits = ex.fence_waits;
  s.fence_wait_ns = ex.fence_wait_nanoseconds;
  s.fence_wait_issuing_ns = ex.fence_wait_issuing_nanoseconds;
  s.evict_ranges = ex.evict_ranges;
  s.forget_bytes = rc.forget_bytes;
  s.forgotten_discard_bytes = rc.forgotten_discard_bytes;
  s.hold_bytes = rc.hold_bytes;
  s.plan_bytes = rc.plan_bytes;
  s.plan_victim_bytes = rc.plan_victim_bytes;
  s.evict_first_bytes = rc.evict_first_bytes;
  s.event_samples = event_samples_.load(std::memory_order_relaxed);
  s.event_sample_ns = event_sample_ns_.load(std::memory_order_relaxed);
  const KernelCopyCounters kc = kernelCopyCounters();
  s.kernel_copies = kc.copies;
  s.kernel_copy_bytes = kc.bytes;
  s.kernel_copy_failures = kc.failures;
  s.kernel_copy_cpu_bytes = kc.cpu_bytes;
  s.pageable_copies = kc.pageable_copies;
  s.pageable_cpu_bytes = kc.pageable_cpu_bytes;
  s.pageable_staged_bytes = kc.pageable_staged_bytes;
  return s;
}

void Engine::resetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_managed_bytes_ = managed_bytes_;
}

std::string Engine::oomReport(c10::DeviceIndex device) const {
  TorchUmStats s = stats(device);
  Config cfg = config();
  if (!cfg.enabled) {
    return "";
  }
  std::string refusal = std::exchange(last_refusal(), std::string());
  std::string why =
      refusal.empty() ? std::string() : " Refused by unified memory: " + refusal;
  return why + " Unified memory (PYTORCH_CUDA_UM_CONF): " +
      formatBytes(s.total_managed_bytes) + " managed in total, cap " +
      (cfg.max_managed ? formatBytes(*cfg.max_managed) : std::string("none")) +
      "; on GPU " + std::to_string(static_cast<int>(device)) + " " +
      formatBytes(s.device_placed_bytes + s.unplaced_bytes) +
      " placed on the device (budget " + formatBytes(s.device_budget_bytes) +
      ") and " + formatBytes(s.host_placed_bytes) + " in host RAM (" +
      formatBytes(availableHostBytes()) + " host RAM available, headroom " +
      formatBytes(cfg.host_headroom) + "). Refusals so far: " +
      std::to_string(s.cap_refusals) + " by max_managed, " +
      std::to_string(s.headroom_refusals) + " by host_headroom.";
}

// ---- hooks (UnifiedMemory.h) ----------------------------------------------

cudaError_t allocSegment(
    void** ptr,
    size_t size,
    c10::DeviceIndex device,
    cudaStream_t stream,
    bool capturing) {
  return Engine::get().allocSegment(ptr, size, device, stream, capturing);
}

cudaError_t freeSegment(void* ptr) {
  return Engine::get().freeSegment(ptr);
}

void captureBegin() {
  Engine::get().captureBegin();
}

void onBlockEvent(
    BlockEvent event,
    uintptr_t addr,
    size_t size,
    cudaStream_t stream,
    BlockPool pool) {
  Engine::get().onBlockEvent(event, addr, size, stream, pool);
}

void setEventsAttached() {
  Engine::get().setEventsAttached();
}

void captureEnd() {
  Engine::get().captureEnd();
}

bool resolveExpandableSegments(bool requested) {
  if (requested && Engine::get().enabled()) {
    TORCH_WARN_ONCE(
        "unified memory: expandable_segments:True is ignored because "
        "expandable segments (cuMemCreate/cuMemMap) cannot be managed memory. "
        "Set PYTORCH_CUDA_UM_CONF=enabled:False to use them instead of "
        "unified memory.");
    return false;
  }
  return requested;
}

void checkIpcExportable(const void* ptr) {
  TORCH_CHECK(
      !Engine::get().isManaged(ptr),
      "This CUDA tensor lives in unified (managed) memory, which CUDA IPC "
      "cannot share between processes (cudaIpcGetMemHandle rejects it). "
      "Share it through CPU memory (tensor.cpu()), or run the producing "
      "process with PYTORCH_CUDA_UM_CONF=enabled:False (or call "
      "torch.cuda.um.configure(enabled=False) before allocating the tensor).");
}

std::string oomReport(c10::DeviceIndex device) {
  return Engine::get().oomReport(device);
}

} // namespace c10::cuda::um
