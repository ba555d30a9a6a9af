// What one block event costs the residency engine's ledger on this CPU, far from the
// budget (the case of a job whose data fits): Residency::onAlloc and onFree for blocks
// of three sizes in 100 segments of 20 MiB, as the caching allocator makes them
// (bench/README.md, prediction step 31). No GPU and no torch: the ledger only.
//
//   g++ -std=c++17 -O2 -Ic10_overlay -Itests/engine/cuda_stub -o engine_event_cost
//       bench/engine_event_cost.cpp c10_overlay/c10/cuda/um/Residency.cpp -lpthread
//   ./engine_event_cost [PAIRS]      (allocation-and-free pairs a size, 2000000)
#include <c10/cuda/um/Residency.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

using namespace c10::cuda::um;

int main(int argc, char** argv) {
  Residency r;
  DeviceLimits lim;
  lim.budget = 100ull << 30;
  lim.can_act = true;
  lim.discard = true;
  std::vector<Action> out;
  void* stream = reinterpret_cast<void*>(0x5);
  const uint64_t seg = 20ull << 20;
  const int segments = 100;
  const uintptr_t base = 1ull << 36;
  for (int i = 0; i < segments; ++i) {
    r.addSegment(base + i * (1ull << 30), seg, 0, stream, true, false,
                 Policy::Lru, lim, out);
  }
  out.clear();
  const int n = argc > 1 ? std::atoi(argv[1]) : 2000000;
  if (n < 1) {
    std::fprintf(stderr, "PAIRS must be a count of at least 1\n");
    return 2;
  }
  for (uint64_t size : {512ull, 4ull << 20, 16ull << 20}) {
    const auto t = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      const uintptr_t a = base + (i % segments) * (1ull << 30) + (i % 3) * 512;
      r.onAlloc(a, size, stream, Policy::Lru, lim, out);
      r.onFree(a, size);
      out.clear();
    }
    const double ns = std::chrono::duration<double, std::nano>(
                          std::chrono::steady_clock::now() - t)
                          .count() /
        n / 2;
    std::printf("block of %llu bytes: %.0f ns an event\n",
                static_cast<unsigned long long>(size), ns);
  }
  return 0;
}
