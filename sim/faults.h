// Fault injection for simulated ranks: what CI uses to prove failure handling.
//
// A plan is a list of faults separated by ';', each  rank=R:ACTION[@POINT]
//   ACTION  abort | segv | exit=CODE | throw | hang | slow=DURATION
//   POINT   start (the default; before the function runs)
//           collective=K (before the rank's K-th collective, counting from 1)
//           after=DURATION (that long after the rank started)
//   DURATION  a number with ms or s: 250ms, 2s
// `slow` delays every collective from its point on. `throw` and `hang` happen in the
// rank's own thread, so they take start or collective=K, not after: `hang` at start
// blocks outside any collective, at a collective inside it (its peers wait in theirs).
// Plans come from Options::sim_faults, else SGPU_SIM_FAULTS.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

namespace sgpu::sim {

struct Fault {
  enum class Action { kAbort, kSegv, kExit, kThrow, kHang, kSlow };
  enum class Point { kStart, kCollective, kAfter };
  int rank = 0;
  Action action = Action::kAbort;
  int exit_code = 1;
  std::chrono::milliseconds slow{0};
  Point point = Point::kStart;
  int collective = 0;
  std::chrono::milliseconds after{0};
};

// Throws ConfigError naming the bad part, the grammar, and ranks outside 0..world-1.
std::vector<Fault> parse_faults(std::string_view plan, int world_size);

// The fault as a plan writes it: "rank=1:segv@collective=3".
std::string describe(const Fault& fault);

// Carries out a fault's action in the calling thread (never returns, except for slow).
void act(const Fault& fault);

// The environment variable a plan travels in to the ranks.
inline constexpr const char* kFaultsVar = "SGPU_SIM_FAULTS";

}  // namespace sgpu::sim
