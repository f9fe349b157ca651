// The option table (contract/option_table.h): each row sets its own member of
// sgpu::Options from what a front end gives, a value of another kind is a ConfigError that
// names the option, the SGPU_* variables act on their options as their rows say (and a
// value a row does not take is refused naming the variable), advice for the sgpu command
// spells the row's flag, and docs/options.md holds the table the rows make.
#include "contract/option_table.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>

#include "contract/front_end.h"
#include "sgpu/errors.h"

namespace {

using sgpu::FrontEnd;
using sgpu::contract::environment_value;
using sgpu::contract::EnvRule;
using sgpu::contract::find_option;
using sgpu::contract::option_table;
using sgpu::contract::OptionValue;
using sgpu::contract::Spelling;
using sgpu::contract::with_environment;

sgpu::Options set(std::string_view name, const OptionValue& value) {
  sgpu::Options options;
  const auto* row = find_option(name);
  EXPECT_NE(row, nullptr) << name;
  if (row != nullptr) row->set(options, value);
  return options;
}

// Sets `name` to `value` (nullptr: unsets it) for the scope, then puts back what it was.
class ScopedVariable {
 public:
  ScopedVariable(const char* name, const char* value) : name_(name) {
    if (const char* was = ::getenv(name)) was_ = was;
    value != nullptr ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedVariable() { was_ ? ::setenv(name_, was_->c_str(), 1) : ::unsetenv(name_); }
  ScopedVariable(const ScopedVariable&) = delete;
  ScopedVariable& operator=(const ScopedVariable&) = delete;

 private:
  const char* name_;
  std::optional<std::string> was_;
};

void expect_refused(const char* variable, const char* value, const std::string& says) {
  const ScopedVariable set(variable, value);
  try {
    with_environment({});
    ADD_FAILURE() << variable << "=" << value << " was taken";
  } catch (const sgpu::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

TEST(OptionTable, NamesAndFlagsAreEachOneOptionsAndEveryRowSaysWhatItIs) {
  std::set<std::string_view> names, flags;
  for (const auto& row : option_table()) {
    EXPECT_TRUE(names.insert(row.name).second) << row.name;
    if (!row.flag.empty()) {
      EXPECT_TRUE(flags.insert(row.flag).second) << row.flag;
    }
    EXPECT_FALSE(row.must_be.empty()) << row.name;
    EXPECT_FALSE(row.shown_default.empty()) << row.name;
    EXPECT_FALSE(row.doc.empty()) << row.name;
  }
  EXPECT_EQ(find_option("no_such_option"), nullptr);
}

TEST(OptionTable, EachRowSetsItsOwnMember) {
  EXPECT_EQ(set("gpus", 4LL).gpus, 4);
  EXPECT_EQ(set("gpu_type", std::string("A10")).gpu_type, "A10");
  EXPECT_EQ(set("timeout", std::monostate{}).timeout, sgpu::kNoTimeout);
  EXPECT_EQ(set("timeout", 1.5).timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(set("hang_timeout", 60.0).hang_timeout, std::chrono::minutes(1));
  EXPECT_EQ(set("recorder_entries", 0LL).recorder_entries, 0u);
  EXPECT_EQ(set("runs_dir", std::string("/r")).runs_dir, "/r");
  EXPECT_TRUE(set("keep_run_dir", true).keep_run_dir);
  EXPECT_EQ(set("console_ranks", std::vector<int>{0, 3}).console_ranks, (std::vector<int>{0, 3}));
  EXPECT_FALSE(set("console_ranks", std::monostate{}).console_ranks.has_value());
  EXPECT_EQ(set("teardown_grace", 0.25).teardown_grace, std::chrono::milliseconds(250));
  EXPECT_EQ(set("start_method", std::string("exec")).start_method, sgpu::StartMethod::kExec);
  EXPECT_EQ(set("start_method", std::string("fork-server")).start_method,
            sgpu::StartMethod::kForkServer);
  EXPECT_FALSE(set("tracking", false).tracking);
  EXPECT_FALSE(set("sim_cuda", false).sim.cuda);
  EXPECT_EQ(set("node_rank", 1LL).node_rank, 1);
  EXPECT_EQ(set("rdzv_timeout", 30.0).rdzv_timeout, std::chrono::seconds(30));
  EXPECT_EQ(set("max_payload_bytes", 1024LL).max_payload_bytes, 1024u);
}

TEST(OptionTable, AValueOfAnotherKindOrOutOfRangeNamesTheOption) {
  const auto refused = [](std::string_view name, const OptionValue& value, const char* says) {
    sgpu::Options options;
    try {
      find_option(name)->set(options, value);
      ADD_FAILURE() << name << " took a value of another kind";
    } catch (const sgpu::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused("gpus", std::string("2"), "gpus takes a whole number");
  refused("timeout", std::string("1"), "timeout takes seconds, or none");
  refused("gpus", 1LL << 40, "gpus is out of range");
  refused("recorder_entries", -1LL, "recorder_entries is out of range");
  refused("timeout", std::nan(""), "Options::timeout must be seconds (a positive number");
  refused("teardown_grace", std::nan(""), "Options::teardown_grace must be seconds");
  refused("start_method", std::string("spawn"),
          "Options::start_method must be \"auto\", \"fork-server\" or \"exec\", got \"spawn\"");
}

TEST(OptionTable, ARowWithAVariableSaysHowItActs) {
  for (const auto& row : option_table()) {
    EXPECT_EQ(row.env.empty(), row.env_rule == EnvRule::kNone) << row.name;
    if (row.env_rule == EnvRule::kStandsIn) {
      EXPECT_NE(row.left_empty, nullptr) << row.name;
    }
    if (row.env_rule == EnvRule::kTurnsOff) {
      EXPECT_EQ(row.type, sgpu::contract::OptionType::kBool) << row.name;
    }
  }
}

TEST(OptionTable, AVariableDecidesStandsInOrTurnsOffAsItsRowSays) {
  const ScopedVariable backend("SGPU_BACKEND", "sim"), hang("SGPU_HANG_TIMEOUT", "none"),
      node("SGPU_SIM", "2xA10"), transport("SGPU_SIM_TRANSPORT", "gloo"),
      tracking("SGPU_TRACKING", "off"), cuda("SGPU_SIM_CUDA", "0"),
      method("SGPU_START_METHOD", "exec"), runs("SGPU_RUNS_DIR", "/runs");
  sgpu::Options given;
  given.backend = "cuda";
  given.sim.transport = "shm";
  const sgpu::Options options = with_environment(given);
  EXPECT_EQ(options.backend, "sim");  // it decides
  EXPECT_EQ(options.hang_timeout, sgpu::kNoTimeout);
  EXPECT_FALSE(options.sim.cuda);
  EXPECT_EQ(options.start_method, sgpu::StartMethod::kExec);
  EXPECT_EQ(options.sim.node, "2xA10");     // it stands in for the option left empty
  EXPECT_EQ(options.runs_dir, "/runs");     // a path's row too
  EXPECT_EQ(options.sim.transport, "shm");  // not for one given
  EXPECT_FALSE(options.tracking);           // it turns it off
}

// Each variable against an option given a value other than its default, its rule written
// here and not read from the table, so that a row whose rule changes (and its docs with it)
// fails: a variable that decides overrides what the call passed, one that stands in does
// not, and SGPU_TRACKING turns tracking off and never on.
TEST(OptionTable, EveryVariableActsOnAGivenOptionAsItsRuleHasAlwaysSaid) {
  struct Case {
    const char* variable;
    const char* value;
    void (*give)(sgpu::Options&);
    bool (*took_variable)(const sgpu::Options&);  // the variable's value won
    bool decides;
  };
  const Case cases[] = {
      {"SGPU_BACKEND", "sim", [](sgpu::Options& o) { o.backend = "cuda"; },
       [](const sgpu::Options& o) { return o.backend == "sim"; }, true},
      {"SGPU_HANG_TIMEOUT", "none",
       [](sgpu::Options& o) { o.hang_timeout = std::chrono::seconds(5); },
       [](const sgpu::Options& o) { return o.hang_timeout == sgpu::kNoTimeout; }, true},
      {"SGPU_SIM_CUDA", "on", [](sgpu::Options& o) { o.sim.cuda = false; },
       [](const sgpu::Options& o) { return o.sim.cuda; }, true},
      {"SGPU_SIM_FOLD", "on", [](sgpu::Options& o) { o.sim.fold = false; },
       [](const sgpu::Options& o) { return o.sim.fold; }, true},
      {"SGPU_START_METHOD", "exec",
       [](sgpu::Options& o) { o.start_method = sgpu::StartMethod::kForkServer; },
       [](const sgpu::Options& o) { return o.start_method == sgpu::StartMethod::kExec; }, true},
      {"SGPU_SIM", "2xA10", [](sgpu::Options& o) { o.sim.node = "4xH100"; },
       [](const sgpu::Options& o) { return o.sim.node == "2xA10"; }, false},
      {"SGPU_SIM_FAULTS", "rank=1:exit=3@start",
       [](sgpu::Options& o) { o.sim.faults = "rank=0:exit=2@start"; },
       [](const sgpu::Options& o) { return o.sim.faults == "rank=1:exit=3@start"; }, false},
      {"SGPU_SIM_TRANSPORT", "gloo", [](sgpu::Options& o) { o.sim.transport = "shm"; },
       [](const sgpu::Options& o) { return o.sim.transport == "gloo"; }, false},
      {"SGPU_SIM_COMPUTE", "values", [](sgpu::Options& o) { o.sim.compute = "shapes"; },
       [](const sgpu::Options& o) { return o.sim.compute == "values"; }, false},
      {"SGPU_RUNS_DIR", "/runs", [](sgpu::Options& o) { o.runs_dir = "/mine"; },
       [](const sgpu::Options& o) { return o.runs_dir == "/runs"; }, false},
      {"SGPU_TRACKING", "off", [](sgpu::Options& o) { o.tracking = true; },
       [](const sgpu::Options& o) { return !o.tracking; }, true},
      {"SGPU_TRACKING", "on", [](sgpu::Options& o) { o.tracking = false; },
       [](const sgpu::Options& o) { return o.tracking; }, false},
  };
  std::set<std::string> covered;
  for (const Case& c : cases) {
    covered.insert(c.variable);
    const ScopedVariable set(c.variable, c.value);
    sgpu::Options given;
    c.give(given);
    EXPECT_EQ(c.took_variable(with_environment(given)), c.decides)
        << c.variable << "=" << c.value << (c.decides ? " did not override " : " overrode ")
        << "the option the call gave";
  }
  for (const auto& row : option_table()) {
    if (row.env.empty() || row.env_rule == EnvRule::kMlflow) continue;
    EXPECT_EQ(covered.count(std::string(row.env)), 1U)
        << row.env << " has no case here: say how it acts on a given option";
  }
}

TEST(OptionTable, AVariableTurnsNothingOnAndOneTheOptionLeavesUnusedIsNotRead) {
  const ScopedVariable tracking("SGPU_TRACKING", "on"), transport("SGPU_SIM_TRANSPORT", "ib"),
      empty("SGPU_BACKEND", "");
  sgpu::Options given;
  given.tracking = false;
  given.sim.transport = "gloo";
  const sgpu::Options options = with_environment(given);
  EXPECT_FALSE(options.tracking);
  EXPECT_EQ(options.sim.transport, "gloo");
  EXPECT_EQ(options.backend, "auto");  // set but empty is unset
}

TEST(OptionTable, AVariableItsRowDoesNotTakeIsRefusedNamingIt) {
  expect_refused("SGPU_HANG_TIMEOUT", "soon", "SGPU_HANG_TIMEOUT=soon is not positive seconds");
  expect_refused("SGPU_HANG_TIMEOUT", "0", "SGPU_HANG_TIMEOUT=0 is not positive seconds or none");
  expect_refused("SGPU_HANG_TIMEOUT", "nan", "SGPU_HANG_TIMEOUT=nan is not positive seconds");
  expect_refused("SGPU_TRACKING", "maybe", "SGPU_TRACKING=maybe is neither on nor off");
  expect_refused("SGPU_SIM_CUDA", "maybe", "SGPU_SIM_CUDA=maybe is neither on nor off");
  expect_refused("SGPU_START_METHOD", "auto",
                 "SGPU_START_METHOD=auto is not \"fork-server\" or \"exec\"");
  expect_refused("SGPU_SIM_COMPUTE", "shape",
                 "SGPU_SIM_COMPUTE=shape is not \"values\" or \"shapes\" (SGPU_SIM_COMPUTE sets");
}

TEST(OptionTable, ARankReadsWhatItsLauncherResolvedByTheRowsName) {
  {
    const ScopedVariable unset("SGPU_SIM", nullptr);
    EXPECT_FALSE(environment_value("sim_node", FrontEnd::kCpp).has_value());
    EXPECT_EQ(sgpu::contract::environment_text("sim_node", FrontEnd::kCpp), "");
    const ScopedVariable cuda_unset("SGPU_SIM_CUDA", nullptr);
    EXPECT_TRUE(sgpu::contract::environment_flag("sim_cuda", true, FrontEnd::kCpp));
  }
  const ScopedVariable node("SGPU_SIM", "4xH100"), cuda("SGPU_SIM_CUDA", "off");
  EXPECT_EQ(std::get<std::string>(*environment_value("sim_node", FrontEnd::kCpp)), "4xH100");
  EXPECT_FALSE(std::get<bool>(*environment_value("sim_cuda", FrontEnd::kCpp)));
  EXPECT_EQ(sgpu::contract::environment_text("sim_node", FrontEnd::kCpp), "4xH100");
  EXPECT_FALSE(sgpu::contract::environment_flag("sim_cuda", true, FrontEnd::kCpp));
  EXPECT_FALSE(environment_value("gpus", FrontEnd::kCpp).has_value());  // a row with no variable
  EXPECT_FALSE(environment_value("no_such_option", FrontEnd::kCpp).has_value());
}

TEST(OptionTable, AFrontEndsTextIsAValueOfTheRowsKind) {
  using sgpu::contract::option_value_of_text;
  EXPECT_EQ(std::get<long long>(option_value_of_text(*find_option("gpus"), "4")), 4);
  EXPECT_EQ(std::get<double>(option_value_of_text(*find_option("timeout"), "1.5")), 1.5);
  EXPECT_TRUE(std::holds_alternative<std::monostate>(
      option_value_of_text(*find_option("timeout"), "none")));
  EXPECT_EQ(std::get<std::vector<int>>(option_value_of_text(*find_option("console_ranks"), "0,3")),
            (std::vector<int>{0, 3}));
  EXPECT_TRUE(std::get<bool>(option_value_of_text(*find_option("tracking"), "yes")));
  EXPECT_THROW(option_value_of_text(*find_option("gpus"), "4x"), std::invalid_argument);
  EXPECT_THROW(option_value_of_text(*find_option("teardown_grace"), "nan"), std::invalid_argument);
  EXPECT_THROW(option_value_of_text(*find_option("tracking"), "maybe"), std::invalid_argument);
}

TEST(OptionTable, AdviceForTheCommandSpellsTheRowsFlag) {
  const Spelling spell(FrontEnd::kCommand);
  EXPECT_EQ(spell("runs_dir"), "--log-dir");
  EXPECT_EQ(spell("console_ranks"), "--ranks");
  EXPECT_EQ(spell("backend", "sim"), "--backend sim");
  EXPECT_EQ(spell("recorder_entries"), "recorder_entries");  // no flag
  EXPECT_EQ(spell.no_timeout(), "--timeout none");
  EXPECT_EQ(spell.none("hang_timeout"), "--hang-timeout none");
}

TEST(OptionTable, AdviceInCppNamesTheSimulatedBackendsFieldsOfOptionsSim) {
  const Spelling cpp(FrontEnd::kCpp);
  EXPECT_EQ(cpp("sim_compute", "shapes"), "sim.compute=\"shapes\"");
  EXPECT_EQ(cpp("sim_fold"), "Options::sim.fold");
  EXPECT_EQ(cpp("timeout"), "Options::timeout");
  EXPECT_EQ(cpp.none("hang_timeout"), "Options::hang_timeout = sgpu::kNoTimeout");
  const Spelling python(FrontEnd::kPython);
  EXPECT_EQ(python("sim_compute", "shapes"), "sim_compute=\"shapes\"");
  EXPECT_EQ(python("sim_fold"), "sim_fold");
  EXPECT_EQ(python("gpus", "4"), "gpus=4");
  EXPECT_EQ(python.no_timeout(), "timeout=None");
}

// The front end travels with the options (NOTE [Front ends]): one process that makes calls
// for two callers names each one's settings as that caller writes them, whichever came first.
TEST(OptionTable, AVariablesErrorNamesTheSettingAsItsOwnCallerWritesIt) {
  const ScopedVariable bad("SGPU_SIM_FOLD", "maybe");
  const auto refusal = [](FrontEnd front_end) {
    sgpu::Options given;
    given.front_end = front_end;
    try {
      with_environment(given);
    } catch (const sgpu::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("taken");
  };
  for (int twice = 0; twice < 2; ++twice) {
    EXPECT_NE(refusal(FrontEnd::kPython).find("(SGPU_SIM_FOLD sets sim_fold)"), std::string::npos)
        << refusal(FrontEnd::kPython);
    EXPECT_NE(refusal(FrontEnd::kCommand).find("(SGPU_SIM_FOLD sets --sim-fold)"),
              std::string::npos)
        << refusal(FrontEnd::kCommand);
    EXPECT_NE(refusal(FrontEnd::kCpp).find("(SGPU_SIM_FOLD sets Options::sim.fold)"),
              std::string::npos)
        << refusal(FrontEnd::kCpp);
  }
  // A variable read alone, by its row's name, says it the same way.
  try {
    sgpu::contract::environment_flag("sim_fold", false, FrontEnd::kCommand);
    ADD_FAILURE() << "SGPU_SIM_FOLD=maybe was taken";
  } catch (const sgpu::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("sets --sim-fold)"), std::string::npos) << e.what();
  }
}

TEST(OptionTable, TheManualsTablesAreTheTables) {
  std::ifstream in(std::string(SGPU_TEST_SOURCE_DIR) + "/docs/options.md");
  std::stringstream text;
  text << in.rdbuf();
  const std::string table = sgpu::contract::options_markdown();
  EXPECT_NE(text.str().find(table), std::string::npos)
      << "docs/options.md does not hold the option table; put this table in it:\n"
      << table;
  const std::string settings = sgpu::contract::settings_markdown();
  EXPECT_NE(text.str().find(settings), std::string::npos)
      << "docs/options.md does not hold the settings table; put this table in it:\n"
      << settings;
}

// NOTE [Settings]: a setting's variable is read by its row's rules, and what it does not take
// is a ConfigError naming the variable and what it takes.
class Settings : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const char* name : {"SGPU_SIM_MEMORY", "SGPU_SIM_SHM_SLOT_BYTES",
                             "SGPU_CUDA_MEMORY_FRACTION", "SGPU_PLATFORM_PATH"}) {
      ::unsetenv(name);
    }
  }
  static std::string refusal(const char* env) {
    try {
      (void)sgpu::contract::setting_value(env);
    } catch (const sgpu::ConfigError& e) {
      return e.what();
    }
    return "(taken)";
  }
};

TEST_F(Settings, AnOnOrOffSettingTakesTheTablesWords) {
  using sgpu::contract::setting_flag;
  EXPECT_TRUE(setting_flag("SGPU_SIM_MEMORY", true));  // unset
  for (const char* off : {"off", "0", "false", "no"}) {
    ::setenv("SGPU_SIM_MEMORY", off, 1);
    EXPECT_FALSE(setting_flag("SGPU_SIM_MEMORY", true)) << off;
  }
  for (const char* on : {"on", "1", "true", "yes"}) {
    ::setenv("SGPU_SIM_MEMORY", on, 1);
    EXPECT_TRUE(setting_flag("SGPU_SIM_MEMORY", false)) << on;
  }
  ::setenv("SGPU_SIM_MEMORY", "maybe", 1);
  EXPECT_EQ(refusal("SGPU_SIM_MEMORY"),
            "SGPU_SIM_MEMORY=maybe is neither on nor off: \"off\" (or 0, false, no) or \"on\" "
            "(or 1, true, yes)");
}

TEST_F(Settings, ANumberIsTakenWithinItsRowsBounds) {
  using sgpu::contract::setting_value;
  ::setenv("SGPU_SIM_SHM_SLOT_BYTES", "4096", 1);
  EXPECT_EQ(std::get<long long>(*setting_value("SGPU_SIM_SHM_SLOT_BYTES")), 4096);
  for (const char* bad : {"12", "4294967297", "4k", "-64"}) {
    ::setenv("SGPU_SIM_SHM_SLOT_BYTES", bad, 1);
    EXPECT_EQ(refusal("SGPU_SIM_SHM_SLOT_BYTES"),
              std::string("SGPU_SIM_SHM_SLOT_BYTES=") + bad +
                  " is not a whole number from 64 to 4294967296");
  }
  ::setenv("SGPU_CUDA_MEMORY_FRACTION", "0.5", 1);
  EXPECT_EQ(std::get<double>(*setting_value("SGPU_CUDA_MEMORY_FRACTION")), 0.5);
  for (const char* bad : {"0", "1.5", "half", "nan"}) {
    ::setenv("SGPU_CUDA_MEMORY_FRACTION", bad, 1);
    EXPECT_EQ(refusal("SGPU_CUDA_MEMORY_FRACTION"), std::string("SGPU_CUDA_MEMORY_FRACTION=") +
                                                        bad +
                                                        " is not a fraction above 0 and at most 1");
  }
}

TEST_F(Settings, TextIsEmptyWhereUnset) {
  EXPECT_EQ(sgpu::contract::setting_text("SGPU_PLATFORM_PATH"), "");
  ::setenv("SGPU_PLATFORM_PATH", "/a:/b", 1);
  EXPECT_EQ(sgpu::contract::setting_text("SGPU_PLATFORM_PATH"), "/a:/b");
}

}  // namespace
