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

  bool operator==(const CollectiveTotals&) const = default;
};

// One rank's collectives (and sends and receives) in one call.
struct CommStats {
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
      }
    }
    return out;
  }
};

}  // namespace sgpu
