// CPU tensors in managed memory, so that a GPU can take them without a copy.
//
// Note [Managed host memory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Plain unified memory still keeps data twice in host RAM: `x.to("cuda")`
// leaves x in host memory, and the GPU copy's overflow past the device
// budget lands in host RAM next to it. When x itself is managed memory,
// placed in host RAM, the GPU can use the same pages: torch.cuda.um.move_
// views the storage on the device (a DLPack alias holding a reference to the
// CPU storage) and Engine::adoptHost enters the allocation into the device's
// residency ledger, which places it under the budget like a new segment and
// keeps its data (untracked: no block events describe it, so it is never
// discarded). Nothing is copied; pages migrate as the budget allows and the
// rest is read in place.
//
// ManagedHostAllocator is c10's CPU allocator wrapped: an allocation of at
// least host_alloc_min bytes comes from Engine::allocHost when this thread
// is inside torch.cuda.um.managed_host() or the host_alloc:managed setting
// is on and the process has used CUDA; everything else, and every
// allocation the engine declines (cap, host headroom, a fork()ed child),
// goes to the wrapped allocator. Costs: cudaMallocManaged and cudaFree are
// slower than malloc and free (cudaFree waits for the device), which is why
// small allocations never qualify; and a fork()ed child (DataLoader workers
// under the fork start method) cannot read its parent's managed memory,
// which is why host_alloc defaults to "default" and the scope is explicit.
// An allocation of at least 128 MiB gets its pages at once, made by CPU
// threads as a pinned buffer's are (Note [Host pages are populated by CPU
// threads], HostMemory.cpp): a GPU copy into pages nobody made faults them
// in at about 4 GB/s.
//
// Thread safety: allocate and the deleter may run on any thread; the scope
// depth is per thread; install is idempotent and serialised.
#pragma once

#include <c10/core/Allocator.h>

#include <functional>
#include <string>

namespace c10::cuda::um {

class ManagedHostAllocator final : public c10::Allocator {
 public:
  explicit ManagedHostAllocator(c10::Allocator* fallback) : fallback_(fallback) {}
  c10::DataPtr allocate(size_t n) override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

 private:
  c10::Allocator* fallback_;
};

// Note [Pinned in place]
// ~~~~~~~~~~~~~~~~~~~~~~
// DataLoader batches reach the main process in shared memory from the
// workers, and pin_memory=True copies each into a page-locked buffer: a
// second host copy of every batch in flight. Managed memory cannot replace
// either buffer (a fork()ed worker cannot use it). With pin_in_place, the
// batch is page-locked where it lies (cudaHostRegister) and handed on as a
// CPU alias that holds its storage; nothing is copied. The alias dies when
// the training loop drops the batch, maybe while an asynchronous copy from
// it is still running (torch records no event for pinned memory it did not
// allocate), so the range is unregistered and the storage released by a
// background thread after the device has finished the work queued so far.

// Page-locks [ptr, ptr+size) in place; "" or why it could not.
std::string pinInPlace(void* ptr, size_t size);
// Hands a range pinned by pinInPlace back: once `device` has finished the
// work queued so far, a background thread unregisters it and then calls
// `release` (which drops the storage). Thread-safe.
void unpinLater(void* ptr, int device, std::function<void()> release);

// Registers ManagedHostAllocator as the CPU allocator, wrapping the one in
// place. Returns "" or why it could not (another CPU allocator registered
// with a higher priority).
std::string installHostAllocator();

// Adds `delta` to this thread's managed_host() depth; returns the new depth.
int hostScope(int delta);

} // namespace c10::cuda::um
