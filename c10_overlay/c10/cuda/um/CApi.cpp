// C API (c_api.h) over the engine: no exception crosses it.
#include <c10/cuda/um/Engine.h>
#include <c10/cuda/um/c_api.h>

#include <c10/cuda/um/CudaCompat.h>
#include <c10/cuda/um/ErrorText.h>
#include <c10/cuda/um/UnifiedMemory.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <string>

using c10::cuda::um::Engine;

namespace {

int fail(char* err, size_t errlen, const std::string& msg) {
  return c10::cuda::um::writeError(err, errlen, msg);
}

int cudaFail(char* err, size_t errlen, const char* what, cudaError_t e) {
  (void)cudaGetLastError();
  return fail(
      err, errlen, std::string(what) + " failed: " + cudaGetErrorString(e));
}

} // namespace

extern "C" {

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
  if (out == nullptr || device < 0 || out->struct_size == 0) {
    return -1;
  }
  try {
    TorchUmStats s = Engine::get().stats(static_cast<c10::DeviceIndex>(device));
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
  if (device < 0 || (flags & ~TORCH_UM_TOUCH_READ_ONLY) != 0) {
    return -1;
  }
  try {
    return static_cast<long long>(Engine::get().touch(
        ptr,
        size,
        device,
        static_cast<cudaStream_t>(stream),
        (flags & TORCH_UM_TOUCH_READ_ONLY) != 0));
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
