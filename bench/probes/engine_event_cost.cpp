// What one block event costs the residency engine's ledger on this CPU, far from the
// budget (the case of a job whose data fits): Residency::onAlloc and onFree for blocks
// of three sizes, as the caching allocator makes them (bench/README.md, prediction
// steps 31 and 42). No GPU and no torch: the ledger only. Two ways:
//
//   hot   100 segments of 20 MiB in turn, nothing else between events: the ledger's
//         own work, its data in the CPU's caches;
//   cold  450 segments in a shuffled order, a MiB of other memory written between
//         events, as a training step's own work does between two of its allocations:
//         what the ledger waits for memory (Note [Finding a segment], Residency.cpp).
//
//   g++ -std=c++17 -O2 -Ic10_overlay -Itests/engine/cuda_stub -o engine_event_cost
//       bench/probes/engine_event_cost.cpp c10_overlay/c10/cuda/um/Residency.cpp -lpthread
//   ./engine_event_cost [PAIRS]      (allocation-and-free pairs a size, 2000000 hot,
//                                     a tenth of that cold)
#include <c10/cuda/um/Residency.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

using namespace c10::cuda::um;

namespace {

double nsAnEvent(bool cold, uint64_t size, int n) {
  Residency r;
  DeviceLimits lim;
  lim.budget = 100ull << 30;
  lim.can_act = true;
  lim.discard = true;
  std::vector<Action> out;
  void* stream = reinterpret_cast<void*>(0x5);
  const int segments = cold ? 450 : 100;
  const uintptr_t base = 1ull << 36;
  std::vector<int> order(segments);
  for (int i = 0; i < segments; ++i) {
    order[i] = i;
    r.addSegment(base + i * (1ull << 30), 20ull << 20, 0, stream, true, false,
                 Policy::Lru, lim, out);
  }
  if (cold) {
    std::shuffle(order.begin(), order.end(), std::mt19937(1));
  }
  out.clear();
  std::vector<char> other(cold ? 8 << 20 : 0);
  std::chrono::steady_clock::duration spent{};
  for (int i = 0; i < n; ++i) {
    if (cold) {
      std::memset(other.data() + (i % 8) * (1 << 20), i, 1 << 20);
    }
    const uintptr_t a = base + order[i % segments] * (1ull << 30) + (i % 3) * 512;
    const auto t = std::chrono::steady_clock::now();
    r.onAlloc(a, size, stream, Policy::Lru, lim, out);
    r.onFree(a, size);
    spent += std::chrono::steady_clock::now() - t;
    out.clear();
  }
  return std::chrono::duration<double, std::nano>(spent).count() / n / 2;
}

} // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 2000000;
  if (n < 10) {
    std::fprintf(stderr, "PAIRS must be a count of at least 10\n");
    return 2;
  }
  for (bool cold : {false, true}) {
    for (uint64_t size : {512ull, 4ull << 20, 16ull << 20}) {
      std::printf("%s: block of %llu bytes: %.0f ns an event\n", cold ? "cold" : "hot ",
                  static_cast<unsigned long long>(size),
                  nsAnEvent(cold, size, cold ? n / 10 : n));
    }
  }
  return 0;
}
