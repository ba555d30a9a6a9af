// Drives the learned lookahead (c10_overlay/c10/cuda/um/Lookahead.h) with
// sequences of operator uses and checks what it predicts:
//   - nothing on the first pass over a loop, the next ranges in order from the
//     second pass's second use (the transition is the key), up to the bytes in
//     flight;
//   - a range used twice a step is predicted from what came before it;
//   - bytes handed out ahead are released as the program's uses reach them,
//     so a repeated loop keeps predicting at every step;
//   - ranges already on the device cost nothing and do not stop the walk;
//   - a changed pattern stops the prediction, and it resumes once the new
//     pattern repeats;
//   - the walk is bounded by max_steps and never hands out the present op;
//   - the predicted next use (Note [Predicted next use]): one period on in a
//     scan, the next use in the step for a range used twice, the handed-out
//     ranges at their positions, nothing off a path;
//   - Note [Counterparts]: a pass whose activations have new addresses is
//     found by its weights and predicted from the pass before.
// Built and run by tests/unit/test_engine_lookahead.py; no GPU, no torch.
#include "check.h"
#include <c10/cuda/um/Lookahead.h>

#include <cstdio>
#include <random>
#include <set>
#include <vector>

using namespace c10::cuda::um;
using Range = Lookahead::Range;

namespace {

using engine_test::g_failures;

constexpr uint64_t kMiB = 1ull << 20;

Range R(int i, uint64_t size = 64 * kMiB) {
  return Range{0x100000000ull + static_cast<uintptr_t>(i) * (1ull << 30), size};
}

// A simulated device: ranges in `host` move when handed out ahead.
struct Sim {
  std::set<uintptr_t> host;
  std::vector<uintptr_t> order; // every range handed to `ahead`, in order
  std::vector<uint64_t> dues; // and the position of its predicted use
  uint64_t operator()(const Range& r, uint64_t due) {
    order.push_back(r.addr);
    dues.push_back(due);
    if (host.erase(r.addr) != 0) {
      return r.size;
    }
    return 0;
  }
};

void op(Lookahead& la, Sim& sim, std::vector<Range> rs, uint64_t lookahead) {
  la.use(rs.data(), rs.size(), lookahead, [&](const Range& r, uint64_t due) { return sim(r, due); });
}

bool first_pass_predicts_nothing_then_the_next_ranges_in_order() {
  Lookahead la;
  Sim sim;
  for (int i = 0; i < 8; ++i) {
    op(la, sim, {R(i)}, 1ull << 40);
  }
  CHECK(sim.order.empty(), "first pass handed out %zu ranges", sim.order.size());
  for (int i = 0; i < 8; ++i) {
    sim.host.insert(R(i).addr);
  }
  // R7 -> R0 never happened: the transition, not the range, is the key.
  op(la, sim, {R(0)}, 3 * 64 * kMiB);
  CHECK(sim.order.empty(), "R7 -> R0 matched a transition never seen");
  op(la, sim, {R(1)}, 3 * 64 * kMiB);
  CHECK(sim.order.size() == 3, "handed out %zu, want 3 (the lookahead)", sim.order.size());
  CHECK(sim.order[0] == R(2).addr && sim.order[1] == R(3).addr && sim.order[2] == R(4).addr,
        "not the ranges that followed R0 -> R1 last time, in order");
  CHECK(la.inFlight() == 3 * 64 * kMiB, "in flight %llu", (unsigned long long)la.inFlight());
  return true;
}

bool used_ranges_release_their_bytes_and_the_walk_goes_on() {
  Lookahead la;
  Sim sim;
  for (int step = 0; step < 4; ++step) {
    for (int i = 0; i < 16; ++i) {
      if (step > 0) {
        // What was handed out ahead is on the device; the rest went back.
        for (int j = 0; j < 16; ++j) {
          if (j != i) {
            sim.host.insert(R(j).addr);
          }
        }
        sim.host.erase(R(i).addr);
      }
      sim.order.clear();
      op(la, sim, {R(i)}, 2 * 64 * kMiB);
      if (step >= 1 && i >= 1 && i < 14) {
        CHECK(!sim.order.empty(), "step %d op %d: nothing handed out", step, i);
        CHECK(sim.order.back() == R(i + 2).addr || sim.order.back() == R(i + 1).addr,
              "step %d op %d: handed out range %llx", step, i,
              (unsigned long long)sim.order.back());
      }
    }
  }
  CHECK(la.counters().paths <= 2, "the path restarted %llu times in a steady loop",
        (unsigned long long)la.counters().paths);
  return true;
}

bool ranges_on_the_device_cost_nothing() {
  Lookahead la;
  Sim sim;
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < 10; ++i) {
      if (pass == 1 && i == 1) {
        sim.host.insert(R(9).addr); // only the last is off the device
      }
      op(la, sim, {R(i)}, 64 * kMiB);
      if (pass == 1 && i == 1) {
        CHECK(sim.order.size() == 8, "walked %zu ranges, want 8 to reach R9", sim.order.size());
        CHECK(sim.host.empty(), "R9 was not brought in");
      }
    }
  }
  return true;
}

bool a_changed_pattern_stops_then_resumes() {
  Lookahead la;
  Sim sim;
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < 6; ++i) {
      op(la, sim, {R(i)}, 1ull << 40);
    }
  }
  // A new pattern of new ranges: no prediction on its first pass.
  sim.order.clear();
  for (int i = 100; i < 106; ++i) {
    op(la, sim, {R(i)}, 1ull << 40);
  }
  CHECK(sim.order.empty(), "predicted %zu ranges for ranges never seen", sim.order.size());
  sim.order.clear();
  op(la, sim, {R(100)}, 1ull << 40);
  op(la, sim, {R(101)}, 1ull << 40);
  CHECK(!sim.order.empty() && sim.order.front() == R(102).addr,
        "the new pattern's repeat did not predict R102");
  // Same address, another size: not the same range.
  sim.order.clear();
  op(la, sim, {R(102)}, 1ull << 40);
  sim.order.clear();
  op(la, sim, {R(103, 8 * kMiB)}, 1ull << 40);
  CHECK(sim.order.empty(), "a range of another size matched");
  return true;
}

bool the_walk_is_bounded_and_never_reaches_the_present() {
  Lookahead la(1u << 12, 5);
  Sim sim;
  for (int i = 0; i < 100; ++i) {
    op(la, sim, {R(i)}, 1ull << 40);
  }
  op(la, sim, {R(0), R(1)}, 1ull << 40);
  CHECK(sim.order.size() <= 5, "one use walked %zu positions past max_steps", sim.order.size());
  // A loop of two ranges: the walk stops before the ranges just recorded.
  Lookahead small;
  Sim s2;
  for (int k = 0; k < 6; ++k) {
    op(small, s2, {R(1)}, 1ull << 40);
    op(small, s2, {R(2)}, 1ull << 40);
  }
  CHECK(s2.order.size() < 12, "a two-range loop walked %zu times", s2.order.size());
  // Zero-sized ranges are not recorded; consecutive repeats fold.
  Lookahead z;
  Sim s3;
  op(z, s3, {R(5, 0), R(6), R(6)}, 1ull << 40);
  CHECK(z.counters().uses == 1, "uses %llu, want 1", (unsigned long long)z.counters().uses);
  return true;
}

bool a_range_used_twice_a_step_follows_its_context() {
  // A step: W used in the forward (after X), again in the update (after M).
  Sim sim;
  const int X = 1, W = 2, Y = 3, M = 4, Z = 5;
  const std::vector<int> step = {X, W, Y, M, W, Z};
  Lookahead fresh;
  for (int pass = 0; pass < 2; ++pass) {
    for (int i : step) {
      op(fresh, sim, {R(i)}, 0);
    }
  }
  op(fresh, sim, {R(X)}, 0);
  op(fresh, sim, {R(W)}, 0);
  op(fresh, sim, {R(Y)}, 0);
  op(fresh, sim, {R(M)}, 0);
  sim.order.clear();
  op(fresh, sim, {R(W)}, 1ull << 40);
  CHECK(!sim.order.empty() && sim.order.front() == R(Z).addr,
        "after M -> W the update's successor Z was not predicted first");
  // And X -> W is the forward's: Y comes next.
  Lookahead again;
  for (int pass = 0; pass < 2; ++pass) {
    for (int i : step) {
      op(again, sim, {R(i)}, 0);
    }
  }
  op(again, sim, {R(X)}, 0);
  sim.order.clear();
  op(again, sim, {R(W)}, 1ull << 40);
  CHECK(!sim.order.empty() && sim.order.front() == R(Y).addr,
        "after X -> W the forward's successor Y was not predicted first");
  return true;
}

bool pairs_repeated_within_a_step_keep_one_path() {
  // Each layer reports (h, W) twice (matmul, then the mm it dispatches to):
  // the second pass's uses match the first's, a little back and forth.
  Lookahead la;
  Sim sim;
  const int steps = 6;
  for (int s = 0; s < steps; ++s) {
    for (int layer = 0; layer < 24; ++layer) {
      const int h = 100 + layer, w = 200 + layer;
      op(la, sim, {R(h), R(w)}, 4 * 64 * kMiB);
      op(la, sim, {R(h), R(w)}, 4 * 64 * kMiB);
      op(la, sim, {R(h + 1)}, 4 * 64 * kMiB);
    }
  }
  CHECK(la.counters().paths <= static_cast<uint64_t>(steps), "the path restarted %llu times in %d steps",
        (unsigned long long)la.counters().paths, steps);
  return true;
}

bool a_history_shorter_than_the_loop_predicts_nothing() {
  Lookahead la(8, 64);
  Sim sim;
  for (int pass = 0; pass < 3; ++pass) {
    for (int i = 0; i < 20; ++i) {
      op(la, sim, {R(i)}, 1ull << 40);
    }
  }
  CHECK(sim.order.empty(), "predicted from positions that left the history");
  CHECK(la.counters().matches == 0, "matched %llu", (unsigned long long)la.counters().matches);
  return true;
}

bool a_scan_is_next_used_one_period_on() {
  Lookahead la;
  Sim sim;
  for (int i = 0; i < 8; ++i) {
    CHECK(la.due(R(i)) == 0, "first pass predicted a use of %d", i);
    op(la, sim, {R(i)}, 0);
  }
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < 8; ++i) {
      const uint64_t now = la.clock().now;
      const uint64_t due = la.due(R(i));
      // The second pass's path starts at its second use (the first
      // transition that repeats); from then on the next use is a period (8
      // uses) on.
      if (pass == 1 || i > 1) {
        CHECK(due == now + 8, "pass %d range %d: due %llu, want now %llu + 8", pass + 2, i,
              (unsigned long long)due, (unsigned long long)now);
      }
      op(la, sim, {R(i)}, 0);
    }
  }
  // What is handed out ahead is due where the loop will use it: the next
  // ranges at the next positions, and the window ends at the last of them.
  const uint64_t now = la.clock().now;
  sim.order.clear();
  sim.dues.clear();
  op(la, sim, {R(0)}, 3 * 64 * kMiB);
  CHECK(sim.order.size() >= 3, "handed out %zu", sim.order.size());
  for (size_t k = 0; k < sim.order.size(); ++k) {
    CHECK(sim.order[k] == R(static_cast<int>(k) + 1).addr && sim.dues[k] == now + 1 + k,
          "ahead %zu: range %llx due %llu, want range %d due %llu", k,
          (unsigned long long)sim.order[k], (unsigned long long)sim.dues[k],
          static_cast<int>(k) + 1, (unsigned long long)(now + 1 + k));
  }
  CHECK(la.clock().window == sim.dues.back(), "window %llu, last handed out due %llu",
        (unsigned long long)la.clock().window, (unsigned long long)sim.dues.back());
  return true;
}

bool a_burst_is_told_from_uses_across_the_period() {
  // A plain training step of 8 layers: the forward uses each weight after
  // the activation, the backward each weight again, and the update each
  // momentum M three times in a row (mul_, add_ with the gradient, sub_ from
  // the weight). A gradient G is used once (add_).
  Lookahead la;
  Sim sim;
  constexpr int kLayers = 8;
  auto W = [](int i) { return 100 + i; };
  auto M = [](int i) { return 200 + i; };
  auto G = [](int i) { return 300 + i; };
  auto A = [](int i) { return 400 + i; };
  struct Seen {
    Lookahead::Burst first, middle, last, weight, gradient;
  };
  Seen seen{};
  auto step = [&](bool look) {
    for (int i = 0; i < kLayers; ++i) {
      op(la, sim, {R(A(i)), R(W(i))}, 0);
    }
    for (int i = kLayers - 1; i >= 0; --i) {
      op(la, sim, {R(A(i)), R(W(i))}, 0);
    }
    for (int i = 0; i < kLayers; ++i) {
      if (look && i == 3) {
        seen.first = la.burst(R(M(i)));
        seen.gradient = la.burst(R(G(i)), 1);
      }
      op(la, sim, {R(M(i))}, 0);
      if (look && i == 3) {
        seen.middle = la.burst(R(M(i)));
      }
      op(la, sim, {R(M(i)), R(G(i))}, 0);
      if (look && i == 3) {
        seen.last = la.burst(R(M(i)), 1);
        seen.weight = la.burst(R(W(i)));
      }
      op(la, sim, {R(W(i)), R(M(i))}, 0);
    }
  };
  step(false);
  CHECK(!la.burst(R(M(3))).burst, "a burst was found in the first period");
  step(false);
  step(true);
  CHECK(seen.first.burst && !seen.first.last, "the burst's first use: burst %d last %d",
        seen.first.burst, seen.first.last);
  CHECK(seen.middle.burst && !seen.middle.last, "the burst's second use: burst %d last %d",
        seen.middle.burst, seen.middle.last);
  CHECK(seen.last.burst && seen.last.last, "the burst's last use: burst %d last %d",
        seen.last.burst, seen.last.last);
  CHECK(!seen.weight.burst, "a weight used in the forward, backward and update is a burst");
  CHECK(!seen.gradient.burst, "a range used once a period is a burst");
  // A changed pattern: off the path nothing is a burst.
  for (int i = 0; i < 80; ++i) {
    op(la, sim, {R(900 + i)}, 0);
  }
  CHECK(!la.burst(R(M(3))).burst, "a burst off the path");
  return true;
}

bool a_range_used_twice_is_next_used_at_its_next_use_in_the_step() {
  // W is used in the forward (after X) and in the update (after M), seven
  // uses apart in a step of ten.
  Lookahead la;
  Sim sim;
  const int X = 1, W = 2, M = 9, Z = 10;
  const std::vector<int> step = {X, W, 3, 4, 5, 6, 7, M, W, Z};
  for (int pass = 0; pass < 3; ++pass) {
    for (int i : step) {
      op(la, sim, {R(i)}, 0);
    }
  }
  op(la, sim, {R(X)}, 0);
  const uint64_t at_forward = la.clock().now;
  const uint64_t forward = la.due(R(W));
  CHECK(forward == at_forward + 7, "forward use: due %llu, want now %llu + 7",
        (unsigned long long)forward, (unsigned long long)at_forward);
  for (int i : {W, 3, 4, 5, 6, 7, M}) {
    op(la, sim, {R(i)}, 0);
  }
  const uint64_t at_update = la.clock().now;
  const uint64_t update = la.due(R(W));
  CHECK(update == at_update + 3, "update use: due %llu, want now %llu + 3",
        (unsigned long long)update, (unsigned long long)at_update);
  return true;
}

bool off_a_path_nothing_is_predicted() {
  Lookahead la(1u << 16, 8);
  Sim sim;
  for (int pass = 0; pass < 3; ++pass) {
    for (int i = 0; i < 8; ++i) {
      op(la, sim, {R(i)}, 0);
    }
  }
  CHECK(la.due(R(0)) != 0, "no prediction on the loop");
  for (int i = 100; i < 120; ++i) {
    op(la, sim, {R(i)}, 0);
  }
  CHECK(la.due(R(0)) == 0 && la.due(R(200)) == 0 && la.clock().window == 0,
        "predicted %llu after 20 uses off the loop", (unsigned long long)la.due(R(0)));
  return true;
}

// A training loop of four alike layers whose activations and gradients get
// new addresses every pass (the caching allocator's early steps), while the
// weights and their optimizer state keep theirs. Identities: one per kind of
// use, the same for every layer (alike layers); a weight has one identity in
// the forward, another in the backward (a transpose) and a third in the
// update (Note [Counterparts]).
struct Loop {
  static constexpr int kLayers = 4;
  static constexpr uint64_t kAct = 11, kWeightFwd = 21, kWeightBwd = 22, kWeightUpd = 23,
                            kGrad = 31, kOut = 41, kState = 51;
  bool ids = true;
  bool swap = false; // pass 3 takes pass 2's blocks, each layer another's:
  int swap_by = 1; // layer i takes layer i + swap_by's (modulo the layers)
  // Positions of pass 1 (the position the range takes when recorded).
  std::vector<uint64_t> act_forward, act_backward, grad_first, grad_next;
  uint64_t id(uint64_t v) const {
    return ids ? v : 0;
  }
  int block(int pass, int i) const {
    return swap && pass == 2 ? 16 + (i + swap_by + kLayers) % kLayers : pass * 16 + i;
  }
  Range A(int pass, int i) const {
    return Range{0x500000000ull + block(pass, i) * (1ull << 26), 8 * kMiB, id(kAct)};
  }
  Range G(int pass, int i) const {
    return Range{0x900000000ull + block(pass, i) * (1ull << 26), 8 * kMiB, id(kGrad)};
  }
  Range Y(int pass, int i) const {
    return Range{0xd00000000ull + (pass * 16 + i) * (1ull << 26), 8 * kMiB, id(kOut)};
  }
  Range W(int i, uint64_t use) const {
    return Range{0x100000000ull + i * (1ull << 28), 128 * kMiB, id(use)};
  }
  Range M(int i) const {
    return Range{0x300000000ull + i * (1ull << 28), 128 * kMiB, id(kState)};
  }
  // One pass; `check(range, k, want)` is called before each operator for the
  // ranges whose next use pass 1 says (want 0: not known yet).
  template <class Check>
  void pass(Lookahead& la, Sim& sim, int p, Check&& check) {
    for (int i = 0; i < kLayers; ++i) {
      if (p == 0) {
        act_forward.push_back(la.clock().now);
      }
      check(A(p, i), 0, p == 0 ? 0 : act_backward[i]);
      op(la, sim, {A(p, i), W(i, kWeightFwd)}, 0);
      op(la, sim, {Y(p, i)}, 0);
    }
    for (int i = kLayers - 1; i >= 0; --i) {
      if (p == 0) {
        grad_first.push_back(la.clock().now);
      }
      check(G(p, i), 0, p == 0 ? 0 : grad_next[kLayers - 1 - i]);
      op(la, sim, {G(p, i), W(i, kWeightBwd)}, 0);
      if (p == 0) {
        act_backward.resize(kLayers);
        act_backward[i] = la.clock().now;
        grad_next.push_back(la.clock().now + 1);
      }
      op(la, sim, {A(p, i), G(p, i)}, 0);
    }
    for (int i = 0; i < kLayers; ++i) {
      op(la, sim, {W(i, kWeightUpd), M(i)}, 0);
    }
  }
};

bool new_addresses_are_predicted_from_their_counterparts(int swap_by) {
  Lookahead la;
  Sim sim;
  Loop loop;
  loop.swap_by = swap_by;
  // Pass 1: nothing matches, not even a weight's backward use with its
  // forward one (other identities), so nothing is predicted.
  loop.pass(la, sim, 0, [&](const Range& r, uint64_t k, uint64_t) {
    CHECK(la.due(r, k) == 0, "pass 1 predicted %llx", (unsigned long long)r.addr);
    return true;
  });
  CHECK(la.counters().matches == 0, "pass 1 matched %llu times",
        (unsigned long long)la.counters().matches);
  const uint64_t period = la.clock().now - loop.act_forward[0];
  // Pass 2: the first layer's forward (new activation, known weight) finds
  // pass 1's, one period back; from the second layer on, every new
  // activation and gradient is due where its counterpart was next used.
  int checked = 0;
  bool started = false;
  loop.pass(la, sim, 1, [&](const Range& r, uint64_t k, uint64_t want) {
    if (!started) {
      started = true; // the first operator of the pass comes before any match
      return true;
    }
    const uint64_t due = la.due(r, k);
    CHECK(due == want + period, "pass 2: %llx due %llu, want %llu + %llu",
          (unsigned long long)r.addr, (unsigned long long)due, (unsigned long long)want,
          (unsigned long long)period);
    ++checked;
    return true;
  });
  CHECK(checked == 2 * Loop::kLayers - 1, "checked %d", checked);
  // Pass 3 takes pass 2's blocks, each layer another layer's: an address's
  // own history now names another tensor's next use; the counterpart (same
  // identity, another address) still names this one's. Where a layer takes
  // an earlier layer's blocks, the transition from its weight to its new
  // output was last seen at that earlier layer, farther back than the
  // counterpart: continuation must win over it (a rule that let the
  // farther match win broke train-plain's path in its second and third
  // steps, step 56).
  loop.swap = true;
  checked = 0;
  loop.pass(la, sim, 2, [&](const Range& r, uint64_t k, uint64_t want) {
    const uint64_t due = la.due(r, k);
    CHECK(due == want + 2 * period, "pass 3: %llx due %llu, want %llu + 2 x %llu",
          (unsigned long long)r.addr, (unsigned long long)due, (unsigned long long)want,
          (unsigned long long)period);
    ++checked;
    return true;
  });
  CHECK(checked == 2 * Loop::kLayers, "checked %d in pass 3", checked);
  CHECK(la.counters().mixed > 0 && la.counters().counterparts >= 7,
        "mixed %llu, counterparts %llu", (unsigned long long)la.counters().mixed,
        (unsigned long long)la.counters().counterparts);
  return true;
}

bool every_range_of_an_operator_is_due_a_period_on() {
  // Operators of two ranges, [activation, weight]: the weight, recorded one
  // position after the operator's first range, is next used a period after
  // this use, not at it (its use a period ago is its counterpart).
  Lookahead la;
  Sim sim;
  for (int pass = 0; pass < 3; ++pass) {
    for (int i = 0; i < 4; ++i) {
      const uint64_t now = la.clock().now;
      const Range x = R(100 + i), w = R(i);
      if (pass == 2) {
        CHECK(la.due(x, 0) == now + 8 && la.due(w, 1) == now + 1 + 8,
              "layer %d: x due %llu, w due %llu, want %llu and %llu", i,
              (unsigned long long)la.due(x, 0), (unsigned long long)la.due(w, 1),
              (unsigned long long)(now + 8), (unsigned long long)(now + 9));
      }
      op(la, sim, {x, w}, 0);
    }
  }
  return true;
}

bool alike_layers_do_not_hide_the_period() {
  // Repeated forwards of four alike layers (one identity for every layer's
  // activation, one for every weight): in the first forward the identities
  // alone make a path one layer long; from the second, the weights'
  // addresses find the forward before, and the path keeps that period.
  Lookahead la;
  Sim sim;
  auto act = [](int pass, int i) {
    return Range{0x500000000ull + (pass * 16 + i) * (1ull << 26), 8 * kMiB, 11};
  };
  auto weight = [](int i) {
    return Range{0x100000000ull + i * (1ull << 28), 128 * kMiB, 21};
  };
  const uint64_t period = 8; // four operators of two ranges
  for (int pass = 0; pass < 4; ++pass) {
    for (int i = 0; i < 4; ++i) {
      const uint64_t now = la.clock().now;
      if (pass == 3) {
        const uint64_t due = la.due(weight(i), 1);
        CHECK(due == now + 1 + period, "forward 4, layer %d: weight due %llu, want %llu", i,
              (unsigned long long)due, (unsigned long long)(now + 1 + period));
      }
      op(la, sim, {act(pass, i), weight(i)}, 0);
    }
  }
  return true;
}

bool random_uses_never_predict_the_past() {
  // Loops with noise: a few alike identities, blocks handed around at
  // random, operators of one to four ranges, a small history (ring reuse).
  // Whatever matches, a prediction is 0 (none) or after the use it is made
  // for, and the window never lies behind the present.
  std::mt19937_64 rng(55);
  for (int trace = 0; trace < 20; ++trace) {
    Lookahead la(256, 16);
    Sim sim;
    for (int step = 0; step < 400; ++step) {
      const int n = 1 + static_cast<int>(rng() % 4);
      std::vector<Range> rs;
      for (int i = 0; i < n; ++i) {
        const int slot = static_cast<int>((step * 3 + i) % 40);
        const int block = rng() % 5 == 0 ? static_cast<int>(rng() % 40) : slot;
        rs.push_back(Range{0x100000000ull + block * (1ull << 26), 4 * kMiB,
                           rng() % 7 == 0 ? 0 : 1 + static_cast<uint64_t>(slot % 3)});
      }
      const uint64_t now = la.clock().now;
      for (size_t k = 0; k < rs.size(); ++k) {
        const uint64_t due = la.due(rs[k], k);
        CHECK(due == 0 || due > now + k, "trace %d step %d: range %zu due %llu at %llu", trace,
              step, k, (unsigned long long)due, (unsigned long long)(now + k));
      }
      CHECK(la.clock().window == 0 || la.clock().window + 64 >= now, "window %llu at %llu",
            (unsigned long long)la.clock().window, (unsigned long long)now);
      op(la, sim, rs, step % 2 == 0 ? 16 * kMiB : 0);
    }
  }
  return true;
}

bool without_identities_the_moved_pass_is_not_predicted() {
  // The same loop with no identities (the history as it was keyed before):
  // the activations of pass 2 are not predicted where they are used next.
  Lookahead la;
  Sim sim;
  Loop loop;
  loop.ids = false;
  loop.pass(la, sim, 0, [](const Range&, uint64_t, uint64_t) { return true; });
  const uint64_t period = la.clock().now - loop.act_forward[0];
  int right = 0;
  loop.pass(la, sim, 1, [&](const Range& r, uint64_t k, uint64_t want) {
    right += want != 0 && la.due(r, k) == want + period ? 1 : 0;
    return true;
  });
  CHECK(right == 0, "%d predicted right without identities", right);
  CHECK(la.counters().mixed == 0 && la.counters().counterparts == 0, "mixed without ids");
  return true;
}

} // namespace

int main() {
  struct Case {
    const char* name;
    bool (*fn)();
  } cases[] = {
      {"first pass predicts nothing, then the next ranges in order",
       first_pass_predicts_nothing_then_the_next_ranges_in_order},
      {"used ranges release their bytes and the walk goes on",
       used_ranges_release_their_bytes_and_the_walk_goes_on},
      {"ranges on the device cost nothing", ranges_on_the_device_cost_nothing},
      {"a changed pattern stops, then resumes", a_changed_pattern_stops_then_resumes},
      {"the walk is bounded and never reaches the present",
       the_walk_is_bounded_and_never_reaches_the_present},
      {"a range used twice a step follows its context",
       a_range_used_twice_a_step_follows_its_context},
      {"pairs repeated within a step keep one path", pairs_repeated_within_a_step_keep_one_path},
      {"a history shorter than the loop predicts nothing",
       a_history_shorter_than_the_loop_predicts_nothing},
      {"a scan is next used one period on", a_scan_is_next_used_one_period_on},
      {"a range used twice is next used at its next use in the step",
       a_range_used_twice_is_next_used_at_its_next_use_in_the_step},
      {"off a path nothing is predicted", off_a_path_nothing_is_predicted},
      {"a burst is told from uses across the period", a_burst_is_told_from_uses_across_the_period},
      {"new addresses are predicted from their counterparts (a later layer's blocks)",
       [] { return new_addresses_are_predicted_from_their_counterparts(1); }},
      {"new addresses are predicted from their counterparts (an earlier layer's blocks)",
       [] { return new_addresses_are_predicted_from_their_counterparts(-1); }},
      {"without identities the moved pass is not predicted",
       without_identities_the_moved_pass_is_not_predicted},
      {"every range of an operator is due a period on",
       every_range_of_an_operator_is_due_a_period_on},
      {"alike layers do not hide the period", alike_layers_do_not_hide_the_period},
      {"random uses never predict the past", random_uses_never_predict_the_past},
  };
  int n = 0;
  for (const Case& c : cases) {
    const int before = g_failures;
    c.fn();
    std::printf("%s %s\n", g_failures == before ? "ok  " : "FAIL", c.name);
    ++n;
  }
  std::printf("%d cases, %d failures\n", n, g_failures);
  return g_failures == 0 ? 0 : 1;
}
