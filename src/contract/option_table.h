// NOTE [The option table]
// Every option of a call, once: its name (sgpu::Options' member, the Python keyword), its
// type, what a value must be, its default as the manual shows it, the environment variable
// that sets it and how, the sgpu command's flag, a line of doc, and how a value is set.
// From it come the Python keywords and their types (python/sgpu/_decorator.py, through
// the native module), the native module's conversion of them, sgpu run's flags, the flag
// that advice names for the sgpu command (front_end.h) and docs/options.md's table (a test
// keeps the file equal to options_markdown()). Adding an option is a member of
// sgpu::Options and a row here.
//
// The table is the only reader of the SGPU_* variables that set options: with_environment
// applies them to a call's options once, in its first step (launcher/call_plan.h), and to
// what the node's inventory is asked (sgpu::inventories, sgpu info). A rank reads the
// values its launcher resolved, which the launcher writes into the rank's environment under
// the same names, through environment_value. MLflow's own variables (MLFLOW_TRACKING_URI,
// MLFLOW_EXPERIMENT_NAME) are read by the tracking store, as MLflow's client reads them,
// in a call and outside one.
#pragma once

#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "sgpu/options.h"

namespace sgpu::contract {

enum class OptionType {
  kInt,       // a whole number
  kString,    // text
  kBool,      // true or false
  kSeconds,   // a duration in seconds (a number)
  kTimeout,   // seconds, or none (Python's None, the command's "none") for no deadline
  kRanks,     // a list of ranks, or none for all
  kFraction,  // a number above 0 and at most 1 (settings only)
};

// A value as a front end gives it: none, or a value of the row's type (kInt as long long,
// kSeconds and kTimeout as double, kRanks as a list).
using OptionValue =
    std::variant<std::monostate, bool, long long, double, std::string, std::vector<int>>;

// How a row's variable acts on its option.
enum class EnvRule {
  kNone,      // the row has no variable
  kDecides,   // where set, the variable decides, whatever the option says (SGPU_BACKEND)
  kStandsIn,  // the variable stands in for the text option left empty (SGPU_SIM)
  kTurnsOff,  // the variable can turn the option off, not on (SGPU_TRACKING=off)
  kMlflow,    // MLflow's own variable, read by the tracking store (see the NOTE)
};

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
  EnvRule env_rule = EnvRule::kNone;
  std::string_view choices = {};  // "shm|gloo": what the variable may say ("" any)
  bool (*left_empty)(const Options& options) = nullptr;  // kStandsIn: the option is unset
};

std::span<const OptionRow> option_table();
// The row named `name`; nullptr for none.
const OptionRow* find_option(std::string_view name);
// What a value of a type is: as sgpu run's help names it ("SECONDS|none") and as an
// error says what a flag or variable takes ("seconds or none").
struct TypeText {
  const char* metavar;
  const char* takes;
};
const TypeText& type_text(OptionType type);

// A front end's text as the row's value: a whole number, seconds ("none" for a timeout's
// none), a list like "0,3", or the text. Throws std::invalid_argument for text that is no
// value of the row's kind (NaN seconds among them); a true-or-false row's text is on or
// off (1, true, yes / 0, false, no).
OptionValue option_value_of_text(const OptionRow& row, const std::string& text);
// The same for a value of `type` (a kFraction's: above 0 and at most 1).
OptionValue option_value_of_text(OptionType type, const std::string& text);

// Who reads a row's variable: a caller, whose errors name the setting the variable stands for
// as it writes it (NOTE [Front ends]); or kRankSide, a rank or a process on a simulated node
// reading what its launcher resolved, whose errors name the variable alone, there being no
// caller's setting to name.
using Reader = std::optional<FrontEnd>;
inline constexpr Reader kRankSide = std::nullopt;

// The row's variable as its value; nullopt where the row has none or it is unset or empty.
// Throws ConfigError naming the variable ("SGPU_SIM_TRANSPORT=ib is not ...") for a value the
// row does not take. `name` must name a row.
std::optional<OptionValue> environment_value(std::string_view name, Reader reader);
// environment_value of a text row: "" where unset.
std::string environment_text(std::string_view name, Reader reader);
// environment_value of a true-or-false row: `unset` where unset.
bool environment_flag(std::string_view name, bool unset, Reader reader);

// `options` as the SGPU_* variables set them, each by its row's rule. Throws ConfigError
// naming the variable for a value its row does not take, and the setting as
// options.front_end writes it.
Options with_environment(Options options);

// docs/options.md's table of the options, a row each.
std::string options_markdown();

// NOTE [Settings]
// The SGPU_* variables that tune sgpu beyond a call's options (no member of sgpu::Options),
// the second part of the table: each read only through these functions, by the option
// table's rules (on or off in the same words; a whole number within the row's bounds) and
// with its errors (a ConfigError naming the variable and what it takes), and shown in
// docs/options.md's second table. Python reads them through the native module, but for
// SGPU_SERVERLESS_GPU, which the interpreter's startup hook reads before sgpu can load, in
// the table's words (a test holds them equal).
struct SettingRow {
  std::string_view env;
  OptionType type;  // kString, kBool, kInt (within min..max) or kFraction
  std::string_view shown_default;
  std::string_view doc;
  long long min = 0;  // kInt's bounds
  long long max = std::numeric_limits<long long>::max();
};

std::span<const SettingRow> setting_table();
// The row whose variable is `env`; std::logic_error where there is none.
const SettingRow& setting_row(std::string_view env);
// The setting's variable as its value; nullopt where it is unset or empty. Throws ConfigError
// naming the variable for a value its row does not take. `env` must name a row.
std::optional<OptionValue> setting_value(std::string_view env);
// setting_value of a text row: "" where unset.
std::string setting_text(std::string_view env);
// setting_value of a true-or-false row: `unset` where unset.
bool setting_flag(std::string_view env, bool unset);
// docs/options.md's table of the settings, a row each.
std::string settings_markdown();

}  // namespace sgpu::contract
