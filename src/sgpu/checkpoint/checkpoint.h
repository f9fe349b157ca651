// Distributed checkpoints: model and optimizer state saved by the ranks of a DDP, FSDP or
// ZeRO job into one directory, and loaded at any world size under any strategy.
//
//   sgpu::checkpoint::save(dir, fsdp, &optimizer);           // every rank, collective
//   sgpu::checkpoint::CheckpointReader reader(dir);          // any process, any rank count
//   sgpu::checkpoint::load(reader, other_fsdp, &optimizer);  // or load(reader, *module, ...)
//
// Strategies hand their state over as sharded pieces (NOTE [Sharded state]); the files:
// manifest.* (the typed manifest), writer.cc (save), reader.cc (CheckpointReader, load),
// optimizer_state.cc (the optimizer states it knows).
//
// A checkpoint directory holds:
//   model-RRRRR-of-NNNNN.safetensors      per writing rank: model tensors ("format": "pt")
//   optimizer-RRRRR-of-NNNNN.safetensors  per writing rank: optimizer state
//   model.safetensors.index.json          {"metadata": {...}, "weight_map": {key: file}}
//   sgpu-checkpoint.json                  the manifest: world size, strategy, and per tensor
//                                         its dtype, shape and pieces (file, key, offset,
//                                         element count, CRC-32 of the bytes)
// Under DDP (or one process) rank 0 writes full tensors, one file of each kind, so the
// model file is what Hugging Face's loaders read. Under FSDP and ZeRO every rank writes
// its own part: a piece is a contiguous run of a tensor's flattened elements, stored
// under the key "<name>@<first element>" (a tensor held whole keeps its name and shape).
// Optimizer tensors are named "optimizer/<parameter>/<state>" (Adam and AdamW: exp_avg,
// exp_avg_sq, step; SGD: momentum_buffer), in the unsharded layout of the parameter, so
// any strategy can read any other's state.
//
// NOTE [Checkpoint completeness]
// Every file is written under a temporary name, fsynced and renamed; rank 0 writes the
// manifest last, after a barrier that follows every rank's renames, and fsyncs the
// directory. A directory without the manifest is an incomplete checkpoint: the reader
// refuses it with IncompleteCheckpointError. Saving never touches another directory, so
// a crash at any point leaves the previous checkpoint (a sibling directory) intact, and
// save() refuses a directory that already holds a complete checkpoint.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sgpu/checkpoint/manifest.h"
#include "sgpu/checkpoint/safetensors.h"
#include "sgpu/parallel/fsdp.h"
#include "sgpu/parallel/group.h"
#include "sgpu/parallel/sharded_state.h"
#include "sgpu/parallel/zero.h"

namespace sgpu::checkpoint {

// The directory has no manifest: the save that made it did not finish.
class IncompleteCheckpointError : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

struct SaveOptions {
  // The ranks that save together; null inside a rank means sgpu's default group, and
  // outside a rank this process alone.
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  std::map<std::string, std::string> metadata;  // added to every file's and the index's
  // Called at every write point ("<what>:<file>") on the rank that reaches it; a test
  // makes a rank die there to check crash safety.
  std::function<void(const std::string& point)> on_write_point;
};

// What one rank stores of one tensor: elements [offset, offset + data.numel()) of its
// flattened value.
struct Piece {
  std::string name;
  std::vector<std::int64_t> shape;  // the whole tensor's
  std::int64_t offset = 0;
  at::Tensor data;  // 1-D, or the whole tensor
};

// The low-level writer: every rank of the group calls it with its pieces. `sharded`:
// every rank writes files (else only rank 0, whose pieces must be whole tensors).
void save_pieces(const std::filesystem::path& dir, const std::vector<Piece>& model,
                 const std::vector<Piece>& optimizer, const std::string& strategy, bool sharded,
                 const SaveOptions& options = {});

// Any strategy's state (NOTE [Sharded state] in sgpu/parallel/sharded_state.h): every
// rank of the group calls it; each writes its shards, rank 0 alone the replicated ones.
void save(const std::filesystem::path& dir, const parallel::ShardedState& state,
          const SaveOptions& options = {});

// One process, or DDP (every rank calls; rank 0 writes).
void save(const std::filesystem::path& dir, const torch::nn::Module& module,
          torch::optim::Optimizer* optimizer, const SaveOptions& options = {});
// FSDP: every rank writes its shards of parameters and optimizer state.
template <class M>
void save(const std::filesystem::path& dir, parallel::FullyShardedDataParallel<M>& fsdp,
          torch::optim::Optimizer* optimizer, const SaveOptions& options = {}) {
  save(dir, fsdp.sharded_state(optimizer), options);
}
// ZeRO 1/2: rank 0 writes the (replicated) model; every rank its optimizer partition.
// `module` holds the parameters the ZeroOptimizer was built from, in the same order.
void save(const std::filesystem::path& dir, const torch::nn::Module& module,
          parallel::ZeroOptimizer& zero, const SaveOptions& options = {});

// Whether `dir` holds a complete checkpoint (its manifest).
bool is_complete(const std::filesystem::path& dir);

// Reads a complete checkpoint. Every tensor read is checked against the manifest (file
// present, header valid, dtype and shape as recorded, CRC-32); every failure is a
// CheckpointError naming the file and the tensor.
class CheckpointReader {
 public:
  explicit CheckpointReader(std::filesystem::path dir);
  ~CheckpointReader();

  const Manifest& manifest() const { return manifest_; }
  int world_size() const { return manifest_.world_size; }
  const std::string& strategy() const { return manifest_.strategy; }
  const std::map<std::string, TensorRecord>& tensors() const { return manifest_.tensors; }
  bool contains(const std::string& name) const { return manifest_.tensors.count(name) > 0; }
  // The whole tensor, reassembled from its pieces.
  at::Tensor read(const std::string& name) const;
  // Elements [offset, offset + numel) of the flattened tensor, from the pieces that hold
  // them only.
  at::Tensor read_flat(const std::string& name, std::int64_t offset, std::int64_t numel) const;
  // The same into `out` (1-D, contiguous, on the CPU, of the tensor's dtype; its size is
  // numel): each piece that lies wholly inside the range is read straight into it.
  void read_flat_into(const std::string& name, std::int64_t offset, const at::Tensor& out) const;
  // The file a tensor's first piece is in, for messages.
  std::string file_of(const std::string& name) const;

 private:
  const TensorRecord& record(const std::string& name) const;
  at::Tensor read_piece(const std::string& name, const TensorRecord::PieceRecord& piece) const;
  // Reads the piece into `out` (contiguous, on the CPU, of the piece's dtype and size) and
  // checks its CRC there.
  void read_piece_into(const std::string& name, const TensorRecord::PieceRecord& piece,
                       const at::Tensor& out) const;
  const SafetensorsReader& open(const std::string& file) const;

  std::filesystem::path dir_;
  Manifest manifest_;
  mutable std::map<std::string, std::unique_ptr<SafetensorsReader>> open_;
};

// Any strategy's state, whatever strategy and world size saved the checkpoint: each
// shard is filled from the pieces it overlaps (its padding is zeroed), and the
// optimizer's state restored for each of its parameters.
void load(const CheckpointReader& reader, const parallel::ShardedState& state);

// One process or DDP: every parameter and buffer of `module` (and the optimizer's state,
// when given) from the checkpoint, whatever strategy and world size saved it.
void load(const CheckpointReader& reader, torch::nn::Module& module,
          torch::optim::Optimizer* optimizer = nullptr);
// FSDP: each rank reads only the slices of its shards.
template <class M>
void load(const CheckpointReader& reader, parallel::FullyShardedDataParallel<M>& fsdp,
          torch::optim::Optimizer* optimizer = nullptr) {
  load(reader, fsdp.sharded_state(optimizer));
}
// ZeRO: the whole model, and the optimizer state of the rank's partition.
void load(const CheckpointReader& reader, torch::nn::Module& module, parallel::ZeroOptimizer& zero);

}  // namespace sgpu::checkpoint
