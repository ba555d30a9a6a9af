/* LD_PRELOAD shim for tests/gpu/test_reliability.py: makes the CUDA runtime calls the
 * unified-memory engine depends on fail on demand, so that the test can check the process
 * survives them (allocation: OutOfMemoryError; placement hints: counted, data unchanged).
 *
 * Each wrapped function carries the symbol version libcudart.so.13 gives it, so the
 * engine's versioned references (cudaMallocManaged@libcudart.so.13, ...) bind here first;
 * the real function is looked up with dlvsym(RTLD_NEXT). Armed per kind at run time through
 * um_fault_arm(); um_fault_count() says how many calls were failed. Built by the test with
 * the system C compiler and cudart_fault.map; needs no CUDA headers. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>

typedef int cudaError_t;
typedef void* cudaStream_t;
typedef struct {
  int type;
  int id;
} Location; /* struct cudaMemLocation */

enum { kMalloc = 0, kPrefetch = 1, kAdvise = 2, kDiscard = 3, kKinds = 4 };
enum { kErrorInvalidValue = 1, kErrorMemoryAllocation = 2, kErrorNotFound = 500 };

static atomic_int armed[kKinds];
static atomic_long failed[kKinds];

void um_fault_arm(int kind, int on) {
  if (kind >= 0 && kind < kKinds) atomic_store(&armed[kind], on);
}

long um_fault_count(int kind) {
  return (kind >= 0 && kind < kKinds) ? atomic_load(&failed[kind]) : -1;
}

static int fails(int kind) {
  if (!atomic_load(&armed[kind])) return 0;
  atomic_fetch_add(&failed[kind], 1);
  return 1;
}

static void* real(const char* name) {
  void* f = dlvsym(RTLD_NEXT, name, "libcudart.so.13");
  return f ? f : dlsym(RTLD_NEXT, name);
}

typedef cudaError_t (*MallocManaged)(void**, size_t, unsigned);
typedef cudaError_t (*Prefetch)(const void*, size_t, Location, unsigned, cudaStream_t);
typedef cudaError_t (*PrefetchBatch)(void**, size_t*, size_t, Location*, size_t*, size_t,
                                     unsigned long long, cudaStream_t);
typedef cudaError_t (*Advise)(const void*, size_t, int, Location);
typedef cudaError_t (*DiscardBatch)(void**, size_t*, size_t, unsigned long long, cudaStream_t);

/* The real function, looked up once. */
#define REAL(type, name) \
  static type fn_ = 0;   \
  if (!fn_) fn_ = (type)real(name); \
  if (!fn_) return kErrorNotFound

cudaError_t cudaMallocManaged(void** p, size_t n, unsigned flags) {
  if (fails(kMalloc)) return kErrorMemoryAllocation;
  REAL(MallocManaged, "cudaMallocManaged");
  return fn_(p, n, flags);
}

cudaError_t cudaMemPrefetchAsync(const void* p, size_t n, Location to, unsigned flags, cudaStream_t s) {
  if (fails(kPrefetch)) return kErrorInvalidValue;
  REAL(Prefetch, "cudaMemPrefetchAsync");
  return fn_(p, n, to, flags, s);
}

cudaError_t cudaMemPrefetchBatchAsync(void** ps, size_t* ns, size_t count, Location* locs, size_t* idx,
                                      size_t nlocs, unsigned long long flags, cudaStream_t s) {
  if (fails(kPrefetch)) return kErrorInvalidValue;
  REAL(PrefetchBatch, "cudaMemPrefetchBatchAsync");
  return fn_(ps, ns, count, locs, idx, nlocs, flags, s);
}

cudaError_t cudaMemAdvise(const void* p, size_t n, int advice, Location where) {
  if (fails(kAdvise)) return kErrorInvalidValue;
  REAL(Advise, "cudaMemAdvise");
  return fn_(p, n, advice, where);
}

cudaError_t cudaMemDiscardBatchAsync(void** ps, size_t* ns, size_t count, unsigned long long flags, cudaStream_t s) {
  if (fails(kDiscard)) return kErrorInvalidValue;
  REAL(DiscardBatch, "cudaMemDiscardBatchAsync");
  return fn_(ps, ns, count, flags, s);
}

cudaError_t cudaMemDiscardAndPrefetchBatchAsync(void** ps, size_t* ns, size_t count, Location* locs, size_t* idx,
                                                size_t nlocs, unsigned long long flags, cudaStream_t s) {
  if (fails(kDiscard)) return kErrorInvalidValue;
  REAL(PrefetchBatch, "cudaMemDiscardAndPrefetchBatchAsync");
  return fn_(ps, ns, count, locs, idx, nlocs, flags, s);
}
