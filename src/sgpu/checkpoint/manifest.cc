#include "sgpu/checkpoint/manifest.h"

#include <c10/util/accumulate.h>
#include <zlib.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace sgpu::checkpoint {

using json = nlohmann::json;

std::int64_t TensorRecord::numel() const { return c10::multiply_integers(shape); }

std::uint32_t crc32_of(const at::Tensor& contiguous_cpu) {
  return static_cast<std::uint32_t>(crc32_z(crc32_z(0, nullptr, 0),
                                            static_cast<const Bytef*>(contiguous_cpu.data_ptr()),
                                            contiguous_cpu.nbytes()));
}

void Manifest::merge(const Manifest& part, int rank) {
  for (const auto& [file, size] : part.files) files[file] = size;
  for (const auto& [name, record] : part.tensors) {
    auto [it, added] = tensors.try_emplace(name, TensorRecord{record.dtype, record.shape, {}});
    TensorRecord& merged = it->second;
    if (!added && (merged.dtype != record.dtype || merged.shape != record.shape)) {
      throw CheckpointError("tensor '" + name + "': rank " + std::to_string(rank) + " saved " +
                            json(dtype_name(record.dtype)).dump() + " " +
                            json(record.shape).dump() + " but another rank " +
                            json(dtype_name(merged.dtype)).dump() + " " +
                            json(merged.shape).dump() + "; every rank must hold the same model");
    }
    merged.pieces.insert(merged.pieces.end(), record.pieces.begin(), record.pieces.end());
  }
}

void Manifest::check_coverage() {
  for (auto& [name, record] : tensors) {
    std::sort(record.pieces.begin(), record.pieces.end(),
              [](const auto& a, const auto& b) { return a.offset < b.offset; });
    std::int64_t cursor = 0;
    for (const auto& piece : record.pieces) {
      if (piece.offset != cursor) {
        throw CheckpointError("tensor '" + name + "': the ranks' pieces " +
                              (piece.offset < cursor ? "overlap" : "leave a gap") + " at element " +
                              std::to_string(cursor));
      }
      cursor += piece.numel;
    }
    if (cursor != record.numel()) {
      throw CheckpointError("tensor '" + name + "': the ranks saved " + std::to_string(cursor) +
                            " elements of " + json(record.shape).dump());
    }
  }
}

std::string Manifest::to_json() const {
  json out = {{"format", "sgpu-checkpoint"}, {"version", 1},         {"world_size", world_size},
              {"strategy", strategy},        {"metadata", metadata}, {"files", json::object()},
              {"tensors", json::object()}};
  for (const auto& [file, size] : files) out["files"][file] = size;
  for (const auto& [name, record] : tensors) {
    json pieces = json::array();
    for (const auto& p : record.pieces) {
      pieces.push_back({{"file", p.file},
                        {"key", p.key},
                        {"offset", p.offset},
                        {"numel", p.numel},
                        {"crc32", p.crc32}});
    }
    out["tensors"][name] = {
        {"dtype", dtype_name(record.dtype)}, {"shape", record.shape}, {"pieces", pieces}};
  }
  return out.dump(2);
}

std::string Manifest::index_json() const {
  json index = {{"metadata", {{"format", "pt"}}}, {"weight_map", json::object()}};
  std::uint64_t model_bytes = 0;
  for (const auto& [name, record] : tensors) {
    if (name.rfind("optimizer/", 0) == 0) continue;
    for (const auto& piece : record.pieces) {
      index["weight_map"][piece.key] = piece.file;
      model_bytes += static_cast<std::uint64_t>(piece.numel) * dtype_size(record.dtype);
    }
  }
  index["metadata"]["total_size"] = model_bytes;
  for (const auto& [key, value] : metadata) index["metadata"][key] = value;
  return index.dump(2);
}

Manifest Manifest::read(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw CheckpointError("cannot open " + file.string());
  std::ostringstream text;
  text << in.rdbuf();
  return parse(text.str(), file.string());
}

Manifest Manifest::parse(const std::string& text, const std::string& where) {
  json manifest;
  try {
    manifest = json::parse(text);
  } catch (const json::exception& e) {
    throw CheckpointError(where + " is not valid JSON: " + e.what());
  }
  Manifest out;
  try {
    if (manifest.at("format") != "sgpu-checkpoint") {
      throw CheckpointError(where + " is not an sgpu checkpoint manifest");
    }
    out.world_size = manifest.at("world_size").get<int>();
    out.strategy = manifest.at("strategy").get<std::string>();
    if (manifest.contains("metadata")) {
      out.metadata = manifest.at("metadata").get<std::map<std::string, std::string>>();
    }
    for (const auto& [file, size] : manifest.at("files").items())
      out.files[file] = size.get<std::uint64_t>();
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
        if (!out.files.count(record.pieces.back().file)) {
          throw CheckpointError("tensor '" + name + "' is in file " + record.pieces.back().file +
                                " that the manifest does not list");
        }
      }
      out.tensors.emplace(name, std::move(record));
    }
  } catch (const json::exception& e) {
    throw CheckpointError(where + " is malformed: " + e.what());
  }
  return out;
}

}  // namespace sgpu::checkpoint
