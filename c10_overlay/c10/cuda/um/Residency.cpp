#include <c10/cuda/um/Residency.h>

#include <algorithm>
#include <cassert>
#include <iterator>

namespace c10::cuda::um {

const char* actionName(Action::Kind k) {
  switch (k) {
    case Action::PrefetchToDevice:
      return "prefetch-to-device";
    case Action::DiscardAndPrefetch:
      return "discard-and-prefetch";
    case Action::EvictToHost:
      return "evict-to-host";
    case Action::Discard:
      return "discard";
    case Action::MapHost:
      return "map-host";
    case Action::PlaceOnDevice:
      return "place-on-device";
    case Action::AdviseHost:
      return "advise-host";
    case Action::PlaceOnHost:
      return "place-on-host";
    case Action::DuplicateToDevice:
      return "duplicate-to-device";
    case Action::DropDuplicate:
      return "drop-duplicate";
  }
  return "?";
}

bool coveredWhole(
    const std::vector<JobRanges>& queued,
    const std::vector<JobRanges>& taken,
    uintptr_t lo,
    uintptr_t hi) {
  auto each = [&](const JobRanges& j, auto&& fn) {
    for (size_t r = 0; r < j.ptrs->size(); ++r) {
      const auto a = reinterpret_cast<uintptr_t>((*j.ptrs)[r]);
      const uintptr_t b = a + (*j.sizes)[r];
      if (a < hi && lo < b) {
        fn(std::max(a, lo), std::min(b, hi));
      }
    }
  };
  bool clear = true;
  for (const JobRanges& j : taken) {
    each(j, [&](uintptr_t, uintptr_t) { clear = false; });
  }
  if (!clear || lo >= hi) {
    return false;
  }
  std::vector<std::pair<uintptr_t, uintptr_t>> pieces;
  for (const JobRanges& j : queued) {
    each(j, [&](uintptr_t a, uintptr_t b) { pieces.emplace_back(a, b); });
  }
  std::sort(pieces.begin(), pieces.end());
  uintptr_t reached = lo;
  for (const auto& [a, b] : pieces) {
    if (a > reached) {
      break;
    }
    reached = std::max(reached, b);
  }
  return reached >= hi;
}

void cutOut(JobRanges job, uintptr_t lo, uintptr_t hi) {
  std::vector<void*> ptrs;
  std::vector<size_t> sizes;
  for (size_t r = 0; r < job.ptrs->size(); ++r) {
    const auto a = reinterpret_cast<uintptr_t>((*job.ptrs)[r]);
    const uintptr_t b = a + (*job.sizes)[r];
    if (b <= lo || a >= hi) {
      ptrs.push_back((*job.ptrs)[r]);
      sizes.push_back((*job.sizes)[r]);
      continue;
    }
    if (a < lo) {
      ptrs.push_back((*job.ptrs)[r]);
      sizes.push_back(lo - a);
    }
    if (hi < b) {
      ptrs.push_back(reinterpret_cast<void*>(hi));
      sizes.push_back(b - hi);
    }
  }
  job.ptrs->swap(ptrs);
  job.sizes->swap(sizes);
}

ActionGroup nextGroup(const std::vector<Action>& actions, size_t first) {
  const Action& a = actions[first];
  ActionGroup g{first, 0};
  while (g.end < actions.size()) {
    const Action& b = actions[g.end];
    if (b.kind != a.kind || b.device != a.device || b.stream != a.stream ||
        ((a.kind == Action::EvictToHost || a.kind == Action::Discard) &&
         b.fence != a.fence)) {
      break;
    }
    g.fence = std::max(g.fence, b.fence);
    ++g.end;
  }
  return g;
}

namespace {

// Note [Finding a segment]: the 2 MiB granules [first, end) that a segment at
// base of size bytes covers (none for an empty one).
std::pair<uintptr_t, uintptr_t> granules(uintptr_t base, uint64_t size) {
  return size == 0
      ? std::make_pair(uintptr_t{0}, uintptr_t{0})
      : std::make_pair(base / kChunkBytes, (base + size - 1) / kChunkBytes + 1);
}

// Bytes of [lo, hi) that fall into [clo, chi).
uint64_t overlap(uintptr_t lo, uintptr_t hi, uintptr_t clo, uintptr_t chi) {
  uintptr_t a = std::max(lo, clo);
  uintptr_t b = std::min(hi, chi);
  return b > a ? b - a : 0;
}

} // namespace

// Note [Finding a segment]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every block event starts by finding the segment its address falls in. In
// std::map that is a walk of about log2(segments) nodes, each somewhere else
// in memory, and between two events of a training step the framework's own
// work has pushed them out of the CPU's caches. bench/probes/engine_event_cost.cpp's
// cold case (450 segments, a MiB of other memory written between events) put
// an event at 370-630 ns on the 2-core development host against 33-134 ns
// with the ledger in cache, most of the difference this walk (prediction
// step 42, bench/README.md). So every 2 MiB of address space a segment covers
// also maps to it in a hash table, a lookup of a line or two: 260-370 ns cold.
// Where two segments share 2 MiB (bases are not always 2 MiB aligned), the
// entry names the last one added, and an address of the other falls back to
// the map: the table only ever answers with a segment the address lies in.
Residency::Segment* Residency::find(uintptr_t addr) {
  const auto hit = by_granule_.find(addr / kChunkBytes);
  if (hit != by_granule_.end()) {
    Segment* seg = hit->second;
    if (addr >= seg->base && addr < seg->base + seg->size) {
      return seg;
    }
  }
  auto it = segments_.upper_bound(addr);
  if (it == segments_.begin()) {
    return nullptr;
  }
  --it;
  return addr < it->second.base + it->second.size ? &it->second : nullptr;
}

const Residency::Segment* Residency::find(uintptr_t addr) const {
  return const_cast<Residency*>(this)->find(addr);
}

Residency::DeviceLru& Residency::lru(int device) {
  if (devices_.size() <= static_cast<size_t>(device)) {
    devices_.resize(static_cast<size_t>(device) + 1);
  }
  return devices_[device];
}

Residency::OrderKind Residency::orderOf(const Segment& seg, size_t i) const {
  if (seg.chunks[i].where == Where::Host || seg.chunks[i].held) {
    return OrderKind::None; // Note [Held ranges]: never a victim
  }
  if (seg.dead(i)) {
    return OrderKind::Dead;
  }
  if (seg.chunks[i].scan) {
    return OrderKind::Scan;
  }
  if (seg.chunks[i].due == 0) {
    return OrderKind::Live;
  }
  return seg.chunks[i].host_pages ? OrderKind::Planned : OrderKind::PlannedCold;
}

Residency::Order& Residency::order(DeviceLru& d, OrderKind kind) {
  return kind == OrderKind::Dead  ? d.dead
      : kind == OrderKind::Scan     ? d.scan
      : kind == OrderKind::Planned  ? d.planned
      : kind == OrderKind::PlannedCold ? d.planned_cold
                                    : d.live;
}

void Residency::unlink(Segment& seg, size_t i) {
  Chunk& c = seg.chunks[i];
  DeviceLru& d = lru(seg.device);
  d.bytes[static_cast<int>(c.where)] -= seg.chunkSize(i);
  if (c.in == OrderKind::None) {
    return;
  }
  if (c.in == OrderKind::Dead) {
    d.dead_bytes -= seg.chunkSize(i);
  }
  if (!d.ordered) { // Note [Orders built on demand]
    c.in = OrderKind::None;
    return;
  }
  // Note [The eviction order's cost]: erased from the order it is in, through
  // its entry; the node is kept for the next link.
  Order& from = order(d, c.in);
  if (spare_.empty()) {
    spare_ = from.extract(c.pos);
  } else {
    from.erase(c.pos);
  }
  c.in = OrderKind::None;
}

void Residency::link(Segment& seg, size_t i) {
  Chunk& c = seg.chunks[i];
  DeviceLru& d = lru(seg.device);
  d.bytes[static_cast<int>(c.where)] += seg.chunkSize(i);
  const OrderKind kind = orderOf(seg, i);
  if (kind == OrderKind::None) {
    return;
  }
  if (kind == OrderKind::Dead) {
    d.dead_bytes += seg.chunkSize(i);
  }
  if (!d.ordered) { // Note [Orders built on demand]
    c.in = kind;
    return;
  }
  // Note [The eviction order's cost]: most links are at the newest tick (a
  // planned chunk's due is not, and is placed by search). The key is unique:
  // segments in the ledger never overlap (addSegment).
  Order& into = order(d, kind);
  const Key key = keyOf(seg, i, kind);
  if (spare_.empty()) {
    c.pos = into.emplace_hint(into.end(), key);
  } else {
    spare_.value() = key;
    c.pos = into.insert(into.end(), std::move(spare_));
  }
  assert(spare_.empty()); // inserted, not found: the node is the chunk's
  c.in = kind;
}

void Residency::ensureOrdered(int device) {
  DeviceLru& d = lru(device);
  if (d.ordered) {
    return;
  }
  for (auto& [base, seg] : segments_) {
    if (seg.device != device) {
      continue;
    }
    for (size_t i = 0; i < seg.chunks.size(); ++i) {
      Chunk& c = seg.chunks[i];
      if (c.in != OrderKind::None) {
        c.pos = order(d, c.in).emplace(keyOf(seg, i, c.in)).first;
      }
    }
  }
  d.ordered = true;
}

void Residency::setWhere(Segment& seg, size_t i, Where to) {
  unlink(seg, i);
  seg.chunks[i].where = to;
  if (to == Where::Host) {
    seg.chunks[i].held = false; // Note [Held ranges]: it left, so it ends
    seg.chunks[i].due = 0; // Note [The learned eviction order]: so does a plan
  }
  if (to == Where::Device) {
    seg.chunks[i].evicted_live = false;
  }
  link(seg, i);
}

void Residency::setLive(Segment& seg, size_t i, uint32_t live, bool retick) {
  Chunk& c = seg.chunks[i];
  const bool was_dead = seg.dead(i);
  // A block event over the chunk ends what forget() said of it (Note
  // [Forgotten content]); was_dead above is the order it is in now.
  c.stale = false;
  // So does it end a hold (Note [Held ranges]), which changes the order.
  const bool was_held = c.held;
  c.held = false;
  const bool now_dead = seg.tracked && live == 0;
  if (now_dead && !was_dead && c.evicted_live) {
    counters_.evicted_unused_bytes += seg.chunkSize(i);
    c.evicted_live = false;
  }
  if (!retick && was_dead == now_dead && !was_held) {
    c.live = live; // same set, same key
    return;
  }
  unlink(seg, i);
  c.live = live;
  if (retick) {
    c.tick = tick_;
    c.due = 0; // another block: the prediction was about the old one
  }
  link(seg, i);
}

void Residency::retouch(Segment& seg, size_t i, bool scan) {
  unlink(seg, i);
  seg.chunks[i].tick = tick_;
  seg.chunks[i].scan = scan;
  seg.chunks[i].due = 0; // until plan() files it again
  link(seg, i);
}

void Residency::unstale(Segment& seg, size_t i) {
  if (seg.chunks[i].stale) {
    unlink(seg, i);
    seg.chunks[i].stale = false;
    link(seg, i);
  }
}

void Residency::emit(
    std::vector<Action>& out,
    uintptr_t segment,
    Action::Kind kind,
    uintptr_t addr,
    uint64_t size,
    int device,
    void* stream,
    uint64_t fence) {
  // Merges with the last action, or with the one before it when the last
  // is about other pages and the fence is the same (chunks leaving as
  // DropDuplicate, EvictToHost, DropDuplicate, ... then make two calls, not
  // one pair per chunk; an eviction's fence is its batch number).
  // Adjacent segments are separate allocations: one CUDA call per range
  // must stay inside one of them. A range joins on either side: the
  // farthest-first orders hand out a range's chunks from its highest address
  // down (Note [Victims leave as runs]).
  auto extends = [&](const Action& a) {
    return a.kind == kind && a.device == device && a.stream == stream &&
        a.segment == segment &&
        (a.addr + a.size == addr || addr + size == a.addr);
  };
  const size_t n = out.size();
  Action* into = nullptr;
  if (n >= 1 && extends(out[n - 1])) {
    into = &out[n - 1];
  } else if (
      n >= 2 && extends(out[n - 2]) && out[n - 2].fence == fence &&
      (out[n - 1].addr >= addr + size ||
       out[n - 1].addr + out[n - 1].size <= addr)) {
    into = &out[n - 2];
  }
  if (into != nullptr) {
    into->addr = std::min(into->addr, addr);
    into->size += size;
    into->fence = std::max(into->fence, fence);
    return;
  }
  out.push_back(Action{kind, addr, size, device, stream, segment, fence});
}

uint64_t Residency::evictionBatch(void* stream, bool discard) {
  if (evict_seq_tick_ != tick_ || evict_seq_stream_ != stream ||
      evict_seq_discard_ != discard || evict_seq_ == 0) {
    ++evict_seq_;
    evict_seq_tick_ = tick_;
    evict_seq_stream_ = stream;
    evict_seq_discard_ = discard;
  }
  return evict_seq_;
}

void Residency::addSegment(
    uintptr_t base,
    uint64_t size,
    int device,
    void* stream,
    bool tracked,
    bool adopted,
    Policy policy,
    const DeviceLimits& limits,
    std::vector<Action>& out) {
  if (trace_ != nullptr) {
    trace_->record(TraceRecord{TraceRecord::AddSegment, base, size, device,
                               reinterpret_cast<uintptr_t>(stream), tracked, adopted, policy,
                               limits});
  }
  // A base can only come back after its segment was released, and live
  // segments never overlap: an entry over any of these addresses is stale
  // (its free never reached the engine). None may survive, or its chunks'
  // entries in the eviction order would resolve to the new segment's.
  auto it = segments_.lower_bound(base);
  if (it != segments_.begin() &&
      std::prev(it)->first + std::prev(it)->second.size > base) {
    --it;
  }
  while (it != segments_.end() && (it->first == base || it->first < base + size)) {
    const uintptr_t stale = it->first;
    ++it;
    removeSegment(stale);
  }
  Segment& seg = segments_[base];
  seg.base = base;
  seg.size = size;
  for (auto [g, end] = granules(base, size); g < end; ++g) {
    by_granule_[g] = &seg; // Note [Finding a segment]
  }
  seg.device = device;
  seg.stream = stream;
  seg.tracked = tracked;
  seg.chunks.assign((size + kChunkBytes - 1) / kChunkBytes, Chunk{});
  ++tick_;
  for (Chunk& c : seg.chunks) {
    c.tick = tick_;
  }
  DeviceLru& d = lru(device);
  const uint64_t on_device = d.resident();
  // Chunks [0, on_dev) go to the device, the rest to host RAM.
  size_t on_dev = seg.chunks.size();
  if (!limits.can_act) {
    // Unplaced: no advice is possible now.
  } else if (policy == Policy::Static) {
    if (on_device + size > limits.budget) {
      on_dev = 0;
    }
  } else {
    if (on_device + size > limits.budget && !streamsInPlace(size, limits)) {
      makeRoom(
          device, on_device + size - limits.budget, limits, tick_, stream, out);
    }
    const uint64_t now = d.resident();
    const uint64_t room = limits.budget > now ? limits.budget - now : 0;
    on_dev = std::min<uint64_t>(seg.chunks.size(), room / kChunkBytes);
    if (on_dev == seg.chunks.size() - 1 &&
        seg.chunkSize(on_dev) <= room - on_dev * kChunkBytes) {
      on_dev = seg.chunks.size(); // a short last chunk that still fits
    }
  }
  if (limits.can_act && policy == Policy::Lru) {
    emit(out, base, Action::AdviseHost, base, size, device, stream);
  }
  for (size_t i = 0; i < seg.chunks.size(); ++i) {
    Chunk& c = seg.chunks[i];
    if (!limits.can_act) {
      c.where = Where::Unplaced;
    } else if (i < on_dev) {
      c.where = Where::Device;
      emit(out, seg.base, Action::PlaceOnDevice, seg.chunkAddr(i), seg.chunkSize(i),
           device, stream);
      counters_.place_bytes += seg.chunkSize(i);
    } else {
      c.where = Where::Host;
      c.host_pages = true; // made in host RAM or adopted from it (Note [First evictions])
      // Fresh pages are made in host RAM (MapHost); an adopted range's are
      // there already and hold its data: it only needs the advice, which
      // lru gave the whole segment above.
      if (!adopted) {
        emit(out, seg.base, Action::MapHost, seg.chunkAddr(i), seg.chunkSize(i), device,
             stream);
      } else if (policy != Policy::Lru) {
        emit(out, seg.base, Action::AdviseHost, seg.chunkAddr(i), seg.chunkSize(i),
             device, stream);
      }
      counters_.map_host_bytes += seg.chunkSize(i);
    }
    link(seg, i);
  }
}

std::optional<Residency::SegmentInfo> Residency::removeSegment(uintptr_t base) {
  if (trace_ != nullptr) {
    trace_->record(TraceRecord{TraceRecord::RemoveSegment, base});
  }
  auto it = segments_.find(base);
  if (it == segments_.end()) {
    return std::nullopt;
  }
  Segment& seg = it->second;
  for (size_t i = 0; i < seg.chunks.size(); ++i) {
    unlink(seg, i);
  }
  const SegmentInfo info{seg.size, seg.device};
  for (auto [g, end] = granules(base, seg.size); g < end; ++g) {
    const auto entry = by_granule_.find(g);
    if (entry != by_granule_.end() && entry->second == &seg) {
      by_granule_.erase(entry);
    }
  }
  segments_.erase(it);
  return info;
}

uint64_t Residency::makeRoom(
    int device,
    uint64_t need,
    const DeviceLimits& limits,
    uint64_t protect_tick,
    void* stream,
    std::vector<Action>& out,
    uint64_t needed_at) {
  ensureOrdered(device); // Note [Orders built on demand]
  DeviceLru& d = lru(device);
  uint64_t freed = 0;
  while (freed < need) {
    // Note [The learned eviction order], around Note [Scans]: dead chunks
    // first (they leave without a copy), then planned ones whose use is
    // overdue, then planned ones due after the lookahead's window (farthest
    // first), then the unplanned: live ones colder than the whole scan, the
    // scan's most recently read, the least recently touched; last the
    // planned ones inside the window. Never a chunk of the range being
    // brought in (no planned chunk is: a touch takes its chunks out of
    // `planned` until plan() files them again).
    auto usable = [&](const Order& s) {
      return !s.empty() && s.begin()->first < protect_tick;
    };
    // The planned chunks, in two orders by their pages (Note [First
    // evictions]): the soonest due of both, and the farthest, of both or,
    // with warm_first, of the warm ones where one is due after the window.
    const Order& w = d.planned;
    const Order& cold = d.planned_cold;
    const Order* soonest = w.empty() ? &cold
        : cold.empty()               ? &w
        : *w.begin() < *cold.begin() ? &w
                                     : &cold;
    const Order* farthest = w.empty() ? &cold
        : cold.empty()                ? &w
        : *cold.rbegin() < *w.rbegin() ? &w
                                       : &cold;
    const uint64_t after = std::max(d.clock.window, needed_at);
    if (limits.warm_first && !w.empty() && w.rbegin()->first > after) {
      farthest = &w;
    }
    uintptr_t addr = 0;
    bool by_plan = false;
    if (usable(d.dead)) {
      addr = dead_choice_ == nullptr ? d.dead.begin()->second
                                     : chooseDead(d.dead, protect_tick);
    } else if (!soonest->empty() && soonest->begin()->first < d.clock.now) {
      addr = soonest->begin()->second;
      by_plan = true;
    } else if (!farthest->empty() && farthest->rbegin()->first > after) {
      addr = farthest->rbegin()->second;
      by_plan = true;
    } else if (needed_at != 0) {
      break; // a bring-in ahead takes nothing needed before it
    } else if (
        usable(d.live) &&
        (d.scan.empty() || d.live.begin()->first < d.scan.begin()->first)) {
      addr = d.live.begin()->second;
    } else if (usable(d.scan)) {
      auto it = d.scan.lower_bound(Key{protect_tick, 0});
      addr = std::prev(it)->second;
    } else if (usable(d.live)) {
      addr = d.live.begin()->second;
    } else if (!farthest->empty()) {
      addr = farthest->rbegin()->second;
      by_plan = true;
    } else {
      break;
    }
    Segment* seg = find(addr);
    const uint64_t left = leave(*seg, (addr - seg->base) / kChunkBytes, limits, out);
    freed += left;
    if (by_plan) {
      counters_.plan_victim_bytes += left;
    }
  }
  return freed;
}

uintptr_t Residency::chooseDead(const Order& dead, uint64_t protect_tick) {
  std::vector<uintptr_t> candidates;
  for (auto it = dead.begin(); it != dead.end() && it->first < protect_tick;
       ++it) {
    candidates.push_back(it->second);
  }
  return candidates[dead_choice_->pick(candidates)];
}

uint64_t Residency::leave(
    Segment& seg,
    size_t i,
    const DeviceLimits& limits,
    std::vector<Action>& out) {
  Chunk& c = seg.chunks[i];
  const uintptr_t addr = seg.chunkAddr(i);
  const uint64_t sz = seg.chunkSize(i);
  dropDuplicate(seg, i, seg.stream, out);
  if (seg.dead(i) && limits.discard) {
    // After the last use of its blocks, through the evictor (Note
    // [Discards leave through the evictor]).
    c.evicted_in = evictionBatch(seg.stream, /*discard=*/true);
    emit(out, seg.base, Action::Discard, addr, sz, seg.device, seg.stream,
         c.evicted_in);
    counters_.discards += 1;
    counters_.discard_bytes += sz;
    counters_.forgotten_discard_bytes += c.stale ? sz : 0;
    c.discarded = true;
    c.host_pages = false; // Note [First evictions]
  } else {
    // Ordered after the work queued so far on the stream of the chunk's
    // blocks (their kernels, and any discard-and-prefetch of the chunk),
    // never racing a discard there (Note [Executor: ordering]).
    c.evicted_in = evictionBatch(seg.stream, /*discard=*/false);
    emit(out, seg.base, Action::EvictToHost, addr, sz, seg.device, seg.stream,
         c.evicted_in);
    counters_.evictions += 1;
    counters_.evict_bytes += sz;
    counters_.evict_first_bytes += c.host_pages ? 0 : sz; // Note [First evictions]
    c.host_pages = true;
    c.evicted_live = true;
  }
  setWhere(seg, i, Where::Host);
  return sz;
}

void Residency::dropDuplicate(
    Segment& seg,
    size_t i,
    void* stream,
    std::vector<Action>& out) {
  Chunk& c = seg.chunks[i];
  if (!c.dup) {
    return;
  }
  emit(out, seg.base, Action::DropDuplicate, seg.chunkAddr(i), seg.chunkSize(i),
       seg.device, stream);
  counters_.drop_bytes += seg.chunkSize(i);
  c.dup = false;
}

uint64_t Residency::bringIn(
    Segment& seg,
    size_t first,
    size_t last,
    void* stream,
    bool dead_content,
    uintptr_t lo,
    uintptr_t hi,
    const DeviceLimits& limits,
    std::vector<Action>& out,
    bool read_only) {
  DeviceLru& d = lru(seg.device);
  uint64_t on_device = d.resident();
  uint64_t moved = 0;
  for (size_t i = first; i < last; ++i) {
    Chunk& c = seg.chunks[i];
    if (c.where != Where::Host) {
      continue;
    }
    if (!dead_content && seg.tracked && c.live == 0) {
      // A use of live data never moves (or discards) a dead chunk: the
      // toucher's stream is not its blocks' stream, and nothing reads it. A
      // forgotten chunk is live: its toucher writes it next.
      continue;
    }
    const uint64_t sz = seg.chunkSize(i);
    if (on_device + sz > limits.budget) {
      // No room: the chunk stays in host RAM, mapped in place. A discarded
      // one gets its pages there first (a GPU write into discarded pages
      // by faults costs seconds per GiB).
      if (c.discarded) {
        emit(out, seg.base, Action::PlaceOnHost, seg.chunkAddr(i), sz,
             seg.device, stream, c.evicted_in);
        c.discarded = false;
        c.host_pages = true; // Note [First evictions]
      }
      c.stale = false; // in host RAM: in no order
      continue;
    }
    // A duplicate needs valid host pages to copy.
    const bool host_valid = !c.discarded;
    c.discarded = false;
    // Discarding is safe when no live byte of the chunk survives the
    // toucher's write: the chunk is dead, its content was forgotten (Note
    // [Forgotten content]), or only the touched block lives there and the
    // toucher overwrites all of it.
    const uintptr_t clo = seg.chunkAddr(i);
    const uint64_t mine = overlap(lo, hi, clo, clo + sz);
    const bool discardable = seg.tracked && limits.discard &&
        (c.live == 0 || c.stale || (dead_content && c.live == mine));
    c.stale = false; // in host RAM until setWhere below: in no order
    if (discardable) {
      emit(out, seg.base, Action::DiscardAndPrefetch, clo, sz, seg.device,
           stream, c.evicted_in);
      counters_.reuse_bytes += sz;
      c.host_pages = false; // the discard drops its pages (Note [First evictions])
    } else if (read_only && !dead_content && host_valid) {
      // Note [Read-only duplicates]
      emit(out, seg.base, Action::DuplicateToDevice, clo, sz, seg.device,
           stream, c.evicted_in);
      counters_.duplicate_bytes += sz;
      c.dup = true;
    } else {
      emit(out, seg.base, Action::PrefetchToDevice, clo, sz, seg.device,
           stream, c.evicted_in);
      counters_.prefetch_bytes += sz;
    }
    setWhere(seg, i, Where::Device);
    on_device += sz;
    moved += sz;
  }
  return moved;
}

// Note [Reviving a dead chunk]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Any thread that needs room may decide to discard a dead chunk, and the
// discard is queued on the chunk's own stream (its segment's) when that
// thread's ticket is served, which can be after the engine's lock is dropped.
// If the allocator meanwhile hands out a block over that chunk and the owner
// of the stream launches a kernel writing it, a discard queued behind that
// kernel destroys the block's data (seen on the GPU as zeros in the
// multi-stream fuzz). So an allocation that revives a dead chunk reports it,
// and the engine makes it wait, before malloc returns, until every action
// decided before it has been queued: the discard is then ahead of the
// block's first kernel on the stream.
bool Residency::onAlloc(
    uintptr_t addr,
    uint64_t size,
    void* stream,
    Policy policy,
    const DeviceLimits& limits,
    std::vector<Action>& out,
    bool replayed) {
  if (trace_ != nullptr) {
    trace_->record(TraceRecord{TraceRecord::Alloc, addr, size, 0,
                               reinterpret_cast<uintptr_t>(stream), replayed, false, policy,
                               limits});
  }
  Segment* seg = find(addr);
  if (seg == nullptr || size == 0) {
    return false;
  }
  seg->replayed = seg->replayed || replayed;
  const auto [hi, first, last] = seg->span(addr, size);
  ++tick_;
  // Far from the budget nothing will be evicted soon: the eviction order is
  // not kept up to date there (Note [Near the budget]), and a block event
  // costs a few additions per chunk.
  const bool recency =
      policy == Policy::Lru && nearBudget(seg->device, limits.budget, size);
  uint64_t need = 0;
  bool revived = false;
  for (size_t i = first; i < last; ++i) {
    Chunk& c = seg->chunks[i];
    revived = revived || seg->dead(i);
    if (c.scan) {
      // Written by its new block: no longer part of a read-only scan.
      unlink(*seg, i);
      c.scan = false;
      link(*seg, i);
    }
    const uintptr_t clo = seg->chunkAddr(i);
    const auto now_live = static_cast<uint32_t>(std::min<uint64_t>(
        seg->chunkSize(i), c.live + overlap(addr, hi, clo, clo + seg->chunkSize(i))));
    setLive(*seg, i, now_live, recency);
    if (c.where == Where::Host) {
      need += seg->chunkSize(i);
    }
  }
  if (policy != Policy::Lru || !limits.can_act || need == 0) {
    return revived;
  }
  counters_.touches += 1;
  DeviceLru& d = lru(seg->device);
  const uint64_t on_device = d.resident();
  if (on_device + need > limits.budget && !streamsInPlace(size, limits)) {
    makeRoom(seg->device, on_device + need - limits.budget, limits, tick_,
             stream, out);
  }
  // Note [Graph pools: a free is not a death]
  bringIn(*seg, first, last, stream, /*dead_content=*/!seg->replayed, addr,
          hi, limits, out);
  return revived;
}

void Residency::onFree(uintptr_t addr, uint64_t size, bool replayed) {
  if (trace_ != nullptr) {
    TraceRecord r{TraceRecord::Free, addr, size};
    r.flag = replayed;
    trace_->record(r);
  }
  Segment* seg = find(addr);
  if (seg == nullptr || size == 0) {
    return;
  }
  seg->replayed = seg->replayed || replayed;
  const auto [hi, first, last] = seg->span(addr, size);
  if (seg->replayed) {
    // Note [Graph pools: a free is not a death]; an event over a chunk still
    // ends what forget() said of it (Note [Forgotten content]).
    for (size_t i = first; i < last; ++i) {
      unstale(*seg, i);
    }
    return;
  }
  for (size_t i = first; i < last; ++i) {
    Chunk& c = seg->chunks[i];
    const uintptr_t clo = seg->chunkAddr(i);
    const uint64_t gone = overlap(addr, hi, clo, clo + seg->chunkSize(i));
    setLive(*seg, i, static_cast<uint32_t>(c.live > gone ? c.live - gone : 0),
            /*retick=*/false);
  }
}

uint64_t Residency::touch(
    uintptr_t addr,
    uint64_t size,
    int device,
    void* stream,
    Policy policy,
    const DeviceLimits& limits,
    std::vector<Action>& out,
    bool read_only,
    bool hold,
    uint64_t needed_at) {
  if (trace_ != nullptr) {
    TraceRecord r{TraceRecord::Touch, addr, size, device,
                  reinterpret_cast<uintptr_t>(stream), read_only, hold, policy,
                  limits};
    r.needed_at = needed_at;
    trace_->record(r);
  }
  Segment* seg = find(addr);
  if (seg == nullptr || size == 0) {
    return 0;
  }
  const auto [hi, first, last] = seg->span(addr, size);
  if (!limits.can_act) {
    // Nothing moves, but the toucher's write is coming: a forgotten chunk
    // left in the dead order would be discarded over it later.
    for (size_t i = first; i < last; ++i) {
      unstale(*seg, i);
    }
    return 0;
  }
  counters_.touches += 1;
  if (device != seg->device) {
    // The ledger follows each segment on its own device only: a move to
    // another GPU is made as asked, and counted as having left this one.
    for (size_t i = first; i < last; ++i) {
      dropDuplicate(*seg, i, stream, out);
      seg->chunks[i].stale = false; // Note [Forgotten content]; relinked below
      setWhere(*seg, i, Where::Host);
    }
    emit(out, seg->base, Action::PrefetchToDevice, addr, hi - addr, device, stream);
    counters_.prefetch_bytes += hi - addr;
    return hi - addr;
  }
  ++tick_;
  uint64_t need = 0;
  hold = hold && policy == Policy::Lru && seg->tracked && !seg->replayed;
  const bool scan = read_only && !hold && policy == Policy::Lru;
  for (size_t i = first; i < last; ++i) {
    Chunk& c = seg->chunks[i];
    if (c.where != Where::Host) {
      // Note [Forgotten content]: the touch ends it. A chunk in host RAM
      // keeps the mark until bringIn decides how it comes back.
      c.stale = false;
    }
    retouch(*seg, i, scan);
    if (c.where == Where::Host) {
      need += seg->chunkSize(i);
    }
  }
  if (need == 0) {
    if (hold) {
      holdChunks(*seg, first, last, addr, hi);
    }
    return 0;
  }
  DeviceLimits lim = limits;
  if (policy == Policy::Static) {
    // An explicit prefetch under static placement is honoured as asked.
    lim.budget = UINT64_MAX;
  } else {
    DeviceLru& d = lru(seg->device);
    const uint64_t on_device = d.resident();
    if (on_device + need > limits.budget && !streamsInPlace(size, limits)) {
      makeRoom(seg->device, on_device + need - limits.budget, limits, tick_,
               stream, out, needed_at);
    }
  }
  const uint64_t moved = bringIn(*seg, first, last, stream, /*dead_content=*/false,
                                 addr, hi, lim, out, scan && limits.read_copies);
  if (hold) {
    holdChunks(*seg, first, last, addr, hi);
  }
  return moved;
}

bool Residency::onlyRangeLive(const Segment& seg, size_t i, uintptr_t addr,
                              uintptr_t hi) const {
  // The range is live (the caller's word), so its part of the chunk is live,
  // and a chunk with more live bytes than that shares them with another block.
  const Chunk& c = seg.chunks[i];
  const uintptr_t clo = seg.chunkAddr(i);
  return c.live != 0 && c.live == overlap(addr, hi, clo, clo + seg.chunkSize(i));
}

void Residency::holdChunks(Segment& seg, size_t first, size_t last,
                           uintptr_t addr, uintptr_t hi) {
  // Note [Held ranges]: the chunks holding only the range's live bytes, once on
  // the device (bringIn may have left some in host RAM).
  for (size_t i = first; i < last; ++i) {
    Chunk& c = seg.chunks[i];
    if (c.held || c.where == Where::Host || c.stale ||
        !onlyRangeLive(seg, i, addr, hi)) {
      continue;
    }
    unlink(seg, i);
    c.held = true;
    link(seg, i);
    counters_.hold_bytes += seg.chunkSize(i);
  }
}

uint64_t Residency::plan(uintptr_t addr, uint64_t size, uint64_t due) {
  if (trace_ != nullptr) {
    TraceRecord r{TraceRecord::Plan, addr, size};
    r.limits.budget = due;
    trace_->record(r);
  }
  Segment* seg = find(addr);
  if (seg == nullptr || size == 0) {
    return 0;
  }
  const auto [hi, first, last] = seg->span(addr, size);
  uint64_t filed = 0;
  for (size_t i = first; i < last; ++i) {
    Chunk& c = seg->chunks[i];
    // Live on the device and in a plain order: held chunks never leave, a
    // read-only scan keeps Note [Scans]' order, dead ones leave first anyway.
    const OrderKind now = orderOf(*seg, i);
    if (c.due == due || (now != OrderKind::Live && !isPlanned(now))) {
      continue;
    }
    unlink(*seg, i);
    c.due = due;
    link(*seg, i);
    if (due != 0) {
      filed += seg->chunkSize(i);
    }
  }
  counters_.plan_bytes += filed;
  return filed;
}

void Residency::setPlanClock(int device, PlanClock clock) {
  if (trace_ != nullptr) {
    TraceRecord r{TraceRecord::Clock, clock.now, clock.window, device};
    trace_->record(r);
  }
  lru(device).clock = clock;
}

uint64_t Residency::forget(uintptr_t addr, uint64_t size) {
  if (trace_ != nullptr) {
    trace_->record(TraceRecord{TraceRecord::Forget, addr, size});
  }
  Segment* seg = find(addr);
  if (seg == nullptr || size == 0 || !seg->tracked || seg->replayed) {
    return 0;
  }
  const auto [hi, first, last] = seg->span(addr, size);
  uint64_t marked = 0;
  for (size_t i = first; i < last; ++i) {
    Chunk& c = seg->chunks[i];
    const uint64_t sz = seg->chunkSize(i);
    // Every live byte of the chunk must be the range's.
    if (c.stale || !onlyRangeLive(*seg, i, addr, hi)) {
      continue;
    }
    unlink(*seg, i);
    c.stale = true;
    c.held = false; // its content is dead: nothing to hold (Note [Held ranges])
    link(*seg, i);
    marked += sz;
  }
  counters_.forget_bytes += marked;
  return marked;
}

uint64_t Residency::evict(
    uintptr_t addr,
    uint64_t size,
    void* stream,
    const DeviceLimits& limits,
    std::vector<Action>& out) {
  if (trace_ != nullptr) {
    TraceRecord r{TraceRecord::Evict, addr, size, 0, reinterpret_cast<uintptr_t>(stream)};
    r.limits = limits;
    trace_->record(r);
  }
  Segment* seg = find(addr);
  if (seg == nullptr || size == 0 || !limits.can_act) {
    return 0;
  }
  ++tick_; // an operation of its own (eviction batch numbers follow ticks)
  const auto [hi, first, last] = seg->span(addr, size);
  uint64_t moved = 0;
  for (size_t i = first; i < last; ++i) {
    Chunk& c = seg->chunks[i];
    if (c.where == Where::Host) {
      continue;
    }
    moved += leave(*seg, i, limits, out);
  }
  return moved;
}

int Residency::deviceOf(uintptr_t addr) const {
  const Segment* seg = find(addr);
  return seg ? seg->device : -1;
}

uint64_t Residency::bytesOn(int device, Where where) const {
  if (device < 0 || static_cast<size_t>(device) >= devices_.size()) {
    return 0;
  }
  return devices_[device].bytes[static_cast<int>(where)];
}

bool Residency::nearBudget(int device, uint64_t budget, uint64_t extra) const {
  if (device < 0 || static_cast<size_t>(device) >= devices_.size()) {
    return extra > budget / 10 * 9;
  }
  const DeviceLru& d = devices_[device];
  return d.bytes[0] + d.bytes[1] + d.bytes[2] + extra > budget / 10 * 9;
}

// Note [Dead bytes are counted]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The saved-activation offload reads the room under the budget, dead bytes
// counted as free, at every unpack of a saved tensor in the backward
// (torch/cuda/_um_predict.py): 850 reads a step for a 1.1 B Llama. Summed
// over the dead order, each read walked 3000 chunks with a segment lookup
// apiece while holding the engine's lock: 62 ms of a 0.31 s backward
// (bench/README.md, prediction step 35). link/unlink keep the sum instead;
// checkInvariants recounts it. (The offload now also reads the room only
// when an entry may be brought back: PrefetchQueue.pump, _um_plan.py.)
uint64_t Residency::deadOnDevice(int device) const {
  if (device < 0 || static_cast<size_t>(device) >= devices_.size()) {
    return 0;
  }
  return devices_[device].dead_bytes;
}

Where Residency::whereIs(uintptr_t addr) const {
  const Segment* seg = find(addr);
  return seg ? seg->chunks[(addr - seg->base) / kChunkBytes].where
             : Where::Host;
}

Residency::Placement Residency::placement(uintptr_t addr, uint64_t size) const {
  Placement p;
  const Segment* seg = find(addr);
  if (seg == nullptr || size == 0) {
    return p;
  }
  const auto [hi, first, last] = seg->span(addr, size);
  for (size_t i = first; i < last; ++i) {
    const Chunk& c = seg->chunks[i];
    const uintptr_t clo = seg->chunkAddr(i);
    const uint64_t mine = overlap(addr, hi, clo, clo + seg->chunkSize(i));
    p.bytes[static_cast<int>(c.where)] += mine;
    p.held += c.held ? mine : 0;
  }
  return p;
}

std::vector<Residency::Run> Residency::hostRuns(uintptr_t addr, uint64_t size) const {
  std::vector<Run> runs;
  const Segment* seg = find(addr);
  if (seg == nullptr || size == 0 || size > seg->base + seg->size - addr) {
    return runs;
  }
  const auto [hi, first, last] = seg->span(addr, size);
  for (size_t i = first; i < last; ++i) {
    if (seg->chunks[i].where != Where::Host) {
      continue;
    }
    const uintptr_t lo = std::max(addr, seg->chunkAddr(i));
    const uint64_t bytes = std::min<uintptr_t>(hi, seg->chunkAddr(i) + seg->chunkSize(i)) - lo;
    if (!runs.empty() && runs.back().offset + runs.back().bytes == lo - addr) {
      runs.back().bytes += bytes;
    } else {
      runs.push_back(Run{lo - addr, bytes});
    }
  }
  return runs;
}

uint64_t Residency::hostTail(uintptr_t addr, uint64_t size) const {
  const std::vector<Run> runs = hostRuns(addr, size);
  return !runs.empty() && runs.back().offset + runs.back().bytes == size ? runs.back().bytes : 0;
}

std::vector<Residency::Run> Residency::gaps(
    const std::vector<Run>& runs,
    uint64_t size,
    uint64_t most) {
  std::vector<Run> pieces;
  uint64_t at = 0;
  for (size_t i = 0; i <= runs.size(); ++i) {
    const uint64_t end = i < runs.size() ? runs[i].offset : size;
    for (; at < end; at += std::min(most, end - at)) {
      pieces.push_back(Run{at, std::min(most, end - at)});
    }
    if (i < runs.size()) {
      at = runs[i].offset + runs[i].bytes;
    }
  }
  return pieces;
}

uint32_t Residency::liveBytesAt(uintptr_t addr) const {
  const Segment* seg = find(addr);
  return seg ? seg->chunks[(addr - seg->base) / kChunkBytes].live : 0;
}

std::string Residency::checkInvariants() const {
  std::vector<DeviceLru> expect(devices_.size());
  for (const auto& [base, seg] : segments_) {
    if (static_cast<size_t>(seg.device) >= expect.size()) {
      return "segment on an unknown device";
    }
    DeviceLru& e = expect[seg.device];
    for (size_t i = 0; i < seg.chunks.size(); ++i) {
      const Chunk& c = seg.chunks[i];
      if (c.live > seg.chunkSize(i)) {
        return "chunk with more live bytes than its size";
      }
      if (c.stale && (c.live == 0 || !seg.tracked || seg.replayed)) {
        return "a forgotten chunk that holds no forgettable live bytes";
      }
      if (c.held && (c.live == 0 || c.stale || c.where == Where::Host ||
                     !seg.tracked || seg.replayed)) {
        return "a held chunk that is not live on its device";
      }
      e.bytes[static_cast<int>(c.where)] += seg.chunkSize(i);
      if (c.in != orderOf(seg, i)) {
        return "a chunk is not in the eviction order its state says";
      }
      if (devices_[seg.device].ordered && c.in != OrderKind::None &&
          *c.pos != keyOf(seg, i, c.in)) {
        return "a chunk's entry in the eviction order is not its own";
      }
      if (c.where != Where::Host && !c.held) {
        order(e, orderOf(seg, i)).insert(keyOf(seg, i, orderOf(seg, i)));
        if (seg.dead(i)) {
          e.dead_bytes += seg.chunkSize(i);
        }
      }
    }
  }
  for (size_t dev = 0; dev < devices_.size(); ++dev) {
    const DeviceLru& a = devices_[dev];
    const DeviceLru& e = expect[dev];
    for (int w = 0; w < 3; ++w) {
      if (a.bytes[w] != e.bytes[w]) {
        return "device " + std::to_string(dev) + ": byte count of state " +
            std::to_string(w) + " is " + std::to_string(a.bytes[w]) +
            ", chunks say " + std::to_string(e.bytes[w]);
      }
    }
    if (a.ordered && (a.live != e.live || a.scan != e.scan || a.dead != e.dead ||
                      a.planned != e.planned || a.planned_cold != e.planned_cold)) {
      return "device " + std::to_string(dev) + ": eviction order out of date";
    }
    if (!a.ordered &&
        !(a.live.empty() && a.scan.empty() && a.dead.empty() && a.planned.empty() &&
          a.planned_cold.empty())) {
      return "device " + std::to_string(dev) + ": orders hold chunks before they are built";
    }
    if (a.dead_bytes != e.dead_bytes) {
      return "device " + std::to_string(dev) + ": dead bytes are " +
          std::to_string(a.dead_bytes) + ", the dead order holds " +
          std::to_string(e.dead_bytes);
    }
  }
  return "";
}

} // namespace c10::cuda::um
