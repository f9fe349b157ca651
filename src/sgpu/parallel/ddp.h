// DistributedDataParallel: PyTorch's DDP for a libtorch module, on the rank's process group.
//
//   auto model = sgpu::parallel::DistributedDataParallel(Net());  // inside a rank
//   torch::optim::Adam optimizer(model.parameters(), 1e-3);
//   auto loss = torch::mse_loss(model.forward(x), y);
//   loss.backward();        // gradients are averaged over the ranks during backward
//   optimizer.step();
//
// Construction checks that every rank built the same model (a clear error otherwise) and
// broadcasts parameters and buffers from rank 0. Gradients are averaged by libtorch's own
// c10d::Reducer, the engine behind PyTorch's DDP: in buckets (1 MiB first, then 25 MiB)
// launched as their gradients become ready, so communication overlaps backward.
//
// no_sync() skips synchronisation for gradient accumulation: gradients of the backward
// passes under it accumulate locally, and the next synchronised backward averages the sum.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "sgpu/parallel/group.h"

namespace c10d {
class Reducer;
}

namespace sgpu::parallel {

struct DdpOptions {
  std::int64_t bucket_cap_bytes = std::int64_t{25} << 20;
  std::int64_t first_bucket_cap_bytes = std::int64_t{1} << 20;
  bool broadcast_buffers = true;        // rank 0's buffers before every forward
  bool find_unused_parameters = false;  // parameters the forward did not use are marked ready
};

namespace detail {

// The part of DDP that does not depend on the module's type.
class DdpEngine {
 public:
  DdpEngine(torch::nn::Module& module, DdpOptions options,
            c10::intrusive_ptr<c10d::ProcessGroup> group);
  ~DdpEngine();
  DdpEngine(const DdpEngine&) = delete;
  DdpEngine& operator=(const DdpEngine&) = delete;

  void before_forward();
  void after_forward(const std::vector<at::Tensor>& outputs);
  bool sync() const { return sync_; }
  void set_sync(bool sync) { sync_ = sync; }
  const c10::intrusive_ptr<c10d::ProcessGroup>& group() const { return group_; }

 private:
  torch::nn::Module& module_;
  DdpOptions options_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::vector<at::Tensor> buffers_;
  std::unique_ptr<c10d::Reducer> reducer_;
  bool sync_ = true;
};

}  // namespace detail

// M is a module holder (torch::nn::Sequential, or a TORCH_MODULE of your own).
template <class M>
class DistributedDataParallel {
 public:
  explicit DistributedDataParallel(M module, DdpOptions options = {},
                                   c10::intrusive_ptr<c10d::ProcessGroup> group = default_group())
      : module_(std::move(module)),
        engine_(std::make_unique<detail::DdpEngine>(*module_, options, std::move(group))) {}

  template <class... Args>
  auto forward(Args&&... args) {
    engine_->before_forward();
    auto output = module_->forward(std::forward<Args>(args)...);
    if constexpr (std::is_convertible_v<decltype(output), at::Tensor>) {
      engine_->after_forward({output});
    } else {
      engine_->after_forward({});
    }
    return output;
  }

  // While the guard lives, backward passes accumulate gradients without communicating.
  class NoSync {
   public:
    explicit NoSync(detail::DdpEngine& engine) : engine_(engine), was_(engine.sync()) {
      engine_.set_sync(false);
    }
    ~NoSync() { engine_.set_sync(was_); }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    detail::DdpEngine& engine_;
    bool was_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*engine_); }

  std::vector<at::Tensor> parameters() const { return module_->parameters(); }
  M& module() { return module_; }
  const M& module() const { return module_; }

 private:
  M module_;
  std::unique_ptr<detail::DdpEngine> engine_;
};

}  // namespace sgpu::parallel
