// Do kernel launches on one thread wait behind managed-memory calls on another?
// (bench/README.md, prediction step 35.) Past the budget, Llama training's backward
// spends 53 us in each cudaLaunchKernel against 14 in its forward and 5 in stock, while
// the engine's evictor thread discards dead chunks and the allocating thread places
// them again. This probe takes the model out: one thread launches empty kernels and
// times each call, while a second thread runs one kind of managed-memory call in a
// loop over 2 MiB chunks of a small managed arena (at most 1 GiB, and never more than
// a fifth of the free memory read at start: far inside the device).
//
//   nvcc -O2 -std=c++17 -Ic10_overlay -o launch_contention bench/probes/launch_contention.cu
//   ./launch_contention [LAUNCHES]      (launches in an idle row, 20000; a tenth in the others)
//
// Rows (one JSON object each on stdout, with the launch times and the other calls'
// count and mean time by kind):
//   idle              nothing else runs
//   discard+place     the other thread: cudaMemDiscardBatchAsync of 64 chunks, then
//                     cudaMemPrefetchBatchAsync of the same chunks to the device (the
//                     engine's Discard, then DiscardAndPrefetch), each followed by a
//                     stream synchronize
//   discard-only      the other thread: discards only (already-discarded chunks after
//                     the first round: the call's own cost)
//   place-only        the other thread: prefetches of resident chunks to the device
//   migrate           the other thread: chunks to host and back (real copies)
//   same-thread       no other thread; the launching thread itself issues one
//                     discard and one place of 4 chunks every 16 launches (the
//                     allocating thread's DiscardAndPrefetch path)
#include <c10/cuda/um/CudaCompat.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace compat = c10::cuda::um::compat;

__global__ void empty_kernel() {}

constexpr size_t kChunk = 2ull << 20;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "launch_contention: %s failed: %s\n", what,
                 cudaGetErrorString(e));
    std::exit(1);
  }
}

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Arena {
  char* base = nullptr;
  size_t chunks = 0;
  std::vector<void*> ptrs(size_t first, size_t n) const {
    std::vector<void*> v;
    for (size_t i = 0; i < n; ++i) {
      v.push_back(base + ((first + i) % chunks) * kChunk);
    }
    return v;
  }
};

// The engine's own call forms (c10_overlay/c10/cuda/um/CudaCompat.h): -1 is the host.
void prefetch(std::vector<void*>& p, int device, cudaStream_t s) {
  std::vector<size_t> sizes(p.size(), kChunk);
  check(compat::prefetchBatch(p.data(), sizes.data(), p.size(), device, s),
        "cudaMemPrefetchBatchAsync");
}

void discard(std::vector<void*>& p, cudaStream_t s) {
  std::vector<size_t> sizes(p.size(), kChunk);
  check(compat::discardBatch(p.data(), sizes.data(), p.size(), s),
        "cudaMemDiscardBatchAsync");
}

// Time spent in each kind of call, and how many were made.
struct Calls {
  double discard_us = 0, place_us = 0, to_host_us = 0;
  long discards = 0, places = 0, to_host = 0;
  void timed(double& us, long& n, const std::function<void()>& f) {
    const double t = now_us();
    f();
    us += now_us() - t;
    ++n;
  }
};

// The other thread's loop: one kind of call until told to stop. Each call is
// followed by a stream synchronize, outside its timing.
Calls other_thread(const std::string& kind, const Arena& a, std::atomic<bool>& stop,
                   int device) {
  check(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  Calls c;
  size_t at = 0;
  auto sync = [&] { check(cudaStreamSynchronize(s), "sync"); };
  while (!stop.load(std::memory_order_relaxed)) {
    auto p = a.ptrs(at, 64);
    at += 64;
    if (kind == "discard+place") {
      c.timed(c.discard_us, c.discards, [&] { discard(p, s); });
      sync();
      c.timed(c.place_us, c.places, [&] { prefetch(p, device, s); });
    } else if (kind == "discard-only") {
      c.timed(c.discard_us, c.discards, [&] { discard(p, s); });
    } else if (kind == "place-only") {
      c.timed(c.place_us, c.places, [&] { prefetch(p, device, s); });
    } else if (kind == "migrate") {
      c.timed(c.to_host_us, c.to_host, [&] { prefetch(p, compat::kHost, s); });
      sync();
      c.timed(c.place_us, c.places, [&] { prefetch(p, device, s); });
    }
    sync();
  }
  check(cudaStreamDestroy(s), "cudaStreamDestroy");
  return c;
}

void row(const std::string& kind, const Arena& a, int launches, int device) {
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  std::atomic<bool> stop{false};
  Calls calls;
  std::thread other;
  const bool threaded = kind != "idle" && kind != "same-thread";
  if (threaded) {
    other = std::thread([&] { calls = other_thread(kind, a, stop, device); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::vector<double> us;
  us.reserve(launches);
  size_t at = 0;
  const double t0 = now_us();
  for (int i = 0; i < launches; ++i) {
    if (kind == "same-thread" && i % 16 == 0) {
      auto p = a.ptrs(at, 4);
      at += 4;
      calls.timed(calls.discard_us, calls.discards, [&] { discard(p, s); });
      calls.timed(calls.place_us, calls.places, [&] { prefetch(p, device, s); });
    }
    const double t = now_us();
    empty_kernel<<<1, 32, 0, s>>>();
    us.push_back(now_us() - t);
    if (i % 256 == 255) {  // keep the queue short: launches, not a full queue
      check(cudaStreamSynchronize(s), "sync");
    }
  }
  check(cudaGetLastError(), "kernel launch");
  check(cudaStreamSynchronize(s), "sync");
  const double wall = now_us() - t0;
  stop.store(true);
  if (threaded) {
    other.join();
  }
  check(cudaStreamDestroy(s), "cudaStreamDestroy");
  std::sort(us.begin(), us.end());
  double sum = 0;
  for (double v : us) {
    sum += v;
  }
  auto per = [](double us_total, long n) { return n ? us_total / n : 0.0; };
  auto pct = [&](double q) { return us[static_cast<size_t>(q * (us.size() - 1))]; };
  std::printf(
      "{\"row\": \"%s\", \"launches\": %d, \"launch_us_mean\": %.2f, "
      "\"launch_us_p50\": %.2f, \"launch_us_p90\": %.2f, \"launch_us_p99\": %.2f, "
      "\"launch_us_max\": %.1f, \"wall_ms\": %.1f, \"discards\": %ld, "
      "\"discard_us_per_call\": %.1f, \"places\": %ld, \"place_us_per_call\": %.1f, "
      "\"to_host\": %ld, \"to_host_us_per_call\": %.1f}\n",
      kind.c_str(), launches, sum / us.size(), pct(0.5), pct(0.9), pct(0.99),
      us.back(), wall / 1000.0, calls.discards, per(calls.discard_us, calls.discards),
      calls.places, per(calls.place_us, calls.places), calls.to_host,
      per(calls.to_host_us, calls.to_host));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const int launches = argc > 1 ? std::atoi(argv[1]) : 20000;
  if (launches < 256) {
    std::fprintf(stderr, "LAUNCHES must be at least 256\n");
    return 2;
  }
  const int device = 0;
  check(cudaSetDevice(device), "cudaSetDevice");
  size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  Arena a;
  const size_t bytes = std::min<size_t>(1ull << 30, free_b / 5) / kChunk * kChunk;
  a.chunks = bytes / kChunk;
  if (a.chunks < 64) {
    std::fprintf(stderr, "launch_contention: only %zu bytes free\n", free_b);
    return 1;
  }
  check(cudaMallocManaged(reinterpret_cast<void**>(&a.base), bytes), "cudaMallocManaged");
  {
    cudaStream_t s;  // batches never take the legacy default stream
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    auto all = a.ptrs(0, a.chunks);
    prefetch(all, device, s);
    check(cudaStreamSynchronize(s), "sync");
    check(cudaStreamDestroy(s), "cudaStreamDestroy");
  }
  std::printf("{\"free_at_start\": %zu, \"managed_bytes\": %zu}\n", free_b, bytes);
  for (const char* kind : {"idle", "discard+place", "discard-only", "place-only",
                           "migrate", "same-thread", "idle"}) {
    // A launch behind a managed-memory call can take milliseconds: a tenth as many.
    const bool alone = std::string(kind) == "idle";
    row(kind, a, alone ? launches : launches / 10, device);
  }
  check(cudaFree(a.base), "cudaFree");
  return 0;
}
