// The residency ledger of managed memory and the policies that move it.
//
// Pure C++: no CUDA and no c10 here, so that the whole decision logic builds
// and runs on a machine without a GPU (tests/engine/ drives it with event
// traces). Engine.cpp owns one Residency, calls it under the engine's lock,
// and hands the Actions it returns to the Executor, which runs them after the
// lock is dropped.
//
// Note [Residency ledger]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Managed segments are cut into chunks of kChunkBytes (2 MiB, the caching
// allocator's segment granularity and the driver's large-page size). Each
// chunk records where its pages are (device, host, or unplaced: never
// advised, so they migrate on touch), how many of its bytes belong to blocks
// the allocator has handed out (live bytes, from ALLOC and FREE_COMPLETED
// events), and when it was last touched. Per device, the bytes of chunks on
// the device stay at or under the device budget: when a range is about to be
// used on the device and does not fit, other chunks leave first.
//
// Note [Which bytes move, and how]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Measured on an H200 (docs/design-notes.md, section 9): a GPU prefetch of
// managed memory runs at about 50 GB/s, eviction by prefetch to the CPU at
// only 3-16 GB/s, a discard costs no transfer at all, and a discarded range
// that is then faulted in instead of prefetched costs seconds per GiB. Hence:
//   - a chunk with no live bytes is dead: it leaves the device by Discard,
//     never by a copy, and it is the first victim when room is needed;
//   - a block handed out again over chunks that are not on the device is
//     placed by DiscardAndPrefetch (its old content is dead), never faulted;
//     the executor issues it as a plain prefetch (Note [Dead content is
//     prefetched, not discarded], Executor.h);
//   - live chunks leave least recently touched first, by EvictToHost
//     (prefetch to the CPU on a side stream; every segment is advised
//     PreferredLocation=host, AccessedBy=device when it is made, which moves
//     nothing but makes GPU touches of evicted pages read them in place
//     until the engine brings them back);
//   - a range larger than what the budget can hold is mapped in place for
//     its remainder (MapHost): data touched once streams at link speed; it
//     makes no room (Note [Ranges larger than the budget]);
//   - live data that its user will only read (parameters in a forward
//     without autograd: inference) comes back as a read-only duplicate
//     (Note [Read-only duplicates]) and leaves by dropping the duplicate.
//
// Note [Read-only duplicates]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With cudaMemAdviseSetReadMostly, a prefetch to the GPU copies pages and
// leaves the host copy valid; unsetting the advice then drops the GPU copy
// (the pages' preferred location is the host) without a write-back. Measured
// on an H200 (bench/probes/evict_routes.py): the drop runs at about 48 GB/s where
// eviction by prefetch to the CPU runs at 8-17 GB/s. The advice is a hint,
// never a change of meaning: a write to such a page collapses the copies
// where it happens, so a wrong guess costs speed, not data. Hence:
//   - a touch marked read-only of chunks in host RAM emits
//     DuplicateToDevice (set ReadMostly, prefetch to the device) and marks
//     the chunks `dup`;
//   - ReadMostly is set on a chunk exactly while it is `dup`: every way off
//     the device starts with DropDuplicate (unset ReadMostly), and a live
//     chunk is then still evicted as usual, which moves only pages a write
//     has made GPU-only (none, when the guess was right);
//   - a dead dup chunk is dropped and discarded.
//
// Note [Scans]
// ~~~~~~~~~~~~
// Inference reads the weights layer by layer, forward after forward: a
// cyclic scan. When the scan is larger than the budget, LRU is the worst
// policy for it: the chunk it evicts is always the one the scan needs next,
// so every forward moves every weight. The best victim is the chunk whose
// next use is farthest away, which in a cyclic scan is the one read most
// recently: then a prefix of the scan stays on the device and each forward
// moves only the rest (Belady's order for a loop). A chunk last touched
// read-only (a forward without autograd, TORCH_UM_TOUCH_READ_ONLY) is
// therefore kept in a set of its own, `scan`, and room is made
//   1. from dead chunks, least recently touched first (no copy);
//   2. from live chunks that have not been touched since before the oldest
//      scan chunk was read (colder than the whole scan: data of another
//      phase), least recently touched first;
//   3. from scan chunks, most recently read first, never those of the range
//      being brought in;
//   4. from the remaining live chunks, least recently touched first.
// Training touches nothing read-only, so for it this is plain LRU; a chunk
// touched for writing or (re)allocated leaves the scan set.
//
// Note [The learned eviction order]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// LRU is the worst order for any loop, not only a scan: in a training step
// the chunk used least recently is the one needed soonest after the
// lookahead (Note [Learned lookahead], Lookahead.h) brought in what it
// predicts, so what it brings in is evicted again before its use (a plain-
// tensor step past its budget moved 9.5 GiB ahead where 4.4 GiB must move:
// docs/notes/step-53-operator-signal.md). Where the operator signal has
// learned the loop, each use of a range comes with the position of its
// predicted next use (Note [Predicted next use]), and plan() files the
// range's chunks under it, in the order `planned`, keyed by that position
// (`due`) instead of by the last touch. With the positions the signal sets
// by setPlanClock (`now`: the present; `window`: the last use the lookahead
// has brought in ahead), room is made
//   1. from dead chunks, as always (no copy);
//   2. from planned chunks whose use is overdue (due before now: the loop
//      did not come back to them, a changed pattern), most overdue first;
//   3. from planned chunks due after the window, farthest first: Belady's
//      rule on the learned order;
//   4. from unplanned chunks, by Note [Scans] (data no prediction covers:
//      fresh outputs not yet read, the first period, another phase);
//   5. last, from planned chunks inside the window, farthest first: what the
//      lookahead brought in for its use leaves only when nothing else can.
// A bring-in ahead is itself a use predicted at a position: it takes room
// only from steps 1-3, and of step 3 only chunks predicted after it (Belady's
// condition for a prefetch); what finds no room waits for its operator.
// Without it the lookahead pushed out what was needed before the ranges it
// brought in: 8.1 GiB evicted a step of train-plain, against 4.75 without the
// lookahead and 4.44 that must leave (docs/notes/step-54-learned-eviction.md).
// A touch without a prediction (the Python layer's, a use off the learned
// path) takes a chunk out of `planned` again; a block event over it does
// too. The signal plans a range only after every range of its operator was
// touched, so that the newest touches protect an operator's inputs from
// each other (makeRoom's protect_tick). Without the signal nothing is
// planned and the orders are those above.
//
// Note [First evictions]
// ~~~~~~~~~~~~~~~~~~~~~~~
// The driver's eviction (a prefetch to the CPU) runs at about 3 GB/s into
// host pages the range never had, and at 10-12 GB/s into pages it had
// before (docs/notes/results/evict_routes-h200-2026-11-29-step54.json). Which
// chunks an order sends out then sets the step's time as much as how many
// bytes: an order that evicts the same chunks every step pays the fast rate,
// one that picks chunks never evicted before pays the slow one. The engine
// does not see the driver's pages; it keeps, for each chunk, whether they
// were in host RAM (evicted, or made there) and not discarded since (a
// discard, with or without a prefetch, is taken to drop them: the driver
// may free a discarded range's pages), and counts, of
// evict_bytes, the bytes of chunks without: evict_first_bytes. In step 56's
// plain-tensor step the learned order sent 0.81 GiB a step of such first
// evictions out and the order before it none, at two thirds of its eviction
// rate (docs/notes/step-56-first-evictions.md). So the planned chunks are kept
// in two orders by their pages, and with the evict_warm_first setting the
// ones whose pages exist leave first among those due after the window (the
// others only when none of those is left); without it, the farthest of
// both, as one order. On by default since step 57: with victims leaving as
// runs (below) it was the fastest of the three orders on both plain-tensor
// classes (docs/notes/step-57-victims-as-runs.md). But the rate above was
// measured on ranges without the engine's advice: a fresh range advised as
// every segment is (PreferredLocation=host, AccessedBy=GPU) evicts at 12.5
// GB/s, and no page history (made by the CPU first, evicted before,
// discarded on the GPU) moves it out of 12-14 (bench.probes.warm_pages_probe,
// docs/notes/step-58-programs-on.md). So what makes warm-first faster is not
// yet known; evict_first_bytes stays a count, not a cost.
//
// Note [Victims leave as runs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The driver evicts a batch of 2 MiB ranges at about 14 GB/s and of 64 MiB
// ranges at 22 (docs/notes/step-05-evictor-bound-calls-cuda.md), so how the
// chosen chunks are cut into ranges sets the eviction rate as much as which
// chunks they are. The orders key a chunk by (due, address), and the
// farthest-first steps take them from the end: a range's chunks, due
// together, come highest address first. emit() joined a chunk only to the
// range below it, so each became a range of its own: step 56's train-plain
// issued 15,579 ranges for 51.8 GiB (3.6 MB a range) where the order before
// the due() fix, taking overdue chunks lowest first, issued 1,855 for 46.8
// GiB (27 MB). A chunk now joins the range on either side of it; the
// chunks, the order and the batches are the same.
//
// Note [Ranges larger than the budget]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A range (a new segment, a block handed out, a touched range) larger than
// the whole budget can never be resident at once: every use of it reads or
// writes at least its part past the budget over the link anyway. Such a
// range takes only free room on the device; it makes none, and the rest of
// it is mapped in place.
//   - Evicting live bytes for it pays a migration to host RAM at 3-16 GB/s
//     (design notes, section 9) to spare the same bytes a direct access at
//     about 50 GB/s per use, and the evicted data, if used again, comes back
//     over the link as well: LRU flushed by a scan larger than the cache.
//     It would pay only if the range were used several times in a row and
//     the evicted data not at all; nothing tells the engine that in time.
//   - Discarding dead chunks for it costs no copy then, but the discarded
//     chunks have no pages anywhere: reused in host RAM later they are made
//     again (PlaceOnHost, about 4 GB/s), and the range's own chunks come in
//     by prefetch. Left alone, dead chunks are revived in place by the next
//     block over them, and placement stays the same from one iteration to
//     the next.
// Listing 1 is the case in point (bench/README.md, "Prediction, step 44"):
// with x and y each twice the budget, making room evicted x's device half
// to place part of y (0.6 s of the square's 0.8); taking dead room instead
// made y's next placement re-make 4 GiB of host pages (0.95 s).
//
// Note [Graph pools: a free is not a death]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A CUDA graph's private pool holds memory that the graph's replays write
// at fixed addresses, and the allocator does not see replays. Its events
// there describe the recording, not the data:
//   - cudagraph trees (torch.compile's "reduce-overhead") hand replay
//     outputs to the program as tensors built over pool memory without an
//     ALLOC, while the allocator counts the recording's output block as
//     freed once its first tensor died;
//   - restoring a pool's checkpoint before a new recording
//     (setCheckpointPoolState) frees every block of the pool and allocates
//     the live ones again, in one call, with their data still in use.
// Taking those events at their word discards live graph outputs: the GPU
// suite's reduce-overhead test read zeros, now and then, after earlier tests
// left pool chunks in host RAM or among the eviction victims. So a segment
// that holds a private pool's blocks is `replayed`: its frees never make a
// chunk dead, and a block handed out there keeps its old content (placed by
// prefetch, never by discard-and-prefetch). Chunks of it no block ever used
// are still dead. Such segments cost write-backs under pressure, which
// graph users pay only for memory their pools hold. Torch 2.6 and 2.7 do not
// say which pool an event is in; there every event after the first capture
// in the process counts as a pool's (Engine::onBlockEvent).
//
// Note [Forgotten content]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Some live blocks hold bytes nobody will read: their owner overwrites all
// of them before the next read. DistributedDataParallel's gradient buckets
// are the case in point (Note [DDP's buckets between steps],
// torch/cuda/_um_ddp.py): from the step's end to the next backward they
// hold last step's gradients, and the backward writes every byte again
// before NCCL or the step reads them. Past the budget such a block costs a
// write-back and a bring-in per step, for nothing. forget() takes its
// owner's word for it: each chunk wholly inside the range whose every live
// byte is the range's (the chunk's live count fits in the range's part of
// it; a chunk that shares its bytes with another block is left alone) is
// marked `stale`. A stale chunk is dead for every purpose but its live
// count:
//   - on the device it sits in the dead order, so it is among the first
//     victims and leaves by Discard, without a copy;
//   - its next touch, which is the owner's signal that the write is coming,
//     brings it back by DiscardAndPrefetch (never by faults) and ends the
//     staleness, wherever the chunk is;
//   - a block event over the chunk (its block freed, another handed out in
//     its free bytes) ends it too: the ledger then follows the blocks again.
// The caller's promise is the whole of the safety: nothing reads the range
// before its next touch. The Python layer forgets only where the owner
// itself overwrites the bytes first.
//
// Note [Held ranges]
// ~~~~~~~~~~~~~~~~~~~
// Every way back to the device goes through a signal: a block handed out, or
// a touch from the Python layer. A live block that kernels use at every step
// and that no signal names is left out: cuBLAS keeps one workspace per handle
// and stream, allocated once from the caching allocator and written by its
// GEMMs ever after. Once evicted, such a block is read and written in place in
// host RAM for the rest of the run (AccessedBy, above): on the H200 every
// GEMM of a Llama forward then ran at 0.4x speed, 10 ms a forward, with
// nothing moving (bench/README.md, prediction step 39). A touch with `hold`
// brings the range to the device like any touch and then takes the chunks
// that hold only its bytes out of the eviction orders: they stay on the
// device until a block event over them (the block freed, or another handed
// out in the chunk), an explicit eviction, or a move to another device.
// Chunks shared with other blocks are touched, not held (the other blocks
// follow their own signals). The Python layer holds only what it found to be
// such a workspace (torch/cuda/_um_workspaces.py), a few tens of MiB.
//
// Thread safety: none. The caller (Engine) serialises every call.
#pragma once

#include <c10/cuda/um/Lookahead.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace c10::cuda::um {

constexpr uint64_t kChunkBytes = 2ull << 20;

// Where a chunk's pages are.
enum class Where : uint8_t {
  Device, // on its device (counted against the budget)
  Host, // in host RAM, mapped for the device (PreferredLocation=host)
  Unplaced, // no advice (capture under way, no concurrent managed access):
            // migrates on first touch, so counted as device
};

// One thing for the Executor to do. Ranges are chunk-aligned except at the
// segment's end; adjacent chunks with the same action are merged.
struct Action {
  enum Kind : uint8_t {
    PrefetchToDevice, // live data: migrate to `device`, ordered on `stream`
    DiscardAndPrefetch, // dead data to `device`: its content need not survive
                        // (issued as a prefetch: Note [Dead content is
                        // prefetched, not discarded], Executor.h)
    EvictToHost, // live data: prefetch to the CPU on the device's side
                 // stream once `stream` (the segment's) has done its work so far
    Discard, // dead data leaves without a copy, like EvictToHost: by the
             // evictor, once `stream` has done its work so far (Note
             // [Discards leave through the evictor])
    MapHost, // fresh segment: advise PreferredLocation=host + AccessedBy=device;
             // with prefetch on, host pages are made by CPU writes (Note [Host
             // pages are populated by CPU threads], Executor.cpp)
    PlaceOnDevice, // fresh segment: prefetch to `device` on `stream`
    AdviseHost, // PreferredLocation=host + AccessedBy=device on a whole new
                // segment (lru): pages the engine moved off the device are
                // then read in place, never migrated back behind its back;
                // pages on the device stay there
    PlaceOnHost, // discarded chunk that must be written where the budget
                 // has no room: populate host pages (never GPU faults)
    DuplicateToDevice, // live data only read: set ReadMostly and prefetch
                       // to `device` on `stream` (a copy; host keeps its)
    DropDuplicate, // unset ReadMostly: the device copy goes, host's stays
  };
  Kind kind;
  uintptr_t addr;
  uint64_t size;
  int device;
  void* stream; // cudaStream_t, opaque here
  uintptr_t segment = 0; // base of the segment: ranges never span two
  // Note [Eviction fences]: an EvictToHost or a Discard carries the number
  // of its batch; a discard-and-prefetch or a bring-in carries the number of
  // the last batch that evicted or discarded any of its pages (0: none),
  // which the executor orders it after. Pages never moved wait for nothing.
  uint64_t fence = 0;
};

const char* actionName(Action::Kind k);

// Consecutive actions of one kind, device and stream are issued as one CUDA
// call (Executor). The group starting at `first` ends before `end`; the call
// waits for `fence`, the highest of its members' fences, since a discard or
// a bring-in grouped behind one that needs no fence may still need one (seen
// on the GPU as lost data under several streams). An EvictToHost or Discard
// group keeps to one batch number: it is one evictor job, and its number is
// its fence.
struct ActionGroup {
  size_t end;
  uint64_t fence;
};
ActionGroup nextGroup(const std::vector<Action>& actions, size_t first);

// Note [Cancelled moves] (Executor.h), the interval part, pure so that the
// CPU test checks it. A job's ranges are parallel lists of starts and sizes.
struct JobRanges {
  std::vector<void*>* ptrs;
  std::vector<size_t>* sizes;
};
// True when the union of `queued` covers [lo, hi) whole and no range of
// `taken` (a job being issued) overlaps it.
bool coveredWhole(
    const std::vector<JobRanges>& queued,
    const std::vector<JobRanges>& taken,
    uintptr_t lo,
    uintptr_t hi);
// Removes [lo, hi) from a job's ranges, splitting a range around it.
void cutOut(JobRanges job, uintptr_t lo, uintptr_t hi);

// The residency policy: `static` keeps the first version's decision (a whole
// segment on the device if it fits under the budget when allocated, else in
// host RAM for good); `lru` manages residency over time as described above.
enum class Policy : uint8_t { Static, Lru };

// Everything the ledger needs to know about one device at a call.
struct DeviceLimits {
  uint64_t budget = 0; // device budget in bytes
  bool can_act = false; // concurrent managed access, and no capture under way
  bool discard = true; // dead data may be discarded (CUDA 13 and the setting)
  // read-only touches bring data in as duplicates (the read_copies setting,
  // Note [Read-only duplicates]); without it they only mark a scan (Note
  // [Scans])
  bool read_copies = false;
  // Note [First evictions]: of the planned chunks due after the window, those
  // whose pages were in host RAM before leave first (the evict_warm_first
  // setting).
  bool warm_first = false;
};


// Note [Ledger traces]
// ~~~~~~~~~~~~~~~~~~~~
// The ledger decides from its calls alone: no clock, no CUDA, no state from
// outside. So a run on the GPU host can record every call that changes the
// ledger, with its arguments (TORCH_UM_LEDGER_TRACE, LedgerTrace.h), and a
// CPU can replay the recording against this class: the replay decides what
// the run decided, and a different choice of victims can be priced on the
// same calls (bench/probes/ledger_replay.cpp). The record of one call:
struct TraceRecord {
  enum Op : char {
    AddSegment = 'S',
    RemoveSegment = 'R',
    Alloc = 'A', // onAlloc
    Free = 'F', // onFree
    Touch = 'T',
    Forget = 'G',
    Evict = 'E',
    Plan = 'P', // size: the range; budget: its due position
    Clock = 'K', // addr: now; size: window (setPlanClock)
  };
  Op op = Alloc;
  uintptr_t addr = 0;
  uint64_t size = 0;
  int device = 0; // AddSegment, Touch
  uintptr_t stream = 0; // AddSegment, Alloc, Touch, Evict
  bool flag = false; // AddSegment: tracked; Alloc, Free: replayed; Touch: read_only
  bool adopted = false; // AddSegment: adopted; Touch: hold (Note [Held ranges])
  Policy policy = Policy::Lru; // AddSegment, Alloc, Touch
  DeviceLimits limits; // AddSegment, Alloc, Touch, Evict
  uint64_t needed_at = 0; // Touch: a bring-in ahead, for a use at this position
};
// Receives each record before the call acts. Called under the caller's
// serialisation of the ledger (the engine's lock), in call order.
class TraceSink {
 public:
  virtual ~TraceSink() = default;
  virtual void record(const TraceRecord& r) = 0;
};
// Which dead chunk leaves first when room is needed. The ledger's own order
// is the least recently touched; bench/probes/ledger_replay.cpp installs others to
// price them on recorded traces. `candidates` are chunk addresses, oldest
// first (never empty); returns the index of the one to take.
class DeadChoice {
 public:
  virtual ~DeadChoice() = default;
  virtual size_t pick(const std::vector<uintptr_t>& candidates) = 0;
};

struct ResidencyCounters {
  uint64_t touches = 0; // ranges reported as about to be used
  uint64_t prefetch_bytes = 0; // live bytes migrated to the device
  uint64_t reuse_bytes = 0; // dead bytes placed by discard-and-prefetch
  uint64_t place_bytes = 0; // fresh segments placed on the device
  uint64_t evictions = 0; // EvictToHost actions
  uint64_t evict_bytes = 0;
  uint64_t discards = 0; // Discard actions
  uint64_t discard_bytes = 0;
  uint64_t map_host_bytes = 0; // bytes placed in host RAM without a move
  uint64_t duplicate_bytes = 0; // live bytes brought in as read-only copies
  uint64_t drop_bytes = 0; // read-only copies dropped from the device
  // Live chunks evicted, then freed before anything brought them back to the
  // device: an upper bound on what knowing lifetimes could save (evictions
  // of data that dies in host RAM, or that the GPU read there in place).
  uint64_t evicted_unused_bytes = 0;
  // Note [Forgotten content]: bytes forget() marked stale, and of those the
  // bytes that left the device by Discard while stale.
  uint64_t forget_bytes = 0;
  uint64_t forgotten_discard_bytes = 0;
  // Note [Held ranges]: bytes of chunks a touch with `hold` took out of the
  // eviction orders.
  uint64_t hold_bytes = 0;
  // Note [The learned eviction order]: bytes plan() filed under a predicted
  // use, and bytes that left the device chosen by that order.
  uint64_t plan_bytes = 0;
  uint64_t plan_victim_bytes = 0;
  // Note [First evictions]: of evict_bytes, the bytes of chunks whose pages
  // were never in host RAM before (or were discarded since).
  uint64_t evict_first_bytes = 0;
};

class Residency {
 public:
  // A new managed segment of `size` bytes at `base` on `device`, allocated
  // on `stream`. `tracked`: the allocator's block events reach the engine,
  // so chunks without live blocks are dead; untracked chunks are always
  // treated as live. `adopted`: the range already holds data (managed host
  // memory handed to the device by torch.cuda.um.move_), so no action may
  // make pages for it (MapHost writes them); fresh from cudaMallocManaged
  // otherwise. Appends the actions that place it.
  void addSegment(
      uintptr_t base,
      uint64_t size,
      int device,
      void* stream,
      bool tracked,
      bool adopted,
      Policy policy,
      const DeviceLimits& limits,
      std::vector<Action>& out);
  struct SegmentInfo {
    uint64_t size;
    int device;
  };
  // Forgets a segment (the allocator released it): its size and device, or
  // nullopt if it is not a managed segment of the engine.
  std::optional<SegmentInfo> removeSegment(uintptr_t base);

  // The allocator handed out [addr, addr+size) on `stream`: the range is
  // about to be written on its device, and its old content is dead, unless
  // the segment is `replayed` (Note [Graph pools: a free is not a death]).
  // Returns true if the block revives a chunk that was dead: the caller must
  // then order the block's first use after every action decided so far
  // (Note [Reviving a dead chunk]).
  bool onAlloc(
      uintptr_t addr,
      uint64_t size,
      void* stream,
      Policy policy,
      const DeviceLimits& limits,
      std::vector<Action>& out,
      bool replayed = false);
  // The allocator took [addr, addr+size) back: its bytes are dead, unless
  // the segment is `replayed`.
  void onFree(uintptr_t addr, uint64_t size, bool replayed = false);

  // [addr, addr+size) (live data) is about to be used on `device`: bring it
  // there, making room under the budget. `read_only`: the use only reads
  // it (Note [Read-only duplicates]). `hold`: keep the chunks that hold only
  // the range's bytes on the device until a block event over them (Note [Held
  // ranges]; read_only is then ignored). `needed_at`: the use is predicted
  // at that position, not now (the lookahead): room is made only from data
  // needed later (makeRoom); what finds none stays where it is until its
  // operator's touch. Returns the bytes asked to move.
  uint64_t touch(
      uintptr_t addr,
      uint64_t size,
      int device,
      void* stream,
      Policy policy,
      const DeviceLimits& limits,
      std::vector<Action>& out,
      bool read_only = false,
      bool hold = false,
      uint64_t needed_at = 0);
  // Note [The learned eviction order]: the live chunks of [addr, addr+size)
  // on their device (not held, not read-only scans) are next used at
  // position `due` (0: no prediction, they go back to the plain order).
  // Returns the bytes filed.
  uint64_t plan(uintptr_t addr, uint64_t size, uint64_t due);
  // The signal's positions on `device` for the order above.
  void setPlanClock(int device, PlanClock clock);
  // Note [Forgotten content]: the content of live [addr, addr+size) is dead
  // until the range is next touched. Returns the bytes of the chunks marked
  // stale (those wholly inside the range, holding no other live bytes).
  uint64_t forget(uintptr_t addr, uint64_t size);
  // Send [addr, addr+size) to host RAM (an explicit prefetch to the CPU).
  uint64_t evict(
      uintptr_t addr,
      uint64_t size,
      void* stream,
      const DeviceLimits& limits,
      std::vector<Action>& out);

  // Note [Ledger traces]: `sink` (not owned; nullptr: none) receives every
  // call that changes the ledger from now on.
  void setTrace(TraceSink* sink) {
    trace_ = sink;
  }
  // Replays only: another order for dead victims (not owned; nullptr: the
  // least recently touched, the ledger's own).
  void setDeadChoice(DeadChoice* choice) {
    dead_choice_ = choice;
  }

  // The device of the managed segment holding addr, or -1 (interior
  // pointers of split blocks included).
  int deviceOf(uintptr_t addr) const;

  uint64_t bytesOn(int device, Where where) const;
  // Note [Near the budget]: the managed bytes of `device`, wherever they
  // are, plus `extra` exceed 90 % of `budget`. Only then is the eviction
  // order kept up to date, and only then does the Python layer report uses:
  // a job that fits (data left in host RAM by earlier work included) pays
  // for neither.
  bool nearBudget(int device, uint64_t budget, uint64_t extra) const;
  uint64_t deadOnDevice(int device) const;
  const ResidencyCounters& counters() const {
    return counters_;
  }

  // Empty if the ledger is consistent, else what is wrong (tests).
  std::string checkInvariants() const;
  // Note [Orders built on demand]: fills the device's eviction orders from
  // its chunks, once; makeRoom calls it (public for the tests, which compare
  // orders built late with orders kept from the start).
  void ensureOrdered(int device);
  bool ordered(int device) const {
    return static_cast<size_t>(device) < devices_.size() && devices_[device].ordered;
  }
  // Where the chunk at addr is, and its live bytes (tests).
  Where whereIs(uintptr_t addr) const;
  uint32_t liveBytesAt(uintptr_t addr) const;
  // The bytes of [addr, addr+size), clipped to the segment holding addr, by
  // the Where of the chunks they lie in, and those of them in held chunks
  // (torch_um_where). The ledger's view: where the engine placed them, not
  // pages the driver moved on its own. All zero outside the engine's segments.
  struct Placement {
    uint64_t bytes[3] = {0, 0, 0}; // by Where
    uint64_t held = 0;
  };
  Placement placement(uintptr_t addr, uint64_t size) const;
  // The bytes at the end of [addr, addr+size) that lie in chunks placed in
  // host RAM, all in one segment: the part a CPU can copy in place (Note
  // [Copies shared with the CPU], HostCopy.h). 0 if the range's last byte is
  // not in host RAM or not in the segment holding addr. The last of hostRuns'
  // runs where it reaches the range's end.
  uint64_t hostTail(uintptr_t addr, uint64_t size) const;
  // The parts of [addr, addr+size) that lie in chunks placed in host RAM, as
  // (offset from addr, bytes), in address order, neighbours joined: what
  // CPU threads can copy in place (Note [Copies of pageable memory past the
  // budget], HostCopy.h). Empty if the range is not wholly in one segment.
  struct Run {
    uint64_t offset = 0;
    uint64_t bytes = 0;
  };
  std::vector<Run> hostRuns(uintptr_t addr, uint64_t size) const;
  // The parts of [0, size) outside `runs` (sorted, apart, as hostRuns gives
  // them), cut into pieces of at most `most` bytes: the bytes of such a copy
  // that are not the CPU's (Note [Pageable bytes on the device go through
  // page-locked buffers], HostCopy.cpp).
  static std::vector<Run> gaps(const std::vector<Run>& runs, uint64_t size, uint64_t most);

 private:
  struct Segment;
  // A chunk on the device, ordered by (tick, address): the eviction order.
  //
  // Note [The eviction order's cost]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // Near the budget every block event re-links each 2 MiB chunk its block
  // spans: a 64 MiB activation is 32 chunks, and an inference forward of a
  // 1.3 B model makes some 20 000 re-links. Erasing by key and inserting by
  // search took 11 % of that forward's host time (bench/README.md,
  // prediction step 23). So each chunk keeps its entry (Chunk::pos): unlink
  // erases through it, in amortized constant time, and link inserts with
  // the hint "at the end", which is constant time when the chunk's tick is
  // the newest, as it is for every use; a chunk re-linked at an older tick
  // (it changes state or set, not tick) is placed by search as before. An
  // unlink keeps its node (spare_) for the link that follows it, so that a
  // re-link allocates and frees nothing. A chunk records which order it is
  // in (Chunk::in), and unlink erases from that one: an entry is never
  // erased through another order, whatever the chunk's state says.
  //
  // Note [Orders built on demand]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // Only makeRoom reads the orders, and a job whose data fits never calls
  // it; yet each of its block events still moved every chunk that turned
  // dead or live from one order to the other: 40-45 ns a chunk on a
  // 2-core CPU (bench/probes/engine_event_cost.cpp), and on the GPU host's slow CPU
  // state 1.2-1.3 ms of a small GPT's step and 4.0-4.4 ms of a ResNet-50's
  // (the engine's own share, timed: Note [Timing the event path],
  // Engine.cpp). So a device's orders are built the first time makeRoom
  // needs them (DeviceLru::ordered); until then link and unlink keep each
  // chunk's kind (Chunk::in) and the byte counts and leave the sets alone:
  // 0.4 and 1.1 ms a step there (bench/README.md, prediction step 41). The
  // sets are a function of the chunks' (kind, tick, address), so the ones
  // built late are the ones that would have been kept all along, and make
  // the same decisions (tests/engine/residency_test.cpp,
  // ordersBuiltLateDecideAlike). Once built they are kept, as before.
  using Key = std::pair<uint64_t, uintptr_t>;
  using Order = std::set<Key>;
  // Which of its device's orders (DeviceLru) a chunk is in.
  // Planned and PlannedCold: chunks with a predicted next use whose pages
  // were (or were not) in host RAM before (Note [First evictions]).
  enum class OrderKind : uint8_t { None, Live, Scan, Dead, Planned, PlannedCold };
  static bool isPlanned(OrderKind kind) {
    return kind == OrderKind::Planned || kind == OrderKind::PlannedCold;
  }
  struct Chunk {
    Where where = Where::Unplaced;
    bool discarded = false; // pages dropped: must be placed before a write
    bool dup = false; // a read-only duplicate: ReadMostly is set on it
    bool scan = false; // last touched read-only (Note [Scans])
    // live, but its content is dead until its next touch (Note [Forgotten
    // content]): counted as dead by Segment::dead
    bool stale = false;
    // on the device until a block event over it: in no eviction order (Note
    // [Held ranges])
    bool held = false;
    // evicted while live and not on the device since (evicted_unused_bytes)
    bool evicted_live = false;
    // Its pages were in host RAM before (evicted or made there) and not
    // discarded since (Note [First evictions]).
    bool host_pages = false;
    uint64_t evicted_in = 0; // eviction batch that last moved it to host
    uint32_t live = 0; // bytes of live blocks in this chunk
    uint64_t tick = 0; // last touch
    // predicted next use (Note [The learned eviction order]); 0: none
    uint64_t due = 0;
    // Its entry in its device's order `in` while on the device (Note [The
    // eviction order's cost]); set by link(), erased through by unlink().
    OrderKind in = OrderKind::None;
    Order::iterator pos{};
  };
  struct Segment {
    uintptr_t base = 0;
    uint64_t size = 0;
    int device = 0;
    void* stream = nullptr;
    bool tracked = false;
    // Holds blocks of a private pool: CUDA graph replays write it
    // (Note [Graph pools: a free is not a death]).
    bool replayed = false;
    std::vector<Chunk> chunks;
    uint64_t chunkSize(size_t i) const {
      uint64_t lo = i * kChunkBytes;
      return std::min<uint64_t>(kChunkBytes, size - lo);
    }
    uintptr_t chunkAddr(size_t i) const {
      return base + i * kChunkBytes;
    }
    bool dead(size_t i) const {
      return tracked && (chunks[i].live == 0 || chunks[i].stale);
    }
    // [addr, addr+size) clipped to the segment: its end, and the chunks
    // [first, last) it overlaps.
    struct Span {
      uintptr_t hi;
      size_t first;
      size_t last;
    };
    Span span(uintptr_t addr, uint64_t size) const {
      const uintptr_t hi = std::min<uintptr_t>(addr + size, base + this->size);
      return Span{
          hi,
          static_cast<size_t>((addr - base) / kChunkBytes),
          static_cast<size_t>((hi - base + kChunkBytes - 1) / kChunkBytes)};
    }
  };
  struct DeviceLru {
    Order live; // device-resident chunks holding live bytes
    Order scan; // of those, the ones last touched read-only
    Order dead; // device-resident chunks with no live bytes
    // live chunks with a predicted next use, keyed by it (Note [The learned
    // eviction order]): those whose pages were in host RAM before, and those
    // whose pages never were (Note [First evictions]); and the signal's
    // positions
    Order planned;
    Order planned_cold;
    PlanClock clock;
    uint64_t bytes[3] = {0, 0, 0}; // by Where
    // The bytes of the chunks in `dead`, kept by link/unlink, so that
    // stats() costs no walk (Note [Dead bytes are counted]).
    uint64_t dead_bytes = 0;
    // The three orders hold their chunks (Note [Orders built on demand]);
    // until then only Chunk::in and the byte counts are kept.
    bool ordered = false;
    // Counted against the budget: unplaced pages migrate on first touch.
    uint64_t resident() const {
      return bytes[static_cast<int>(Where::Device)] +
          bytes[static_cast<int>(Where::Unplaced)];
    }
  };

  Segment* find(uintptr_t addr);
  const Segment* find(uintptr_t addr) const;
  DeviceLru& lru(int device);

  // Moves chunk i of seg to `to` and keeps the per-device sets and byte
  // counts true.
  void setWhere(Segment& seg, size_t i, Where to);
  void unlink(Segment& seg, size_t i);
  void link(Segment& seg, size_t i);
  // Makes chunk i the most recently touched, read-only (`scan`) or not.
  void retouch(Segment& seg, size_t i, bool scan = false);
  // Ends chunk i's staleness (Note [Forgotten content]), keeping its order.
  void unstale(Segment& seg, size_t i);
  // Every live byte of chunk i is [addr, hi)'s, and it has some: forget() and
  // holdChunks() mark only such chunks.
  bool onlyRangeLive(const Segment& seg, size_t i, uintptr_t addr,
                     uintptr_t hi) const;
  // Note [Held ranges]: holds the chunks [first, last) of seg that are on the
  // device and hold only [addr, hi)'s live bytes.
  void holdChunks(Segment& seg, size_t first, size_t last, uintptr_t addr,
                  uintptr_t hi);
  // The order chunk i belongs in by its state, and a device's order.
  OrderKind orderOf(const Segment& seg, size_t i) const;
  static Order& order(DeviceLru& d, OrderKind kind);
  // A chunk's key in its order: (due, address) in `planned`, else (tick,
  // address).
  static Key keyOf(const Segment& seg, size_t i, OrderKind kind) {
    return Key{isPlanned(kind) ? seg.chunks[i].due : seg.chunks[i].tick,
               seg.chunkAddr(i)};
  }
  // Sets a chunk's live bytes; `retick` also makes it the most recent.
  void setLive(Segment& seg, size_t i, uint32_t live, bool retick);
  // Note [Ranges larger than the budget]: a range of `size` bytes makes no
  // room on the device; it takes free room and streams the rest in place.
  static bool streamsInPlace(uint64_t size, const DeviceLimits& limits) {
    return size > limits.budget;
  }
  // Frees room for `need` bytes on `device` under `budget`, never taking a
  // chunk touched at or after `protect_tick`. `needed_at` (0: none): room
  // for a use predicted at that position, made only from chunks that leave
  // without a copy, overdue ones and those predicted later (Note [The learned
  // eviction order]). Returns the bytes freed.
  uint64_t makeRoom(
      int device,
      uint64_t need,
      const DeviceLimits& limits,
      uint64_t protect_tick,
      void* stream,
      std::vector<Action>& out,
      uint64_t needed_at = 0);
  // Brings chunks [first, last) of seg to the device; `dead_content`: the
  // toucher overwrites them (discard-and-prefetch is safe where no other
  // live bytes share the chunk).
  uint64_t bringIn(
      Segment& seg,
      size_t first,
      size_t last,
      void* stream,
      bool dead_content,
      uintptr_t lo,
      uintptr_t hi,
      const DeviceLimits& limits,
      std::vector<Action>& out,
      bool read_only = false);
  // The dead chunk dead_choice_ picks among those of `dead` touched before
  // `protect_tick` (at least the first is).
  uintptr_t chooseDead(const Order& dead, uint64_t protect_tick);
  // Chunk i of seg leaves the device (Where::Host): dropped and discarded
  // when dead, evicted when live, ReadMostly unset first if it is a dup.
  // Returns its bytes.
  uint64_t leave(Segment& seg, size_t i, const DeviceLimits& limits,
                 std::vector<Action>& out);
  // If chunk i of seg is a read-only duplicate, unset ReadMostly on it
  // first thing on its way off the device (Note [Read-only duplicates]).
  void dropDuplicate(Segment& seg, size_t i, void* stream,
                     std::vector<Action>& out);
  void emit(
      std::vector<Action>& out,
      uintptr_t segment,
      Action::Kind kind,
      uintptr_t addr,
      uint64_t size,
      int device,
      void* stream,
      uint64_t fence = 0);
  // The number of the current operation's batch of chunks leaving the
  // device on `stream`, by eviction or (`discard`) by discard: one evictor
  // job each, so that a number is issued all at once.
  uint64_t evictionBatch(void* stream, bool discard);

  std::map<uintptr_t, Segment> segments_;
  // Note [Finding a segment]: the segment over each 2 MiB of address space that
  // a segment covers (the last one added, where two share those 2 MiB).
  std::unordered_map<uintptr_t, Segment*> by_granule_;
  std::vector<DeviceLru> devices_;
  Order::node_type spare_; // Note [The eviction order's cost]
  uint64_t tick_ = 0;
  uint64_t evict_seq_ = 0; // eviction batches so far
  uint64_t evict_seq_tick_ = 0; // the operation (tick) of the last batch
  void* evict_seq_stream_ = nullptr; // and its stream
  bool evict_seq_discard_ = false; // and whether it discards
  ResidencyCounters counters_;
  TraceSink* trace_ = nullptr;
  DeadChoice* dead_choice_ = nullptr;
};

} // namespace c10::cuda::um
