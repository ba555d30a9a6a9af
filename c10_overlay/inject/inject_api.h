/* C API of the injection path (libtorch_um.so only), next to c_api.h.
 *
 * torch/cuda/um.py reads it with ctypes to attach the allocator callbacks
 * after CUDA initialises and to report whether the interposition took.
 */
#ifndef TORCH_UM_INJECT_API_H
#define TORCH_UM_INJECT_API_H

#include <c10/cuda/um/c_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct TorchUmInjectInfo {
  uint64_t struct_size;
  /* 1 if the process-wide cudaMalloc symbol is this library's, i.e. the
   * caching allocator's calls reach the engine. */
  uint64_t interposed;
  /* 1 once the trace tracker and OOM observer are attached. */
  uint64_t attached;
  /* calls from libc10_cuda.so's caching allocator sent to the engine */
  uint64_t segment_allocs;
  uint64_t segment_frees;
  /* cudaMalloc/cudaFree calls from anything else, passed through */
  uint64_t passthrough_mallocs;
  uint64_t passthrough_frees;
  /* the allocator's block events seen by the trace tracker */
  uint64_t block_allocs;
  uint64_t block_frees;
  uint64_t segment_alloc_events;
  uint64_t segment_free_events;
  uint64_t oom_events;
  /* graph captures under way (cudaStreamBeginCapture minus EndCapture) */
  uint64_t captures_underway;
  /* cudaIpcGetMemHandle refused on managed memory */
  uint64_t ipc_refusals;
} TorchUmInjectInfo;

/* Attach the trace tracker and the out-of-memory observer to the caching
 * allocator. Call after CUDA initialised (torch.cuda._lazy_call); idempotent.
 * Returns 0, 1 if the allocator backend is not the native caching allocator
 * (nothing attached; message in err), or -1 with a message in err. */
TORCH_UM_API int torch_um_inject_attach(char* err, size_t errlen);

/* Fills *out (caller sets struct_size, at least 8). Returns 0, or -1. */
TORCH_UM_API int torch_um_inject_info(TorchUmInjectInfo* out);

/* The caching allocator's cudaMalloc and cudaFree are those of this file
 * (its path), or NULL. */
TORCH_UM_API const char* torch_um_inject_library_path(void);

#ifdef __cplusplus
}
#endif

#endif /* TORCH_UM_INJECT_API_H */
