// How the C APIs (c_api.h, inject/inject_api.h) hand a message to their caller.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

namespace c10::cuda::um {

// Copies `msg` into the caller's buffer `err` (NUL-terminated, cut to errlen)
// and returns -1, the C APIs' failure value.
inline int writeError(char* err, size_t errlen, const std::string& msg) {
  if (err != nullptr && errlen > 0) {
    size_t n = std::min(errlen - 1, msg.size());
    std::memcpy(err, msg.data(), n);
    err[n] = '\0';
  }
  return -1;
}

} // namespace c10::cuda::um
