// CPU stand-in for c10's warning macro (tests/engine/executor_test.cpp).
#pragma once
#define TORCH_WARN_ONCE(...) \
  do {                       \
  } while (0)
