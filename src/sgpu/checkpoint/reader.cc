// Loading: the manifest read once, every piece checked where it lands (its file, header,
// dtype, size and CRC-32), and each rank's shards filled from the pieces they overlap.
#include <c10/util/StringUtil.h>

#include "sgpu/checkpoint/checkpoint.h"
#include "sgpu/checkpoint/internal/optimizer_state.h"

namespace sgpu::checkpoint {
namespace {

namespace fs = std::filesystem;
using parallel::FlatParamInfo;

std::string shape_text(c10::IntArrayRef shape) { return c10::str(shape); }

// CheckpointError unless the record has elements [offset, offset + numel).
void check_range(const std::string& name, const TensorRecord& r, std::int64_t offset,
                 std::int64_t numel) {
  if (offset < 0 || numel < 0 || offset + numel > r.numel()) {
    throw CheckpointError("tensor '" + name + "' of " + shape_text(r.shape) + " has no elements [" +
                          std::to_string(offset) + ", " + std::to_string(offset + numel) + ")");
  }
}

}  // namespace

CheckpointReader::CheckpointReader(fs::path dir) : dir_(std::move(dir)) {
  const fs::path manifest_path = dir_ / kManifestName;
  if (!fs::exists(manifest_path)) {
    throw IncompleteCheckpointError(
        "checkpoint " + dir_.string() + " is incomplete: it has no " + kManifestName +
        ", so the save that wrote it did not finish (or it is not an sgpu checkpoint); load the "
        "previous checkpoint");
  }
  manifest_ = Manifest::read(manifest_path);
}

CheckpointReader::~CheckpointReader() = default;

const TensorRecord& CheckpointReader::record(const std::string& name) const {
  const auto it = manifest_.tensors.find(name);
  if (it == manifest_.tensors.end()) {
    throw CheckpointError("checkpoint " + dir_.string() + " (" + kManifestName +
                          ") has no tensor '" + name + "'");
  }
  return it->second;
}

std::string CheckpointReader::file_of(const std::string& name) const {
  const TensorRecord& r = record(name);
  return (dir_ / (r.pieces.empty() ? std::string(kManifestName) : r.pieces.front().file)).string();
}

const SafetensorsReader& CheckpointReader::open(const std::string& file) const {
  auto& slot = open_[file];
  if (!slot) {
    const fs::path path = dir_ / file;
    if (!fs::exists(path)) {
      throw CheckpointError("checkpoint file " + path.string() + " is missing");
    }
    slot = std::make_unique<SafetensorsReader>(path);
    const std::uint64_t size = fs::file_size(path);
    if (size != manifest_.files.at(file)) {
      open_.erase(file);
      throw CheckpointError("checkpoint file " + path.string() + " is " + std::to_string(size) +
                            " bytes but the manifest recorded " +
                            std::to_string(manifest_.files.at(file)));
    }
  }
  return *slot;
}

at::Tensor CheckpointReader::read_piece(const std::string& name,
                                        const TensorRecord::PieceRecord& piece) const {
  at::Tensor data =
      at::empty({piece.numel}, at::TensorOptions().dtype(scalar_type_of(record(name).dtype)));
  read_piece_into(name, piece, data);
  return data;
}

void CheckpointReader::read_piece_into(const std::string& name,
                                       const TensorRecord::PieceRecord& piece,
                                       const at::Tensor& out) const {
  const std::string where =
      "checkpoint file " + (dir_ / piece.file).string() + ", tensor '" + name + "'";
  const SafetensorsReader* reader = nullptr;
  try {
    reader = &open(piece.file);
  } catch (const CheckpointError& e) {
    throw CheckpointError(std::string(e.what()) + " (needed for tensor '" + name + "')");
  }
  const TensorEntry* entry = reader->header().find(piece.key);
  if (entry == nullptr) throw CheckpointError(where + ": the file has no key '" + piece.key + "'");
  const TensorRecord& r = record(name);
  if (entry->dtype != r.dtype || entry->numel() != piece.numel) {
    throw CheckpointError(where + ": the file holds " + dtype_name(entry->dtype) + " " +
                          shape_text(entry->shape) + " but the manifest recorded " +
                          dtype_name(r.dtype) + " with " + std::to_string(piece.numel) +
                          " elements");
  }
  reader->read_into(piece.key, out);
  if (crc32_of(out) != piece.crc32) {
    throw CheckpointError(where + ": CRC-32 mismatch (the file's data is corrupted)");
  }
}

at::Tensor CheckpointReader::read(const std::string& name) const {
  const TensorRecord& r = record(name);
  return read_flat(name, 0, r.numel()).reshape(r.shape);
}

at::Tensor CheckpointReader::read_flat(const std::string& name, std::int64_t offset,
                                       std::int64_t numel) const {
  const TensorRecord& r = record(name);
  check_range(name, r, offset, numel);
  at::Tensor out = at::empty({numel}, at::TensorOptions().dtype(scalar_type_of(r.dtype)));
  read_flat_into(name, offset, out);
  return out;
}

void CheckpointReader::read_flat_into(const std::string& name, std::int64_t offset,
                                      const at::Tensor& out) const {
  const TensorRecord& r = record(name);
  const std::int64_t numel = out.numel();
  check_range(name, r, offset, numel);
  if (out.dim() != 1 || out.device() != at::kCPU || !out.is_contiguous() ||
      out.scalar_type() != scalar_type_of(r.dtype)) {
    throw CheckpointError("tensor '" + name + "' is " + dtype_name(r.dtype) +
                          "; it is read into 1-D contiguous CPU tensors of that dtype only");
  }
  std::int64_t covered = 0;
  for (const auto& piece : r.pieces) {
    const std::int64_t lo = std::max(offset, piece.offset);
    const std::int64_t hi = std::min(offset + numel, piece.offset + piece.numel);
    if (lo >= hi) continue;
    at::Tensor into = out.narrow(0, lo - offset, hi - lo);
    if (lo == piece.offset && hi == piece.offset + piece.numel) {
      read_piece_into(name, piece, into);  // the whole piece: no copy
    } else {
      into.copy_(read_piece(name, piece).narrow(0, lo - piece.offset, hi - lo));
    }
    covered += hi - lo;
  }
  if (covered != numel) {
    throw CheckpointError("checkpoint " + dir_.string() + ": tensor '" + name +
                          "' is not fully covered by its pieces");
  }
}

namespace {

void require(const CheckpointReader& reader, const std::string& name) {
  if (!reader.contains(name)) {
    throw CheckpointError("checkpoint has no tensor '" + name + "' that the model has (its " +
                          kManifestName +
                          " does not list it); build the model the checkpoint "
                          "was saved from");
  }
}

// Checks that the checkpoint has the tensor, as the model holds it there.
void check_fits(const CheckpointReader& reader, const std::string& name,
                const std::vector<std::int64_t>& shape, at::ScalarType type) {
  require(reader, name);
  const TensorRecord& r = reader.tensors().at(name);
  if (r.shape != shape || scalar_type_of(r.dtype) != type) {
    throw CheckpointError("checkpoint file " + reader.file_of(name) + ", tensor '" + name +
                          "': it holds " + dtype_name(r.dtype) + " " + shape_text(r.shape) +
                          " but the model has " + dtype_name(dtype_of(type)) + " " +
                          shape_text(shape) + "; build the model the checkpoint was saved from");
  }
}

// Fills the flat range [base, base + dst.numel()) of the layout from the checkpoint's
// tensors named by `name_of`; padding stays as it is.
void fill_flat(const CheckpointReader& reader, const std::vector<FlatParamInfo>& layout,
               std::int64_t base, at::Tensor dst,
               const std::function<std::string(const std::string&)>& name_of) {
  torch::NoGradGuard no_grad;
  if (!dst.is_contiguous()) {
    at::Tensor flat = dst.contiguous();
    fill_flat(reader, layout, base, flat, name_of);
    dst.copy_(flat);
    return;
  }
  at::Tensor flat = dst.view(-1);
  const std::int64_t end = base + flat.numel();
  for (const auto& p : layout) {
    const std::int64_t lo = std::max(base, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo >= hi) continue;
    const std::string name = name_of(p.name);
    check_fits(reader, name, p.shape, dst.scalar_type());
    at::Tensor into = flat.narrow(0, lo - base, hi - lo);
    if (into.device() == at::kCPU) {
      reader.read_flat_into(name, lo - p.offset, into);  // straight into the shard
    } else {
      into.copy_(reader.read_flat(name, lo - p.offset, hi - lo));
    }
  }
}

// The optimizer state of the shard's tensor, from the states of the tensors it covers.
void load_flat_state(const CheckpointReader& reader, torch::optim::Optimizer& optimizer,
                     const parallel::FlatShard& shard) {
  if (shard.layout.empty()) return;
  const std::string& first = shard.layout.front().name;
  std::map<std::string, at::Tensor> state;
  for (const char* key : detail::kTensorStates) {
    if (!reader.contains(detail::state_name(first, key))) continue;
    at::Tensor value = at::zeros_like(shard.data, at::TensorOptions().device(at::kCPU));
    fill_flat(reader, shard.layout, shard.offset, value,
              [&](const std::string& p) { return detail::state_name(p, key); });
    state[key] = value;
  }
  const std::string step = detail::state_name(first, "step");
  if (reader.contains(step)) state["step"] = reader.read(step);
  detail::set_state(optimizer, shard.data, std::move(state));
}

}  // namespace

void load(const CheckpointReader& reader, const parallel::ShardedState& state) {
  const auto same_name = [](const std::string& p) { return p; };
  for (const auto& shard : state.model) {
    torch::NoGradGuard no_grad;
    shard.data.zero_();  // padding stays zero
    fill_flat(reader, shard.layout, shard.offset, shard.data, same_name);
  }
  if (state.optimizer == nullptr) return;
  for (const auto& shard : state.optimized) {
    const bool loaded = std::any_of(state.model.begin(), state.model.end(),
                                    [&](const auto& m) { return m.data.is_same(shard.data); });
    if (!loaded) {  // a copy of the model's values (ZeRO's partition)
      torch::NoGradGuard no_grad;
      shard.data.zero_();
      fill_flat(reader, shard.layout, shard.offset, shard.data, same_name);
    }
    load_flat_state(reader, *state.optimizer, shard);
  }
}

void load(const CheckpointReader& reader, torch::nn::Module& module,
          torch::optim::Optimizer* optimizer) {
  load(reader, parallel::replicated_state(module, optimizer, ""));
}

void load(const CheckpointReader& reader, torch::nn::Module& module,
          parallel::ZeroOptimizer& zero) {
  load(reader, zero.sharded_state(module));
}

}  // namespace sgpu::checkpoint
