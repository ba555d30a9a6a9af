// Host RAM for managed memory: how much a new host-resident segment may
// still take, and making its pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace c10::cuda::um {

// min(MemAvailable of /proc/meminfo, room left under this process's cgroup v2
// memory.max). Returns UINT64_MAX if neither can be read.
uint64_t availableHostBytes();

// Splits [0, total) into up to max_threads parts (no more than the machine's
// hardware threads) of at least min_part bytes each where total allows, with
// boundaries on whole pages, and runs fn(lo, hi) for every part at once: the
// first on the calling thread, each other on a thread of its own; a thread
// that cannot be started leaves its part to the caller. Returns when all are
// done.
void onParts(
    size_t total,
    size_t min_part,
    size_t max_threads,
    const std::function<void(size_t lo, size_t hi)>& fn);

// Makes the host pages of fresh managed ranges nobody uses yet by writing
// one byte per page from CPU threads (Note [Host pages are populated by CPU
// threads], HostMemory.cpp). Blocks until done.
void populateOnHost(const std::vector<void*>& ptrs, const std::vector<size_t>& sizes);

// Managed CPU tensors at least this large get their pages at allocation
// (Engine::allocHost): two populating threads or more.
constexpr size_t kPopulateMinHostAlloc = 128ull << 20;

} // namespace c10::cuda::um
