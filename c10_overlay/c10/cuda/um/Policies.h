// The engine's policies, one small class each, composed by Engine.
//
//   admission  ManagedCap, HostHeadroom: may a new managed segment exist?
//   placement  BudgetPlacement: device or host for a new segment, and the
//              advice/prefetch that puts it there.
//
// Later policies (eviction of cold segments when the budget is reached,
// discard of freed blocks, per-kind advice for parameters, activations and
// inputs) slot in beside these and are driven by the allocator's block events
// that Engine::onBlockEvent will receive.
#pragma once

#include <c10/cuda/um/Config.h>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace c10::cuda::um {

enum class Placement : uint8_t {
  Device, // within the device budget: prefetched to the device
  Host, // past the budget: lives in host RAM, mapped for the GPU
  Unplaced, // no advice possible (capture under way, or no concurrent access)
};

const char* placementName(Placement p);

// What the admission and placement policies see of the engine's state.
struct Ledger {
  uint64_t managed_bytes = 0; // all devices
  uint64_t device_placed_bytes = 0; // this device
  uint64_t device_total_bytes = 0; // this device's physical memory
};

// Refuses a segment that would take managed bytes past max_managed.
class ManagedCap {
 public:
  std::optional<std::string> refuse(
      const Config& cfg,
      const Ledger& ledger,
      size_t size) const;
};

// Refuses a host-placed segment that would leave less than host_headroom of
// host RAM available. Host memory is read only for host-placed segments.
class HostHeadroom {
 public:
  std::optional<std::string> refuse(
      const Config& cfg,
      Placement placement,
      size_t size) const;
};

// Segments go to the device while the device budget has room, else to host.
class BudgetPlacement {
 public:
  Placement choose(
      const Config& cfg,
      const Ledger& ledger,
      size_t size,
      bool can_advise) const;

  // Applies advice and prefetch for `placement`. Failures are hints lost,
  // not errors: they are reported once and cleared.
  // Returns the number of bytes prefetched.
  size_t apply(
      const Config& cfg,
      void* ptr,
      size_t size,
      int device,
      Placement placement,
      cudaStream_t stream) const;
};

} // namespace c10::cuda::um
