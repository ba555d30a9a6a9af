// The check of tests/engine's programs: a failed condition prints where and
// why, counts a failure and returns false from the case (a bool function).
#pragma once

#include <cstdio>

namespace engine_test {
inline int g_failures = 0;
} // namespace engine_test

#define CHECK(cond, ...)                                        \
  do {                                                          \
    if (!(cond)) {                                              \
      std::fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                        \
      std::fprintf(stderr, "\n");                               \
      ++engine_test::g_failures;                                \
      return false;                                             \
    }                                                           \
  } while (0)
