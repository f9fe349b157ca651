// Checkpoint save and load throughput for a 256 MiB model (4 x Linear(4096, 4096), float32)
// sharded by FSDP over 1, 2 and 4 simulated ranks, against the disk's floor measured in
// the same run: one process writing the same number of bytes sequentially to one file
// (then fsync) and reading them back.
//
// Counters:
//   MiB_per_s   model bytes / time (the slowest rank's median of 3)
//   x_floor     floor time / this time: 1.0 is as fast as a plain sequential write or read
//
// Files go to $SGPU_BENCH_DIR (else the temporary directory). Reads are served from the
// page cache when the files were just written, for the floor and for sgpu alike.
//
//   SGPU_BACKEND=sim build/bin/bench_checkpoint
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "bench_options.h"
#include "sgpu/checkpoint/checkpoint.h"
#include "sgpu/parallel/fsdp.h"
#include "sgpu/parallel/group.h"
#include "sgpu/sgpu.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr int kReps = 3;

torch::nn::Sequential make_model() {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int i = 0; i < 4; ++i) model->push_back(torch::nn::Linear(4096, 4096));
  return model;
}

std::uint64_t model_bytes() {
  static const std::uint64_t bytes = [] {
    std::uint64_t total = 0;
    for (const auto& p : make_model()->parameters()) total += p.nbytes();
    return total;
  }();
  return bytes;
}

fs::path bench_dir() {
  const char* env = std::getenv("SGPU_BENCH_DIR");
  return fs::path(env ? env : fs::temp_directory_path().string()) /
         ("sgpu-bench-checkpoint-" + std::to_string(::getpid()));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Timing {
  double save_s = 0, load_s = 0;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(save_s, load_s);
  }
};

// In each rank: save and load the FSDP-sharded model kReps times; the medians.
Timing time_checkpoint(std::string dir) {
  sgpu::parallel::FullyShardedDataParallel fsdp(make_model());
  auto group = sgpu::parallel::default_group();
  std::vector<double> saves, loads;
  for (int rep = 0; rep < kReps; ++rep) {
    const fs::path path = fs::path(dir) / ("rep-" + std::to_string(rep));
    group->barrier()->wait();
    auto start = Clock::now();
    sgpu::checkpoint::save(path, fsdp, nullptr);  // ends with a barrier
    saves.push_back(seconds_since(start));
    group->barrier()->wait();
    start = Clock::now();
    sgpu::checkpoint::load(sgpu::checkpoint::CheckpointReader(path), fsdp);
    group->barrier()->wait();
    loads.push_back(seconds_since(start));
    if (sgpu::global_rank() == 0) fs::remove_all(path);
  }
  return {median(saves), median(loads)};
}

// The floor: the same bytes, one file, one process.
struct Floor {
  double write_s = 0, read_s = 0;
};

const Floor& floor_times() {
  static const Floor floor = [] {
    const fs::path dir = bench_dir() / "floor";
    fs::create_directories(dir);
    const std::vector<char> buffer(8 << 20, 'x');
    std::vector<double> writes, reads;
    for (int rep = 0; rep < kReps; ++rep) {
      const fs::path file = dir / "floor.bin";
      auto start = Clock::now();
      const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      for (std::uint64_t done = 0; done < model_bytes();) {
        const auto n = std::min<std::uint64_t>(buffer.size(), model_bytes() - done);
        if (::write(fd, buffer.data(), n) != static_cast<ssize_t>(n)) std::abort();
        done += n;
      }
      ::fsync(fd);
      ::close(fd);
      writes.push_back(seconds_since(start));
      std::vector<char> in(8 << 20);
      start = Clock::now();
      const int rfd = ::open(file.c_str(), O_RDONLY);
      while (::read(rfd, in.data(), in.size()) > 0) {
      }
      ::close(rfd);
      reads.push_back(seconds_since(start));
      fs::remove(file);
    }
    return Floor{median(writes), median(reads)};
  }();
  return floor;
}

void report(benchmark::State& state, double seconds, double floor_seconds) {
  state.SetIterationTime(seconds);
  state.counters["MiB_per_s"] = static_cast<double>(model_bytes()) / (1 << 20) / seconds;
  state.counters["x_floor"] = floor_seconds / seconds;
}

void BM_FloorWrite(benchmark::State& state) {
  for (auto _ : state) report(state, floor_times().write_s, floor_times().write_s);
}
void BM_FloorRead(benchmark::State& state) {
  for (auto _ : state) report(state, floor_times().read_s, floor_times().read_s);
}

// One launch per rank count times both save and load.
Timing run_ranks(int ranks) {
  static std::map<int, Timing> done;
  if (done.count(ranks)) return done[ranks];
  sgpu::Options options = sgpu::bench::options();
  options.gpus = ranks;
  options.backend = "sim";
  options.console_ranks = std::vector<int>{};
  const fs::path dir = bench_dir() / ("ranks-" + std::to_string(ranks));
  fs::create_directories(dir);
  Timing slowest;
  for (const Timing& t : sgpu::distributed(time_checkpoint, options).distributed(dir.string())) {
    slowest.save_s = std::max(slowest.save_s, t.save_s);
    slowest.load_s = std::max(slowest.load_s, t.load_s);
  }
  fs::remove_all(dir);
  return done[ranks] = slowest;
}

void BM_Save(benchmark::State& state) {
  for (auto _ : state)
    report(state, run_ranks(static_cast<int>(state.range(0))).save_s, floor_times().write_s);
}
void BM_Load(benchmark::State& state) {
  for (auto _ : state)
    report(state, run_ranks(static_cast<int>(state.range(0))).load_s, floor_times().read_s);
}

BENCHMARK(BM_FloorWrite)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FloorRead)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Save)->ArgName("ranks")->Arg(1)->Arg(2)->Arg(4)->Iterations(1)->UseManualTime()->Unit(
    benchmark::kMillisecond);
BENCHMARK(BM_Load)->ArgName("ranks")->Arg(1)->Arg(2)->Arg(4)->Iterations(1)->UseManualTime()->Unit(
    benchmark::kMillisecond);

}  // namespace
