// The sgpu command:
//   sgpu info                               backends, GPUs, versions
//   sgpu run [options] -- PROGRAM ARGS...   PROGRAM on N ranks, as torchrun would start it
//   sgpu sim [--node SPEC] -- COMMAND ARGS  COMMAND and what it starts on a simulated node
//   sgpu bench collectives [options]        collective throughput (bench_collectives)
//   sgpu tracking sync [--log-dir D]        send runs left pending when a store was down
//   sgpu model list|predict|validate|fit    the collective model's platforms (model_command.h)
//
// Exit status of `sgpu run`: 0 when every rank succeeded; else the root-cause rank's exit
// code, or 128+signal when a signal killed it; 124 on timeout or hang; 3 for an accelerator
// mismatch; 2 for bad flags or options. Interrupted (Ctrl-C, SIGTERM), it tears the ranks
// down and dies of the signal.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend_table.h"
#include "cli/local_nodes.h"
#include "cli/model_command.h"
#include "cli/run_flags.h"
#include "cli/sim_command.h"
#include "contract/option_table.h"
#include "nodes/node_link.h"
#include "nodes/nodes.h"
#include "sgpu/config.h"
#include "sgpu/sgpu.h"
#include "tracking/pending.h"

namespace {

constexpr int kUsageError = 2;
constexpr int kMismatch = 3;
constexpr int kTimedOut = 124;

int info() {
  std::cout << "sgpu " << SGPU_VERSION << ", libtorch " << SGPU_TORCH_VERSION;
  if (SGPU_WITH_CUDA) {
    std::cout << ", built with CUDA " << SGPU_CUDA_VERSION << " and NCCL " << SGPU_NCCL_VERSION;
  } else {
    std::cout << ", built without CUDA";
  }
  std::cout << "\n";
  // The engine this process runs under, and the place `sgpu run` would take.
  try {
    const sgpu::nodes::NodePlan plan = sgpu::nodes::plan_nodes(sgpu::cli::command_options());
    std::cout << "nodes: " << (plan.engine.empty() ? "no engine detected" : plan.engine);
    std::cout << "; sgpu run would be " << plan.describe() << "\n";
  } catch (const sgpu::ConfigError& e) {
    std::cout << "nodes: " << e.what() << "\n";
  }
  sgpu::Options options = sgpu::cli::command_options();
  try {
    options = sgpu::contract::with_environment(options);  // SGPU_SIM, say
  } catch (const sgpu::ConfigError& e) {
    std::cout << "options: " << e.what() << "\n";
  }
  for (const auto& entry : sgpu::backend::backend_table()) {
    const auto inventory = sgpu::backend::find_backend(entry.name).inventory(options);
    std::cout << "backend " << entry.name << ": " << inventory.summary();
    if (inventory.gpus.empty()) std::cout << " (" << inventory.unavailable_reason << ")";
    if (!inventory.node.empty()) std::cout << " [" << inventory.node << "]";
    std::cout << "\n";
    for (const auto& gpu : inventory.gpus) {
      std::cout << "  " << gpu.index << ": " << gpu.type << "  " << gpu.name << "  "
                << (gpu.memory_bytes >> 30) << " GiB\n";
    }
  }
  return 0;
}

int run(sgpu::Options options, const std::vector<std::string>& command) {
  try {
    const std::shared_ptr<sgpu::detail::Call> call = sgpu::detail::start_program(options, command);
    call->wait();
    call->results_taken();  // a success: the run folder goes, unless --keep-run-dir
    return 0;
  } catch (const sgpu::TimeoutError& e) {
    std::cerr << e.what() << std::endl;
    return kTimedOut;
  } catch (const sgpu::HangError& e) {
    std::cerr << e.what() << std::endl;
    return kTimedOut;
  } catch (const sgpu::DistributedError& e) {
    std::cerr << e.what() << std::endl;
    const sgpu::RankFailure* root = e.root_cause();
    if (root == nullptr) return 1;
    if (root->signal) return 128 + *root->signal;
    return root->exit_code && *root->exit_code != 0 ? *root->exit_code : 1;
  } catch (const sgpu::AcceleratorMismatchError& e) {
    std::cerr << "sgpu run: " << e.what() << std::endl;
    return kMismatch;
  } catch (const sgpu::ConfigError& e) {
    std::cerr << "sgpu run: " << e.what() << std::endl;
    return kUsageError;
  } catch (const sgpu::TrackingError& e) {  // a tracking URI or experiment that cannot work
    std::cerr << "sgpu run: " << e.what() << std::endl;
    return kUsageError;
  } catch (const sgpu::Error& e) {  // a run folder that cannot be staged, a node unreachable
    std::cerr << "sgpu run: " << e.what() << std::endl;
    return 1;
  }
}

// Replaces this process with bench_collectives (next to this binary, or
// SGPU_BENCH_COLLECTIVES), which launches its ranks through sgpu itself.
int bench_collectives(const std::vector<std::string>& args) {
  const std::string named = sgpu::contract::setting_text("SGPU_BENCH_COLLECTIVES");
  const std::string program =
      !named.empty()
          ? named
          : (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "bench_collectives")
                .string();
  std::vector<char*> argv{const_cast<char*>(program.c_str())};
  for (const auto& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  ::execv(program.c_str(), argv.data());
  std::cerr << "sgpu bench collectives: cannot run " << program << ": " << std::strerror(errno)
            << " (build it with `ninja -C build bench_collectives`, or set "
               "SGPU_BENCH_COLLECTIVES to its path)\n";
  return 127;
}

// `sgpu tracking sync`: 0 when nothing is left pending.
int sync_tracking(const std::filesystem::path& runs_dir) {
  if (!std::filesystem::is_directory(runs_dir)) {
    std::cout << "sgpu tracking sync: no runs folder at " << runs_dir.string()
              << "; nothing is pending" << std::endl;
    return 0;
  }
  int pending = 0, sent = 0;
  for (const auto& synced : sgpu::tracking::sync_pending_runs(runs_dir)) {
    std::cout << "sgpu: tracking: " << sgpu::tracking::describe(synced) << std::endl;
    (synced.done ? sent : pending) += 1;
  }
  std::cout << "sgpu tracking sync: " << sent << " run(s) sent, " << pending << " still pending in "
            << runs_dir.string() << std::endl;
  return pending == 0 ? 0 : 1;
}

// A flag of `sgpu run` it does not know, before the program's "--", as the error to give:
// CLI11 would take it, and what follows it, for the program's arguments and say
// "arguments not expected". Empty when every flag is known.
std::string unknown_run_flag(const CLI::App& run, int argc, char** argv) {
  int at = 1;
  while (at < argc && std::string_view(argv[at]) != "run") ++at;
  for (++at; at < argc; ++at) {
    const std::string_view arg = argv[at];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    const std::string name(arg.substr(0, arg.find('=')));
    if (name == "-h" || name == "--help") continue;
    if (const CLI::Option* known = run.get_option_no_throw(name)) {
      // Its value is the next argument, whatever it looks like ("--node-rank -1").
      if (arg.find('=') == std::string_view::npos && known->get_items_expected_min() > 0) ++at;
      continue;
    }
    std::string near;
    for (const CLI::Option* option : run.get_options()) {
      for (const std::string& known : option->get_lnames()) {
        const std::string flag = "--" + known;
        const bool alike = flag.rfind(name, 0) == 0 || name.rfind(flag, 0) == 0;
        if (alike && (near.empty() || flag.size() < near.size())) near = flag;  // the closest
      }
    }
    return "unknown flag " + name + (near.empty() ? "" : " (did you mean " + near + "?)") +
           "; the program and its arguments go after --, as in: sgpu run --gpus 2 -- python "
           "train.py (sgpu run --help lists the flags)";
  }
  return {};
}

// `sgpu bench collectives`'s flags, as given.
struct BenchFlags {
  CLI::App* collectives = nullptr;
  int gpus = 0;
  std::string gpu_type, backend, timeout;
};

void add_bench_command(CLI::App& app, BenchFlags& f) {
  CLI::App* bench_cmd = app.add_subcommand("bench", "Run sgpu's benchmarks");
  bench_cmd->require_subcommand(1);
  CLI::App* collectives_cmd = f.collectives = bench_cmd->add_subcommand(
      "collectives",
      "Collective throughput (nccl-tests' algbw, busbw) through sgpu against plain libtorch");
  collectives_cmd->footer(
      "Other flags go to bench_collectives: --min-bytes, --max-bytes, --ops, --dtypes,\n"
      "--warmup, --iters, --no-floor, --table FILE and Google Benchmark's --benchmark_*\n"
      "(see bench_collectives --help). Exit status: 0; 1 when a result was wrong or a sweep\n"
      "failed; 2 for bad flags.\n"
      "Examples:\n"
      "  sgpu bench collectives --gpus 8 --gpu-type H100\n"
      "  sgpu bench collectives --gpus 4 --backend sim --ops allreduce,allgather --max-bytes 16M\n"
      "  sgpu bench collectives --benchmark_repetitions=5 --benchmark_out=run.json "
      "--benchmark_out_format=json");
  collectives_cmd->allow_extras();
  collectives_cmd->add_option("--gpus", f.gpus, "Ranks (default: every GPU of the node)");
  collectives_cmd->add_option("--gpu-type", f.gpu_type, "GPU type the node must have");
  collectives_cmd->add_option("--backend", f.backend, "auto, cuda or sim");
  collectives_cmd->add_option("--timeout", f.timeout, "Seconds per sweep, or none");
}

int run_bench(const BenchFlags& f) {
  std::vector<std::string> args;
  if (f.gpus != 0) args.insert(args.end(), {"--gpus", std::to_string(f.gpus)});
  if (!f.gpu_type.empty()) args.insert(args.end(), {"--gpu-type", f.gpu_type});
  if (!f.backend.empty()) args.insert(args.end(), {"--backend", f.backend});
  if (!f.timeout.empty()) args.insert(args.end(), {"--timeout", f.timeout});
  for (const auto& extra : f.collectives->remaining()) args.push_back(extra);
  return bench_collectives(args);
}

void add_tracking_command(CLI::App& app, std::string& sync_dir) {
  CLI::App* tracking_cmd = app.add_subcommand("tracking", "MLflow runs of earlier calls");
  tracking_cmd->require_subcommand(1);
  CLI::App* sync_cmd = tracking_cmd->add_subcommand(
      "sync", "Send the runs whose calls ended while their tracking store was unreachable");
  sync_cmd->footer(
      "A call that cannot reach its store when it ends keeps what its ranks could not send\n"
      "in its run folder, with tracking-pending.json. This sends it, ends the run with the\n"
      "status and time the call reached, and removes what it sent (the run folder too when\n"
      "it was kept only for that). Exit status: 0 when nothing is pending any more; 1 when\n"
      "a store is still unreachable.\n"
      "Example:\n"
      "  sgpu tracking sync --log-dir /tmp/sgpu-0/runs");
  sync_cmd->add_option(
      "--log-dir", sync_dir,
      "Runs folder to look in (default: SGPU_RUNS_DIR, else $TMPDIR/sgpu-UID/runs)");
}

}  // namespace

int main(int argc, char** argv) {
  sgpu::init(argc, argv);
  // A node of a launch that loses node 0's store says so in its own words.
  sgpu::nodes::quiet_store_warnings();
  CLI::App app{"sgpu: run one program or function on every GPU of a node, real or simulated"};
  app.require_subcommand(1);
  app.footer(
      "Examples:\n"
      "  sgpu info\n"
      "  sgpu run --gpus 8 --gpu-type H100 -- python train.py --epochs 3\n"
      "  sgpu run --gpus 4 --backend sim --timeout 600 -- ./my_benchmark\n"
      "  sgpu sim --node 8xH100 -- pytest tests/\n"
      "  sgpu bench collectives --gpus 8 --ops allreduce --max-bytes 1G\n"
      "  sgpu model validate h100-nvswitch");
  app.add_subcommand("info", "Show the backends built in, the GPUs they see, and versions");
  sgpu::cli::RunFlags run_flags;
  sgpu::cli::add_run_command(app, run_flags);
  BenchFlags bench_flags;
  add_bench_command(app, bench_flags);
  std::string sync_dir;
  add_tracking_command(app, sync_dir);
  const auto run_model = sgpu::cli::add_model_command(app);
  const auto run_sim = sgpu::cli::add_sim_command(app);

  if (const std::string unknown = unknown_run_flag(*run_flags.command_line, argc, argv);
      !unknown.empty()) {
    std::cerr << "sgpu run: " << unknown << "\n";
    return kUsageError;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << "sgpu: " << e.what() << "\n\n" << app.help("", CLI::AppFormatMode::Normal);
    return kUsageError;
  }
  if (app.got_subcommand("info")) return info();
  if (app.got_subcommand("model")) return run_model();
  if (app.got_subcommand("sim")) return run_sim();
  if (app.got_subcommand("tracking")) {
    sgpu::Options where = sgpu::cli::command_options();
    where.runs_dir = sync_dir;
    return sync_tracking(sgpu::runs_dir_of(where));
  }
  if (app.got_subcommand("bench")) return run_bench(bench_flags);
  const std::optional<sgpu::Options> options = sgpu::cli::options_of(run_flags);
  if (!options) return kUsageError;
  try {
    if (sgpu::cli::every_node_here(sgpu::contract::with_environment(*options))) {
      return sgpu::cli::run_every_node(*options, argc, argv, [&](const sgpu::Options& node) {
        return run(node, run_flags.command);
      });
    }
  } catch (const sgpu::ConfigError& e) {  // an environment's override that is no value
    std::cerr << "sgpu run: " << e.what() << std::endl;
    return kUsageError;
  } catch (const sgpu::Error& e) {  // no port, a node that could not start
    std::cerr << "sgpu run: " << e.what() << std::endl;
    return 1;
  }
  return run(*options, run_flags.command);
}
