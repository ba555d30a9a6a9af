#include <c10/cuda/um/HostAllocator.h>

#include <c10/core/CPUAllocator.h>
#include <c10/cuda/um/Engine.h>

#include <cuda_runtime_api.h>

#include <semaphore.h>

#include <deque>
#include <mutex>
#include <thread>
#include <utility>

namespace c10::cuda::um {
namespace {

thread_local int scope_depth = 0;

void freeManagedHost(void* ptr) {
  Engine::get().freeHost(ptr);
}

// Above the default CPU allocator's registration (priority 0), so that the
// wrapper replaces it; an allocator registered higher is left alone.
constexpr uint8_t kPriority = 1;

} // namespace

c10::DataPtr ManagedHostAllocator::allocate(size_t n) {
  Engine& engine = Engine::get();
  if (engine.wantsHost(n, scope_depth)) {
    if (void* p = engine.allocHost(n)) {
      return {p, p, &freeManagedHost, c10::Device(c10::DeviceType::CPU)};
    }
  }
  return fallback_->allocate(n);
}

void ManagedHostAllocator::copy_data(
    void* dest,
    const void* src,
    std::size_t count) const {
  default_copy_data(dest, src, count);
}

std::string installHostAllocator() {
  static std::mutex mu;
  static ManagedHostAllocator* installed = nullptr; // leaked: outlives tensors
  std::lock_guard<std::mutex> lock(mu);
  c10::Allocator* current = c10::GetCPUAllocator();
  if (installed != nullptr && current == installed) {
    return "";
  }
  if (installed == nullptr) {
    installed = new ManagedHostAllocator(current);
  }
  c10::SetCPUAllocator(installed, kPriority);
  if (c10::GetCPUAllocator() != installed) {
    return "another CPU allocator is registered with a higher priority; "
           "managed host memory is not available in this process";
  }
  return "";
}

namespace {

struct Unpin {
  void* ptr;
  int device;
  std::function<void()> release;
};

// The background thread of Note [Pinned in place]; leaked on purpose, like
// the engine (storages may die during interpreter shutdown).
class Unpinner {
 public:
  void push(Unpin u) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!started_) {
        started_ = true;
        sem_init(&ready_, 0, 0);
        std::thread([this] { loop(); }).detach();
      }
      queue_.push_back(std::move(u));
    }
    sem_post(&ready_);
  }

 private:
  void loop() {
    for (;;) {
      std::deque<Unpin> batch;
      while (sem_wait(&ready_) != 0) {
        // EINTR: wait again
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        batch.swap(queue_); // may be empty: an earlier wake took this item
      }
      int synced = -1;
      for (Unpin& u : batch) {
        if (u.device != synced && cudaSetDevice(u.device) == cudaSuccess) {
          (void)cudaDeviceSynchronize(); // copies queued before the drop finish
          synced = u.device;
        }
        if (cudaHostUnregister(u.ptr) != cudaSuccess) {
          (void)cudaGetLastError();
        }
        u.release();
      }
    }
  }

  // A POSIX semaphore, as the evictor's: std::condition_variable::wait would
  // raise the wheel's platform tag (GLIBCXX_3.4.30 with GCC 12: manylinux_2_35).
  std::mutex mu_;
  sem_t ready_;
  std::deque<Unpin> queue_;
  bool started_ = false;
};

Unpinner& unpinner() {
  static Unpinner* u = new Unpinner();
  return *u;
}

} // namespace

std::string pinInPlace(void* ptr, size_t size) {
  cudaError_t e = cudaHostRegister(ptr, size, cudaHostRegisterDefault);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("cudaHostRegister failed: ") + cudaGetErrorString(e);
  }
  return "";
}

void unpinLater(void* ptr, int device, std::function<void()> release) {
  unpinner().push(Unpin{ptr, device, std::move(release)});
}

int hostScope(int delta) {
  scope_depth += delta;
  if (scope_depth < 0) {
    scope_depth = 0;
  }
  return scope_depth;
}

} // namespace c10::cuda::um
