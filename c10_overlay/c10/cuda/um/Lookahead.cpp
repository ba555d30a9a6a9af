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

bool Lookahead::record(const Range& r) {
  if (r.size == 0) {
    return false;
  }
  if (held(pos_ - 1) && at(pos_ - 1) == r) {
    return false; // a repeat of the range just recorded says nothing new
  }
  counters_.uses += 1;
  uint64_t q = 0;
  if (auto it = seen_.find(r.addr); it != seen_.end() && held(it->second) &&
      at(it->second) == r) {
    q = it->second;
  }
  hist_[pos_ % hist_.size()] = r;
  seen_[r.addr] = pos_;
  ++pos_;
  ++recorded_;
  if (seen_.size() > 4 * hist_.size()) {
    // Addresses that left the history predict nothing: keep the map bounded.
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
    // Another place in the history: what was handed out along the old path
    // is not known to come next any more.
    counters_.paths += 1;
    flight_.clear();
    in_flight_ = 0;
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
