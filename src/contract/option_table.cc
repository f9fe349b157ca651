#include "contract/option_table.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "contract/front_end.h"
#include "sgpu/errors.h"

namespace sgpu::contract {
namespace {

// The row a value is for, and who gave it (NOTE [Front ends]).
struct Field {
  const char* name;
  FrontEnd front_end;
};

[[noreturn]] void refuse_kind(Field field, const char* kind) {
  throw ConfigError(std::string(field.name) + " takes " + kind);
}

template <class T>
const T& held_value(const OptionValue& value, Field field, const char* kind) {
  if (const T* held = std::get_if<T>(&value)) return *held;
  refuse_kind(field, kind);
}

// A whole number within T's range.
template <class T>
T as_whole(const OptionValue& value, Field field) {
  const long long number = held_value<long long>(value, field, "a whole number");
  if (number < static_cast<long long>(std::numeric_limits<T>::min()) ||
      static_cast<unsigned long long>(number) > std::numeric_limits<T>::max()) {
    throw ConfigError(std::string(field.name) + " is out of range, got " + std::to_string(number));
  }
  return static_cast<T>(number);
}

std::string as_text(const OptionValue& value, Field field) {
  return held_value<std::string>(value, field, "text");
}

bool as_flag(const OptionValue& value, Field field) {
  return held_value<bool>(value, field, "true or false");
}

// Seconds that are a number: NaN is refused as what the option must be.
double as_number_of_seconds(const OptionValue& value, Field field, const char* kind) {
  const double seconds = held_value<double>(value, field, kind);
  if (std::isnan(seconds)) {
    throw ConfigError(Spelling(field.front_end)(field.name) + " must be " +
                      std::string(find_option(field.name)->must_be) + ", got nan");
  }
  return seconds;
}

std::chrono::milliseconds as_seconds(const OptionValue& value, Field field) {
  return duration_of_seconds(as_number_of_seconds(value, field, "seconds"));
}

Timeout as_timeout(const OptionValue& value, Field field) {
  if (std::holds_alternative<std::monostate>(value)) return kNoTimeout;
  return timeout_of_seconds(as_number_of_seconds(value, field, "seconds, or none"));
}

#define SGPU_SET(member, how) \
  [](Options& o, const OptionValue& v) { o.member = how(v, Field{#member, o.front_end}); }
#define SGPU_EMPTY(member) [](const Options& o) { return o.member.empty(); }
// A row of the simulated backend's SimOptions, named sim_<field>.
#define SGPU_SET_SIM(field, how) \
  [](Options& o, const OptionValue& v) { o.sim.field = how(v, Field{"sim_" #field, o.front_end}); }
#define SGPU_EMPTY_SIM(field) [](const Options& o) { return o.sim.field.empty(); }

constexpr OptionRow kRows[] = {
    {"gpus", OptionType::kInt, "a positive int", "1", "", "--gpus", "ranks to start, one per GPU",
     SGPU_SET(gpus, as_whole<int>)},
    {"gpu_type", OptionType::kString, "a GPU type such as \"H100\"", "detected", "", "--gpu-type",
     "the GPU type the node must have: `\"H100\"`, `\"h100\"`, `\"A10\"`, ...",
     SGPU_SET(gpu_type, as_text)},
    {"timeout", OptionType::kTimeout,
     "seconds (a positive number; float('inf') is none), or None for no deadline", "3 hours", "",
     "--timeout", "deadline for the whole call (every rank's collectives end with it), or none",
     SGPU_SET(timeout, as_timeout)},
    {"hang_timeout", OptionType::kTimeout,
     "seconds (a positive number), or None to never judge a call hung", "10 minutes",
     "SGPU_HANG_TIMEOUT", "--hang-timeout",
     "how long a collective may be in flight on a rank before the call is judged hung, or none",
     SGPU_SET(hang_timeout, as_timeout), EnvRule::kDecides},
    {"recorder_entries", OptionType::kInt, "a number of collectives (0: none recorded)", "2000", "",
     "", "collectives each rank's recorder keeps; 0 records none, and no call is judged hung",
     SGPU_SET(recorder_entries, as_whole<std::uint32_t>)},
    {"backend", OptionType::kString, "\"auto\", \"cuda\" or \"sim\"", "`\"auto\"`", "SGPU_BACKEND",
     "--backend",
     "`\"cuda\"`, `\"sim\"`, or `\"auto\"` (cuda when a GPU is visible; never falls back to sim)",
     SGPU_SET(backend, as_text), EnvRule::kDecides, "auto|cuda|sim"},
    {"sim_node", OptionType::kString, "a node spec such as \"8xH100\"", "`SGPU_SIM`, else `8xH100`",
     "SGPU_SIM", "", "the node `sim` pretends to be: `8xH100`, `4xH100+4xA10`, `2xH200:40GiB`",
     SGPU_SET_SIM(node, as_text), EnvRule::kStandsIn, "", SGPU_EMPTY_SIM(node)},
    {"sim_faults", OptionType::kString, "a fault plan such as \"rank=1:segv@collective=3\"",
     "`SGPU_SIM_FAULTS`, else none", "SGPU_SIM_FAULTS", "",
     "faults for `sim` ranks: `rank=1:segv@collective=3`", SGPU_SET_SIM(faults, as_text),
     EnvRule::kStandsIn, "", SGPU_EMPTY_SIM(faults)},
    {"sim_transport", OptionType::kString, "\"shm\" or \"gloo\"",
     "`SGPU_SIM_TRANSPORT`, else `\"shm\"`", "SGPU_SIM_TRANSPORT", "",
     "how `sim` collectives travel: `\"shm\"` (shared memory) or `\"gloo\"`",
     SGPU_SET_SIM(transport, as_text), EnvRule::kStandsIn, "shm|gloo", SGPU_EMPTY_SIM(transport)},
    {"sim_compute", OptionType::kString, "\"values\" or \"shapes\"",
     "`SGPU_SIM_COMPUTE`, else `\"values\"`", "SGPU_SIM_COMPUTE", "--sim-compute",
     "what a Python rank on `sim` computes: `\"values\"`, or `\"shapes\"` (no data)",
     SGPU_SET_SIM(compute, as_text), EnvRule::kStandsIn, "values|shapes", SGPU_EMPTY_SIM(compute)},
    {"sim_fold", OptionType::kBool,
     "True (node 0's ranks stand for every node's) or False (every rank runs)", "false",
     "SGPU_SIM_FOLD", "--sim-fold",
     "in shape-only compute over several `sim` nodes, run node 0's ranks only, each standing "
     "for its place on every node",
     SGPU_SET_SIM(fold, as_flag), EnvRule::kDecides},
    {"sim_cuda", OptionType::kBool,
     "True (a rank's cuda devices are the simulated GPUs) or False (CPU)", "true", "SGPU_SIM_CUDA",
     "", "a Python rank's `cuda` devices on `sim` are the node's GPUs, served by the CPU",
     SGPU_SET_SIM(cuda, as_flag), EnvRule::kDecides},
    {"runs_dir", OptionType::kString, "a folder", "`SGPU_RUNS_DIR`, else `$TMPDIR/sgpu-<uid>/runs`",
     "SGPU_RUNS_DIR", "--log-dir", "where run folders go", SGPU_SET(runs_dir, as_text),
     EnvRule::kStandsIn, "", SGPU_EMPTY(runs_dir)},
    {"keep_run_dir", OptionType::kBool, "True or False", "false", "", "--keep-run-dir",
     "keep the run folder after a success too (a failure's is always kept)",
     SGPU_SET(keep_run_dir, as_flag)},
    {"console_ranks", OptionType::kRanks, "a list of ranks, or None for all", "all", "", "--ranks",
     "ranks whose output the console shows (the logs keep all)",
     [](Options& o, const OptionValue& v) {
       if (std::holds_alternative<std::monostate>(v)) {
         o.console_ranks.reset();
       } else {
         o.console_ranks = held_value<std::vector<int>>(v, Field{"console_ranks", o.front_end},
                                                        "a list of ranks");
       }
     }},
    {"max_payload_bytes", OptionType::kInt, "a positive int", "256 MiB", "", "",
     "limit on the serialized arguments and on each rank's result",
     SGPU_SET(max_payload_bytes, as_whole<std::size_t>)},
    {"teardown_grace", OptionType::kSeconds, "seconds (not negative)", "5 s", "", "",
     "between SIGTERM and SIGKILL when ranks are torn down", SGPU_SET(teardown_grace, as_seconds)},
    {"start_method", OptionType::kString, "\"auto\", \"fork-server\" or \"exec\"", "fork server",
     "SGPU_START_METHOD", "", "how ranks start: `\"fork-server\"` or `\"exec\"`",
     [](Options& o, const OptionValue& v) {
       const std::string method = as_text(v, Field{"start_method", o.front_end});
       if (method != "auto" && method != "exec" && method != "fork-server") {
         throw ConfigError(Spelling(o.front_end)("start_method") + " must be " +
                           std::string(find_option("start_method")->must_be) + ", got \"" + method +
                           "\"");
       }
       o.start_method = method == "exec"          ? StartMethod::kExec
                        : method == "fork-server" ? StartMethod::kForkServer
                                                  : StartMethod::kAuto;
     },
     EnvRule::kDecides, "fork-server|exec"},
    {"name", OptionType::kString, "a name", "the function's symbol", "", "--run-name",
     "the call's name in errors and of its MLflow run", SGPU_SET(name, as_text)},
    {"tracking", OptionType::kBool, "True or False", "true", "SGPU_TRACKING", "--no-tracking",
     "record the call as an MLflow run", SGPU_SET(tracking, as_flag), EnvRule::kTurnsOff},
    {"tracking_uri", OptionType::kString, "an MLflow tracking URI",
     "`MLFLOW_TRACKING_URI`, else MLflow's default (`sqlite:///mlflow.db`, or `./mlruns` when "
     "it holds runs)",
     "MLFLOW_TRACKING_URI", "", "the MLflow tracking server, database or file store",
     SGPU_SET(tracking_uri, as_text), EnvRule::kMlflow},
    {"experiment", OptionType::kString, "an experiment name",
     "`MLFLOW_EXPERIMENT_NAME`, else `MLFLOW_EXPERIMENT_ID`, else `Default`",
     "MLFLOW_EXPERIMENT_NAME", "--experiment", "the MLflow experiment, created if missing",
     SGPU_SET(experiment, as_text), EnvRule::kMlflow},
    {"nnodes", OptionType::kInt, "a number of nodes (0: from the engine, else 1)",
     "from the engine, else 1", "", "--nnodes", "nodes in the launch, each running the same call",
     SGPU_SET(nnodes, as_whole<int>)},
    {"node_rank", OptionType::kInt, "this node's place, 0 to nnodes-1 (-1: from the engine)",
     "from the engine, else 0", "", "--node-rank",
     "this node's place in the launch; node 0 hosts the store", SGPU_SET(node_rank, as_whole<int>)},
    {"rdzv_endpoint", OptionType::kString, "node 0's store as \"HOST[:PORT]\"", "from the engine",
     "", "--rdzv-endpoint", "node 0's store as `HOST[:PORT]` (port 29500 when left out)",
     SGPU_SET(rdzv_endpoint, as_text)},
    {"rdzv_id", OptionType::kString, "the launch's name, the same on every node",
     "from the engine, else derived", "", "--rdzv-id", "the launch's name, the same on every node",
     SGPU_SET(rdzv_id, as_text)},
    {"rdzv_timeout", OptionType::kSeconds, "seconds (a positive number) for every node to join",
     "10 minutes", "", "--rdzv-timeout", "how long every node has to join the launch",
     SGPU_SET(rdzv_timeout, as_seconds)},
};

#undef SGPU_SET
#undef SGPU_EMPTY
#undef SGPU_SET_SIM
#undef SGPU_EMPTY_SIM

}  // namespace

std::span<const OptionRow> option_table() { return kRows; }

const OptionRow* find_option(std::string_view name) {
  for (const OptionRow& row : kRows) {
    if (row.name == name) return &row;
  }
  return nullptr;
}

namespace {

// What a value of each type is, in OptionType's order: as sgpu run's help names it, and as
// an error says what a flag or variable takes.
constexpr TypeText kTypeTexts[] = {
    {"INT", "a whole number"},
    {"TEXT", "text"},
    {"", "on or off"},
    {"SECONDS", "seconds"},
    {"SECONDS|none", "seconds or none"},
    {"RANKS", "a list like 0,3"},
    {"FRACTION", "a fraction above 0 and at most 1"},
};
static_assert(std::size(kTypeTexts) == static_cast<std::size_t>(OptionType::kFraction) + 1);

// Seconds as a front end's text gives them (sgpu::parse_timeout: a number the whole text
// is, "inf" and exponents too; NaN throws). "none": +infinity, which a timeout takes as no
// deadline and a duration as the longest.
double seconds_in_text(const std::string& text) {
  const Timeout timeout = parse_timeout(text);
  return timeout ? std::chrono::duration<double>(*timeout).count() : HUGE_VAL;
}

std::optional<bool> on_or_off_in_text(std::string_view text) {
  for (std::string_view on : {"on", "1", "true", "yes", "ON", "True"}) {
    if (text == on) return true;
  }
  for (std::string_view off : {"off", "0", "false", "no", "OFF", "False"}) {
    if (text == off) return false;
  }
  return std::nullopt;
}

// A row's choices, "a|b|c", one by one.
std::vector<std::string_view> choice_list(std::string_view choices) {
  std::vector<std::string_view> list;
  for (std::size_t start = 0; start <= choices.size();) {
    const std::size_t bar = std::min(choices.find('|', start), choices.size());
    list.push_back(choices.substr(start, bar - start));
    start = bar + 1;
  }
  return list;
}

// "a|b|c" as a message names them: "a", "b" or "c".
std::string choices_named(std::string_view choices) {
  const std::vector<std::string_view> list = choice_list(choices);
  std::string named;
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (i > 0) named += i + 1 == list.size() ? " or " : ", ";
    named += "\"" + std::string(list[i]) + "\"";
  }
  return named;
}

bool among_choices(std::string_view choices, std::string_view text) {
  const std::vector<std::string_view> list = choice_list(choices);
  return std::find(list.begin(), list.end(), text) != list.end();
}

// What a variable may say, as its row has it.
struct VariableRule {
  std::string_view env;
  OptionType type;
  std::string_view choices;  // "" any
  std::string sets;          // what the error adds: " (SGPU_X sets x)", or ""
  long long min = std::numeric_limits<long long>::min();  // kInt
  long long max = std::numeric_limits<long long>::max();
};

// A variable as its value: nullopt where unset or empty; ConfigError naming it for a value
// its rule does not take (environment_value's and setting_value's contract).
std::optional<OptionValue> variable_value(const VariableRule& rule) {
  if (rule.env.empty()) return std::nullopt;
  const std::string variable(rule.env);
  const char* set = std::getenv(variable.c_str());
  if (set == nullptr || *set == '\0') return std::nullopt;
  const std::string text = set;
  const std::string given = variable + "=" + text;
  if (rule.type == OptionType::kBool) {
    if (const std::optional<bool> flag = on_or_off_in_text(text)) return *flag;
    throw ConfigError(given +
                      " is neither on nor off: \"off\" (or 0, false, no) or \"on\" (or 1, " +
                      "true, yes)" + rule.sets);
  }
  if (!rule.choices.empty() && !among_choices(rule.choices, text)) {
    throw ConfigError(given + " is not " + choices_named(rule.choices) + rule.sets);
  }
  const bool seconds = rule.type == OptionType::kSeconds || rule.type == OptionType::kTimeout;
  const bool bounded =
      rule.type == OptionType::kInt && (rule.min != std::numeric_limits<long long>::min() ||
                                        rule.max != std::numeric_limits<long long>::max());
  try {
    OptionValue value = option_value_of_text(rule.type, text);
    const double* number = std::get_if<double>(&value);
    if (number != nullptr && !(*number > 0)) throw std::invalid_argument(text);
    const long long* whole = std::get_if<long long>(&value);
    if (whole != nullptr && (*whole < rule.min || *whole > rule.max)) {
      throw std::out_of_range(text);
    }
    return value;
  } catch (const std::exception&) {  // std::invalid_argument, std::out_of_range
    const std::string range =
        bounded ? " from " + std::to_string(rule.min) + " to " + std::to_string(rule.max) : "";
    throw ConfigError(given + " is not " + (seconds ? "positive " : "") +
                      type_text(rule.type).takes + range + rule.sets);
  }
}

std::optional<OptionValue> variable_value(const OptionRow& row, Reader reader) {
  if (row.env.empty()) return std::nullopt;
  const std::string sets =
      reader ? " (" + std::string(row.env) + " sets " + Spelling(*reader)(row.name) + ")" : "";
  return variable_value(VariableRule{row.env, row.type, row.choices, sets});
}

}  // namespace

const TypeText& type_text(OptionType type) { return kTypeTexts[static_cast<int>(type)]; }

OptionValue option_value_of_text(const OptionRow& row, const std::string& text) {
  return option_value_of_text(row.type, text);
}

OptionValue option_value_of_text(OptionType type, const std::string& text) {
  switch (type) {
    case OptionType::kInt: {
      std::size_t used = 0;
      const long long number = std::stoll(text, &used);
      if (used != text.size()) throw std::invalid_argument(text);
      return number;
    }
    case OptionType::kTimeout:
      if (text == "none") return std::monostate{};
      return seconds_in_text(text);
    case OptionType::kSeconds:
      return seconds_in_text(text);
    case OptionType::kRanks: {
      std::vector<int> ranks;
      std::stringstream in(text);
      for (std::string part; std::getline(in, part, ',');) {
        std::size_t used = 0;
        ranks.push_back(std::stoi(part, &used));
        if (used != part.size()) throw std::invalid_argument(text);
      }
      return ranks;
    }
    case OptionType::kBool:
      if (const std::optional<bool> flag = on_or_off_in_text(text)) return *flag;
      throw std::invalid_argument(text);
    case OptionType::kFraction: {
      std::size_t used = 0;
      const double fraction = std::stod(text, &used);
      if (used != text.size() || !(fraction > 0.0 && fraction <= 1.0)) {
        throw std::invalid_argument(text);
      }
      return fraction;
    }
    case OptionType::kString:
      break;
  }
  return text;
}

std::optional<OptionValue> environment_value(std::string_view name, Reader reader) {
  const OptionRow* row = find_option(name);
  return row != nullptr ? variable_value(*row, reader) : std::nullopt;
}

std::string environment_text(std::string_view name, Reader reader) {
  const std::optional<OptionValue> value = environment_value(name, reader);
  return value ? std::get<std::string>(*value) : std::string();
}

bool environment_flag(std::string_view name, bool unset, Reader reader) {
  const std::optional<OptionValue> value = environment_value(name, reader);
  return value ? std::get<bool>(*value) : unset;
}

Options with_environment(Options options) {
  for (const OptionRow& row : kRows) {
    switch (row.env_rule) {
      case EnvRule::kDecides:
        if (const auto value = variable_value(row, options.front_end)) row.set(options, *value);
        break;
      case EnvRule::kStandsIn:  // a variable the option leaves unused is not read
        if (!row.left_empty(options)) break;
        if (const auto value = variable_value(row, options.front_end)) row.set(options, *value);
        break;
      case EnvRule::kTurnsOff:
        if (const auto value = variable_value(row, options.front_end);
            value && !std::get<bool>(*value)) {
          row.set(options, false);
        }
        break;
      case EnvRule::kNone:
      case EnvRule::kMlflow:
        break;
    }
  }
  return options;
}

std::string options_markdown() {
  const auto code = [](std::string_view text) {
    return text.empty() ? std::string("—") : "`" + std::string(text) + "`";
  };
  const auto variable = [&](const OptionRow& row) {
    switch (row.env_rule) {
      case EnvRule::kDecides:
        return code(row.env) + " decides";
      case EnvRule::kStandsIn:
        return code(row.env) + " if unset";
      case EnvRule::kTurnsOff:
        return code(std::string(row.env) + "=off") + " turns off";
      case EnvRule::kMlflow:
        return code(row.env) + " if unset (MLflow's)";
      case EnvRule::kNone:
        break;
    }
    return code(row.env);
  };
  std::string table =
      "| option | default | environment | `sgpu run` flag | what it is |\n"
      "| --- | --- | --- | --- | --- |\n";
  for (const OptionRow& row : kRows) {
    table += "| `" + std::string(row.name) + "` | " + std::string(row.shown_default) + " | " +
             variable(row) + " | " + code(row.flag) + " | " + std::string(row.doc) + " |\n";
  }
  return table;
}

namespace {

// NOTE [Settings]
const SettingRow kSettings[] = {
    {"SGPU_PLATFORM", OptionType::kString, "the simulated node's; none on `cuda`",
     "the platform collectives and kernels are timed on: a name under `platforms/` "
     "(`h100-nvswitch`) or a platform file"},
    {"SGPU_PLATFORM_PATH", OptionType::kString, "none",
     "folders (`:`-separated) searched for platform files before sgpu's own"},
    {"SGPU_SIM_MEMORY", OptionType::kBool, "on",
     "a simulated GPU counts what its ranks allocate: its capacity, CUDA's out-of-memory error "
     "past it, its peaks"},
    {"SGPU_SIM_SHM_SLOT_BYTES", OptionType::kInt, "1 MiB",
     "bytes of each rank's slot in the shared-memory transport: a collective moves at most one "
     "slot per rank per stage",
     64, std::int64_t{1} << 32},
    {"SGPU_SIM_VOLUME", OptionType::kString, "none",
     "a network volume's behaviour for `sgpu.data` and `sgpu.checkpoint` on `sim`: "
     "`path=...;fail_every=2`"},
    {"SGPU_CUDA_MEMORY_FRACTION", OptionType::kFraction, "1",
     "what a `cuda` rank's caching allocator may take of its GPU"},
    {"SGPU_CUDA_MODULE", OptionType::kString, "the one built with sgpu",
     "the CUDA runtime module (`libsgpu_cuda_runtime.so`) a `cuda` rank loads"},
    {"SGPU_FORK_SERVER_PRELOAD", OptionType::kString, "none",
     "modules (`,`-separated) a Python caller's fork server imports before it forks ranks"},
    {"SGPU_SERVERLESS_GPU", OptionType::kBool, "on",
     "`serverless_gpu` and `databricks.air` come from sgpu's stand-ins where no installed "
     "package has the name"},
    {"SGPU_BENCH_COLLECTIVES", OptionType::kString, "beside `sgpu`",
     "the `bench_collectives` program `sgpu bench collectives` runs"},
};

}  // namespace

std::span<const SettingRow> setting_table() { return kSettings; }

const SettingRow& setting_row(std::string_view env) {
  for (const SettingRow& row : kSettings) {
    if (row.env == env) return row;
  }
  throw std::logic_error("no setting is called " + std::string(env));
}

std::optional<OptionValue> setting_value(std::string_view env) {
  const SettingRow& row = setting_row(env);
  return variable_value(VariableRule{row.env, row.type, "", "", row.min, row.max});
}

std::string setting_text(std::string_view env) {
  const std::optional<OptionValue> value = setting_value(env);
  return value ? std::get<std::string>(*value) : std::string();
}

bool setting_flag(std::string_view env, bool unset) {
  const std::optional<OptionValue> value = setting_value(env);
  return value ? std::get<bool>(*value) : unset;
}

std::string settings_markdown() {
  std::string table =
      "| variable | takes | default | what it is |\n"
      "| --- | --- | --- | --- |\n";
  for (const SettingRow& row : kSettings) {
    std::string takes = type_text(row.type).takes;
    if (row.type == OptionType::kInt) {
      takes += " from " + std::to_string(row.min) + " to " + std::to_string(row.max);
    }
    table += "| `" + std::string(row.env) + "` | " + takes + " | " +
             std::string(row.shown_default) + " | " + std::string(row.doc) + " |\n";
  }
  return table;
}

}  // namespace sgpu::contract
