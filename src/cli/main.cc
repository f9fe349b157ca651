// The sgpu command:
//   sgpu info                               backends, GPUs, versions
//   sgpu run [options] -- PROGRAM ARGS...   PROGRAM on N ranks, as torchrun would start it
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
#include "cli/model_command.h"
#include "contract/front_end.h"
#include "launcher/node_link.h"
#include "launcher/nodes.h"
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
    const sgpu::launcher::NodePlan plan = sgpu::launcher::plan_nodes(sgpu::Options{});
    std::cout << "nodes: " << (plan.engine.empty() ? "no engine detected" : plan.engine);
    std::cout << "; sgpu run would be " << plan.describe() << "\n";
  } catch (const sgpu::ConfigError& e) {
    std::cout << "nodes: " << e.what() << "\n";
  }
  for (const auto& entry : sgpu::backend::backend_table()) {
    const auto inventory = sgpu::backend::find_backend(entry.name).inventory(sgpu::Options{});
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

std::vector<int> parse_ranks(const std::string& text) {
  std::vector<int> ranks;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) ranks.push_back(std::stoi(part));
  return ranks;
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
  const char* env = std::getenv("SGPU_BENCH_COLLECTIVES");
  const std::string program =
      env != nullptr && *env != '\0'
          ? env
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

// `sgpu run`'s flags, as given.
struct RunFlags {
  CLI::App* command_line = nullptr;
  int gpus = 1;
  std::string gpu_type, backend = "auto", timeout = "10800", hang_timeout = "600", log_dir, ranks,
                        run_name, experiment, sim_compute;
  bool no_tracking = false, keep_run_dir = false;
  int nnodes = 0, node_rank = -1;
  std::string rdzv_endpoint, rdzv_id, rdzv_timeout = "600";
  std::vector<std::string> command;
};

void add_run_command(CLI::App& app, RunFlags& f) {
  CLI::App* run_cmd = f.command_line = app.add_subcommand(
      "run", "Start PROGRAM on N ranks with torchrun's environment (RANK, WORLD_SIZE, ...)");
  run_cmd->footer(
      "Exit status: 0 when every rank succeeded; the root-cause rank's exit code, or\n"
      "128+signal; 124 on timeout or hang; 3 when the node cannot serve the request; 2 for bad\n"
      "flags or options (a tracking URI that cannot work, say).\n"
      "Standard input: every rank reads /dev/null (not sgpu's own standard input); give a\n"
      "rank its input in a file or in its arguments.\n"
      "Example:\n"
      "  sgpu run --gpus 4 --backend sim --ranks 0 -- python -c 'import os; "
      "print(os.environ[\"RANK\"])'\n"
      "  srun -N2 --ntasks-per-node=1 sgpu run --gpus 8 -- python train.py   (two nodes)\n"
      "  sgpu run --nnodes 2 --node-rank 0 --rdzv-endpoint n1:29500 --gpus 8 -- python train.py\n"
      "  sgpu run --gpus 8 --backend sim --sim-compute shapes -- python "
      "examples/models/llama_step.py");
  run_cmd->add_option("--gpus", f.gpus, "Ranks to start, one per GPU")->capture_default_str();
  run_cmd->add_option("--gpu-type", f.gpu_type, "GPU type the node must have (detected if unset)");
  run_cmd->add_option("--backend", f.backend, "auto, cuda or sim (SGPU_BACKEND overrides)")
      ->capture_default_str();
  run_cmd->add_option("--timeout", f.timeout, "Seconds, or none")->capture_default_str();
  run_cmd
      ->add_option("--hang-timeout", f.hang_timeout,
                   "Seconds a collective may be in flight before the call is judged hung, or "
                   "none (SGPU_HANG_TIMEOUT overrides)")
      ->capture_default_str();
  run_cmd->add_option("--log-dir", f.log_dir, "Where run folders go");
  run_cmd->add_flag("--keep-run-dir", f.keep_run_dir,
                    "Keep the run folder (the ranks' logs) after a success too; a failure's "
                    "is always kept");
  run_cmd->add_option("--ranks", f.ranks, "Ranks whose output the console shows, e.g. 0,3");
  run_cmd->add_option("--run-name", f.run_name,
                      "Name of the launch in errors and of its MLflow run");
  run_cmd->add_option("--experiment", f.experiment,
                      "MLflow experiment of the launch's run (created if missing)");
  run_cmd->add_flag("--no-tracking", f.no_tracking, "Record no MLflow run (as SGPU_TRACKING=off)");
  run_cmd->add_option("--sim-compute", f.sim_compute,
                      "On sim: values, or shapes (a Python program's tensors carry shapes and no "
                      "data; default: SGPU_SIM_COMPUTE, else values)");
  run_cmd
      ->add_option("--nnodes", f.nnodes,
                   "Nodes in the launch, each running this same command (default: what torchrun's "
                   "PET_NNODES, a Slurm step or mpirun says, else 1)")
      ->check(CLI::PositiveNumber);
  run_cmd
      ->add_option("--node-rank", f.node_rank,
                   "This node's place, 0 to nnodes-1; node 0 hosts the store (default: detected)")
      ->check(CLI::NonNegativeNumber);
  run_cmd->add_option("--rdzv-endpoint", f.rdzv_endpoint,
                      "HOST[:PORT] of node 0's store, an address node 0 has and the others reach "
                      "(port 29500 if left out; default: MASTER_ADDR/MASTER_PORT or the engine's)");
  run_cmd->add_option("--rdzv-id", f.rdzv_id, "The launch's id, the same on every node");
  run_cmd->add_option("--rdzv-timeout", f.rdzv_timeout, "Seconds for every node to join the launch")
      ->capture_default_str();
  run_cmd->add_option("command", f.command, "PROGRAM ARGS... (after --)")->required();
}

// A timeout flag's seconds, or none; nullopt (said on stderr) for what is not one, or not
// above 0.
std::optional<sgpu::Timeout> timeout_flag(const char* flag, const std::string& text,
                                          const char* none_means) {
  sgpu::Timeout timeout;
  try {
    timeout = sgpu::parse_timeout(text);
  } catch (const std::exception&) {
    std::cerr << "sgpu run: " << flag << " takes seconds or none, got \"" << text << "\"\n";
    return std::nullopt;
  }
  if (timeout && timeout->count() <= 0) {
    std::cerr << "sgpu run: " << flag << " takes seconds or none, got \"" << text
              << "\"; give more than 0 seconds, or none " << none_means << "\n";
    return std::nullopt;
  }
  return timeout;
}

// The call's options from `sgpu run`'s flags; nullopt (said on stderr) for a bad one.
std::optional<sgpu::Options> options_of(const RunFlags& f) {
  sgpu::Options options;
  options.gpus = f.gpus;
  options.gpu_type = f.gpu_type;
  options.backend = f.backend;
  options.runs_dir = f.log_dir;
  options.keep_run_dir = f.keep_run_dir;
  options.name = f.run_name;
  options.experiment = f.experiment;
  options.tracking = !f.no_tracking;
  options.sim_compute = f.sim_compute;
  options.nnodes = f.nnodes;
  options.node_rank = f.node_rank;
  options.rdzv_endpoint = f.rdzv_endpoint;
  options.rdzv_id = f.rdzv_id;
  try {
    const sgpu::Timeout join = sgpu::parse_timeout(f.rdzv_timeout);  // none: the longest there is
    if (join && join->count() <= 0) throw std::invalid_argument(f.rdzv_timeout);
    options.rdzv_timeout = join ? *join : sgpu::kLongestDuration;
  } catch (const std::exception&) {
    std::cerr << "sgpu run: --rdzv-timeout takes seconds (more than 0), got \"" << f.rdzv_timeout
              << "\"\n";
    return std::nullopt;
  }
  const auto timeout = timeout_flag("--timeout", f.timeout, "for no deadline");
  if (!timeout) return std::nullopt;
  options.timeout = *timeout;
  const auto hang = timeout_flag("--hang-timeout", f.hang_timeout, "to never judge a launch hung");
  if (!hang) return std::nullopt;
  options.hang_timeout = *hang;
  if (!f.ranks.empty()) {
    try {
      options.console_ranks = parse_ranks(f.ranks);
    } catch (const std::exception&) {
      std::cerr << "sgpu run: --ranks takes a list like 0,3, got \"" << f.ranks << "\"\n";
      return std::nullopt;
    }
  }
  return options;
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
  // Advice in messages names this command's flags (NOTE [Front ends]).
  sgpu::contract::set_front_end(sgpu::contract::FrontEnd::kCommand);
  // A node of a launch that loses node 0's store says so in its own words.
  sgpu::launcher::quiet_store_warnings();
  CLI::App app{"sgpu: run one program or function on every GPU of a node, real or simulated"};
  app.require_subcommand(1);
  app.footer(
      "Examples:\n"
      "  sgpu info\n"
      "  sgpu run --gpus 8 --gpu-type H100 -- python train.py --epochs 3\n"
      "  sgpu run --gpus 4 --backend sim --timeout 600 -- ./my_benchmark\n"
      "  sgpu bench collectives --gpus 8 --ops allreduce --max-bytes 1G\n"
      "  sgpu model validate h100-nvswitch");
  app.add_subcommand("info", "Show the backends built in, the GPUs they see, and versions");
  RunFlags run_flags;
  add_run_command(app, run_flags);
  BenchFlags bench_flags;
  add_bench_command(app, bench_flags);
  std::string sync_dir;
  add_tracking_command(app, sync_dir);
  const auto run_model = sgpu::cli::add_model_command(app);

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
  if (app.got_subcommand("tracking")) {
    sgpu::Options where;
    where.runs_dir = sync_dir;
    return sync_tracking(sgpu::runs_dir_of(where));
  }
  if (app.got_subcommand("bench")) return run_bench(bench_flags);
  const std::optional<sgpu::Options> options = options_of(run_flags);
  return options ? run(*options, run_flags.command) : kUsageError;
}
