// Options for a call on simulated GPUs, as the tests make them.
#pragma once

#include <vector>

#include "sgpu/options.h"

namespace sgpu::testing {

// `gpus` simulated ranks; quiet: none of them streamed to the console.
inline Options sim(int gpus, bool quiet = false) {
  Options options;
  options.gpus = gpus;
  options.backend = "sim";
  if (quiet) options.console_ranks = std::vector<int>{};
  return options;
}

}  // namespace sgpu::testing
