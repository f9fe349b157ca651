// The compute estimate of a C++ function's rank computing values on sim (NOTE [The compute
// model]): each aten operator that runs a kernel of its own, seen through libtorch's
// RecordFunction, timed into the rank's account (rank/accounting.h) as shape-only
// compute times a Python rank's (sgpu/_shapes.py): each outermost operator, the rank's
// own call (aten::linear, not the addmm it runs), is one kernel: the bytes of its tensors
// in and out, and its FLOPs (matmuls, convolutions, attention; its own formula's, or those
// of the operators inside it that have one). Views and allocations run no kernel.
#pragma once

#include <string>
#include <vector>

namespace sgpu::rank {

// From now on, in every thread of this process. Once; later calls do nothing.
void time_operators();

// The FLOPs of one operator from its name ("aten::mm") and its tensors' sizes (inputs in
// order, then outputs; an argument that is not a tensor has no sizes), torch's flop
// counter's formulas; 0 for an operator without one.
double operator_flops(const std::string& name, const std::vector<std::vector<long>>& inputs,
                      const std::vector<std::vector<long>>& outputs);

}  // namespace sgpu::rank
