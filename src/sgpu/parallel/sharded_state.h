// NOTE [Sharded state]
// How a training strategy hands its state to a checkpoint and takes it back, the way
// PyTorch's distributed checkpoint asks each stateful object for its pieces. A rank's
// state is a list of flat shards: each is a run of elements of the concatenation of some
// named tensors, flattened, in their unsharded layout. A checkpoint stores every shard by
// those names and offsets, so what one strategy and world size wrote, any other reads.
// The shards' tensors are the strategy's own storage, not copies: a load writes into
// them. A strategy offers `ShardedState sharded_state()` (ZeRO, which holds no module,
// takes the module its parameters came from); sgpu::checkpoint needs nothing else of
// it, so a new strategy needs no change there.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>
#include <vector>

namespace sgpu::parallel {

// One named tensor's place in a flat buffer: elements [offset, offset + numel).
struct FlatParamInfo {
  std::string name;  // as in the module's named_parameters() (or named_buffers())
  std::vector<std::int64_t> shape;
  std::int64_t offset = 0;
  std::int64_t numel = 0;
};

// Elements [offset, offset + data.numel()) of the concatenation of `layout`'s tensors,
// flattened. Elements past the layout's end (padding) belong to no tensor.
struct FlatShard {
  std::vector<FlatParamInfo> layout;
  std::int64_t offset = 0;
  at::Tensor data;          // the rank's storage, of any shape; contiguous when flat
  bool replicated = false;  // every rank holds the same: rank 0 alone saves it
};

struct ShardedState {
  std::string strategy;  // recorded in the checkpoint: "single", "ddp", "fsdp", "zero"
  // Parameters and buffers. Over all ranks, the shards cover every element of every
  // tensor once (replicated shards counted once).
  std::vector<FlatShard> model;
  // Whose state is saved and restored with the model (nullptr: none), and each of its
  // parameters as a shard of the model: its state has that parameter's layout.
  torch::optim::Optimizer* optimizer = nullptr;
  std::vector<FlatShard> optimized;
};

// The shard that is one whole tensor.
FlatShard whole_tensor(const std::string& name, const at::Tensor& tensor, bool replicated);
// Adds each of `module`'s buffers to the state's model, whole and replicated: every
// strategy here keeps buffers unsharded, the same on every rank.
void add_replicated_buffers(const torch::nn::Module& module, ShardedState& state);

// A module every rank holds whole (DDP), or one process's: each parameter and buffer is a
// replicated whole-tensor shard; each parameter is one of the optimizer's.
ShardedState replicated_state(const torch::nn::Module& module, torch::optim::Optimizer* optimizer,
                              std::string strategy);

}  // namespace sgpu::parallel
