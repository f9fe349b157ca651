// NOTE [A node's worlds]
// Under `sgpu sim` (cli/sim_command.cc) the processes on the simulated node are not sgpu's
// ranks: pytest, its workers, what mp.spawn, torchrun or a test starts. Their process groups
// still get what a launch's ranks get:
//   - A process that forms a world (a group of every rank: init_process_group("nccl"),
//     however its ranks meet) agrees with the others on the world's name over the group's
//     store, rank 0's pid and count, and records the collectives of the world and of its
//     subgroups in <node>/world-<id>/rank-<N>/collectives.ring, its stacks dumped beside it
//     (SGPU_NODE_DIR names the node's folder, contract::NodeFolder; rank/rank_group.cc).
//   - The fault plan names a world's ranks (sim/process_group.cc): `start` is when the
//     process joins the world, `collective=K` its K-th collective there.
//   - `sgpu sim` reads the rings as a launch's hang watchdog does (NodeWatch), every
//     hang_timeout/4 (50 ms to 1 s). A collective in flight longer than the hang timeout is
//     judged by hang_diagnosis.h: the verdict goes to stderr in a launch's words
//     (hung_headline), with the table to the world's collectives.txt, flight-recorder/ and
//     stacks.txt; then the world's live processes are ended (SIGTERM, the teardown grace,
//     SIGKILL), as NCCL's watchdog ends a process whose collective timed out. The world's
//     folder is kept, and `sgpu sim` exits 124 once its command ends, as `sgpu run` does.
//   - A world whose processes are all gone is summed up (its collectives' line, as a call
//     prints it) and its folder removed; `sgpu sim` prints the lines when its command ends.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "sgpu/options.h"

namespace sgpu::launcher {

struct WorldRanks;  // a world's ranks as its folder holds them (node_watch.cc)

class NodeWatch {
 public:
  struct Settings {
    std::filesystem::path dir;                              // the node's folder
    std::optional<std::chrono::milliseconds> hang_timeout;  // nullopt: no hang is judged
    std::chrono::milliseconds teardown_grace{std::chrono::seconds(5)};
    FrontEnd front_end = FrontEnd::kCommand;  // how a verdict names settings: sgpu sim's flags
  };
  explicit NodeWatch(Settings settings);

  // How often check() should look.
  std::chrono::milliseconds period() const;

  // One look at every world: a hang is judged and reported on `out`, a world that ended is
  // summed up.
  void check(std::ostream& out);

  // At the end (the command ended): every world left is summed up, and what the worlds did
  // goes to `out`, a line a world.
  void finish(std::ostream& out);

  // True once some world was judged hung.
  bool hung() const { return hung_; }

 private:
  struct World {
    std::string label;  // "the world of 2 processes on the node (pids 4242, 4243: python t.py)"
    bool judged = false;
  };
  void judge(const std::filesystem::path& folder, World& world, const WorldRanks& ranks,
             std::ostream& out);
  void sum_up(const std::filesystem::path& folder, const World& world, const WorldRanks& ranks);

  Settings settings_;
  std::map<std::string, World> worlds_;  // by folder name
  std::vector<std::string> summaries_;
  bool hung_ = false;
};

}  // namespace sgpu::launcher
