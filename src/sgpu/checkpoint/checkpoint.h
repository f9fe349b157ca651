// Distributed checkpoints: model and optimizer state saved by the ranks of a DDP, FSDP or
// ZeRO job into one directory, and loaded at any world size under any strategy.
//
//   sgpu::checkpoint::save(dir, fsdp, &optimizer);           // every rank, collective
//   sgpu::checkpoint::CheckpointReader reader(dir);          // any process, any rank count
//   sgpu::checkpoint::load(reader, other_fsdp, &optimizer);  // or load(reader, *module, ...)
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

#include "sgpu/checkpoint/safetensors.h"
#include "sgpu/parallel/fsdp.h"
#include "sgpu/parallel/group.h"
#include "sgpu/parallel/zero.h"

namespace sgpu::checkpoint {

// The directory has no manifest: the save that made it did not finish.
class IncompleteCheckpointError : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

inline constexpr const char* kManifestName = "sgpu-checkpoint.json";
inline constexpr const char* kIndexName = "model.safetensors.index.json";

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

// One process, or DDP (every rank calls; rank 0 writes).
void save(const std::filesystem::path& dir, const torch::nn::Module& module,
          torch::optim::Optimizer* optimizer, const SaveOptions& options = {});
// FSDP: every rank writes its shards of parameters and optimizer state.
void save_fsdp(const std::filesystem::path& dir, const std::vector<parallel::UnitShard>& shards,
               const torch::nn::Module& module, torch::optim::Optimizer* optimizer,
               const SaveOptions& options = {});
template <class M>
void save(const std::filesystem::path& dir, parallel::FullyShardedDataParallel<M>& fsdp,
          torch::optim::Optimizer* optimizer, const SaveOptions& options = {}) {
  save_fsdp(dir, fsdp.shards(), *fsdp.module(), optimizer, options);
}
// ZeRO 1/2: rank 0 writes the (replicated) model; every rank its optimizer partition.
// `module` holds the parameters the ZeroOptimizer was built from, in the same order.
void save(const std::filesystem::path& dir, const torch::nn::Module& module,
          parallel::ZeroOptimizer& zero, const SaveOptions& options = {});

// Whether `dir` holds a complete checkpoint (its manifest).
bool is_complete(const std::filesystem::path& dir);

// One tensor as the manifest describes it.
struct TensorRecord {
  Dtype dtype = Dtype::kF32;
  std::vector<std::int64_t> shape;
  struct PieceRecord {
    std::string file;
    std::string key;
    std::int64_t offset = 0;
    std::int64_t numel = 0;
    std::uint32_t crc32 = 0;
  };
  std::vector<PieceRecord> pieces;  // by offset; together they cover every element once
  std::int64_t numel() const;
};

// Reads a complete checkpoint. Every tensor read is checked against the manifest (file
// present, header valid, dtype and shape as recorded, CRC-32); every failure is a
// CheckpointError naming the file and the tensor.
class CheckpointReader {
 public:
  explicit CheckpointReader(std::filesystem::path dir);
  ~CheckpointReader();

  int world_size() const { return world_size_; }
  const std::string& strategy() const { return strategy_; }
  const std::map<std::string, TensorRecord>& tensors() const { return tensors_; }
  bool contains(const std::string& name) const { return tensors_.count(name) > 0; }
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
  int world_size_ = 0;
  std::string strategy_;
  std::map<std::string, TensorRecord> tensors_;
  std::map<std::string, std::uint64_t> file_sizes_;
  mutable std::map<std::string, std::unique_ptr<SafetensorsReader>> open_;
};

// One process or DDP: every parameter and buffer of `module` (and the optimizer's state,
// when given) from the checkpoint, whatever strategy and world size saved it.
void load(const CheckpointReader& reader, torch::nn::Module& module,
          torch::optim::Optimizer* optimizer = nullptr);
// FSDP: each rank reads only the slices of its shards.
void load_fsdp(const CheckpointReader& reader, const std::vector<parallel::UnitShard>& shards,
               torch::nn::Module& module, torch::optim::Optimizer* optimizer = nullptr);
template <class M>
void load(const CheckpointReader& reader, parallel::FullyShardedDataParallel<M>& fsdp,
          torch::optim::Optimizer* optimizer = nullptr) {
  load_fsdp(reader, fsdp.shards(), *fsdp.module(), optimizer);
}
// ZeRO: the whole model, and the optimizer state of the rank's partition.
void load(const CheckpointReader& reader, torch::nn::Module& module, parallel::ZeroOptimizer& zero);

}  // namespace sgpu::checkpoint
