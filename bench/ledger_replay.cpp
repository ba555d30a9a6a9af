// Replays a ledger trace (Note [Ledger traces], Residency.h) recorded on the GPU host
// against c10_overlay's Residency on a CPU, with the ledger's own order for dead
// victims or another, and prints what each would have moved (bench/README.md,
// prediction step 36). No GPU and no torch: the ledger only.
//
//   g++ -std=c++17 -O2 -Ic10_overlay -o ledger_replay bench/ledger_replay.cpp
//       c10_overlay/c10/cuda/um/Residency.cpp c10_overlay/c10/cuda/um/LedgerTrace.cpp
//   TORCH_UM_LEDGER_TRACE=/tmp/run <a +um job>      (writes /tmp/run.<pid>)
//   ./ledger_replay /tmp/run.<pid> [--from FRACTION]
//
// Orders, each replayed from the start of the trace:
//   lru     the ledger's own: the dead chunk touched least recently leaves first
//   belady  the dead chunk whose next use (a block handed out over it, or a touch)
//           comes last in the trace leaves first: Belady's choice, which knows the
//           future, so no predictor can move fewer bytes by choosing dead victims
//           alone. A bound, not a policy.
// Output: one JSON object a line per order, its counters summed over the records
// from FRACTION of the trace (default 0.5: past the warm-up) to its end.
#include <c10/cuda/um/LedgerTrace.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

using namespace c10::cuda::um;

namespace {

// Belady's choice over the trace's future uses of each chunk.
class NextUse final : public DeadChoice {
 public:
  explicit NextUse(const std::vector<TraceRecord>& trace) {
    std::map<uintptr_t, uint64_t> segments; // base -> size, as the run had them
    for (size_t k = 0; k < trace.size(); ++k) {
      const TraceRecord& r = trace[k];
      if (r.op == TraceRecord::AddSegment) {
        segments[r.addr] = r.size;
      } else if (r.op == TraceRecord::RemoveSegment) {
        segments.erase(r.addr);
      } else if (r.op == TraceRecord::Alloc || r.op == TraceRecord::Touch) {
        auto it = segments.upper_bound(r.addr);
        if (it == segments.begin()) {
          continue;
        }
        --it;
        const uintptr_t base = it->first;
        if (r.addr >= base + it->second || r.size == 0) {
          continue;
        }
        const uintptr_t hi = std::min<uintptr_t>(r.addr + r.size, base + it->second);
        for (uintptr_t c = base + (r.addr - base) / kChunkBytes * kChunkBytes; c < hi;
             c += kChunkBytes) {
          uses_[c].push_back(k);
        }
      }
    }
  }
  void at(size_t k) {
    now_ = k;
  }
  size_t pick(const std::vector<uintptr_t>& candidates) override {
    size_t best = 0;
    size_t best_next = 0;
    for (size_t i = 0; i < candidates.size(); ++i) {
      const size_t next = nextUse(candidates[i]);
      if (next == kNever) {
        return i;
      }
      if (next > best_next) {
        best_next = next;
        best = i;
      }
    }
    return best;
  }

 private:
  static constexpr size_t kNever = std::numeric_limits<size_t>::max();
  size_t nextUse(uintptr_t chunk) const {
    auto it = uses_.find(chunk);
    if (it == uses_.end()) {
      return kNever;
    }
    auto u = std::upper_bound(it->second.begin(), it->second.end(), now_);
    return u == it->second.end() ? kNever : *u;
  }
  std::unordered_map<uintptr_t, std::vector<size_t>> uses_;
  size_t now_ = 0;
};

// Bytes under the engine's own counter names (torch.cuda.um.stats(): prefetch_bytes is
// its touch_prefetch_bytes), so that a replay is checked against the run's stats.
void printJson(const char* order, const ResidencyCounters& c, size_t allocs,
               double seconds) {
  auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
  std::printf(
      "{\"order\": \"%s\", \"allocs\": %zu, \"discard_bytes\": %llu, "
      "\"reuse_bytes\": %llu, \"evict_bytes\": %llu, \"touch_prefetch_bytes\": %llu, "
      "\"duplicate_bytes\": %llu, \"map_host_bytes\": %llu, \"discards\": %llu, "
      "\"evictions\": %llu, \"replay_s\": %.2f}\n",
      order, allocs, u(c.discard_bytes), u(c.reuse_bytes), u(c.evict_bytes),
      u(c.prefetch_bytes), u(c.duplicate_bytes), u(c.map_host_bytes), u(c.discards),
      u(c.evictions), seconds);
}

ResidencyCounters minus(const ResidencyCounters& a, const ResidencyCounters& b) {
  ResidencyCounters d;
  d.discard_bytes = a.discard_bytes - b.discard_bytes;
  d.reuse_bytes = a.reuse_bytes - b.reuse_bytes;
  d.evict_bytes = a.evict_bytes - b.evict_bytes;
  d.prefetch_bytes = a.prefetch_bytes - b.prefetch_bytes;
  d.duplicate_bytes = a.duplicate_bytes - b.duplicate_bytes;
  d.map_host_bytes = a.map_host_bytes - b.map_host_bytes;
  d.discards = a.discards - b.discards;
  d.evictions = a.evictions - b.evictions;
  return d;
}

int usage(const char* why) {
  std::fprintf(stderr, "ledger_replay: %s\nusage: ledger_replay TRACE [--from FRACTION]\n",
               why);
  return 2;
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 4) {
    return usage("give a trace file, and optionally --from FRACTION");
  }
  double from = 0.5;
  if (argc == 4) {
    char* end = nullptr;
    from = std::strtod(argv[3], &end);
    if (std::string(argv[2]) != "--from" || *end != '\0' || !(from >= 0 && from < 1)) {
      return usage("--from takes a fraction in [0, 1)");
    }
  }
  std::ifstream in(argv[1]);
  if (!in) {
    return usage((std::string("cannot read ") + argv[1]).c_str());
  }
  std::vector<TraceRecord> trace;
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    TraceRecord r;
    if (!parseTrace(line, r)) {
      std::fprintf(stderr, "ledger_replay: %s:%zu is not a ledger record: %.80s\n",
                   argv[1], n, line.c_str());
      return 1;
    }
    trace.push_back(r);
  }
  if (trace.empty()) {
    return usage("the trace holds no records");
  }
  const size_t start = static_cast<size_t>(from * static_cast<double>(trace.size()));
  size_t allocs = 0;
  for (size_t k = start; k < trace.size(); ++k) {
    allocs += trace[k].op == TraceRecord::Alloc;
  }
  NextUse belady(trace);
  for (const char* order : {"lru", "belady"}) {
    const auto t0 = std::chrono::steady_clock::now();
    Residency ledger;
    const bool oracle = std::string(order) == "belady";
    if (oracle) {
      ledger.setDeadChoice(&belady);
    }
    std::vector<Action> out;
    ResidencyCounters before;
    for (size_t k = 0; k < trace.size(); ++k) {
      if (k == start) {
        before = ledger.counters();
      }
      belady.at(k);
      out.clear();
      replayTrace(ledger, trace[k], out);
    }
    const std::string bad = ledger.checkInvariants();
    if (!bad.empty()) {
      std::fprintf(stderr, "ledger_replay: %s: the ledger is inconsistent: %s\n", order,
                   bad.c_str());
      return 1;
    }
    printJson(order, minus(ledger.counters(), before), allocs,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 0;
}
