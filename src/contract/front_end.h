// NOTE [Front ends]
// The same checks serve the C++ API and the sgpu command, and their messages end with
// what to do. Advice names a setting the way the caller writes it: spell("backend",
// "sim") is `backend="sim"` in C++ and `--backend sim` for the sgpu command, which says
// so with set_front_end(kCommand) before it calls anything, and `backend="sim"` for the
// Python decorator (kPython: its keyword arguments). Settings are named as the option
// table's rows, which the decorator's keywords are; in C++ the simulated backend's rows are
// the fields of Options::sim (spell("sim_compute", "shapes") is `sim.compute="shapes"`).
#pragma once

#include <string>
#include <string_view>

namespace sgpu::contract {

enum class FrontEnd { kCpp, kCommand, kPython };

void set_front_end(FrontEnd front_end);
FrontEnd front_end();

// The setting given `value`: backend="sim" (a number unquoted: gpus=4) / --backend sim.
std::string spell(std::string_view setting, std::string_view value);
// The setting itself: Options::timeout / --timeout / timeout.
std::string spell(std::string_view setting);
// How to ask for no timeout: sgpu::kNoTimeout / --timeout none / timeout=None.
std::string spell_no_timeout();
// How to turn off another timeout: --hang-timeout none / hang_timeout=None /
// Options::hang_timeout = sgpu::kNoTimeout.
std::string spell_none(std::string_view setting);

}  // namespace sgpu::contract
