// What a call's collectives added up to, per rank, process group and op: exact on any
// backend, so that a change which turns off DDP's bucketing, gathers FSDP's units twice or
// moves gradients in float32 instead of bfloat16 shows as a different count or byte total
// even where timings are noise (NOTE [Communication accounting] in
// contract/collective_ring.h).
//
//   auto launch = sgpu::distributed(train, options).launch(steps);
//   launch.wait();
//   const sgpu::CommStats& rank0 = launch.comm_stats().at(0);
//   rank0.by_op().at("all_reduce").bytes;
//   rank0.by_op().at("all_reduce").predicted_seconds;  // on rank0.platform
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace sgpu {

struct CollectiveTotals {
  std::int64_t count = 0;  // collectives the rank entered
  // Their message sizes summed, in nccl-tests' terms (algbw's numerator): an all-reduce's
  // buffer, an all-gather's whole output, a reduce-scatter's whole input.
  std::int64_t bytes = 0;
  double seconds = 0;  // from entering each to its end, of those that ended
  // What they would take on CommStats::platform (NOTE [The collective model] in
  // model/platform.h): each collective's predicted time, summed; 0 without a platform.
  double predicted_seconds = 0;

  bool operator==(const CollectiveTotals&) const = default;
};

// One rank's collectives (and sends and receives) in one call.
struct CommStats {
  // The node the predicted times are for ("h100-nvswitch"): a simulated node's platform,
  // or SGPU_PLATFORM's; "" when nothing was predicted.
  std::string platform;
  // Process group ("world", "ranks 0,2") to op ("all_reduce", "all_gather_into_tensor",
  // "send", ...) to totals; ops the rank never called are left out.
  std::map<std::string, std::map<std::string, CollectiveTotals>> groups;

  // Every group's totals added up, per op.
  std::map<std::string, CollectiveTotals> by_op() const {
    std::map<std::string, CollectiveTotals> out;
    for (const auto& [group, ops] : groups) {
      for (const auto& [op, t] : ops) {
        CollectiveTotals& sum = out[op];
        sum.count += t.count;
        sum.bytes += t.bytes;
        sum.seconds += t.seconds;
        sum.predicted_seconds += t.predicted_seconds;
      }
    }
    return out;
  }
};

}  // namespace sgpu
