// NOTE [The option table]
// Every option of a call, once: its name (sgpu::Options' member, the Python keyword), its
// type, what a value must be, its default as the manual shows it, the environment variable
// that sets it, the sgpu command's flag, a line of doc, and how a value is set. From it
// come the Python keywords and their types (python/sgpu/_decorator.py, through the native
// module), the native module's conversion of them, the flag that advice names for the
// sgpu command (front_end.h) and docs/options.md's table (a test keeps the file equal to
// options_markdown()). Adding an option is a member of sgpu::Options and a row here.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "sgpu/options.h"

namespace sgpu::contract {

enum class OptionType {
  kInt,      // a whole number
  kString,   // text
  kBool,     // true or false
  kSeconds,  // a duration in seconds (a number)
  kTimeout,  // seconds, or none (Python's None, the command's "none") for no deadline
  kRanks,    // a list of ranks, or none for all
};

// A value as a front end gives it: none, or a value of the row's type (kInt as long long,
// kSeconds and kTimeout as double, kRanks as a list).
using OptionValue =
    std::variant<std::monostate, bool, long long, double, std::string, std::vector<int>>;

struct OptionRow {
  std::string_view name;
  OptionType type;
  std::string_view must_be;  // what a value must be: "a positive int"
  std::string_view shown_default;
  std::string_view env;   // the variable that sets it ("" none), as `doc` says how
  std::string_view flag;  // sgpu run's flag ("" none); a bool's "--no-..." sets false
  std::string_view doc;
  // Sets the option. Throws ConfigError naming the option for a value of another kind.
  void (*set)(Options& options, const OptionValue& value);
};

std::span<const OptionRow> option_table();
// The row named `name`; nullptr for none.
const OptionRow* find_option(std::string_view name);
// docs/options.md's table of the options, a row each.
std::string options_markdown();

}  // namespace sgpu::contract
