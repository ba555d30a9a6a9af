#include <c10/cuda/um/HostAllocator.h>

#include <c10/core/CPUAllocator.h>
#include <c10/cuda/um/Engine.h>

#include <mutex>

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

int hostScope(int delta) {
  scope_depth += delta;
  if (scope_depth < 0) {
    scope_depth = 0;
  }
  return scope_depth;
}

} // namespace c10::cuda::um
