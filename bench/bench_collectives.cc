// Collective throughput on N ranks, through sgpu, against the floor in the same run (and,
// on sim, against Open MPI's shared-memory collectives).
//
// For each operation and data type, one sgpu call runs the whole size sweep inside the
// ranks (collectives/collective_sweep.h) and returns each rank's timings; the floor
// (collectives/floor.h) runs the same sweep in plain libtorch processes just before it.
// Each size is reported to Google Benchmark as `<op>/<dtype>/<bytes>/{floor,sgpu}` (Google
// Benchmark appends `/iterations:1/manual_time`) with
// manual time = the time per operation of the slowest rank (each rank's mean over the
// timed iterations; a collective is as slow as its slowest rank), and the counters of
// nccl-tests: algbw_GBps = bytes / time, busbw_GBps = algbw x bus factor, wrong (elements
// of the first result that differ from the expected one, summed over ranks), and, on the
// sgpu rows, vs_floor = floor time / sgpu time (1.0: no overhead). On sim, where the
// sgpu rows run through the simulated transport (--transport; shared memory by default)
// and the floor is ProcessGroupGloo, `<op>/float32/<bytes>/openmpi` rows time the same
// sweep through Open MPI (collectives/mpi_sweep.c under mpirun, btl self,vader,
// mpi_yield_when_idle 1), and the sgpu rows get vs_openmpi = Open MPI time / sgpu time. With
// --recorder both, each size also has a `/sgpu_unrecorded` row (the collective recorder
// off), and the sgpu rows get vs_unrecorded = that time / sgpu time and recorder_us, the
// difference per collective. Beside each measured sgpu row, what the collective model
// (model/platform.h) predicts for the node: on sim the simulated node's platform (8xH100:
// h100-nvswitch), elsewhere SGPU_PLATFORM's: counters model_us and model_busbw_GBps, and
// the table's model columns. With
// --benchmark_repetitions=K each repetition is a fresh sweep pair. A nccl-tests-like
// table follows (medians over repetitions). Exit status 1 when a result was wrong or a
// sweep failed; 2 for bad flags.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend_table.h"
#include "bench_options.h"
#include "collectives/collective_sweep.h"
#include "collectives/floor.h"
#include "contract/option_table.h"
#include "contract/rank_env.h"
#include "model/platform.h"
#include "sgpu/config.h"
#include "sgpu/process_group.h"
#include "sgpu/sgpu.h"
#include "sim/node_spec.h"
#include "sim/sim_backend.h"

namespace {

using sgpu::bench::Collective;

sgpu::bench::SweepResult collective_sweep(sgpu::bench::SweepSpec spec) {
  return sgpu::bench::run_sweep(sgpu::process_group(), spec, sgpu::device());
}

struct Config {
  std::string backend = "auto";
  int gpus = 0;  // 0: every GPU of the node
  std::string gpu_type;
  std::string timeout = "3600";
  std::string min_bytes = "8";
  std::string max_bytes;  // empty: 256M on cuda, 64M on sim
  std::vector<std::string> dtypes{"float32", "bfloat16"};
  std::vector<std::string> ops{"allreduce", "allgather", "reducescatter",
                               "broadcast", "alltoall",  "barrier"};
  int warmup = 5;
  int iters = 20;
  bool no_floor = false;
  std::string table_path;
  std::string transport;        // sim: "shm" or "gloo"; empty: SGPU_SIM_TRANSPORT, else shm
  std::string mpi = "auto";     // the Open MPI reference rows: auto (sim, when built), on, off
  std::string recorder = "on";  // the collective recorder: on, off, or both (rows of each)
};

std::int64_t parse_bytes(const std::string& text) { return sgpu::model::parse_message_size(text); }

// One measurement of an (operation, data type): the floor's and sgpu's per-rank results.
struct Measured {
  std::vector<sgpu::bench::SweepResult> sgpu, floor;  // [rank][size]
  std::vector<sgpu::bench::SweepResult> unrecorded;   // sgpu with the recorder off
  std::vector<double> mpi;                            // [size]: Open MPI's slowest rank
  std::string error;                                  // set when a sweep failed
};

// The Open MPI reference (collectives/mpi_sweep.c), beside this binary when CMake found
// MPI; empty when it was not built.
std::string mpi_sweep_path() {
  if (std::string(SGPU_BENCH_MPIRUN).empty()) return "";
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  const auto path = self.parent_path() / "bench_mpi_sweep";
  return std::filesystem::exists(path) ? path.string() : "";
}

// The same sweep through Open MPI's collectives over shared memory (btl self,vader),
// ranks yielding when idle, as a tuned MPI run on an oversubscribed node would: the
// slowest rank's mean per size. Throws with mpirun's output when it fails.
std::vector<double> run_mpi(const sgpu::bench::SweepSpec& spec, int ranks) {
  std::string command = std::string(SGPU_BENCH_MPIRUN) +
                        (::geteuid() == 0 ? " --allow-run-as-root" : "") + " --oversubscribe -np " +
                        std::to_string(ranks) +
                        " --mca btl self,vader --mca mpi_yield_when_idle 1 " + mpi_sweep_path() +
                        " " + std::string(sgpu::bench::name(spec.op)) + " " +
                        std::to_string(spec.warmup) + " " + std::to_string(spec.iters);
  for (const auto& size : spec.sizes) command += " " + std::to_string(size.count);
  std::string output;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("cannot run " + command);
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;)
    output.append(buffer, n);
  const int status = ::pclose(pipe);
  std::vector<double> seconds;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    long long bytes = 0;
    double per_op = 0;
    if (words >> bytes >> per_op) seconds.push_back(per_op);
  }
  const std::size_t want = spec.sizes.empty() ? 1 : spec.sizes.size();
  if (status != 0 || seconds.size() != want) {
    throw std::runtime_error("the Open MPI reference failed (" + command + "):\n" + output);
  }
  return seconds;
}

struct SizeSummary {
  double seconds = 0;  // the slowest rank's
  std::int64_t wrong = 0;
  std::string wrong_ranks;
};

SizeSummary summarise(const std::vector<sgpu::bench::SweepResult>& ranks, std::size_t size) {
  SizeSummary summary;
  for (std::size_t rank = 0; rank < ranks.size(); ++rank) {
    const auto& timing = ranks[rank].at(size);
    summary.seconds = std::max(summary.seconds, timing.seconds_per_op);
    summary.wrong += timing.wrong;
    if (timing.wrong > 0) summary.wrong_ranks += " " + std::to_string(rank);
  }
  return summary;
}

class CollectiveBench {
 public:
  CollectiveBench(Config config, sgpu::Options options, std::string backend, int ranks,
                  std::optional<sgpu::model::Platform> platform)
      : config_(std::move(config)),
        options_(std::move(options)),
        backend_(std::move(backend)),
        ranks_(ranks),
        platform_(std::move(platform)) {}

  void register_all() {
    const std::int64_t min = parse_bytes(config_.min_bytes);
    const std::int64_t max = parse_bytes(config_.max_bytes);
    for (const auto& op_name : config_.ops) {
      const Collective op = *sgpu::bench::parse_collective(op_name);
      for (const auto& dtype_name : config_.dtypes) {
        const c10::ScalarType dtype = *sgpu::bench::parse_dtype(dtype_name);
        sgpu::bench::SweepSpec spec;
        spec.op = op;
        spec.dtype = dtype;
        spec.sizes = sgpu::bench::plan_sizes(op, dtype, ranks_, min, max);
        spec.warmup = config_.warmup;
        spec.iters = config_.iters;
        specs_[{op, dtype}] = spec;
        order_.emplace_back(op, dtype);
        for (std::size_t i = 0; i < spec.sizes.size(); ++i) {
          if (!config_.no_floor) add(spec, i, Who::kFloor);
          if (with_mpi(spec)) add(spec, i, Who::kMpi);
          if (config_.recorder == "both") add(spec, i, Who::kUnrecorded);
          add(spec, i, Who::kSgpu);
        }
        if (op == Collective::kBarrier) break;  // no data type
      }
    }
  }

  // Prints the nccl-tests-like table (medians over repetitions) to `out`.
  void print_table(std::ostream& out) const {
    out << "# sgpu collective benchmark: backend " << backend_ << ", " << ranks_
        << " ranks; time = slowest rank's mean over " << config_.iters << " iterations after "
        << config_.warmup << " warm-up; median over repetitions\n";
    if (platform_) {
      out << "# model: the collective model's time and busbw on " << platform_->name << " ("
          << platform_->origin << ")\n";
    }
    out << "#" << std::setw(14) << "op" << std::setw(10) << "type" << std::setw(12) << "size(B)"
        << std::setw(12) << "count" << std::setw(12) << "time(us)" << std::setw(12) << "algbw"
        << std::setw(12) << "busbw" << std::setw(8) << "#wrong" << std::setw(14) << "floor(us)"
        << std::setw(14) << "floor_busbw" << std::setw(10) << "vs_floor" << std::setw(12)
        << "mpi(us)" << std::setw(10) << "vs_mpi";
    if (platform_) out << std::setw(12) << "model(us)" << std::setw(12) << "model_busbw";
    out << "\n";
    out << "#" << std::setw(82) << "(GB/s)" << std::setw(12) << "(GB/s)" << std::setw(36)
        << "(GB/s)"
        << "\n";
    out << std::fixed;
    for (const auto& key : order_) {
      const auto it = measured_.find(key);
      if (it == measured_.end()) continue;
      const auto& spec = specs_.at(key);
      for (std::size_t i = 0; i < spec.sizes.size(); ++i) {
        std::vector<double> times, floors, mpis;
        std::int64_t wrong = 0;
        for (const Measured& m : it->second) {
          if (!m.error.empty()) continue;
          const SizeSummary s = summarise(m.sgpu, i);
          times.push_back(s.seconds);
          wrong += s.wrong;
          if (!m.floor.empty()) floors.push_back(summarise(m.floor, i).seconds);
          if (!m.mpi.empty()) mpis.push_back(m.mpi.at(i));
        }
        if (times.empty()) continue;
        const double time = median(times);
        const double bytes = static_cast<double>(spec.sizes[i].bytes);
        const double factor = sgpu::bench::bus_factor(spec.op, ranks_);
        const bool barrier = spec.op == Collective::kBarrier;
        out << " " << std::setw(14) << sgpu::bench::name(spec.op) << std::setw(10)
            << (barrier ? "-" : std::string(sgpu::bench::dtype_name(spec.dtype))) << std::setw(12)
            << spec.sizes[i].bytes << std::setw(12) << spec.sizes[i].count << std::setprecision(1)
            << std::setw(12) << time * 1e6 << std::setprecision(3) << std::setw(12)
            << bytes / time / 1e9 << std::setw(12) << bytes / time / 1e9 * factor << std::setw(8)
            << wrong;
        if (!floors.empty()) {
          const double floor = median(floors);
          out << std::setprecision(1) << std::setw(14) << floor * 1e6 << std::setprecision(3)
              << std::setw(14) << bytes / floor / 1e9 * factor << std::setw(10) << floor / time;
        } else {
          out << std::setw(14) << "-" << std::setw(14) << "-" << std::setw(10) << "-";
        }
        if (!mpis.empty()) {
          const double mpi = median(mpis);
          out << std::setprecision(1) << std::setw(12) << mpi * 1e6 << std::setprecision(3)
              << std::setw(10) << mpi / time;
        } else if (platform_) {
          out << std::setw(12) << "-" << std::setw(10) << "-";
        }
        if (platform_) {
          const auto p = predicted(spec.op, spec.sizes[i].bytes);
          out << std::setprecision(1) << std::setw(12) << p.seconds * 1e6 << std::setprecision(3)
              << std::setw(12) << p.busbw_gbps;
        }
        out << "\n";
      }
    }
    out << std::defaultfloat;
  }

  bool failed() const { return failed_; }

 private:
  using Key = std::pair<Collective, c10::ScalarType>;
  enum class Who { kFloor, kMpi, kUnrecorded, kSgpu };

  sgpu::model::Prediction predicted(Collective op, std::int64_t bytes) const {
    return sgpu::model::predict(*platform_, sgpu::bench::model_collective(op), bytes, ranks_);
  }

  // Open MPI rows: on sim, float32 (MPI has no bfloat16), when the reference was built.
  bool with_mpi(const sgpu::bench::SweepSpec& spec) const {
    if (config_.mpi == "off" || backend_ != "sim") return false;
    return spec.dtype == c10::ScalarType::Float || spec.op == Collective::kBarrier;
  }

  static double median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    const std::size_t n = values.size();
    return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
  }

  // The repetition-th measurement of `key`, made when first asked for: the floor first,
  // then sgpu, one sweep each.
  const Measured& measure(const Key& key, std::size_t repetition) {
    auto& runs = measured_[key];
    while (runs.size() <= repetition) {
      Measured m;
      const auto& spec = specs_.at(key);
      try {
        if (!config_.no_floor) {
          m.floor = sgpu::bench::run_floor(spec, backend_, ranks_,
                                           options_.timeout.value_or(std::chrono::hours(24)));
        }
        if (with_mpi(spec)) m.mpi = run_mpi(spec, ranks_);
        // With the recorder both on and off, the two calls take turns going first, so
        // neither gains from running second.
        sgpu::Options unrecorded = options_;
        unrecorded.recorder_entries = 0;
        const bool both = config_.recorder == "both";
        const bool unrecorded_first = both && runs.size() % 2 == 0;
        if (unrecorded_first) {
          m.unrecorded = sgpu::distributed(collective_sweep, unrecorded).distributed(spec);
        }
        m.sgpu = sgpu::distributed(collective_sweep, options_).distributed(spec);
        if (both && !unrecorded_first) {
          m.unrecorded = sgpu::distributed(collective_sweep, unrecorded).distributed(spec);
        }
      } catch (const std::exception& e) {
        m.error = e.what();
        failed_ = true;
        std::cerr << "bench_collectives: " << sgpu::bench::name(spec.op) << "/"
                  << sgpu::bench::dtype_name(spec.dtype) << " failed: " << e.what() << "\n";
      }
      runs.push_back(std::move(m));
    }
    return runs[repetition];
  }

  void add(const sgpu::bench::SweepSpec& spec, std::size_t index, Who who) {
    const Key key{spec.op, spec.dtype};
    const auto& size = spec.sizes[index];
    std::string name(sgpu::bench::name(spec.op));
    if (spec.op != Collective::kBarrier) {
      name +=
          "/" + std::string(sgpu::bench::dtype_name(spec.dtype)) + "/" + std::to_string(size.bytes);
    }
    name += who == Who::kFloor        ? "/floor"
            : who == Who::kMpi        ? "/openmpi"
            : who == Who::kUnrecorded ? "/sgpu_unrecorded"
                                      : "/sgpu";
    auto calls = std::make_shared<std::size_t>(0);
    benchmark::RegisterBenchmark(
        name.c_str(),
        [this, key, index, who, calls, bytes = size.bytes](benchmark::State& state) {
          const Measured& m = measure(key, (*calls)++);
          if (!m.error.empty()) {
            state.SkipWithError(m.error.c_str());
            return;
          }
          SizeSummary s;
          if (who == Who::kMpi) {
            s.seconds = m.mpi.at(index);
          } else {
            s = summarise(who == Who::kFloor        ? m.floor
                          : who == Who::kUnrecorded ? m.unrecorded
                                                    : m.sgpu,
                          index);
          }
          if (s.wrong > 0) {
            failed_ = true;
            state.SkipWithError((std::to_string(s.wrong) +
                                 " wrong elements in the first result, on ranks" + s.wrong_ranks)
                                    .c_str());
            return;
          }
          for (auto _ : state) state.SetIterationTime(s.seconds);
          state.counters["ranks"] = ranks_;
          state.counters["wrong"] = 0;
          if (key.first != Collective::kBarrier) {
            const double algbw = static_cast<double>(bytes) / s.seconds / 1e9;
            state.counters["bytes"] = static_cast<double>(bytes);
            state.counters["algbw_GBps"] = algbw;
            state.counters["busbw_GBps"] = algbw * sgpu::bench::bus_factor(key.first, ranks_);
          }
          if (who == Who::kSgpu && platform_) {
            const auto p = predicted(key.first, bytes);
            state.counters["model_us"] = p.seconds * 1e6;
            state.counters["model_busbw_GBps"] = p.busbw_gbps;
          }
          if (who == Who::kSgpu && !m.floor.empty()) {
            state.counters["vs_floor"] = summarise(m.floor, index).seconds / s.seconds;
          }
          if (who == Who::kSgpu && !m.mpi.empty()) {
            state.counters["vs_openmpi"] = m.mpi.at(index) / s.seconds;
          }
          if (who == Who::kSgpu && !m.unrecorded.empty()) {
            // What recording costs a collective: the recorded row's time less the other's.
            const double unrecorded = summarise(m.unrecorded, index).seconds;
            state.counters["vs_unrecorded"] = unrecorded / s.seconds;
            state.counters["recorder_us"] = (s.seconds - unrecorded) * 1e6;
          }
        })
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  }

  Config config_;
  sgpu::Options options_;
  std::string backend_;
  int ranks_;
  std::optional<sgpu::model::Platform> platform_;  // the model's node, when there is one
  std::map<Key, sgpu::bench::SweepSpec> specs_;
  std::vector<Key> order_;
  std::map<Key, std::vector<Measured>> measured_;
  bool failed_ = false;
};

std::string command_output(const std::string& command) {
  std::string output;
  if (FILE* pipe = ::popen((command + " 2>/dev/null").c_str(), "r")) {
    char buffer[4096];
    for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) {
      output.append(buffer, n);
    }
    ::pclose(pipe);
  }
  while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
  return output;
}

// The commit this binary was built from: the source tree's, at run time, marked -dirty
// when tracked files changed; the one CMake saw, when the tree is not at hand.
std::string source_commit() {
  const std::string git = "git -C '" SGPU_BENCH_SOURCE_DIR "' ";
  std::string commit = command_output(git + "rev-parse HEAD");
  if (commit.empty()) return SGPU_BENCH_GIT_COMMIT;
  if (!command_output(git + "status --porcelain --untracked-files=no").empty()) {
    commit += "-dirty";
  }
  return commit;
}

// "NVLink (NV18)" or "PCIe (PIX, SYS)" from `nvidia-smi topo -m`: the link kinds between
// the GPUs of the node.
std::string interconnect() {
  std::istringstream topo(command_output("nvidia-smi topo -m"));
  std::set<std::string> links;
  for (std::string line; std::getline(topo, line);) {
    std::istringstream words(line);
    std::string word;
    words >> word;
    if (word.rfind("GPU", 0) != 0) continue;
    while (words >> word) {
      if (word.rfind("NV", 0) == 0 || word == "PIX" || word == "PXB" || word == "PHB" ||
          word == "NODE" || word == "SYS") {
        links.insert(word);
      }
    }
  }
  if (links.empty()) return "unknown (no nvidia-smi topo)";
  std::string kinds;
  bool nvlink = false;
  for (const auto& link : links) {
    kinds += (kinds.empty() ? "" : ", ") + link;
    nvlink = nvlink || link.rfind("NV", 0) == 0;
  }
  return std::string(nvlink ? "NVLink" : "PCIe") + " (" + kinds + ")";
}

void add_context(const std::string& backend, int ranks, const sgpu::Options& options,
                 const Config& config) {
  benchmark::AddCustomContext("sgpu_version", SGPU_VERSION);
  benchmark::AddCustomContext("sgpu_commit", source_commit());
  benchmark::AddCustomContext("libtorch", SGPU_TORCH_VERSION);
  benchmark::AddCustomContext("cuda_built", SGPU_WITH_CUDA ? SGPU_CUDA_VERSION : "none");
  benchmark::AddCustomContext("nccl_built", SGPU_WITH_CUDA ? SGPU_NCCL_VERSION : "none");
  benchmark::AddCustomContext("backend", backend);
  benchmark::AddCustomContext("ranks", std::to_string(ranks));
  const auto inventory = sgpu::backend::find_backend(backend).inventory(options);
  benchmark::AddCustomContext("gpus", inventory.summary());
  benchmark::AddCustomContext("node", inventory.node);
  std::string names;
  for (const auto& gpu : inventory.gpus) {
    if (gpu.index < ranks) names += (names.empty() ? "" : "; ") + gpu.name;
  }
  benchmark::AddCustomContext("gpu_names", names);
  if (backend == "cuda") {
    const std::string driver =
        command_output("nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1");
    benchmark::AddCustomContext("driver", driver.empty() ? "unknown" : driver);
    benchmark::AddCustomContext("interconnect", interconnect());
  } else {
    benchmark::AddCustomContext("driver", "none (simulated ranks)");
    const char* env = std::getenv("SGPU_SIM_TRANSPORT");
    const std::string transport = !options.sim.transport.empty()
                                      ? options.sim.transport
                                      : (env != nullptr && *env != '\0' ? env : "shm");
    benchmark::AddCustomContext("interconnect", transport == "gloo"
                                                    ? "simulated: Gloo over TCP on 127.0.0.1"
                                                    : "simulated: shared memory (sgpu's shm "
                                                      "transport); floor: Gloo over TCP");
  }
  benchmark::AddCustomContext("warmup", std::to_string(config.warmup));
  benchmark::AddCustomContext("iters", std::to_string(config.iters));
  benchmark::AddCustomContext("time",
                              "slowest rank's mean time per operation over the timed iterations");
  benchmark::AddCustomContext(
      "floor", config.no_floor ? "off" : "the same sweep in plain libtorch processes");
  benchmark::AddCustomContext(
      "openmpi", config.mpi == "off" || backend != "sim"
                     ? "off"
                     : "the same sweep (float32) through Open MPI's collectives: mpirun "
                       "--mca btl self,vader --mca mpi_yield_when_idle 1");
}

}  // namespace

int main(int argc, char** argv) {
  if (sgpu::bench::is_floor_rank()) sgpu::bench::floor_rank_main();
  sgpu::init(argc, argv);

  Config config;
  CLI::App app{
      "Collective throughput (nccl-tests' algbw and busbw) through sgpu, against "
      "plain libtorch processes (the floor), in one run. Google Benchmark's own "
      "--benchmark_* flags pass through."};
  // A flag given twice takes its last value, so callers can preset and users override.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.footer(
      "Examples:\n"
      "  bench_collectives --backend sim --gpus 4 --max-bytes 16M\n"
      "  bench_collectives --gpus 8 --ops allreduce,allgather --dtypes bfloat16 \\\n"
      "      --benchmark_repetitions=5 --benchmark_out=run.json --benchmark_out_format=json");
  app.add_option("--backend", config.backend, "auto, cuda or sim (SGPU_BACKEND overrides)")
      ->capture_default_str();
  app.add_option("--gpus", config.gpus, "Ranks (default: every GPU of the node)");
  app.add_option("--gpu-type", config.gpu_type, "GPU type the node must have");
  app.add_option("--timeout", config.timeout, "Seconds per sweep, or none")->capture_default_str();
  app.add_option("--min-bytes", config.min_bytes, "Smallest message, e.g. 8, 1K, 1M")
      ->capture_default_str();
  app.add_option("--max-bytes", config.max_bytes, "Largest message (default 256M cuda, 64M sim)");
  app.add_option("--dtypes", config.dtypes, "float32,bfloat16")->delimiter(',');
  app.add_option("--ops", config.ops,
                 "allreduce,allgather,reducescatter,broadcast,alltoall,barrier")
      ->delimiter(',');
  app.add_option("--warmup", config.warmup, "Untimed iterations per size")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--iters", config.iters, "Timed iterations per size")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--no-floor", config.no_floor, "Skip the libtorch-only floor");
  app.add_option("--transport", config.transport,
                 "sim: shm (shared memory, the default) or gloo; the floor is Gloo either way")
      ->check(CLI::IsMember({"shm", "gloo"}));
  app.add_option("--mpi", config.mpi,
                 "Open MPI reference rows (sim, float32): auto (when built), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--recorder", config.recorder,
                 "The collective recorder: on, off, or both (sgpu_unrecorded rows beside the "
                 "recorded ones, and their difference)")
      ->check(CLI::IsMember({"on", "off", "both"}))
      ->capture_default_str();
  app.add_option("--table", config.table_path, "Also write the table to this file");
  // Google Benchmark answers --help itself and exits; this binary's flags come first.
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::cout << app.help()
                << "\nGoogle Benchmark's flags: --benchmark_filter=REGEX, "
                   "--benchmark_repetitions=K, --benchmark_out=FILE, "
                   "--benchmark_out_format=json|console|csv, --benchmark_format=...\n";
      return 0;
    }
  }
  bool json_on_stdout = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    json_on_stdout =
        json_on_stdout || arg == "--benchmark_format=json" || arg == "--benchmark_format=csv";
  }
  benchmark::Initialize(&argc, argv);
  try {
    app.parse(argc, argv);
    for (const auto& op : config.ops) {
      if (!sgpu::bench::parse_collective(op)) throw CLI::ValidationError("--ops", "unknown " + op);
    }
    for (const auto& dtype : config.dtypes) {
      if (!sgpu::bench::parse_dtype(dtype)) {
        throw CLI::ValidationError("--dtypes", "unknown " + dtype);
      }
    }
    if (config.mpi != "off" && mpi_sweep_path().empty()) {
      if (config.mpi == "on") {
        throw CLI::ValidationError("--mpi",
                                   "on, but this build has no Open MPI reference "
                                   "(CMake found no mpirun and MPI; ci/setup installs "
                                   "openmpi-bin and libopenmpi-dev)");
      }
      config.mpi = "off";
    }
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "bench_collectives: " << e.what() << "\n\n" << app.help();
    return 2;
  }

  sgpu::Options options = sgpu::bench::options();
  options.backend = config.backend;
  options.gpu_type = config.gpu_type;
  options.name = "collective_sweep";
  options.sim.transport = config.transport;
  if (config.recorder == "off") options.recorder_entries = 0;
  std::string backend;
  std::optional<sgpu::model::Platform> platform;
  try {
    options.timeout = sgpu::parse_timeout(config.timeout);
    sgpu::backend::check_backend_name(options.backend);
    options = sgpu::contract::with_environment(options);
    backend = std::string(sgpu::backend::choose_backend(options).name());
    options.backend = backend;
    if (config.max_bytes.empty()) config.max_bytes = backend == "cuda" ? "256M" : "64M";
    parse_bytes(config.min_bytes);
    parse_bytes(config.max_bytes);
    options.gpus =
        config.gpus > 0
            ? config.gpus
            : static_cast<int>(sgpu::backend::find_backend(backend).inventory(options).gpus.size());
    const std::string platform_name =
        backend == "sim" ? sgpu::sim::platform_of_spec(sgpu::sim::node_spec_of(options))
                         : sgpu::contract::env_string(sgpu::contract::kPlatformVar);
    if (!platform_name.empty()) platform = sgpu::model::load_platform(platform_name);
  } catch (const sgpu::Error& e) {
    std::cerr << "bench_collectives: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "bench_collectives: --timeout takes seconds or none, and --min-bytes and "
                 "--max-bytes a size like 8, 4K, 64M (got "
              << config.timeout << ", " << config.min_bytes << ", " << config.max_bytes << ")\n";
    return 2;
  }
  if (options.gpus < 1) {
    std::cerr << "bench_collectives: backend " << backend << " has no GPU to run on\n";
    return 2;
  }

  add_context(backend, options.gpus, options, config);
  CollectiveBench bench(config, options, backend, options.gpus, std::move(platform));
  bench.register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();

  std::ostringstream table;
  bench.print_table(table);
  (json_on_stdout ? std::cerr : std::cout) << "\n" << table.str() << std::flush;
  if (!config.table_path.empty()) std::ofstream(config.table_path) << table.str();
  return bench.failed() ? 1 : 0;
}
