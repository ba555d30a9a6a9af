// Staging by copy of the state that one burst of operators a period writes.
//
// Note [State one burst a period writes is staged by copy]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Past the budget, a program's weights and optimizer state do not fit on the
// device together, and the state an update writes (a hand-written update's
// momentum, which three operators read and write in a row and nothing else
// uses until the next update) leaves after every update and comes back before
// the next. By the driver's migration it leaves at 7-14 GB/s (design notes,
// section 9); train-plain's 3 GiB of momentum took 0.25-0.43 s of a 0.5 s
// step (docs/notes/step-58-programs-on.md). A kernel reads host-placed
// managed memory at about 51 GB/s and writes it at 52: copied, the same bytes
// take about 60 ms each way. torch.optim's state is staged by copy by the
// Python layer (torch/cuda/_um_optim.py), which owns the references its step
// reads; a hand-written update holds its own, so staging has to happen below
// every reference: at the storage, whose data pointer every tensor and view
// of it reads when its kernels are queued.
//
// So, with the op_stage setting, the operator signal (OpSignal.cpp) stages a
// storage at the start of an outermost operator that uses it when
//   - the learned order calls the use part of a burst, not its last (Note
//     [Bursts of use], Lookahead.h),
//   - the storage was written between two of its uses seen (its version
//     counter moved: state, not read-only data, which leaves by a dropped
//     duplicate for free),
//   - the ledger has at least half of it in host RAM (the rest, untouched
//     while the storage is staged, leaves as the order's victim), and it is
//     at least a chunk:
// a block is taken from the caching allocator on the operator's stream, the
// storage's bytes copied into it by the engine's copy kernel (HostCopy.h), and
// the storage's DataPtr swapped for one over the block. At the end of the
// burst's last operator (the observer's end callback: its kernels are queued)
// the block is copied back into the storage's own range, still in host RAM (a
// write in place), the storage's own DataPtr put back, and the block freed,
// ordered after the copy on the stream that staged it. The storage's own
// range never migrates, so nothing is left for the driver to evict.
//
// Measured (docs/notes/step-59-staging-by-copy.md, one H200): train-plain's
// steady step 0.522 -> 0.299 s (3.0x -> 1.73x its link floor), 2.9-3.0 GiB
// staged each way a step and the driver's evictions down from about 5 GiB to
// 1.3; outputs bit-equal to stock's. Where it does not reach yet: a compiled
// model's optimizer is most of the operators the signal sees, so its state's
// uses span more than an eighth of the period in positions and are not
// called a burst; and the operator signal alone on a model trained by a
// hand-written Lion (hooks off) was slower with it (0.614 against 0.521 s),
// with 10 of its 25 candidates a step not in host RAM.
//
// What must hold, and how it is kept:
//   - nothing keeps the raw pointer across the burst: kernels read it when
//     they are queued, and the swaps happen only at an outermost operator's
//     start or end on the thread (an operator inside another may run on
//     pointers its caller took). Never while a graph is captured, and never in
//     a process that has captured one: a graph keeps the pointers it captured.
//     Code that keeps data_ptr() across operators (an extension's cache, NCCL
//     buffer registration) sees the block during the burst: the reason the
//     setting is off by default.
//   - the burst's streams: the copy in is queued on the staging stream; the
//     copy out runs on it after the ending operator's stream, which then waits
//     for it, so the block is freed after its last use by either.
//   - one thread at a time uses the storage, as for any in-place update.
//   - a storage that dies while staged: its DataPtr's deleter (dropStaged)
//     frees the block and the storage's own range; no copy.
//   - a storage given another DataPtr while staged (resize_, set_): the
//     stage's DataPtr is destroyed with the same deleter, and the end finds
//     nothing of the stage's to put back.
//   - a copy that cannot be launched: a copy in leaves the storage as it was;
//     a copy out goes to cudaMemcpyAsync, and if that fails too the storage
//     stays on the block (its data is there) and the failure is counted.
// A wrong burst costs copies, never data: a storage staged at a use that was
// not followed by the burst's end stays on its block (ordinary device memory
// of the engine, evicted like any other) until a use the order calls the
// last, or off the burst pattern.
//
// Thread safety: one mutex over the tables; dropStaged may run on any thread.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace c10 {
struct StorageImpl;
} // namespace c10

namespace c10::cuda::um {

struct StageCounters {
  uint64_t ins = 0; // storages staged
  uint64_t in_bytes = 0;
  uint64_t outs = 0; // put back after a copy out
  uint64_t out_bytes = 0;
  uint64_t dropped = 0; // storages that died while staged
  uint64_t failures = 0; // stagings that could not start or copies out that failed
  uint64_t candidates = 0; // uses that met every condition but the ledger's
  uint64_t not_on_host = 0; // of those, the ranges less than half in host RAM
};

class Stage {
 public:
  static Stage& get();

  // The storage's own address of the block at `addr` while it is staged, or
  // 0 (not a staged block).
  uintptr_t homeOf(uintptr_t addr) const;
  // Records a use of the storage `storage` (identity only) at its own
  // address `home` with its version counter `version`; true once it has
  // moved between two uses seen of the storage (it stays true: the burst's
  // first use follows its last, which may only have read it).
  bool written(uintptr_t home, const void* storage, uint64_t version);
  // Stages `storage` (its bytes in host RAM) in a block on `device`, copied
  // on `stream`. False where nothing changed (no block, no kernel).
  bool stageIn(c10::StorageImpl* storage, int device, cudaStream_t stream);
  // Counts a use that met every condition of the Note but the ledger's, and
  // whether the ledger had at least half of the range in host RAM.
  void candidate(bool on_host);
  // Puts `storage` back, after a copy out queued after the work on
  // `stream`. Nothing if it is not staged.
  void stageOut(c10::StorageImpl* storage, cudaStream_t stream);
  // Whether `home` is the own address of a storage staged now.
  bool isHome(uintptr_t home) const {
    std::lock_guard<std::mutex> lock(mu_);
    return homes_.count(home) != 0;
  }
  // Whether any storage is staged now.
  bool any() const {
    std::lock_guard<std::mutex> lock(mu_);
    return !staged_.empty();
  }
  StageCounters counters() const;

 private:
  struct Staged;
  Stage() = default;
  static void dropStaged(void* ctx);

  mutable std::mutex mu_;
  std::unordered_map<uintptr_t, Staged*> staged_; // block address -> its staging
  std::unordered_set<uintptr_t> homes_; // their own addresses
  struct Seen {
    const void* storage = nullptr;
    uint64_t version = 0;
    bool moved = false;
  };
  std::unordered_map<uintptr_t, Seen> seen_; // own address -> last use seen
  StageCounters counters_;
};

} // namespace c10::cuda::um
