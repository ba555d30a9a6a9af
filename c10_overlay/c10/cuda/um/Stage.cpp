#include <c10/cuda/um/Stage.h>

#include <c10/core/StorageImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/um/HostCopy.h>

#include <utility>

namespace c10::cuda::um {

// A staged storage: the block it reads during the burst and its own DataPtr,
// the context of the DataPtr the storage holds meanwhile.
struct Stage::Staged {
  c10::DataPtr block; // from the caching allocator, on `stream`
  c10::DataPtr own; // the storage's, over `home` in host RAM
  void* home = nullptr;
  size_t bytes = 0;
  int device = -1;
  cudaStream_t stream = nullptr;
};

Stage& Stage::get() {
  static Stage* s = new Stage(); // never destroyed: storages may die at exit
  return *s;
}

uintptr_t Stage::homeOf(uintptr_t addr) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = staged_.find(addr);
  return it == staged_.end() ? 0 : reinterpret_cast<uintptr_t>(it->second->home);
}

bool Stage::written(uintptr_t home, const void* storage, uint64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  constexpr size_t kMostSeen = 1u << 16;
  if (seen_.size() >= kMostSeen) {
    seen_.clear(); // forgotten uses cost a period before a burst is staged
  }
  Seen& s = seen_[home];
  if (s.storage != storage) {
    s = Seen{storage, version, false}; // another storage at the address
  } else if (s.version != version) {
    s.version = version;
    s.moved = true; // kept: the burst's first use follows a use that read it
  }
  return s.moved;
}

void Stage::dropStaged(void* ctx) {
  // The storage died, or was given another DataPtr, while staged: its
  // content goes with it. Freeing the block and the own range needs no lock.
  auto* e = static_cast<Staged*>(ctx);
  Stage& stage = get();
  {
    std::lock_guard<std::mutex> lock(stage.mu_);
    stage.staged_.erase(reinterpret_cast<uintptr_t>(e->block.get()));
    stage.homes_.erase(reinterpret_cast<uintptr_t>(e->home));
    stage.counters_.dropped += 1;
  }
  delete e;
}

void Stage::candidate(bool on_host) {
  std::lock_guard<std::mutex> lock(mu_);
  counters_.candidates += 1;
  counters_.not_on_host += on_host ? 0 : 1;
}

bool Stage::stageIn(c10::StorageImpl* storage, int device, cudaStream_t stream) {
  const size_t bytes = storage->nbytes();
  void* home = const_cast<void*>(storage->data());
  if (home == nullptr || bytes == 0) {
    return false;
  }
  auto e = std::make_unique<Staged>();
  try {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    // The allocator takes the block on the device's current stream, the
    // operator's (the observer reads the same).
    e->block = c10::cuda::CUDACachingAllocator::get()->allocate(bytes);
    if (e->block.get() == nullptr ||
        !launchCopy(device, e->block.get(), home, bytes, stream)) {
      std::lock_guard<std::mutex> lock(mu_);
      counters_.failures += 1;
      return false; // the block goes back unused
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    counters_.failures += 1; // no room for the block: the touch moves it instead
    return false;
  }
  e->home = home;
  e->bytes = bytes;
  e->device = device;
  e->stream = stream;
  void* block = e->block.get();
  Staged* raw = e.release();
  raw->own = storage->set_data_ptr(
      c10::DataPtr(block, raw, &Stage::dropStaged, raw->block.device()));
  std::lock_guard<std::mutex> lock(mu_);
  staged_[reinterpret_cast<uintptr_t>(block)] = raw;
  homes_.insert(reinterpret_cast<uintptr_t>(home));
  counters_.ins += 1;
  counters_.in_bytes += bytes;
  return true;
}

namespace {

// `waiter` waits on the GPU for the work queued on `after` so far. False
// where no event could be made or recorded.
bool streamWaits(cudaStream_t waiter, cudaStream_t after) {
  if (waiter == after) {
    return true;
  }
  cudaEvent_t ev = nullptr;
  if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const bool ok = cudaEventRecord(ev, after) == cudaSuccess &&
      cudaStreamWaitEvent(waiter, ev, 0) == cudaSuccess;
  if (!ok) {
    cudaGetLastError();
  }
  cudaEventDestroy(ev); // legal once the wait is queued
  return ok;
}

} // namespace

void Stage::stageOut(c10::StorageImpl* storage, cudaStream_t stream) {
  const c10::DataPtr& current = storage->data_ptr();
  if (current.get_deleter() != &Stage::dropStaged) {
    return; // not staged, or given another DataPtr since
  }
  auto* e = static_cast<Staged*>(current.get_context());
  bool copied = false;
  {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(e->device));
    // The copy out runs on the staging stream after the ending operator's
    // work, and that stream waits for it: the block is freed on its own
    // stream after its last use, and the storage's next use reads the copy.
    if (streamWaits(e->stream, stream)) {
      copied = launchCopy(e->device, e->home, e->block.get(), e->bytes, e->stream) ||
          cudaMemcpyAsync(e->home, e->block.get(), e->bytes, cudaMemcpyDeviceToDevice,
                          e->stream) == cudaSuccess;
      copied = copied && streamWaits(stream, e->stream);
    }
    if (!copied) {
      cudaGetLastError();
    }
  }
  if (!copied) {
    std::lock_guard<std::mutex> lock(mu_);
    counters_.failures += 1; // the data stays on the block, which stays staged
    return;
  }
  c10::DataPtr mine = storage->set_data_ptr(std::move(e->own));
  (void)mine.release_context(); // the stage's DataPtr: its deleter must not run
  {
    std::lock_guard<std::mutex> lock(mu_);
    staged_.erase(reinterpret_cast<uintptr_t>(e->block.get()));
    homes_.erase(reinterpret_cast<uintptr_t>(e->home));
    counters_.outs += 1;
    counters_.out_bytes += e->bytes;
  }
  delete e; // the block goes back to the allocator, ordered on its stream
}

StageCounters Stage::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

} // namespace c10::cuda::um
