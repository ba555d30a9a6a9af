// Replays a ledger trace (Note [Ledger traces], Residency.h) recorded on the GPU host
// against c10_overlay's Residency on a CPU, with the ledger's own order for dead
// victims or another, and prints what each would have moved (bench/README.md,
// prediction step 36). No GPU and no torch: the ledger only.
//
//   g++ -std=c++17 -O2 -Ic10_overlay -o ledger_replay bench/probes/ledger_replay.cpp
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
//   resident-block
//           the ledger's own order, and the allocator's choice of block changed: a
//           block handed out whose size some other free block has (whole, 2 MiB
//           aligned, a segment of the same stream) is swapped for the one of them
//           with the most chunks on the device, from then on (Note [Pricing the
//           block choice] below). What a residency-aware choice among the caching
//           allocator's free blocks of a size could save; a lower bound of that, as
//           it never splits a larger block.
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

// The managed segments as the run had them at a point of its trace.
class Segments {
 public:
  struct Segment {
    uintptr_t base;
    uint64_t size;
    uintptr_t stream;
  };
  // Follows one record: AddSegment and RemoveSegment change the set.
  void follow(const TraceRecord& r) {
    if (r.op == TraceRecord::AddSegment) {
      all_[r.addr] = Segment{r.addr, r.size, r.stream};
    } else if (r.op == TraceRecord::RemoveSegment) {
      all_.erase(r.addr);
    }
  }
  // The segment holding addr, or nullptr.
  const Segment* find(uintptr_t addr) const {
    auto it = all_.upper_bound(addr);
    if (it == all_.begin()) {
      return nullptr;
    }
    --it;
    return addr < it->first + it->second.size ? &it->second : nullptr;
  }
  const std::map<uintptr_t, Segment>& all() const {
    return all_;
  }

 private:
  std::map<uintptr_t, Segment> all_; // by base
};

// Belady's choice over the trace's future uses of each chunk.
class NextUse final : public DeadChoice {
 public:
  explicit NextUse(const std::vector<TraceRecord>& trace) {
    Segments segments;
    for (size_t k = 0; k < trace.size(); ++k) {
      const TraceRecord& r = trace[k];
      segments.follow(r);
      if (r.op != TraceRecord::Alloc && r.op != TraceRecord::Touch) {
        continue;
      }
      const Segments::Segment* seg = segments.find(r.addr);
      if (seg == nullptr || r.size == 0) {
        continue;
      }
      const uintptr_t hi = std::min<uintptr_t>(r.addr + r.size, seg->base + seg->size);
      for (uintptr_t c = seg->base + (r.addr - seg->base) / kChunkBytes * kChunkBytes;
           c < hi; c += kChunkBytes) {
        uses_[c].push_back(k);
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

// Note [Pricing the block choice]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The ledger sees blocks only as ranges, so the replay may hand out another free
// range of the same size in place of the one the run's allocator chose, as long as
// every later record about either range is moved with it. Swaps keeps that
// permutation: run addresses to replay addresses and back, as whole pieces; a
// record is translated piece by piece (a later block that spans a moved piece and
// its neighbour becomes two ranges, which the ledger takes as it would one). Only
// whole free blocks of exactly the size asked, chunk aligned, in a segment of the
// same stream are candidates; a segment released while a piece moved into or out
// of it ends the pricing (no recorded trace has one).
class Swaps {
 public:
  struct Piece {
    uint64_t len;
    uintptr_t to;
  };
  // [addr, addr+len) in run addresses -> replay ranges, in order.
  void translate(uintptr_t addr, uint64_t len,
                 std::vector<std::pair<uintptr_t, uint64_t>>& out) const {
    out.clear();
    translateIn(fwd_, addr, len, out);
  }
  // The run range now at replay range [addr, addr+len), if it is one piece.
  bool inverse(uintptr_t addr, uint64_t len, uintptr_t& run) const {
    std::vector<std::pair<uintptr_t, uint64_t>> out;
    translateIn(inv_, addr, len, out);
    if (out.size() != 1) {
      return false;
    }
    run = out[0].first;
    return true;
  }
  // Run range a (now at replay a2) and run range b (now at replay b2) trade places.
  void swap(uintptr_t a, uintptr_t a2, uintptr_t b, uintptr_t b2, uint64_t len) {
    assign(fwd_, a, len, b2);
    assign(fwd_, b, len, a2);
    assign(inv_, b2, len, a);
    assign(inv_, a2, len, b);
  }
  // Drops the pieces inside a released segment; false if one crosses its edge.
  bool release(uintptr_t base, uint64_t size) {
    return releaseIn(fwd_, base, size) && releaseIn(inv_, base, size);
  }

 private:
  using Map = std::map<uintptr_t, Piece>;
  static void translateIn(const Map& m, uintptr_t addr, uint64_t len,
                          std::vector<std::pair<uintptr_t, uint64_t>>& out) {
    uintptr_t at = addr;
    const uintptr_t end = addr + len;
    auto it = m.upper_bound(at);
    if (it != m.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second.len > at) {
        it = prev;
      }
    }
    while (at < end) {
      if (it == m.end() || it->first >= end) {
        push(out, at, end - at); // identity to the end
        break;
      }
      if (it->first > at) {
        push(out, at, it->first - at); // identity up to the next piece
        at = it->first;
      }
      const uintptr_t hi = std::min<uintptr_t>(end, it->first + it->second.len);
      push(out, it->second.to + (at - it->first), hi - at);
      at = hi;
      ++it;
    }
  }
  static void push(std::vector<std::pair<uintptr_t, uint64_t>>& out, uintptr_t a,
                   uint64_t n) {
    if (!out.empty() && out.back().first + out.back().second == a) {
      out.back().second += n;
    } else {
      out.emplace_back(a, n);
    }
  }
  // Maps exactly [from, from+len) to [to, to+len); a piece that reaches past
  // either end is cut there first, its parts outside keeping their mapping.
  static void assign(Map& m, uintptr_t from, uint64_t len, uintptr_t to) {
    cut(m, from);
    cut(m, from + len);
    m.erase(m.lower_bound(from), m.lower_bound(from + len));
    if (from != to) {
      m[from] = Piece{len, to};
    }
  }
  // A piece that holds `at` strictly inside becomes two, split at `at`.
  static void cut(Map& m, uintptr_t at) {
    auto it = m.upper_bound(at);
    if (it == m.begin()) {
      return;
    }
    --it;
    const uintptr_t base = it->first;
    Piece& p = it->second;
    if (at > base && at < base + p.len) {
      const uint64_t head = at - base;
      m[at] = Piece{p.len - head, p.to + head};
      p.len = head;
    }
  }
  static bool releaseIn(Map& m, uintptr_t base, uint64_t size) {
    for (auto it = m.lower_bound(base); it != m.end() && it->first < base + size;) {
      const Piece& p = it->second;
      if (it->first + p.len > base + size || p.to < base || p.to + p.len > base + size) {
        return false;
      }
      it = m.erase(it);
    }
    return true;
  }
  Map fwd_; // run -> replay
  Map inv_; // replay -> run
};

// Blocks handed out elsewhere than the run's allocator put them.
struct BlockSwaps {
  size_t count = 0;
  uint64_t bytes = 0;
};

// Replays one record under Note [Pricing the block choice]; false once the pricing
// cannot go on (a released segment with a moved piece).
class BlockChooser {
 public:
  bool replay(Residency& ledger, const TraceRecord& r, std::vector<Action>& out) {
    switch (r.op) {
      case TraceRecord::AddSegment:
        segments_.follow(r);
        replayTrace(ledger, r, out);
        return true;
      case TraceRecord::RemoveSegment: {
        const Segments::Segment* seg = segments_.find(r.addr);
        if (seg != nullptr && seg->base == r.addr) {
          const uintptr_t end = seg->base + seg->size;
          if (!swaps_.release(seg->base, seg->size)) {
            return false;
          }
          free_.erase(free_.lower_bound(r.addr), free_.lower_bound(end));
        }
        segments_.follow(r);
        replayTrace(ledger, r, out);
        return true;
      }
      case TraceRecord::Alloc:
        choose(ledger, r);
        break;
      case TraceRecord::Clock: // positions, not an address
        replayTrace(ledger, r, out);
        return true;
      default:
        break;
    }
    swaps_.translate(r.addr, r.size, pieces_);
    for (const auto& [addr, len] : pieces_) {
      TraceRecord p = r;
      p.addr = addr;
      p.size = len;
      if (r.op == TraceRecord::Alloc) {
        takeFree(addr, len);
      } else if (r.op == TraceRecord::Free && whole(addr, len)) {
        free_[addr] = len;
      }
      out.clear();
      replayTrace(ledger, p, out);
    }
    return true;
  }
  const BlockSwaps& swapped() const {
    return swapped_;
  }

 private:
  static bool whole(uintptr_t addr, uint64_t len) {
    return len >= kChunkBytes && addr % kChunkBytes == 0 && len % kChunkBytes == 0;
  }
  // The run's block [r.addr, +r.size) may go to another free block of its size.
  void choose(const Residency& ledger, const TraceRecord& r) {
    swaps_.translate(r.addr, r.size, pieces_);
    if (pieces_.size() != 1 || !whole(pieces_[0].first, r.size)) {
      return;
    }
    const uintptr_t here = pieces_[0].first;
    auto own = free_.find(here);
    if (own == free_.end() || own->second != r.size) {
      return; // not a whole free block the allocator handed back out
    }
    const uintptr_t stream = streamOf(here);
    uintptr_t best = here;
    uint64_t best_on = onDevice(ledger, here, r.size);
    for (const auto& [addr, len] : free_) {
      if (len != r.size || addr == here || streamOf(addr) != stream) {
        continue;
      }
      const uint64_t on = onDevice(ledger, addr, len);
      if (on > best_on) {
        best_on = on;
        best = addr;
      }
    }
    uintptr_t other = 0;
    if (best == here || !swaps_.inverse(best, r.size, other)) {
      return;
    }
    swaps_.swap(r.addr, here, other, best, r.size);
    swapped_.count += 1;
    swapped_.bytes += r.size;
  }
  static uint64_t onDevice(const Residency& ledger, uintptr_t addr, uint64_t len) {
    uint64_t n = 0;
    for (uintptr_t c = addr; c < addr + len; c += kChunkBytes) {
      n += ledger.whereIs(c) == Where::Device;
    }
    return n;
  }
  uintptr_t streamOf(uintptr_t addr) const {
    const Segments::Segment* seg = segments_.find(addr);
    return seg != nullptr ? seg->stream : 0;
  }
  // A range handed out is no longer a free block (nor is any block it overlaps).
  void takeFree(uintptr_t addr, uint64_t len) {
    auto it = free_.upper_bound(addr);
    if (it != free_.begin() && std::prev(it)->first + std::prev(it)->second > addr) {
      --it;
    }
    while (it != free_.end() && it->first < addr + len) {
      it = free_.erase(it);
    }
  }
  Segments segments_;
  std::map<uintptr_t, uint64_t> free_; // whole free blocks, replay addresses -> size
  Swaps swaps_;
  BlockSwaps swapped_;
  std::vector<std::pair<uintptr_t, uint64_t>> pieces_;
};

// Bytes under the engine's own counter names (torch.cuda.um.stats(): prefetch_bytes is
// its touch_prefetch_bytes), so that a replay is checked against the run's stats.
void printJson(const char* order, const ResidencyCounters& c, size_t allocs,
               double seconds, const BlockSwaps* swapped = nullptr) {
  auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
  std::printf(
      "{\"order\": \"%s\", \"allocs\": %zu, \"discard_bytes\": %llu, "
      "\"reuse_bytes\": %llu, \"evict_bytes\": %llu, \"touch_prefetch_bytes\": %llu, "
      "\"duplicate_bytes\": %llu, \"map_host_bytes\": %llu, \"discards\": %llu, "
      "\"evictions\": %llu, ",
      order, allocs, u(c.discard_bytes), u(c.reuse_bytes), u(c.evict_bytes),
      u(c.prefetch_bytes), u(c.duplicate_bytes), u(c.map_host_bytes), u(c.discards),
      u(c.evictions));
  if (swapped != nullptr) {
    std::printf("\"block_swaps\": %zu, \"block_swap_bytes\": %llu, ", swapped->count,
                u(swapped->bytes));
  }
  std::printf("\"replay_s\": %.2f}\n", seconds);
}

// Live bytes the ledger holds at the end, over the segments the trace left: the same
// for every way of replaying it (a moved block moves its live bytes, it makes none).
uint64_t liveTotal(const Residency& ledger, const std::vector<TraceRecord>& trace) {
  Segments segments;
  for (const TraceRecord& r : trace) {
    segments.follow(r);
  }
  uint64_t live = 0;
  for (const auto& [base, seg] : segments.all()) {
    for (uintptr_t c = base; c < base + seg.size; c += kChunkBytes) {
      live += ledger.liveBytesAt(c);
    }
  }
  return live;
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
  constexpr uint64_t kNoLive = std::numeric_limits<uint64_t>::max();
  uint64_t live_first = kNoLive;
  for (const char* order : {"lru", "belady", "resident-block"}) {
    const auto t0 = std::chrono::steady_clock::now();
    Residency ledger;
    const bool oracle = std::string(order) == "belady";
    if (oracle) {
      ledger.setDeadChoice(&belady);
    }
    const bool choose = std::string(order) == "resident-block";
    BlockChooser chooser;
    std::vector<Action> out;
    ResidencyCounters before;
    BlockSwaps swapped_before;
    for (size_t k = 0; k < trace.size(); ++k) {
      if (k == start) {
        before = ledger.counters();
        swapped_before = chooser.swapped();
      }
      belady.at(k);
      out.clear();
      if (!choose) {
        replayTrace(ledger, trace[k], out);
      } else if (!chooser.replay(ledger, trace[k], out)) {
        std::fprintf(stderr,
                     "ledger_replay: %s: record %zu releases a segment a moved block "
                     "is in or came from; not priced\n",
                     order, k + 1);
        return 1;
      }
    }
    const std::string bad = ledger.checkInvariants();
    if (!bad.empty()) {
      std::fprintf(stderr, "ledger_replay: %s: the ledger is inconsistent: %s\n", order,
                   bad.c_str());
      return 1;
    }
    const uint64_t live = liveTotal(ledger, trace);
    if (live_first == kNoLive) {
      live_first = live;
    } else if (live != live_first) {
      std::fprintf(stderr, "ledger_replay: %s: %llu live bytes at the end, not %llu\n",
                   order, static_cast<unsigned long long>(live),
                   static_cast<unsigned long long>(live_first));
      return 1;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (choose) {
      const BlockSwaps swapped{chooser.swapped().count - swapped_before.count,
                               chooser.swapped().bytes - swapped_before.bytes};
      printJson(order, minus(ledger.counters(), before), allocs, seconds, &swapped);
    } else {
      printJson(order, minus(ledger.counters(), before), allocs, seconds);
    }
  }
  return 0;
}
