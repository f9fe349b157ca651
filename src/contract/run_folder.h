// NOTE [The run folder]
// Each call has a folder of its own, <runs dir>/<run id>/ (mode 0700), that the launcher
// creates and every module writing into it finds through these names:
//
//   call.bin                       the staged call (launcher, before any rank starts)
//   tracking-pending.json          a run whose end did not reach its store (tracking)
//   rank-<N>/stdout.log            each rank's output (launcher, as it streams it)
//   rank-<N>/stderr.log
//   rank-<N>/result.bin            the rank's return value (the rank, as it ends), or
//   rank-<N>/error.json            the rank's error record
//   rank-<N>/exception.bin         a worker rank's exception, as the worker encodes it
//   rank-<N>/torchelastic-error.json  a program rank's torchrun error file (its
//                                  TORCHELASTIC_ERROR_FILE, which @record writes)
//   rank-<N>/abrupt-end            when it went down without one (contract/abrupt_end.h)
//   rank-<N>/tracking-spool.jsonl  what the rank's logger could not send (tracking)
//   rank-<N>/collectives.ring      the rank's recent collectives (NOTE [The collective ring])
//   rank-<N>/memory.json           its device's memory figures at its end (sgpu/memory.h)
//   collectives.txt                the call's collectives, when it hung or failed in one
//   stacks.txt                     then every live rank's stacks (NOTE [Stack dumps])
//   flight-recorder/nccl_trace_rank_<N>  the rings as c10d flight-recorder dumps
//   rank-<N>/stacks/               the rank's threads' dumps of their own stacks
//
// It is kept after a failure, removed after success unless asked to keep it.
//
// Under `sgpu sim` the node has a folder too (NodeFolder, NOTE [A node's worlds] in
// launcher/node_watch.h): each world that processes on the node form is a run folder in it,
// world-<id>/, with the same rank-<N>/collectives.ring, rank-<N>/stacks/, collectives.txt,
// stacks.txt and flight-recorder/.
#pragma once

#include <filesystem>
#include <string>

namespace sgpu::contract {

struct RankFolder {
  std::filesystem::path dir;

  std::filesystem::path stdout_log() const { return dir / "stdout.log"; }
  std::filesystem::path stderr_log() const { return dir / "stderr.log"; }
  std::filesystem::path result() const { return dir / "result.bin"; }
  std::filesystem::path error() const { return dir / "error.json"; }
  std::filesystem::path exception() const { return dir / "exception.bin"; }
  std::filesystem::path torchelastic_error() const { return dir / "torchelastic-error.json"; }
  std::filesystem::path tracking_spool() const { return dir / kTrackingSpoolName; }
  // When the rank went down without an error record (NOTE [Abrupt ends]).
  std::filesystem::path abrupt_end() const { return dir / "abrupt-end"; }
  std::filesystem::path collective_ring() const { return dir / "collectives.ring"; }
  std::filesystem::path memory() const { return dir / "memory.json"; }
  std::filesystem::path compute() const { return dir / "compute.json"; }
  // Left by a program under sgpu run once it runs in shape-only compute.
  std::filesystem::path computes_shapes() const { return dir / "computes-shapes"; }

  static constexpr const char* kTrackingSpoolName = "tracking-spool.jsonl";
};

struct RunFolder {
  std::filesystem::path dir;

  std::filesystem::path call() const { return dir / "call.bin"; }
  std::filesystem::path tracking_pending() const { return dir / kTrackingPendingName; }
  std::filesystem::path collectives_report() const { return dir / "collectives.txt"; }
  std::filesystem::path stacks_report() const { return dir / "stacks.txt"; }
  // The rings as c10d flight-recorder dumps (launcher/flight_recorder.h).
  std::filesystem::path flight_recorder() const { return dir / "flight-recorder"; }
  RankFolder rank(int rank) const { return {dir / (kRankPrefix + std::to_string(rank))}; }
  // True for the name of a rank's folder ("rank-3").
  static bool is_rank_folder_name(const std::string& name) {
    return name.rfind(kRankPrefix, 0) == 0 && name.size() > std::string(kRankPrefix).size();
  }

  static constexpr const char* kRankPrefix = "rank-";
  static constexpr const char* kTrackingPendingName = "tracking-pending.json";
};

struct NodeFolder {
  std::filesystem::path dir;

  // The world `id` (its rank 0's pid and count: "4242-1").
  RunFolder world(const std::string& id) const { return {dir / (kWorldPrefix + id)}; }
  static bool is_world_folder_name(const std::string& name) {
    return name.rfind(kWorldPrefix, 0) == 0 && name.size() > std::string(kWorldPrefix).size();
  }

  static constexpr const char* kWorldPrefix = "world-";
};

}  // namespace sgpu::contract
