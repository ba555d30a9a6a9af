#include <c10/cuda/um/Engine.h>

#include <c10/cuda/um/HostMemory.h>
#include <c10/cuda/um/UnifiedMemory.h>
#include <c10/util/Exception.h>

#include <algorithm>
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

Engine::Engine() {
  const char* env = std::getenv(kConfigEnvVar);
  if (env != nullptr) {
    cfg_ = parseConfig(env, Config{}, kConfigEnvVar);
  }
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
  // Unplaced segments migrate to the GPU on touch: count them as device.
  l.device_placed_bytes =
      st.placed_bytes[static_cast<int>(Placement::Device)] +
      st.placed_bytes[static_cast<int>(Placement::Unplaced)];
  l.device_total_bytes = st.total_bytes;
  return l;
}

cudaError_t Engine::allocSegment(
    void** ptr,
    size_t size,
    c10::DeviceIndex device,
    cudaStream_t stream,
    bool capturing) {
  last_refusal().clear();
  Config cfg;
  Placement placement = Placement::Unplaced;
  // Warnings may call into Python: emit them only after mu_ is released.
  std::string warning;
  std::optional<std::string> refusal;
  bool use_plain = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cfg = cfg_;
    if (!cfg.enabled) {
      use_plain = true; // UM off: exactly the stock call, outside the lock
    } else if (DeviceState& st = probe(device, warning); !st.managed_supported) {
      use_plain = true;
    } else {
      Ledger l = ledger(device);
      refusal = cap_.refuse(cfg, l, size);
      if (refusal) {
        ++cap_refusals_;
      } else {
        bool quiet = capturing || captures_.load() > 0;
        placement =
            placement_.choose(cfg, l, size, st.concurrent_access && !quiet);
        if (placement == Placement::Unplaced && quiet) {
          ++st.prefetches_skipped_capture;
        }
        refusal = headroom_.refuse(cfg, placement, size);
        if (refusal) {
          ++headroom_refusals_;
        } else {
          // Reserve before dropping the lock so that concurrent allocations
          // cannot overshoot the cap or the budget together.
          managed_bytes_ += size;
          st.placed_bytes[static_cast<int>(placement)] += size;
        }
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
  size_t prefetched = 0;
  if (err == cudaSuccess) {
    prefetched = placement_.apply(cfg, *ptr, size, device, placement, stream);
  }

  std::lock_guard<std::mutex> lock(mu_);
  DeviceState& st = devices_[device];
  if (err != cudaSuccess) {
    managed_bytes_ -= size;
    st.placed_bytes[static_cast<int>(placement)] -= size;
    return err;
  }
  segments_.emplace(*ptr, Segment{size, device, placement});
  st.managed_segments += 1;
  st.managed_bytes += size;
  if (prefetched > 0) {
    st.prefetches += 1;
    st.prefetch_bytes += prefetched;
  }
  peak_managed_bytes_ = std::max(peak_managed_bytes_, managed_bytes_);
  return cudaSuccess;
}

cudaError_t Engine::freeSegment(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = segments_.find(ptr);
    if (it != segments_.end()) {
      const Segment seg = it->second;
      segments_.erase(it);
      DeviceState& st = devices_[seg.device];
      st.managed_segments -= 1;
      st.managed_bytes -= seg.size;
      st.placed_bytes[static_cast<int>(seg.placement)] -= seg.size;
      managed_bytes_ -= seg.size;
    }
  }
  // cudaFree releases managed and device memory alike.
  return cudaFree(ptr);
}

void Engine::captureBegin() {
  captures_.fetch_add(1);
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
}

bool Engine::enabled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cfg_.enabled;
}

bool Engine::isManaged(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mu_);
  // The segment that starts at or before ptr, if ptr lies inside it
  // (interior pointers of split blocks included).
  auto it = segments_.upper_bound(ptr);
  if (it == segments_.begin()) {
    return false;
  }
  --it;
  auto p = static_cast<const char*>(ptr);
  auto base = static_cast<const char*>(it->first);
  return p < base + it->second.size;
}

TorchUmStats Engine::stats(c10::DeviceIndex device) const {
  std::lock_guard<std::mutex> lock(mu_);
  TorchUmStats s{};
  s.struct_size = sizeof(TorchUmStats);
  if (device >= 0 && static_cast<size_t>(device) < devices_.size()) {
    const DeviceState& st = devices_[device];
    s.managed_segments = st.managed_segments;
    s.managed_bytes = st.managed_bytes;
    s.device_placed_bytes = st.placed_bytes[static_cast<int>(Placement::Device)];
    s.host_placed_bytes = st.placed_bytes[static_cast<int>(Placement::Host)];
    s.unplaced_bytes = st.placed_bytes[static_cast<int>(Placement::Unplaced)];
    s.prefetches = st.prefetches;
    s.prefetch_bytes = st.prefetch_bytes;
    s.prefetches_skipped_capture = st.prefetches_skipped_capture;
    s.device_total_bytes = st.total_bytes;
    s.device_budget_bytes = cfg_.device_budget.resolve(st.total_bytes);
  }
  s.total_managed_bytes = managed_bytes_;
  s.peak_managed_bytes = peak_managed_bytes_;
  s.cap_refusals = cap_refusals_;
  s.headroom_refusals = headroom_refusals_;
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
