#include <c10/cuda/um/HostMemory.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>

namespace c10::cuda::um {
namespace {

std::optional<uint64_t> memAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") {
      return kib * 1024;
    }
  }
  return std::nullopt;
}

std::optional<uint64_t> readNumber(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") {
    return std::nullopt;
  }
  try {
    return std::stoull(word);
  } catch (...) {
    return std::nullopt;
  }
}

std::optional<uint64_t> cgroupRoom() {
  // cgroup v2: a single "0::/path" line names our group.
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) != 0) {
      continue;
    }
    std::string dir = "/sys/fs/cgroup" + line.substr(3);
    auto limit = readNumber(dir + "/memory.max");
    auto current = readNumber(dir + "/memory.current");
    if (limit && current) {
      return *limit > *current ? *limit - *current : 0;
    }
  }
  return std::nullopt;
}

// Note [Host pages are populated by CPU threads]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A new segment's chunks that are placed in host RAM (MapHost) need host
// pages before a GPU can write them in place at link speed. Fresh pages come
// into existence through the driver's CPU fault path whatever asks for them,
// and that path is slow per thread but scales with threads. On an H200 host,
// for a fresh 2 GiB range with PreferredLocation=host (GB/s of population,
// bench/probes/populate_probe.py, bench/README.md "Prediction, step 17"): a
// prefetch to the host (what MapHost did before) 2.4; GPU writes faulting
// them in 4.7; CPU writes from 1, 4, 8 and 16 threads 2.3, 5.4, 8.8 and 9.5.
// Listing 1's first run went from 9.9 to 8.4 s with it (step 20).
// So populateOnHost writes one byte per page from up to kPopulateThreads
// threads, at least kPopulatePart bytes each, the calling thread included.
// Two callers, both on memory fresh from cudaMallocManaged that nobody holds
// yet, so no kernel, copy or thread can use it and its content is undefined
// until its first user writes it:
//   - MapHost (Executor.cpp), for a new segment's chunks placed in host RAM.
//     A range adopted by torch.cuda.um.move_ holds data and never gets
//     MapHost (Residency::addSegment; the GPU suite's move_ past the budget
//     lost its data when it did);
//   - Engine::allocHost, for a managed CPU tensor of at least
//     kPopulateMinHostAlloc bytes (Note [Managed host memory]): a pinned
//     buffer's pages are made at allocation too, and pages the CPU makes are
//     the ones a GPU copy then writes at link speed, where a copy into pages
//     nobody made faults them in at about 4 GB/s (step 43) and a CPU
//     writer alone makes them at 2.3.
// If a thread cannot be started, the calling thread touches that part
// itself.
//
// Note [A host allocation is mapped before its pages are made]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A GPU reaches host-placed managed pages through its own page tables, which
// AccessedBy=GPU fills. Set before the CPU makes the pages, it costs nothing
// we can measure: each CPU fault maps the new page for the GPU too (2 GiB,
// 8-16 threads: 11.9-13.6 GB/s with AccessedBy set first, 12.1-12.6 with
// PreferredLocation alone; bench.probes.populate_probe --making-only, bench/README.md
// "Prediction, step 45"). Set after, it walks pages that already exist, at
// about 25 GB/s (0.08 s per 2 GiB); left to the GPU's faults, 1.7-2.6 GB/s.
// So MapHost advises before populateOnHost, and Engine::allocHost maps a
// managed CPU tensor it populates for the current device before making its
// pages; mapHostFor does it for any other device at that device's first
// kernel copy (Note [Copies of managed host memory by kernel], HostCopy.h).
constexpr size_t kPopulateThreads = 8;
constexpr size_t kPopulatePart = 64ull << 20;

size_t pageBytes() {
  const long page = sysconf(_SC_PAGESIZE);
  return page > 0 ? static_cast<size_t>(page) : 4096;
}

void touchPages(char* begin, size_t size, size_t page) {
  volatile char* p = begin;
  for (size_t off = 0; off < size; off += page) {
    p[off] = 0;
  }
}

} // namespace

uint64_t availableHostBytes() {
  uint64_t room = UINT64_MAX;
  if (auto avail = memAvailable()) {
    room = std::min(room, *avail);
  }
  if (auto cg = cgroupRoom()) {
    room = std::min(room, *cg);
  }
  return room;
}

void populateOnHost(const std::vector<void*>& ptrs, const std::vector<size_t>& sizes) {
  size_t total = 0;
  for (size_t s : sizes) {
    total += s;
  }
  const size_t page = pageBytes();
  // [lo, hi) of the ranges laid end to end.
  onParts(total, kPopulatePart, kPopulateThreads, [&](size_t lo, size_t hi) {
    size_t start = 0;
    for (size_t r = 0; r < ptrs.size() && lo < hi; ++r) {
      const size_t end = start + sizes[r];
      if (lo < end) {
        const size_t upto = std::min(hi, end);
        touchPages(static_cast<char*>(ptrs[r]) + (lo - start), upto - lo, page);
        lo = upto;
      }
      start = end;
    }
  });
}

void onParts(
    size_t total,
    size_t min_part,
    size_t max_threads,
    const std::function<void(size_t lo, size_t hi)>& fn) {
  const size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t parts =
      std::clamp<size_t>(total / std::max<size_t>(min_part, 1), 1, std::min(max_threads, hw));
  const size_t page = pageBytes();
  const size_t share = (total / parts + page - 1) / page * page;
  auto part = [&](size_t k) {
    const size_t lo = std::min(total, k * share);
    const size_t hi = std::min(total, lo + share);
    if (lo < hi) {
      fn(lo, hi);
    }
  };
  std::vector<std::thread> helpers;
  helpers.reserve(parts - 1);
  for (size_t k = 1; k < parts; ++k) {
    try {
      helpers.emplace_back(part, k);
    } catch (const std::system_error&) {
      part(k);
    }
  }
  part(0);
  for (std::thread& t : helpers) {
    t.join();
  }
}

} // namespace c10::cuda::um
