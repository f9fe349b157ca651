#include "launcher/call_plan.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string_view>
#include <system_error>

#include "backend/backend_table.h"
#include "contract/front_end.h"
#include "contract/option_table.h"
#include "contract/rank_env.h"
#include "launcher/rank_starter.h"
#include "rank/program.h"
#include "sgpu/errors.h"

namespace sgpu::launcher {

void check_option_values(const Options& options) {
  const contract::Spelling spell(options.front_end);
  if (options.gpus < 1) {
    throw ConfigError(spell("gpus") + " must be at least 1, got " + std::to_string(options.gpus));
  }
  if (options.timeout && options.timeout->count() <= 0) {
    throw ConfigError(spell("timeout") + " must be positive, got " +
                      std::to_string(options.timeout->count()) + " ms; use " + spell.no_timeout() +
                      " for no deadline");
  }
  if (options.hang_timeout && options.hang_timeout->count() <= 0) {
    throw ConfigError(spell("hang_timeout") + " must be positive, got " +
                      std::to_string(options.hang_timeout->count()) + " ms; use " +
                      spell.none("hang_timeout") + " to never judge a call hung");
  }
  if (options.rdzv_timeout.count() <= 0) {
    throw ConfigError(spell("rdzv_timeout") + " must be positive seconds, got " +
                      std::to_string(options.rdzv_timeout.count()) + " ms");
  }
  if (options.max_payload_bytes == 0) {
    throw ConfigError(spell("max_payload_bytes") + " must be positive");
  }
  if (options.teardown_grace.count() < 0) {
    throw ConfigError(spell("teardown_grace") + " must not be negative");
  }
}

namespace {

void check_options(const Options& options) {
  check_option_values(options);
  if (options.console_ranks) {
    const int world = options.gpus * std::max(options.nnodes, 1);
    for (int rank : *options.console_ranks) {
      if (rank < 0 || rank >= world) {
        throw ConfigError(contract::Spelling(options.front_end)("console_ranks") + " names rank " +
                          std::to_string(rank) + " but the call has " + std::to_string(world) +
                          " ranks (0 to " + std::to_string(world - 1) + ")");
      }
    }
  }
  if (rank::started_as_rank() || rank::started_as(contract::kWorkerRole)) {
    throw ConfigError("a distributed call was made inside a rank; nested calls are not supported");
  }
}

// Durations past kLongestDuration (a C++ caller's std::chrono::milliseconds::max(), say)
// as what they mean: no deadline for a timeout, the longest wait for a duration. Deadlines
// are now + duration in the clocks' nanoseconds, which the rest would overflow.
Options within_the_clocks(Options options) {
  const auto longest = kLongestDuration;
  for (Timeout* timeout : {&options.timeout, &options.hang_timeout}) {
    if (*timeout && **timeout > longest) *timeout = kNoTimeout;
  }
  options.teardown_grace = std::min(options.teardown_grace, longest);
  options.rdzv_timeout = std::min(options.rdzv_timeout, longest);
  return options;
}

}  // namespace

Options resolve_options(const Options& given, const nodes::NodePlan& nodes) {
  backend::check_backend_name(given.backend);  // refused whatever SGPU_BACKEND says
  Options options = within_the_clocks(contract::with_environment(given));
  options.nnodes = nodes.nnodes;
  options.node_rank = nodes.node_rank;
  check_options(options);
  return options;
}

Options world_options(Options options, int folded_nodes) {
  if (folded_nodes > 1) options.nnodes = folded_nodes;
  return options;
}

CallPlan plan_call(Options options, const RankProgram& program, int folded_nodes) {
  CallPlan plan;
  plan.folded_nodes = folded_nodes;
  plan.hang_timeout = options.hang_timeout;
  // The watchdog reads the rings: ranks that keep none are never judged hung.
  if (options.recorder_entries == 0) plan.hang_timeout = kNoTimeout;
  // The fork server forks this binary; a program's ranks are other binaries, and a
  // worker's come from its own server when it has one.
  plan.method = program.forks() ? resolve_start_method(options) : StartMethod::kExec;
  const backend::Backend& chosen = backend::choose_backend(options);
  const backend::Inventory inventory = chosen.inventory(options);
  plan.backend = std::string(chosen.name());
  plan.selection = backend::select_devices(inventory, options.gpus, options.gpu_type, plan.backend,
                                           options.front_end);
  plan.sim_node = inventory.sim_spec;
  const Options world = world_options(options, folded_nodes);
  plan.backend_env = chosen.rank_environment(world);
  program.check(chosen.computes_shapes(world), options.front_end);
  if (const std::size_t size = program.payload_bytes(); size > options.max_payload_bytes) {
    throw ConfigError("the arguments take " + std::to_string(size) + " bytes serialized, over " +
                      contract::Spelling(options.front_end)("max_payload_bytes") + " (" +
                      std::to_string(options.max_payload_bytes) +
                      "); raise the limit, or load large data inside the function");
  }
  plan.options = std::move(options);
  return plan;
}

std::filesystem::path runs_dir(const Options& options) {
  if (!options.runs_dir.empty()) return options.runs_dir;
  const char* tmp = std::getenv("TMPDIR");
  return std::filesystem::path(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") /
         ("sgpu-" + std::to_string(::getuid())) / "runs";
}

std::filesystem::path make_run_dir(const Options& options) {
  static std::atomic<unsigned> counter{0};
  const std::filesystem::path root = runs_dir(options);
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec) throw ConfigError("cannot create the runs folder " + root.string() + ": " + ec.message());
  const std::time_t now = WallClock::to_time_t(WallClock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &utc);
  const std::filesystem::path dir = root / (std::string(stamp) + "-" + std::to_string(::getpid()) +
                                            "-" + std::to_string(counter.fetch_add(1)));
  if (::mkdir(dir.c_str(), 0700) != 0) {
    throw ConfigError("cannot create the run folder " + dir.string() + ": " + std::strerror(errno));
  }
  return dir;
}

void check_runnable(const std::string& program) {
  const auto runnable = [](const std::filesystem::path& path) {
    std::error_code ec;
    return std::filesystem::is_regular_file(path, ec) && ::access(path.c_str(), X_OK) == 0;
  };
  if (program.find('/') != std::string::npos) {
    if (runnable(program)) return;
    throw ConfigError(
        "cannot run \"" + program + "\": " +
        (std::filesystem::exists(program) ? "it is not an executable file" : "no such file"));
  }
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    const auto colon = dirs.find(':');
    const std::string_view dir = dirs.substr(0, colon);
    if (runnable(std::filesystem::path(dir.empty() ? "." : std::string(dir)) / program)) return;
    if (colon == std::string_view::npos) break;
    dirs.remove_prefix(colon + 1);
  }
  throw ConfigError("cannot run \"" + program +
                    "\": no executable of that name on PATH; give its path, or check the name");
}

}  // namespace sgpu::launcher
