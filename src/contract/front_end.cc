#include "contract/front_end.h"

#include <atomic>

#include "contract/option_table.h"

namespace sgpu::contract {
namespace {

std::atomic<FrontEnd> g_front_end{FrontEnd::kCpp};

// The sgpu command's flag for an Options member (NOTE [The option table]); the member's
// name where the command has none.
std::string flag_of(std::string_view setting) {
  const OptionRow* row = find_option(setting);
  return row != nullptr && !row->flag.empty() ? std::string(row->flag) : std::string(setting);
}

// An Options member as C++ names it: the simulated backend's rows (sim_node) are the fields
// of Options::sim (sim.node).
std::string member_of(std::string_view setting) {
  constexpr std::string_view kSim = "sim_";
  if (setting.starts_with(kSim)) return "sim." + std::string(setting.substr(kSim.size()));
  return std::string(setting);
}

}  // namespace

void set_front_end(FrontEnd front_end) { g_front_end = front_end; }
FrontEnd front_end() { return g_front_end; }

std::string spell(std::string_view setting, std::string_view value) {
  if (front_end() == FrontEnd::kCommand) return flag_of(setting) + " " + std::string(value);
  const bool number = !value.empty() && value.find_first_not_of("0123456789") == value.npos;
  const std::string name =
      front_end() == FrontEnd::kPython ? std::string(setting) : member_of(setting);
  return name + "=" + (number ? std::string(value) : "\"" + std::string(value) + "\"");
}

std::string spell(std::string_view setting) {
  if (front_end() == FrontEnd::kCommand) return flag_of(setting);
  if (front_end() == FrontEnd::kPython) return std::string(setting);
  return "Options::" + member_of(setting);
}

std::string spell_no_timeout() {
  switch (front_end()) {
    case FrontEnd::kCommand:
      return "--timeout none";
    case FrontEnd::kPython:
      return "timeout=None";
    case FrontEnd::kCpp:
      break;
  }
  return "sgpu::kNoTimeout";
}

std::string spell_none(std::string_view setting) {
  switch (front_end()) {
    case FrontEnd::kCommand:
      return flag_of(setting) + " none";
    case FrontEnd::kPython:
      return std::string(setting) + "=None";
    case FrontEnd::kCpp:
      break;
  }
  return "Options::" + member_of(setting) + " = sgpu::kNoTimeout";
}

}  // namespace sgpu::contract
