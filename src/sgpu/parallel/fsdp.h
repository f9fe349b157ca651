// FullyShardedDataParallel (full shard): each rank keeps 1/N of every unit's parameters,
// gradients and optimizer state.
//
//   auto model = sgpu::parallel::FullyShardedDataParallel(net);   // inside a rank
//   torch::optim::Adam optimizer(model.parameters(), 1e-3);       // the rank's shards
//   auto loss = torch::mse_loss(model.forward(x), y);
//   loss.backward();                                               // grads reduce-scattered
//   optimizer.step();
//
// A unit is a submodule whose parameters are flattened into one buffer, padded to a
// multiple of the world size and split into equal shards. By default every direct child
// with parameters is a unit, and the root's own parameters form one more. The module's
// parameters view the unit's gathered buffer, whose memory exists only while the unit
// runs: it is all-gathered before the unit's forward and released after it, and gathered
// again when backward reaches the unit. Once backward has accumulated the gradient of
// every parameter of a unit, the unit's gradients are reduce-scattered (while backward
// goes on to the units before it) and the unit is released; at most two reduce-scatters
// are in flight, and each is averaged into its shard's gradient. When backward ends, the
// units some of whose parameters got no gradient are reduce-scattered too. For
// torch::nn::Sequential the units are gathered one at a time, just before each runs; for
// other modules all units are gathered when forward starts and released when it ends.
// Between steps a rank holds its shards only, and the module's own parameters hold no
// memory: read them through full_state_dict().
//
// Construction broadcasts rank 0's parameters and buffers first (sync_module_states).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "sgpu/parallel/group.h"
#include "sgpu/parallel/sharded_state.h"

namespace sgpu::parallel {

struct FsdpOptions {
  bool sync_module_states = true;  // broadcast rank 0's parameters and buffers first
};

// What one rank holds of one unit: elements [shard_offset, shard_offset + data.numel())
// of the unit's padded flat buffer, whose parameters are `params` (offsets in the
// unit's unsharded flat buffer).
struct UnitShard {
  std::vector<FlatParamInfo> params;
  std::int64_t flat_numel = 0;    // unpadded
  std::int64_t padded_numel = 0;  // a multiple of the world size
  std::int64_t shard_offset = 0;
  at::Tensor data;  // the shard, the leaf the optimizer updates
};

using StateDict = std::map<std::string, at::Tensor>;

namespace detail {

class FsdpEngine {
 public:
  FsdpEngine(torch::nn::Module& root, const std::vector<std::shared_ptr<torch::nn::Module>>& units,
             FsdpOptions options, c10::intrusive_ptr<c10d::ProcessGroup> group);
  ~FsdpEngine();  // removes its hooks from the module's parameters
  FsdpEngine(const FsdpEngine&) = delete;
  FsdpEngine& operator=(const FsdpEngine&) = delete;

  // The units of module and its descendants (children), or of module itself only.
  std::vector<int> units_in(const torch::nn::Module& module, bool children) const;
  void gather(int unit);
  void gather_all();
  void free(int unit);
  void free_all();
  // After `units` ran forward with gradients into `output`: frees them, and gathers them
  // again when backward reaches output.
  void after_unit_forward(const std::vector<int>& units, at::Tensor& output);
  // After a forward with gradients: settle the reduce-scatters when its backward ends.
  void expect_backward(at::Tensor& output);
  // Backward accumulated the gradient of one more parameter of `unit`.
  void grad_accumulated(int unit);

  std::vector<at::Tensor> parameters() const;
  const std::vector<UnitShard>& shards() const { return units_; }
  ShardedState sharded_state(const torch::nn::Module& root, torch::optim::Optimizer* optimizer);
  StateDict full_state_dict(bool rank0_only);
  void load_full_state_dict(const StateDict& state);

 private:
  // Reduce-scatters the unit's gradients (asynchronously) and releases the unit.
  void reduce_unit(int unit);
  // Waits for the oldest reduce-scatter and adds its average to the shard's gradient.
  void settle_oldest();
  void finish_backward();

  struct InFlight {
    int unit;
    at::Tensor input;  // kept alive until the collective is done
    at::Tensor output;
    c10::intrusive_ptr<c10d::Work> work;
  };

  torch::nn::Module& root_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::vector<UnitShard> units_;
  std::vector<std::vector<at::Tensor>> module_params_;  // per unit, the module's tensors
  std::vector<const torch::nn::Module*> unit_modules_;  // per unit; nullptr for the root's
  std::vector<at::Tensor> full_;  // per unit, the gathered buffer the parameters view
  std::vector<bool> gathered_;
  // This backward: per unit, parameters whose gradient was accumulated, and whether its
  // reduce-scatter was issued.
  std::vector<std::size_t> accumulated_;
  std::vector<bool> reduced_;
  std::deque<InFlight> in_flight_;
};

}  // namespace detail

template <class M>
class FullyShardedDataParallel {
 public:
  // units: submodules of module to shard as units; empty: every direct child with
  // parameters. Parameters in no unit form one more unit.
  explicit FullyShardedDataParallel(M module,
                                    std::vector<std::shared_ptr<torch::nn::Module>> units = {},
                                    FsdpOptions options = {},
                                    c10::intrusive_ptr<c10d::ProcessGroup> group = default_group())
      : module_(std::move(module)),
        engine_(std::make_unique<detail::FsdpEngine>(*module_, units, options, std::move(group))) {}

  template <class... Args>
  auto forward(Args&&... args) {
    if constexpr (std::is_same_v<M, torch::nn::Sequential>) {
      return forward_sequential(std::forward<Args>(args)...);
    } else {
      engine_->gather_all();
      auto output = module_->forward(std::forward<Args>(args)...);
      if constexpr (std::is_same_v<decltype(output), at::Tensor>) {
        if (torch::GradMode::is_enabled())
          engine_->after_unit_forward(engine_->units_in(*module_, true), output);
      }
      finish_forward(output);
      return output;
    }
  }

  // The rank's shards: what the optimizer updates.
  std::vector<at::Tensor> parameters() const { return engine_->parameters(); }
  const std::vector<UnitShard>& shards() const { return engine_->shards(); }
  // For checkpoints (NOTE [Sharded state]): each unit's shard, sharded, and the module's
  // buffers, replicated; `optimizer` (given the shards) is saved and restored with them.
  ShardedState sharded_state(torch::optim::Optimizer* optimizer = nullptr) {
    return engine_->sharded_state(*module_, optimizer);
  }
  // Every parameter and buffer, unsharded, by name; on rank 0 only when rank0_only (other
  // ranks get an empty dict). Every rank must call it.
  StateDict full_state_dict(bool rank0_only = true) { return engine_->full_state_dict(rank0_only); }
  // Every rank passes the full state; each keeps its shards.
  void load_full_state_dict(const StateDict& state) { engine_->load_full_state_dict(state); }
  M& module() { return module_; }

 private:
  template <class Output>
  void finish_forward(Output& output) {
    if (!torch::GradMode::is_enabled()) {
      engine_->free_all();
    } else if constexpr (std::is_same_v<Output, at::Tensor>) {
      engine_->expect_backward(output);
    } else {
      static_assert(std::is_same_v<Output, at::Tensor>,
                    "FullyShardedDataParallel needs a forward that returns a tensor when it "
                    "trains, to know when backward ends");
    }
  }

  at::Tensor forward_sequential(at::Tensor input) {
    at::Tensor x = std::move(input);
    const bool grad = torch::GradMode::is_enabled();
    const std::vector<int> root_units = engine_->units_in(*module_, /*children=*/false);
    for (const int unit : root_units) engine_->gather(unit);
    // Units gathered one at a time, each just before it runs.
    for (auto& child : *module_) {
      const std::vector<int> units = engine_->units_in(*child.ptr(), /*children=*/true);
      for (const int unit : units) engine_->gather(unit);
      x = child.forward(x);
      if (!grad) {
        for (const int unit : units) engine_->free(unit);
      } else {
        engine_->after_unit_forward(units, x);
      }
    }
    finish_forward(x);
    return x;
  }

  M module_;
  std::unique_ptr<detail::FsdpEngine> engine_;
};

}  // namespace sgpu::parallel
