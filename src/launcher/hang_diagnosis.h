// Why a call hangs, from every rank's collective ring (NOTE [The collective ring]), by the
// rules of c10d's flight-recorder analyzer: per process group, the lowest collective some
// rank is in flight in is the one the call waits on. Then
//   - a member whose last collective comes before it never entered it (kMissing);
//   - else members that entered it with other arguments (op, dtype, element counts, reduce
//     op, root) are named against the others (kMismatch);
//   - else a member whose entry failed is named (kFailed);
//   - else every member entered it alike and it did not complete (kStuck).
// With no collective in flight on any rank, every rank is blocked outside them (kOutside).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "contract/collective_ring.h"

namespace sgpu::launcher {

struct RankView {
  int rank = 0;
  std::optional<contract::RingSnapshot> ring;  // nullopt: the rank recorded nothing
  std::string end;  // how it ended ("exited with code 1"); empty while it runs
};

struct Diagnosis {
  enum class Kind { kNone, kMissing, kMismatch, kFailed, kStuck, kOutside };
  Kind kind = Kind::kNone;
  std::string verdict;        // one sentence or a few; empty for kNone
  std::vector<int> culprits;  // the ranks the verdict names as the cause
  std::string group;          // the process group it is about ("world", "ranks 0,2")
  std::uint64_t seq = 0;      // the collective it is about
  std::string table;          // each rank's last collectives, newest last
};

// The verdict for the ranks' rings at wall-clock time `now_ns`; `depth` entries a rank in
// the table.
Diagnosis diagnose(const std::vector<RankView>& ranks, std::int64_t now_ns, int depth = 4);

// The rank in a collective the longest, and since when (wall-clock ns); nullopt when no
// rank is in one.
struct InFlight {
  int rank = 0;
  std::int64_t since_ns = 0;
};
std::optional<InFlight> longest_in_flight(const std::vector<RankView>& ranks);

// The wall clock in nanoseconds, as the rings' times are.
std::int64_t wall_now_ns();

// True when some rank has been in one collective for `limit` or longer at `now_ns`.
bool in_flight_for(const std::vector<RankView>& ranks, std::chrono::milliseconds limit,
                   std::int64_t now_ns);

// Every process group some rank recorded, by name, with its global ranks (all of the
// call's when no rank knows them).
std::map<std::string, std::vector<int>> recorded_groups(const std::vector<RankView>& ranks);

// "1.5 s", "320 ms", "4 min 12 s".
std::string describe_duration(std::int64_t ns);

}  // namespace sgpu::launcher
