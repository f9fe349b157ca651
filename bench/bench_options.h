// What every benchmark's calls share: they leave the user's MLflow store alone. A call a
// benchmark makes is untracked unless SGPU_BENCH_TRACKING=on asks for it (bench_tracking,
// which measures tracking, names its own temporary stores).
#pragma once

#include <cstdlib>
#include <string>

#include "sgpu/options.h"

namespace sgpu::bench {

inline bool tracking_asked() {
  const char* value = std::getenv("SGPU_BENCH_TRACKING");
  return value != nullptr && std::string(value) == "on";
}

// sgpu::Options for a benchmark's call: the defaults, tracked only when asked.
inline sgpu::Options options() {
  sgpu::Options options;
  options.tracking = tracking_asked();
  return options;
}

}  // namespace sgpu::bench
