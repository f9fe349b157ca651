// One rank's side of the collective benchmark: a size sweep of one operation and one data
// type over a c10d process group, timed and checked the way nccl-tests does it.
//
// The same sweep runs in sgpu's ranks (over sgpu::process_group()) and in the floor's
// plain processes (over a group they make themselves), so the two differ only in what
// sgpu puts around the loop. For each size: the first operation runs on known inputs and
// its result is compared element by element with the expected one (`wrong` counts the
// elements that differ, like nccl-tests' #wrong); then `warmup` untimed operations, a
// barrier, and `iters` timed ones, issued back to back and waited for once at the end
// (on cuda, a copy of one element to the host, which waits for the queued work).
//
// Sizes follow nccl-tests: `bytes` is the whole buffer (the all-gather output, the
// reduce-scatter input, the all-to-all buffer), rounded down to a multiple of the rank
// count for the operations that split it; a size too small to give each rank one element
// is left out. Bus bandwidth = algbw x bus_factor (2(n-1)/n for all-reduce, (n-1)/n for
// all-gather, reduce-scatter and all-to-all, 1 for broadcast).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <vector>

#include "model/platform.h"

namespace sgpu::bench {

enum class Collective { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kAllToAll, kBarrier };

inline constexpr Collective kAllCollectives[] = {Collective::kAllReduce,     Collective::kAllGather,
                                                 Collective::kReduceScatter, Collective::kBroadcast,
                                                 Collective::kAllToAll,      Collective::kBarrier};

std::string_view name(Collective op);  // "allreduce", "allgather", ...
std::optional<Collective> parse_collective(std::string_view text);
std::string_view dtype_name(c10::ScalarType dtype);  // "float32", "bfloat16"
std::optional<c10::ScalarType> parse_dtype(std::string_view text);
// nccl-tests' bus factor (model/platform.h's); 0 for the barrier, which moves nothing.
double bus_factor(Collective op, int world_size);
// The collective the model predicts for a benchmarked op (a barrier is NCCL's empty
// all-reduce).
sgpu::model::Collective model_collective(Collective op);

// One message size of a sweep.
struct MessageSize {
  std::int64_t bytes = 0;  // the whole buffer, as nccl-tests counts it
  std::int64_t count = 0;  // elements of that buffer

  template <class Archive>
  void serialize(Archive& archive) {
    archive(bytes, count);
  }
};

// The sizes from min_bytes to max_bytes, doubling; empty for the barrier, which has one
// entry of size 0.
std::vector<MessageSize> plan_sizes(Collective op, c10::ScalarType dtype, int world_size,
                                    std::int64_t min_bytes, std::int64_t max_bytes);

struct SweepSpec {
  Collective op = Collective::kAllReduce;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<MessageSize> sizes;
  int warmup = 5;
  int iters = 20;

  template <class Archive>
  void serialize(Archive& archive) {
    archive(op, dtype, sizes, warmup, iters);
  }
};

struct SizeTiming {
  std::int64_t bytes = 0;
  double seconds_per_op = 0;  // this rank's mean over the timed iterations
  std::int64_t wrong = 0;     // elements of the first result that differ from the expected

  template <class Archive>
  void serialize(Archive& archive) {
    archive(bytes, seconds_per_op, wrong);
  }
};

using SweepResult = std::vector<SizeTiming>;  // one per SweepSpec::sizes entry

// Runs the sweep on this rank. `device` is where tensors go ("cpu", "cuda:3").
SweepResult run_sweep(c10d::Backend& group, const SweepSpec& spec, const std::string& device);

}  // namespace sgpu::bench
