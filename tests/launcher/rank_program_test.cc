// The three kinds of rank (launcher/rank_program.h), with no process: what each starts as,
// what it stages, what its exit means, where its error record is, whether its stacks may
// be taken and how its run is named.
#include "launcher/rank_program.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "contract/stack_dump.h"
#include "serialize/record.h"
#include "sgpu/errors.h"
#include "testing/temp_dir.h"

namespace {

using sgpu::launcher::ExitStatus;
using sgpu::launcher::function_ranks;
using sgpu::launcher::program_ranks;
using sgpu::launcher::RankProgram;
using sgpu::launcher::RankSlot;
using sgpu::launcher::worker_ranks;

class RankProgramTest : public ::testing::Test {
 protected:
  RankProgramTest() : dir_(sgpu::testing::make_temp_dir("rank-program-test")) {
    slot_.rank = 3;
    slot_.pid = ::getpid();
    slot_.folder = sgpu::contract::RunFolder{dir_}.rank(3);
    std::filesystem::create_directory(slot_.folder.dir);
  }
  ~RankProgramTest() override { std::filesystem::remove_all(dir_); }

  const RankSlot& exited(int code) {
    slot_.exit = ExitStatus{code, std::nullopt};
    return slot_;
  }
  static void write(const std::filesystem::path& file, const std::string& text) {
    std::ofstream(file) << text;
  }

  std::filesystem::path dir_;
  RankSlot slot_;
};

sgpu::launcher::WorkerCall worker() {
  sgpu::launcher::WorkerCall call;
  call.command = {"/usr/bin/python3", "-m", "sgpu._worker"};
  call.function_name = "__main__.train";
  return call;
}

TEST_F(RankProgramTest, AFunctionsRankSucceedsOnlyWithItsResultWritten) {
  const auto ranks = function_ranks({});
  EXPECT_STREQ(ranks->role(), "rank");
  EXPECT_FALSE(ranks->exited_ok(exited(0)));
  write(slot_.folder.result(), "r");
  EXPECT_TRUE(ranks->exited_ok(exited(0)));
  EXPECT_FALSE(ranks->exited_ok(exited(1)));
  EXPECT_TRUE(ranks->returns_results());
  EXPECT_EQ(ranks->spawn().program, "/proc/self/exe");
  const auto target = ranks->stack_target(slot_);
  ASSERT_TRUE(target.has_value());
  EXPECT_EQ(target->pid, slot_.pid);
  EXPECT_FALSE(target->python);
}

TEST_F(RankProgramTest, AFunctionsRanksRefuseShapeOnlyCompute) {
  const auto ranks = function_ranks({});
  EXPECT_NO_THROW(ranks->check(false, sgpu::FrontEnd::kCpp));
  try {
    ranks->check(true, sgpu::FrontEnd::kCpp);
    FAIL() << "shapes were accepted";
  } catch (const sgpu::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("sim.compute=\"shapes\" is for Python code"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(RankProgramTest, AFunctionWithNoNameIsCalledByItsTypeAndItsRunByTheBinary) {
  sgpu::serialize::CallRecord record;
  record.signature = "FifE";
  sgpu::tracking::CallRunRequest request;
  function_ranks(record)->name_run(request);
  EXPECT_EQ(request.function_name, "a function of type int (float)");
  EXPECT_EQ(request.run_name, "rank_program_test");
  EXPECT_EQ(function_ranks(record)->label(), "the distributed function");
}

TEST_F(RankProgramTest, AProgramsRankSucceedsOnExitZeroAndReturnsNothing) {
  const auto ranks = program_ranks({"python", "train.py", "--lr", "1"});
  EXPECT_STREQ(ranks->role(), "program");
  EXPECT_TRUE(ranks->exited_ok(exited(0)));
  EXPECT_FALSE(ranks->exited_ok(exited(2)));
  EXPECT_FALSE(ranks->returns_results());
  EXPECT_FALSE(ranks->always_prints_figures());
  EXPECT_FALSE(ranks->forks());
  EXPECT_EQ(ranks->label(), "python");
  sgpu::tracking::CallRunRequest request;
  ranks->name_run(request);
  EXPECT_TRUE(request.program);
  EXPECT_EQ(request.function_name, "python train.py --lr 1");
  EXPECT_EQ(request.run_name, "train.py");
}

TEST_F(RankProgramTest, AProgramsErrorIsWhatTorchElasticsRecordWroteWhenSgpuWroteNone) {
  const auto ranks = program_ranks({"python", "train.py"});
  RankProgram::Variables vars;
  ranks->add_environment(slot_, vars);
  ASSERT_EQ(vars.size(), 1u);
  EXPECT_EQ(vars[0].first, "TORCHELASTIC_ERROR_FILE");
  EXPECT_EQ(vars[0].second, slot_.folder.torchelastic_error().string());
  EXPECT_FALSE(ranks->error_record(slot_).has_value());
  write(slot_.folder.torchelastic_error(),
        R"({"message": {"message": "ValueError: boom", "extraInfo": {"timestamp": "0"}}})");
  const auto record = ranks->error_record(slot_);
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->type, "ValueError");
  EXPECT_EQ(record->message, "boom");
  EXPECT_FALSE(function_ranks({})->error_record(slot_).has_value());  // a function's: sgpu's only
}

TEST_F(RankProgramTest, AProgramsStacksAreTakenOnlyFromAProgramThatArmedItsDumps) {
  const auto ranks = program_ranks({"python", "train.py"});
  EXPECT_FALSE(ranks->stack_target(slot_).has_value());
  // Armed, but not the supervisor's child: no longer that rank's program.
  std::filesystem::create_directories(
      sgpu::contract::program_pid_file(slot_.folder.dir).parent_path());
  write(sgpu::contract::program_pid_file(slot_.folder.dir), std::to_string(::getpid()));
  slot_.pid = 1;
  EXPECT_FALSE(ranks->stack_target(slot_).has_value());
  slot_.pid = ::getppid();  // this test is that pid's child
  const auto target = ranks->stack_target(slot_);
  ASSERT_TRUE(target.has_value());
  EXPECT_EQ(target->pid, ::getpid());
  EXPECT_TRUE(target->python);
}

TEST_F(RankProgramTest, AWorkerStagesItsPayloadAndStartsAsItsOwnProgram) {
  const std::string payload(1000, 'p');
  const auto ranks = worker_ranks(worker(), payload);
  EXPECT_STREQ(ranks->role(), "worker");
  EXPECT_EQ(ranks->payload_bytes(), payload.size());
  EXPECT_FALSE(ranks->forks());  // no fork server of its own
  ranks->stage(sgpu::contract::RunFolder{dir_}, 1 << 20);
  EXPECT_EQ(sgpu::serialize::read_record_file(sgpu::contract::RunFolder{dir_}.call(),
                                              sgpu::serialize::RecordKind::kWorkerCall, 1 << 20),
            payload);
  EXPECT_EQ(ranks->spawn().program, "/usr/bin/python3");
  EXPECT_EQ(ranks->spawn().argv.front(), "/usr/bin/python3");
  EXPECT_FALSE(ranks->exited_ok(exited(0)));  // no result
  const auto target = ranks->stack_target(slot_);
  ASSERT_TRUE(target.has_value());
  EXPECT_TRUE(target->python);
  sgpu::tracking::CallRunRequest request;
  ranks->name_run(request);
  EXPECT_EQ(request.function_name, "__main__.train");
  EXPECT_EQ(request.run_name, "__main__.train");
}

}  // namespace
