// The manifest of a checkpoint (sgpu-checkpoint.json), the one type that saving writes and
// loading reads: the world size and strategy that saved it, the files with their sizes,
// and per tensor its dtype, shape and pieces (file, key, offset, element count, CRC-32 of
// the bytes). Each rank's part of a save is a Manifest too; rank 0 merges them.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "sgpu/checkpoint/safetensors.h"

namespace sgpu::checkpoint {

inline constexpr const char* kManifestName = "sgpu-checkpoint.json";
inline constexpr const char* kIndexName = "model.safetensors.index.json";

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

struct Manifest {
  int world_size = 1;
  std::string strategy;
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::uint64_t> files;  // name -> size in bytes
  std::map<std::string, TensorRecord> tensors;

  // Adds rank `rank`'s part: its files and pieces. CheckpointError when the part holds a
  // tensor with another dtype or shape than what is already there.
  void merge(const Manifest& part, int rank);
  // Sorts every tensor's pieces by offset; CheckpointError unless they cover each element
  // exactly once.
  void check_coverage();

  std::string to_json() const;
  // Hugging Face's model.safetensors.index.json: the file of every model tensor's key and
  // the model's total size, with the metadata.
  std::string index_json() const;
  // CheckpointError naming `where` for text that is no manifest.
  static Manifest parse(const std::string& text, const std::string& where);
  // parse() of the file's text; CheckpointError when it cannot be opened.
  static Manifest read(const std::filesystem::path& file);
};

// The CRC-32 of a contiguous CPU tensor's bytes, as a piece records it.
std::uint32_t crc32_of(const at::Tensor& contiguous_cpu);

}  // namespace sgpu::checkpoint
