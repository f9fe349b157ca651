// The backend a suite's calls run on, for suites registered once per backend: SGPU_BACKEND
// ("sim" for every test; the gpu-labelled CTest instances set "cuda"), and how many ranks
// a call on it can have (the GPUs the backend sees).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "backend/backend_table.h"
#include "testing/sim_options.h"

namespace sgpu::testing {

inline std::string test_backend() {
  const char* name = std::getenv("SGPU_BACKEND");
  return name != nullptr && *name != '\0' ? name : "sim";
}

// The GPUs the test backend offers a call (8 on the default simulated node).
inline int test_backend_ranks() {
  static const int ranks =
      static_cast<int>(backend::find_backend(test_backend()).inventory(Options{}).gpus.size());
  return ranks;
}

// `gpus` quiet ranks on the test backend.
inline Options on_test_backend(int gpus) {
  Options options = sim(gpus, /*quiet=*/true);
  options.backend = test_backend();
  return options;
}

}  // namespace sgpu::testing

// Skips the test when the test backend has fewer than `n` GPUs.
#define SGPU_REQUIRE_RANKS(n)                                                                  \
  do {                                                                                         \
    if (::sgpu::testing::test_backend_ranks() < (n)) {                                         \
      GTEST_SKIP() << "needs " << (n) << " ranks; backend " << ::sgpu::testing::test_backend() \
                   << " offers " << ::sgpu::testing::test_backend_ranks();                     \
    }                                                                                          \
  } while (0)
