// NOTE [A folded world]
// In shape-only compute a world of many ranks can run as a few processes: the ranks that a
// program treats alike share one process, which stands for all of them. The classes are
// the places in a replica: with a period P (the size of one replica), ranks r and s are
// alike when r % P == s % P. Ranks 0 to P-1 run, one for each class, and, where the plan
// asks for one, the last rank of the world, a second of its class, so that what the program
// does on one rank of a class can be held against another. The launcher folds a simulated
// world's nodes (sim_fold, nodes::folds_nodes): P is a node's ranks, node 0's run, each
// standing for its place on every node, and the world's last rank runs as a second, whose
// collectives the launcher holds against node 0's rank of its place at the end: where they
// differ the call fails; where only the memory peaks differ (uneven shards), the second's
// are its own and the summary says so (docs/simulation.md, "A folded world"). In shape-only
// compute the running members of a group agree on each collective through its transport
// (MovingNoBytes), so the second's groups need no stand-ins for fake tensors.
//
// A folded group (folded_group()) is a group of the world as its ranks see it: its size and
// ranks are the world's, and its transport connects only its members that run. A collective
// on data completes as it would with every member there, each member that does not run
// contributing what its stand-in (the running rank of its class in the group) contributes:
// an all-gather's slot of rank 9 holds rank 1's tensor when P is 8, an all-reduce sums
// every member's, stand-ins counted once for each rank they stand for. Operations on fake
// tensors never reach it (MovingNoBytes completes them above it, once the running members
// agree on what they called, through the folded group's all-gather). What no running member
// of a group can stand for (a member whose class has no running rank in the group, a
// transfer to a rank that does not run, a scatter from one) fails naming the rank, the group
// and what to do: run without folding.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <vector>

namespace sgpu::sim {

struct Fold {
  int world = 0;
  int period = 0;            // ranks r and s are alike when r % period == s % period
  std::vector<int> running;  // the ranks that run, ascending

  // ConfigError unless 1 <= period <= world and period divides world. With
  // `second_of_a_place` false, the first replica's ranks alone run.
  static Fold plan(int world, int period, bool second_of_a_place = true);
  bool runs(int rank) const;
  // The ranks of `members` (global ranks) that run, in `members`' order.
  std::vector<int> running_of(const std::vector<int>& members) const;
  // The running rank that stands for `rank` among `members` (global ranks): itself if it
  // runs, else the first running member of its class in `members`' order; -1 when no
  // running member is of its class.
  int stand_in(int rank, const std::vector<int>& members) const;
};

// Rank `rank` (a global rank, one of `members`, running) of the group of `members` (global
// ranks, in the group's order) in world `fold`, over `transport`: a group of the members
// that run, in the same order, ready to use.
c10::intrusive_ptr<c10d::Backend> folded_group(c10::intrusive_ptr<c10d::Backend> transport,
                                               const Fold& fold, std::vector<int> members,
                                               int rank);

}  // namespace sgpu::sim
