// Assertions for our own bugs. They stay on in release builds (house style): a replica whose invariants are
// broken must stop rather than send a wrong promise. Never use them on network input: that is rejected with a
// reason instead.
#pragma once

#include <cstdio>
#include <cstdlib>

#define BFT_ASSERT(cond)                                                                          \
  do {                                                                                            \
    if (!(cond)) [[unlikely]] {                                                                   \
      std::fprintf(stderr, "assertion failed: %s at %s:%d (%s)\n", #cond, __FILE__, __LINE__,     \
                   __func__);                                                                     \
      std::abort();                                                                               \
    }                                                                                             \
  } while (0)

#define BFT_UNREACHABLE()                                                                         \
  do {                                                                                            \
    std::fprintf(stderr, "unreachable at %s:%d (%s)\n", __FILE__, __LINE__, __func__);            \
    std::abort();                                                                                 \
  } while (0)
