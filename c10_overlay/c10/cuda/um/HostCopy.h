// Copies between managed host memory and a GPU, run as a kernel.
//
// Note [Copies of managed host memory by kernel]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Under host_alloc:managed (or inside managed_host()) a CPU tensor is managed
// memory placed in host RAM (Note [Managed host memory], HostAllocator.h).
// torch does not know it from pageable memory: `x.to("cuda")` and
// `y_host.copy_(y)` call cudaMemcpyAsync, and the driver copies managed
// memory through its staging as it does pageable memory, at 6.4 GB/s to the
// GPU and 13.2 back on the H200 host, where a kernel reads and writes the
// same pages in place at 51-52 GB/s (bench/README.md, step 43,
// `python -m bench.probes.copy_routes_probe`). So the injection path interposes
// cudaMemcpyAsync, and a copy whose host side lies inside one managed host
// allocation of the engine runs as the lean copy kernel (Note [Lean copies],
// torch/cuda/_um_copy.py; compiled here by NVRTC once per device at its
// first use, and shared with the weight streamer).
//
// The host allocation is mapped into the GPU's page tables (AccessedBy) at
// its first kernel copy for that GPU, unless allocHost mapped it for that GPU
// before making its pages (Note [A host allocation is mapped before its pages
// are made], HostMemory.cpp): without the mapping the kernel's first read
// faults each page in, and Listing 1's first copy in took 6.4 s instead of
// the driver's 1.7 (step 43).
//
// What the caller sees does not change. A cudaMemcpyAsync from or to
// pageable memory returns once the copy no longer needs the host buffer
// (from it: staged; to it: done), and torch treats managed host memory as
// pageable (it is not pinned). So the kernel's copy is followed by a wait for
// the stream, and torch's own wait after a blocking copy finds it done. A copy
// made while any stream of the process is captured into a CUDA graph (a
// capture in global mode forbids the advice and the wait on every thread)
// goes to the driver, and so does any copy the kernel does not
// take: under 1 MiB (a launch and a wait cost more than the driver's copy),
// source and destination not 16-byte aligned alike (the kernel would copy
// bytes), a kind other than host-to-device or device-to-host, a host range
// that is not wholly inside one allocation of the engine, no kernel for the
// current device (its compile failed), UM off, or host_copy_kernel:False. A
// failed launch queues nothing; the copy then goes to the driver too
// (counted).
//
// Note [Copies shared with the CPU]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The GPU side of such a copy is managed memory too, and past the device
// budget its chunks lie in host RAM (Note [Ranges larger than the budget],
// Residency.h): the kernel then reads host RAM and writes host RAM, every
// byte crossing the link both ways. The link carries that at 42 GB/s of
// payload on the H200 host, CPU threads copying the same pages (memcpy, no
// link) at 37 GB/s from 16 threads, and both at once 47, 51, 58 and 54 GB/s
// with 15, 25, 35 and 50 % of the bytes on the CPU
// (`python -m bench.probes.copy_routes_probe --split`, bench/README.md step 44).
// So a copy of at least 64 MiB whose GPU side ends in chunks the residency
// ledger places in host RAM leaves up to host_copy_cpu_share of its bytes
// (0.35), taken from that end, to CPU threads: the host waits for the
// stream's earlier work, launches the kernel on the rest, copies its part
// while the kernel runs, then waits for the stream as before. A chunk the
// ledger places in host RAM is mapped there for the device; a page that is
// somewhere else after all is migrated by the CPU's access and still read
// or written correctly. Counted in um.kernel_copy_cpu_bytes.
//
// Note [Copies of pageable memory past the budget]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Most programs copy ordinary CPU tensors: pageable memory, which the driver
// stages through buffers of its own. Where the GPU side is an engine segment
// whose chunks lie in host RAM past the device budget, those bytes go from
// host RAM through the driver's staging and over the link to host RAM again:
// 1.4-4.9 GB/s into host-placed managed memory and 7.4-10 out of it on the
// H200 host (bench/README.md, step 17), and Listing 1's first copy out (8 GiB
// of a square mostly in host RAM into a fresh CPU tensor) took 7.0 s
// (step 45). Both sides of those bytes are host memory. So a copy whose host
// side is pageable leaves the GPU side's host-RAM runs (the residency
// ledger's view, Residency::hostRuns) to CPU threads, memcpy in place with
// no link at all (37 GB/s from 16 threads on that host, step 44; into fresh
// pageable pages about as fast as CPU threads make pages, the fastest route
// there, step 45), while the calling thread moves the rest, on the device,
// through page-locked buffers of the engine's (Note [Pageable bytes on the
// device go through page-locked buffers], HostCopy.cpp), or where those are
// busy or missing hands it to the driver as one copy per run. Like the CPU
// share above, the threads start only once the stream's work queued before
// the copy has finished (the GPU side may be written by that work, or read by
// it before this copy overwrites it); the call returns when the CPU's part is
// done and the rest has left the host buffer or reached it, which is what a
// pageable copy promises its caller (from the host buffer: read; to it:
// written).
//
// Which copies: host-to-device or device-to-host, at least 1 MiB, with at
// least 1 MiB of the GPU side in host RAM by the ledger, the GPU side wholly
// inside one engine segment, the host side pageable
// (cudaPointerGetAttributes: page-locked memory goes to the driver, which
// copies it at the link's speed, and managed host memory to the kernel of the
// Note above), no stream capturing, UM on and pageable_copy_cpu:True. The
// ledger may be a step behind the driver (a chunk brought back since): a page
// the CPU reaches that lies on the device after all is migrated by the access
// and still read or written correctly, only slower. Counted in
// um.pageable_copies, um.pageable_cpu_bytes and um.pageable_staged_bytes.
//
// Only the injection path has the hook: on the source path torch's copies
// call the CUDA runtime from libtorch_cuda.so, which that path leaves alone.
//
// Thread safety: any thread may copy; a device's kernel is compiled once,
// under a lock, and read without it after.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace c10::cuda::um {

// The engine's copy kernel for `device` (Note [Lean copies],
// torch/cuda/_um_copy.py): a CUfunction taking (dst, src, bytes) as (void*,
// const void*, unsigned long long), launched with kCopyThreads threads a
// block. Compiled by NVRTC for the device's architecture at its first use
// and kept; nullptr, with `why`, where it cannot be had (no NVRTC or driver
// library, a compile or load error: tried once per device). Makes the device
// current on the calling thread. Thread-safe.
void* copyFunction(int device, std::string& why);
constexpr unsigned kCopyThreads = 1024;
// Queues that kernel on `stream`: `bytes` from src to dst, with
// kHostCopyBlocks blocks. False, with nothing queued, where `device` has no
// kernel or the launch fails (counted in KernelCopyCounters::failures).
// Makes the device current on the calling thread, as copyFunction does.
bool launchCopy(int device, void* dst, const void* src, size_t bytes, cudaStream_t stream);
// The blocks of the copies taken from cudaMemcpyAsync: two carry the link
// (bench/README.md, step 43); a few more cost nothing when no kernel runs
// beside them, as none does beside a copy the host waits for.
constexpr unsigned kHostCopyBlocks = 8;

// cudaMemcpyAsync's arguments. True when the kernel took the copy, with
// *result what the call returns (the stream wait's status); false when the
// caller must hand the copy to the runtime.
bool copyByKernel(
    void* dst,
    const void* src,
    size_t count,
    cudaMemcpyKind kind,
    cudaStream_t stream,
    cudaError_t* result);

// Note [Copies of pageable memory past the budget]: cudaMemcpyAsync's
// arguments and the runtime's own cudaMemcpyAsync (`driver`), which copies
// the parts that are not the CPU's. True when the copy was taken, with
// *result what the call returns; false when the caller must hand the whole
// copy to the runtime (nothing was copied).
using MemcpyAsyncFn = cudaError_t (*)(void*, const void*, size_t, cudaMemcpyKind, cudaStream_t);
bool copyPageable(
    void* dst,
    const void* src,
    size_t count,
    cudaMemcpyKind kind,
    cudaStream_t stream,
    MemcpyAsyncFn driver,
    cudaError_t* result);

struct KernelCopyCounters {
  uint64_t copies = 0; // taken by the kernel
  uint64_t bytes = 0;
  uint64_t failures = 0; // launches that failed: handed to the driver
  uint64_t cpu_bytes = 0; // of `bytes`, those CPU threads copied
  // Note [Copies of pageable memory past the budget]: the copies taken and
  // the bytes CPU threads copied in them.
  uint64_t pageable_copies = 0;
  uint64_t pageable_cpu_bytes = 0;
  // Note [Pageable bytes on the device go through page-locked buffers]
  // (HostCopy.cpp): the bytes of such copies that went that way.
  uint64_t pageable_staged_bytes = 0;
};
KernelCopyCounters kernelCopyCounters();

} // namespace c10::cuda::um
