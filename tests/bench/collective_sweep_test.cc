// The collective sweep's promises: the sizes follow nccl-tests' convention, and a wrong
// result is counted on the rank that got it (nccl-tests' #wrong).
#include "collectives/collective_sweep.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "sgpu/process_group.h"
#include "sgpu/sgpu.h"

namespace {

using sgpu::bench::Collective;

// Passes every collective through, then spoils element 0 of each all-reduce on rank 1.
class CorruptingBackend final : public c10d::Backend {
 public:
  explicit CorruptingBackend(c10d::Backend& inner)
      : c10d::Backend(inner.getRank(), inner.getSize()), inner_(inner) {}
  const std::string getBackendName() const override { return "corrupting"; }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    auto work = inner_.allreduce(tensors, opts);
    work->wait();
    if (getRank() == 1) tensors[0].reshape(-1)[0].add_(1);
    return work;
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return inner_.barrier(opts);
  }

 private:
  c10d::Backend& inner_;
};

sgpu::bench::SweepResult sweep(sgpu::bench::SweepSpec spec, bool corrupt) {
  CorruptingBackend corrupting(sgpu::process_group());
  return sgpu::bench::run_sweep(
      corrupt ? static_cast<c10d::Backend&>(corrupting) : sgpu::process_group(), spec,
      sgpu::device());
}

sgpu::bench::SweepSpec allreduce_spec(c10::ScalarType dtype) {
  sgpu::bench::SweepSpec spec;
  spec.op = Collective::kAllReduce;
  spec.dtype = dtype;
  spec.sizes = sgpu::bench::plan_sizes(spec.op, dtype, 2, 8, 4096);
  spec.warmup = 1;
  spec.iters = 2;
  return spec;
}

sgpu::Options two_ranks() {
  sgpu::Options options;
  options.gpus = 2;
  options.backend = "sim";
  options.timeout = std::chrono::minutes(2);
  return options;
}

TEST(CollectiveSweep, AWrongResultIsCountedOnTheRankThatGotIt) {
  for (auto dtype : {c10::ScalarType::Float, c10::ScalarType::BFloat16}) {
    const auto spec = allreduce_spec(dtype);
    const auto ranks = sgpu::distributed(sweep, two_ranks()).distributed(spec, true);
    ASSERT_EQ(ranks.size(), 2u);
    ASSERT_EQ(ranks[1].size(), spec.sizes.size());
    for (std::size_t i = 0; i < spec.sizes.size(); ++i) {
      EXPECT_EQ(ranks[0][i].wrong, 0) << "size " << spec.sizes[i].bytes;
      EXPECT_EQ(ranks[1][i].wrong, 1) << "size " << spec.sizes[i].bytes;
      EXPECT_GT(ranks[1][i].seconds_per_op, 0);
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
    for (const auto& rank : sgpu::distributed(sweep, options).distributed(spec, false)) {
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
