// Elementwise reductions for the shared-memory transport: acc[i] = acc[i] OP x[i], in the
// tensor's own dtype, one step at a time, so that folding ranks 0, 1, ..., N-1 in order
// gives what a sequential reduction in one process gives (for half and bfloat16 each step
// rounds, as torch's own add does). Integers wrap as torch's do. The one inexact pair is
// the complex product, computed as (ac - bd, ad + bc): torch's vectorized kernel rounds
// differently, and differently again for a tensor's tail, so no fold matches it exactly.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <torch/csrc/distributed/c10d/Types.hpp>

namespace sgpu::sim::shm {

// Throws c10::Error naming the dtype and op when the pair is not supported: the bitwise
// ops on floating dtypes, min and max on complex ones, PREMUL_SUM. AVG reduces as SUM
// here; the caller divides by the world size at the end.
void check_reducible(c10::ScalarType dtype, c10d::ReduceOp::RedOpType op);

// "SUM", "AVG", ... as torch spells them after ReduceOp.
const char* reduce_op_name(c10d::ReduceOp::RedOpType op);

void combine(void* acc, const void* x, std::size_t count, c10::ScalarType dtype,
             c10d::ReduceOp::RedOpType op);

}  // namespace sgpu::sim::shm
