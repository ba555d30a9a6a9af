#include <c10/cuda/um/Lookahead.h>

#include <algorithm>

namespace c10::cuda::um {

Lookahead::Lookahead(size_t capacity, size_t max_steps)
    : hist_(capacity < 2 ? 2 : capacity),
      prev_(hist_.size(), 0),
      next_(hist_.size(), 0),
      max_steps_(max_steps) {}

uint64_t Lookahead::key(const Range& prev, const Range& r) {
  // The transition prev -> r, not r alone: a storage used several times a
  // step (a weight in the forward, the backward and the update) is told apart
  // by what came just before it (Note [Learned lookahead]).
  return (static_cast<uint64_t>(r.addr) ^ (r.size << 1)) ^
      ((static_cast<uint64_t>(prev.addr) + prev.size) * 0x9E3779B97F4A7C15ull);
}

uint64_t Lookahead::keyIdAddr(const Range& prev, const Range& r) {
  return hashMix(hashMix(prev.id, 1), hashMix(r.addr, r.size));
}

uint64_t Lookahead::keyAddrId(const Range& prev, const Range& r) {
  return hashMix(hashMix(prev.addr, prev.size), hashMix(r.id, 2));
}

uint64_t Lookahead::mixedMatch(const Range& prev, const Range& r) const {
  // Note [Counterparts]: one side by address, the other by identity; the
  // identities must be known (an unknown one matches nothing).
  if (prev.id != 0) {
    if (auto it = seen_mixed_.find(keyIdAddr(prev, r)); it != seen_mixed_.end()) {
      const uint64_t q = it->second;
      if (q > 1 && held(q) && held(q - 1) && at(q) == r && at(q).id == r.id &&
          at(q - 1).id == prev.id) {
        return q;
      }
    }
  }
  if (r.id != 0) {
    if (auto it = seen_mixed_.find(keyAddrId(prev, r)); it != seen_mixed_.end()) {
      const uint64_t q = it->second;
      if (q > 1 && held(q) && held(q - 1) && at(q - 1) == prev && at(q - 1).id == prev.id &&
          at(q).id == r.id) {
        return q;
      }
    }
  }
  return 0;
}

bool Lookahead::record(const Range& r) {
  if (r.size == 0) {
    return false;
  }
  const bool has_prev = held(pos_ - 1);
  const Range prev = has_prev ? at(pos_ - 1) : Range{};
  if (has_prev && prev == r) {
    return false; // a repeat of the range just recorded says nothing new
  }
  counters_.uses += 1;
  const uint64_t k = key(prev, r);
  uint64_t q = 0;
  if (auto it = seen_.find(k); it != seen_.end() && held(it->second) &&
      at(it->second) == r && it->second > 1 && held(it->second - 1) &&
      at(it->second - 1) == prev) {
    q = it->second;
  }
  bool mixed = false;
  if (q == 0 && has_prev) {
    q = mixedMatch(prev, r);
    mixed = q != 0;
  }
  // Note [Counterparts]: on a path, a use like the one a period ago (same
  // identities, this one and the one before) continues the path there,
  // whatever another occurrence of its transition says: alike layers whose
  // blocks were handed around match each other's transitions, one or more
  // layers off, and would misalign every prediction after them. (Step 55
  // let a farther match win instead; the plain-tensor step then lost its
  // path 14 times in step 2 and 5 in step 3, against 2 and 0, and called
  // off 4-5 GiB of queued moves there against 0.8: step 56.)
  if (has_prev && onPath() && shift_ < pos_ && r.id != 0 && prev.id != 0) {
    const uint64_t e = pos_ - shift_;
    if (e > 1 && held(e) && held(e - 1) && at(e).id == r.id && at(e).size == r.size &&
        at(e - 1).id == prev.id && q != e) {
      mixed = mixed || q == 0 || !(at(e) == r);
      q = e;
    }
  }
  // A transition repeated within a few positions (an op and the op it
  // dispatches to report the same arguments) says nothing about the loop:
  // the earlier occurrence stays the one remembered, so that the next step
  // matches it, in order, instead of jumping between the two.
  const bool local = q != 0 && pos_ - q <= kLocal;
  hist_[pos_ % hist_.size()] = r;
  uint64_t before = 0;
  if (auto [it, fresh] = last_.try_emplace(r.addr, pos_); !fresh) {
    before = held(it->second) && at(it->second) == r ? it->second : 0;
    it->second = pos_;
  }
  prev_[pos_ % hist_.size()] = before;
  next_[pos_ % hist_.size()] = 0;
  if (before != 0) {
    next_[before % hist_.size()] = pos_;
  }
  if (!local) {
    seen_[k] = pos_;
    if (has_prev && prev.id != 0) {
      seen_mixed_[keyIdAddr(prev, r)] = pos_;
    }
    if (has_prev && r.id != 0) {
      seen_mixed_[keyAddrId(prev, r)] = pos_;
    }
  }
  ++pos_;
  ++recorded_;
  if (local) {
    return false;
  }
  if (seen_.size() > 4 * hist_.size() || seen_mixed_.size() > 8 * hist_.size()) {
    // Transitions that left the history predict nothing: keep the map bounded.
    for (auto it = seen_.begin(); it != seen_.end();) {
      it = held(it->second) ? std::next(it) : seen_.erase(it);
    }
    for (auto it = seen_mixed_.begin(); it != seen_mixed_.end();) {
      it = held(it->second) ? std::next(it) : seen_mixed_.erase(it);
    }
    for (auto it = last_.begin(); it != last_.end();) {
      it = held(it->second) ? std::next(it) : last_.erase(it);
    }
  }
  if (q == 0) {
    return false;
  }
  counters_.matches += 1;
  counters_.mixed += mixed ? 1 : 0;
  matched_at_ = pos_ - 1;
  shift_ = matched_at_ - q;
  // Near the path: a transition that occurs twice close together (an op and
  // the op it dispatches to, both reporting the same arguments) matches its
  // later occurrence first and its earlier one next, a small step back. Only
  // a jump far from the path starts a new one, and only a jump far back (the
  // next step of a loop) drops what was handed out along the old one (left
  // counted, a restart at every such pair moved 19 GiB ahead a step of
  // train-plain, 2026-11-29).
  const uint64_t slack = max_steps_;
  const bool near = match_ != 0 && q + slack >= match_ && q <= cursor_ + slack;
  if (!near) {
    counters_.paths += 1;
    if (match_ != 0 && q + slack < match_) {
      flight_.clear();
      in_flight_ = 0;
    }
    cursor_ = q;
    match_ = q;
  } else {
    cursor_ = std::max(cursor_, q);
    match_ = std::max(match_, q);
  }
  return true;
}

uint64_t Lookahead::due(const Range& r, uint64_t k) const {
  // Note [Predicted next use]
  if (!onPath() || pos_ <= shift_) {
    return 0;
  }
  // This use's own position (the operator's k-th range is recorded k
  // positions after its first), and that position a period ago: a range's
  // use in the last period at or before it is this use's counterpart, not
  // its next use.
  const uint64_t here = pos_ + k;
  const uint64_t from = here - shift_;
  // Note [Counterparts]: `from` holds the use a period ago at this
  // position. The same identity at another address: the tensor moved (its
  // block went to another tensor, or it has a new one), and the counterpart
  // says when it is used next, not the address's own history.
  if (r.id != 0 && from < pos_ && held(from) && !(at(from) == r) && at(from).id == r.id &&
      at(from).size == r.size) {
    const uint64_t n = next_[from % hist_.size()];
    counters_.counterparts += 1;
    if (n > from && held(n) && at(n) == at(from)) {
      return n + shift_;
    }
    return here + shift_; // not used again in the period
  }
  uint64_t g = 0; // r's first use in the last period after now
  const auto it = last_.find(r.addr);
  if (it != last_.end()) {
    uint64_t p = it->second;
    for (int steps = 0; p > from && held(p) && at(p) == r; ++steps) {
      if (steps == kWalk) {
        // Used that often a period: hot, next at its last spacing.
        return pos_ + (pos_ - it->second);
      }
      g = p;
      p = prev_[p % hist_.size()];
    }
  }
  return (g != 0 ? g : here) + shift_; // none in the last period: one period on
}

Lookahead::Burst Lookahead::burst(const Range& r, uint64_t k) const {
  // Note [Bursts of use]
  Burst b;
  if (!onPath() || pos_ <= shift_) {
    return b;
  }
  const auto it = last_.find(r.addr);
  if (it == last_.end()) {
    return b;
  }
  const uint64_t here = pos_ + k;
  const uint64_t from = here - shift_; // this use's counterpart a period ago
  uint64_t first = here; // the period's earliest use, walking back
  uint64_t widest = 0; // the widest gap between neighbouring uses in it
  int uses = 0;
  for (uint64_t p = it->second; p > from && held(p) && at(p) == r; p = prev_[p % hist_.size()]) {
    if (++uses > kWalk) {
      return b; // hot
    }
    widest = std::max(widest, first - p);
    first = p;
  }
  if (uses == 0) {
    return b;
  }
  // From this use round to the period's first use, one period on.
  const uint64_t after = first + shift_ - here;
  b.burst = std::max(widest, after) * 8 >= shift_ * 7;
  b.last = b.burst && after >= widest;
  return b;
}

void Lookahead::release(uint64_t p) {
  while (!flight_.empty() && flight_.front().pos <= p) {
    in_flight_ -= flight_.front().bytes;
    flight_.pop_front();
  }
}

} // namespace c10::cuda::um
