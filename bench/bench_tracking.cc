// Metrics per second logged from 8 simulated ranks with sgpu::log_metric, into MLflow's
// file store, into an MLflow database (sqlite:///, sgpu's SQLite store) and into a local
// MLflow tracking server (on SQLite), against MLflow's own Python client's log_batch (1000
// metrics a request) into that server and into such a database, in the same run.
//   metrics_per_s       metrics that reached the store per second of the whole call
//                       (launch, logging, the ranks' final flush, the run's end)
//   x_python_log_batch  that rate over the Python client's rate (measured first) into the
//                       same kind of store: the database's for the database, else the server's
#include <benchmark/benchmark.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "sgpu/sgpu.h"
#include "testing/mlflow_server.h"
#include "testing/sim_options.h"

namespace {

constexpr int kRanks = 8;
constexpr int kPerRank = 5000;

std::unique_ptr<sgpu::testing::MlflowServer> g_server;
double g_python_rate = 0;           // metrics per second, into the server
double g_python_database_rate = 0;  // into a database
std::filesystem::path g_database;   // the database both log into

int log_many(int count) {
  for (int step = 0; step < count; ++step) sgpu::log_metric("loss", step * 0.5, step);
  return 0;
}

double python_rate(const std::string& uri, int count) {
  const std::string command = std::string(SGPU_BENCH_PYTHON) + " " + SGPU_BENCH_SOURCE_DIR +
                              "/mlflow_log_batch.py " + uri + " " + std::to_string(count);
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return 0;
  // MLflow may print lines of its own; the answer is the line "seconds=<s>".
  double seconds = 0;
  char line[4096];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    if (std::sscanf(line, "seconds=%lf", &seconds) == 1) break;
  }
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
  }
  ::pclose(pipe);
  return seconds > 0 ? count / seconds : 0;
}

void run_calls(benchmark::State& state, const std::string& uri) {
  sgpu::Options options = sgpu::testing::sim(kRanks);
  options.tracking_uri = uri;
  options.experiment = "bench_tracking";
  const auto job = sgpu::distributed(log_many, options);
  for (auto _ : state) job.distributed(kPerRank);
  const double metrics = static_cast<double>(state.iterations()) * kRanks * kPerRank;
  state.counters["metrics_per_s"] = benchmark::Counter(metrics, benchmark::Counter::kIsRate);
  state.counters["ranks"] = kRanks;
}

void BM_Python_LogBatch_Server(benchmark::State& state) {
  for (auto _ : state) {
    g_python_rate = python_rate(g_server->uri(), kRanks * kPerRank);
    if (g_python_rate <= 0) {
      state.SkipWithError("mlflow_log_batch.py gave no time; is mlflow installed (ci/setup)?");
      break;
    }
    state.SetIterationTime(kRanks * kPerRank / g_python_rate);
  }
  state.counters["metrics_per_s"] = g_python_rate;
}

void BM_Python_LogBatch_Database(benchmark::State& state) {
  g_database = sgpu::testing::make_temp_dir("sgpu-bench-db") / "mlflow.db";
  for (auto _ : state) {
    g_python_database_rate = python_rate("sqlite:///" + g_database.string(), kRanks * kPerRank);
    if (g_python_database_rate <= 0) {
      state.SkipWithError("mlflow_log_batch.py gave no time; is mlflow installed (ci/setup)?");
      break;
    }
    state.SetIterationTime(kRanks * kPerRank / g_python_database_rate);
  }
  state.counters["metrics_per_s"] = g_python_database_rate;
}

void BM_Sgpu_Server_8Ranks(benchmark::State& state) { run_calls(state, g_server->uri()); }

void BM_Sgpu_Database_8Ranks(benchmark::State& state) {
  run_calls(state, "sqlite:///" + g_database.string());  // the database MLflow made above
  std::filesystem::remove_all(g_database.parent_path());
}

void BM_Sgpu_FileStore_8Ranks(benchmark::State& state) {
  const auto dir = sgpu::testing::make_temp_dir("sgpu-bench-mlruns");
  run_calls(state, "file://" + (dir / "mlruns").string());
  std::filesystem::remove_all(dir);
}

// The counter x_python_log_batch is added after the run, when all rates are known.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> copy = runs;
    for (Run& run : copy) {
      const auto it = run.counters.find("metrics_per_s");
      const bool database = run.benchmark_name().find("Database") != std::string::npos;
      const double reference = database ? g_python_database_rate : g_python_rate;
      if (it != run.counters.end() && reference > 0) {
        // Rates are final here: the library divided by the run's time already.
        run.counters["x_python_log_batch"] = it->second.value / reference;
      }
    }
    ConsoleReporter::ReportRuns(copy);
  }
};

}  // namespace

BENCHMARK(BM_Python_LogBatch_Server)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Python_LogBatch_Database)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Sgpu_Server_8Ranks)->Iterations(3)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Sgpu_Database_8Ranks)->Iterations(3)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Sgpu_FileStore_8Ranks)->Iterations(3)->UseRealTime()->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  sgpu::init(argc, argv);
  benchmark::Initialize(&argc, argv);
  g_server = std::make_unique<sgpu::testing::MlflowServer>(SGPU_BENCH_PYTHON);
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  g_server.reset();
  benchmark::Shutdown();
}
