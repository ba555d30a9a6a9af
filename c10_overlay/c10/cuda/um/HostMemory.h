// How much host RAM a new host-resident segment may still take before the
// kernel's OOM killer would have to step in.
#pragma once

#include <cstdint>

namespace c10::cuda::um {

// min(MemAvailable of /proc/meminfo, room left under this process's cgroup v2
// memory.max). Returns UINT64_MAX if neither can be read.
uint64_t availableHostBytes();

} // namespace c10::cuda::um
