#include "launcher/flight_recorder.h"

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <fstream>
#include <map>
#include <stdexcept>
#include <string>

#include "contract/atomic_file.h"

namespace sgpu::launcher {
namespace {

using contract::CollectiveEntry;
using contract::CollectiveOp;
using contract::EntryState;

// The analyzer's names for the ops (what ProcessGroupNCCL records them as), where they
// are not torch.distributed's.
std::string fr_op(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllReduceCoalesced:
      return "allreduce_coalesced";
    case CollectiveOp::kAllGatherIntoTensor:
      return "_all_gather_base";
    case CollectiveOp::kAllGatherCoalesced:
      return "ALLGATHER_coalesced";
    case CollectiveOp::kReduceScatterTensor:
      return "_reduce_scatter_base";
    case CollectiveOp::kAllToAllSingle:
      return "all_to_all";
    case CollectiveOp::kBarrier:
      return "all_reduce_barrier";
    case CollectiveOp::kRecvAnySource:
      return "recv";
    default:
      return std::string(contract::op_name(op));
  }
}

// torch's C++ names of the dtypes ("Float" for float32), as the recorder writes them.
std::string fr_dtype(const std::string& dtype) {
  static const std::map<std::string, std::string> names = {
      {"float32", "Float"},
      {"float64", "Double"},
      {"float16", "Half"},
      {"bfloat16", "BFloat16"},
      {"int64", "Long"},
      {"int32", "Int"},
      {"int16", "Short"},
      {"int8", "Char"},
      {"uint8", "Byte"},
      {"bool", "Bool"},
      {"complex64", "ComplexFloat"},
      {"complex128", "ComplexDouble"},
  };
  const auto it = names.find(dtype);
  return it != names.end() ? it->second : dtype;
}

c10::Dict<c10::IValue, c10::IValue> dict() {
  return c10::Dict<c10::IValue, c10::IValue>(c10::StringType::get(), c10::AnyType::get());
}

c10::impl::GenericList list() { return c10::impl::GenericList(c10::AnyType::get()); }

// [[n]]: one flat tensor of n elements; [] without tensors.
c10::impl::GenericList sizes(const CollectiveEntry& e, std::int64_t numel) {
  c10::impl::GenericList all = list();
  if (e.dtype.empty()) return all;
  c10::impl::GenericList dims = list();
  dims.push_back(numel);
  all.push_back(dims);
  return all;
}

c10::impl::GenericList dtypes(const CollectiveEntry& e) {
  c10::impl::GenericList all = list();
  if (!e.dtype.empty()) all.push_back(fr_dtype(e.dtype));
  return all;
}

std::string ranks_text(const std::vector<int>& members) {
  std::string text = "[";
  for (std::size_t i = 0; i < members.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(members[i]);
  }
  return text + "]";
}

}  // namespace

void write_flight_recorder_dumps(const std::vector<RankView>& ranks,
                                 const std::filesystem::path& dir) {
  // Every rank describes every group alike, as the analyzer asks.
  const std::map<std::string, std::vector<int>> groups = recorded_groups(ranks);
  std::filesystem::create_directories(dir);
  for (const RankView& view : ranks) {
    auto pg_config = dict();
    for (const auto& [name, members] : groups) {
      auto group = dict();
      group.insert("name", name);
      group.insert("desc", name);
      group.insert("ranks", ranks_text(members));
      pg_config.insert(name, group);
    }
    c10::impl::GenericList entries = list();
    if (view.ring) {
      for (const CollectiveEntry& e : view.ring->entries) {
        if (contract::is_point_to_point(e.op)) continue;
        const std::string& group = e.group < view.ring->groups.size()
                                       ? view.ring->groups[e.group].name
                                       : std::string("unknown");
        auto entry = dict();
        entry.insert("record_id", static_cast<std::int64_t>(e.serial - 1));
        entry.insert("pg_id", static_cast<std::int64_t>(e.group));
        entry.insert("process_group", c10::ivalue::Tuple::create(group, group));
        entry.insert("collective_seq_id", static_cast<std::int64_t>(e.seq));
        entry.insert("p2p_seq_id", static_cast<std::int64_t>(0));
        entry.insert("op_id", static_cast<std::int64_t>(e.seq));
        entry.insert("profiling_name", std::string("nccl:") + fr_op(e.op));
        entry.insert("time_created_ns", e.entered_ns);
        entry.insert("input_sizes", sizes(e, e.numel_in));
        entry.insert("input_dtypes", dtypes(e));
        entry.insert("output_sizes", sizes(e, e.numel_out != 0 ? e.numel_out : e.numel_in));
        entry.insert("output_dtypes", dtypes(e));
        const bool completed = e.state == EntryState::kCompleted;
        entry.insert("state", std::string(completed ? "completed" : "started"));
        entry.insert("time_discovered_started_ns", e.entered_ns);
        entry.insert("time_discovered_completed_ns",
                     completed ? c10::IValue(e.ended_ns) : c10::IValue());
        entry.insert("retired", completed);
        entry.insert("is_p2p", false);
        entry.insert("frames", list());
        entries.push_back(entry);
      }
    }
    auto dump = dict();
    dump.insert("version", std::string("2.10"));
    dump.insert("pg_config", pg_config);
    dump.insert("entries", entries);
    // A plain pickle, as c10d's own recorder writes it (TraceUtils.h's pickle_str): no
    // tensor table, so no persistent ids.
    std::vector<char> bytes;
    {
      torch::jit::Pickler pickler(
          [&](const char* data, std::size_t size) { bytes.insert(bytes.end(), data, data + size); },
          nullptr, nullptr, nullptr, nullptr, false);
      pickler.protocol();
      pickler.pushIValue(dump);
      pickler.stop();
    }
    const std::filesystem::path file = dir / ("nccl_trace_rank_" + std::to_string(view.rank));
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw std::runtime_error("cannot write the flight-recorder dump " + file.string());
  }
}

Diagnosis diagnose_into(const std::vector<RankView>& ranks, const contract::RunFolder& folder) {
  const Diagnosis d = diagnose(ranks, wall_now_ns());
  write_diagnosis(d, ranks, folder);
  return d;
}

void write_diagnosis(const Diagnosis& d, const std::vector<RankView>& ranks,
                     const contract::RunFolder& folder) {
  std::string report = d.verdict.empty() ? "" : d.verdict + "\n\n";
  report += d.table + "\n";
  try {
    contract::write_file_atomically(folder.collectives_report(), report);
  } catch (const std::exception&) {
    // The verdict carries the same text.
  }
  try {
    write_flight_recorder_dumps(ranks, folder.flight_recorder());
  } catch (const std::exception&) {
    // The rings stay in the folder.
  }
}

}  // namespace sgpu::launcher
