// C API (c_api.h) over the engine: no exception crosses it.
#include <c10/cuda/um/Engine.h>
#include <c10/cuda/um/c_api.h>

#include <c10/core/StorageImpl.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/um/CudaCompat.h>
#include <c10/cuda/um/HostAllocator.h>
#include <c10/cuda/um/HostCopy.h>
#include <c10/cuda/um/OpSignal.h>
#include <c10/cuda/um/Stage.h>
#include <c10/cuda/um/Policies.h>
#include <c10/cuda/um/ErrorText.h>
#include <c10/cuda/um/UnifiedMemory.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <memory>
#include <string>

using c10::cuda::um::Engine;
using c10::cuda::um::OpSignal;
using c10::cuda::um::OpSignalCounters;
using c10::cuda::um::Residency;
using c10::cuda::um::Where;

namespace {

int fail(char* err, size_t errlen, const std::string& msg) {
  return c10::cuda::um::writeError(err, errlen, msg);
}

int cudaFail(char* err, size_t errlen, const char* what, cudaError_t e) {
  (void)cudaGetLastError();
  return fail(
      err, errlen, std::string(what) + " failed: " + cudaGetErrorString(e));
}

// The DLPack ABI (dlpack.h, v0.8: the unversioned DLManagedTensor that every
// torch.from_dlpack accepts in a "dltensor" capsule), declared here because
// the source path builds c10 without ATen's copy of the header.
struct DLDevice {
  int32_t device_type; // 1 CPU, 2 CUDA
  int32_t device_id;
};
struct DLDataType {
  uint8_t code; // 1 unsigned int
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

// One alias: the DLPack record and the reference that keeps the aliased
// storage (and so its memory) alive until torch drops the alias.
struct Alias {
  DLManagedTensor managed{};
  int64_t shape[1] = {0};
  c10::intrusive_ptr<c10::StorageImpl> owner;
  int pinned_on = -1; // Note [Pinned in place]: the device to wait for
};

void deleteAlias(DLManagedTensor* self) {
  auto* a = static_cast<Alias*>(self->manager_ctx);
  if (a->pinned_on >= 0) {
    auto owner = std::make_shared<c10::intrusive_ptr<c10::StorageImpl>>(
        std::move(a->owner));
    c10::cuda::um::unpinLater(
        a->managed.dl_tensor.data, a->pinned_on, [owner] { owner->reset(); });
  }
  delete a;
}

// A uint8 DLPack record of `nbytes` at `data` on (device_type, device_id).
Alias* makeAlias(
    c10::intrusive_ptr<c10::StorageImpl> owner,
    void* data,
    size_t nbytes,
    DLDevice where) {
  auto* a = new Alias();
  a->owner = std::move(owner);
  a->shape[0] = static_cast<int64_t>(nbytes);
  DLTensor& t = a->managed.dl_tensor;
  t.data = data;
  t.device = where;
  t.ndim = 1;
  t.dtype = DLDataType{1, 8, 1};
  t.shape = a->shape;
  t.strides = nullptr; // compact
  t.byte_offset = 0;
  a->managed.manager_ctx = a;
  a->managed.deleter = &deleteAlias;
  return a;
}

// The storage behind a torch.UntypedStorage._cdata handle, with a reference
// of our own, and its memory.
struct Storage {
  c10::intrusive_ptr<c10::StorageImpl> owner;
  void* data;
  size_t nbytes;
};

Storage storageOf(void* storage_impl) {
  auto owner = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(
      static_cast<c10::StorageImpl*>(storage_impl));
  void* data = owner->data_ptr().get();
  const size_t nbytes = owner->nbytes();
  return {std::move(owner), data, nbytes};
}

} // namespace

extern "C" {

TORCH_UM_API int torch_um_host_install(char* err, size_t errlen) {
  try {
    std::string why = c10::cuda::um::installHostAllocator();
    return why.empty() ? 0 : fail(err, errlen, why);
  } catch (const c10::Error& e) {
    return fail(err, errlen, e.what_without_backtrace());
  }
}

TORCH_UM_API void* torch_um_copy_function(int device, char* err, size_t errlen) {
  std::string why;
  void* f = c10::cuda::um::copyFunction(device, why);
  if (f == nullptr) {
    fail(err, errlen, why);
  }
  return f;
}

TORCH_UM_API int torch_um_host_scope(int delta) {
  return c10::cuda::um::hostScope(delta);
}

TORCH_UM_API void* torch_um_alias(
    void* storage_impl,
    int device,
    char* err,
    size_t errlen) {
  if (storage_impl == nullptr || device < TORCH_UM_HOST) {
    fail(err, errlen, "alias: bad argument");
    return nullptr;
  }
  try {
    Storage st = storageOf(storage_impl);
    Engine& engine = Engine::get();
    if (st.data == nullptr || !engine.isManaged(st.data)) {
      fail(err, errlen,
           "the storage is not managed memory (a CPU tensor is when it was "
           "allocated inside torch.cuda.um.managed_host() or with "
           "host_alloc:managed; a CUDA tensor is when unified memory was on)");
      return nullptr;
    }
    if (device >= 0) {
      const auto dev = static_cast<c10::DeviceIndex>(device);
      std::string why = engine.adoptHost(
          st.data, device, c10::cuda::getCurrentCUDAStream(dev).stream());
      if (!why.empty()) {
        fail(err, errlen, "cannot move to cuda:" + std::to_string(device) + ": " + why);
        return nullptr;
      }
    }
    Alias* a = makeAlias(
        std::move(st.owner), st.data, st.nbytes,
        device >= 0 ? DLDevice{2, device} : DLDevice{1, 0});
    return &a->managed;
  } catch (const c10::Error& e) {
    fail(err, errlen, e.what_without_backtrace());
    return nullptr;
  }
}

TORCH_UM_API void* torch_um_pin_alias(
    void* storage_impl,
    char* err,
    size_t errlen) {
  if (storage_impl == nullptr) {
    fail(err, errlen, "pin_alias: bad argument");
    return nullptr;
  }
  try {
    Storage st = storageOf(storage_impl);
    int device = 0;
    if (st.data == nullptr || st.nbytes == 0 ||
        st.owner->device().type() != c10::DeviceType::CPU ||
        cudaGetDevice(&device) != cudaSuccess) {
      (void)cudaGetLastError();
      fail(err, errlen, "pin_alias: not a non-empty CPU storage, or no CUDA device");
      return nullptr;
    }
    std::string why = c10::cuda::um::pinInPlace(st.data, st.nbytes);
    if (!why.empty()) {
      fail(err, errlen, why);
      return nullptr;
    }
    Alias* a = makeAlias(std::move(st.owner), st.data, st.nbytes, DLDevice{1, 0});
    a->pinned_on = device;
    return &a->managed;
  } catch (const c10::Error& e) {
    fail(err, errlen, e.what_without_backtrace());
    return nullptr;
  }
}

TORCH_UM_API int torch_um_abi_version(void) {
  return TORCH_UM_ABI_VERSION;
}

TORCH_UM_API int torch_um_configure(
    const char* conf,
    char* err,
    size_t errlen) {
  if (conf == nullptr) {
    return fail(err, errlen, "torch_um_configure: conf is NULL");
  }
  try {
    Engine::get().configure(conf, "unified memory configuration");
    return 0;
  } catch (const c10::Error& e) {
    return fail(err, errlen, e.what_without_backtrace());
  } catch (const std::exception& e) {
    return fail(err, errlen, e.what());
  }
}

TORCH_UM_API long torch_um_get_config(char* buf, size_t len) {
  std::string text;
  try {
    text = Engine::get().config().str();
  } catch (const c10::Error& e) {
    fail(buf, len, e.what_without_backtrace());
    return -1;
  }
  if (buf != nullptr && len > 0) {
    size_t n = std::min(len - 1, text.size());
    std::memcpy(buf, text.data(), n);
    buf[n] = '\0';
  }
  return static_cast<long>(text.size());
}

TORCH_UM_API int torch_um_enabled(void) {
  try {
    return Engine::get().enabled() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

TORCH_UM_API int torch_um_is_managed(const void* ptr) {
  try {
    return Engine::get().isManaged(ptr) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

TORCH_UM_API int torch_um_get_stats(int device, TorchUmStats* out) {
  // struct_size itself is written back: a caller's struct holds at least it.
  if (out == nullptr || device < 0 || out->struct_size < sizeof(uint64_t)) {
    return -1;
  }
  try {
    TorchUmStats s = Engine::get().stats(static_cast<c10::DeviceIndex>(device));
    const OpSignalCounters op = OpSignal::get().counters();
    s.op_signal_installed = op.installed;
    s.op_signal_installs = op.installs;
    s.op_calls = op.ops;
    s.op_touch_bytes = op.touch_bytes;
    s.op_ahead_ranges = op.ahead_ranges;
    s.op_ahead_bytes = op.ahead_bytes;
    s.op_matches = op.matches;
    s.op_paths = op.paths;
    s.op_signal_ns = op.nanoseconds;
    s.op_mixed = op.mixed;
    s.op_counterparts = op.counterparts;
    const c10::cuda::um::StageCounters st = c10::cuda::um::Stage::get().counters();
    s.stage_ins = st.ins;
    s.stage_in_bytes = st.in_bytes;
    s.stage_outs = st.outs;
    s.stage_out_bytes = st.out_bytes;
    s.stage_dropped = st.dropped;
    s.stage_failures = st.failures;
    s.stage_candidates = st.candidates;
    s.stage_not_on_host = st.not_on_host;
    size_t n = std::min<size_t>(out->struct_size, sizeof(TorchUmStats));
    uint64_t caller_size = out->struct_size;
    std::memcpy(out, &s, n);
    out->struct_size = caller_size;
    return 0;
  } catch (...) {
    return -1;
  }
}

TORCH_UM_API void torch_um_reset_peak(void) {
  try {
    Engine::get().resetPeak();
  } catch (...) {
  }
}

TORCH_UM_API int torch_um_prefetch(
    const void* ptr,
    size_t size,
    int location,
    void* stream,
    char* err,
    size_t errlen) {
  if (location < c10::cuda::um::compat::kHost) {
    return fail(err, errlen, "prefetch: location must be a device index or -1");
  }
  try {
    cudaError_t e = Engine::get().prefetch(
        ptr, size, location, static_cast<cudaStream_t>(stream));
    return e == cudaSuccess ? 0
                            : cudaFail(err, errlen, "cudaMemPrefetchAsync", e);
  } catch (const c10::Error& e) {
    return fail(err, errlen, e.what_without_backtrace());
  }
}

TORCH_UM_API int torch_um_advise(
    const void* ptr,
    size_t size,
    int advice,
    int location,
    char* err,
    size_t errlen) {
  cudaMemoryAdvise a;
  switch (advice) {
    case TORCH_UM_ADVISE_PREFERRED_LOCATION:
      a = cudaMemAdviseSetPreferredLocation;
      break;
    case TORCH_UM_ADVISE_UNSET_PREFERRED_LOCATION:
      a = cudaMemAdviseUnsetPreferredLocation;
      break;
    case TORCH_UM_ADVISE_ACCESSED_BY:
      a = cudaMemAdviseSetAccessedBy;
      break;
    case TORCH_UM_ADVISE_UNSET_ACCESSED_BY:
      a = cudaMemAdviseUnsetAccessedBy;
      break;
    case TORCH_UM_ADVISE_READ_MOSTLY:
      a = cudaMemAdviseSetReadMostly;
      break;
    case TORCH_UM_ADVISE_UNSET_READ_MOSTLY:
      a = cudaMemAdviseUnsetReadMostly;
      break;
    default:
      return fail(err, errlen, "advise: unknown advice " + std::to_string(advice));
  }
  try {
    cudaError_t e = Engine::get().advise(ptr, size, a, location);
    return e == cudaSuccess ? 0 : cudaFail(err, errlen, "cudaMemAdvise", e);
  } catch (const c10::Error& e) {
    return fail(err, errlen, e.what_without_backtrace());
  }
}

TORCH_UM_API long long torch_um_touch(
    const void* ptr,
    size_t size,
    int device,
    void* stream,
    int flags) {
  if (device < 0 ||
      (flags & ~(TORCH_UM_TOUCH_READ_ONLY | TORCH_UM_TOUCH_HOLD)) != 0) {
    return -1;
  }
  try {
    return static_cast<long long>(Engine::get().touch(
        ptr,
        size,
        device,
        static_cast<cudaStream_t>(stream),
        (flags & TORCH_UM_TOUCH_READ_ONLY) != 0,
        (flags & TORCH_UM_TOUCH_HOLD) != 0));
  } catch (...) {
    return -1;
  }
}

TORCH_UM_API int torch_um_op_signal(int on, char* err, size_t errlen) {
  try {
    if (on == 0) {
      OpSignal::get().remove();
      return 0;
    }
    std::string why;
    if (OpSignal::get().install(why)) {
      return 0;
    }
    return fail(err, errlen, "the operator use signal could not be installed: " + why);
  } catch (const std::exception& e) {
    return fail(err, errlen, e.what());
  }
}

TORCH_UM_API long long torch_um_forget(const void* ptr, size_t size) {
  try {
    return static_cast<long long>(Engine::get().forget(ptr, size));
  } catch (...) {
    return -1;
  }
}

TORCH_UM_API long long torch_um_where(const void* ptr, size_t size, int where) {
  if (where < TORCH_UM_WHERE_DEVICE || where > TORCH_UM_WHERE_HELD) {
    return -1;
  }
  try {
    const Residency::Placement p = Engine::get().placement(ptr, size);
    switch (where) {
      case TORCH_UM_WHERE_DEVICE:
        return static_cast<long long>(p.bytes[static_cast<int>(Where::Device)]);
      case TORCH_UM_WHERE_HOST:
        return static_cast<long long>(p.bytes[static_cast<int>(Where::Host)]);
      case TORCH_UM_WHERE_UNPLACED:
        return static_cast<long long>(p.bytes[static_cast<int>(Where::Unplaced)]);
      default:
        return static_cast<long long>(p.held);
    }
  } catch (...) {
    return -1;
  }
}

TORCH_UM_API int torch_um_under_pressure(void) {
  try {
    return Engine::get().underPressure() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

TORCH_UM_API uint64_t torch_um_host_room(void) {
  try {
    return c10::cuda::um::HostHeadroom{}.room(Engine::get().config());
  } catch (...) {
    return 0;
  }
}

TORCH_UM_API int torch_um_attach_events(char* err, size_t errlen) {
  try {
    c10::cuda::um::attachBlockEvents();
    return 0;
  } catch (const c10::Error& e) {
    return fail(err, errlen, e.what_without_backtrace());
  } catch (const std::exception& e) {
    return fail(err, errlen, e.what());
  }
}

} // extern "C"
