// The contracts modules share: the rank environment round-trips through the variables
// the launcher sets (and Python's copy of their names is theirs), files are replaced whole, and the
// run folder's names are the ones every module uses.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <system_error>
#include <thread>

#include "contract/abrupt_end.h"
#include "contract/atomic_file.h"
#include "contract/node_memory.h"
#include "contract/rank_env.h"
#include "contract/run_folder.h"
#include "contract/stack_dump.h"
#include "testing/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using sgpu::contract::RankEnvironment;

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

RC_GTEST_PROP(RankEnvironment, WhatTheLauncherSetsIsWhatTheRankReads, ()) {
  RankEnvironment written;
  written.world_size = *rc::gen::inRange(1, 1025);
  written.rank = *rc::gen::inRange(0, written.world_size);
  written.local_world_size = *rc::gen::inRange(1, 9);
  written.local_rank = written.rank % written.local_world_size;
  written.node_rank = written.rank / written.local_world_size;
  written.master_addr = *rc::gen::element<std::string>("127.0.0.1", "::1", "node-0");
  written.master_port = *rc::gen::inRange(1, 65536);
  written.role = *rc::gen::element<std::string>("rank", "program");
  written.call_file = "/runs/" + std::to_string(*rc::gen::inRange(0, 1000)) + "/call.bin";
  written.rank_dir = "/runs/x/rank-" + std::to_string(written.rank);
  written.device_index = *rc::gen::inRange(0, 8);
  written.backend = *rc::gen::element<std::string>("sim", "cuda");
  written.parent_pid = *rc::gen::inRange(1, 1 << 22);
  written.lifeline_fd = *rc::gen::inRange(3, 10);
  written.group_timeout = std::chrono::milliseconds(*rc::gen::inRange(1, 1 << 30));
  written.recorder_entries = *rc::gen::inRange(0, 1 << 20);
  const auto variables = written.variables();
  for (const auto& [name, value] : variables) ::setenv(name.c_str(), value.c_str(), 1);
  const RankEnvironment read = sgpu::contract::read_rank_environment();
  for (const auto& [name, value] : variables) ::unsetenv(name.c_str());
  RC_ASSERT(read.variables() == variables);
  RC_ASSERT(read.group_timeout == written.group_timeout);
  RC_ASSERT(read.recorder_entries == written.recorder_entries);
  RC_ASSERT(read.rank_dir == written.rank_dir);
}

TEST(RankEnvironment, TorchrunsNamesCarryTheRanksPlace) {
  RankEnvironment env;
  env.rank = 5;
  env.local_rank = 1;
  env.world_size = 8;
  env.local_world_size = 4;
  env.node_rank = 1;
  std::map<std::string, std::string> vars;
  for (const auto& [name, value] : env.variables()) vars[name] = value;
  EXPECT_EQ(vars["RANK"], "5");
  EXPECT_EQ(vars["LOCAL_RANK"], "1");
  EXPECT_EQ(vars["ROLE_RANK"], "5");
  EXPECT_EQ(vars["GROUP_RANK"], "1");
  EXPECT_EQ(vars["NODE_RANK"], "1");
  EXPECT_EQ(vars["WORLD_SIZE"], "8");
  EXPECT_EQ(vars["LOCAL_WORLD_SIZE"], "4");
}

TEST(RankEnvironment, UnsetVariablesKeepTheDefaults) {
  for (const auto& [name, value] : RankEnvironment{}.variables()) ::unsetenv(name.c_str());
  const RankEnvironment read = sgpu::contract::read_rank_environment();
  EXPECT_EQ(read.rank, 0);
  EXPECT_EQ(read.world_size, 1);
  EXPECT_EQ(read.group_timeout, std::chrono::minutes(30));
  EXPECT_TRUE(read.rank_dir.empty());
}

// Python that may not load the native module reads the rank's variables and roles by the
// names this file gives, and they are the launcher's.
TEST(RankEnvironment, PythonsNamesAreTheContracts) {
  const std::string names = sgpu::contract::python_rank_names();
  EXPECT_EQ(read(fs::path(SGPU_TEST_SOURCE_DIR) / "python" / "_sgpu_rank_env.py"), names)
      << "python/_sgpu_rank_env.py is not what the contract says; put this text in it:\n"
      << names;
  EXPECT_NE(names.find("ROLE = \"SGPU_ROLE\"\n"), std::string::npos);
  EXPECT_NE(names.find("WORKER_ROLE = \"worker\"\n"), std::string::npos);
  EXPECT_NE(names.find("SIM_BACKEND = \"sim\"\n"), std::string::npos);
  EXPECT_NE(names.find("BACKEND_SETTING = \"SGPU_BACKEND\"\n"), std::string::npos);
}

TEST(AtomicFile, ReplacesTheContentWholeAndLeavesNothingBeside) {
  const fs::path dir = sgpu::testing::make_temp_dir("sgpu-contract");
  const fs::path path = dir / "result.bin";
  for (auto durability :
       {sgpu::contract::Durability::kAtomic, sgpu::contract::Durability::kSynced}) {
    sgpu::contract::write_file_atomically(path, "first", {.durability = durability});
    std::string seen_before_rename;
    sgpu::contract::write_file_atomically(
        path, std::string(100000, 'x'),
        {.durability = durability, .mode = 0600, .before_rename = [&] {
           seen_before_rename = read(path);
         }});
    EXPECT_EQ(seen_before_rename, "first");  // readers see the old content until the rename
    EXPECT_EQ(read(path), std::string(100000, 'x'));
    EXPECT_EQ(names_in(dir), std::vector<std::string>{"result.bin"});
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }
  fs::remove_all(dir);
}

TEST(AtomicFile, AFailureNamesThePathAndLeavesNothing) {
  const fs::path dir = sgpu::testing::make_temp_dir("sgpu-contract");
  try {
    sgpu::contract::write_file_atomically(dir / "missing" / "x.json", "{}");
    FAIL() << "a write into a missing folder succeeded";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "missing").string()), std::string::npos)
        << e.what();
  }
  fs::create_directory(dir / "sub");
  // A rename onto a folder fails after the content was written: the sibling goes too.
  EXPECT_THROW(sgpu::contract::write_file_atomically(dir / "sub", "text"), std::system_error);
  EXPECT_EQ(names_in(dir), std::vector<std::string>{"sub"});
  EXPECT_TRUE(fs::is_empty(dir / "sub"));
  fs::remove_all(dir);
}

TEST(AbruptEnd, TheFirstNoteIsReadBackAtTheTimeItWasWritten) {
  const fs::path dir = sgpu::testing::make_temp_dir("sgpu-contract");
  const fs::path file = sgpu::contract::RankFolder{dir}.abrupt_end();
  EXPECT_FALSE(sgpu::contract::read_abrupt_end(file));
  sgpu::contract::note_abrupt_end();  // unarmed: nothing written
  EXPECT_TRUE(fs::is_empty(dir));
  sgpu::contract::arm_abrupt_end(file);
  const auto before = std::chrono::system_clock::now();
  sgpu::contract::note_abrupt_end();
  const auto after = std::chrono::system_clock::now();
  const auto noted = sgpu::contract::read_abrupt_end(file);
  ASSERT_TRUE(noted);
  EXPECT_LE(before, *noted);
  EXPECT_LE(*noted, after);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  sgpu::contract::note_abrupt_end();  // a second note (a crash handler after a fault)
  EXPECT_EQ(sgpu::contract::read_abrupt_end(file), noted) << "the first note wins";
  sgpu::contract::arm_abrupt_end("");
  fs::remove_all(dir);
}

TEST(RunFolder, NamesAreTheDocumentedLayout) {
  const sgpu::contract::RunFolder run{"/runs/abc"};
  EXPECT_EQ(run.call(), "/runs/abc/call.bin");
  EXPECT_EQ(run.tracking_pending(), "/runs/abc/tracking-pending.json");
  const auto rank = run.rank(3);
  EXPECT_EQ(rank.dir, "/runs/abc/rank-3");
  EXPECT_EQ(rank.result(), "/runs/abc/rank-3/result.bin");
  EXPECT_EQ(rank.error(), "/runs/abc/rank-3/error.json");
  EXPECT_EQ(rank.stdout_log(), "/runs/abc/rank-3/stdout.log");
  EXPECT_EQ(rank.stderr_log(), "/runs/abc/rank-3/stderr.log");
  EXPECT_EQ(rank.tracking_spool(), "/runs/abc/rank-3/tracking-spool.jsonl");
  EXPECT_EQ(rank.abrupt_end(), "/runs/abc/rank-3/abrupt-end");
  // NOTE [Stack dumps]: what the caller and a Python rank (through the native module) name.
  EXPECT_EQ(sgpu::contract::stacks_dir(rank.dir), "/runs/abc/rank-3/stacks");
  EXPECT_EQ(sgpu::contract::python_stacks_file(rank.dir), "/runs/abc/rank-3/stacks/python");
  EXPECT_EQ(sgpu::contract::program_pid_file(rank.dir), "/runs/abc/rank-3/stacks/program.pid");
  EXPECT_TRUE(sgpu::contract::RunFolder::is_rank_folder_name("rank-12"));
  EXPECT_FALSE(sgpu::contract::RunFolder::is_rank_folder_name("rank-"));
  EXPECT_FALSE(sgpu::contract::RunFolder::is_rank_folder_name("call.bin"));
}

}  // namespace

namespace sgpu::contract {
namespace {

// NOTE [A node's shared device memory]: one ledger, every process's holdings in it.
TEST(NodeMemory, ProcessesShareEachGpusCapacityAndAGoneOnesHoldingsComeBack) {
  ::unsetenv(kNodeMemoryVar);
  NodeMemory* ledger = NodeMemory::of_process(/*make=*/true);
  ASSERT_NE(ledger, nullptr);
  ASSERT_NE(std::getenv(kNodeMemoryVar), nullptr);   // named for what this process starts
  EXPECT_EQ(NodeMemory::of_process(false), ledger);  // one a process
  constexpr std::uint64_t kCapacity = 100;
  ASSERT_TRUE(ledger->take(3, 60, kCapacity));
  EXPECT_EQ(ledger->held(3), 60u);
  EXPECT_EQ(ledger->held(2), 0u);  // each GPU on its own

  // Another process on the node (a child that opens the ledger by its name) holds 30 of GPU 3
  // and ends without giving it back, as a process killed holding memory does.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    NodeMemory* own = NodeMemory::of_process(false);  // the parent's object, by fork
    const bool taken = own != nullptr && own->take(3, 30, kCapacity);
    const char byte = taken ? 'y' : 'n';
    (void)!::write(ready[1], &byte, 1);
    ::pause();  // until killed
    ::_exit(0);
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ASSERT_EQ(byte, 'y');
  EXPECT_EQ(ledger->held(3), 90u);
  const auto others = ledger->others(3);
  ASSERT_EQ(others.size(), 1u);
  EXPECT_EQ(others[0], std::make_pair(static_cast<long>(child), std::uint64_t{30}));
  EXPECT_FALSE(ledger->take(3, 20, kCapacity));  // 60 + 30 + 20 is past the capacity
  EXPECT_EQ(ledger->held(3), 90u);               // and nothing was taken

  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_TRUE(ledger->take(3, 20, kCapacity));  // the gone process's 30 came back
  EXPECT_EQ(ledger->held(3), 80u);
  ledger->give(3, 80);
  EXPECT_EQ(ledger->held(3), 0u);
  ::close(ready[0]);
  ::close(ready[1]);
}

}  // namespace
}  // namespace sgpu::contract
