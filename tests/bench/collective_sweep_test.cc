// The collective sweep's promises: the sizes follow nccl-tests' convention, and a wrong
// result is counted on the rank that got it (nccl-tests' #wrong).
#include "collectives/collective_sweep.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "sgpu/process_group.h"
#include "sgpu/sgpu.h"
#include "testing/sim_options.h"

namespace {

using sgpu::bench::Collective;

// The inner work; each wait spoils element 0 of the result on rank 1 (some of Gloo's
// works copy their result out on every wait, as reduce-scatter's does).
class SpoilingWork final : public c10d::Work {
 public:
  SpoilingWork(c10::intrusive_ptr<c10d::Work> inner, at::Tensor result, bool spoil)
      : inner_(std::move(inner)), result_(std::move(result)), spoil_(spoil) {}
  bool wait(std::chrono::milliseconds timeout) override {
    inner_->wait(timeout);
    if (spoil_ && result_.numel() > 0) result_.reshape(-1)[0].add_(1);
    return true;
  }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  at::Tensor result_;
  bool spoil_;
};

// Passes every collective the sweep issues through; rank 1's results come back spoiled.
class CorruptingBackend final : public c10d::Backend {
 public:
  explicit CorruptingBackend(c10d::Backend& inner)
      : c10d::Backend(inner.getRank(), inner.getSize()), inner_(inner) {}
  const std::string getBackendName() const override { return "corrupting"; }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    return spoiled(inner_.allreduce(tensors, opts), tensors[0]);
  }
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    return spoiled(inner_.broadcast(tensors, opts), tensors[0]);
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    return spoiled(inner_._allgather_base(output, input, opts), output);
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    return spoiled(inner_._reduce_scatter_base(output, input, opts), output);
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    return spoiled(inner_.alltoall_base(output, input, output_splits, input_splits, opts), output);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return inner_.barrier(opts);
  }

 private:
  c10::intrusive_ptr<c10d::Work> spoiled(c10::intrusive_ptr<c10d::Work> work,
                                         const at::Tensor& result) {
    return c10::make_intrusive<SpoilingWork>(std::move(work), result, getRank() == 1);
  }

  c10d::Backend& inner_;
};

sgpu::bench::SweepResult sweep(sgpu::bench::SweepSpec spec, bool corrupt) {
  CorruptingBackend corrupting(sgpu::process_group());
  return sgpu::bench::run_sweep(
      corrupt ? static_cast<c10d::Backend&>(corrupting) : sgpu::process_group(), spec,
      sgpu::device());
}

sgpu::bench::SweepSpec spec_of(Collective op, c10::ScalarType dtype) {
  sgpu::bench::SweepSpec spec;
  spec.op = op;
  spec.dtype = dtype;
  spec.sizes = sgpu::bench::plan_sizes(spec.op, dtype, 2, 8, 4096);
  spec.warmup = 1;
  spec.iters = 2;
  return spec;
}

sgpu::Options two_ranks() {
  sgpu::Options options = sgpu::testing::sim(2);
  options.timeout = std::chrono::minutes(2);
  return options;
}

TEST(CollectiveSweep, AWrongResultIsCountedOnTheRankThatGotItForEveryOperation) {
  for (Collective op : sgpu::bench::kAllCollectives) {
    if (op == Collective::kBarrier) continue;  // no result to check
    for (auto dtype : {c10::ScalarType::Float, c10::ScalarType::BFloat16}) {
      const auto spec = spec_of(op, dtype);
      const auto ranks = sgpu::distributed(sweep, two_ranks()).distributed(spec, true);
      ASSERT_EQ(ranks.size(), 2u);
      ASSERT_EQ(ranks[0].size(), spec.sizes.size()) << sgpu::bench::name(op);
      ASSERT_EQ(ranks[1].size(), spec.sizes.size()) << sgpu::bench::name(op);
      for (std::size_t i = 0; i < spec.sizes.size(); ++i) {
        EXPECT_EQ(ranks[0][i].wrong, 0) << sgpu::bench::name(op) << " " << spec.sizes[i].bytes;
        EXPECT_EQ(ranks[1][i].wrong, 1) << sgpu::bench::name(op) << " " << spec.sizes[i].bytes;
        EXPECT_GT(ranks[1][i].seconds_per_op, 0);
      }
    }
  }
}

TEST(CollectiveSweep, EveryOperationIsRightOnThreeRanks) {
  auto options = two_ranks();
  options.gpus = 3;  // not a power of two: split operations round down
  for (Collective op : sgpu::bench::kAllCollectives) {
    sgpu::bench::SweepSpec spec;
    spec.op = op;
    spec.dtype = c10::ScalarType::BFloat16;
    spec.sizes = sgpu::bench::plan_sizes(op, spec.dtype, 3, 2, 1024);
    spec.warmup = 0;
    spec.iters = 1;
    const auto ranks = sgpu::distributed(sweep, options).distributed(spec, false);
    ASSERT_EQ(ranks.size(), 3u);
    for (const auto& rank : ranks) {
      ASSERT_EQ(rank.size(), spec.sizes.size()) << sgpu::bench::name(op);
      for (const auto& timing : rank) EXPECT_EQ(timing.wrong, 0) << sgpu::bench::name(op);
    }
  }
}

RC_GTEST_PROP(PlanSizes, FollowNcclTestsConvention, ()) {
  const int world = *rc::gen::inRange(1, 65);
  const auto dtype = *rc::gen::element(c10::ScalarType::Float, c10::ScalarType::BFloat16);
  const auto op = *rc::gen::elementOf(std::vector<Collective>(
      std::begin(sgpu::bench::kAllCollectives), std::end(sgpu::bench::kAllCollectives)));
  const std::int64_t min = *rc::gen::inRange<std::int64_t>(1, 1 << 20);
  const std::int64_t max = min * *rc::gen::inRange<std::int64_t>(1, 1 << 10);
  const auto sizes = sgpu::bench::plan_sizes(op, dtype, world, min, max);
  if (op == Collective::kBarrier) {
    RC_ASSERT(sizes.size() == 1u);
    return;
  }
  const std::int64_t element = dtype == c10::ScalarType::Float ? 4 : 2;
  const bool split = op == Collective::kAllGather || op == Collective::kReduceScatter ||
                     op == Collective::kAllToAll;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    RC_ASSERT(sizes[i].count >= 1);
    RC_ASSERT(sizes[i].bytes == sizes[i].count * element);
    RC_ASSERT(sizes[i].bytes <= max);
    if (split) RC_ASSERT(sizes[i].count % world == 0);
    if (i > 0) RC_ASSERT(sizes[i].bytes > sizes[i - 1].bytes);
  }
  // Every doubling from min to max that holds an element per rank is there.
  std::int64_t expected = 0;
  for (std::int64_t b = min; b <= max; b *= 2) {
    expected += (b / element) / (split ? world : 1) > 0;
  }
  RC_ASSERT(static_cast<std::int64_t>(sizes.size()) == expected);
}

}  // namespace
