// Hooks through which c10's CUDA caching allocator reaches the unified-memory
// engine. This is the whole surface the patch series (source path) and the
// interposer (injection path) call; everything behind it lives in Engine.cpp.
//
// The header is internal to the rebuilt library: it is not shipped in the
// wheel's include/ tree and changes no class layout of the shipped headers.
#pragma once

#include <c10/core/Device.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace c10::cuda::um {

// Allocate one allocator segment on `device` (the current device). With
// unified memory enabled the segment is cudaMallocManaged memory placed by the
// engine's policies; disabled, this is exactly cudaMalloc. A refusal by the
// total cap or the host-RAM headroom returns cudaErrorMemoryAllocation so that
// the allocator's release-and-retry path runs and, if that does not help,
// raises torch.OutOfMemoryError with oomReport() in its message.
// `stream` orders the placement prefetch; `capturing` says whether `stream` is
// being captured into a CUDA graph: such a segment (a graph's private pool)
// is plain cudaMalloc memory (Note [Segments made during a capture are plain],
// Engine.cpp).
cudaError_t allocSegment(
    void** ptr,
    size_t size,
    c10::DeviceIndex device,
    cudaStream_t stream,
    bool capturing);

// Release a segment obtained from allocSegment (managed or not).
cudaError_t freeSegment(void* ptr);

// Graph capture or private-pool recording began / ended somewhere in the
// process: no prefetch or advice is issued while any is under way.
void captureBegin();
void captureEnd();

// The caching allocator's block events the engine acts on (its trace
// tracker's ALLOC and FREE_COMPLETED).
enum class BlockEvent : uint8_t { Alloc, FreeCompleted };

// The pool a block event belongs to (Note [Graph pools: a free is not a
// death], Residency.h). Torch 2.8 and later name it in every trace entry;
// 2.6 and 2.7 do not (Unknown).
enum class BlockPool : uint8_t { Default, Private, Unknown };

// A block was handed out or taken back. Called with the allocator's lock
// held (lock order: allocator, then engine). With policy lru an Alloc over
// pages that are not on the device places them there before the caller's
// kernels run (discard-and-prefetch: a new block's old content is dead),
// except in a private pool, which CUDA graph replays write without the
// allocator knowing.
void onBlockEvent(
    BlockEvent event,
    uintptr_t addr,
    size_t size,
    cudaStream_t stream,
    BlockPool pool);

// Block events reach the engine from now on: segments allocated after this
// know which of their bytes are dead.
void setEventsAttached();

// Attaches onBlockEvent to the process's caching allocator (its trace
// tracker). Throws c10::Error if the allocator is not the native one.
void attachBlockEvents();

// Expandable segments (cuMemMap) cannot be managed memory: in UM mode the
// request is dropped with one warning. Returns the value to use.
bool resolveExpandableSegments(bool requested);

// Throws c10::Error with instructions if `ptr` lies in a managed segment:
// cudaIpcGetMemHandle cannot export managed memory.
void checkIpcExportable(const void* ptr);

// Unified-memory numbers appended to the allocator's out-of-memory message;
// empty when UM is off.
std::string oomReport(c10::DeviceIndex device);

} // namespace c10::cuda::um
