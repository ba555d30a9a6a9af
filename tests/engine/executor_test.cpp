// The engine's Executor on the CPU (tests/unit/test_engine_executor.py), against the
// CUDA stand-ins of tests/engine/cuda_stub: two threads run the actions of the engine's
// decisions as the allocator's threads do (tickets taken under one lock, Note [Executor:
// one order]), each an eviction batch and a bring-in of pages an earlier batch evicted,
// while a third reads the counters. Built with ThreadSanitizer, and with AddressSanitizer
// and UBSan. Checks, from the stand-ins' log of every move issued:
//   - Note [Eviction fences]: a bring-in is issued after the eviction of its pages, or
//     that eviction is called off (Note [Cancelled moves]) and never issued;
//   - every eviction that is not called off is issued exactly once;
//   - drainAll() returns, and the counters add up;
//   - the jobs' events are reused, not made one a job, and none is lost.
// Prints "0 failures" when every check holds.
#include <c10/cuda/um/CudaCompat.h>
#include <c10/cuda/um/Executor.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

using namespace c10::cuda::um;

namespace {

constexpr uintptr_t kBase = uintptr_t{1} << 40;
constexpr uint64_t kChunk = 2ull << 20;
constexpr int kRangesPerBatch = 4;
constexpr int kIterations = 4000;

// Batch b evicts the chunks of its own region, so that each address is evicted once.
uintptr_t chunkOf(uint64_t batch, int k) {
  return kBase + batch * (kRangesPerBatch * kChunk) + static_cast<uint64_t>(k) * kChunk;
}

struct Driver {
  Executor ex;
  std::mutex engine; // the engine's lock: decisions and tickets in one order
  uint64_t batches = 0;
  std::set<uint64_t> returned; // batches whose region was brought back
  std::map<uintptr_t, uint64_t> evicted_in; // chunk -> its batch
  std::map<uintptr_t, uint64_t> brought_in; // chunk -> the batch it was brought back from

  void worker(int id) {
    std::mt19937_64 g(static_cast<uint64_t>(id));
    for (int it = 0; it < kIterations; ++it) {
      std::vector<Action> acts;
      uint64_t ticket = 0;
      {
        std::lock_guard<std::mutex> lock(engine);
        const uint64_t b = ++batches;
        const int device = static_cast<int>(g() % 2);
        for (int k = 0; k < kRangesPerBatch; ++k) {
          const uintptr_t a = chunkOf(b, k);
          acts.push_back(Action{Action::EvictToHost, a, kChunk, device,
                                reinterpret_cast<void*>(0x10), kBase, b});
          evicted_in[a] = b;
        }
        // Bring back an earlier batch's region (often the one just queued, whose
        // eviction may still wait in the queue and then is called off).
        const uint64_t back = b > 2 ? b - g() % 3 : 0;
        if (back > 0 && returned.insert(back).second) {
          // To this batch's device, whichever evicted it: the fence is what matters.
          acts.push_back(Action{Action::PrefetchToDevice, chunkOf(back, 0),
                                kChunk * kRangesPerBatch, device,
                                reinterpret_cast<void*>(0x10), kBase, back});
          for (int k = 0; k < kRangesPerBatch; ++k) {
            brought_in[chunkOf(back, k)] = back;
          }
        }
        ticket = ex.take();
      }
      ex.run(ticket, acts, /*prefetch=*/true);
    }
  }
};

} // namespace

int main() {
  static Driver d; // the evictor thread is detached: the executor must outlive it
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    while (!stop.load()) {
      (void)d.ex.counters();
    }
  });
  std::thread a([] { d.worker(1); });
  std::thread b([] { d.worker(2); });
  a.join();
  b.join();
  d.ex.drainAll();
  stop.store(true);
  reader.join();

  int failures = 0;
  auto fail = [&](const char* what, uintptr_t addr) {
    if (failures++ < 10) {
      std::printf("FAIL %s at chunk %#llx\n", what, static_cast<unsigned long long>(addr));
    }
  };
  // Per chunk: the sequence numbers of its evictions and bring-ins as issued.
  std::map<uintptr_t, std::vector<uint64_t>> out, in;
  {
    std::lock_guard<std::mutex> lock(compat::logMutex());
    for (const compat::Moved& m : compat::moveLog()) {
      // Logged by their start: an eviction is one chunk, a bring-in its region.
      (m.to == compat::kHost ? out : in)[m.addr].push_back(m.seq);
    }
  }
  uint64_t issued_out = 0, called_off = 0;
  for (const auto& [addr, batch] : d.evicted_in) {
    const auto o = out.find(addr);
    const size_t n = o == out.end() ? 0 : o->second.size();
    if (n > 1) {
      fail("eviction issued more than once", addr);
    }
    issued_out += n;
    called_off += n == 0;
    if (n == 0 && d.brought_in.count(addr) == 0) {
      fail("eviction neither issued nor called off by a bring-in", addr);
    }
  }
  for (const auto& [addr, batch] : d.brought_in) {
    if (addr != chunkOf(batch, 0)) {
      continue; // a bring-in is logged by the start of its region
    }
    const auto i = in.find(addr);
    const size_t times = i == in.end() ? 0 : i->second.size();
    if (times > 1) {
      fail("bring-in issued more than once", addr);
      continue;
    }
    for (int k = 0; k < kRangesPerBatch; ++k) {
      const auto o = out.find(chunkOf(batch, k));
      if (o == out.end()) {
        continue; // its eviction was called off: the pages never left
      }
      if (times == 0) {
        // Not issued: a bring-in does nothing only when every move it needed to
        // follow was called off.
        fail("bring-in dropped though its pages were evicted", chunkOf(batch, k));
      } else if (o->second.front() > i->second.front()) {
        fail("eviction issued after the bring-in that waited for it", chunkOf(batch, k));
      }
    }
  }
  const ExecutorCounters c = d.ex.counters();
  if (c.failures != 0) {
    fail("executor counted failures", 0);
  }
  if (c.cancelled_bytes != called_off * kChunk) {
    std::printf("cancelled_bytes %llu, chunks never evicted %llu\n",
                static_cast<unsigned long long>(c.cancelled_bytes),
                static_cast<unsigned long long>(called_off));
    fail("cancelled bytes disagree with the evictions never issued", 0);
  }
  std::printf("%llu batches, %llu chunks evicted, %llu called off, %llu fence waits\n",
              static_cast<unsigned long long>(d.batches),
              static_cast<unsigned long long>(issued_out),
              static_cast<unsigned long long>(called_off),
              static_cast<unsigned long long>(c.fence_waits));
  if (called_off == 0 || c.fence_waits == 0) {
    fail("the run exercised neither cancelled moves nor fence waits", 0);
  }
  // Note [Ready events are reused]: every job records one event; they come from a
  // free list that keeps at most 256 a device, so few are made, and none is lost.
  // Besides them, each of the two devices' side streams has `done` and a ring of 64.
  const long made = stubEventsCreated().load(), gone = stubEventsDestroyed().load();
  std::printf("%llu jobs, %ld events made, %ld destroyed\n",
              static_cast<unsigned long long>(d.batches), made, gone);
  if (made >= static_cast<long>(d.batches) / 4) {
    fail("ready events made per job, not reused", 0);
  }
  if (made - gone > 2 * (256 + 1 + 64)) {
    fail("ready events lost (neither free nor destroyed)", 0);
  }
  std::printf("%d failures\n", failures);
  return failures == 0 ? 0 : 1;
}
