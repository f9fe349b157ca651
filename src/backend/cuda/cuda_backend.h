// The real backend: the node's NVIDIA GPUs.
//
// Detection loads the CUDA driver (libcuda.so.1) at run time, so a binary built with CUDA
// still starts on a machine without a driver and reports no GPU, with the reason. The
// driver honours CUDA_VISIBLE_DEVICES. Device names are normalised through
// backend/gpu_type.h. Binding (set the device) and process groups (NCCL) live in a module
// linked against libtorch's CUDA part (process_group.cc -> libsgpu_cuda_runtime.so),
// loaded by the rank that binds: simulated ranks and machines without CUDA libraries
// never load it. SGPU_CUDA_MODULE overrides where it is looked for.
#pragma once

#include "sgpu/config.h"

#if !SGPU_WITH_CUDA
#error "src/backend/cuda is built only with SGPU_WITH_CUDA=1"
#endif

#include <memory>

#include "backend/backend.h"
#include "contract/rank_env.h"

namespace sgpu::cuda {

class CudaBackend final : public backend::Backend {
 public:
  std::string_view name() const override { return contract::kCudaBackend; }
  backend::Inventory inventory(const Options& options) const override;
  std::string device(int device_index) const override {
    return "cuda:" + std::to_string(device_index);
  }
  // Sets the rank's device; with SGPU_CUDA_MEMORY_FRACTION=F (0 < F <= 1) the caching
  // allocator may take only that fraction of it (torch.cuda.set_per_process_memory_fraction),
  // which makes a large GPU small for an out-of-memory test.
  void bind(int device_index) const override;
  // Checks SGPU_CUDA_MEMORY_FRACTION; adds nothing.
  std::vector<std::string> rank_environment(const Options& options) const override;
  // The CUDA caching allocator's figures, from the runtime module.
  MemoryStats memory_stats(int device_index) const override;
  void reset_peak_memory_stats(int device_index) const override;
  // NCCL, made by the runtime module.
  const backend::ProcessGroupFactory& process_groups() const override;
};

std::unique_ptr<backend::Backend> make_cuda_backend();

}  // namespace sgpu::cuda
