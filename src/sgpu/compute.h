// What a call's compute would take on the node it pretends to be, per rank: in shape-only
// compute (Options::sim.compute "shapes") each operator a rank runs on its GPU is timed
// by the platform's roofline from its FLOPs and the bytes it moves (NOTE [The compute
// model] in model/platform.h), beside the collective model's times (sgpu/comm.h).
//
//   const sgpu::ComputeStats& rank0 = launch.compute_stats().at(0);
//   rank0.total().predicted_seconds;       // on rank0.platform
//   rank0.ops.at("aten.mm").flops;
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace sgpu {

struct ComputeTotals {
  std::int64_t count = 0;  // operators timed
  double flops = 0;        // floating-point operations (torch's flop counter's formulas)
  double bytes = 0;        // read and written in the GPU's memory
  double predicted_seconds = 0;

  bool operator==(const ComputeTotals&) const = default;
};

// The end of a training step, as the program marked it (sgpu.step() in Python): how far the
// rank's step timeline had got (NOTE [The step's timeline] in model/kernels.h), with its
// collectives and without them, and what the program said the step held.
struct StepMark {
  double end = 0;          // the step timeline's end
  double compute_end = 0;  // the same with every collective taking no time
  double tokens = 0;       // the tokens this rank's step processed; 0 where not said
  double model_flops = 0;  // the model's FLOPs in this rank's step (for MFU); 0 where not said

  bool operator==(const StepMark&) const = default;
};

// One rank's operators in one call.
struct ComputeStats {
  // The node the times are predicted for ("h100-nvswitch"); "" when nothing was timed.
  std::string platform;
  // Operator ("aten.mm", "aten._scaled_dot_product_flash_attention", ...) to totals. An
  // operator's predicted_seconds are how far it moves the end of the compute's own
  // critical path (NOTE [The step's timeline] in model/kernels.h).
  std::map<std::string, ComputeTotals> ops;
  // How much later the step ends for its collectives: the part of their time that compute
  // does not hide, as the program's streams and waits let it.
  double exposed_collective_seconds = 0;
  // The part of predicted_seconds in matmul and attention kernels of a dtype that the
  // platform's kernel model was not held to measured runs of (model/kernels.h): where it
  // is large, the estimate has no error bound.
  double unvalidated_seconds = 0;
  // The ends of the steps the program marked, in order.
  std::vector<StepMark> steps;

  ComputeTotals total() const {
    ComputeTotals sum;
    for (const auto& [op, t] : ops) {
      sum.count += t.count;
      sum.flops += t.flops;
      sum.bytes += t.bytes;
      sum.predicted_seconds += t.predicted_seconds;
    }
    return sum;
  }
};

}  // namespace sgpu
