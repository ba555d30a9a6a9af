// Drives the residency ledger (c10_overlay/c10/cuda/um/Residency.h) with event
// traces, executes its actions on a simulated GPU, and checks the engine's
// invariants after every step:
//   - pages on the device never exceed the budget while the engine may act;
//   - no live byte is ever discarded (a simulated content check), but those
//     of a block whose content was forgotten until its next touch;
//   - a discarded chunk gets pages before its next use;
//   - nothing is done while a capture is under way;
//   - the ledger agrees with where the actions put each chunk;
//   - when everything fits, a repeating loop issues no action at all.
// Built and run by tests/unit/test_engine_residency.py; no GPU, no torch.
#include "check.h"
#include <c10/cuda/um/LedgerTrace.h>
#include <c10/cuda/um/Residency.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>
#include <sys/wait.h>
#include <unistd.h>
#include <fstream>

using namespace c10::cuda::um;

namespace {

using engine_test::g_failures;

enum class Phys { None, Device, Host };

// A simulated GPU: where each chunk's pages physically are (by the actions
// executed), and which blocks hold live data.
struct Sim {
  Residency r;
  Policy policy = Policy::Lru;
  DeviceLimits lim;
  std::map<uintptr_t, Phys> phys; // chunk address -> pages
  std::map<uintptr_t, uint64_t> csize; // chunk address -> bytes
  std::map<uintptr_t, uint64_t> evicted_by; // chunk -> its last eviction batch
  std::set<uintptr_t> read_mostly; // chunks with ReadMostly set
  uintptr_t next_base = 1ull << 36; // for segments of trainingLoop
  std::map<uintptr_t, uint64_t> live; // block addr -> size
  // live blocks whose content was forgotten and not touched since (Note
  // [Forgotten content]): their bytes may be discarded
  std::set<uintptr_t> forgotten;
  std::map<uintptr_t, uint64_t> segs; // segment base -> size
  uint64_t actions = 0;
  std::vector<Action> last; // the actions of the last call
  void* stream = reinterpret_cast<void*>(0x5);

  Sim() {
    lim.budget = 64 * kChunkBytes;
    lim.can_act = true;
    lim.discard = true;
    lim.read_copies = true;
  }

  // `content`: only blocks whose content must survive (not forgotten).
  bool overlapsLive(uintptr_t lo, uintptr_t hi, uintptr_t except, bool content = false) const {
    for (const auto& [a, n] : live) {
      if (a != except && !(content && forgotten.count(a)) && a < hi && lo < a + n) {
        return true;
      }
    }
    return false;
  }

  std::map<uint64_t, std::pair<void*, Action::Kind>> batch_stream; // batch -> stream, kind

  std::vector<Action> all; // every action of every call, in order

  bool apply(const std::vector<Action>& out, uintptr_t allocating) {
    last = out;
    all.insert(all.end(), out.begin(), out.end());
    if (!lim.can_act) {
      CHECK(out.empty(), "%zu actions while capturing", out.size());
    }
    for (const Action& a : out) {
      if (a.kind == Action::EvictToHost || a.kind == Action::Discard) {
        // One batch number, one stream, one kind: the evictor issues it as
        // one job.
        auto [it, fresh] = batch_stream.emplace(a.fence, std::make_pair(a.stream, a.kind));
        CHECK(fresh || it->second == std::make_pair(a.stream, a.kind),
              "batch %llu spans streams or kinds", (unsigned long long)a.fence);
      }
    }
    // The executor issues each group of nextGroup() as one call that waits
    // for the group's fence: check the fences as it will use them.
    std::vector<uint64_t> call_fence(out.size());
    for (size_t i = 0; i < out.size();) {
      const ActionGroup g = nextGroup(out, i);
      CHECK(g.end > i, "empty group");
      for (; i < g.end; ++i) {
        call_fence[i] = g.fence;
        if (out[i].kind == Action::EvictToHost || out[i].kind == Action::Discard) {
          CHECK(out[i].fence == g.fence, "one evictor job spans batch numbers");
        }
      }
    }
    for (size_t k = 0; k < out.size(); ++k) {
      const Action& a = out[k];
      ++actions;
      CHECK(a.size > 0, "empty action");
      for (uintptr_t c = a.addr; c < a.addr + a.size; c += kChunkBytes) {
        CHECK(phys.count(c), "action %s on unknown chunk", actionName(a.kind));
        const uintptr_t hi = std::min<uintptr_t>(c + kChunkBytes, a.addr + a.size);
        if (a.kind == Action::DiscardAndPrefetch || a.kind == Action::PlaceOnHost) {
          // Never discard pages whose eviction may still be in flight.
          CHECK(call_fence[k] >= evicted_by[c], "%s not fenced after eviction batch %llu",
                actionName(a.kind), (unsigned long long)evicted_by[c]);
        }
        if (a.kind == Action::EvictToHost || a.kind == Action::Discard) {
          // An evictor job, after every earlier one of the chunk (FIFO).
          CHECK(a.fence > evicted_by[c], "%s without a new batch number",
                actionName(a.kind));
          evicted_by[c] = a.fence;
        }
        if (a.kind == Action::EvictToHost || a.kind == Action::Discard ||
            a.kind == Action::DiscardAndPrefetch || a.kind == Action::PrefetchToDevice) {
          // With ReadMostly left set, an eviction keeps the GPU copy and a
          // discard leaves advice behind on reused memory.
          CHECK(!read_mostly.count(c), "%s of a chunk with ReadMostly set",
                actionName(a.kind));
        }
        switch (a.kind) {
          case Action::Discard:
            CHECK(!overlapsLive(c, hi, 0, true), "discard of a live chunk");
            phys[c] = Phys::None;
            break;
          case Action::DiscardAndPrefetch:
          case Action::PlaceOnHost:
            CHECK(!overlapsLive(c, hi, allocating, true),
                  "%s over another live block", actionName(a.kind));
            phys[c] = a.kind == Action::PlaceOnHost ? Phys::Host : Phys::Device;
            break;
          case Action::PrefetchToDevice:
          case Action::PlaceOnDevice:
            phys[c] = Phys::Device;
            break;
          case Action::MapHost:
            // The executor makes these pages by writing them: only pages
            // nothing was ever written to (a fresh segment's) may get it.
            CHECK(phys[c] == Phys::None, "MapHost over pages that hold data");
            phys[c] = Phys::Host;
            break;
          case Action::EvictToHost:
            phys[c] = Phys::Host;
            break;
          case Action::AdviseHost:
            break;
          case Action::DuplicateToDevice:
            // A copy of valid host pages; a live chunk only.
            CHECK(phys[c] == Phys::Host, "duplicate of a chunk not in host RAM");
            CHECK(overlapsLive(c, hi, 0), "duplicate of a dead chunk");
            read_mostly.insert(c);
            phys[c] = Phys::Device;
            break;
          case Action::DropDuplicate:
            CHECK(read_mostly.count(c), "drop of a chunk without ReadMostly");
            read_mostly.erase(c);
            phys[c] = Phys::Host; // the host copy stays valid
            break;
        }
      }
    }
    return true;
  }

  uint64_t deviceBytes() const {
    uint64_t n = 0;
    for (const auto& [c, p] : phys) {
      n += p == Phys::Device ? csize.at(c) : 0;
    }
    return n;
  }

  bool invariants(const char* step) {
    std::string bad = r.checkInvariants();
    CHECK(bad.empty(), "%s: ledger: %s", step, bad.c_str());
    if (lim.can_act) {
      CHECK(deviceBytes() <= lim.budget, "%s: %llu bytes on the device, budget %llu",
            step, (unsigned long long)deviceBytes(), (unsigned long long)lim.budget);
      CHECK(r.bytesOn(0, Where::Device) + r.bytesOn(0, Where::Unplaced) <= lim.budget,
            "%s: ledger over budget", step);
    }
    for (const auto& [c, p] : phys) {
      Where w = r.whereIs(c);
      if (w == Where::Device) {
        CHECK(p == Phys::Device, "%s: ledger says device, pages are not", step);
      } else if (w == Where::Host) {
        CHECK(p != Phys::Device, "%s: ledger says host, pages on device", step);
      }
    }
    return true;
  }

  // adopted: host memory that already holds data (torch.cuda.um.move_).
  bool addSegment(uintptr_t base, uint64_t size, bool adopted = false) {
    std::vector<Action> out;
    for (uintptr_t c = base; c < base + size; c += kChunkBytes) {
      phys[c] = adopted ? Phys::Host : Phys::None;
      csize[c] = std::min<uint64_t>(kChunkBytes, base + size - c);
    }
    segs[base] = size;
    r.addSegment(base, size, 0, stream, true, adopted, policy, lim, out);
    return apply(out, 0) && invariants("addSegment");
  }

  // The segment is freed behind the engine's back: its pages are gone, the
  // ledger is not told.
  void forget(uintptr_t base) {
    for (uintptr_t c = base; c < base + segs[base]; c += kChunkBytes) {
      phys.erase(c);
      csize.erase(c);
    }
    segs.erase(base);
  }

  bool removeSegment(uintptr_t base) {
    auto info = r.removeSegment(base);
    CHECK(info && info->size == segs[base], "segment unknown or of another size");
    for (uintptr_t c = base; c < base + segs[base]; c += kChunkBytes) {
      phys.erase(c);
      csize.erase(c);
    }
    segs.erase(base);
    return invariants("removeSegment");
  }

  // `pool`: the block is a private pool's (Note [Graph pools: a free is not
  // a death]).
  bool alloc(uintptr_t addr, uint64_t size, bool pool = false) {
    std::vector<Action> out;
    bool was_dead = false, forgotten_there = false;
    for (uintptr_t c = addr - (addr % kChunkBytes); c < addr + size; c += kChunkBytes) {
      was_dead = was_dead || r.liveBytesAt(c) == 0;
      for (uintptr_t f : forgotten) {
        forgotten_there = forgotten_there || (f < c + kChunkBytes && c < f + live.at(f));
      }
    }
    const bool revived = r.onAlloc(addr, size, stream, policy, lim, out, pool);
    // A pending discard of a dead chunk (decided by another thread) must be
    // queued before the block's first kernel: the engine waits when told.
    // A chunk whose content was forgotten may have one pending as well.
    CHECK(revived == was_dead || (revived && forgotten_there),
          "onAlloc did not report reviving a dead chunk");
    if (!apply(out, addr)) {
      return false;
    }
    live[addr] = size;
    // The block's first use: every chunk under it has pages.
    for (uintptr_t c = addr - (addr % kChunkBytes); c < addr + size; c += kChunkBytes) {
      CHECK(phys.at(c) != Phys::None || !lim.can_act,
            "a discarded chunk reached its next use without pages");
    }
    return invariants("alloc");
  }

  bool free(uintptr_t addr) {
    r.onFree(addr, live.at(addr));
    live.erase(addr);
    forgotten.erase(addr);
    return invariants("free");
  }

  // Note [Forgotten content]: the block's owner overwrites it before any
  // read, which comes after its next touch.
  uint64_t forgetContent(uintptr_t addr) {
    forgotten.insert(addr);
    const uint64_t marked = r.forget(addr, live.at(addr));
    return invariants("forget") ? marked : ~0ull;
  }

  // A graph pool's block the allocator takes back while a replay's output
  // still lives there: its data stays live.
  bool freeReplayed(uintptr_t addr) {
    r.onFree(addr, live.at(addr), /*replayed=*/true);
    return invariants("freeReplayed");
  }

  // A pool checkpoint restored (setCheckpointPoolState): the live block is
  // freed and handed out again in one call, its data in use throughout.
  bool restore(uintptr_t addr) {
    const uint64_t size = live.at(addr);
    std::vector<Action> out;
    r.onFree(addr, size, /*replayed=*/true);
    r.onAlloc(addr, size, stream, policy, lim, out, /*replayed=*/true);
    // No block is new here: a discard over this one is a discard of live data.
    return apply(out, 0) && invariants("restore");
  }

  bool touch(uintptr_t addr, bool read_only = false, bool hold = false) {
    std::vector<Action> out;
    r.touch(addr, live.at(addr), 0, stream, policy, lim, out, read_only, hold);
    if (!apply(out, 0)) {
      return false;
    }
    // A forgotten block's touch is its owner's write coming: every chunk
    // under it has pages again.
    if (forgotten.erase(addr) && lim.can_act) {
      for (uintptr_t c = addr - (addr % kChunkBytes); c < addr + live.at(addr); c += kChunkBytes) {
        CHECK(phys.at(c) != Phys::None, "a forgotten chunk was touched without pages");
      }
    }
    for (uintptr_t c : read_mostly) {
      CHECK(r.whereIs(c) == Where::Device, "ReadMostly set on a chunk off the device");
    }
    return invariants("touch");
  }

  // Note [The learned eviction order]: the block is next used at `due`.
  bool plan(uintptr_t addr, uint64_t due) {
    r.plan(addr, live.at(addr), due);
    return invariants("plan");
  }
};

// Blocks are carved from segments at 512-byte granularity, like the caching
// allocator's, so that chunks are shared between blocks.
struct Carver {
  std::mt19937_64 rng;
  explicit Carver(uint64_t seed) : rng(seed) {}
  uint64_t size(uint64_t max) {
    std::uniform_int_distribution<uint64_t> d(1, max / 512);
    return d(rng) * 512;
  }
};

bool randomTrace(uint64_t seed) {
  Sim s;
  Carver rnd(seed);
  s.lim.budget = (8 + seed % 24) * kChunkBytes;
  s.lim.discard = seed % 3 != 0;
  const uintptr_t base0 = 1ull << 32;
  std::vector<std::pair<uintptr_t, uint64_t>> segments;
  for (int i = 0; i < 4; ++i) {
    uint64_t size = (4 + rnd.rng() % 20) * kChunkBytes - (i == 3 ? 4096 : 0);
    uintptr_t base = base0 + i * (64ull << 20);
    segments.push_back({base, size});
    s.stream = reinterpret_cast<void*>(0x10 + i % 2); // two streams' segments
    if (!s.addSegment(base, size, /*adopted=*/i == 1 && seed % 2 == 0)) return false;
  }
  // A segment's blocks: a sorted set of non-overlapping live ranges.
  for (int step = 0; step < 4000; ++step) {
    int op = rnd.rng() % 10;
    s.lim.can_act = rnd.rng() % 25 != 0; // now and then a capture
    if (op < 4) {
      auto [base, size] = segments[rnd.rng() % segments.size()];
      uint64_t n = rnd.size(std::min<uint64_t>(size, 6 * kChunkBytes));
      uint64_t off = (rnd.rng() % ((size - n) / 512 + 1)) * 512;
      uintptr_t a = base + off;
      if (s.overlapsLive(a, a + n, 0)) continue;
      if (!s.alloc(a, n)) return false;
    } else if (op < 7 && !s.live.empty()) {
      auto it = s.live.begin();
      std::advance(it, rnd.rng() % s.live.size());
      if (!s.free(it->first)) return false;
    } else if (!s.live.empty()) {
      auto it = s.live.begin();
      std::advance(it, rnd.rng() % s.live.size());
      if (rnd.rng() % 4 == 0) {
        if (s.forgetContent(it->first) == ~0ull) return false;
      } else if (!s.touch(it->first, rnd.rng() % 3 == 0)) {
        return false;
      } else if (seed % 2 == 1 && rnd.rng() % 2 == 0) {
        // Note [The learned eviction order]: a prediction, overdue, inside
        // the window or past it, or none; and now and then a new clock.
        const uint64_t now = static_cast<uint64_t>(step) * 4;
        if (rnd.rng() % 8 == 0) {
          s.r.setPlanClock(0, PlanClock{now, now + rnd.rng() % 64});
        }
        const uint64_t due = rnd.rng() % 5 == 0 ? 0 : now - 32 + rnd.rng() % 200;
        if (!s.plan(it->first, due)) return false;
      }
    }
  }
  return true;
}

// Note [Orders built on demand]: a ledger whose eviction orders are built at
// its first makeRoom decides, step by step, as one that kept them from the
// start. Two segments fit under the budget while blocks come and go; then
// three more make it choose victims.
bool ordersBuiltLateDecideAlike(uint64_t seed) {
  Sim late, kept;
  Carver rnd(seed);
  late.lim.budget = kept.lim.budget = 40 * kChunkBytes;
  late.lim.discard = kept.lim.discard = seed % 3 != 0;
  const uintptr_t base0 = 1ull << 32;
  std::vector<std::pair<uintptr_t, uint64_t>> segments;
  auto addSegment = [&](int i) {
    const uint64_t size = (8 + rnd.rng() % 9) * kChunkBytes - (i == 4 ? 4096 : 0);
    const uintptr_t base = base0 + i * (64ull << 20);
    segments.push_back({base, size});
    return late.addSegment(base, size) && kept.addSegment(base, size);
  };
  for (int i = 0; i < 2; ++i) {
    if (!addSegment(i)) return false;
  }
  kept.r.ensureOrdered(0);
  auto same = [](const std::vector<Action>& a, const std::vector<Action>& b) {
    if (a.size() != b.size()) return false;
    for (size_t k = 0; k < a.size(); ++k) {
      if (a[k].kind != b[k].kind || a[k].addr != b[k].addr || a[k].size != b[k].size ||
          a[k].device != b[k].device || a[k].stream != b[k].stream ||
          a[k].segment != b[k].segment || a[k].fence != b[k].fence) {
        return false;
      }
    }
    return true;
  };
  uint64_t chose = 0; // steps whose actions included an eviction or a discard
  for (int step = 0; step < 3000; ++step) {
    if (step == 1000) {
      CHECK(!late.r.ordered(0), "seed %llu: orders built before anything needed room",
            (unsigned long long)seed);
      for (int i = 2; i < 5; ++i) {
        if (!addSegment(i)) return false;
      }
    }
    const int op = rnd.rng() % 10;
    if (op < 4) {
      auto [base, size] = segments[rnd.rng() % segments.size()];
      const uint64_t n = rnd.size(std::min<uint64_t>(size, 6 * kChunkBytes));
      const uintptr_t a = base + (rnd.rng() % ((size - n) / 512 + 1)) * 512;
      if (late.overlapsLive(a, a + n, 0)) continue;
      if (!late.alloc(a, n) || !kept.alloc(a, n)) return false;
    } else if (op < 7 && !late.live.empty()) {
      auto it = late.live.begin();
      std::advance(it, rnd.rng() % late.live.size());
      const uintptr_t a = it->first;
      if (!late.free(a) || !kept.free(a)) return false;
    } else if (!late.live.empty()) {
      auto it = late.live.begin();
      std::advance(it, rnd.rng() % late.live.size());
      const uintptr_t a = it->first;
      const bool read_only = rnd.rng() % 3 == 0;
      if (!late.touch(a, read_only) || !kept.touch(a, read_only)) return false;
    }
    CHECK(same(late.last, kept.last), "seed %llu, step %d: the decisions differ",
          (unsigned long long)seed, step);
    for (const Action& x : late.last) {
      chose += x.kind == Action::EvictToHost || x.kind == Action::Discard;
    }
  }
  CHECK(chose > 0, "seed %llu: no victim was ever chosen: the test compares nothing",
        (unsigned long long)seed);
  CHECK(late.r.ordered(0), "seed %llu: victims chosen with no order built",
        (unsigned long long)seed);
  return true;
}

// A training loop: persistent parameters and optimizer state, activations
// allocated in forward order and freed in reverse in backward, gradients.
struct Loop {
  uint64_t layers;
  uint64_t act;
  uint64_t param;
};

bool trainingLoop(Sim& s, const std::vector<Loop>& phases, int iters,
                  std::vector<uint64_t>* per_iter_evicted) {
  auto segment = [&](uint64_t n) {
    uintptr_t a = s.next_base;
    s.next_base += (n + kChunkBytes - 1) / kChunkBytes * kChunkBytes + (64ull << 20);
    return a;
  };
  // Persistent: params in one segment (one block each), state likewise.
  const Loop& p0 = phases[0];
  uintptr_t params = segment(p0.layers * p0.param);
  if (!s.addSegment(params, p0.layers * p0.param)) return false;
  for (uint64_t l = 0; l < p0.layers; ++l) {
    if (!s.alloc(params + l * p0.param, p0.param)) return false;
  }
  uintptr_t state = segment(2 * p0.layers * p0.param);
  if (!s.addSegment(state, 2 * p0.layers * p0.param)) return false;
  for (uint64_t l = 0; l < 2 * p0.layers; ++l) {
    if (!s.alloc(state + l * p0.param, p0.param)) return false;
  }
  // The activation pool: the caching allocator reuses its segments.
  uint64_t pool_size = 0;
  for (const Loop& p : phases) pool_size = std::max(pool_size, p.layers * p.act + p.layers * p.param);
  uintptr_t pool = segment(pool_size);
  if (!s.addSegment(pool, pool_size)) return false;
  for (int it = 0; it < iters; ++it) {
    const Loop& p = phases[std::min<size_t>(phases.size() - 1, it * phases.size() / iters)];
    uint64_t before = s.r.counters().evict_bytes;
    for (uint64_t l = 0; l < p.layers; ++l) {
      if (!s.touch(params + (l % p0.layers) * p0.param)) return false;
      if (!s.alloc(pool + l * p.act, p.act)) return false;
    }
    for (uint64_t l = p.layers; l-- > 0;) {
      if (!s.touch(pool + l * p.act)) return false;
      uintptr_t g = pool + p.layers * p.act + l * p.param;
      if (!s.alloc(g, p.param)) return false;
      if (!s.free(pool + l * p.act)) return false;
    }
    for (uint64_t l = 0; l < p.layers; ++l) {
      if (!s.free(pool + p.layers * p.act + l * p.param)) return false;
    }
    if (per_iter_evicted) per_iter_evicted->push_back(s.r.counters().evict_bytes - before);
  }
  return true;
}

bool repeatedLoopUnderBudget() {
  Sim s;
  s.lim.budget = 40 * kChunkBytes;
  std::vector<uint64_t> evicted;
  if (!trainingLoop(s, {{8, 3 * kChunkBytes, kChunkBytes + 4096}}, 20, &evicted)) return false;
  CHECK(s.r.counters().discard_bytes > 0, "no dead chunk was discarded");
  CHECK(s.r.counters().reuse_bytes > 0, "no reused block was discarded-and-prefetched");
  // Steady state: every iteration moves the same bytes (no drift, no leak).
  CHECK(evicted[10] == evicted[19], "evictions drift: %llu vs %llu",
        (unsigned long long)evicted[10], (unsigned long long)evicted[19]);
  return true;
}

// Three training patterns one after the other, under a budget of 32 chunks.
bool changingLoop(Sim& s) {
  s.lim.budget = 32 * kChunkBytes;
  return trainingLoop(
      s, {{8, 3 * kChunkBytes, kChunkBytes}, {12, kChunkBytes + 512, kChunkBytes}, {5, 5 * kChunkBytes, kChunkBytes}},
      30, nullptr);
}

bool changingPattern() {
  Sim s;
  return changingLoop(s);
}

bool fitsIssuesNothing() {
  Sim s;
  s.lim.budget = 1024 * kChunkBytes;
  if (!trainingLoop(s, {{8, 3 * kChunkBytes, kChunkBytes}}, 2, nullptr)) return false;
  uint64_t before = s.actions;
  if (!trainingLoop(s, {{8, 3 * kChunkBytes, kChunkBytes}}, 10, nullptr)) return false;
  // Only the new segments' placement (advice + prefetch) may appear.
  CHECK(s.actions - before <= 6, "%llu actions in a loop that fits",
        (unsigned long long)(s.actions - before));
  CHECK(s.r.counters().evict_bytes == 0 && s.r.counters().discard_bytes == 0,
        "evictions although everything fits");
  // Note [Orders built on demand]: nothing needed room, so no order was kept.
  CHECK(!s.r.ordered(0), "eviction orders built in a loop that fits");
  return true;
}

// A segment whose free never reached the engine leaves a stale entry; a new
// segment over any part of its addresses replaces it, and the ledger (the
// eviction order included) stays whole.
bool staleSegmentIsReplaced() {
  Sim s;
  s.lim.budget = 6 * kChunkBytes;
  const uintptr_t a = 1ull << 32;
  if (!s.addSegment(a, 4 * kChunkBytes)) return false;
  if (!s.alloc(a, 4 * kChunkBytes)) return false;
  s.forget(a);
  // Starts inside the stale segment and needs the whole budget.
  if (!s.addSegment(a + 2 * kChunkBytes, 6 * kChunkBytes)) return false;
  CHECK(s.r.deviceOf(a) == -1, "the stale segment is still in the ledger");
  CHECK(s.r.bytesOn(0, Where::Device) == 6 * kChunkBytes, "the new segment is not placed");
  if (!s.alloc(a + 2 * kChunkBytes, 6 * kChunkBytes)) return false;
  return true;
}

// Note [Finding a segment]: segments at bases and sizes that are not 2 MiB
// multiples share 2 MiB of address space with their neighbours; every address
// must still resolve to the segment it lies in, through any order of adds and
// removals, as a search of all segments would.
bool everyAddressFindsItsSegment() {
  std::mt19937_64 rng(42);
  Residency r;
  DeviceLimits lim;
  lim.budget = 1ull << 40;
  lim.can_act = false; // placement is not what is checked here
  std::vector<Action> out;
  struct Seg {
    uintptr_t base;
    uint64_t size;
    int device;
  };
  std::vector<Seg> segs;
  const uintptr_t origin = 1ull << 36;
  uintptr_t next = origin;
  int checked = 0;
  for (int round = 0; round < 400; ++round) {
    if (segs.empty() || rng() % 3 != 0) {
      // 512-byte aligned, as cudaMalloc's are; often sharing a chunk with the last.
      next += (rng() % 3 == 0) ? (rng() % 4096) * 512 : 0;
      const uint64_t size = (1 + rng() % (6 * 4096)) * 512;
      const int device = static_cast<int>(rng() % 4);
      r.addSegment(next, size, device, reinterpret_cast<void*>(0x5), true, false,
                   Policy::Lru, lim, out);
      segs.push_back({next, size, device});
      next += size;
    } else {
      const size_t i = rng() % segs.size();
      CHECK(r.removeSegment(segs[i].base).has_value(), "segment %zu not found to remove", i);
      segs.erase(segs.begin() + static_cast<std::ptrdiff_t>(i));
    }
    for (int k = 0; k < 64; ++k) {
      const uintptr_t addr = origin + rng() % (next - origin + (4u << 20));
      int want = -1;
      for (const Seg& s : segs) {
        if (addr >= s.base && addr < s.base + s.size) {
          want = s.device;
        }
      }
      CHECK(r.deviceOf(addr) == want, "address +%llu: device %d, want %d (round %d)",
            (unsigned long long)(addr - origin), r.deviceOf(addr), want, round);
      ++checked;
    }
  }
  CHECK(checked == 400 * 64, "%d addresses checked", checked);
  return true;
}

bool captureDoesNothing() {
  Sim s;
  s.lim.budget = 4 * kChunkBytes;
  if (!s.addSegment(1ull << 32, 8 * kChunkBytes)) return false;
  s.lim.can_act = false;
  if (!s.addSegment(1ull << 33, 8 * kChunkBytes)) return false;
  if (!s.alloc((1ull << 32) + 6 * kChunkBytes, kChunkBytes)) return false;
  if (!s.alloc(1ull << 33, 3 * kChunkBytes)) return false;
  CHECK(s.r.bytesOn(0, Where::Unplaced) == 8 * kChunkBytes, "capture segment not unplaced");
  return true;
}

bool staticPolicy() {
  Sim s;
  s.policy = Policy::Static;
  s.lim.budget = 10 * kChunkBytes;
  if (!s.addSegment(1ull << 32, 8 * kChunkBytes)) return false;
  if (!s.addSegment(1ull << 33, 8 * kChunkBytes)) return false;
  CHECK(s.r.whereIs(1ull << 33) == Where::Host, "static: second segment not in host RAM");
  uint64_t before = s.actions;
  if (!s.alloc(1ull << 33, 8 * kChunkBytes)) return false;
  if (!s.free(1ull << 33)) return false;
  CHECK(s.actions == before, "static policy acted on block events");
  return true;
}

bool oversizedSegmentIsSplit() {
  Sim s;
  s.lim.budget = 8 * kChunkBytes;
  // Larger than the budget: its first part on the device, the rest in host
  // RAM, and nothing else is pushed out beyond what the budget needs.
  if (!s.addSegment(1ull << 32, 20 * kChunkBytes)) return false;
  CHECK(s.r.bytesOn(0, Where::Device) == 8 * kChunkBytes, "device part is not the budget");
  CHECK(s.r.bytesOn(0, Where::Host) == 12 * kChunkBytes, "host part is not the rest");
  CHECK(s.r.whereIs(1ull << 32) == Where::Device, "first chunk not on the device");
  return true;
}

// A range adopted by move_ (managed host memory that holds data) larger than
// the budget: split like a fresh one, but its host part is only advised; no
// MapHost, whose pages are made by writing them (the Sim fails on that).
bool adoptedSegmentKeepsItsData() {
  for (Policy policy : {Policy::Lru, Policy::Static}) {
    Sim s;
    s.policy = policy;
    s.lim.budget = 8 * kChunkBytes;
    const uintptr_t base = 1ull << 32;
    if (!s.addSegment(base, 6 * kChunkBytes)) return false; // fresh, on the device
    const uintptr_t adopted = base + (1ull << 30);
    const uintptr_t end = adopted + 20 * kChunkBytes;
    if (!s.addSegment(adopted, 20 * kChunkBytes, /*adopted=*/true)) return false;
    bool advised = false;
    for (const Action& a : s.last) {
      CHECK(a.kind != Action::MapHost, "MapHost on an adopted range");
      advised |= a.kind == Action::AdviseHost && a.addr + a.size == end;
    }
    CHECK(advised, "the adopted range's host part was not advised");
    CHECK(s.r.bytesOn(0, Where::Host) >= 12 * kChunkBytes, "host part smaller than the rest");
  }
  return true;
}

// evicted_unused_bytes counts live chunks that were evicted and then died in
// host RAM, and not those a use brought back first.
bool evictedUnusedIsCounted() {
  Sim s;
  s.lim.budget = 4 * kChunkBytes;
  const uintptr_t a = 1ull << 32, b = 1ull << 33;
  if (!s.addSegment(a, 4 * kChunkBytes)) return false;
  if (!s.alloc(a, 2 * kChunkBytes)) return false;
  if (!s.alloc(a + 2 * kChunkBytes, 2 * kChunkBytes)) return false;
  if (!s.addSegment(b, 4 * kChunkBytes)) return false;
  if (!s.alloc(b, 4 * kChunkBytes)) return false;  // evicts all of a (live)
  CHECK(s.r.counters().evict_bytes == 4 * kChunkBytes, "a was not evicted");
  if (!s.touch(a)) return false;  // a's first block comes back: not unused
  if (!s.free(a)) return false;
  if (!s.free(a + 2 * kChunkBytes)) return false;  // died in host RAM: unused
  CHECK(s.r.counters().evicted_unused_bytes == 2 * kChunkBytes,
        "evicted_unused_bytes %llu, expected two chunks",
        (unsigned long long)s.r.counters().evicted_unused_bytes);
  return true;
}

// Note [First evictions]: an eviction counts as first when the chunk's pages
// were never in host RAM, or were discarded since; a chunk evicted before
// does not count again.
bool firstEvictionsAreCounted() {
  Sim s;
  s.lim.budget = 4 * kChunkBytes;
  const uintptr_t a = 1ull << 32, b = 1ull << 33;
  const uint64_t four = 4 * kChunkBytes;
  auto counts = [&](uint64_t evicted, uint64_t first, const char* when) {
    CHECK(s.r.counters().evict_bytes == evicted && s.r.counters().evict_first_bytes == first,
          "%s: evicted %llu, first %llu; want %llu, %llu", when,
          (unsigned long long)s.r.counters().evict_bytes,
          (unsigned long long)s.r.counters().evict_first_bytes, (unsigned long long)evicted,
          (unsigned long long)first);
    return true;
  };
  if (!s.addSegment(a, four) || !s.alloc(a, four)) return false;
  if (!s.addSegment(b, four) || !s.alloc(b, four)) return false; // a leaves: first
  if (!counts(four, four, "a evicted")) return false;
  if (!s.touch(a)) return false; // b leaves: first
  if (!counts(2 * four, 2 * four, "b evicted")) return false;
  if (!s.touch(b)) return false; // a leaves again: its pages were in host RAM
  if (!counts(3 * four, 2 * four, "a evicted again")) return false;
  if (!s.free(b)) return false;
  if (!s.touch(a)) return false; // b is dead: discarded, its pages dropped
  if (!counts(3 * four, 2 * four, "b discarded")) return false;
  if (!s.alloc(b, four)) return false; // a leaves again
  if (!counts(4 * four, 2 * four, "a evicted a third time")) return false;
  if (!s.touch(a)) return false; // b leaves: first again, after its discard
  if (!counts(5 * four, 3 * four, "b evicted after its discard")) return false;
  return true;
}

// Note [First evictions]: with warm_first, of the planned chunks due after the
// window, one whose pages were in host RAM leaves before a farther one whose
// pages never were; without it the farthest leaves, whatever its pages.
bool warmVictimsLeaveFirst() {
  for (const bool warm_first : {false, true}) {
    Sim s;
    s.lim.budget = 4 * kChunkBytes;
    s.lim.warm_first = warm_first;
    const uintptr_t base = s.next_base;
    if (!s.addSegment(base, 8 * kChunkBytes)) return false;
    const uintptr_t w = base, c1 = base + kChunkBytes, c2 = base + 2 * kChunkBytes,
                    c3 = base + 3 * kChunkBytes, x = base + 4 * kChunkBytes;
    for (uintptr_t r : {w, c1, c2, c3, x}) { // x evicts w, the least recently touched
      if (!s.alloc(r, kChunkBytes) || !s.touch(r)) return false;
    }
    if (!s.touch(w)) return false; // w comes back, c1 leaves
    CHECK(s.r.whereIs(c1) == Where::Host && s.r.whereIs(w) == Where::Device, "setup");
    s.r.setPlanClock(0, PlanClock{100, 100});
    if (!s.plan(w, 300) || !s.plan(c2, 400) || !s.plan(c3, 200) || !s.plan(x, 150)) {
      return false;
    }
    const uint64_t first = s.r.counters().evict_first_bytes;
    if (!s.touch(c1)) return false; // room for c1: w (warm, 300) or c2 (cold, 400)
    const uintptr_t gone = warm_first ? w : c2, kept = warm_first ? c2 : w;
    CHECK(s.r.whereIs(gone) == Where::Host && s.r.whereIs(kept) == Where::Device,
          "warm_first %d: the wrong chunk left", warm_first ? 1 : 0);
    CHECK((s.r.counters().evict_first_bytes == first) == warm_first,
          "warm_first %d: first evictions %llu -> %llu", warm_first ? 1 : 0,
          (unsigned long long)first, (unsigned long long)s.r.counters().evict_first_bytes);
  }
  return true;
}

// Note [Victims leave as runs]: a planned block due after the window leaves
// farthest first, its chunks from the highest address down, and they go as
// one range, not a range a chunk; with warm_first too.
bool plannedVictimsLeaveAsOneRange() {
  for (const bool warm_first : {false, true}) {
    Sim s;
    s.lim.budget = 8 * kChunkBytes;
    s.lim.warm_first = warm_first;
    const uintptr_t base = s.next_base, other = base + (1ull << 30);
    if (!s.addSegment(base, 8 * kChunkBytes)) return false;
    const uintptr_t a = base, b = base + 4 * kChunkBytes;
    if (!s.alloc(a, 4 * kChunkBytes) || !s.alloc(b, 4 * kChunkBytes)) return false;
    if (!s.touch(a) || !s.touch(b)) return false;
    s.r.setPlanClock(0, PlanClock{100, 100});
    if (!s.plan(a, 400) || !s.plan(b, 200)) return false;
    if (!s.addSegment(other, 4 * kChunkBytes)) return false; // room: a, the farthest
    int ranges = 0;
    for (const Action& x : s.last) {
      if (x.kind == Action::EvictToHost) {
        ++ranges;
        CHECK(x.addr == a && x.size == 4 * kChunkBytes,
              "warm_first %d: evicted [%llx, +%llu), want a's four chunks", warm_first ? 1 : 0,
              (unsigned long long)x.addr, (unsigned long long)x.size);
      }
    }
    CHECK(ranges == 1, "warm_first %d: a left in %d ranges, want 1", warm_first ? 1 : 0, ranges);
    CHECK(s.r.whereIs(b) == Where::Device, "b left too");
  }
  return true;
}

// Note [The step's gradients are touched] (torch/cuda/_um_optim.py): a block
// allocated once and used every step by kernels alone (DDP's gradient
// buckets) gets no event after its allocation. The least recently used live
// data when a forward needs room, it leaves the device and nothing brings it
// back but a touch; with the optimizer step's touch it returns every step.
bool stepTouchBringsBackAnUntouchedBlock(bool step_touches) {
  Sim s;
  s.lim.budget = 10 * kChunkBytes;
  const uintptr_t bucket = 1ull << 32, params = 1ull << 33, pool = 1ull << 34;
  if (!s.addSegment(bucket, 3 * kChunkBytes)) return false;
  if (!s.alloc(bucket, 3 * kChunkBytes)) return false;
  if (!s.addSegment(params, 2 * kChunkBytes)) return false;
  if (!s.alloc(params, 2 * kChunkBytes)) return false;
  if (!s.addSegment(pool, 6 * kChunkBytes)) return false;
  auto bucketOnDevice = [&] {
    for (uint64_t c = 0; c < 3; ++c) {
      if (s.r.whereIs(bucket + c * kChunkBytes) != Where::Device) return false;
    }
    return true;
  };
  for (int step = 0; step < 5; ++step) {
    if (!s.touch(params)) return false;  // the forward: parameters, then activations
    for (uint64_t l = 0; l < 6; ++l) {
      if (!s.alloc(pool + l * kChunkBytes, kChunkBytes)) return false;
    }
    for (uint64_t l = 6; l-- > 0;) {  // the backward reads them in reverse and frees them
      if (!s.touch(pool + l * kChunkBytes)) return false;
      if (!s.free(pool + l * kChunkBytes)) return false;
    }
    if (step_touches) {  // the step's pre-hook
      if (!s.touch(bucket)) return false;
      CHECK(bucketOnDevice(), "step %d: the touched bucket is not on the device", step);
    }
  }
  CHECK(s.r.counters().evict_bytes > 0, "the forward never made room: nothing was tested");
  if (!step_touches) {
    CHECK(!bucketOnDevice(), "an untouched bucket came back by itself");
  }
  return true;
}

// Note [Held ranges]: a workspace that kernels write at every step and no
// signal names. Held, its own chunks stay on the device through a training
// loop and a read-only scan that both need its room; the chunk it shares
// with a neighbour block is not held. Once freed, the hold is gone: its
// chunks are dead and leave first.
bool heldWorkspaceStays() {
  Sim s;
  s.lim.budget = 10 * kChunkBytes;
  const uintptr_t ws = 1ull << 32, params = 1ull << 33, pool = 1ull << 34;
  const uint64_t ws_bytes = 3 * kChunkBytes - 4096;
  if (!s.addSegment(ws, 3 * kChunkBytes)) return false;
  if (!s.alloc(ws, ws_bytes)) return false;
  if (!s.alloc(ws + ws_bytes, 4096)) return false; // the neighbour
  if (!s.addSegment(params, 2 * kChunkBytes)) return false;
  if (!s.alloc(params, 2 * kChunkBytes)) return false;
  if (!s.addSegment(pool, 6 * kChunkBytes)) return false;
  if (!s.touch(ws, false, /*hold=*/true)) return false;
  CHECK(s.r.counters().hold_bytes == 2 * kChunkBytes, "%llu bytes held, the workspace's own "
        "chunks are 2", (unsigned long long)s.r.counters().hold_bytes);
  auto held = [&] {
    return s.r.whereIs(ws) == Where::Device && s.r.whereIs(ws + kChunkBytes) == Where::Device;
  };
  // torch_um_where's reading: every byte of the range on the device, the two
  // chunks wholly its own held, the third (shared with the neighbour) not.
  auto on = [](const Residency::Placement& p, Where w) { return p.bytes[static_cast<int>(w)]; };
  const Residency::Placement p0 = s.r.placement(ws, ws_bytes);
  CHECK(on(p0, Where::Device) == ws_bytes && on(p0, Where::Host) == 0 &&
            p0.held == 2 * kChunkBytes,
        "placement: %llu on the device, %llu held", (unsigned long long)on(p0, Where::Device),
        (unsigned long long)p0.held);
  const Residency::Placement clipped = s.r.placement(ws + kChunkBytes, 100 * kChunkBytes);
  CHECK(on(clipped, Where::Device) == 2 * kChunkBytes, "placement: not clipped to the segment");
  const Residency::Placement outside = s.r.placement(1ull << 40, kChunkBytes);
  CHECK(on(outside, Where::Device) + on(outside, Where::Host) + on(outside, Where::Unplaced) +
                outside.held == 0,
        "placement: memory outside every segment counted");
  for (int step = 0; step < 4; ++step) {
    if (!s.touch(params, /*read_only=*/step % 2 == 1)) return false;
    for (uint64_t l = 0; l < 6; ++l) {
      if (!s.alloc(pool + l * kChunkBytes, kChunkBytes)) return false;
      CHECK(held(), "step %d: a held chunk left the device", step);
    }
    for (uint64_t l = 6; l-- > 0;) {
      if (!s.touch(pool + l * kChunkBytes)) return false;
      if (!s.free(pool + l * kChunkBytes)) return false;
      CHECK(held(), "step %d: a held chunk left the device", step);
    }
  }
  CHECK(s.r.counters().evict_bytes > 0, "nothing needed room: nothing was tested");
  if (!s.free(ws)) return false;
  const uintptr_t big = 1ull << 35;  // then a phase that needs the whole budget
  if (!s.addSegment(big, 10 * kChunkBytes)) return false;
  if (!s.alloc(big, 10 * kChunkBytes)) return false;
  CHECK(s.r.whereIs(ws) == Where::Host, "a freed workspace stayed held");
  const Residency::Placement gone = s.r.placement(ws, 2 * kChunkBytes);
  CHECK(on(gone, Where::Host) == 2 * kChunkBytes && gone.held == 0,
        "placement after the workspace left: %llu in host RAM, %llu held",
        (unsigned long long)on(gone, Where::Host), (unsigned long long)gone.held);
  return true;
}

// Note [Forgotten content] and Note [DDP's buckets between steps]
// (torch/cuda/_um_ddp.py): DDP's bucket, forgotten at each forward's start,
// leaves by discard when the forward needs room and comes back by
// discard-and-prefetch at the backward's touch, never by a copy either way.
// Its last chunk shares bytes with a small live block of another owner: that
// chunk is never forgotten, so its bytes are evicted and brought back as
// live data, and the sim's content check fails if they are discarded.
bool forgottenBucketLeavesWithoutACopy(bool forget) {
  Sim s;
  s.lim.budget = 10 * kChunkBytes;
  const uintptr_t bucket = 1ull << 32, params = 1ull << 33, pool = 1ull << 34;
  const uint64_t bucket_bytes = 3 * kChunkBytes - 4096;
  if (!s.addSegment(bucket, 3 * kChunkBytes)) return false;
  if (!s.alloc(bucket, bucket_bytes)) return false;
  if (!s.alloc(bucket + bucket_bytes, 4096)) return false; // the neighbour
  if (!s.addSegment(params, 2 * kChunkBytes)) return false;
  if (!s.alloc(params, 2 * kChunkBytes)) return false;
  if (!s.addSegment(pool, 6 * kChunkBytes)) return false;
  uint64_t bucket_evicted = 0, bucket_discarded = 0;
  auto count = [&] {
    for (const Action& a : s.last) {
      if (a.addr < bucket + 2 * kChunkBytes && bucket < a.addr + a.size) {
        const uint64_t n = std::min<uintptr_t>(a.addr + a.size, bucket + 2 * kChunkBytes) -
            std::max<uintptr_t>(a.addr, bucket);
        bucket_evicted += a.kind == Action::EvictToHost ? n : 0;
        bucket_discarded += a.kind == Action::Discard ? n : 0;
      }
    }
  };
  for (int step = 0; step < 5; ++step) {
    if (forget) {
      const uint64_t marked = s.forgetContent(bucket);
      CHECK(marked == 2 * kChunkBytes, "step %d: %llu bytes forgotten, the bucket's own "
            "chunks are 2", step, (unsigned long long)marked);
    }
    if (!s.touch(params)) return false;
    for (uint64_t l = 0; l < 6; ++l) {
      if (!s.alloc(pool + l * kChunkBytes, kChunkBytes)) return false;
      count();
    }
    for (uint64_t l = 6; l-- > 0;) {
      if (!s.touch(pool + l * kChunkBytes)) return false;
      count();
      if (l == 3) {  // the backward reaches the bucket's parameters
        if (!s.touch(bucket)) return false;
        count();
      }
      if (!s.free(pool + l * kChunkBytes)) return false;
    }
    if (!s.touch(bucket)) return false;  // the step
    count();
    if (!s.touch(bucket + bucket_bytes)) return false;
    count();
  }
  if (forget) {
    CHECK(bucket_evicted == 0, "%llu bytes of the forgotten bucket were evicted",
          (unsigned long long)bucket_evicted);
    CHECK(bucket_discarded > 0, "the forward never took the bucket's room: nothing was tested");
    CHECK(s.r.liveBytesAt(bucket) == kChunkBytes, "forgetting changed the live count");
  } else {
    CHECK(bucket_evicted > 0, "the bucket was never evicted: nothing to compare with");
  }
  CHECK(s.r.whereIs(bucket) == Where::Device, "the bucket is not back for the step");
  return true;
}

// Inference past the budget: weights read layer by layer, forward after
// forward. Read-only touches bring them back as duplicates and they leave by
// dropping the duplicate; nothing is written back.
bool inferenceReadOnly() {
  Sim s;
  s.lim.budget = 24 * kChunkBytes;
  const uint64_t layers = 16, param = 3 * kChunkBytes;
  const uintptr_t w = s.next_base;
  if (!s.addSegment(w, layers * param)) return false;
  for (uint64_t l = 0; l < layers; ++l) {
    if (!s.alloc(w + l * param, param)) return false;
  }
  for (int fwd = 0; fwd < 4; ++fwd) {
    const ResidencyCounters before = s.r.counters();
    for (uint64_t l = 0; l < layers; ++l) {
      if (!s.touch(w + l * param, /*read_only=*/true)) return false;
    }
    const ResidencyCounters& after = s.r.counters();
    if (fwd > 0) {
      CHECK(after.duplicate_bytes - before.duplicate_bytes > 0, "no duplicate brought in");
      CHECK(after.prefetch_bytes == before.prefetch_bytes, "weights migrated, not duplicated");
      CHECK(after.drop_bytes - before.drop_bytes >= after.evict_bytes - before.evict_bytes,
            "an evicted weight chunk was not dropped first");
    }
  }
  // A write-capable touch, then an eviction: ReadMostly is gone before it.
  if (!s.touch(w, false)) return false;
  std::vector<Action> out;
  s.r.evict(w, layers * param, s.stream, s.lim, out);
  if (!s.apply(out, 0)) return false;
  CHECK(s.read_mostly.empty(), "ReadMostly left on chunks in host RAM");
  return s.invariants("evict");
}

// Note [Cancelled moves]: a bring-in calls off queued moves only for a range
// the queued jobs cover whole and the job being issued does not touch; the
// cut leaves the rest of each job's ranges.
bool cancelledMoveRanges() {
  const uintptr_t base = 1ull << 32;
  auto at = [&](uint64_t chunk) { return base + chunk * kChunkBytes; };
  std::vector<void*> ap{reinterpret_cast<void*>(at(0))}, bp{reinterpret_cast<void*>(at(4))},
      tp{reinterpret_cast<void*>(at(10))};
  std::vector<size_t> as{4 * kChunkBytes}, bs{2 * kChunkBytes}, ts{2 * kChunkBytes};
  const std::vector<JobRanges> queued{{&ap, &as}, {&bp, &bs}}, taken{{&tp, &ts}};
  CHECK(coveredWhole(queued, taken, at(2), at(5)), "a range covered by two jobs");
  CHECK(!coveredWhole(queued, taken, at(5), at(7)), "a range with a gap counted as covered");
  CHECK(!coveredWhole(queued, taken, at(3), at(3)), "an empty range counted as covered");
  std::vector<void*> cp{reinterpret_cast<void*>(at(10))};
  std::vector<size_t> cs{2 * kChunkBytes};
  const std::vector<JobRanges> also{{&cp, &cs}};
  CHECK(!coveredWhole(also, taken, at(10), at(11)), "a range of the job being issued");
  cutOut(queued[0], at(1), at(2));
  CHECK(ap.size() == 2 && ap[0] == reinterpret_cast<void*>(at(0)) && as[0] == kChunkBytes &&
            ap[1] == reinterpret_cast<void*>(at(2)) && as[1] == 2 * kChunkBytes,
        "the cut did not split the range around it");
  CHECK(!coveredWhole(queued, taken, at(0), at(3)), "a cut range still counted as covered");
  cutOut(queued[1], at(4), at(6));
  CHECK(bp.empty() && bs.empty(), "a range cut whole is still there");
  return true;
}

// Note [Scans]: a read-only scan larger than the budget, repeated, keeps a
// prefix on the device (the most recently read chunk leaves first), so each
// pass brings in about the part that does not fit, where LRU brings in all of
// it; and a live chunk untouched since before the scan leaves before any of
// the scan's chunks.
bool repeatedScanKeepsAPrefix() {
  Sim s;
  s.lim.read_copies = false; // the default: the scan is marked all the same
  s.lim.budget = 24 * kChunkBytes;
  const uint64_t layers = 16, param = 3 * kChunkBytes;
  const uintptr_t w = s.next_base, old = s.next_base + (1ull << 32);
  if (!s.addSegment(old, kChunkBytes)) return false;
  if (!s.alloc(old, kChunkBytes)) return false;
  if (!s.addSegment(w, layers * param)) return false;
  for (uint64_t l = 0; l < layers; ++l) {
    if (!s.alloc(w + l * param, param)) return false;
  }
  uint64_t last_pass = 0;
  for (int fwd = 0; fwd < 6; ++fwd) {
    const uint64_t before = s.r.counters().prefetch_bytes + s.r.counters().duplicate_bytes;
    for (uint64_t l = 0; l < layers; ++l) {
      if (!s.touch(w + l * param, /*read_only=*/true)) return false;
      if (fwd == 0 && l == layers - 1) {
        CHECK(s.r.whereIs(old) == Where::Host, "the cold live chunk outlived the scan's");
      }
    }
    last_pass = s.r.counters().prefetch_bytes + s.r.counters().duplicate_bytes - before;
  }
  const uint64_t over = layers * param - s.lim.budget;
  CHECK(last_pass <= over + 2 * param, "a pass brought in %llu chunks, %llu do not fit",
        (unsigned long long)(last_pass / kChunkBytes), (unsigned long long)(over / kChunkBytes));
  CHECK(s.r.whereIs(w) == Where::Device, "the scan's first chunk is not kept");
  // The runs in host RAM of a range that ends in neither place: every chunk in
  // them in host RAM, the chunk before each not, and their bytes the ledger's.
  {
    const auto runs = s.r.hostRuns(w, layers * param);
    uint64_t total = 0;
    for (const auto& run : runs) {
      CHECK(run.offset > 0 && s.r.whereIs(w + run.offset - 1) != Where::Host,
            "a host run that does not start where host RAM starts");
      for (uint64_t o = run.offset; o < run.offset + run.bytes; o += kChunkBytes) {
        CHECK(s.r.whereIs(w + o) == Where::Host, "a host run over a chunk not in host RAM");
      }
      total += run.bytes;
    }
    CHECK(!runs.empty(), "no host run where the scan left chunks in host RAM");
    CHECK(total == s.r.placement(w, layers * param).bytes[static_cast<int>(Where::Host)],
          "host runs hold %llu bytes, the ledger %llu", (unsigned long long)total,
          (unsigned long long)s.r.placement(w, layers * param)
              .bytes[static_cast<int>(Where::Host)]);
  }
  // Touched for writing, the chunks leave the scan: plain LRU again.
  for (uint64_t l = 0; l < layers; ++l) {
    if (!s.touch(w + l * param, /*read_only=*/false)) return false;
  }
  CHECK(s.r.whereIs(w) == Where::Host, "LRU did not evict the least recently written chunk");
  return s.invariants("scan");
}

// Note [The learned eviction order]: a loop written by its uses (a plain
// training step's weights, used once a period), larger than the budget,
// brings in every chunk every pass under LRU; filed under their predicted
// next use (one period on), each pass brings in about the part that does not
// fit (Belady's count for a loop: one range more than the excess). A
// prediction the loop does not keep (overdue) makes its chunk the first to
// leave.
bool learnedOrderMovesWhatDoesNotFit() {
  uint64_t pass_bytes[2] = {0, 0};
  const uint64_t layers = 16, param = 3 * kChunkBytes;
  for (int planned = 0; planned < 2; ++planned) {
    Sim s;
    s.lim.budget = 24 * kChunkBytes;
    const uintptr_t w = s.next_base;
    if (!s.addSegment(w, layers * param)) return false;
    for (uint64_t l = 0; l < layers; ++l) {
      if (!s.alloc(w + l * param, param)) return false;
    }
    uint64_t pos = 0;
    for (int pass = 0; pass < 6; ++pass) {
      const uint64_t before = s.r.counters().prefetch_bytes;
      for (uint64_t l = 0; l < layers; ++l, ++pos) {
        if (planned) {
          s.r.setPlanClock(0, PlanClock{pos, pos});
        }
        if (!s.touch(w + l * param)) return false;
        if (planned && !s.plan(w + l * param, pos + layers)) return false;
      }
      pass_bytes[planned] = s.r.counters().prefetch_bytes - before;
    }
    if (planned) {
      CHECK(s.r.counters().plan_victim_bytes > 0, "nothing left by the learned order");
      // Overdue: the loop's first range was due at pos and is not used; a
      // new block's room comes from it before any other planned chunk.
      const uintptr_t overdue = s.r.whereIs(w) == Where::Device ? w : w + (layers - 1) * param;
      CHECK(s.r.whereIs(overdue) == Where::Device, "no range of the loop on the device");
      s.r.setPlanClock(0, PlanClock{pos + 1, pos + 1});
      if (!s.plan(overdue, pos)) return false; // due before now: missed
      CHECK(s.r.whereIs(overdue) == Where::Device, "a plan moved data");
      const uintptr_t extra = s.next_base + (1ull << 32);
      if (!s.addSegment(extra, kChunkBytes)) return false;
      if (!s.alloc(extra, kChunkBytes)) return false;
      CHECK(s.r.whereIs(overdue) == Where::Host, "the overdue chunk did not leave first");
      if (!s.invariants("learned order")) return false;
    }
  }
  const uint64_t over = layers * param - 24 * kChunkBytes;
  CHECK(pass_bytes[0] == layers * param, "LRU brought in %llu chunks a pass, want all %llu",
        (unsigned long long)(pass_bytes[0] / kChunkBytes),
        (unsigned long long)(layers * param / kChunkBytes));
  CHECK(pass_bytes[1] <= over + param, "a planned pass brought in %llu chunks, %llu do not fit",
        (unsigned long long)(pass_bytes[1] / kChunkBytes), (unsigned long long)(over / kChunkBytes));
  return true;
}

// Note [The learned eviction order]: a bring-in ahead of a use predicted at
// position t takes room only from data predicted after t; with none, the
// range stays in host RAM for its operator, and nothing is evicted for it.
bool aheadTakesOnlyLaterRoom() {
  Sim s;
  s.lim.budget = 4 * kChunkBytes;
  const uintptr_t base = s.next_base;
  if (!s.addSegment(base, 8 * kChunkBytes)) return false;
  const uintptr_t a = base, b = base + kChunkBytes, c = base + 2 * kChunkBytes,
                  d = base + 3 * kChunkBytes, x = base + 4 * kChunkBytes,
                  y = base + 5 * kChunkBytes;
  for (uintptr_t r : {x, y, a, b, c, d}) { // x and y first: they end in host RAM
    if (!s.alloc(r, kChunkBytes)) return false;
    if (!s.touch(r)) return false;
  }
  CHECK(s.r.whereIs(x) == Where::Host && s.r.whereIs(y) == Where::Host, "x, y not evicted");
  s.r.setPlanClock(0, PlanClock{100, 100});
  if (!s.plan(a, 102) || !s.plan(b, 103) || !s.plan(c, 104) || !s.plan(d, 150)) return false;
  auto ahead = [&](uintptr_t r, uint64_t at) {
    std::vector<Action> out;
    s.r.touch(r, kChunkBytes, 0, s.stream, s.policy, s.lim, out, false, false, at);
    return s.apply(out, 0) && s.invariants("ahead");
  };
  if (!ahead(x, 110)) return false; // d (150) is later: it leaves
  CHECK(s.r.whereIs(x) == Where::Device && s.r.whereIs(d) == Where::Host,
        "x was not brought in for d's room");
  if (!s.plan(x, 110)) return false;
  const uint64_t evicted = s.r.counters().evict_bytes;
  if (!ahead(y, 120)) return false; // everything else is needed before 120
  CHECK(s.r.whereIs(y) == Where::Host && s.r.counters().evict_bytes == evicted,
        "a bring-in ahead evicted data needed before it");
  for (uintptr_t r : {a, b, c, x}) {
    CHECK(s.r.whereIs(r) == Where::Device, "a range needed earlier left");
  }
  // Its operator's own touch makes room as always.
  if (!s.touch(y)) return false;
  CHECK(s.r.whereIs(y) == Where::Device, "the operator's touch did not bring y in");
  return s.invariants("ahead");
}

// Note [Ranges larger than the budget]: a new segment, a block handed out and
// a touched range larger than the budget take free room only: no live chunk is
// evicted for them and no dead one discarded; the rest is mapped in place.
bool blockLargerThanBudget() {
  Sim s;
  s.lim.budget = 4 * kChunkBytes;
  const uintptr_t a = 1ull << 32, b = 1ull << 33;
  if (!s.addSegment(a, 3 * kChunkBytes)) return false;
  if (!s.alloc(a, 3 * kChunkBytes)) return false;
  // The segment takes the one free chunk and leaves live `a` alone.
  if (!s.addSegment(b, 10 * kChunkBytes)) return false;
  CHECK(s.r.bytesOn(0, Where::Device) == 4 * kChunkBytes, "free room not taken");
  CHECK(s.r.whereIs(b) == Where::Device, "the segment's first chunk not on the device");
  CHECK(s.r.whereIs(b + kChunkBytes) == Where::Host, "the segment evicted live data");
  // Note [Copies shared with the CPU]: the part at the end in host RAM.
  CHECK(s.r.hostTail(b, 10 * kChunkBytes) == 9 * kChunkBytes, "host tail of the segment");
  CHECK(s.r.hostTail(b + 100, 10 * kChunkBytes - 100) == 9 * kChunkBytes, "host tail, offset");
  CHECK(s.r.hostTail(b + kChunkBytes / 2, 2 * kChunkBytes) == 3 * kChunkBytes / 2,
        "host tail starting on the device");
  CHECK(s.r.hostTail(b, kChunkBytes) == 0, "host tail of a range ending on the device");
  CHECK(s.r.hostTail(b, 11 * kChunkBytes) == 0, "host tail past the segment");
  CHECK(s.r.hostTail(b + 10 * kChunkBytes, kChunkBytes) == 0, "host tail outside");
  // Note [Copies of pageable memory past the budget]: the parts in host RAM,
  // neighbouring chunks joined, offsets from the range's start.
  {
    const auto runs = s.r.hostRuns(b + 100, 10 * kChunkBytes - 200);
    CHECK(runs.size() == 1, "host runs not joined");
    CHECK(runs[0].offset == kChunkBytes - 100, "host run's offset");
    CHECK(runs[0].bytes == 9 * kChunkBytes - 100, "host run's bytes");
    CHECK(s.r.hostRuns(b, kChunkBytes).empty(), "host runs of a range on the device");
    CHECK(s.r.hostRuns(b, 11 * kChunkBytes).empty(), "host runs past the segment");
    CHECK(s.r.hostRuns(b + 10 * kChunkBytes, kChunkBytes).empty(), "host runs outside");
    // Note [Pageable bytes on the device go through page-locked buffers]: the rest of a
    // copy, cut into pieces, around runs at its start, middle and end.
    using Run = Residency::Run;
    const auto pieces = Residency::gaps({Run{0, 10}, Run{25, 5}, Run{40, 10}}, 50, 4);
    const std::vector<std::pair<uint64_t, uint64_t>> want = {
        {10, 4}, {14, 4}, {18, 4}, {22, 3}, {30, 4}, {34, 4}, {38, 2}};
    CHECK(pieces.size() == want.size(), "gaps: %zu pieces", pieces.size());
    for (size_t i = 0; i < want.size(); ++i) {
      CHECK(pieces[i].offset == want[i].first && pieces[i].bytes == want[i].second,
            "gap piece %zu at %llu of %llu bytes", i, (unsigned long long)pieces[i].offset,
            (unsigned long long)pieces[i].bytes);
    }
    CHECK(Residency::gaps({}, 9, 4).size() == 3, "gaps of a copy with no run");
    CHECK(Residency::gaps({Run{0, 9}}, 9, 4).empty(), "gaps of a copy that is one run");
    const auto head = Residency::gaps(runs, 10 * kChunkBytes - 200, 1ull << 40);
    CHECK(head.size() == 1 && head[0].offset == 0 && head[0].bytes == kChunkBytes - 100,
          "the gap before the segment's host run");
  }
  // Handed out, freed, handed out again and touched: `a` stays each time.
  if (!s.alloc(b, 10 * kChunkBytes)) return false;
  if (!s.free(b)) return false;
  if (!s.touch(a)) return false;
  if (!s.alloc(b, 10 * kChunkBytes)) return false;
  if (!s.touch(b)) return false;
  CHECK(s.r.whereIs(a) == Where::Device, "a range larger than the budget evicted live data");
  CHECK(s.r.bytesOn(0, Where::Device) == 4 * kChunkBytes, "budget not filled");
  // Dead chunks are not discarded for it either: they wait, on the device,
  // for the next block over them.
  if (!s.free(a)) return false;
  if (!s.free(b)) return false;
  const uint64_t discards = s.r.counters().discards;
  if (!s.alloc(b, 10 * kChunkBytes)) return false;
  CHECK(s.r.counters().discards == discards, "a dead chunk was discarded for the large block");
  CHECK(s.r.whereIs(a) == Where::Device, "the dead block's chunks left the device");
  CHECK(s.r.whereIs(b + kChunkBytes) == Where::Host, "the large block took dead room");
  if (!s.alloc(a, 3 * kChunkBytes)) return false;
  CHECK(s.r.whereIs(a + 2 * kChunkBytes) == Where::Device, "the dead chunks were not revived in place");
  // A range within the budget still makes room (plain LRU).
  if (!s.free(a)) return false;
  const uintptr_t c = 1ull << 34;
  if (!s.addSegment(c, 4 * kChunkBytes)) return false;
  if (!s.alloc(c, 4 * kChunkBytes)) return false;
  CHECK(s.r.whereIs(c + 3 * kChunkBytes) == Where::Device, "a range within the budget not placed");
  CHECK(s.r.whereIs(a) == Where::Host && s.r.whereIs(b) == Where::Host,
        "a range within the budget did not make room");
  return s.invariants("larger than the budget");
}

// Note [Graph pools: a free is not a death]: replay outputs in a private
// pool whose blocks the allocator freed (cudagraph trees) or freed and handed
// out again (a checkpoint restore) keep their data through eviction,
// discards, and reuse of the budget by other blocks.
bool graphPoolOutputsSurvive() {
  Sim s;
  s.lim.budget = 6 * kChunkBytes;
  const uintptr_t pool = 1ull << 32, other = 1ull << 33;
  if (!s.addSegment(pool, 4 * kChunkBytes)) return false;
  if (!s.alloc(pool, 2 * kChunkBytes, /*pool=*/true)) return false;
  if (!s.alloc(pool + 2 * kChunkBytes, kChunkBytes, /*pool=*/true)) return false;
  // The recording's output tensors died; replays keep writing both blocks.
  if (!s.freeReplayed(pool)) return false;
  if (!s.freeReplayed(pool + 2 * kChunkBytes)) return false;
  if (!s.addSegment(other, 12 * kChunkBytes)) return false;
  for (int round = 0; round < 3; ++round) {
    // Other blocks come and go over twice the budget: every pool chunk is a
    // victim at some point; the checks in apply() fail on a live discard.
    for (uint64_t i = 0; i < 12; i += 3) {
      if (!s.alloc(other + i * kChunkBytes, 3 * kChunkBytes)) return false;
    }
    for (uint64_t i = 0; i < 12; i += 3) {
      if (!s.free(other + i * kChunkBytes)) return false;
    }
    if (!s.restore(pool)) return false;
  }
  CHECK(s.r.liveBytesAt(pool) > 0 && s.r.liveBytesAt(pool + 2 * kChunkBytes) > 0,
        "a replayed pool chunk counts as dead");
  // Pool chunks no block ever used are dead as anywhere else.
  CHECK(s.r.liveBytesAt(pool + 3 * kChunkBytes) == 0, "an unused pool chunk counts as live");
  return true;
}

} // namespace

// Note [Ledger traces]: the records of a run, written as text and read
// back, replayed against a fresh ledger, make the same actions in the same
// order, with the same counters.
struct VectorSink final : TraceSink {
  std::vector<TraceRecord> records;
  void record(const TraceRecord& r) override {
    records.push_back(r);
  }
};

bool recordedTraceReplaysTheSameDecisions() {
  Sim s;
  VectorSink sink;
  s.r.setTrace(&sink);
  if (!changingLoop(s)) {
    return false;
  }
  const uintptr_t bucket = s.next_base;
  if (!s.addSegment(bucket, 4 * kChunkBytes) || !s.alloc(bucket, 4 * kChunkBytes)) {
    return false;
  }
  CHECK(s.forgetContent(bucket) == 4 * kChunkBytes, "the bucket was not forgotten");
  if (!s.touch(bucket) || !s.touch(bucket, false, /*hold=*/true)) {
    return false;
  }
  CHECK(s.r.counters().hold_bytes == 4 * kChunkBytes, "the bucket was not held");
  // The learned order's records: a clock, plans, and touches ahead of a use
  // (Note [The learned eviction order]) that evict what is predicted later.
  s.r.setPlanClock(0, PlanClock{1000, 1010});
  for (const auto& [addr, size] : s.live) {
    if (addr != bucket && !s.plan(addr, 1100 + (addr >> 21) % 50)) return false;
  }
  // A budget the live chunks on the device fill: room comes from the plan,
  // warm chunks first (Note [First evictions]: the flag travels in the trace).
  const uint64_t budget = s.lim.budget;
  s.lim.budget = s.r.bytesOn(0, Where::Device) - s.r.deadOnDevice(0);
  s.lim.warm_first = true;
  for (const auto& [addr, size] : s.live) {
    if (addr == bucket || s.r.whereIs(addr) != Where::Host) continue;
    std::vector<Action> out;
    s.r.touch(addr, size, 0, s.stream, s.policy, s.lim, out, false, false, 1020);
    if (!s.apply(out, 0) || !s.invariants("ahead")) return false;
  }
  s.lim.budget = budget;
  s.lim.warm_first = false;
  if (!s.removeSegment(bucket)) {
    return false;
  }
  std::set<char> ops;
  Residency again;
  std::vector<Action> all;
  for (const TraceRecord& r : sink.records) {
    ops.insert(static_cast<char>(r.op));
    const std::string line = formatTrace(r);
    TraceRecord back;
    CHECK(parseTrace(line, back), "a record does not parse back: %s", line.c_str());
    CHECK(formatTrace(back) == line, "a record changes when read back: %s", line.c_str());
    std::vector<Action> out;
    replayTrace(again, back, out);
    all.insert(all.end(), out.begin(), out.end());
  }
  CHECK(ops == std::set<char>({'S', 'R', 'A', 'F', 'T', 'G', 'P', 'K'}), "%zu kinds of record",
        ops.size());
  CHECK(std::any_of(sink.records.begin(), sink.records.end(),
                    [](const TraceRecord& r) { return r.limits.warm_first; }),
        "no record carries warm_first");
  CHECK(std::any_of(sink.records.begin(), sink.records.end(),
                    [](const TraceRecord& r) { return r.needed_at != 0; }),
        "no touch ahead recorded");
  CHECK(s.r.counters().plan_victim_bytes > 0 &&
            again.counters().plan_victim_bytes == s.r.counters().plan_victim_bytes,
        "the learned order's victims: %llu made, %llu replayed",
        (unsigned long long)s.r.counters().plan_victim_bytes,
        (unsigned long long)again.counters().plan_victim_bytes);
  CHECK(all.size() == s.all.size() && s.all.size() > 100, "%zu actions replayed, %zu made",
        all.size(), s.all.size());
  for (size_t k = 0; k < all.size(); ++k) {
    const Action& a = all[k];
    const Action& b = s.all[k];
    CHECK(a.kind == b.kind && a.addr == b.addr && a.size == b.size && a.fence == b.fence &&
              a.stream == b.stream,
          "action %zu differs in the replay: %s against %s", k, actionName(a.kind),
          actionName(b.kind));
  }
  const ResidencyCounters& x = again.counters();
  const ResidencyCounters& y = s.r.counters();
  CHECK(x.discard_bytes == y.discard_bytes && x.reuse_bytes == y.reuse_bytes &&
            x.evict_bytes == y.evict_bytes && x.prefetch_bytes == y.prefetch_bytes &&
            x.forget_bytes == y.forget_bytes && x.hold_bytes == y.hold_bytes,
        "the replay's counters differ");
  // The file sink writes PATH.<pid>, every record a line, on flush.
  const char* tmp = std::getenv("TMPDIR");
  const std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/um-ledger-test";
  std::string why;
  auto file = TraceFile::open(path, why);
  CHECK(file != nullptr, "TraceFile: %s", why.c_str());
  for (const TraceRecord& r : sink.records) {
    file->record(r);
  }
  // A fork()ed child's records and flushes write nothing: the file holds the
  // parent's lines only, once.
  const pid_t child = fork();
  if (child == 0) {
    for (const TraceRecord& r : sink.records) {
      file->record(r);
    }
    file->flush();
    _exit(0);
  }
  int status = 0;
  CHECK(child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) &&
            WEXITSTATUS(status) == 0,
        "the forked child failed");
  file->flush();
  const std::string name = path + "." + std::to_string(getpid());
  std::ifstream in(name);
  std::string line;
  size_t lines = 0;
  for (; std::getline(in, line); ++lines) {
    CHECK(lines < sink.records.size() && line == formatTrace(sink.records[lines]),
          "line %zu of the trace file is not its record", lines);
  }
  CHECK(lines == sink.records.size(), "%zu lines for %zu records", lines, sink.records.size());
  file.reset();
  std::remove(name.c_str());
  CHECK(TraceFile::open("/nonexistent-dir/trace", why) == nullptr &&
            why.find("/nonexistent-dir/trace.") != std::string::npos,
        "a trace path that cannot be written was not refused: %s", why.c_str());
  TraceRecord junk;
  CHECK(!parseTrace("A 10 20", junk) && !parseTrace("Z 1 2 0 5 0 0 1 9 1 1 0", junk) &&
            !parseTrace(formatTrace(sink.records[0]) + " 7", junk),
        "a malformed line parsed");
  return true;
}

// Any order of dead victims is safe: a dead chunk holds nothing live, so
// whichever leaves first, no live byte is discarded (the simulator checks
// every action) and the ledger stays consistent.
struct NewestDeadFirst final : DeadChoice {
  size_t picks = 0;
  size_t pick(const std::vector<uintptr_t>& candidates) override {
    ++picks;
    return candidates.size() - 1;
  }
};

bool anotherDeadOrderIsSafe() {
  Sim s;
  NewestDeadFirst order;
  s.r.setDeadChoice(&order);
  if (!changingLoop(s)) {
    return false;
  }
  CHECK(order.picks > 0, "the dead order was never asked");
  CHECK(s.r.counters().discard_bytes > 0, "nothing was discarded");
  return true;
}

int main() {
  struct Case {
    const char* name;
    bool (*fn)();
  };
  const Case cases[] = {
      {"repeated training loop under the budget", repeatedLoopUnderBudget},
      {"changing pattern", changingPattern},
      {"a loop that fits issues nothing", fitsIssuesNothing},
      {"no action during capture", captureDoesNothing},
      {"a stale segment is replaced by one over its addresses", staleSegmentIsReplaced},
      {"every address finds its segment", everyAddressFindsItsSegment},
      {"static policy", staticPolicy},
      {"oversized segment split by placement", oversizedSegmentIsSplit},
      {"an adopted range keeps its data", adoptedSegmentKeepsItsData},
      {"a block larger than the budget", blockLargerThanBudget},
      {"inference: read-only duplicates", inferenceReadOnly},
      {"cancelled moves: coverage and cuts", cancelledMoveRanges},
      {"a repeated read-only scan keeps a prefix", repeatedScanKeepsAPrefix},
      {"the learned order moves what does not fit", learnedOrderMovesWhatDoesNotFit},
      {"a bring-in ahead takes only room needed later", aheadTakesOnlyLaterRoom},
      {"evicted, then freed unused, is counted", evictedUnusedIsCounted},
      {"first evictions are counted", firstEvictionsAreCounted},
      {"warm victims leave first", warmVictimsLeaveFirst},
      {"planned victims leave as one range", plannedVictimsLeaveAsOneRange},
      {"graph pool outputs survive frees and restores", graphPoolOutputsSurvive},
      {"a block no event touches stays evicted",
       [] { return stepTouchBringsBackAnUntouchedBlock(false); }},
      {"a step's touch brings it back every step",
       [] { return stepTouchBringsBackAnUntouchedBlock(true); }},
      {"a bucket not forgotten leaves by copy",
       [] { return forgottenBucketLeavesWithoutACopy(false); }},
      {"a forgotten bucket leaves and comes back without a copy",
       [] { return forgottenBucketLeavesWithoutACopy(true); }},
      {"a held workspace stays on the device until freed", heldWorkspaceStays},
      {"a recorded trace replays to the same decisions", recordedTraceReplaysTheSameDecisions},
      {"another order of dead victims is safe", anotherDeadOrderIsSafe},
  };
  int run = 0;
  for (const Case& c : cases) {
    bool ok = c.fn();
    std::printf("%s %s\n", ok ? "ok  " : "FAIL", c.name);
    ++run;
  }
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    bool ok = randomTrace(seed);
    if (!ok) std::printf("FAIL random trace, seed %llu\n", (unsigned long long)seed);
    ++run;
  }
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    bool ok = ordersBuiltLateDecideAlike(seed);
    std::printf("%s orders built late decide alike, seed %llu\n", ok ? "ok  " : "FAIL",
                (unsigned long long)seed);
    ++run;
  }
  std::printf("%d cases, %d failures\n", run, g_failures);
  return g_failures == 0 ? 0 : 1;
}
