// NOTE [Front ends]
// The same checks serve the C++ API, the sgpu command and the Python decorator, and their
// messages end with what to do. Advice names a setting the way its caller writes it. The
// caller says who it is in Options::front_end, and every check spells from the options (or
// the plan, node plan or ending made of them) it is given: Spelling(FrontEnd::kCpp)
// ("backend", "sim") is `backend="sim"`, kCommand's `--backend sim` (the sgpu command's
// flags), kPython's `backend="sim"` (the decorator's keywords). Settings are named as the
// option table's rows, which the decorator's keywords are; in C++ the simulated backend's
// rows are the fields of Options::sim (`sim.compute="shapes"` for sim_compute). Nothing is
// process-wide: each call is told in its own caller's words, whatever else its process has
// called.
#pragma once

#include <string>
#include <string_view>

#include "sgpu/options.h"

namespace sgpu::contract {

class Spelling {
 public:
  explicit Spelling(FrontEnd front_end) : front_end_(front_end) {}

  // The setting given `value`: backend="sim" (a number unquoted: gpus=4) / --backend sim.
  std::string operator()(std::string_view setting, std::string_view value) const;
  // The setting itself: Options::timeout / --timeout / timeout.
  std::string operator()(std::string_view setting) const;
  // How to ask for no timeout: sgpu::kNoTimeout / --timeout none / timeout=None.
  std::string no_timeout() const;
  // How to turn off another timeout: --hang-timeout none / hang_timeout=None /
  // Options::hang_timeout = sgpu::kNoTimeout.
  std::string none(std::string_view setting) const;

 private:
  FrontEnd front_end_;
};

}  // namespace sgpu::contract
