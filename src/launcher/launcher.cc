// Steps 1-12 of a call (see docs/architecture.md): check, select devices, stage, host the
// store, start ranks, monitor them, tear down, gather.
#include "launcher/launcher.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <system_error>
#include <thread>

#include "backend/backend_table.h"
#include "backend/selection.h"
#include "contract/abrupt_end.h"
#include "contract/atomic_file.h"
#include "contract/collective_ring.h"
#include "contract/front_end.h"
#include "contract/rank_env.h"
#include "contract/run_folder.h"
#include "contract/stack_dump.h"
#include "launcher/accounting.h"
#include "launcher/call_end.h"
#include "launcher/failure_table.h"
#include "launcher/flight_recorder.h"
#include "launcher/fork_server.h"
#include "launcher/hang_diagnosis.h"
#include "launcher/interrupt.h"
#include "launcher/log_stream.h"
#include "launcher/node_link.h"
#include "launcher/nodes.h"
#include "launcher/process.h"
#include "launcher/program.h"
#include "launcher/rank_starter.h"
#include "launcher/stacks.h"
#include "launcher/symbols.h"
#include "rendezvous/store.h"
#include "serialize/error_record.h"
#include "serialize/memory_record.h"
#include "serialize/record.h"
#include "sgpu/errors.h"
#include "sgpu/internal/call.h"
#include "sgpu/internal/values.h"
#include "tracking/call_run.h"

extern char** environ;

namespace sgpu::launcher {

std::filesystem::path runs_dir(const Options& options) {
  if (!options.runs_dir.empty()) return options.runs_dir;
  if (const char* env = std::getenv("SGPU_RUNS_DIR"); env != nullptr && *env != '\0') return env;
  const char* tmp = std::getenv("TMPDIR");
  return std::filesystem::path(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") /
         ("sgpu-" + std::to_string(::getuid())) / "runs";
}

namespace {

using Clock = std::chrono::steady_clock;
using WallClock = std::chrono::system_clock;

// How long output may still arrive after every rank has exited and its group was killed.
constexpr auto kDrainLimit = std::chrono::seconds(1);
// How long the ranks' threads have to dump their stacks, and how much of the culprit's
// the error quotes.
constexpr auto kStackLimit = std::chrono::milliseconds(1500);
constexpr std::size_t kQuotedFrames = 24;
constexpr std::size_t kQuotedWidth = 160;  // characters of a frame

void check_options(const Options& options, bool runs_a_program) {
  if (options.gpus < 1) {
    throw ConfigError(contract::spell("gpus") + " must be at least 1, got " +
                      std::to_string(options.gpus));
  }
  if (options.timeout && options.timeout->count() <= 0) {
    throw ConfigError(contract::spell("timeout") + " must be positive, got " +
                      std::to_string(options.timeout->count()) + " ms; use " +
                      contract::spell_no_timeout() + " for no deadline");
  }
  if (options.hang_timeout && options.hang_timeout->count() <= 0) {
    throw ConfigError(contract::spell("hang_timeout") + " must be positive, got " +
                      std::to_string(options.hang_timeout->count()) + " ms; use " +
                      contract::spell_none("hang_timeout") + " to never judge a call hung");
  }
  if (options.max_payload_bytes == 0) throw ConfigError("max_payload_bytes must be positive");
  if (options.teardown_grace.count() < 0) throw ConfigError("teardown_grace must not be negative");
  if (options.console_ranks) {
    const int world = options.gpus * std::max(options.nnodes, 1);
    for (int rank : *options.console_ranks) {
      if (rank < 0 || rank >= world) {
        throw ConfigError(contract::spell("console_ranks") + " names rank " + std::to_string(rank) +
                          " but the call has " + std::to_string(world) + " ranks (0 to " +
                          std::to_string(world - 1) + ")");
      }
    }
  }
  if (!runs_a_program && program_args().empty()) {
    throw ConfigError(
        "sgpu::init(argc, argv) was not called: call it first thing in main(); every rank "
        "runs this binary again and starts there");
  }
  if (started_as_rank() || started_as("worker")) {
    throw ConfigError("a distributed call was made inside a rank; nested calls are not supported");
  }
}

// A program as execvp would find it: a path with a '/', else the first match on PATH. A
// ConfigError naming it, before anything starts, when there is none to run.
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

// Options::hang_timeout, unless SGPU_HANG_TIMEOUT (seconds, or none) says otherwise.
Timeout hang_timeout_of(const Options& options) {
  const char* env = std::getenv("SGPU_HANG_TIMEOUT");
  if (env == nullptr || *env == '\0') return options.hang_timeout;
  const std::string given = std::string("SGPU_HANG_TIMEOUT=") + env;
  try {
    const Timeout timeout = parse_timeout(env);
    if (!timeout || timeout->count() > 0) return timeout;
  } catch (const std::exception&) {
  }
  throw ConfigError(given + " is not a hang timeout: give positive seconds, or none");
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

// What a call's ranks run: the caller's function (this binary), a program (sgpu run), or
// a worker program that speaks the record protocol (WorkerCall).
enum class CallKind { kFunction, kProgram, kWorker };

struct RankSlot {
  int rank = 0;        // global: node_rank * gpus + local_rank
  int local_rank = 0;  // on this node
  int device_index = 0;
  pid_t pid = 0;
  std::unique_ptr<LogStream> out;
  std::unique_ptr<LogStream> err;
  std::optional<ExitStatus> exit;
  WallClock::time_point exit_time;
  bool exited_in_teardown = false;
  bool timed_out = false;
  contract::RankFolder folder;  // rank-<N>/
};

class CallImpl final : public detail::Call {
 public:
  // `spec`: a program's or worker's call (WorkerCall's fields; a program's has only its
  // command); empty for a function's.
  CallImpl(CallKind kind, Options options, serialize::CallRecord record, WorkerCall spec,
           std::string backend_name, std::vector<std::string> backend_env,
           backend::Selection selection, std::filesystem::path run_dir,
           std::unique_ptr<tracking::CallRun> tracking, Timeout hang_timeout,
           std::unique_ptr<NodeLink> link)
      : kind_(kind),
        options_(std::move(options)),
        record_(std::move(record)),
        spec_(std::move(spec)),
        backend_name_(std::move(backend_name)),
        backend_env_(std::move(backend_env)),
        selection_(std::move(selection)),
        run_dir_(std::move(run_dir)),
        tracking_(std::move(tracking)),
        hang_timeout_(options_.recorder_entries > 0 ? hang_timeout : kNoTimeout),
        tracking_link_(tracking_ ? tracking_->link() : std::string()),
        cancel_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
        link_(std::move(link)),
        nodes_(link_ ? link_->plan() : NodePlan{}),
        node_host_(link_ ? link_->host_name() : std::string()) {}

  ~CallImpl() override {
    if (thread_.joinable()) {
      cancel();  // a call nobody waits for any more must not keep running
      thread_.join();
    }
  }

  void start(StartMethod method) {
    if (kind_ == CallKind::kWorker && method == StartMethod::kForkServer) {
      // Ranks that serve cuda on sim fork from a server that prepared it (its own server:
      // the command differs).
      std::vector<std::string> command = spec_.fork_server;
      if (backend::find_backend(backend_name_).serves_cuda(options_)) {
        command.push_back("--cuda-on-sim");
      }
      starter_ = make_fork_server_starter(command);
    } else {
      starter_ = make_starter(method);
    }
    // Several nodes meet at node 0's store (NodeLink hosts it); one node at its own.
    if (!link_) store_ = std::make_unique<rendezvous::HostStore>("127.0.0.1");
    thread_ = std::thread([this] { monitor(); });
  }

  const std::vector<std::string>& wait() override {
    std::unique_lock lock(mutex_);
    finished_cv_.wait(lock, [this] { return finished_; });
    if (error_) std::rethrow_exception(error_);
    return results_;
  }

  std::vector<std::string> take_results() override {
    std::unique_lock lock(mutex_);
    finished_cv_.wait(lock, [this] { return finished_; });
    if (error_) std::rethrow_exception(error_);
    std::vector<std::string> taken = std::move(results_);
    results_.assign(taken.size(), std::string());
    return taken;
  }

  const std::vector<MemoryStats>& memory_stats() override {
    std::unique_lock lock(mutex_);
    finished_cv_.wait(lock, [this] { return finished_; });
    return memory_;
  }

  const std::vector<CommStats>& comm_stats() override {
    std::unique_lock lock(mutex_);
    finished_cv_.wait(lock, [this] { return finished_; });
    return comm_;
  }

  const std::vector<ComputeStats>& compute_stats() override {
    std::unique_lock lock(mutex_);
    finished_cv_.wait(lock, [this] { return finished_; });
    return compute_;
  }

  bool wait_for(std::chrono::milliseconds limit) override {
    std::unique_lock lock(mutex_);
    return finished_cv_.wait_for(lock, limit, [this] { return finished_; });
  }

  void cancel() override {
    const std::uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(cancel_fd_.get(), &one, sizeof one);
  }

  const std::filesystem::path& run_dir() const override { return run_dir_; }
  const std::string& gpu_type() const override { return selection_.gpu_type; }
  const std::string& tracking_link() const override { return tracking_link_; }

  [[noreturn]] void raise_bad_result(int rank, const std::string& why) override {
    CallEnd end = call_end(Outcome::kRankFailed, "");
    RankFailure& row = end.rows.at(static_cast<std::size_t>(rank));  // every rank, in rank order
    row.kind = RankFailure::Kind::kBadResult;
    row.message = "cannot decode its result as the function's return type: " + why;
    row.root_cause = true;
    throw DistributedError(failure_text(failed_headline(end, 1), end.rows), end.rows, run_dir_);
  }

  void results_taken() override {
    // Only now is the call a success: the folder goes unless asked to stay.
    if (options_.keep_run_dir || tracking_unsent_) return;
    std::error_code ec;
    std::filesystem::remove_all(run_dir_, ec);
  }

 private:
  // Every rank's collective ring, and how the ranks that ended did.
  std::vector<RankView> rank_views() const {
    std::vector<RankView> views;
    for (const RankSlot& slot : slots_) {
      RankView view;
      view.rank = slot.rank;
      view.ring = contract::read_collective_ring(slot.folder.collective_ring());
      if (slot.exit && slot.exit->signal) {
        view.end = "was killed by " + signal_name(*slot.exit->signal);
      } else if (slot.exit) {
        view.end = "exited with code " + std::to_string(slot.exit->exit_code.value_or(0));
      }
      views.push_back(std::move(view));
    }
    return views;
  }

  // True when some rank has been in one collective longer than the hang timeout.
  bool hung() const {
    if (!hang_timeout_) return false;
    const auto longest = longest_in_flight(rank_views());
    if (!longest) return false;
    const auto since = WallClock::time_point(std::chrono::duration_cast<WallClock::duration>(
        std::chrono::nanoseconds(longest->since_ns)));
    return WallClock::now() - since >= *hang_timeout_;
  }

  // What the rings say now, before teardown changes it: kept for the error, and written to
  // the run folder's collectives.txt. Stacks are taken on a hang or a timeout, and on a
  // rank's failure when peers were left in a collective it names a culprit for.
  void diagnose_collectives(Outcome why) {
    if (options_.recorder_entries == 0) return;
    const std::int64_t now =
        std::chrono::duration_cast<std::chrono::nanoseconds>(WallClock::now().time_since_epoch())
            .count();
    const std::vector<RankView> views = rank_views();
    const Diagnosis d = diagnose(views, now);
    collectives_.verdict = d.verdict;
    collectives_.culprits = d.culprits;
    collectives_.table = d.table;
    std::string report = d.verdict.empty() ? "" : d.verdict + "\n\n";
    report += d.table + "\n";
    try {
      contract::write_file_atomically(contract::RunFolder{run_dir_}.collectives_report(), report);
    } catch (const std::exception&) {
      // The error carries the same text.
    }
    try {
      write_flight_recorder_dumps(views, contract::RunFolder{run_dir_}.flight_recorder());
    } catch (const std::exception&) {
      // The rings stay in the run folder.
    }
    if (!d.verdict.empty() && (why != Outcome::kRankFailed || !d.culprits.empty())) {
      take_rank_stacks();
    }
  }

  // Every live rank's stacks (NOTE [Stack dumps]) into the run folder's stacks.txt, and
  // the first live culprit's main thread for the error. A program's rank is asked through
  // its program, when that is a Python program that armed its dumps (import sgpu): its
  // supervisor only waits, and another program would die of the signal.
  void take_rank_stacks() {
    std::vector<StackTarget> targets;
    for (const RankSlot& slot : slots_) {
      if (slot.pid <= 0 || slot.exit) continue;
      if (kind_ != CallKind::kProgram) {
        targets.push_back({slot.rank, slot.pid, slot.folder.dir, kind_ == CallKind::kWorker});
      } else if (const pid_t program = armed_program(slot); program > 0) {
        targets.push_back({slot.rank, program, slot.folder.dir, true});
      }
    }
    if (targets.empty()) return;
    const std::vector<RankStacks> stacks = take_stacks(targets, kStackLimit);
    std::string all;
    for (const RankStacks& rank : stacks) all += format_stacks(rank) + "\n";
    const std::filesystem::path file = contract::RunFolder{run_dir_}.stacks_report();
    try {
      contract::write_file_atomically(file, all);
      collectives_.stacks = file;
    } catch (const std::exception&) {
    }
    for (int culprit : collectives_.culprits) {
      for (const RankStacks& rank : stacks) {
        if (rank.rank != culprit || rank.threads.empty()) continue;
        RankStacks main_thread = rank;
        main_thread.threads.resize(1);
        collectives_.culprit_stack = format_stacks(main_thread, kQuotedFrames, kQuotedWidth);
        return;
      }
    }
  }

  // The pid of the program `slot`'s supervisor runs, once it has armed its stack dumps and
  // while it is that supervisor's child; 0 otherwise.
  static pid_t armed_program(const RankSlot& slot) {
    std::ifstream in(contract::program_pid_file(slot.folder.dir));
    pid_t pid = 0;
    if (!(in >> pid) || pid <= 0) return 0;
    return live_parent(pid) == slot.pid ? pid : 0;
  }

  // What the call's error is made of (call_end.h), for `outcome`.
  CallEnd call_end(Outcome outcome, std::string reason) const {
    CallEnd end;
    end.outcome = outcome;
    end.label = function_label();
    end.world_size = world_size();
    end.nnodes = nodes_.several() ? nodes_.nnodes : 1;
    end.rows = all_rows();
    end.run_dir = run_dir_;
    end.collectives = collectives_;
    end.stacks = stack_text();
    end.timeout = options_.timeout;
    end.hang_timeout = hang_timeout_;
    end.reason = std::move(reason);
    end.text = [this](const std::string& headline, const std::vector<RankFailure>& rows) {
      return failure_text(headline, rows);
    };
    return end;
  }
  int world_size() const { return options_.gpus * nodes_.nnodes; }
  std::string function_label() const {
    if (kind_ == CallKind::kProgram) return spec_.command.front();
    return record_.function_name.empty() ? "the distributed function" : record_.function_name;
  }

  // The caller's environment with the rank's variables set over it; a variable the
  // caller has under one of those names (a caller that is itself a torchrun worker, say)
  // is replaced, never passed on.
  std::vector<std::string> rank_env(const RankSlot& slot) const {
    const int world = world_size();
    contract::RankEnvironment rank;
    rank.rank = slot.rank;
    rank.local_rank = slot.local_rank;
    rank.world_size = world;
    rank.local_world_size = options_.gpus;
    rank.node_rank = nodes_.node_rank;
    rank.group_world_size = nodes_.nnodes;
    rank.master_addr = link_ ? nodes_.host : store_->host();
    rank.master_port = link_ ? nodes_.port : store_->port();
    rank.role = kind_ == CallKind::kFunction  ? "rank"
                : kind_ == CallKind::kProgram ? "program"
                                              : "worker";
    rank.call_file = contract::RunFolder{run_dir_}.call();
    rank.rank_dir = slot.folder.dir;
    rank.device_index = slot.device_index;
    rank.backend = backend_name_;
    rank.parent_pid = ::getpid();
    rank.lifeline_fd = kRankLifelineFd;
    rank.group_timeout = group_timeout();
    rank.recorder_entries = options_.recorder_entries;
    std::vector<std::pair<std::string, std::string>> vars = rank.variables();
    // PyTorch's env:// rendezvous joins the caller's store instead of hosting one.
    vars.insert(vars.end(),
                {{"TORCHELASTIC_USE_AGENT_STORE", "True"},
                 {"TORCHELASTIC_RESTART_COUNT", "0"},
                 {"TORCHELASTIC_RUN_ID", link_ ? nodes_.id : run_dir_.filename().string()}});
    // Where a program's @record (torch.distributed.elastic) writes the rank's error.
    if (kind_ == CallKind::kProgram) {
      vars.emplace_back("TORCHELASTIC_ERROR_FILE", slot.folder.torchelastic_error().string());
    }
    for (auto& var :
         tracking_ ? tracking_->rank_environment() : tracking::untracked_rank_environment()) {
      vars.push_back(std::move(var));
    }
    for (const std::string& var : backend_env_) {
      const auto eq = var.find('=');
      vars.emplace_back(var.substr(0, eq), var.substr(eq + 1));
    }
    if (world > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
      vars.emplace_back("OMP_NUM_THREADS", "1");
    }
    std::vector<std::string> env;
    for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
      const std::string_view var(*entry);
      const std::string_view name = var.substr(0, var.find('='));
      if (std::none_of(vars.begin(), vars.end(), [&](const auto& v) { return v.first == name; })) {
        env.emplace_back(var);
      }
    }
    for (const auto& [name, value] : vars) env.push_back(name + "=" + value);
    return env;
  }

  // Collectives give up with the call: its timeout, or c10d's 30 minutes without one.
  std::chrono::milliseconds group_timeout() const {
    return options_.timeout.value_or(std::chrono::minutes(30));
  }

  bool shows_on_console(int rank) const {
    if (!options_.console_ranks) return true;
    const auto& ranks = *options_.console_ranks;
    return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
  }
  bool any_rank_on_console() const {
    for (const RankSlot& slot : slots_)
      if (shows_on_console(slot.rank)) return true;
    return false;
  }

  void start_ranks() {
    slots_.resize(static_cast<std::size_t>(options_.gpus));
    for (int local = 0; local < options_.gpus; ++local) {
      RankSlot& slot = slots_[static_cast<std::size_t>(local)];
      const int rank = nodes_.node_rank * options_.gpus + local;
      slot.rank = rank;
      slot.local_rank = local;
      slot.device_index = selection_.device_indices[static_cast<std::size_t>(local)];
      slot.folder = contract::RunFolder{run_dir_}.rank(rank);
      std::filesystem::create_directory(slot.folder.dir);
      Pipe out = make_pipe();
      Pipe err = make_pipe();
      SpawnRequest request;
      // A program's ranks start as this binary in the program role, which arms the
      // parent-death signal and then becomes the program (launcher/rank_main.h); a
      // worker's are the worker program, which does that itself.
      request.program = kind_ == CallKind::kWorker ? spec_.command.front() : "/proc/self/exe";
      request.argv = kind_ == CallKind::kFunction ? program_args() : spec_.command;
      request.env = rank_env(slot);
      request.stdout_fd = out.write.get();
      request.stderr_fd = err.write.get();
      slot.pid = starter_->start(request);
      const bool console = shows_on_console(rank);
      if (console && spec_.console) {
        const auto to = [this](int stream) {
          return [this, stream](std::string_view line) { spec_.console(stream, line); };
        };
        slot.out = std::make_unique<LogStream>(std::move(out.read), rank, slot.folder.stdout_log(),
                                               to(STDOUT_FILENO));
        slot.err = std::make_unique<LogStream>(std::move(err.read), rank, slot.folder.stderr_log(),
                                               to(STDERR_FILENO));
      } else {
        slot.out = std::make_unique<LogStream>(std::move(out.read), rank, slot.folder.stdout_log(),
                                               console ? STDOUT_FILENO : -1);
        slot.err = std::make_unique<LogStream>(std::move(err.read), rank, slot.folder.stderr_log(),
                                               console ? STDERR_FILENO : -1);
      }
    }
  }

  RankSlot* slot_of(pid_t pid) {
    for (RankSlot& slot : slots_) {
      if (slot.pid == pid) return &slot;
    }
    return nullptr;
  }

  // A rank that exits on its own is a failure unless it exited 0 with its result written.
  bool exited_ok(const RankSlot& slot) const {
    if (kind_ == CallKind::kProgram) return slot.exit->exit_code == 0;
    return slot.exit->exit_code == 0 && std::filesystem::exists(slot.folder.result());
  }

  // NOTE [The monitor's phases]
  // A call's monitor loop moves through these phases in order, skipping the ones it does
  // not need; `phase_` is the one it is in and `phase_until_` when that phase's wait ends.
  //   kRunning      the ranks run and their output streams. The first failure of a rank of
  //                 its own, the deadline, cancel() or a signal decides the Outcome and
  //                 sends SIGTERM to every live rank's group: kTerminating.
  //   kTerminating  until teardown_grace has passed; then SIGKILL to what is left: kKilling.
  //   kKilling      until the kernel reports the last exit.
  //   kDraining     every rank has exited, in whatever phase (a call that succeeds comes
  //                 straight from kRunning): every group gets SIGKILL once, since what the
  //                 ranks started may still hold their output open, and output is read
  //                 until it closes or kDrainLimit has passed: kDone.
  enum class Phase { kRunning, kTerminating, kKilling, kDraining, kDone };

  void enter(Phase phase, Clock::time_point until = Clock::time_point::max()) {
    phase_ = phase;
    phase_until_ = until;
  }

  void begin_teardown(Clock::time_point now) {
    if (phase_ != Phase::kRunning) return;
    teardown_began_ = WallClock::now();
    enter(Phase::kTerminating, now + options_.teardown_grace);
    for (RankSlot& slot : slots_) {
      if (slot.pid > 0 && !slot.exit) signal_group(slot.pid, SIGTERM);
    }
  }

  bool all_ranks_exited() const {
    return std::all_of(slots_.begin(), slots_.end(),
                       [](const RankSlot& s) { return s.pid == 0 || s.exit.has_value(); });
  }

  bool output_open() const {
    return std::any_of(slots_.begin(), slots_.end(), [](const RankSlot& s) {
      return (s.out && s.out->open()) || (s.err && s.err->open());
    });
  }

  void monitor() {
    const InterruptScope interrupts(spec_.caught_signals);
    Outcome outcome = Outcome::kRunning;
    std::string start_error;
    std::string cancel_reason;
    try {
      start_ranks();
    } catch (const std::exception& e) {
      outcome = Outcome::kStartFailed;
      start_error = e.what();
      begin_teardown(Clock::now());
    }
    const Clock::time_point deadline =
        options_.timeout ? Clock::now() + *options_.timeout : Clock::time_point::max();
    // The hang watchdog looks at the rings this often.
    const auto watch_every = hang_timeout_ ? std::clamp<Clock::duration>(
                                                 *hang_timeout_ / 4, std::chrono::milliseconds(50),
                                                 std::chrono::seconds(1))
                                           : Clock::duration::max();
    Clock::time_point next_watch =
        hang_timeout_ ? Clock::now() + watch_every : Clock::time_point::max();
    while (true) {
      Clock::time_point now = Clock::now();
      if (phase_ < Phase::kDraining && all_ranks_exited()) {
        if (outcome == Outcome::kRunning) outcome = Outcome::kSucceeded;
        for (RankSlot& slot : slots_) {
          if (slot.pid > 0) signal_group(slot.pid, SIGKILL);
        }
        enter(Phase::kDraining, now + kDrainLimit);
      }
      if (phase_ == Phase::kDraining && (!output_open() || now >= phase_until_)) {
        enter(Phase::kDone);
        break;
      }

      std::vector<pollfd> fds;
      fds.push_back({cancel_fd_.get(), POLLIN, 0});
      // The signal fd stays readable once a signal came, so it is watched only while the
      // call runs, and not once the signal that came is one this call leaves to the caller
      // (caught by another call in this process that catches more).
      const int pending = InterruptScope::pending_signal();
      const bool watch_signals =
          phase_ == Phase::kRunning && (pending == 0 || interrupts.catches(pending));
      fds.push_back({watch_signals ? InterruptScope::event_fd() : -1, POLLIN, 0});
      for (RankSlot& slot : slots_) {
        if (slot.out && slot.out->open()) fds.push_back({slot.out->fd(), POLLIN, 0});
        if (slot.err && slot.err->open()) fds.push_back({slot.err->fd(), POLLIN, 0});
      }
      starter_->add_poll_fds(fds);
      const Clock::time_point wake =
          phase_ == Phase::kRunning ? std::min(deadline, next_watch) : phase_until_;
      int timeout_ms = -1;
      if (wake != Clock::time_point::max()) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(wake - now).count();
        timeout_ms = static_cast<int>(std::clamp<long long>(left, 0, 60'000));
      }
      // The other nodes hear from this one, and it from them, every 100 ms.
      if (link_ && (timeout_ms < 0 || timeout_ms > 100)) timeout_ms = 100;
      ::poll(fds.data(), fds.size(), timeout_ms);
      now = Clock::now();

      for (RankSlot& slot : slots_) {
        if (slot.out) slot.out->pump();
        if (slot.err) slot.err->pump();
      }
      for (const RankExit& exit : starter_->collect_exits()) {
        RankSlot* slot = slot_of(exit.pid);
        if (slot == nullptr || slot->exit) continue;
        slot->exit = exit.status;
        slot->exit_time = WallClock::now();
        slot->exited_in_teardown = teardown_began_.has_value();
        if (phase_ == Phase::kRunning && !exited_ok(*slot)) {
          outcome = Outcome::kRankFailed;
          diagnose_collectives(outcome);
          begin_teardown(now);
        }
      }
      if (phase_ == Phase::kRunning && (fds[0].revents & POLLIN)) {
        outcome = Outcome::kCancelled;
        cancel_reason = "cancelled";
        begin_teardown(now);
      }
      if (phase_ == Phase::kRunning && interrupts.catches(InterruptScope::pending_signal())) {
        outcome = Outcome::kCancelled;
        cancel_reason = "interrupted by " + signal_name(InterruptScope::pending_signal());
        begin_teardown(now);
      }
      if (phase_ == Phase::kRunning && now >= deadline) {
        outcome = Outcome::kTimedOut;
        for (RankSlot& slot : slots_) slot.timed_out = !slot.exit.has_value();
        diagnose_collectives(outcome);
        begin_teardown(now);
      }
      if (phase_ == Phase::kRunning && now >= next_watch) {
        next_watch = now + watch_every;
        if (hung()) {
          outcome = Outcome::kHung;
          diagnose_collectives(outcome);
          begin_teardown(now);
        }
      }
      if (link_) {
        std::optional<std::string> elsewhere = link_->poll();
        if (phase_ == Phase::kRunning && elsewhere) {
          outcome = Outcome::kPeerFailed;
          cancel_reason = std::move(*elsewhere);
          begin_teardown(now);
        } else if (phase_ != Phase::kRunning && outcome != Outcome::kPeerFailed &&
                   outcome != Outcome::kSucceeded) {
          link_->post_failure(node_failure(outcome, cancel_reason, start_error));
        }
      }
      if (phase_ == Phase::kTerminating && now >= phase_until_) {
        for (RankSlot& slot : slots_) {
          if (slot.pid > 0 && !slot.exit) {
            // While the rank lives, what it started (a daemon in a session of its own too)
            // is in its tree, a child subreaper's; once it dies, that would be orphaned.
            kill_descendants(slot.pid);
            signal_group(slot.pid, SIGKILL);
          }
        }
        enter(Phase::kKilling);
      }
    }
    // Final sweep: every group (grandchildren included) is gone before the zombies are
    // reaped, so no process group id can have been reused.
    for (RankSlot& slot : slots_) {
      if (slot.pid > 0) signal_group(slot.pid, SIGKILL);
    }
    starter_->release();
    for (RankSlot& slot : slots_) {
      if (slot.out) slot.out->close();
      if (slot.err) slot.err->close();
    }
    // A node that joined node 0's run sends its ranks' spools there before node 0, which
    // waits for every node's report, can end it.
    if (tracking_ && tracking_->joined()) end_tracking(outcome);
    if (link_) exchange_reports(outcome, cancel_reason);
    store_.reset();  // its port is closed before anyone sees the call end
    end_tracking(outcome);
    finish(outcome, start_error, cancel_reason);
  }

  // What the other nodes are told when this one fails first.
  std::string node_failure(Outcome outcome, const std::string& cancel_reason,
                           const std::string& start_error) const {
    std::string what;
    switch (outcome) {
      case Outcome::kRankFailed:
        for (const RankSlot& slot : slots_) {
          if (!slot.exit || slot.exited_in_teardown || exited_ok(slot)) continue;
          what = "rank " + std::to_string(slot.rank) + " " +
                 (slot.exit->signal
                      ? "was killed by " + signal_name(*slot.exit->signal)
                      : "exited with code " + std::to_string(slot.exit->exit_code.value_or(0)));
          break;
        }
        if (what.empty()) what = "a rank failed";
        break;
      case Outcome::kTimedOut:
        what = "timed out after " + std::to_string(options_.timeout->count()) + " ms";
        break;
      case Outcome::kHung:
        what = "hung: " + collectives_.verdict;
        break;
      case Outcome::kCancelled:
        what = cancel_reason;
        break;
      case Outcome::kStartFailed:
        what = "could not start its ranks: " + start_error;
        break;
      default:
        what = "failed";
    }
    return "node " + std::to_string(nodes_.node_rank) + " (" + node_host_ + ") " + what;
  }

  // Once this node's ranks are gone: its report to the others and theirs to it (waiting,
  // after a success here, for the nodes still running). A success here is the launch's
  // failure when another node failed or went away. A distributed function's results
  // travel with the reports: every node's call returns every rank's, in global rank order.
  void exchange_reports(Outcome& outcome, std::string& cancel_reason) {
    serialize::NodeReport mine;
    mine.node_rank = nodes_.node_rank;
    mine.host = node_host_;
    mine.run_dir = run_dir_;
    for (const RankSlot& slot : slots_) mine.rows.push_back(row_for(slot));
    const bool returns = kind_ != CallKind::kProgram && outcome == Outcome::kSucceeded;
    std::vector<std::string> mine_results;
    std::optional<std::string> published;
    if (returns) {
      try {
        for (const RankSlot& slot : slots_) {
          mine_results.push_back(serialize::read_record_file(
              slot.folder.result(), serialize::RecordKind::kResult, options_.max_payload_bytes));
        }
        published = serialize::to_bytes(mine_results);
      } catch (const serialize::RecordError&) {
        mine_results.clear();  // finish() says which rank's result is bad
      }
    }
    const auto stop = [this] {
      pollfd fd{cancel_fd_.get(), POLLIN, 0};
      return InterruptScope::pending_signal() != 0 || ::poll(&fd, 1, 0) > 0;
    };
    const std::vector<NodeLink::Told> told = link_->exchange(mine, published, stop);
    std::vector<bool> reported(static_cast<std::size_t>(nodes_.nnodes), false);
    std::vector<std::vector<std::string>> results(static_cast<std::size_t>(nodes_.nnodes));
    results[static_cast<std::size_t>(nodes_.node_rank)] = std::move(mine_results);
    std::string missing_results;
    for (const auto& [report, node_results] : told) {
      if (report.node_rank < 0 || report.node_rank >= nodes_.nnodes) continue;
      reported[static_cast<std::size_t>(report.node_rank)] = true;
      if (report.node_rank == nodes_.node_rank) continue;
      if (returns) {
        try {
          if (node_results) {
            results[static_cast<std::size_t>(report.node_rank)] =
                serialize::from_bytes<std::vector<std::string>>(*node_results);
          }
        } catch (const std::exception&) {  // cereal's: bytes that hold no results
        }
        if (results[static_cast<std::size_t>(report.node_rank)].size() !=
                static_cast<std::size_t>(options_.gpus) &&
            missing_results.empty()) {
          missing_results = "node " + std::to_string(report.node_rank) + " (" + report.host + ")";
        }
      }
      peer_logs_.push_back("logs of node " + std::to_string(report.node_rank) + " (" + report.host +
                           "): " + report.run_dir.string());
      for (const RankFailure& row : report.rows) {
        peer_rows_.push_back(row);
        if (outcome == Outcome::kSucceeded && row.kind != RankFailure::Kind::kOk) {
          outcome = Outcome::kPeerFailed;
          cancel_reason = "node " + std::to_string(report.node_rank) + " (" + report.host +
                          ") failed after this node's ranks had finished";
        }
      }
    }
    node0_reported_ = reported[0];
    for (int node = 0; node < nodes_.nnodes; ++node) {
      if (reported[static_cast<std::size_t>(node)]) continue;
      peer_logs_.push_back("node " + std::to_string(node) + " sent no report: its sgpu is gone");
      if (outcome == Outcome::kSucceeded) {
        outcome = Outcome::kPeerFailed;
        cancel_reason = "node " + std::to_string(node) + " sent no report: its sgpu is gone";
      }
    }
    if (returns && outcome == Outcome::kSucceeded && !missing_results.empty()) {
      outcome = Outcome::kPeerFailed;
      cancel_reason = missing_results +
                      "'s ranks finished, but their results did not reach this node; its "
                      "logs say more";
    }
    if (returns && outcome == Outcome::kSucceeded &&
        results[static_cast<std::size_t>(nodes_.node_rank)].size() == slots_.size()) {
      gathered_.emplace();
      for (auto& node_results : results) {
        for (std::string& result : node_results) gathered_->push_back(std::move(result));
      }
    }
    link_.reset();  // node 0: the store stays until every node has read the reports
  }

  // The error's text. Over several nodes, node 0 shows every rank; the others show their
  // own and say where the rest is.
  std::string failure_text(const std::string& headline,
                           const std::vector<RankFailure>& rows) const {
    if (!nodes_.several()) return format_failure(headline, rows, run_dir_);
    if (nodes_.node_rank == 0) {
      std::string text = format_failure(headline, rows, run_dir_);
      for (const std::string& line : peer_logs_) text += "\n" + line;
      return text;
    }
    std::vector<RankFailure> here;
    for (const RankFailure& row : rows) {
      if (row.node_rank == nodes_.node_rank || row.root_cause) here.push_back(row);
    }
    return format_failure(
        headline + "\nnode 0 (" + nodes_.host + ")" +
            (node0_reported_ ? " shows every rank of the launch" : " is gone; this node's ranks:"),
        here, run_dir_);
  }

  // Step 4's other half: the run ends once every rank is gone, so it holds everything the
  // ranks logged (and spooled) before the caller sees the call end.
  void end_tracking(Outcome outcome) {
    if (!tracking_) return;
    tracking::RunStatus status = tracking::RunStatus::kFailed;
    if (outcome == Outcome::kSucceeded) status = tracking::RunStatus::kFinished;
    if (outcome == Outcome::kTimedOut || outcome == Outcome::kCancelled) {
      status = tracking::RunStatus::kKilled;
    }
    // A successful call's folder is removed unless asked to stay; kept only for what is
    // unsent, it goes once that is sent (tracking/pending.h).
    const bool kept_for_tracking_only = outcome == Outcome::kSucceeded && !options_.keep_run_dir;
    tracking_unsent_ = !tracking_->end(status, run_dir_, kept_for_tracking_only);
    tracking_.reset();  // its store's connection: a finished call a handle keeps holds none
  }

  // The culprit's stack as the error quotes it, and where the others are; "" without.
  std::string stack_text() const {
    std::string text;
    if (!collectives_.culprit_stack.empty()) {
      text += "\nthe stack of " + collectives_.culprit_stack;
      text.pop_back();
    }
    if (!collectives_.stacks.empty()) {
      text += "\nevery live rank's stacks: " + collectives_.stacks.string();
    }
    return text;
  }

  // Every rank's row, this node's and the other nodes' (from their reports), in rank order.
  std::vector<RankFailure> all_rows() const {
    std::vector<RankFailure> rows;
    for (const RankSlot& slot : slots_) rows.push_back(row_for(slot));
    if (!peer_rows_.empty()) {
      rows.insert(rows.end(), peer_rows_.begin(), peer_rows_.end());
      std::sort(rows.begin(), rows.end(),
                [](const auto& a, const auto& b) { return a.rank < b.rank; });
    }
    return rows;
  }

  RankFailure row_for(const RankSlot& slot) const {
    RankFailure row;
    row.rank = slot.rank;
    row.local_rank = slot.local_rank;
    if (link_ || nodes_.several()) {
      row.node_rank = nodes_.node_rank;
      row.host = node_host_;
    }
    row.pid = slot.pid;
    row.time = slot.exit_time;
    row.stderr_tail = slot.err ? slot.err->tail() : "";
    if (slot.exit) {
      row.exit_code = slot.exit->exit_code;
      row.signal = slot.exit->signal;
    }
    auto record = serialize::read_error_record(slot.folder.error());
    if (!record && kind_ == CallKind::kProgram) {
      record = serialize::read_torchelastic_error(slot.folder.torchelastic_error());
    }
    // When it went down without a record (NOTE [Abrupt ends]).
    const auto abrupt_end = contract::read_abrupt_end(slot.folder.abrupt_end());
    if (abrupt_end && !record) row.time = *abrupt_end;
    // A rank whose own failure was recorded (or noted) before teardown began failed in its
    // own right, even when its exit was seen only after.
    const auto before_teardown = [&](WallClock::time_point time) {
      return !teardown_began_ || time < *teardown_began_;
    };
    const bool failed_before_teardown =
        slot.exit &&
        ((record && slot.exit->exit_code.value_or(0) != 0 && before_teardown(record->time)) ||
         (!record && abrupt_end && before_teardown(*abrupt_end)));
    if (slot.timed_out) {
      row.kind = RankFailure::Kind::kTimedOut;
    } else if (!failed_before_teardown && (!slot.exit || slot.exited_in_teardown)) {
      row.kind = RankFailure::Kind::kTerminated;
    } else if (exited_ok(slot)) {
      row.kind = RankFailure::Kind::kOk;
    } else if (slot.exit->signal) {
      row.kind = RankFailure::Kind::kSignal;
    } else if (record && slot.exit->exit_code != 0) {
      row.kind = RankFailure::Kind::kException;
      row.exception_type = record->type;
      row.message = record->message;
      if (record->time.time_since_epoch().count() != 0) row.time = record->time;
    } else if (slot.exit->exit_code != 0) {
      row.kind = RankFailure::Kind::kExitCode;
    } else {
      row.kind = RankFailure::Kind::kBadResult;
      row.message = "exited with code 0 without writing a result (did it call exit()?)";
    }
    return row;
  }

  void finish(Outcome outcome, const std::string& start_error, const std::string& cancel_reason) {
    std::vector<std::string> results;
    CallEnd end = call_end(outcome, outcome == Outcome::kStartFailed ? start_error : cancel_reason);
    // A fault that ends its rank, planned but never acted, cannot end in success.
    if (outcome == Outcome::kSucceeded) {
      end.unacted = backend::find_backend(backend_name_).ending_faults(options_);
    }
    std::exception_ptr error = error_of(end);  // none: a success, whose results are read
    if (!error && kind_ == CallKind::kProgram) {
      results.assign(slots_.size(), std::string());
    } else if (!error && gathered_) {
      results = std::move(*gathered_);  // every node's, from exchange_reports()
    } else if (!error) {
      for (std::size_t i = 0; i < slots_.size() && !error; ++i) {
        try {
          results.push_back(serialize::read_record_file(slots_[i].folder.result(),
                                                        serialize::RecordKind::kResult,
                                                        options_.max_payload_bytes));
        } catch (const serialize::RecordError& e) {
          // Over several nodes the rows are every node's, in global rank order.
          RankFailure& row = *std::find_if(end.rows.begin(), end.rows.end(),
                                           [&](auto& r) { return r.rank == slots_[i].rank; });
          row.kind = RankFailure::Kind::kBadResult;
          row.message = e.what();
          row.root_cause = true;
          error = std::make_exception_ptr(DistributedError(
              failure_text(failed_headline(end, 1), end.rows), end.rows, run_dir_));
        }
      }
    }
    std::vector<MemoryStats> memory;
    std::vector<CommStats> comm;
    std::vector<ComputeStats> compute;
    for (const RankSlot& slot : slots_) {
      memory.push_back(serialize::read_memory_record(slot.folder.memory()).value_or(MemoryStats{}));
      comm.push_back(comm_stats_of(contract::read_collective_ring(slot.folder.collective_ring())));
      compute.push_back(
          serialize::read_compute_record(slot.folder.compute()).value_or(ComputeStats{}));
    }
    // A program's lines only when it ran in shape-only compute, whose figures are the point.
    const bool shapes = std::any_of(compute.begin(), compute.end(),
                                    [](const ComputeStats& c) { return !c.ops.empty(); });
    if ((kind_ != CallKind::kProgram || shapes) && any_rank_on_console()) {
      const std::string whose = nodes_.several() ? "any rank of this node" : "any rank";
      for (const std::string& line :
           {comm_summary(comm, whose), compute_summary(compute, comm, whose)}) {
        if (line.empty()) continue;
        if (spec_.console) {
          spec_.console(STDERR_FILENO, line);
        } else {
          std::cerr << line << std::flush;
        }
      }
    }
    {
      std::lock_guard lock(mutex_);
      results_ = std::move(results);
      memory_ = std::move(memory);
      comm_ = std::move(comm);
      compute_ = std::move(compute);
      error_ = error;
      finished_ = true;
    }
    finished_cv_.notify_all();
  }

  const CallKind kind_;
  const Options options_;
  const serialize::CallRecord record_;
  const WorkerCall spec_;  // a program's or worker's call: what each rank runs, and how
  const std::string backend_name_;
  const std::vector<std::string> backend_env_;
  const backend::Selection selection_;
  const std::filesystem::path run_dir_;
  std::unique_ptr<tracking::CallRun> tracking_;  // released once its run is ended
  const Timeout hang_timeout_;                   // nullopt: never judged hung
  CollectiveDiagnosis collectives_;              // what the rings said when the call went wrong
  const std::string tracking_link_;
  bool tracking_unsent_ = false;  // spooled entries are still in the run folder
  UniqueFd cancel_fd_;
  std::unique_ptr<RankStarter> starter_;
  std::unique_ptr<rendezvous::HostStore> store_;
  std::unique_ptr<NodeLink> link_;      // several nodes: this node's link to the others
  const NodePlan nodes_;                // this node's place; one node without a link
  const std::string node_host_;         // this node's host name, several nodes
  std::vector<RankFailure> peer_rows_;  // the other nodes' ranks, from their reports
  std::vector<std::string> peer_logs_;  // where the other nodes keep their logs
  std::optional<std::vector<std::string>> gathered_;  // several nodes: every rank's result
  bool node0_reported_ = true;  // false: node 0 sent no report, it shows nothing
  std::vector<RankSlot> slots_;
  Phase phase_ = Phase::kRunning;  // NOTE [The monitor's phases]
  Clock::time_point phase_until_ = Clock::time_point::max();
  std::optional<WallClock::time_point> teardown_began_;
  std::thread thread_;

  std::mutex mutex_;
  std::condition_variable finished_cv_;
  bool finished_ = false;
  std::vector<std::string> results_;
  std::vector<MemoryStats> memory_;
  std::vector<CommStats> comm_;
  std::vector<ComputeStats> compute_;
  std::exception_ptr error_;
};

std::shared_ptr<detail::Call> start_checked(CallKind kind, const Options& options,
                                            serialize::CallRecord record, WorkerCall spec,
                                            std::unique_ptr<NodeLink> link) {
  // A node whose own checks fail tells the others before it throws.
  const auto refuse = [&](const std::exception& e) {
    if (link) link->agree(e.what());
  };
  Timeout hang_timeout;
  StartMethod method = StartMethod::kExec;
  const backend::Backend* chosen_backend = nullptr;
  backend::Inventory inventory;
  backend::Selection selection;
  std::vector<std::string> backend_env;
  try {
    hang_timeout = hang_timeout_of(options);
    // The fork server forks this binary; a program's ranks are other binaries, and a
    // worker's come from its own server when it has one.
    const bool forks = kind == CallKind::kFunction || !spec.fork_server.empty();
    method = forks ? launcher::resolve_start_method(options) : StartMethod::kExec;
    chosen_backend = &backend::choose_backend(options);
    inventory = chosen_backend->inventory(options);
    selection =
        backend::select_devices(inventory, options.gpus, options.gpu_type, chosen_backend->name());
    backend_env = chosen_backend->rank_environment(options);
    // Shapes without data are Python's, whose tensors can be fake ones: a C++ function's
    // ranks would compute on nothing and move nothing. A program's rank checks at its end
    // that the program ran in shapes (NOTE [A program's supervisor]).
    const std::string shapes = std::string(contract::kSimComputeVar) + "=shapes";
    if (kind == CallKind::kFunction &&
        std::find(backend_env.begin(), backend_env.end(), shapes) != backend_env.end()) {
      throw ConfigError(contract::spell("sim_compute", "shapes") +
                        " is for Python code (the decorator's ranks, or a Python program under "
                        "sgpu run, whose tensors can be fake ones); a C++ function's ranks "
                        "compute on data: leave it \"values\"");
    }
    if (const std::size_t size = std::max(record.args.size(), spec.payload.size());
        size > options.max_payload_bytes) {
      throw ConfigError("the arguments take " + std::to_string(size) +
                        " bytes serialized, over max_payload_bytes (" +
                        std::to_string(options.max_payload_bytes) +
                        "); raise the limit, or load large data inside the function");
    }
  } catch (const Error& e) {
    refuse(e);
    throw;
  }
  const backend::Backend& chosen = *chosen_backend;
  if (link) link->agree("");  // every node can serve the launch, or this throws
  record.max_payload_bytes = options.max_payload_bytes;
  // 4. tracking: the call's run exists before any rank starts.
  tracking::CallRunRequest run_request;
  // One run per launch: node 0's (the others join it below).
  run_request.tracking = options.tracking && options.node_rank <= 0;
  run_request.tracking_uri = options.tracking_uri;
  run_request.experiment = options.experiment;
  run_request.gpus = options.gpus;
  run_request.nnodes = std::max(options.nnodes, 1);
  run_request.timeout = options.timeout;
  run_request.backend = std::string(chosen.name());
  run_request.gpu_type = selection.gpu_type;
  run_request.program = kind == CallKind::kProgram;
  run_request.parent_run_id = spec.parent_run_id;
  // The run's name: Options::name, else the function's plain name or the program's
  // (`python train.py` is train.py), never a signature; the function param keeps it all.
  run_request.run_name = options.name;
  if (kind == CallKind::kProgram) {
    for (const std::string& word : spec.command) {
      run_request.function_name += (run_request.function_name.empty() ? "" : " ") + word;
    }
    if (run_request.run_name.empty()) run_request.run_name = program_run_name(spec.command);
  } else if (!record.function_name.empty()) {
    run_request.function_name = record.function_name;
    if (run_request.run_name.empty()) run_request.run_name = plain_name(record.function_name);
  } else {
    // A function the binary keeps no name for (a stripped static one): its type.
    run_request.function_name = "a function of type " + demangle(record.signature);
    if (run_request.run_name.empty() && !program_args().empty()) {
      run_request.run_name = program_run_name({program_args().front()});  // the binary's name
    }
  }
  run_request.sim_node = inventory.sim_spec;
  std::unique_ptr<tracking::CallRun> tracking;
  try {
    tracking = tracking::CallRun::begin(run_request);
  } catch (const std::exception& e) {
    if (link) link->post_failure("node 0 cannot track the launch: " + std::string(e.what()));
    throw;
  }
  // Over several nodes the launch is node 0's run; the other nodes' ranks log into it.
  if (link && options.node_rank == 0) {
    const auto shared = tracking ? tracking->shared() : tracking::CallRun::Shared{};
    link->share_run(shared.run_id.empty()
                        ? ""
                        : shared.uri + "\n" + shared.experiment_id + "\n" + shared.run_id);
  } else if (link) {
    std::istringstream run(link->node0_run());
    tracking::CallRun::Shared shared;
    std::getline(run, shared.uri);
    std::getline(run, shared.experiment_id);
    std::getline(run, shared.run_id);
    tracking = tracking::CallRun::join(options.tracking, shared);
  }
  try {
    const std::filesystem::path run_dir = launcher::make_run_dir(options);
    if (tracking) tracking->hold_in_flight(run_dir);  // ended KILLED should this process die
    try {
      if (kind == CallKind::kFunction) {
        serialize::write_record_file(contract::RunFolder{run_dir}.call(),
                                     serialize::RecordKind::kCall, serialize::to_bytes(record));
      } else if (kind == CallKind::kWorker) {
        serialize::write_record_file(contract::RunFolder{run_dir}.call(),
                                     serialize::RecordKind::kWorkerCall, spec.payload);
      }
    } catch (const std::system_error& e) {  // a full or read-only runs folder, say
      throw Error("cannot stage the call in its run folder: " + std::string(e.what()) +
                  "; free space there, or put run folders elsewhere (" +
                  contract::spell("runs_dir") + ", SGPU_RUNS_DIR)");
    }
    spec.payload.clear();  // staged: the ranks read it from call.bin
    auto call = std::make_shared<launcher::CallImpl>(
        kind, options, std::move(record), std::move(spec), std::string(chosen.name()),
        std::move(backend_env), std::move(selection), run_dir, std::move(tracking), hang_timeout,
        std::move(link));
    call->start(method);
    return call;
  } catch (...) {
    if (tracking) tracking->end(tracking::RunStatus::kFailed, {});
    throw;
  }
}

std::shared_ptr<detail::Call> start(CallKind kind, const Options& given,
                                    serialize::CallRecord record, WorkerCall spec = {}) {
  const bool runs_a_program = kind != CallKind::kFunction;
  // This node's place (NOTE [Several nodes]); the options carry it from here on.
  const NodePlan nodes = plan_nodes(given);
  Options options = within_the_clocks(given);
  options.nnodes = nodes.nnodes;
  options.node_rank = nodes.node_rank;
  launcher::check_options(options, runs_a_program);
  // Over several nodes every node reaches node 0's store before anything else, so that
  // a node that cannot serve the launch stops all of them before any rank starts.
  std::unique_ptr<NodeLink> link;
  if (nodes.several()) link = std::make_unique<NodeLink>(nodes, options.gpus, options.rdzv_timeout);
  return start_checked(kind, options, std::move(record), std::move(spec), std::move(link));
}

}  // namespace

std::shared_ptr<detail::Call> start_call(const Options& options, serialize::CallRecord record) {
  return start(CallKind::kFunction, options, std::move(record), {});
}

std::shared_ptr<detail::Call> start_program(const Options& options,
                                            std::vector<std::string> command) {
  if (command.empty()) throw ConfigError("no program to run");
  check_runnable(command.front());
  WorkerCall spec;
  spec.command = std::move(command);
  return start(CallKind::kProgram, options, serialize::CallRecord{}, std::move(spec));
}

std::shared_ptr<detail::Call> start_worker_call(const Options& options, WorkerCall call) {
  if (call.command.empty() || call.command.front().find('/') == std::string::npos) {
    throw ConfigError("a worker call needs the path of the program every rank runs");
  }
  check_runnable(call.command.front());
  serialize::CallRecord record;
  record.function_name = call.function_name;
  return start(CallKind::kWorker, options, std::move(record), std::move(call));
}

}  // namespace sgpu::launcher
