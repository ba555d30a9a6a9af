// Admission policies, one small class each, composed by Engine: may a new
// managed segment exist? Residency policies (where its pages live over
// time: placement, eviction, discard, reuse) are in Residency.h.
#pragma once

#include <c10/cuda/um/Config.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace c10::cuda::um {

// What the admission policies see of the engine's state.
struct Ledger {
  uint64_t managed_bytes = 0; // all devices
  uint64_t device_resident_bytes = 0; // this device
  uint64_t device_budget_bytes = 0; // this device
};

// Refuses a segment that would take managed bytes past max_managed.
class ManagedCap {
 public:
  std::optional<std::string> refuse(
      const Config& cfg,
      const Ledger& ledger,
      size_t size) const;
};

// Refuses a segment whose bytes past the device budget (which end up in host
// RAM, placed or evicted there) would leave less than host_headroom of host
// RAM available. Host memory is read only when such bytes exist.
class HostHeadroom {
 public:
  std::optional<std::string> refuse(
      const Config& cfg,
      const Ledger& ledger,
      size_t size) const;
  // The same rule for bytes that go to host RAM whatever the budget (managed
  // host memory for CPU tensors, Note [Managed host memory]).
  bool fits(const Config& cfg, uint64_t to_host) const;
  // Host RAM still free past host_headroom: what fits() admits (0 below it;
  // about UINT64_MAX when host memory cannot be read).
  uint64_t room(const Config& cfg) const;
};

} // namespace c10::cuda::um
