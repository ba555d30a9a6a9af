// The event inlet: the caching allocator's trace tracker, turned into the
// engine's block events. The same tracker API exists on every supported
// torch (2.6's TraceEntry lives in c10::cuda::CUDACachingAllocator, later
// versions' in c10::CachingDeviceAllocator with a using-declaration there),
// so both integration paths use this one translation.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/um/UnifiedMemory.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <type_traits>
#include <utility>

namespace c10::cuda::um {

namespace {

using TraceEntry = c10::cuda::CUDACachingAllocator::TraceEntry;

template <typename E, typename = void>
struct NamesPool : std::false_type {};
template <typename E>
struct NamesPool<E, std::void_t<decltype(std::declval<const E&>().mempool_)>>
    : std::true_type {};

// Torch 2.8 added the block's pool to every trace entry: {0, 0} is the
// default pool, anything else a private one (a CUDA graph's, or a MemPool).
template <typename E>
BlockPool poolOf(const E& e) {
  if constexpr (NamesPool<E>::value) {
    const auto& id = e.mempool_;
    return id.first == 0 && id.second == 0 ? BlockPool::Default
                                           : BlockPool::Private;
  } else {
    return BlockPool::Unknown;
  }
}

void onTrace(const TraceEntry& e) {
  // Under the allocator's device lock: the engine acts at once, so that a
  // placement is queued on the stream before the block's first kernel.
  switch (e.action_) {
    case TraceEntry::ALLOC:
      onBlockEvent(
          BlockEvent::Alloc,
          static_cast<uintptr_t>(e.addr_),
          e.size_,
          reinterpret_cast<cudaStream_t>(e.stream_),
          poolOf(e));
      break;
    case TraceEntry::FREE_COMPLETED:
      onBlockEvent(
          BlockEvent::FreeCompleted,
          static_cast<uintptr_t>(e.addr_),
          e.size_,
          reinterpret_cast<cudaStream_t>(e.stream_),
          poolOf(e));
      break;
    default:
      break;
  }
}

} // namespace

void attachBlockEvents() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto* alloc = c10::cuda::CUDACachingAllocator::get();
    TORCH_CHECK(alloc != nullptr, "the CUDA caching allocator is not set up");
    std::string name = alloc->name();
    TORCH_CHECK(
        name == "native",
        "the CUDA allocator backend is '",
        name,
        "', not the native caching allocator: unified memory does not "
        "apply to it");
    alloc->attachAllocatorTraceTracker(onTrace);
    setEventsAttached();
  });
}

} // namespace c10::cuda::um
