#include "sgpu/checkpoint/checkpoint.h"

#include <c10/util/StringUtil.h>
#include <c10/util/accumulate.h>
#include <fcntl.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>

#include "contract/atomic_file.h"
#include "sgpu/runtime.h"

namespace sgpu::checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using parallel::FlatParamInfo;

// "[7, 5]".
std::string shape_text(c10::IntArrayRef shape) { return c10::str(shape); }

std::uint32_t crc_of(const at::Tensor& contiguous_cpu) {
  return static_cast<std::uint32_t>(crc32_z(crc32_z(0, nullptr, 0),
                                            static_cast<const Bytef*>(contiguous_cpu.data_ptr()),
                                            contiguous_cpu.nbytes()));
}

// Renames the written and fsynced `temp` to `path` and fsyncs the directory, passing the
// write points "written:<file>" and "renamed:<file>".
void publish(const fs::path& temp, const fs::path& path,
             const std::function<void(const std::string&)>& hook) {
  if (hook) hook("written:" + path.filename().string());
  try {
    contract::publish_file(temp, path, contract::Durability::kSynced);
  } catch (const std::system_error& e) {
    throw CheckpointError(e.what());
  }
  if (hook) hook("renamed:" + path.filename().string());
}

// Writes `text` durably over `path` (contract/atomic_file.h), with publish's write points.
void write_text_durably(const fs::path& path, const std::string& text,
                        const std::function<void(const std::string&)>& hook) {
  try {
    contract::write_file_atomically(
        path, text, {.durability = contract::Durability::kSynced, .before_rename = [&] {
                       if (hook) hook("written:" + path.filename().string());
                     }});
  } catch (const std::system_error& e) {
    throw CheckpointError(e.what());
  }
  if (hook) hook("renamed:" + path.filename().string());
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw CheckpointError("cannot open " + path.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw CheckpointError(path.string() + " is not valid JSON: " + e.what());
  }
}

// CheckpointError unless the record has elements [offset, offset + numel).
void check_range(const std::string& name, const TensorRecord& r, std::int64_t offset,
                 std::int64_t numel) {
  if (offset < 0 || numel < 0 || offset + numel > r.numel()) {
    throw CheckpointError("tensor '" + name + "' of " + shape_text(r.shape) + " has no elements [" +
                          std::to_string(offset) + ", " + std::to_string(offset + numel) + ")");
  }
}

c10::intrusive_ptr<c10d::ProcessGroup> resolve_group(const SaveOptions& options) {
  if (options.group) return options.group;
  if (sgpu::is_rank()) return parallel::default_group();
  return {};
}

void barrier(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  if (group && group->getSize() > 1) group->barrier()->wait();
}

std::string numbered(const char* kind, int index, int count) {
  char name[64];
  std::snprintf(name, sizeof name, "%s-%05d-of-%05d", kind, index + 1, count);
  return name;
}

// Optimizer state per parameter, as named tensors, for the optimizers checkpoints know.
std::map<std::string, at::Tensor> state_of(torch::optim::Optimizer& optimizer,
                                           const at::Tensor& param) {
  auto& states = optimizer.state();
  const auto it = states.find(param.unsafeGetTensorImpl());
  if (it == states.end()) return {};
  std::map<std::string, at::Tensor> out;
  auto adam_like = [&](auto& s) {
    out["exp_avg"] = s.exp_avg();
    out["exp_avg_sq"] = s.exp_avg_sq();
    if (s.max_exp_avg_sq().defined()) out["max_exp_avg_sq"] = s.max_exp_avg_sq();
    out["step"] = at::scalar_tensor(s.step(), at::kLong);
  };
  if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
    adam_like(*s);
  } else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
    adam_like(*w);
  } else if (auto* m = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
    if (m->momentum_buffer().defined()) out["momentum_buffer"] = m->momentum_buffer();
  } else {
    throw CheckpointError(
        "checkpoints save the state of Adam, AdamW and SGD only; this "
        "optimizer's state is of another kind");
  }
  return out;
}

void set_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
               std::map<std::string, at::Tensor> state) {
  if (state.empty()) return;
  auto take = [&](const char* key) {
    const auto it = state.find(key);
    return it == state.end() ? at::Tensor() : it->second.to(param.device());
  };
  auto adam_like = [&](auto made) {
    made->exp_avg(take("exp_avg").to(param.dtype()));
    made->exp_avg_sq(take("exp_avg_sq").to(param.dtype()));
    if (state.count("max_exp_avg_sq"))
      made->max_exp_avg_sq(take("max_exp_avg_sq").to(param.dtype()));
    made->step(state.at("step").item<std::int64_t>());
    optimizer.state()[param.unsafeGetTensorImpl()] = std::move(made);
  };
  if (dynamic_cast<torch::optim::Adam*>(&optimizer) != nullptr) {
    adam_like(std::make_unique<torch::optim::AdamParamState>());
  } else if (dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr) {
    adam_like(std::make_unique<torch::optim::AdamWParamState>());
  } else if (dynamic_cast<torch::optim::SGD*>(&optimizer) != nullptr) {
    auto made = std::make_unique<torch::optim::SGDParamState>();
    if (state.count("momentum_buffer"))
      made->momentum_buffer(take("momentum_buffer").to(param.dtype()));
    optimizer.state()[param.unsafeGetTensorImpl()] = std::move(made);
  } else {
    throw CheckpointError("checkpoints restore the state of Adam, AdamW and SGD only");
  }
}

std::string state_name(const std::string& param, const std::string& state) {
  return "optimizer/" + param + "/" + state;
}

// The pieces of the params in `layout` that the flat range [base, base + flat.numel())
// covers.
void add_flat_pieces(const std::vector<FlatParamInfo>& layout, std::int64_t base,
                     const at::Tensor& flat, const std::string& state, std::vector<Piece>& out) {
  const std::int64_t end = base + flat.numel();
  for (const auto& p : layout) {
    const std::int64_t lo = std::max(base, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo >= hi) continue;
    out.push_back({state.empty() ? p.name : state_name(p.name, state), p.shape, lo - p.offset,
                   flat.detach().reshape(-1).narrow(0, lo - base, hi - lo)});
  }
}

// Adds the unit- or partition-level optimizer state of `flat_param` as pieces of each
// parameter's state; the step (one per flat parameter) is written whole by rank 0.
void add_flat_state(torch::optim::Optimizer& optimizer, const at::Tensor& flat_param,
                    const std::vector<FlatParamInfo>& layout, std::int64_t base, int rank,
                    std::vector<Piece>& out) {
  for (const auto& [key, value] : state_of(optimizer, flat_param)) {
    if (key == "step") {
      if (rank != 0) continue;
      for (const auto& p : layout) out.push_back({state_name(p.name, "step"), {}, 0, value});
    } else {
      add_flat_pieces(layout, base, value, key, out);
    }
  }
}

std::vector<FlatParamInfo> layout_of(const torch::nn::Module& module) {
  std::vector<FlatParamInfo> layout;
  std::int64_t offset = 0;
  for (const auto& item : module.named_parameters()) {
    layout.push_back({item.key(), item.value().sizes().vec(), offset, item.value().numel()});
    offset += item.value().numel();
  }
  return layout;
}

void add_whole(const torch::nn::Module& module, std::vector<Piece>& out, bool params) {
  for (const auto& item : params ? module.named_parameters() : module.named_buffers()) {
    out.push_back({item.key(), item.value().sizes().vec(), 0, item.value()});
  }
}

}  // namespace

bool is_complete(const fs::path& dir) { return fs::exists(dir / kManifestName); }

std::int64_t TensorRecord::numel() const { return c10::multiply_integers(shape); }

void save_pieces(const fs::path& dir, const std::vector<Piece>& model,
                 const std::vector<Piece>& optimizer, const std::string& strategy, bool sharded,
                 const SaveOptions& options) {
  const auto group = resolve_group(options);
  const int rank = group ? group->getRank() : 0;
  const int world = group ? group->getSize() : 1;
  const auto& hook = options.on_write_point;
  if (is_complete(dir)) {
    throw CheckpointError("checkpoint directory " + dir.string() +
                          " already holds a complete "
                          "checkpoint; save into a new directory (one per step) so that the "
                          "previous checkpoint stays intact until the new one is complete");
  }
  if (rank == 0) {
    fs::create_directories(dir);
    // Leftovers of a save that did not finish.
    for (const auto& entry : fs::directory_iterator(dir)) fs::remove_all(entry.path());
  }
  barrier(group);
  if (hook) hook("begin");

  json part = {{"files", json::object()}, {"tensors", json::object()}};
  const bool writes = sharded || rank == 0;
  const int index = sharded ? rank : 0, count = sharded ? world : 1;
  for (const auto& [kind, pieces] :
       {std::pair{"model", &model}, std::pair{"optimizer", &optimizer}}) {
    if (!writes || pieces->empty()) continue;
    const std::string file = numbered(kind, index, count) + ".safetensors";
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const Piece& piece : *pieces) {
      const std::int64_t total = c10::multiply_integers(piece.shape);
      const bool whole = piece.offset == 0 && piece.data.numel() == total;
      at::Tensor data = piece.data.detach().to(at::kCPU).contiguous();
      if (whole) data = data.reshape(piece.shape);
      const std::string key = whole ? piece.name : piece.name + "@" + std::to_string(piece.offset);
      json& record = part["tensors"][piece.name];
      record["dtype"] = dtype_name(dtype_of(data.scalar_type()));
      record["shape"] = piece.shape;
      record["pieces"].push_back({{"file", file},
                                  {"key", key},
                                  {"offset", piece.offset},
                                  {"numel", data.numel()},
                                  {"crc32", crc_of(data)}});
      tensors.emplace_back(key, std::move(data));
    }
    std::map<std::string, std::string> metadata = options.metadata;
    metadata["sgpu_strategy"] = strategy;
    const fs::path temp = contract::sibling_for_writing(dir / file);
    part["files"][file] = write_safetensors(temp, tensors, metadata);
    publish(temp, dir / file, hook);
  }
  write_text_durably(dir / ("rank-" + std::to_string(rank) + ".json"), part.dump(), hook);
  barrier(group);

  if (rank == 0) {
    json manifest = {{"format", "sgpu-checkpoint"},  {"version", 1},
                     {"world_size", world},          {"strategy", strategy},
                     {"metadata", options.metadata}, {"files", json::object()},
                     {"tensors", json::object()}};
    json index = {{"metadata", {{"format", "pt"}}}, {"weight_map", json::object()}};
    std::uint64_t model_bytes = 0;
    for (int r = 0; r < world; ++r) {
      const fs::path part_path = dir / ("rank-" + std::to_string(r) + ".json");
      const json other = read_json(part_path);
      for (const auto& [file, size] : other["files"].items()) manifest["files"][file] = size;
      for (const auto& [name, record] : other["tensors"].items()) {
        json& merged = manifest["tensors"][name];
        if (merged.is_null()) {
          merged = {
              {"dtype", record["dtype"]}, {"shape", record["shape"]}, {"pieces", json::array()}};
        } else if (merged["dtype"] != record["dtype"] || merged["shape"] != record["shape"]) {
          throw CheckpointError("tensor '" + name + "': rank " + std::to_string(r) + " saved " +
                                record["dtype"].dump() + " " + record["shape"].dump() +
                                " but another rank " + merged["dtype"].dump() + " " +
                                merged["shape"].dump() + "; every rank must hold the same model");
        }
        for (const auto& piece : record["pieces"]) {
          merged["pieces"].push_back(piece);
          if (name.rfind("optimizer/", 0) != 0) {
            index["weight_map"][piece["key"].get<std::string>()] = piece["file"];
            model_bytes += piece["numel"].get<std::uint64_t>() *
                           dtype_size(*dtype_from_name(record["dtype"].get<std::string>()));
          }
        }
      }
    }
    // Every element of every tensor saved exactly once.
    for (auto& [name, record] : manifest["tensors"].items()) {
      auto& pieces = record["pieces"];
      std::sort(pieces.begin(), pieces.end(),
                [](const json& a, const json& b) { return a["offset"] < b["offset"]; });
      std::int64_t cursor = 0;
      for (const auto& piece : pieces) {
        if (piece["offset"].get<std::int64_t>() != cursor) {
          throw CheckpointError(
              "tensor '" + name + "': the ranks' pieces " +
              (piece["offset"].get<std::int64_t>() < cursor ? "overlap" : "leave a gap") +
              " at element " + std::to_string(cursor));
        }
        cursor += piece["numel"].get<std::int64_t>();
      }
      if (cursor != c10::multiply_integers(record["shape"].get<std::vector<std::int64_t>>())) {
        throw CheckpointError("tensor '" + name + "': the ranks saved " + std::to_string(cursor) +
                              " elements of " + record["shape"].dump());
      }
    }
    index["metadata"]["total_size"] = model_bytes;
    for (const auto& [key, value] : options.metadata) index["metadata"][key] = value;
    write_text_durably(dir / kIndexName, index.dump(2), hook);
    if (hook) hook("before-manifest");
    write_text_durably(dir / kManifestName, manifest.dump(2), hook);
    for (int r = 0; r < world; ++r) fs::remove(dir / ("rank-" + std::to_string(r) + ".json"));
  }
  barrier(group);
}

void save(const fs::path& dir, const torch::nn::Module& module, torch::optim::Optimizer* optimizer,
          const SaveOptions& options) {
  std::vector<Piece> model, state;
  const auto group = resolve_group(options);
  if (!group || group->getRank() == 0) {
    add_whole(module, model, true);
    add_whole(module, model, false);
    if (optimizer != nullptr) {
      for (const auto& item : module.named_parameters()) {
        for (const auto& [key, value] : state_of(*optimizer, item.value())) {
          state.push_back({state_name(item.key(), key), value.sizes().vec(), 0, value});
        }
      }
    }
  }
  save_pieces(dir, model, state, group && group->getSize() > 1 ? "ddp" : "single", false, options);
}

void save_fsdp(const fs::path& dir, const std::vector<parallel::UnitShard>& shards,
               const torch::nn::Module& module, torch::optim::Optimizer* optimizer,
               const SaveOptions& options) {
  const auto group = resolve_group(options);
  const int rank = group ? group->getRank() : 0;
  std::vector<Piece> model, state;
  for (const auto& unit : shards) {
    add_flat_pieces(unit.params, unit.shard_offset, unit.data, "", model);
    if (optimizer != nullptr)
      add_flat_state(*optimizer, unit.data, unit.params, unit.shard_offset, rank, state);
  }
  if (rank == 0) add_whole(module, model, false);
  save_pieces(dir, model, state, "fsdp", true, options);
}

void save(const fs::path& dir, const torch::nn::Module& module, parallel::ZeroOptimizer& zero,
          const SaveOptions& options) {
  const auto group = resolve_group(options);
  const int rank = group ? group->getRank() : 0;
  std::vector<Piece> model, state;
  if (rank == 0) {
    add_whole(module, model, true);
    add_whole(module, model, false);
  }
  add_flat_state(zero.optimizer(), zero.partition(), layout_of(module), zero.partition_offset(),
                 rank, state);
  save_pieces(dir, model, state, "zero", true, options);
}

CheckpointReader::CheckpointReader(fs::path dir) : dir_(std::move(dir)) {
  const fs::path manifest_path = dir_ / kManifestName;
  if (!fs::exists(manifest_path)) {
    throw IncompleteCheckpointError(
        "checkpoint " + dir_.string() + " is incomplete: it has no " + kManifestName +
        ", so the save that wrote it did not finish (or it is not an sgpu checkpoint); load the "
        "previous checkpoint");
  }
  const json manifest = read_json(manifest_path);
  try {
    if (manifest.at("format") != "sgpu-checkpoint") {
      throw CheckpointError(manifest_path.string() + " is not an sgpu checkpoint manifest");
    }
    world_size_ = manifest.at("world_size").get<int>();
    strategy_ = manifest.at("strategy").get<std::string>();
    for (const auto& [file, size] : manifest.at("files").items())
      file_sizes_[file] = size.get<std::uint64_t>();
    for (const auto& [name, value] : manifest.at("tensors").items()) {
      TensorRecord record;
      const std::string dtype = value.at("dtype").get<std::string>();
      const auto parsed = dtype_from_name(dtype);
      if (!parsed) throw CheckpointError("tensor '" + name + "' has unknown dtype " + dtype);
      record.dtype = *parsed;
      record.shape = value.at("shape").get<std::vector<std::int64_t>>();
      for (const auto& p : value.at("pieces")) {
        record.pieces.push_back({p.at("file").get<std::string>(), p.at("key").get<std::string>(),
                                 p.at("offset").get<std::int64_t>(),
                                 p.at("numel").get<std::int64_t>(),
                                 p.at("crc32").get<std::uint32_t>()});
        if (!file_sizes_.count(record.pieces.back().file)) {
          throw CheckpointError("tensor '" + name + "' is in file " + record.pieces.back().file +
                                " that the manifest does not list");
        }
      }
      tensors_.emplace(name, std::move(record));
    }
  } catch (const json::exception& e) {
    throw CheckpointError(manifest_path.string() + " is malformed: " + e.what());
  }
}

CheckpointReader::~CheckpointReader() = default;

const TensorRecord& CheckpointReader::record(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
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
    if (size != file_sizes_.at(file)) {
      open_.erase(file);
      throw CheckpointError("checkpoint file " + path.string() + " is " + std::to_string(size) +
                            " bytes but the manifest recorded " +
                            std::to_string(file_sizes_.at(file)));
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
  if (crc_of(out) != piece.crc32) {
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
// tensors named by `name_of`; padding stays zero.
void fill_flat(const CheckpointReader& reader, const std::vector<FlatParamInfo>& layout,
               std::int64_t base, at::Tensor dst,
               const std::function<std::string(const std::string&)>& name_of) {
  torch::NoGradGuard no_grad;
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

void load_flat_state(const CheckpointReader& reader, torch::optim::Optimizer& optimizer,
                     const at::Tensor& flat_param, const std::vector<FlatParamInfo>& layout,
                     std::int64_t base) {
  if (layout.empty()) return;
  std::map<std::string, at::Tensor> state;
  for (const char* key : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer"}) {
    if (!reader.contains(state_name(layout.front().name, key))) continue;
    at::Tensor value = at::zeros_like(flat_param, at::TensorOptions().device(at::kCPU));
    fill_flat(reader, layout, base, value,
              [&](const std::string& p) { return state_name(p, key); });
    state[key] = value;
  }
  const std::string step = state_name(layout.front().name, "step");
  if (reader.contains(step)) state["step"] = reader.read(step);
  set_state(optimizer, flat_param, std::move(state));
}

// The whole tensor `name` into `dst`, which fits it (check_fits): read straight into a
// contiguous CPU tensor, else through a copy.
void read_whole(const CheckpointReader& reader, const std::string& name, at::Tensor dst) {
  if (dst.device() == at::kCPU && dst.is_contiguous()) {
    reader.read_flat_into(name, 0, dst.view(-1));
  } else {
    dst.copy_(reader.read(name));
  }
}

// Each of the named parameters or buffers, whole, from the tensor of its name.
void load_named(const CheckpointReader& reader,
                const torch::OrderedDict<std::string, at::Tensor>& named) {
  torch::NoGradGuard no_grad;
  for (const auto& item : named) {
    check_fits(reader, item.key(), item.value().sizes().vec(), item.value().scalar_type());
    read_whole(reader, item.key(), item.value());
  }
}

}  // namespace

void load(const CheckpointReader& reader, torch::nn::Module& module,
          torch::optim::Optimizer* optimizer) {
  torch::NoGradGuard no_grad;
  load_named(reader, module.named_parameters());
  load_named(reader, module.named_buffers());
  if (optimizer == nullptr) return;
  for (auto& item : module.named_parameters()) {
    std::map<std::string, at::Tensor> state;
    for (const char* key : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "step"}) {
      const std::string name = state_name(item.key(), key);
      if (!reader.contains(name)) continue;
      if (std::string(key) != "step")
        check_fits(reader, name, item.value().sizes().vec(), item.value().scalar_type());
      state[key] = reader.read(name);
    }
    set_state(*optimizer, item.value(), std::move(state));
  }
}

void load_fsdp(const CheckpointReader& reader, const std::vector<parallel::UnitShard>& shards,
               torch::nn::Module& module, torch::optim::Optimizer* optimizer) {
  for (const auto& unit : shards) {
    torch::NoGradGuard no_grad;
    unit.data.zero_();
    fill_flat(reader, unit.params, unit.shard_offset, unit.data,
              [](const std::string& p) { return p; });
    if (optimizer != nullptr)
      load_flat_state(reader, *optimizer, unit.data, unit.params, unit.shard_offset);
  }
  load_named(reader, module.named_buffers());
}

void load(const CheckpointReader& reader, torch::nn::Module& module,
          parallel::ZeroOptimizer& zero) {
  load(reader, module, nullptr);
  const auto layout = layout_of(module);
  {
    torch::NoGradGuard no_grad;
    zero.partition().zero_();
    fill_flat(reader, layout, zero.partition_offset(), zero.partition(),
              [](const std::string& p) { return p; });
  }
  load_flat_state(reader, zero.optimizer(), zero.partition(), layout, zero.partition_offset());
}

}  // namespace sgpu::checkpoint
