// A call's communication accounting (NOTE [Communication accounting]): each rank's totals
// from its collective ring, as the caller reports them (Launch::comm_stats(), the line at
// the end of a call) and as the rank logs them to the call's run.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "contract/collective_ring.h"
#include "model/kernels.h"
#include "sgpu/comm.h"
#include "sgpu/compute.h"
#include "sgpu/memory.h"

namespace sgpu::rank {

// The ring's totals per group and op; empty without a ring.
CommStats comm_stats_of(const std::optional<contract::RingSnapshot>& ring);

// "sgpu: collectives (the most of any rank): all_reduce 1875 calls, 4.58 MiB, 0.410 s
// (0.023147 s on h100-nvswitch); ...\n" (the part in brackets when a platform predicted);
// "" when no rank made any. `whose` names the ranks ("any rank"; over several nodes "any
// rank of this node", since each node sees its own).
std::string comm_summary(const std::vector<CommStats>& ranks,
                         const std::string& whose = "any rank");

// "sgpu: peak memory of each rank's GPU, reserved and allocated: ranks 0-6 26.74 and 20.08
// GiB; rank 7 26.74 and 20.09 GiB; rank 511 26.77 and 20.08 GiB\n": consecutive ranks with the
// same peaks (to the byte) said once; `ranks` names each of `memory`'s, in order; "" when no
// rank has both peaks.
std::string memory_summary(const std::vector<MemoryStats>& memory, const std::vector<int>& ranks);

// sgpu.comm.<op>.count, .bytes, .seconds and (with a platform) .predicted_seconds, every
// group added up.
std::map<std::string, double> comm_metrics(const CommStats& stats);

// In a rank: one operator on its GPU, timed on the rank's platform (NOTE [The compute
// model], NOTE [The kernel model]; counted untimed without one): its predicted_seconds are
// how far it moves the end of the rank's GPU timeline, its kernel and the GPU's wait for
// the host to issue it. Thread-safe; operators are in the timeline in the order counted.
void count_compute(const std::string& op, const std::string& dtype, double flops, double bytes,
                   const model::KernelShape& shape = {});
// What count_compute added up so far in this rank; empty when nothing was counted.
ComputeStats rank_compute_stats();

// In a rank: the end of a training step the program marks (sgpu.step()), where the rank's
// step timeline has got to, with the tokens and the model's FLOPs of the rank's step as the
// program says them (0: not said). Thread-safe.
void mark_step(double tokens, double model_flops);

// A marked step's predicted figures, from the mark before it (the rank's start for the
// first): how long it takes, its compute's own critical path, and how much its collectives
// add to that.
struct StepFigures {
  double seconds = 0;
  double compute_seconds = 0;
  double exposed_collective_seconds = 0;
  double tokens = 0;
  double model_flops = 0;
};
// The last marked step's figures; std::nullopt when the program marked none.
std::optional<StepFigures> last_step(const ComputeStats& compute);

// "sgpu: steps (the slowest of any rank): 3 marked; the last 2.912 s on h100-nvswitch
// (compute 2.601 s, exposed collectives 0.311 s), 5,630 tokens/s per GPU, MFU 36%; typical
// error ...\n": the rank whose last marked step is the slowest, its tokens per second and
// MFU where the program said its tokens and FLOPs; "" where no rank marked a step on a
// platform.
std::string step_summary(const std::vector<ComputeStats>& compute,
                         const std::string& whose = "any rank");

// "sgpu: compute (the most of any rank): 4210 operators, 96.31 TFLOP, 412.55 GiB of memory
// traffic, 0.210 s on h100-nvswitch; with the collectives' 0.233 s (0.031 s of them exposed),
// 0.241 s\n": the step, each rank's compute and the part of its collectives compute does
// not hide (NOTE [The step's timeline]);
// "" when no rank timed anything. `comm` is by rank, as `compute`.
std::string compute_summary(const std::vector<ComputeStats>& compute,
                            const std::vector<CommStats>& comm,
                            const std::string& whose = "any rank");

// sgpu.compute.count, .flops, .bytes, .predicted_seconds, .exposed_collective_seconds, and
// sgpu.predicted_seconds: the compute's and the exposed collectives' predicted times added
// up; with marked steps, sgpu.step.count and the last step's sgpu.step.predicted_seconds,
// .exposed_collective_seconds, .tokens_per_second and .mfu (those the program said the
// figures for); empty when nothing was timed.
std::map<std::string, double> compute_metrics(const ComputeStats& compute);

// Where rank `second_rank` did not call the collectives rank `first_rank` called, from what
// each recorded (a folded world's second of a place against node 0's rank of that place:
// NOTE [A folded world] in sim/fold.h), group by group in the order each made its groups (the
// group's size, each op's count and bytes); "" where they are alike or a ring is missing.
std::string collective_difference(int first_rank, int second_rank,
                                  const std::optional<contract::RingSnapshot>& first,
                                  const std::optional<contract::RingSnapshot>& second);

// Where the two ranks' memory peaks (allocated, reserved) differ, each named with both
// figures, "; " between them; "" where they are the same.
std::string memory_difference(int first_rank, int second_rank, const MemoryStats& first,
                              const MemoryStats& second);

}  // namespace sgpu::rank
