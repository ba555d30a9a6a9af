#include <c10/cuda/um/Policies.h>

#include <c10/cuda/um/HostMemory.h>

#include <algorithm>

namespace c10::cuda::um {

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
    const Ledger& ledger,
    size_t size) const {
  const uint64_t after = ledger.device_resident_bytes + size;
  if (after <= ledger.device_budget_bytes) {
    return std::nullopt;
  }
  const uint64_t to_host =
      std::min<uint64_t>(size, after - ledger.device_budget_bytes);
  if (fits(cfg, to_host)) {
    return std::nullopt;
  }
  const uint64_t host_available = availableHostBytes();
  return "host_headroom: a " + formatBytes(size) + " segment puts " +
      formatBytes(to_host) +
      " past the device budget into host RAM, which has " +
      formatBytes(host_available) + " available and must keep " +
      formatBytes(cfg.host_headroom) +
      " free. Lower host_headroom in PYTORCH_CUDA_UM_CONF, raise "
      "device_budget, or free host memory.";
}

bool HostHeadroom::fits(const Config& cfg, uint64_t to_host) const {
  return room(cfg) >= to_host;
}

uint64_t HostHeadroom::room(const Config& cfg) const {
  const uint64_t host_available = availableHostBytes();
  return host_available >= cfg.host_headroom
      ? host_available - cfg.host_headroom
      : 0;
}

} // namespace c10::cuda::um
