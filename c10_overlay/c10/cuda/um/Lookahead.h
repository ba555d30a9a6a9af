// A learned order of use: which ranges a program is about to use next.
//
// Note [Learned lookahead]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Training and serving loops repeat: the operators of one step use the same
// storages in the same order as the step before (weights, optimizer state,
// and, because the caching allocator hands the same blocks to the same
// requests, most activations too). The operator use signal (Note [Operator
// use signals], OpSignal.h) reports each operator's storages, in the order
// the operators run; this class keeps that order as a history and, as in
// DeepUM's correlation prefetching (ASPLOS 2023) but at operator and storage
// granularity, predicts the future from the past: when a transition from one
// range to the next happens again, the ranges that followed it last time are
// about to be used again, in that order. The key is the transition, not the
// range alone: a weight is used in the forward, the backward and the update
// of one step, and what came just before it tells those uses apart (keyed by
// the range alone, the prediction restarted at almost every use of a plain-
// tensor training step: bench/results, train-plain, 2026-11-29). The caller brings the predicted ranges in ahead of their use, up to
// a number of bytes in flight (the lookahead), on a stream of its own.
//
// Nothing here needs an iteration boundary, a module or an optimizer: the
// first repeat of any range starts a prediction, and a program whose pattern
// changes (another shape, inference between training steps) stops matching
// its history, which ends the prediction until the new pattern repeats. A
// wrong prediction costs link time and device room, never data: a bring-in is
// a prefetch, coherent with every access (Note [Executor: ordering]).
//
// The path: `cursor_` is the last history position already handed out along
// the current prediction. A use that matches the position just after the
// previous match (or anywhere up to the cursor) continues the path; any other
// match starts a new one from that position. Bytes moved ahead are kept per
// handed-out position and released once the program's own use reaches it, so
// that what is in flight ahead stays under the lookahead.
//
// Note [Predicted next use]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// The same history says when each range is needed next, which is what an
// eviction order needs (Belady's rule: the victim is the data whose next use
// is farthest; Note [The learned eviction order], Residency.h). Along a path
// the range's own position P (an operator's k-th range is recorded k
// positions after its first: until step 55 every range was taken at the
// first's, so an operator's later ranges were predicted at their own use,
// overdue right after it and the first to leave) corresponds to P - shift
// in the history, where
// shift is the distance between the last match and the position it matched
// (one period of the loop). The uses of a range r in the history after that
// point are its uses in the last period from "now" on; the first of them, g,
// predicts r's next use at g + shift. A range used once a period (a weight
// in a plain scan, the optimizer state) is predicted one period ahead, a
// saved activation at its use in the backward, a weight of the forward at
// its use in the backward, and so on, with no notion of what the data is.
// Each use links to the range's use before it (prev_), so the search walks
// back from r's last use, at most kWalk uses: a range used that often a
// period is hot, predicted at the spacing of its last two uses. A prediction
// is renewed at every use: an op and the op it dispatches to (a local
// repeat) predict each other, and the second predicts the next real use. Off
// a path (no match for max_steps positions: a new pattern, the first period)
// nothing is predicted, and the caller's plain order decides.
//
// Note [Counterparts]
// ~~~~~~~~~~~~~~~~~~~
// Keyed by addresses alone, the history cannot predict the second step from
// the first: the caching allocator hands the first steps' blocks to other
// tensors (of train-plain's 459 operators a step, 102 used their
// counterpart's ranges in step 2, all from step 6; step 2 evicted twice the
// steady bytes, 8.9 GiB of them chosen by wrong plans; step-54 lab note). So
// each use also carries an identity: what the call looks like (each
// argument's kind, each tensor's dtype, shape and strides) and the
// argument's place in it, not its address (`Range::id`, from the operator
// signal). Three things follow.
// - Mixed transitions: where the exact transition (both addresses) has not
//   been seen, a transition whose one side has the same address and the
//   other the same identity matches too: the activation entering a layer's
//   matmul is new, the layer's weight is not, so the second step's forward
//   finds the first step's at its first layer, one period back. Identities
//   alone would not do: the layers of a model are alike, and only the
//   weights' addresses tell them apart; a weight's use in the backward is a
//   call of another shape (a transposed view, other arguments) than in the
//   forward, so it does not match its forward use.
// - Counterparts: the range used at position P on a path corresponds to the
//   one used at P - shift, a period ago; each use links forward to the next
//   use of its address (next_). A range whose counterpart has its identity
//   but another address (its block is new, or was another tensor's) is
//   predicted next used where its counterpart was: next_[P - shift] + shift
//   (one period on if the counterpart was not used again); the address's own
//   history would name another tensor's next use.
// - Continuation: on a path, a use whose identity and its predecessor's are
//   those of the uses a period ago continues the path there, whatever another
//   occurrence of its transition says. Alike layers whose blocks were handed
//   around match each other's transitions one or more layers off, and a
//   match taken from them would misalign every prediction after it. (A rule
//   that let the farther of the two win broke the plain-tensor step's path
//   in its second and third steps; step 56.)
//
// Note [Bursts of use]
// ~~~~~~~~~~~~~~~~~~~~
// The same history tells a range used in one burst a period from one used
// across it: a momentum a hand-written update reads and writes in three
// operators in a row, then not until the next update, against a weight used
// in the forward, the backward and the update. Past the budget the first
// kind leaves the device after every burst and comes back before the next,
// and what it costs depends only on how it travels (Note [State one burst a
// period writes is staged by copy], Stage.h). burst() takes r's uses in the
// last period (walked back as due() walks them) with this one, as points on
// a circle one period around, and calls them a burst when the widest gap
// between neighbours is at least seven eighths of the period; this use is
// the burst's last when that gap is the one that follows it. A range used
// once a period has no burst to stage (one use, no gain over the plain
// touch), and a range used more than kWalk times a period is hot.
//
// Pure C++ (no CUDA): tested on the CPU in tests/engine/lookahead_test.cpp.
// Not thread-safe: the caller serialises use() per device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

namespace c10::cuda::um {

// Folds v into the hash h (the keys of the learned order and the identities
// of Note [Counterparts], computed by the operator signal).
inline uint64_t hashMix(uint64_t h, uint64_t v) {
  constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
  h ^= v + kGolden + (h << 6) + (h >> 2);
  return h * kGolden;
}

// Positions of the learned order, for an order by predicted use (Note [The
// learned eviction order], Residency.h): `now` is the next position to be
// recorded; `window` the predicted position of the last range handed out
// ahead (0 off a path). A prediction earlier than `now` was missed.
struct PlanClock {
  uint64_t now = 0;
  uint64_t window = 0;
};

class Lookahead {
 public:
  struct Range {
    uintptr_t addr = 0;
    uint64_t size = 0;
    // What uses it, not where it is (Note [Counterparts]): a hash of the
    // call's signature and the argument's place in it; 0 unknown. Not part
    // of equality: the same storage is one range under every operator.
    uint64_t id = 0;
    bool operator==(const Range& o) const {
      return addr == o.addr && size == o.size;
    }
  };

  // `capacity`: the history kept (positions); a loop longer than it in
  // distinct uses is not predicted. `max_steps`: the most history positions
  // one use() may hand out, which bounds its host time.
  explicit Lookahead(size_t capacity = 1u << 16, size_t max_steps = 64);

  // The operator about to run uses `ranges` (in argument order). Records
  // them, then hands the ranges predicted to follow to `ahead`, in predicted
  // order, while the bytes moved ahead and not yet used stay under
  // `lookahead_bytes`. `ahead(range, due)` brings the range in and returns
  // the bytes it asked to move (0 when it was on the device already); `due`
  // is the position of its predicted use (Note [Predicted next use]).
  template <class Ahead>
  void use(const Range* ranges, size_t n, uint64_t lookahead_bytes, Ahead&& ahead) {
    recorded_ = 0;
    bool matched = false;
    for (size_t i = 0; i < n; ++i) {
      matched = record(ranges[i]) || matched;
    }
    if (!matched || lookahead_bytes == 0) {
      return;
    }
    release(match_);
    const uint64_t limit = pos_ - recorded_; // never predict into the present
    size_t steps = 0;
    for (uint64_t p = cursor_ + 1; in_flight_ < lookahead_bytes && steps < max_steps_ &&
         p < limit && held(p);
         ++p, ++steps) {
      const uint64_t moved = ahead(at(p), p + shift_);
      if (moved > 0) {
        flight_.push_back({p, moved});
        in_flight_ += moved;
        counters_.ahead_bytes += moved;
      }
      counters_.ahead_ranges += 1;
      cursor_ = p;
    }
  }

  // Note [Predicted next use]: the position at which r, used now (before
  // use() records it) as the k-th range of its operator, is predicted to be
  // used next; 0 off a path.
  uint64_t due(const Range& r, uint64_t k = 0) const;
  // Note [Bursts of use]: whether r, used now as the k-th range of its
  // operator (before use() records it), is used in one burst a period (all
  // its uses of the last period, with this one, lie within an eighth of the
  // period), and whether this use is the burst's last. Both false off a path,
  // for a range not used before in the last period, and for a hot one.
  struct Burst {
    bool burst = false;
    bool last = false;
  };
  Burst burst(const Range& r, uint64_t k = 0) const;
  // The positions now (PlanClock).
  PlanClock clock() const {
    return PlanClock{pos_, onPath() ? cursor_ + shift_ : 0};
  }

  struct Counters {
    uint64_t uses = 0; // ranges recorded (consecutive repeats folded)
    uint64_t matches = 0; // of which had been used before, still in the history
    uint64_t mixed = 0; // of the matches, by a mixed transition (Note [Counterparts])
    uint64_t counterparts = 0; // predictions made from a counterpart
    uint64_t paths = 0; // predictions started (a match off the current path)
    uint64_t ahead_ranges = 0; // ranges handed to `ahead`
    uint64_t ahead_bytes = 0; // bytes they asked to move
  };
  const Counters& counters() const {
    return counters_;
  }
  uint64_t inFlight() const {
    return in_flight_;
  }

 private:
  static constexpr uint64_t kLocal = 4; // positions of a local repeat
  static constexpr int kWalk = 16; // uses due() looks back over
  bool onPath() const {
    return shift_ != 0 && pos_ - matched_at_ <= max_steps_;
  }
  static uint64_t key(const Range& prev, const Range& r);
  // Mixed transitions (Note [Counterparts]): prev by identity and r by
  // address, or prev by address and r by identity.
  static uint64_t keyIdAddr(const Range& prev, const Range& r);
  static uint64_t keyAddrId(const Range& prev, const Range& r);
  // The last position of a mixed transition that matches (prev, r), or 0.
  uint64_t mixedMatch(const Range& prev, const Range& r) const;
  // Records r; true if it matched an earlier use (then match_ and cursor_
  // follow it).
  bool record(const Range& r);
  // Bytes handed out at positions up to `p` are now being used.
  void release(uint64_t p);
  bool held(uint64_t p) const {
    return p < pos_ && pos_ - p <= hist_.size();
  }
  const Range& at(uint64_t p) const {
    return hist_[p % hist_.size()];
  }

  std::vector<Range> hist_; // ring; position p at hist_[p % size]
  // The range's use before position p (0: none held), beside hist_.
  std::vector<uint64_t> prev_;
  // Its use after p (0: none yet), beside hist_ (Note [Counterparts]).
  std::vector<uint64_t> next_;
  // A range's start -> its last position (Note [Predicted next use]).
  std::unordered_map<uintptr_t, uint64_t> last_;
  uint64_t shift_ = 0; // last match's position - the position it matched
  uint64_t matched_at_ = 0; // and its position
  uint64_t pos_ = 1; // next position; 0 means "none"
  uint64_t recorded_ = 0; // positions the current use() recorded
  // The transition (range before, range) -> its last position.
  std::unordered_map<uint64_t, uint64_t> seen_;
  // The mixed transitions -> their last position (Note [Counterparts]).
  std::unordered_map<uint64_t, uint64_t> seen_mixed_;
  uint64_t match_ = 0; // history position the last match found
  uint64_t cursor_ = 0; // last position handed out along the path
  struct Flight {
    uint64_t pos;
    uint64_t bytes;
  };
  std::deque<Flight> flight_;
  uint64_t in_flight_ = 0;
  size_t max_steps_;
  mutable Counters counters_; // due() counts its counterparts
};

} // namespace c10::cuda::um
