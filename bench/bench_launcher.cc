// Launch-to-results of a trivial function on 1, 2, 4 and 8 simulated ranks, started by
// the warm fork server and by exec, against
//   floor:    plain fork+exec+wait of N trivial processes (/bin/true), the least any
//             launcher can cost;
//   mpirun:   OpenMPI's `mpirun -np N /bin/true`;
//   torchrun: `torchrun --nproc-per-node N` on a script that does nothing.
// and, to show where the time goes, exec+wait of N copies of this binary that exit at
// once (the cost of loading libtorch, which every exec'd rank pays).
// All run in the same process; each result carries `x_floor`, its time over the floor's
// time for the same N (the floor runs first).
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "bench_options.h"
#include "sgpu/sgpu.h"

extern char** environ;

namespace {

std::map<int, double> floor_seconds;  // per rank count

int trivial(int x) { return x + sgpu::global_rank(); }

// Starts every command, then waits for all; returns false when one failed to run.
bool run_all(const std::vector<std::vector<std::string>>& commands) {
  std::vector<pid_t> pids;
  for (const auto& command : commands) {
    std::vector<char*> argv;
    for (const auto& arg : command) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid = 0;
    const int rc = ::posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) return false;
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

void report_ratio(benchmark::State& state, int ranks, double seconds_per_launch) {
  if (auto it = floor_seconds.find(ranks); it != floor_seconds.end() && it->second > 0) {
    state.counters["x_floor"] = seconds_per_launch / it->second;
  }
}

template <class Launch>
void time_launches(benchmark::State& state, Launch launch) {
  const int ranks = static_cast<int>(state.range(0));
  double total = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    if (!launch(ranks)) {
      state.SkipWithError("launch failed");
      return;
    }
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double per_launch = total / static_cast<double>(state.iterations());
  if (ranks > 0) report_ratio(state, ranks, per_launch);
  state.counters["ranks"] = ranks;
}

void BM_Floor_ForkExecWait(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0));
  double total = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    run_all(std::vector<std::vector<std::string>>(static_cast<std::size_t>(ranks), {"/bin/true"}));
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  floor_seconds[ranks] = total / static_cast<double>(state.iterations());
  state.counters["ranks"] = ranks;
}

void BM_ExecThisBinary(benchmark::State& state) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  time_launches(state, [&](int ranks) {
    std::vector<std::vector<std::string>> commands(static_cast<std::size_t>(ranks),
                                                   {"env", "SGPU_BENCH_EXIT_AT_ONCE=1", self});
    return run_all(commands);
  });
}

void time_sgpu(benchmark::State& state, sgpu::StartMethod method) {
  sgpu::Options options = sgpu::bench::options();
  options.backend = "sim";
  options.start_method = method;
  time_launches(state, [&](int ranks) {
    options.gpus = ranks;
    return sgpu::distributed(trivial, options).distributed(1).size() ==
           static_cast<std::size_t>(ranks);
  });
}

// The fork server is already warm: main() made the first call.
void BM_Sgpu_ForkServer(benchmark::State& state) {
  time_sgpu(state, sgpu::StartMethod::kForkServer);
}
void BM_Sgpu_Exec(benchmark::State& state) { time_sgpu(state, sgpu::StartMethod::kExec); }

void BM_Mpirun(benchmark::State& state) {
  time_launches(state, [](int ranks) {
    return run_all({{"mpirun", "--allow-run-as-root", "--oversubscribe", "-np",
                     std::to_string(ranks), "/bin/true"}});
  });
}

void BM_Torchrun(benchmark::State& state) {
  static const std::string script = [] {
    const auto path = std::filesystem::temp_directory_path() / "sgpu_bench_trivial.py";
    std::ofstream(path) << "pass\n";
    return path.string();
  }();
  const char* venv = std::getenv("SGPU_VENV");
  const std::string torchrun =
      std::string(venv != nullptr ? venv : "/opt/sgpu/venv") + "/bin/torchrun";
  if (!std::filesystem::exists(torchrun)) {
    state.SkipWithError(("torchrun not found at " + torchrun).c_str());
    return;
  }
  time_launches(state, [&](int ranks) {
    return run_all({{torchrun, "--standalone", "--nproc-per-node", std::to_string(ranks), script}});
  });
}

void rank_counts(benchmark::internal::Benchmark* b) {
  for (int n : {1, 2, 4, 8}) b->Arg(n);
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

// Registration order is run order: the floor first, so the others can divide by it.
BENCHMARK(BM_Floor_ForkExecWait)->Apply(rank_counts);
BENCHMARK(BM_ExecThisBinary)->Apply(rank_counts);
BENCHMARK(BM_Sgpu_ForkServer)->Apply(rank_counts);
BENCHMARK(BM_Sgpu_Exec)->Apply(rank_counts);
BENCHMARK(BM_Mpirun)->Apply(rank_counts);
BENCHMARK(BM_Torchrun)->Apply(rank_counts)->Iterations(2);

}  // namespace

int main(int argc, char** argv) {
  if (std::getenv("SGPU_BENCH_EXIT_AT_ONCE") != nullptr) return 0;
  sgpu::init(argc, argv);
  ::setenv("SGPU_BACKEND", "sim", 0);
  benchmark::Initialize(&argc, argv);
  {
    // The first call of a process starts the fork server: its cost, once.
    sgpu::Options options = sgpu::bench::options();
    options.backend = "sim";
    options.gpus = 8;
    const auto start = std::chrono::steady_clock::now();
    sgpu::distributed(trivial, options).distributed(1);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    benchmark::AddCustomContext("first_call_8_ranks_fork_server_ms", std::to_string(ms));
  }
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
