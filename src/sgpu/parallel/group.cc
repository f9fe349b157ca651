#include "sgpu/parallel/group.h"

#include <torch/utils.h>

#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/comm.hpp>

#include "sgpu/process_group.h"
#include "sgpu/runtime.h"

namespace sgpu::parallel {

c10::intrusive_ptr<c10d::ProcessGroup> default_group() {
  static std::once_flag once;
  static c10::intrusive_ptr<c10d::ProcessGroup>* group = nullptr;  // lives to the rank's end
  c10d::Backend& backend = process_group();                        // throws outside a rank
  std::call_once(once, [&backend] {
    auto owned = c10::intrusive_ptr<c10d::Backend>::unsafe_reclaim_from_nonowning(&backend);
    auto made = c10::make_intrusive<c10d::ProcessGroup>(global_rank(), world_size());
    const bool nccl = backend.getBackendName() == "nccl";
    const auto type =
        nccl ? c10d::ProcessGroup::BackendType::NCCL : c10d::ProcessGroup::BackendType::GLOO;
    made->setBackend(nccl ? c10::DeviceType::CUDA : c10::DeviceType::CPU, type, owned);
    made->setDefaultBackend(type);
    group = new c10::intrusive_ptr<c10d::ProcessGroup>(std::move(made));
  });
  return *group;
}

std::string describe_rank(const c10d::ProcessGroup& group) {
  return "rank " + std::to_string(group.getRank()) + " of " + std::to_string(group.getSize());
}

void broadcast_from_rank0(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                          std::vector<at::Tensor> tensors) {
  constexpr std::int64_t kBucketBytes = std::int64_t{250} << 20;  // as PyTorch's DDP
  if (tensors.empty()) return;
  torch::NoGradGuard no_grad;
  c10d::broadcast_coalesced(group, tensors, kBucketBytes, 0);
}

std::int64_t padded_to(std::int64_t numel, std::int64_t world) {
  return (numel + world - 1) / world * world;
}

at::Tensor flatten_padded(const std::vector<at::Tensor>& tensors, std::int64_t padded_numel) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> parts;
  for (const auto& t : tensors) parts.push_back(t.detach().reshape(-1));
  at::Tensor flat = at::cat(parts);
  if (padded_numel > flat.numel()) {
    flat = at::cat({flat, at::zeros({padded_numel - flat.numel()}, flat.options())});
  }
  return flat;
}

at::Tensor take_grads_flat(std::vector<at::Tensor>& params, std::int64_t padded_numel,
                           const at::TensorOptions& options) {
  at::Tensor flat = at::zeros({padded_numel}, options.requires_grad(false));
  std::int64_t offset = 0;
  for (auto& p : params) {
    if (p.grad().defined()) {
      flat.narrow(0, offset, p.numel()).copy_(p.grad().reshape(-1));
      p.mutable_grad().reset();
    }
    offset += p.numel();
  }
  return flat;
}

void accumulate_grad(at::Tensor& leaf, const at::Tensor& grad) {
  if (leaf.grad().defined()) {
    leaf.mutable_grad().add_(grad);
  } else {
    leaf.mutable_grad() = grad;
  }
}

}  // namespace sgpu::parallel
