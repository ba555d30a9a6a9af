#include <c10/cuda/um/Lookahead.h>

namespace c10::cuda::um {

Lookahead::Lookahead(size_t capacity, size_t max_steps)
    : hist_(capacity < 2 ? 2 : capacity), max_steps_(max_steps) {}

void Lookahead::reset() {
  seen_.clear();
  pos_ = 1;
  recorded_ = 0;
  match_ = 0;
  cursor_ = 0;
  flight_.clear();
  in_flight_ = 0;
}

uint64_t Lookahead::key(const Range& prev, const Range& r) {
  // The transition prev -> r, not r alone: a storage used several times a
  // step (a weight in the forward, the backward and the update) is told apart
  // by what came just before it (Note [Learned lookahead]).
  return (static_cast<uint64_t>(r.addr) ^ (r.size << 1)) ^
      ((static_cast<uint64_t>(prev.addr) + prev.size) * 0x9E3779B97F4A7C15ull);
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
  hist_[pos_ % hist_.size()] = r;
  seen_[k] = pos_;
  ++pos_;
  ++recorded_;
  if (seen_.size() > 4 * hist_.size()) {
    // Transitions that left the history predict nothing: keep the map bounded.
    for (auto it = seen_.begin(); it != seen_.end();) {
      it = held(it->second) ? std::next(it) : seen_.erase(it);
    }
  }
  if (q == 0) {
    return false;
  }
  counters_.matches += 1;
  const bool on_path = match_ != 0 && q > match_ && q <= cursor_ + 1;
  if (!on_path) {
    // Another place in the history. Bytes handed out at or before it have
    // been used; those after it stay counted until the new path reaches
    // them, unless the program went back (a new step: all were used or
    // left).
    counters_.paths += 1;
    if (q < match_) {
      flight_.clear();
      in_flight_ = 0;
    }
    cursor_ = q;
  } else if (q > cursor_) {
    cursor_ = q;
  }
  match_ = q;
  return true;
}

void Lookahead::release(uint64_t p) {
  while (!flight_.empty() && flight_.front().pos <= p) {
    in_flight_ -= flight_.front().bytes;
    flight_.pop_front();
  }
}

} // namespace c10::cuda::um
