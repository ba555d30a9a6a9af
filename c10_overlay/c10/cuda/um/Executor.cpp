#include <c10/cuda/um/Executor.h>

#include <c10/cuda/um/CudaCompat.h>
#include <c10/cuda/um/HostMemory.h>
#include <c10/util/Exception.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <system_error>
#include <thread>

namespace c10::cuda::um {

namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;

bool isBringIn(Action::Kind k) {
  return k == Action::PlaceOnDevice || k == Action::AdviseHost || k == Action::PrefetchToDevice ||
      k == Action::DiscardAndPrefetch || k == Action::PlaceOnHost ||
      k == Action::DuplicateToDevice;
}

// Restores the calling thread's current device.
struct DeviceGuard {
  int saved = -1;
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&saved) != cudaSuccess) {
      (void)cudaGetLastError();
      saved = -1;
    }
    if (saved != device) {
      (void)cudaSetDevice(device);
    }
  }
  ~DeviceGuard() {
    if (saved >= 0) {
      (void)cudaSetDevice(saved);
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
};

// Prefetches on any stream: one range by cudaMemPrefetchAsync (which also
// takes the legacy default stream), several by the batch API, which does not
// (and exists from CUDA 13).
cudaError_t prefetchOn(
    std::vector<void*>& ptrs,
    std::vector<size_t>& sizes,
    int to,
    cudaStream_t stream) {
  if (ptrs.size() == 1 || stream == nullptr || stream == cudaStreamLegacy ||
      !compat::kHasBatch) {
    for (size_t k = 0; k < ptrs.size(); ++k) {
      cudaError_t e = compat::prefetch(ptrs[k], sizes[k], to, stream);
      if (e != cudaSuccess) {
        return e;
      }
    }
    return cudaSuccess;
  }
  return compat::prefetchBatch(
      ptrs.data(), sizes.data(), ptrs.size(), to, stream);
}

} // namespace

Executor::Side& Executor::side(int device) {
  std::lock_guard<std::mutex> lock(sides_mu_);
  if (sides_.size() <= static_cast<size_t>(device)) {
    sides_.resize(static_cast<size_t>(device) + 1, nullptr);
  }
  if (sides_[device] == nullptr) {
    sides_[device] = new Side();
  }
  return *sides_[device];
}

// Note [Ready events are reused]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every eviction or discard job carries an event recorded on the chunk's
// stream. Made with cudaEventCreate and destroyed by the evictor, each one
// took the driver's lock twice, and that lock is held for the whole of a
// managed-memory call on any thread: while the evictor discards 128 MiB
// (0.5 ms) or evicts it (14 ms), a cudaEventCreate or cudaLaunchKernel on
// the compute thread waits (bench/probes/launch_contention.cu; bench/README.md,
// prediction step 35, where the backward's allocations waited in
// cuEventCreate). So a job's event comes from a free list of its device and
// goes back to it once the evictor has queued its wait on it: a stream wait
// takes the event's latest record at the time of the call, so recording the
// event again later changes nothing for it. The list keeps at most
// kFreeEvents; events past that are destroyed.
constexpr size_t kFreeEvents = 256;

cudaError_t Executor::takeEvent(int device, cudaEvent_t* out) {
  Side& s = side(device);
  {
    std::lock_guard<std::mutex> lock(s.events_mu);
    if (!s.free_events.empty()) {
      *out = s.free_events.back();
      s.free_events.pop_back();
      return cudaSuccess;
    }
  }
  DeviceGuard guard(device);
  return cudaEventCreateWithFlags(out, cudaEventDisableTiming);
}

void Executor::giveEvent(int device, cudaEvent_t event) {
  if (event == nullptr) {
    return;
  }
  Side& s = side(device);
  {
    std::lock_guard<std::mutex> lock(s.events_mu);
    if (s.free_events.size() < kFreeEvents) {
      s.free_events.push_back(event);
      return;
    }
  }
  (void)cudaEventDestroy(event);
}

bool Executor::ensureSide(Side& s, int device) {
  if (s.stream != nullptr) {
    return true;
  }
  DeviceGuard guard(device);
  cudaError_t e = cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) {
    e = cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming);
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    s.stream = nullptr;
    return false;
  }
  return true;
}

void Executor::fail(cudaError_t err, const Action& a) {
  (void)cudaGetLastError();
  failures_.fetch_add(1, kRelaxed);
  TORCH_WARN_ONCE(
      "unified memory: ",
      actionName(a.kind),
      " of ",
      a.size,
      " bytes failed (",
      cudaGetErrorString(err),
      "); the data stays correct, only its placement is not what the engine "
      "asked for. Further failures are counted in torch.cuda.um.stats().");
}

uint64_t Executor::group(
    const std::vector<Action>& actions,
    size_t& i,
    std::vector<void*>& ptrs,
    std::vector<size_t>& sizes) {
  ptrs.clear();
  sizes.clear();
  const ActionGroup g = nextGroup(actions, i);
  for (; i < g.end; ++i) {
    ptrs.push_back(reinterpret_cast<void*>(actions[i].addr));
    sizes.push_back(actions[i].size);
  }
  return g.fence;
}

void Executor::enqueue(EvictJob job) {
  try {
    std::call_once(sem_once_, [this] { sem_init(&queue_sem_, 0, 0); });
    std::call_once(
        evictor_once_, [this] { std::thread([this] { evictorLoop(); }).detach(); });
  } catch (const std::exception& err) {
    // No evictor thread (the process is out of threads): the job's pages stay
    // where they are, a hint lost like any failed move. Its batch number is
    // published as issued all the same, or a later use of those pages would
    // wait for it forever (waitFor); call_once tries again next time.
    // The event's record is still ahead of nothing that waits on it.
    giveEvent(job.device, job.ready);
    Side& s = side(job.device);
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.issued.store(job.seq, std::memory_order_release);
    }
    failures_.fetch_add(1, kRelaxed);
    TORCH_WARN_ONCE(
        "unified memory: the evictor thread could not start (", err.what(),
        "); data the engine would move to host RAM stays where it is. Further "
        "failures are counted in torch.cuda.um.stats().");
    return;
  }
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    side(job.device).queued.store(job.seq, std::memory_order_relaxed);
    queue_.push_back(std::move(job));
    jobs_queued_.fetch_add(1, std::memory_order_relaxed);
  }
  sem_post(&queue_sem_);
}

void Executor::drain(int device) {
  Side& s = side(device);
  const uint64_t upto = s.queued.load(std::memory_order_relaxed);
  while (s.issued.load(std::memory_order_acquire) < upto) {
    std::this_thread::yield();
  }
}

void Executor::drainAll() {
  uint64_t upto = 0;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    upto = jobs_queued_.load(std::memory_order_relaxed);
  }
  while (jobs_done_.load(std::memory_order_acquire) < upto) {
    std::this_thread::yield();
  }
}

void Executor::evictorLoop() {
  for (;;) {
    while (sem_wait(&queue_sem_) != 0) {
    }
    // The job stays at the front while it is issued (Note [Cancelled
    // moves]); deque::push_back keeps the reference valid.
    EvictJob* taken = nullptr;
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      taken = &queue_.front();
      taken_ = true;
    }
    EvictJob& job = *taken;
    const auto t0 = std::chrono::steady_clock::now();
    Side& s = side(job.device);
    cudaError_t e = cudaSetDevice(job.device);
    // Note [Discards leave through the evictor]: host waits, outside s.mu,
    // for a job that still moves anything.
    const bool moves = !job.ptrs.empty();
    if (e == cudaSuccess && moves && job.ready != nullptr) {
      e = cudaEventSynchronize(job.ready);
    }
    if (e == cudaSuccess && moves && job.discard) {
      cudaStream_t side_stream = nullptr;
      {
        std::lock_guard<std::mutex> lock(s.mu);
        side_stream = s.stream;
      }
      if (side_stream != nullptr) {
        e = cudaStreamSynchronize(side_stream);
      }
    }
    evictor_wait_ns_.fetch_add(
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::steady_clock::now() - t0)
                                  .count()),
        kRelaxed);
    evict_ranges_.fetch_add(job.ptrs.size(), kRelaxed);
    evictor_issuing_.store(true, kRelaxed);
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (e == cudaSuccess && !ensureSide(s, job.device)) {
        e = cudaErrorUnknown;
      }
      if (e == cudaSuccess && job.ready != nullptr) {
        e = cudaStreamWaitEvent(s.stream, job.ready, 0);
        if (e == cudaSuccess && moves) {
          e = job.discard
              ? compat::discardBatch(
                    job.ptrs.data(), job.sizes.data(), job.ptrs.size(), s.stream)
              : prefetchOn(job.ptrs, job.sizes, compat::kHost, s.stream);
        }
        if (e == cudaSuccess) {
          e = cudaEventRecord(s.done, s.stream);
          s.used = true;
        }
        const size_t slot = job.seq % Side::kRing;
        if (e == cudaSuccess && s.ring[slot] == nullptr) {
          e = cudaEventCreateWithFlags(&s.ring[slot], cudaEventDisableTiming);
        }
        if (e == cudaSuccess) {
          e = cudaEventRecord(s.ring[slot], s.stream);
          s.ring_seq[slot] = job.seq;
        }
      }
      // Reached even on failure: nothing may wait for it forever.
      s.issued.store(job.seq, std::memory_order_release);
    }
    evictor_issuing_.store(false, kRelaxed);
    // Waited on (or never to be): free for the next job (Note [Ready events
    // are reused]).
    giveEvent(job.device, job.ready);
    const int device = job.device;
    const bool discard = job.discard;
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      queue_.pop_front();
      taken_ = false;
    }
    if (e != cudaSuccess) {
      fail(e, Action{discard ? Action::Discard : Action::EvictToHost, 0, 0,
                     device, nullptr});
    }
    calls_.fetch_add(4, kRelaxed);
    evictor_ns_.fetch_add(
        std::chrono::duration_cast<std::chrono::nanoseconds>(
            std::chrono::steady_clock::now() - t0)
            .count(),
        kRelaxed);
    jobs_done_.fetch_add(1, std::memory_order_release);
  }
}

uint64_t Executor::cancelQueued(
    int device,
    std::vector<void*>& ptrs,
    std::vector<size_t>& sizes) {
  std::lock_guard<std::mutex> lock(queue_mu_);
  const size_t first = taken_ ? 1 : 0;
  if (queue_.size() <= first) {
    return 0;
  }
  std::vector<JobRanges> queued;
  std::vector<JobRanges> taken;
  for (size_t j = 0; j < queue_.size(); ++j) {
    EvictJob& job = queue_[j];
    if (job.device == device) {
      (j < first ? taken : queued).push_back(JobRanges{&job.ptrs, &job.sizes});
    }
  }
  uint64_t removed = 0;
  size_t keep = 0;
  for (size_t k = 0; k < ptrs.size(); ++k) {
    const auto lo = reinterpret_cast<uintptr_t>(ptrs[k]);
    const uintptr_t hi = lo + sizes[k];
    if (!coveredWhole(queued, taken, lo, hi)) {
      ptrs[keep] = ptrs[k];
      sizes[keep] = sizes[k];
      ++keep;
      continue;
    }
    for (const JobRanges& job : queued) {
      cutOut(job, lo, hi);
    }
    removed += sizes[k];
  }
  ptrs.resize(keep);
  sizes.resize(keep);
  return removed;
}

cudaError_t Executor::waitFor(int device, uint64_t fence, cudaStream_t stream) {
  Side& s = side(device);
  // The batch is queued (the engine's order); wait until it is issued.
  if (s.issued.load(std::memory_order_acquire) < fence) {
    using Clock = std::chrono::steady_clock;
    uint64_t total = 0;
    uint64_t issuing = 0;
    auto last = Clock::now();
    while (s.issued.load(std::memory_order_acquire) < fence) {
      std::this_thread::yield();
      const auto now = Clock::now();
      const auto ns = static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(now - last)
              .count());
      total += ns;
      issuing += evictor_issuing_.load(kRelaxed) ? ns : 0;
      last = now;
    }
    fence_waits_.fetch_add(1, kRelaxed);
    fence_wait_ns_.fetch_add(total, kRelaxed);
    fence_wait_issuing_ns_.fetch_add(issuing, kRelaxed);
  }
  std::lock_guard<std::mutex> lock(s.mu);
  const size_t slot = fence % Side::kRing;
  if (s.ring_seq[slot] == fence) {
    return cudaStreamWaitEvent(stream, s.ring[slot], 0);
  }
  // Overwritten in the ring: a later batch's event covers it.
  return s.used ? cudaStreamWaitEvent(stream, s.done, 0) : cudaSuccess;
}

void Executor::run(
    uint64_t ticket,
    const std::vector<Action>& actions,
    bool prefetch) {
  while (serving_.load(std::memory_order_acquire) != ticket) {
    std::this_thread::yield();
  }
  struct Next {
    std::atomic<uint64_t>& serving;
    uint64_t ticket;
    ~Next() {
      serving.store(ticket + 1, std::memory_order_release);
    }
  } next{serving_, ticket};
  if (actions.empty()) {
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<void*> ptrs;
  std::vector<size_t> sizes;
  uint64_t calls = 0;
  // Evictions and discards first (they make the room), then bring-ins.
  for (int pass = 0; pass < 2; ++pass) {
    size_t i = 0;
    while (i < actions.size()) {
      const Action a = actions[i];
      if (isBringIn(a.kind) != (pass == 1)) {
        ++i;
        continue;
      }
      const uint64_t fence = group(actions, i, ptrs, sizes);
      if (fence > 0 &&
          (a.kind == Action::PrefetchToDevice ||
           a.kind == Action::DiscardAndPrefetch)) {
        // Note [Cancelled moves]: pages whose way out is still queued stay.
        cancelled_bytes_.fetch_add(
            cancelQueued(a.device, ptrs, sizes), kRelaxed);
        if (ptrs.empty()) {
          continue;
        }
      }
      auto stream = static_cast<cudaStream_t>(a.stream);
      cudaError_t e = cudaSuccess;
      switch (a.kind) {
        case Action::PlaceOnDevice:
        case Action::PrefetchToDevice:
        case Action::DuplicateToDevice:
          if (fence > 0) {
            // Queued after the eviction of the same pages, never before it.
            e = waitFor(a.device, fence, stream);
            ++calls;
          }
          // Note [Read-only duplicates]: with ReadMostly set, the prefetch
          // below copies the pages and the host keeps its own.
          for (size_t k = 0; a.kind == Action::DuplicateToDevice &&
               k < ptrs.size() && e == cudaSuccess;
               ++k) {
            e = compat::advise(
                ptrs[k], sizes[k], cudaMemAdviseSetReadMostly, a.device);
            ++calls;
          }
          if (e == cudaSuccess &&
              (a.kind != Action::PlaceOnDevice || prefetch)) {
            e = prefetchOn(ptrs, sizes, a.device, stream);
            ++calls;
          }
          break;
        case Action::DropDuplicate:
          // Not stream-ordered, and need not be: a kernel still reading the
          // pages reads the host copy that the drop keeps. Issued before
          // the chunk's eviction (next in the list), which then moves only
          // pages a write has made GPU-only.
          for (size_t k = 0; k < ptrs.size() && e == cudaSuccess; ++k) {
            e = compat::advise(
                ptrs[k], sizes[k], cudaMemAdviseUnsetReadMostly, a.device);
            ++calls;
          }
          break;
        case Action::DiscardAndPrefetch:
        case Action::PlaceOnHost: {
          // After the evictor's move or discard of the same pages, if any:
          // wait for its batch (Note [Eviction fences]).
          if (fence > 0) {
            e = waitFor(a.device, fence, stream);
            ++calls;
          }
          // Note [Dead content is prefetched, not discarded]
          if (e == cudaSuccess) {
            const int to =
                a.kind == Action::PlaceOnHost ? compat::kHost : a.device;
            e = prefetchOn(ptrs, sizes, to, stream);
            ++calls;
          }
          break;
        }
        case Action::AdviseHost:
        case Action::MapHost:
          for (size_t k = 0; k < ptrs.size() && e == cudaSuccess; ++k) {
            e = compat::advise(
                ptrs[k], sizes[k], cudaMemAdviseSetPreferredLocation,
                compat::kHost);
            if (e == cudaSuccess) {
              e = compat::advise(
                  ptrs[k], sizes[k], cudaMemAdviseSetAccessedBy, a.device);
            }
            calls += 2;
          }
          if (e == cudaSuccess && prefetch && a.kind == Action::MapHost) {
            // Populate host pages now, so that first GPU touches map them
            // instead of faulting each into existence (Note [Host pages
            // are populated by CPU threads], HostMemory.cpp).
            populateOnHost(ptrs, sizes);
          }
          break;
        case Action::EvictToHost:
        case Action::Discard: {
          // Recorded here, issued by the evictor thread (Note [Evictor
          // thread], Note [Discards leave through the evictor]). A job is
          // queued even if the event fails, so that the batch number is
          // always reached.
          EvictJob job{a.device, a.fence, nullptr, ptrs, sizes,
                       a.kind == Action::Discard};
          e = takeEvent(a.device, &job.ready);
          if (e == cudaSuccess) {
            DeviceGuard guard(a.device);
            e = cudaEventRecord(job.ready, stream);
          }
          if (e != cudaSuccess) {
            if (job.ready != nullptr) {
              (void)cudaEventDestroy(job.ready);
            }
            job.ready = nullptr;
            job.ptrs.clear();
            job.sizes.clear();
          }
          enqueue(std::move(job));
          calls += 2;
          break;
        }
      }
      if (e != cudaSuccess) {
        fail(e, a);
      }
    }
  }
  calls_.fetch_add(calls, kRelaxed);
  ns_.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now() - t0)
          .count(),
      kRelaxed);
}

ExecutorCounters Executor::counters() const {
  return ExecutorCounters{
      calls_.load(), failures_.load(), ns_.load(), evictor_ns_.load(),
      cancelled_bytes_.load(), evictor_wait_ns_.load(), evict_ranges_.load(),
      fence_waits_.load(), fence_wait_ns_.load(),
      fence_wait_issuing_ns_.load()};
}

} // namespace c10::cuda::um
