#include "launcher/rank_program.h"

#include <filesystem>
#include <fstream>

#include "contract/front_end.h"
#include "contract/rank_env.h"
#include "contract/stack_dump.h"
#include "launcher/fork_server.h"
#include "rank/program.h"
#include "rank/symbols.h"
#include "serialize/record.h"
#include "sgpu/errors.h"
#include "sgpu/internal/values.h"

namespace sgpu::launcher {

std::unique_ptr<RankStarter> RankProgram::starter(StartMethod method, bool /*serves_cuda*/) const {
  return make_starter(method);
}

bool RankProgram::exited_ok(const RankSlot& slot) const {
  return slot.exit->exit_code == 0 && std::filesystem::exists(slot.folder.result());
}

std::optional<serialize::ErrorRecord> RankProgram::error_record(const RankSlot& slot) const {
  return serialize::read_error_record(slot.folder.error());
}

namespace {

std::string function_label(const std::string& function_name) {
  return function_name.empty() ? "the distributed function" : function_name;
}

class FunctionRanks final : public RankProgram {
 public:
  explicit FunctionRanks(serialize::CallRecord record) : record_(std::move(record)) {}

  const char* role() const override { return contract::kRankRole; }

  void check(bool computes_shapes, FrontEnd front_end) const override {
    if (rank::program_args().empty()) {
      throw ConfigError(
          "sgpu::init(argc, argv) was not called: call it first thing in main(); every rank "
          "runs this binary again and starts there");
    }
    // Shapes without data are Python's, whose tensors can be fake ones: a C++ function's
    // ranks would compute on nothing and move nothing. A program's rank checks at its end
    // that the program ran in shapes (NOTE [A program's supervisor]).
    if (computes_shapes) {
      throw ConfigError(contract::Spelling(front_end)("sim_compute", "shapes") +
                        " is for Python code (the decorator's ranks, or a Python program under "
                        "sgpu run, whose tensors can be fake ones); a C++ function's ranks "
                        "compute on data: leave it \"values\"");
    }
  }

  std::size_t payload_bytes() const override { return record_.args.size(); }
  bool forks() const override { return true; }

  void stage(const contract::RunFolder& folder, std::size_t max_payload_bytes) override {
    record_.max_payload_bytes = max_payload_bytes;
    serialize::write_record_file(folder.call(), serialize::RecordKind::kCall,
                                 serialize::to_bytes(record_));
  }

  void name_run(tracking::CallRunRequest& request) const override {
    if (!record_.function_name.empty()) {
      request.function_name = record_.function_name;
      if (request.run_name.empty()) request.run_name = rank::plain_name(record_.function_name);
      return;
    }
    // A function the binary keeps no name for (a stripped static one): its type.
    request.function_name = "a function of type " + rank::demangle(record_.signature);
    if (request.run_name.empty() && !rank::program_args().empty()) {
      request.run_name =
          rank::program_run_name({rank::program_args().front()});  // the binary's name
    }
  }

  std::string label() const override { return function_label(record_.function_name); }

  SpawnRequest spawn() const override {
    SpawnRequest request;
    request.program = "/proc/self/exe";
    request.argv = rank::program_args();
    return request;
  }

  std::optional<StackTarget> stack_target(const RankSlot& slot) const override {
    return StackTarget{slot.rank, slot.pid, slot.folder.dir, false};
  }

 private:
  serialize::CallRecord record_;
};

class ProgramRanks final : public RankProgram {
 public:
  explicit ProgramRanks(std::vector<std::string> command) : command_(std::move(command)) {}

  const char* role() const override { return contract::kProgramRole; }
  bool forks() const override { return false; }
  void stage(const contract::RunFolder&, std::size_t) override {}

  void name_run(tracking::CallRunRequest& request) const override {
    request.program = true;
    for (const std::string& word : command_) {
      request.function_name += (request.function_name.empty() ? "" : " ") + word;
    }
    // `python train.py` is train.py.
    if (request.run_name.empty()) request.run_name = rank::program_run_name(command_);
  }

  std::string label() const override { return command_.front(); }

  // The rank starts as this binary in the program role, which arms the parent-death signal
  // and then becomes the program (rank/rank_main.h).
  SpawnRequest spawn() const override {
    SpawnRequest request;
    request.program = "/proc/self/exe";
    request.argv = command_;
    return request;
  }

  // Where a program's @record (torch.distributed.elastic) writes the rank's error.
  void add_environment(const RankSlot& slot, Variables& vars) const override {
    vars.emplace_back("TORCHELASTIC_ERROR_FILE", slot.folder.torchelastic_error().string());
  }

  bool exited_ok(const RankSlot& slot) const override { return slot.exit->exit_code == 0; }
  bool returns_results() const override { return false; }
  bool always_prints_figures() const override { return false; }

  std::optional<serialize::ErrorRecord> error_record(const RankSlot& slot) const override {
    if (auto record = RankProgram::error_record(slot)) return record;
    return serialize::read_torchelastic_error(slot.folder.torchelastic_error());
  }

  // Asked through its program, when that is a Python program that armed its dumps (import
  // sgpu): its supervisor only waits, and another program would die of the signal.
  std::optional<StackTarget> stack_target(const RankSlot& slot) const override {
    const pid_t program = armed_program(slot);
    if (program <= 0) return std::nullopt;
    return StackTarget{slot.rank, program, slot.folder.dir, true};
  }

 private:
  // The pid of the program `slot`'s supervisor runs, once it has armed its stack dumps and
  // while it is that supervisor's child; 0 otherwise.
  static pid_t armed_program(const RankSlot& slot) {
    std::ifstream in(contract::program_pid_file(slot.folder.dir));
    pid_t pid = 0;
    if (!(in >> pid) || pid <= 0) return 0;
    return live_parent(pid) == slot.pid ? pid : 0;
  }

  const std::vector<std::string> command_;
};

class WorkerRanks final : public RankProgram {
 public:
  WorkerRanks(const WorkerCall& call, std::string payload)
      : command_(call.command),
        function_name_(call.function_name),
        fork_server_(call.fork_server),
        server_imports_(call.server_imports),
        payload_(std::move(payload)) {}

  const char* role() const override { return contract::kWorkerRole; }
  std::size_t payload_bytes() const override { return payload_.size(); }
  bool forks() const override { return !fork_server_.empty(); }

  // Ranks that serve cuda on sim fork from a server that prepared it (its own server: the
  // command differs).
  std::unique_ptr<RankStarter> starter(StartMethod method, bool serves_cuda) const override {
    if (method != StartMethod::kForkServer) return make_starter(method);
    std::vector<std::string> command = fork_server_;
    if (serves_cuda) command.push_back("--cuda-on-sim");
    return make_fork_server_starter(command);
  }

  void stage(const contract::RunFolder& folder, std::size_t) override {
    serialize::write_record_file(folder.call(), serialize::RecordKind::kWorkerCall, payload_);
    std::string().swap(payload_);  // staged: the ranks read it from call.bin
  }

  void name_run(tracking::CallRunRequest& request) const override {
    request.function_name = function_name_;
    if (request.run_name.empty() && !function_name_.empty()) {
      request.run_name = rank::plain_name(function_name_);
    }
  }

  std::string label() const override { return function_label(function_name_); }

  // The worker program arms its parent-death signal itself.
  SpawnRequest spawn() const override {
    SpawnRequest request;
    request.program = command_.front();
    request.argv = command_;
    return request;
  }

  std::optional<StackTarget> stack_target(const RankSlot& slot) const override {
    return StackTarget{slot.rank, slot.pid, slot.folder.dir, true};
  }

  void add_environment(const RankSlot& /*slot*/, Variables& vars) const override {
    if (server_imports_.empty()) return;
    std::string modules;
    for (const std::string& module : server_imports_) {
      modules += (modules.empty() ? "" : ",") + module;
    }
    vars.emplace_back(kForkServerImportsVar, modules);
  }

 private:
  const std::vector<std::string> command_;
  const std::string function_name_;
  const std::vector<std::string> fork_server_;
  const std::vector<std::string> server_imports_;
  std::string payload_;
};

}  // namespace

std::unique_ptr<RankProgram> function_ranks(serialize::CallRecord record) {
  return std::make_unique<FunctionRanks>(std::move(record));
}

std::unique_ptr<RankProgram> program_ranks(std::vector<std::string> command) {
  return std::make_unique<ProgramRanks>(std::move(command));
}

std::unique_ptr<RankProgram> worker_ranks(const WorkerCall& call, std::string payload) {
  return std::make_unique<WorkerRanks>(call, std::move(payload));
}

}  // namespace sgpu::launcher
