// Host RAM for managed memory: how much a new host-resident segment may
// still take, and making its pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace c10::cuda::um {

// min(MemAvailable of /proc/meminfo, room left under this process's cgroup v2
// memory.max). Returns UINT64_MAX if neither can be read.
uint64_t availableHostBytes();

// Makes the host pages of fresh managed ranges nobody uses yet by writing
// one byte per page from CPU threads (Note [Host pages are populated by CPU
// threads], HostMemory.cpp). Blocks until done.
void populateOnHost(const std::vector<void*>& ptrs, const std::vector<size_t>& sizes);

// Managed CPU tensors at least this large get their pages at allocation
// (Engine::allocHost): two populating threads or more.
constexpr size_t kPopulateMinHostAlloc = 128ull << 20;

} // namespace c10::cuda::um
