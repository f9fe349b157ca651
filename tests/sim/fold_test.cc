// A folded world (NOTE [A folded world] in sim/fold.h), its ranks threads of this process:
// the plan, and the law that makes folding exact: a folded group's collective gives each
// running rank what the same collective gives it unfolded, when every rank that does not run
// contributes what its stand-in contributes.
#include "sim/fold.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <vector>

#include "sgpu/errors.h"
#include "sim/shm/shm_backend.h"

namespace {

using sgpu::sim::Fold;

TEST(FoldPlan, RunsOneRankOfEachPlaceAndTheLastRankAsASecond) {
  const Fold fold = Fold::plan(64, 8);
  EXPECT_EQ(fold.running, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 63}));
  std::vector<int> world(64);
  for (int r = 0; r < 64; ++r) world[r] = r;
  EXPECT_EQ(fold.stand_in(9, world), 1);
  EXPECT_EQ(fold.stand_in(55, world), 7);
  EXPECT_EQ(fold.stand_in(63, world), 63);
  EXPECT_EQ(fold.stand_in(57, {57, 58, 63}), -1);  // no running rank of its place there
  EXPECT_EQ(Fold::plan(16, 1).running, (std::vector<int>{0, 15}));
  EXPECT_EQ(Fold::plan(64, 8, false).running.size(), 8u);  // no second of a place
  EXPECT_EQ(Fold::plan(8, 8).running.size(), 8u);          // one replica: nothing folds
  EXPECT_THROW(Fold::plan(64, 6), sgpu::ConfigError);
  EXPECT_THROW(Fold::plan(64, 0), sgpu::ConfigError);
  EXPECT_THROW(Fold::plan(8, 16), sgpu::ConfigError);
}

// What each rank contributes: a tensor that depends on its rank only.
at::Tensor contribution(int rank, std::int64_t numel) {
  return at::arange(numel, at::kDouble).mul_(0.5).add_(rank * 10 + 1);
}

// Runs body(rank, group) for each running rank of the group of `members` on its own thread,
// the groups over one store: unfolded (a plain transport of every member) when `fold` is
// null; returns each one's error text ("" for none).
using Body = std::function<void(int, c10d::Backend&)>;
std::vector<std::string> on_ranks(const std::vector<int>& members, const Fold* fold,
                                  const Body& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<int> ranks;  // the members that run
  for (int m : members) {
    if (fold == nullptr || fold->runs(m)) ranks.push_back(m);
  }
  std::vector<std::string> errors(ranks.size());
  std::vector<c10::intrusive_ptr<c10d::Backend>> groups(ranks.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        auto transport = sgpu::sim::shm::make_shm_backend(
            store, static_cast<int>(i), static_cast<int>(ranks.size()), std::chrono::seconds(60),
            sgpu::sim::shm::SegmentSizes{});
        groups[i] = fold != nullptr ? sgpu::sim::folded_group(transport, *fold, members, ranks[i])
                                    : transport;
        body(ranks[i], *groups[i]);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

// Each collective under test, run by `rank` contributing as `as`; returns what it got.
using Collective = std::function<at::Tensor(c10d::Backend&, int rank, int as)>;

at::Tensor all_gather(c10d::Backend& g, int, int as) {
  std::vector<at::Tensor> in{contribution(as, 6)};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int i = 0; i < g.getSize(); ++i) out[0].push_back(at::empty({6}, at::kDouble));
  g.allgather(out, in)->wait();
  return at::stack(out[0]);
}

at::Tensor all_gather_base(c10d::Backend& g, int, int as) {
  at::Tensor in = contribution(as, 4);
  at::Tensor out = at::empty({g.getSize() * 4}, at::kDouble);
  g._allgather_base(out, in)->wait();
  return out;
}

at::Tensor all_reduce(c10d::Backend& g, int, int as, c10d::ReduceOp op) {
  std::vector<at::Tensor> t{contribution(as, 5)};
  c10d::AllreduceOptions opts;
  opts.reduceOp = op;
  g.allreduce(t, opts)->wait();
  return t[0];
}

at::Tensor broadcast_from(c10d::Backend& g, int as, int root) {
  std::vector<at::Tensor> t{contribution(as, 3)};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  g.broadcast(t, opts)->wait();
  return t[0];
}

at::Tensor reduce_scatter(c10d::Backend& g, int, int as) {
  at::Tensor in = contribution(as, g.getSize() * 2);
  at::Tensor out = at::empty({2}, at::kDouble);
  g._reduce_scatter_base(out, in)->wait();
  return out;
}

at::Tensor all_to_all(c10d::Backend& g, int, int as) {
  at::Tensor in = contribution(as, g.getSize() * 3);
  at::Tensor out = at::empty({g.getSize() * 3}, at::kDouble);
  std::vector<int64_t> even;
  g.alltoall_base(out, in, even, even)->wait();
  return out;
}

at::Tensor scatter_from_0(c10d::Backend& g, int rank, int as) {
  std::vector<at::Tensor> out{at::empty({2}, at::kDouble)};
  std::vector<std::vector<at::Tensor>> in;
  if (rank == 0) {
    in.emplace_back();
    for (int i = 0; i < g.getSize(); ++i) in[0].push_back(contribution(as * 100 + i, 2));
  }
  c10d::ScatterOptions opts;
  opts.rootRank = 0;
  g.scatter(out, in, opts)->wait();
  return out[0];
}

// The law, for `collective`, in a world of `world` folded by `period`: each running rank gets
// folded what it gets unfolded when every rank contributes as its stand-in.
void holds_folded_as_unfolded(int world, int period, const Collective& collective) {
  const Fold fold = Fold::plan(world, period);
  std::vector<int> members(world);
  for (int r = 0; r < world; ++r) members[r] = r;
  std::vector<at::Tensor> unfolded(world), folded(world);
  auto errors = on_ranks(members, nullptr, [&](int rank, c10d::Backend& g) {
    unfolded[rank] = collective(g, rank, fold.stand_in(rank, members));
  });
  for (const std::string& e : errors) ASSERT_EQ(e, "");
  errors = on_ranks(members, &fold, [&](int rank, c10d::Backend& g) {
    EXPECT_EQ(g.getSize(), world);
    EXPECT_EQ(g.getRank(), rank);
    folded[rank] = collective(g, rank, rank);
  });
  for (const std::string& e : errors) ASSERT_EQ(e, "");
  for (int r : fold.running) {
    EXPECT_TRUE(at::equal(folded[r], unfolded[r]))
        << "rank " << r << ": " << folded[r] << " folded, " << unfolded[r] << " unfolded";
  }
}

TEST(FoldedGroup, EachCollectiveGivesWhatTheUnfoldedWorldGives) {
  for (auto [world, period] : {std::pair{12, 4}, std::pair{8, 1}}) {
    SCOPED_TRACE("world " + std::to_string(world) + ", period " + std::to_string(period));
    holds_folded_as_unfolded(world, period, all_gather);
    holds_folded_as_unfolded(world, period, all_gather_base);
    for (auto op : {c10d::ReduceOp::SUM, c10d::ReduceOp::AVG, c10d::ReduceOp::MAX}) {
      holds_folded_as_unfolded(world, period, [op](c10d::Backend& g, int rank, int as) {
        return all_reduce(g, rank, as, op);
      });
    }
    // From a root that runs, and from one that does not (its stand-in's tensor).
    for (int root : {0, world - 2}) {
      holds_folded_as_unfolded(world, period, [root](c10d::Backend& g, int, int as) {
        return broadcast_from(g, as, root);
      });
    }
    holds_folded_as_unfolded(world, period, reduce_scatter);
    holds_folded_as_unfolded(world, period, all_to_all);
    holds_folded_as_unfolded(world, period, scatter_from_0);
  }
}

TEST(FoldedGroup, WhatNoRunningRankCanStandForFailsNamingTheRank) {
  const Fold fold = Fold::plan(8, 4);  // ranks 0 to 3 run, and 7
  // The last replica's group: only rank 7 runs, and nothing of ranks 4 to 6's places.
  auto errors =
      on_ranks({4, 5, 6, 7}, &fold, [](int rank, c10d::Backend& g) { all_gather(g, rank, rank); });
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("sgpu: rank 7 of a folded world (group of 4 ranks) called a "
                           "collective where rank 4 has no running rank of its place in the "
                           "group"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[0].find("Run this world unfolded"), std::string::npos);
  std::vector<int> world{0, 1, 2, 3, 4, 5, 6, 7};
  errors = on_ranks(world, &fold, [](int rank, c10d::Backend& g) {
    std::vector<at::Tensor> t{at::zeros({1})};
    if (rank == 0) g.send(t, 5, 0)->wait();
  });
  EXPECT_NE(errors[0].find("called a send to rank 5, which does not run"), std::string::npos)
      << errors[0];
}

}  // namespace
