// sgpu::parallel: data-parallel training strategies for libtorch modules over the rank's
// process group, for use inside a distributed function (link sgpu::parallel).
//   DistributedDataParallel   <sgpu/parallel/ddp.h>   PyTorch's DDP (c10d::Reducer)
//   FullyShardedDataParallel  <sgpu/parallel/fsdp.h>  parameters, gradients and optimizer
//                                                     state sharded (FSDP full shard)
//   ZeroOptimizer             <sgpu/parallel/zero.h>  ZeRO stages 1 and 2 (DeepSpeed's)
//   default_group()           <sgpu/parallel/group.h> the group as a c10d::ProcessGroup
#pragma once

#include "sgpu/parallel/ddp.h"
#include "sgpu/parallel/fsdp.h"
#include "sgpu/parallel/group.h"
#include "sgpu/parallel/zero.h"
