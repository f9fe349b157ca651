// The safetensors format (https://github.com/huggingface/safetensors), read and written
// exactly: an 8-byte little-endian header length N, N bytes of JSON (padded with spaces
// to a multiple of 8), then the data. The JSON maps each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data section)
// and may hold "__metadata__", a map of strings; the writer puts {"format": "pt"} there.
//
// The reader trusts nothing: the header length against the file size, the JSON, every
// field's type, dtype names, shape x element size against the byte span, offsets inside
// the data, spans that neither overlap nor leave holes, duplicate names. Every failure is
// a CheckpointError whose message names the file and, where there is one, the tensor; no
// input crashes the process (the reader is fuzzed: tests/fuzz/decoders_fuzz.cc).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sgpu/errors.h"

namespace sgpu::checkpoint {

// A checkpoint or safetensors file that cannot be read or written as asked.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

enum class Dtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

std::size_t dtype_size(Dtype dtype);
const char* dtype_name(Dtype dtype);  // "F32", ...
std::optional<Dtype> dtype_from_name(std::string_view name);
Dtype dtype_of(at::ScalarType type);  // CheckpointError for a type safetensors lacks here
at::ScalarType scalar_type_of(Dtype dtype);

struct TensorEntry {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // bytes, relative to the data section
  std::uint64_t end = 0;
  std::int64_t numel() const;
};

struct Header {
  std::map<std::string, std::string> metadata;
  std::vector<TensorEntry> tensors;  // in the order of their data
  std::uint64_t data_start = 0;      // 8 + header length
  const TensorEntry* find(const std::string& name) const;
};

// Parses and validates a header. `prefix` holds the file's first bytes (at least the 8 of
// the length, and the JSON if it is to be parsed); `file_size` is the whole file's size;
// `file` names it in errors.
Header parse_header(std::span<const std::uint8_t> prefix, std::uint64_t file_size,
                    const std::string& file);

// A whole safetensors file in memory, validated: what the fuzzer drives.
struct Parsed {
  Header header;
  std::map<std::string, at::Tensor> tensors;
};
Parsed parse_buffer(std::span<const std::uint8_t> bytes, const std::string& file);

// Reads a file's header once, then tensors on demand (pread: only their bytes).
class SafetensorsReader {
 public:
  explicit SafetensorsReader(std::filesystem::path path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const Header& header() const { return header_; }
  const std::filesystem::path& path() const { return path_; }
  // CheckpointError naming the file and the tensor when it is absent or unreadable.
  at::Tensor read(const std::string& name) const;
  // Reads the tensor into `out`: a contiguous CPU tensor of its dtype and element count
  // (any shape), which it fills with no copy in between.
  void read_into(const std::string& name, const at::Tensor& out) const;
  // The tensor's raw bytes.
  std::vector<std::uint8_t> read_bytes(const std::string& name) const;

 private:
  void read_at(std::uint64_t offset, void* out, std::size_t size, const std::string& what) const;
  // The tensor's entry; CheckpointError naming the file and the tensor when it is absent.
  const TensorEntry& entry(const std::string& name) const;
  // The entry's bytes into `out`, which holds them.
  void read_data(const TensorEntry& t, void* out) const;

  std::filesystem::path path_;
  int fd_ = -1;
  std::uint64_t file_size_ = 0;
  Header header_;
};

// Writes `tensors` (any contiguous-able CPU or device tensors) to `path` and fsyncs it.
// Tensor data is ordered by element size, largest first, so each tensor is aligned to its
// element size; metadata gets "format": "pt" unless it has one.
// Returns the file's size.
std::uint64_t write_safetensors(const std::filesystem::path& path,
                                const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                std::map<std::string, std::string> metadata = {});

// The bytes of a tensor as safetensors stores them (little-endian, contiguous).
std::vector<std::uint8_t> tensor_bytes(const at::Tensor& tensor);

}  // namespace sgpu::checkpoint
