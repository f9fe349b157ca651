#include "launcher/node_watch.h"

#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <fstream>
#include <system_error>
#include <thread>
#include <utility>

#include "contract/collective_ring.h"
#include "contract/run_folder.h"
#include "contract/stack_dump.h"
#include "launcher/call_end.h"
#include "launcher/flight_recorder.h"
#include "launcher/hang_diagnosis.h"
#include "launcher/stacks.h"
#include "rank/accounting.h"

namespace sgpu::launcher {

// Every rank of one world as its folder holds them.
struct WorldRanks {
  int size = 0;                 // 0 until some rank has its ring
  std::vector<RankView> views;  // by rank; a rank with no ring yet has none
  std::vector<pid_t> pids;      // by rank; 0 where unknown
  std::vector<bool> alive;      // by rank
};

namespace {

namespace fs = std::filesystem;

constexpr std::size_t kCommandWidth = 80;  // characters of rank 0's command in a label
constexpr std::size_t kWorldsShown = 5;    // summary lines at the end

WorldRanks read_world(const fs::path& folder) {
  std::map<int, std::optional<contract::RingSnapshot>> rings;
  WorldRanks world;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (!contract::RunFolder::is_rank_folder_name(name)) continue;
    const int rank = std::atoi(name.c_str() + std::string(contract::RunFolder::kRankPrefix).size());
    auto ring =
        contract::read_collective_ring(contract::RankFolder{entry.path()}.collective_ring());
    if (ring) world.size = std::max(world.size, static_cast<int>(ring->world_size));
    rings[rank] = std::move(ring);
  }
  for (int rank = 0; rank < world.size; ++rank) {
    RankView view;
    view.rank = rank;
    if (auto it = rings.find(rank); it != rings.end()) view.ring = it->second;
    const pid_t pid = view.ring ? static_cast<pid_t>(view.ring->pid) : 0;
    const bool alive = pid > 0 && live_parent(pid) != 0;
    if (view.ring && !alive) view.end = "has ended";
    world.views.push_back(std::move(view));
    world.pids.push_back(pid);
    world.alive.push_back(alive);
  }
  return world;
}

// Every rank recorded, and none of them runs.
bool all_gone(const WorldRanks& world) {
  for (int rank = 0; rank < world.size; ++rank) {
    if (!world.views[rank].ring || world.alive[rank]) return false;
  }
  return world.size > 0;
}

std::string command_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!text.empty() && text.back() == '\0') text.pop_back();
  std::replace(text.begin(), text.end(), '\0', ' ');
  if (text.size() > kCommandWidth) text = text.substr(0, kCommandWidth - 3) + "...";
  return text;
}

// "the world of 2 processes on the node (pids 4242, 4243: python train.py)".
std::string label_of(const WorldRanks& world) {
  std::string pids;
  for (pid_t pid : world.pids) {
    if (pid > 0) pids += (pids.empty() ? "pids " : ", ") + std::to_string(pid);
  }
  const std::string command =
      world.pids.empty() || world.pids[0] <= 0 ? "" : command_of(world.pids[0]);
  std::string label = "the world of " + std::to_string(world.size) + " process" +
                      (world.size == 1 ? "" : "es") + " on the node";
  if (!pids.empty()) label += " (" + pids + (command.empty() ? "" : ": " + command) + ")";
  return label;
}

// Its Python tracebacks too, once the process armed them (NOTE [Stack dumps]).
bool python_armed(const fs::path& rank_dir, pid_t pid) {
  std::ifstream in(contract::program_pid_file(rank_dir));
  pid_t armed = 0;
  return (in >> armed) && armed == pid;
}

// SIGTERM, `grace`, then SIGKILL for what still runs.
void end_processes(const std::vector<pid_t>& pids, std::chrono::milliseconds grace) {
  for (pid_t pid : pids) ::kill(pid, SIGTERM);
  const auto until = std::chrono::steady_clock::now() + grace;
  auto running = [&] {
    return std::any_of(pids.begin(), pids.end(), [](pid_t pid) { return live_parent(pid) != 0; });
  };
  while (running() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (pid_t pid : pids) {
    if (live_parent(pid) != 0) ::kill(pid, SIGKILL);
  }
}

}  // namespace

NodeWatch::NodeWatch(Settings settings) : settings_(std::move(settings)) {}

std::chrono::milliseconds NodeWatch::period() const {
  using std::chrono::milliseconds;
  if (!settings_.hang_timeout) return milliseconds(1000);
  return std::clamp(*settings_.hang_timeout / 4, milliseconds(50), milliseconds(1000));
}

void NodeWatch::check(std::ostream& out) {
  std::vector<std::pair<fs::path, WorldRanks>> ended;  // summed up after the listing
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(settings_.dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!contract::NodeFolder::is_world_folder_name(name)) continue;
    World& world = worlds_[name];
    if (world.judged) continue;
    const WorldRanks ranks = read_world(entry.path());
    if (ranks.size == 0) continue;
    if (std::any_of(ranks.alive.begin(), ranks.alive.end(), [](bool a) { return a; })) {
      world.label = label_of(ranks);  // while its processes can still be read
    }
    if (settings_.hang_timeout &&
        in_flight_for(ranks.views, *settings_.hang_timeout, wall_now_ns())) {
      judge(entry.path(), world, ranks, out);
    } else if (all_gone(ranks)) {
      ended.emplace_back(entry.path(), ranks);
    }
  }
  for (const auto& [folder, ranks] : ended) {
    sum_up(folder, worlds_[folder.filename().string()], ranks);
    worlds_.erase(folder.filename().string());
  }
}

void NodeWatch::judge(const fs::path& folder, World& world, const WorldRanks& ranks,
                      std::ostream& out) {
  const contract::RunFolder run{folder};
  const Diagnosis d = diagnose_into(ranks.views, run);
  CallEnd end;
  end.outcome = Outcome::kHung;
  end.label = world.label.empty() ? label_of(ranks) : world.label;
  end.collectives.verdict = d.verdict;
  end.collectives.culprits = d.culprits;
  end.collectives.table = d.table;
  std::vector<StackTarget> targets;
  std::vector<pid_t> live;
  for (int rank = 0; rank < ranks.size; ++rank) {
    if (!ranks.alive[rank]) continue;
    const pid_t pid = ranks.pids[rank];
    const fs::path rank_dir = run.rank(rank).dir;
    targets.push_back(StackTarget{rank, pid, rank_dir, python_armed(rank_dir, pid)});
    live.push_back(pid);
  }
  report_stacks(targets, run.stacks_report(), end.collectives);
  end.stacks = stacks_text(end.collectives);
  end.hang_timeout = settings_.hang_timeout;
  end.front_end = settings_.front_end;
  out << hung_headline(end) << "\nsgpu sim: ending the world's " << live.size() << " live process"
      << (live.size() == 1 ? "" : "es") << "; its rings and reports are in " << folder.string()
      << std::endl;
  end_processes(live, settings_.teardown_grace);
  world.judged = true;
  hung_ = true;
}

void NodeWatch::sum_up(const fs::path& folder, const World& world, const WorldRanks& ranks) {
  std::vector<CommStats> stats;
  for (const RankView& view : ranks.views) stats.push_back(rank::comm_stats_of(view.ring));
  std::string line = rank::comm_summary(stats);
  const std::string prefix = "sgpu: ";
  if (line.rfind(prefix, 0) == 0) line = line.substr(prefix.size());
  while (!line.empty() && line.back() == '\n') line.pop_back();
  if (!line.empty()) {
    summaries_.push_back((world.label.empty() ? label_of(ranks) : world.label) + ": " + line);
  }
  std::error_code ec;
  fs::remove_all(folder, ec);
}

void NodeWatch::finish(std::ostream& out) {
  std::error_code ec;
  std::vector<fs::path> left;
  for (const fs::directory_entry& entry : fs::directory_iterator(settings_.dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (contract::NodeFolder::is_world_folder_name(name) && !worlds_[name].judged) {
      left.push_back(entry.path());
    }
  }
  for (const fs::path& folder : left) {
    sum_up(folder, worlds_[folder.filename().string()], read_world(folder));
  }
  for (std::size_t i = 0; i < summaries_.size() && i < kWorldsShown; ++i) {
    out << "sgpu sim: " << summaries_[i] << "\n";
  }
  if (summaries_.size() > kWorldsShown) {
    out << "sgpu sim: and " << summaries_.size() - kWorldsShown << " more worlds\n";
  }
  out.flush();
}

}  // namespace sgpu::launcher
