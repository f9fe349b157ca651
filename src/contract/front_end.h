// NOTE [Front ends]
// The same checks serve the C++ API and the sgpu command, and their messages end with
// what to do. Advice names a setting the way the caller writes it: spell("backend",
// "sim") is `backend="sim"` in C++ and `--backend sim` for the sgpu command, which says
// so with set_front_end(kCommand) before it calls anything. Settings are named as
// sgpu::Options' members.
#pragma once

#include <string>
#include <string_view>

namespace sgpu::contract {

enum class FrontEnd { kCpp, kCommand };

void set_front_end(FrontEnd front_end);
FrontEnd front_end();

// The setting given `value`: backend="sim" (a number unquoted: gpus=4) / --backend sim.
std::string spell(std::string_view setting, std::string_view value);
// The setting itself: Options::timeout / --timeout.
std::string spell(std::string_view setting);
// How to ask for no timeout: sgpu::kNoTimeout / --timeout none.
std::string spell_no_timeout();

}  // namespace sgpu::contract
