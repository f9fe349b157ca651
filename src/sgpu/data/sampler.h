// The distributed sampler for libtorch's data loaders: each rank draws its own 1/N of
// the dataset's indices, shuffled the same way on every rank for a given epoch.
//
//   auto sampler = sgpu::data::distributed_sampler(dataset.size().value());
//   for (size_t epoch = 0; epoch < epochs; ++epoch) {
//     sampler.set_epoch(epoch);   // a new order each epoch
//     ...
//
// It is libtorch's own DistributedRandomSampler, set up with the rank's place.
#pragma once

#include <torch/data/samplers/distributed.h>

#include <cstddef>

#include "sgpu/runtime.h"

namespace sgpu::data {

// allow_duplicates: pad each rank's share to the same length by repeating indices (the
// default, so no rank waits on a last batch the others do not have); false drops the tail.
inline torch::data::samplers::DistributedRandomSampler distributed_sampler(
    std::size_t dataset_size, bool allow_duplicates = true) {
  return torch::data::samplers::DistributedRandomSampler(
      dataset_size, static_cast<std::size_t>(world_size()), static_cast<std::size_t>(global_rank()),
      allow_duplicates);
}

}  // namespace sgpu::data
