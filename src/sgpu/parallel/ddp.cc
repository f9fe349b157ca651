#include "sgpu/parallel/ddp.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <string>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <tuple>
#include <unordered_map>

#include "sgpu/errors.h"

namespace sgpu::parallel::detail {

DdpEngine::DdpEngine(torch::nn::Module& module, DdpOptions options,
                     c10::intrusive_ptr<c10d::ProcessGroup> group)
    : module_(module), options_(options), group_(std::move(group)) {
  std::vector<at::Tensor> params;
  std::unordered_map<size_t, std::string> names;
  for (const auto& item : module_.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    names.emplace(params.size(), item.key());
    params.push_back(item.value());
  }
  buffers_ = module_.buffers();
  try {
    c10d::verify_params_across_processes(group_, params, std::nullopt);
  } catch (const c10::Error& e) {
    throw Error("sgpu DistributedDataParallel, " + describe_rank(*group_) +
                ": the model differs between ranks (" + e.what_without_backtrace() +
                "); every rank must build the same model, with the same parameters in the same "
                "order, shapes and dtypes");
  }
  // Rank 0's parameters and buffers, on every rank.
  std::vector<at::Tensor> state = params;
  state.insert(state.end(), buffers_.begin(), buffers_.end());
  broadcast_from_rank0(group_, state);
  if (params.empty()) return;  // nothing to average

  // Buckets as PyTorch's DDP makes them: by size, in reverse order of the parameters,
  // since backward produces the last layer's gradients first.
  const std::vector<size_t> caps{static_cast<size_t>(options_.first_bucket_cap_bytes),
                                 static_cast<size_t>(options_.bucket_cap_bytes)};
  const std::vector<bool> sparse(params.size(), false);
  auto [buckets, limits] = c10d::compute_bucket_assignment_by_size(params, caps, sparse);
  std::reverse(buckets.begin(), buckets.end());
  std::vector<std::int64_t> cap_list(limits.rbegin(), limits.rend());
  reducer_ = std::make_unique<c10d::Reducer>(
      params, std::move(buckets), group_, sparse, options_.bucket_cap_bytes,
      options_.find_unused_parameters, /*gradient_as_bucket_view=*/false, std::move(names),
      options_.first_bucket_cap_bytes, /*skip_all_reduce_unused_params=*/false,
      /*use_python_reducer=*/false, std::move(cap_list));
}

DdpEngine::~DdpEngine() = default;

void DdpEngine::before_forward() {
  const bool training = torch::GradMode::is_enabled();
  if (reducer_ && training) {
    // After the first iteration the Reducer reorders its buckets to the order in which
    // gradients became ready; a no-op after that.
    reducer_->rebuild_buckets();
  }
  if (options_.broadcast_buffers && sync_) broadcast_from_rank0(group_, buffers_);
  if (reducer_) reducer_->prepare_for_forward();
}

void DdpEngine::after_forward(const std::vector<at::Tensor>& outputs) {
  if (!reducer_ || !torch::GradMode::is_enabled() || !sync_) return;
  reducer_->prepare_for_backward(options_.find_unused_parameters ? outputs
                                                                 : std::vector<at::Tensor>{});
}

}  // namespace sgpu::parallel::detail
