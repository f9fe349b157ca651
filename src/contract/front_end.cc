#include "contract/front_end.h"

#include "contract/option_table.h"

namespace sgpu::contract {
namespace {

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

std::string Spelling::operator()(std::string_view setting, std::string_view value) const {
  if (front_end_ == FrontEnd::kCommand) return flag_of(setting) + " " + std::string(value);
  const bool number = !value.empty() && value.find_first_not_of("0123456789") == value.npos;
  const std::string name =
      front_end_ == FrontEnd::kPython ? std::string(setting) : member_of(setting);
  return name + "=" + (number ? std::string(value) : "\"" + std::string(value) + "\"");
}

std::string Spelling::operator()(std::string_view setting) const {
  if (front_end_ == FrontEnd::kCommand) return flag_of(setting);
  if (front_end_ == FrontEnd::kPython) return std::string(setting);
  return "Options::" + member_of(setting);
}

std::string Spelling::no_timeout() const {
  switch (front_end_) {
    case FrontEnd::kCommand:
      return "--timeout none";
    case FrontEnd::kPython:
      return "timeout=None";
    case FrontEnd::kCpp:
      break;
  }
  return "sgpu::kNoTimeout";
}

std::string Spelling::none(std::string_view setting) const {
  switch (front_end_) {
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
