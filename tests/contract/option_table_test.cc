// The option table (contract/option_table.h): each row sets its own member of
// sgpu::Options from what a front end gives, a value of another kind is a ConfigError that
// names the option, advice for the sgpu command spells the row's flag, and docs/options.md
// holds the table the rows make.
#include "contract/option_table.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "contract/front_end.h"
#include "sgpu/errors.h"

namespace {

using sgpu::contract::find_option;
using sgpu::contract::option_table;
using sgpu::contract::OptionValue;

sgpu::Options set(std::string_view name, const OptionValue& value) {
  sgpu::Options options;
  const auto* row = find_option(name);
  EXPECT_NE(row, nullptr) << name;
  if (row != nullptr) row->set(options, value);
  return options;
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
  EXPECT_FALSE(set("sim_cuda", false).sim_cuda);
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
}

TEST(OptionTable, AdviceForTheCommandSpellsTheRowsFlag) {
  sgpu::contract::set_front_end(sgpu::contract::FrontEnd::kCommand);
  EXPECT_EQ(sgpu::contract::spell("runs_dir"), "--log-dir");
  EXPECT_EQ(sgpu::contract::spell("console_ranks"), "--ranks");
  EXPECT_EQ(sgpu::contract::spell("backend", "sim"), "--backend sim");
  EXPECT_EQ(sgpu::contract::spell("recorder_entries"), "recorder_entries");  // no flag
  sgpu::contract::set_front_end(sgpu::contract::FrontEnd::kCpp);
}

TEST(OptionTable, TheManualsTableIsTheTables) {
  std::ifstream in(std::string(SGPU_TEST_SOURCE_DIR) + "/docs/options.md");
  std::stringstream text;
  text << in.rdbuf();
  const std::string table = sgpu::contract::options_markdown();
  EXPECT_NE(text.str().find(table), std::string::npos)
      << "docs/options.md does not hold the option table; put this table in it:\n"
      << table;
}

}  // namespace
