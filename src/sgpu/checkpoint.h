// sgpu::checkpoint: sharded checkpoints of DDP, FSDP and ZeRO jobs, loaded at any world
// size under any strategy, and the safetensors format they are written in (link
// sgpu::checkpoint).
//   save, load, CheckpointReader   <sgpu/checkpoint/checkpoint.h>
//   SafetensorsReader, write_safetensors, CheckpointError   <sgpu/checkpoint/safetensors.h>
#pragma once

#include "sgpu/checkpoint/checkpoint.h"
#include "sgpu/checkpoint/safetensors.h"
