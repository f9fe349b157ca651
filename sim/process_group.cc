// Gloo process groups on CPU tensors, with the fault plan's collective faults in between.
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "backend/process_group_factory.h"
#include "contract/rank_env.h"
#include "sgpu/errors.h"
#include "sim/faults.h"
#include "sim/sim_backend.h"

namespace sgpu::sim {
namespace {

// This rank's faults, set by bind() before the function runs.
struct RankFaults {
  std::vector<Fault> faults;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  std::atomic<int> collectives{0};
};

RankFaults& rank_faults() {
  static RankFaults* faults = new RankFaults;  // outlives any exit path
  return *faults;
}

// Counts collectives and applies the faults planned for them, then runs the real one.
class FaultInjectingBackend final : public c10d::Backend {
 public:
  explicit FaultInjectingBackend(c10::intrusive_ptr<c10d::Backend> inner)
      : c10d::Backend(inner->getRank(), inner->getSize()), inner_(std::move(inner)) {}

  const std::string getBackendName() const override { return inner_->getBackendName(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    before();
    return inner_->broadcast(tensors, opts);
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    before();
    return inner_->allreduce(tensors, opts);
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    before();
    return inner_->reduce(tensors, opts);
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    before();
    return inner_->allgather(outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    before();
    return inner_->_allgather_base(output, input, opts);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    before();
    return inner_->reduce_scatter(outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    before();
    return inner_->_reduce_scatter_base(output, input, opts);
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    before();
    return inner_->alltoall_base(output, input, output_splits, input_splits, opts);
  }
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    before();
    return inner_->alltoall(outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    before();
    return inner_->barrier(opts);
  }

 private:
  void before() {
    RankFaults& state = rank_faults();
    const int count = ++state.collectives;
    const auto elapsed = std::chrono::steady_clock::now() - state.started;
    for (const Fault& fault : state.faults) {
      const bool due = fault.point == Fault::Point::kStart ||
                       (fault.point == Fault::Point::kCollective &&
                        (fault.action == Fault::Action::kSlow ? count >= fault.collective
                                                              : count == fault.collective)) ||
                       (fault.point == Fault::Point::kAfter && elapsed >= fault.after);
      // Only slow faults act at every collective; the rest acted at start or act once.
      if (due &&
          (fault.action == Fault::Action::kSlow || fault.point == Fault::Point::kCollective)) {
        act(fault);
      }
    }
  }

  c10::intrusive_ptr<c10d::Backend> inner_;
};

}  // namespace

std::vector<std::string> SimBackend::rank_environment(const Options& options) const {
  std::string plan = options.sim_faults;
  if (plan.empty()) {
    const char* env = std::getenv(kFaultsVar);
    plan = env != nullptr ? env : "";
  }
  if (plan.empty()) return {};
  parse_faults(plan, options.gpus);  // ConfigError before anything starts
  return {std::string(kFaultsVar) + "=" + plan};
}

void SimBackend::bind(int device_index) const {
  const char* plan = std::getenv(kFaultsVar);
  if (plan == nullptr || *plan == '\0') return;
  const contract::RankEnvironment env = contract::read_rank_environment();
  const int rank = env.rank;
  const int world = env.world_size;
  RankFaults& state = rank_faults();
  for (const Fault& fault : parse_faults(plan, world)) {
    if (fault.rank == rank) state.faults.push_back(fault);
  }
  for (const Fault& fault : state.faults) {
    if (fault.point == Fault::Point::kStart && fault.action != Fault::Action::kSlow) act(fault);
    if (fault.point == Fault::Point::kAfter && fault.action != Fault::Action::kSlow) {
      std::thread([fault] {
        std::this_thread::sleep_for(fault.after);
        act(fault);
      }).detach();
    }
  }
}

namespace {

class GlooGroups final : public backend::ProcessGroupFactory {
 public:
  c10::intrusive_ptr<c10d::Backend> make(
      const backend::ProcessGroupRequest& request) const override;
};

c10::intrusive_ptr<c10d::Backend> GlooGroups::make(
    const backend::ProcessGroupRequest& request) const {
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->timeout = request.timeout;
  options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  c10::intrusive_ptr<c10d::Backend> gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(
      request.store, request.rank, request.world_size, options);
  if (rank_faults().faults.empty()) return gloo;
  return c10::make_intrusive<FaultInjectingBackend>(std::move(gloo));
}

}  // namespace

const backend::ProcessGroupFactory& SimBackend::process_groups() const {
  static const GlooGroups groups;
  return groups;
}

}  // namespace sgpu::sim
