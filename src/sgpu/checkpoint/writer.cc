// Saving: every rank writes its pieces (save_pieces), rank 0 merges the parts into the
// manifest, written last (NOTE [Checkpoint completeness]).
#include <c10/util/accumulate.h>

#include <cstdio>
#include <system_error>

#include "contract/atomic_file.h"
#include "sgpu/checkpoint/checkpoint.h"
#include "sgpu/checkpoint/internal/optimizer_state.h"
#include "sgpu/runtime.h"

namespace sgpu::checkpoint {
namespace {

namespace fs = std::filesystem;
using parallel::FlatParamInfo;

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

fs::path part_path(const fs::path& dir, int rank) {
  return dir / ("rank-" + std::to_string(rank) + ".json");
}

// The pieces of the tensors in `layout` that the flat range [base, base + flat.numel())
// covers.
void add_flat_pieces(const std::vector<FlatParamInfo>& layout, std::int64_t base,
                     const at::Tensor& flat, const std::string& state, std::vector<Piece>& out) {
  const std::int64_t end = base + flat.numel();
  for (const auto& p : layout) {
    const std::int64_t lo = std::max(base, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo >= hi) continue;
    out.push_back({state.empty() ? p.name : detail::state_name(p.name, state), p.shape,
                   lo - p.offset, flat.detach().reshape(-1).narrow(0, lo - base, hi - lo)});
  }
}

// Adds the optimizer state of the shard's tensor as pieces of each tensor's state; the
// step (one per optimizer parameter) is written whole by rank 0.
void add_flat_state(torch::optim::Optimizer& optimizer, const parallel::FlatShard& shard, int rank,
                    std::vector<Piece>& out) {
  for (const auto& [key, value] : detail::state_of(optimizer, shard.data)) {
    if (key == "step") {
      if (rank != 0) continue;
      for (const auto& p : shard.layout)
        out.push_back({detail::state_name(p.name, "step"), {}, 0, value});
    } else {
      add_flat_pieces(shard.layout, shard.offset, value, key, out);
    }
  }
}

}  // namespace

bool is_complete(const fs::path& dir) { return fs::exists(dir / kManifestName); }

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

  Manifest part;
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
      TensorRecord& record = part.tensors[piece.name];
      record.dtype = dtype_of(data.scalar_type());
      record.shape = piece.shape;
      record.pieces.push_back({file, key, piece.offset, data.numel(), crc32_of(data)});
      tensors.emplace_back(key, std::move(data));
    }
    std::map<std::string, std::string> metadata = options.metadata;
    metadata["sgpu_strategy"] = strategy;
    const fs::path temp = contract::sibling_for_writing(dir / file);
    part.files[file] = write_safetensors(temp, tensors, metadata);
    publish(temp, dir / file, hook);
  }
  write_text_durably(part_path(dir, rank), part.to_json(), hook);
  barrier(group);

  if (rank == 0) {
    Manifest manifest;
    manifest.world_size = world;
    manifest.strategy = strategy;
    manifest.metadata = options.metadata;
    for (int r = 0; r < world; ++r) manifest.merge(Manifest::read(part_path(dir, r)), r);
    manifest.check_coverage();  // every element of every tensor saved exactly once
    write_text_durably(dir / kIndexName, manifest.index_json(), hook);
    if (hook) hook("before-manifest");
    write_text_durably(dir / kManifestName, manifest.to_json(), hook);
    for (int r = 0; r < world; ++r) fs::remove(part_path(dir, r));
  }
  barrier(group);
}

void save(const fs::path& dir, const parallel::ShardedState& state, const SaveOptions& options) {
  const auto group = resolve_group(options);
  const int rank = group ? group->getRank() : 0;
  std::vector<Piece> model, optimizer;
  bool sharded = false;
  for (const auto& shard : state.model) {
    sharded = sharded || !shard.replicated;
    if (shard.replicated && rank != 0) continue;
    add_flat_pieces(shard.layout, shard.offset, shard.data, "", model);
  }
  if (state.optimizer != nullptr) {
    for (const auto& shard : state.optimized) {
      sharded = sharded || !shard.replicated;
      if (shard.replicated && rank != 0) continue;
      add_flat_state(*state.optimizer, shard, rank, optimizer);
    }
  }
  save_pieces(dir, model, optimizer, state.strategy, sharded, options);
}

void save(const fs::path& dir, const torch::nn::Module& module, torch::optim::Optimizer* optimizer,
          const SaveOptions& options) {
  const auto group = resolve_group(options);
  save(dir,
       parallel::replicated_state(module, optimizer,
                                  group && group->getSize() > 1 ? "ddp" : "single"),
       options);
}

void save(const fs::path& dir, const torch::nn::Module& module, parallel::ZeroOptimizer& zero,
          const SaveOptions& options) {
  save(dir, zero.sharded_state(module), options);
}

}  // namespace sgpu::checkpoint
