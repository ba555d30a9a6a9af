// Runs the Residency's actions with CUDA calls.
//
// Note [Executor: ordering]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Every action is stream-ordered, so no kernel sees a range half-moved:
//   - bring-ins (PlaceOnDevice, PrefetchToDevice, DiscardAndPrefetch,
//     PlaceOnHost, the last two as prefetches: Note [Dead content is
//     prefetched, not discarded]) run on the stream of the work that is
//     about to use the range, so that work waits for them;
//   - evictions (EvictToHost) run on one side stream per device, after an
//     event recorded on the stream of the evicted chunk's blocks (its
//     segment's stream): after their kernels and after any discard of the
//     chunk queued there, which a concurrent prefetch would make undefined
//     (seen on the GPU as a block reading an older block's data). They
//     overlap the compute that follows instead of delaying it;
//   - discards of dead chunks that make room go the evictors' way too,
//     after the host has seen the dead blocks' stream finish the work queued
//     before them (Note [Discards leave through the evictor]); a
//     discard-and-prefetch or a bring-in of pages that an evictor batch
//     moved or discarded waits for that batch (Note [Eviction fences]),
//     since a discard racing a prefetch of the same pages is undefined
//     behaviour.
// Several ranges go in one call (cudaMemPrefetchBatchAsync,
// cudaMemDiscardBatchAsync) from CUDA 13; before it, prefetches go one range
// at a time and nothing is discarded (dead ranges are evicted by prefetch,
// their bytes copied for nothing: Residency, DeviceLimits::discard).
//
// Note [Dead content is prefetched, not discarded]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A block handed out again over chunks in host RAM (DiscardAndPrefetch), or
// over discarded chunks that stay there (PlaceOnHost), has no content worth
// keeping, and cudaMemDiscardAndPrefetchBatchAsync would place it without
// a copy. Issued by the allocating thread and ordered after the stream's
// work on the GPU only, it lost data on an H200: the caching allocator
// hands a block back to its stream while the kernels of the block's
// previous owner may still run there, and the discard does not seem to
// wait for them (why is not known). Small trainings past a 256 MiB budget
// left their in-memory losses in 29 of 180 runs (the optimizer-staging GPU
// test's runs with staging off showed it first). With a plain prefetch
// there, none of 48 runs did, nor of 48 with a host wait for the stream
// before the call; with discards off, or the module hooks off, none of 20
// did either (bench/README.md, prediction step 12). The evictor's own
// discards wait on the host for the same reason (Note [Discards leave
// through the evictor]). A prefetch moves pages with their content and is
// coherent with any access in flight: a discarded chunk is repopulated at
// its destination, an evicted one brings its stale bytes back over the
// link (2 MiB per chunk), which is the price of not racing the previous
// owner.
//
// Failures are hints lost, not errors: the data stays correct wherever its
// pages are. They are counted, and the first is reported once.
//
// Thread safety: run() may be called from any thread; it takes a per-device
// mutex for the side stream and event, never the engine's lock.
#pragma once

#include <c10/cuda/um/Residency.h>

#include <cuda_runtime_api.h>

#include <semaphore.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

namespace c10::cuda::um {

struct ExecutorCounters {
  uint64_t calls = 0; // CUDA calls issued
  uint64_t failures = 0;
  uint64_t nanoseconds = 0; // host time spent issuing, in the caller
  uint64_t evictor_nanoseconds = 0; // host time of the evictor thread
  uint64_t cancelled_bytes = 0; // queued moves called off (Note [Cancelled moves])
  // Of evictor_nanoseconds, the part spent waiting on the host for a job's
  // stream to reach it before issuing; and the ranges the evictor issued
  // (one batch entry each): how it spends its time and how large its calls are.
  uint64_t evictor_wait_nanoseconds = 0;
  uint64_t evict_ranges = 0;
  // Bring-ins that waited on the host for an eviction batch to be issued
  // (Note [Eviction fences]), their host time, and the part of it during
  // which the evictor was issuing a job (the rest: it waited on the host for
  // a job's stream, or had not taken the job yet).
  uint64_t fence_waits = 0;
  uint64_t fence_wait_nanoseconds = 0;
  uint64_t fence_wait_issuing_nanoseconds = 0;
};

class Executor {
 public:
  // A place in the execution order; call under the engine's lock, then
  // run() with it (always, also with no actions) after dropping the lock.
  uint64_t take() {
    return next_ticket_++;
  }
  // True while a ticket taken earlier has not been served: some decided
  // action may not be queued on its stream yet. Call under the engine's lock.
  bool behind() const {
    return serving_.load(std::memory_order_acquire) != next_ticket_;
  }
  // `prefetch`: the prefetch setting (placement of fresh segments).
  void run(uint64_t ticket, const std::vector<Action>& actions, bool prefetch);
  ExecutorCounters counters() const;
  // Returns once every eviction queued so far for `device` was issued.
  void drain(int device);
  // Returns once the evictor has finished every job queued so far, on any
  // device, its last CUDA call included (Note [Captures wait for the
  // evictor], Engine.cpp).
  void drainAll();

 private:
  struct Side {
    std::mutex mu;
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr; // recorded on the side stream
    bool used = false;
    // Note [Eviction fences]: the event after each eviction batch, by batch
    // number modulo kRing; a batch older than the ring is long done or, at
    // worst, covered by waiting for `done`.
    static constexpr size_t kRing = 64;
    cudaEvent_t ring[kRing] = {};
    uint64_t ring_seq[kRing] = {};
    // The last eviction batch the evictor thread has issued on this device.
    std::atomic<uint64_t> issued{0};
    // The last eviction batch queued for this device.
    std::atomic<uint64_t> queued{0};
    // Note [Ready events are reused]: events a job's `ready` was, free for
    // the next job. Guarded by events_mu, never by mu (which the evictor
    // holds while it issues).
    std::mutex events_mu;
    std::vector<cudaEvent_t> free_events;
  };
  // Note [Evictor thread]: cudaMemPrefetchAsync to the CPU does much of its
  // work on the calling thread (measured: the executor's host time matched
  // the evicted bytes at 6-7 GB/s). Evictions are therefore issued by a
  // thread of their own, in the engine's order, so that the thread that
  // allocates or touches only records an event and goes on.
  //
  // Note [Discards leave through the evictor]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // Dead chunks that make room are discarded by the same thread, in the same
  // queue, and the thread first waits on the host for the chunk stream's
  // `ready` event and for the side stream to drain. Ordering the discard on
  // the GPU alone (on the chunk's stream, or on the side stream after events
  // on both) lost data on an H200 whenever several streams made room at
  // once: a multi-stream fuzz failed 10-12 runs of 12 that way and none with
  // the host waits (bench/README.md, "Discard ordering"). Prefetches to the
  // CPU wait on the host for their `ready` event too: ordered on the GPU
  // only, the inference benchmark's logits differed from stock's (relative
  // checksum difference 5.5e-4), with the wait they are equal. A later use
  // of the chunk waits on the host until its batch is issued, then for the
  // batch's event on the GPU (Note [Eviction fences]), unless it calls the
  // move off (Note [Cancelled moves]).
  //
  // Note [Cancelled moves]
  // ~~~~~~~~~~~~~~~~~~~~~~
  // The evictor runs behind the compute threads (its host waits above), so
  // a chunk is often needed again while the job that moves it out is still
  // queued: the caching allocator hands a just-freed block straight back
  // (training re-placed ~8.6 GB of discarded chunks per step), and a live
  // chunk evicted by LRU is touched by the next layer. Waiting for the job
  // to be issued and then moving the pages back costs the compute thread
  // the evictor's whole backlog. Instead, a bring-in of pages that are
  // still in queued jobs, and in no job the evictor has taken, removes them
  // from those jobs and does nothing: the pages never left the device, which
  // is where the ledger now wants them, with their data (a touch) or with
  // contents nobody reads (a reused dead chunk). The budget holds: the
  // ledger made room for the bring-in when it decided it, and the pages the
  // cancelled job would have freed are the ones the bring-in fills.
  // Only whole ranges are called off; a range partly in a taken job takes
  // the ordinary path (wait for its batch, then move). The interval logic is
  // pure (coveredWhole, cutOut in Residency.h) and checked by the CPU test.
  struct EvictJob {
    int device;
    uint64_t seq;
    cudaEvent_t ready; // recorded on the chunk's stream (nullptr: none)
    std::vector<void*> ptrs;
    std::vector<size_t> sizes;
    bool discard = false; // discard the ranges instead of evicting them
  };
  void enqueue(EvictJob job);
  void evictorLoop();
  // Note [Cancelled moves]: removes from the queued jobs of `device` every
  // range of ptrs/sizes that they cover whole (and the job being issued does
  // not touch); those ranges leave ptrs/sizes. Returns the bytes removed.
  uint64_t cancelQueued(
      int device,
      std::vector<void*>& ptrs,
      std::vector<size_t>& sizes);
  // Orders `stream` after eviction batch `fence` of `device`.
  cudaError_t waitFor(int device, uint64_t fence, cudaStream_t stream);
  Side& side(int device);
  bool ensureSide(Side& s, int device);
  // Note [Ready events are reused]: an event for a job's `ready` (a free one
  // of `device`, else a new one), and back to the free list once waited on.
  cudaError_t takeEvent(int device, cudaEvent_t* out);
  void giveEvent(int device, cudaEvent_t event);
  void fail(cudaError_t err, const Action& a);
  // The actions of nextGroup() from i (advanced past them) as one call's
  // ranges; returns the fence the call waits for.
  uint64_t group(
      const std::vector<Action>& actions,
      size_t& i,
      std::vector<void*>& ptrs,
      std::vector<size_t>& sizes);

  // Note [Executor: one order]: actions run in the order the engine decided
  // them (tickets handed out under the engine's lock), whichever thread runs
  // them, so that a discard decided after an eviction of the same pages is
  // also enqueued after it.
  // The wait is a yield loop, not a condition variable: the ticket ahead is
  // being served by a thread issuing a few CUDA calls, and libstdc++'s
  // condition_variable::wait would raise the wheel's GLIBCXX requirement.
  uint64_t next_ticket_ = 0; // guarded by the engine's lock (take())
  std::atomic<uint64_t> serving_{0};

  std::mutex queue_mu_;
  // Guarded by queue_mu_. The front job stays in the deque while the
  // evictor issues it (`taken_`), so that cancelQueued() can see it and
  // leave it alone; push_back never moves it.
  std::deque<EvictJob> queue_;
  bool taken_ = false;
  sem_t queue_sem_;
  std::once_flag sem_once_;
  std::once_flag evictor_once_; // retried if the thread cannot start (enqueue)

  std::mutex sides_mu_;
  std::vector<Side*> sides_; // leaked on purpose, like the engine
  std::atomic<uint64_t> calls_{0};
  std::atomic<uint64_t> failures_{0};
  std::atomic<uint64_t> ns_{0};
  std::atomic<uint64_t> evictor_ns_{0};
  std::atomic<uint64_t> cancelled_bytes_{0};
  std::atomic<uint64_t> evictor_wait_ns_{0};
  std::atomic<uint64_t> evict_ranges_{0};
  std::atomic<uint64_t> fence_waits_{0};
  std::atomic<uint64_t> fence_wait_ns_{0};
  std::atomic<uint64_t> fence_wait_issuing_ns_{0};
  // True while the evictor thread issues a job's CUDA calls (for the
  // fence-wait counters only).
  std::atomic<bool> evictor_issuing_{false};
  // Jobs enqueued, and jobs the evictor has finished with (drainAll).
  std::atomic<uint64_t> jobs_queued_{0};
  std::atomic<uint64_t> jobs_done_{0};
};

} // namespace c10::cuda::um
