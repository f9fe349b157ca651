// sgpu::data: how a rank gets its part of the data.
//   VolumeDataset, Stream, StreamState  <sgpu/data/volume_dataset.h>  files from a volume,
//                                       partitioned across ranks and workers, cached
//                                       locally (link sgpu::data)
//   distributed_sampler                 <sgpu/data/sampler.h>  libtorch's distributed
//                                       sampler for the rank (header only)
#pragma once

#include "sgpu/data/sampler.h"
#include "sgpu/data/volume_dataset.h"
