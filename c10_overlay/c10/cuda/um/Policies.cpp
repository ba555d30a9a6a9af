#include <c10/cuda/um/Policies.h>

#include <c10/cuda/um/CudaCompat.h>
#include <c10/cuda/um/HostMemory.h>
#include <c10/util/Exception.h>

namespace c10::cuda::um {

const char* placementName(Placement p) {
  switch (p) {
    case Placement::Device:
      return "device";
    case Placement::Host:
      return "host";
    case Placement::Unplaced:
      return "unplaced";
  }
  return "?";
}

std::optional<std::string> ManagedCap::refuse(
    const Config& cfg,
    const Ledger& ledger,
    size_t size) const {
  if (!cfg.max_managed || ledger.managed_bytes + size <= *cfg.max_managed) {
    return std::nullopt;
  }
  return "max_managed: " + formatBytes(ledger.managed_bytes) +
      " managed + " + formatBytes(size) + " requested exceeds the cap of " +
      formatBytes(*cfg.max_managed) +
      ". Raise it with PYTORCH_CUDA_UM_CONF=max_managed:<size> or "
      "torch.cuda.um.configure(max_managed=...), or free tensors.";
}

std::optional<std::string> HostHeadroom::refuse(
    const Config& cfg,
    Placement placement,
    size_t size) const {
  if (placement != Placement::Host) {
    return std::nullopt;
  }
  const uint64_t host_available = availableHostBytes();
  if (host_available >= cfg.host_headroom &&
      host_available - cfg.host_headroom >= size) {
    return std::nullopt;
  }
  return "host_headroom: a " + formatBytes(size) +
      " segment past the device budget would live in host RAM, which has " +
      formatBytes(host_available) + " available and must keep " +
      formatBytes(cfg.host_headroom) +
      " free. Lower host_headroom in PYTORCH_CUDA_UM_CONF, raise "
      "device_budget, or free host memory.";
}

Placement BudgetPlacement::choose(
    const Config& cfg,
    const Ledger& ledger,
    size_t size,
    bool can_advise) const {
  if (!can_advise) {
    return Placement::Unplaced;
  }
  uint64_t budget = cfg.device_budget.resolve(ledger.device_total_bytes);
  if (ledger.device_placed_bytes + size <= budget) {
    return Placement::Device;
  }
  return Placement::Host;
}

size_t BudgetPlacement::apply(
    const Config& cfg,
    void* ptr,
    size_t size,
    int device,
    Placement placement,
    cudaStream_t stream) const {
  cudaError_t err = cudaSuccess;
  size_t prefetched = 0;
  if (placement == Placement::Host) {
    // Cold data past the budget: keep it in host RAM and let the GPU map it
    // in place (about 51 GB/s on PCIe Gen5) instead of migrating it in.
    err = compat::advise(
        ptr, size, cudaMemAdviseSetPreferredLocation, compat::kHost);
    if (err == cudaSuccess) {
      err = compat::advise(ptr, size, cudaMemAdviseSetAccessedBy, device);
    }
    if (err == cudaSuccess && cfg.prefetch) {
      // Populate the pages in host RAM now, so that first GPU touches map
      // instead of faulting pages into existence one by one.
      err = compat::prefetch(ptr, size, compat::kHost, stream);
      prefetched = size;
    }
  } else if (placement == Placement::Device && cfg.prefetch) {
    // Populate on the device now: removes the first-touch fault cost
    // (17.6 GB/s when faulted, vs. prefetch at the speed of memory).
    err = compat::prefetch(ptr, size, device, stream);
    prefetched = size;
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    TORCH_WARN_ONCE(
        "unified memory: advice/prefetch for a ",
        placementName(placement),
        "-placed segment failed (",
        cudaGetErrorString(err),
        "); the segment is still usable, only unplaced.");
    return 0;
  }
  return prefetched;
}

} // namespace c10::cuda::um
