// A call from its plan to its handle (docs/architecture.md, "The life of one call"): the
// plan (call_plan.h), the call's run, its run folder and what is staged there, the store;
// then, on the call's own thread, its ranks started as its RankProgram says, watched by the
// Monitor, the rings read when it goes wrong, the other nodes' reports, and the results
// gathered or the error made (call_end.h).
#include "launcher/launcher.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
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
#include "contract/node_memory.h"
#include "contract/option_table.h"
#include "contract/rank_env.h"
#include "contract/run_folder.h"
#include "launcher/call_end.h"
#include "launcher/call_plan.h"
#include "launcher/failure_table.h"
#include "launcher/flight_recorder.h"
#include "launcher/hang_diagnosis.h"
#include "launcher/interrupt.h"
#include "launcher/log_stream.h"
#include "launcher/monitor.h"
#include "launcher/process.h"
#include "launcher/rank_environment.h"
#include "launcher/rank_program.h"
#include "launcher/rank_starter.h"
#include "launcher/stacks.h"
#include "nodes/node_link.h"
#include "nodes/nodes.h"
#include "nodes/peers.h"
#include "rank/accounting.h"
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
  const char* tmp = std::getenv("TMPDIR");
  return std::filesystem::path(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") /
         ("sgpu-" + std::to_string(::getuid())) / "runs";
}

namespace {

// How long output may still arrive after every rank has exited and its group was killed.
constexpr auto kDrainLimit = std::chrono::seconds(1);

class CallImpl final : public detail::Call, private MonitorHooks {
 public:
  // `front`: where the console goes and which signals cancel the call (WorkerCall's
  // console and caught_signals; a function's and a program's have the defaults).
  CallImpl(CallPlan plan, std::unique_ptr<RankProgram> program, const WorkerCall& front,
           std::filesystem::path run_dir, std::unique_ptr<tracking::CallRun> tracking,
           std::unique_ptr<nodes::NodeLink> link)
      : program_(std::move(program)),
        options_(std::move(plan.options)),
        console_(front.console),
        caught_signals_(front.caught_signals),
        backend_name_(std::move(plan.backend)),
        backend_env_(std::move(plan.backend_env)),
        selection_(std::move(plan.selection)),
        method_(plan.method),
        run_dir_(std::move(run_dir)),
        tracking_(std::move(tracking)),
        hang_timeout_(plan.hang_timeout),
        tracking_link_(tracking_ ? tracking_->link() : std::string()),
        cancel_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
        link_(std::move(link)),
        nodes_(link_ ? link_->plan() : nodes::NodePlan{}),
        folded_nodes_(plan.folded_nodes),
        node_host_(link_ ? link_->host_name() : std::string()) {}

  ~CallImpl() override {
    if (thread_.joinable()) {
      cancel();  // a call nobody waits for any more must not keep running
      thread_.join();
    }
  }

  void start() {
    starter_ =
        program_->starter(method_, backend::find_backend(backend_name_).serves_cuda(options_));
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
  bool hung() override {
    return hang_timeout_ && in_flight_for(rank_views(), *hang_timeout_, wall_now_ns());
  }

  // What the rings say now, before teardown changes it: kept for the error, and written to
  // the run folder's collectives.txt. Stacks are taken on a hang or a timeout, and on a
  // rank's failure when peers were left in a collective it names a culprit for.
  void diagnose_collectives(Outcome why) {
    if (options_.recorder_entries == 0) return;
    const Diagnosis d = diagnose_into(rank_views(), contract::RunFolder{run_dir_});
    collectives_.verdict = d.verdict;
    collectives_.culprits = d.culprits;
    collectives_.table = d.table;
    if (!d.verdict.empty() && (why != Outcome::kRankFailed || !d.culprits.empty())) {
      take_rank_stacks();
    }
  }

  // Every live rank's stacks (NOTE [Stack dumps]) into the run folder's stacks.txt, and
  // the first live culprit's main thread for the error, where the ranks' kind allows.
  void take_rank_stacks() {
    std::vector<StackTarget> targets;
    for (const RankSlot& slot : slots_) {
      if (slot.pid <= 0 || slot.exit) continue;
      if (auto target = program_->stack_target(slot)) targets.push_back(std::move(*target));
    }
    report_stacks(targets, contract::RunFolder{run_dir_}.stacks_report(), collectives_);
  }

  // What the call's error is made of (call_end.h), for `outcome`.
  CallEnd call_end(Outcome outcome, std::string reason) const {
    CallEnd end;
    end.outcome = outcome;
    end.label = program_->label();
    end.world_size = world_size();
    end.nnodes = nodes_.several() ? nodes_.nnodes : 1;
    end.rows = all_rows();
    end.run_dir = run_dir_;
    end.collectives = collectives_;
    end.stacks = stacks_text(collectives_);
    end.timeout = options_.timeout;
    end.hang_timeout = hang_timeout_;
    end.reason = std::move(reason);
    end.text = [this](const std::string& headline, const std::vector<RankFailure>& rows) {
      return failure_text(headline, rows);
    };
    return end;
  }
  int world_size() const { return options_.gpus * world_nodes(); }
  // The world's nodes: the launch's, or those a folded launch stands for.
  int world_nodes() const { return nodes_.nnodes * folded_nodes_; }

  // What a folded launch stood for (NOTE [A folded world] in sim/fold.h), `held` where its
  // second of a place (the last slot, the world's last rank) called the collectives the first
  // of that place on node 0 called. Where the second's memory peaks differ from the first's
  // (uneven shards: the last rank's share of a parameter is smaller), they are its own, and
  // the line says so with both figures. "" for a launch that does not fold.
  std::string folded_summary(bool held, const std::vector<MemoryStats>& memory) const {
    if (folded_nodes_ <= 1) return "";
    const auto [first, second] = folded_pair();
    const std::string own = held ? rank::memory_difference(slots_[first].rank, slots_[second].rank,
                                                           memory[first], memory[second])
                                 : "";
    const std::string first_rank = std::to_string(slots_[first].rank);
    std::string did =
        "which did " + std::string(held ? "" : "not do ") + "what rank " + first_rank + " did";
    if (!own.empty()) {
      did = "which called the collectives rank " + first_rank +
            " called, with memory peaks of its own (" + own + ")";
    }
    return "sgpu: " + std::to_string(slots_.size()) + " processes stood for " +
           std::to_string(world_size()) + " ranks: node 0's, each for its place on every one of " +
           std::to_string(world_nodes()) + " simulated nodes, and rank " +
           std::to_string(slots_[second].rank) + ", " + did + " (" + contract::spell("sim_fold") +
           ")\n";
  }

  // What a rank of a folded world stood for, for its failure's line; "" where the world is
  // not folded.
  std::string folded_role(const RankSlot& slot) const {
    if (folded_nodes_ <= 1) return "";
    if (slot.rank >= options_.gpus) {
      return "the second of local rank " + std::to_string(slot.local_rank) + "'s place, on the " +
             "last of " + std::to_string(world_nodes()) + " simulated nodes (" +
             contract::spell("sim_fold") + ")";
    }
    return "standing for local rank " + std::to_string(slot.local_rank) + " of every one of " +
           std::to_string(world_nodes()) + " simulated nodes (" + contract::spell("sim_fold") + ")";
  }

  // A folded world's first of the last place (node 0's) and its second (the world's last
  // rank), by slot.
  std::pair<std::size_t, std::size_t> folded_pair() const {
    return {static_cast<std::size_t>(options_.gpus - 1), slots_.size() - 1};
  }

  // In a folded world, where its second of a place did not call the collectives the first of
  // that place on node 0 called: the call's error, which says that the folding does not hold;
  // none where they are alike or the world is not folded.
  std::exception_ptr folding_unheld() const {
    if (folded_nodes_ <= 1) return nullptr;
    const auto [first, second] = folded_pair();
    const auto ring = [&](std::size_t i) {
      return contract::read_collective_ring(slots_[i].folder.collective_ring());
    };
    const std::string why = rank::collective_difference(slots_[first].rank, slots_[second].rank,
                                                        ring(first), ring(second));
    if (why.empty()) return nullptr;
    return std::make_exception_ptr(
        Error("sgpu: the folded world does not hold: " + why + ". Node 0's ranks cannot stand " +
              "for every node's where the program does not run its nodes alike: run it " +
              "unfolded (without " + contract::spell("sim_fold") + ")"));
  }

  // The rank's environment (launcher/rank_environment.h).
  std::vector<std::string> rank_env(const RankSlot& slot) const {
    RankEnvironmentPlan plan;
    contract::RankEnvironment& rank = plan.rank;
    rank.rank = slot.rank;
    rank.local_rank = slot.local_rank;
    rank.world_size = world_size();
    rank.local_world_size = options_.gpus;
    rank.node_rank = slot.rank / options_.gpus;
    rank.group_world_size = world_nodes();
    rank.master_addr = link_ ? nodes_.host : store_->host();
    rank.master_port = link_ ? nodes_.port : store_->port();
    rank.role = program_->role();
    rank.call_file = contract::RunFolder{run_dir_}.call();
    rank.rank_dir = slot.folder.dir;
    rank.device_index = slot.device_index;
    rank.backend = backend_name_;
    rank.parent_pid = ::getpid();
    rank.lifeline_fd = contract::kRankLifelineFd;
    rank.group_timeout = group_timeout();
    rank.recorder_entries = options_.recorder_entries;
    plan.run_id = link_ ? nodes_.id : run_dir_.filename().string();
    program_->add_environment(slot, plan.program);
    // A rank of another node (a folded world's second of a place) has that node's GPUs:
    // their memory is not this node's (NOTE [A node's shared device memory]).
    if (rank.node_rank != nodes_.node_rank) plan.program.push_back({contract::kNodeMemoryVar, ""});
    plan.tracking =
        tracking_ ? tracking_->rank_environment() : tracking::untracked_rank_environment();
    plan.backend = backend_env_;
    return rank_process_environment(plan, environ);
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

  // This launch's ranks: its node's, and in a folded world the last rank too, a second of
  // its place (NOTE [A folded world] in sim/fold.h).
  std::vector<int> launched_ranks() const {
    std::vector<int> ranks;
    for (int local = 0; local < options_.gpus; ++local)
      ranks.push_back(nodes_.node_rank * options_.gpus + local);
    if (folded_nodes_ > 1) ranks.push_back(world_size() - 1);
    return ranks;
  }

  void start_ranks() {
    const std::vector<int> ranks = launched_ranks();
    slots_.resize(ranks.size());
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      RankSlot& slot = slots_[i];
      const int rank = ranks[i];
      const int local = rank % options_.gpus;
      slot.rank = rank;
      slot.local_rank = local;
      slot.device_index = selection_.device_indices[static_cast<std::size_t>(local)];
      slot.folder = contract::RunFolder{run_dir_}.rank(rank);
      std::filesystem::create_directory(slot.folder.dir);
      Pipe out = make_pipe();
      Pipe err = make_pipe();
      SpawnRequest request = program_->spawn();
      request.env = rank_env(slot);
      request.stdout_fd = out.write.get();
      request.stderr_fd = err.write.get();
      slot.pid = starter_->start(request);
      const bool console = shows_on_console(rank);
      if (console && console_) {
        const auto to = [this](int stream) {
          return [this, stream](std::string_view line) { console_(stream, line); };
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

  bool exited_ok(const RankSlot& slot) const override { return program_->exited_ok(slot); }

  void diagnose(Outcome why) override { diagnose_collectives(why); }

  std::optional<std::string> peer_failure() override { return link_->poll(); }

  void tell_peers(const Verdict& verdict) override {
    link_->post_failure(node_failure(verdict.outcome, verdict.reason));
  }

  void monitor() {
    const InterruptScope interrupts(caught_signals_);
    Monitor monitor(*starter_, slots_, *this, cancel_fd_.get(), interrupts);
    try {
      start_ranks();
    } catch (const std::exception& e) {
      monitor.start_failed(e.what());
    }
    Deadlines deadlines;
    if (options_.timeout) deadlines.call = Clock::now() + *options_.timeout;
    // The hang watchdog looks at the rings this often.
    if (hang_timeout_) {
      deadlines.watch_every = std::clamp<Clock::duration>(
          *hang_timeout_ / 4, std::chrono::milliseconds(50), std::chrono::seconds(1));
    }
    // The other nodes hear from this one, and it from them, every 100 ms.
    if (link_) deadlines.peers_every = std::chrono::milliseconds(100);
    verdict_ = monitor.run(deadlines, TeardownPlan{options_.teardown_grace, kDrainLimit});
    // A node that joined node 0's run sends its ranks' spools there before node 0, which
    // waits for every node's report, can end it.
    if (tracking_ && tracking_->joined()) end_tracking(verdict_.outcome);
    if (link_) exchange_reports(verdict_);
    store_.reset();  // its port is closed before anyone sees the call end
    end_tracking(verdict_.outcome);
    finish();
  }

  // What the other nodes are told when this one fails first.
  std::string node_failure(Outcome outcome, const std::string& reason) const {
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
        what = reason;
        break;
      case Outcome::kStartFailed:
        what = "could not start its ranks: " + reason;
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
  void exchange_reports(Verdict& verdict) {
    serialize::NodeReport mine;
    mine.node_rank = nodes_.node_rank;
    mine.host = node_host_;
    mine.run_dir = run_dir_;
    for (const RankSlot& slot : slots_) mine.rows.push_back(row_for(slot));
    const bool returns = program_->returns_results() && verdict.outcome == Outcome::kSucceeded;
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
    nodes::NodeReports heard =
        nodes::hear_reports(link_->exchange(mine, published, stop), nodes_, options_.gpus, returns,
                            std::move(mine_results), verdict.outcome == Outcome::kSucceeded);
    if (!heard.peer_failure.empty()) {  // a success here that another node's end undoes
      verdict.outcome = Outcome::kPeerFailed;
      verdict.reason = std::move(heard.peer_failure);
    }
    peer_rows_ = std::move(heard.rows);
    peer_logs_ = std::move(heard.logs);
    node0_reported_ = heard.node0_reported;
    gathered_ = std::move(heard.results);
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
    row.role = folded_role(slot);
    row.time = slot.exit_time;
    row.stderr_tail = slot.err ? slot.err->tail() : "";
    if (slot.exit) {
      row.exit_code = slot.exit->exit_code;
      row.signal = slot.exit->signal;
    }
    const auto record = program_->error_record(slot);
    // When it went down without a record (NOTE [Abrupt ends]).
    const auto abrupt_end = contract::read_abrupt_end(slot.folder.abrupt_end());
    if (abrupt_end && !record) row.time = *abrupt_end;
    // A rank whose own failure was recorded (or noted) before teardown began failed in its
    // own right, even when its exit was seen only after.
    const auto before_teardown = [&](WallClock::time_point time) {
      return !verdict_.teardown_began || time < *verdict_.teardown_began;
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

  void finish() {
    const Outcome outcome = verdict_.outcome;
    std::vector<std::string> results;
    CallEnd end = call_end(outcome, verdict_.reason);
    // A fault that ends its rank, planned but never acted, cannot end in success.
    if (outcome == Outcome::kSucceeded) {
      end.unacted = backend::find_backend(backend_name_)
                        .ending_faults(world_options(options_, folded_nodes_));
    }
    std::exception_ptr error = error_of(end);  // none: a success, whose results are read
    if (!error && !program_->returns_results()) {
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
      comm.push_back(
          rank::comm_stats_of(contract::read_collective_ring(slot.folder.collective_ring())));
      compute.push_back(
          serialize::read_compute_record(slot.folder.compute()).value_or(ComputeStats{}));
    }
    const std::exception_ptr unheld = folding_unheld();
    if (!error) error = unheld;
    const bool shapes = std::any_of(compute.begin(), compute.end(),
                                    [](const ComputeStats& c) { return !c.ops.empty(); });
    if ((program_->always_prints_figures() || shapes) && any_rank_on_console()) {
      const std::string whose = nodes_.several() ? "any rank of this node" : "any rank";
      // In shape-only compute the GPUs' memory is a point of the call: each rank's peaks.
      for (const std::string& line :
           {folded_summary(!unheld, memory), rank::comm_summary(comm, whose),
            rank::compute_summary(compute, comm, whose),
            shapes ? rank::memory_summary(memory, launched_ranks()) : ""}) {
        if (line.empty()) continue;
        if (console_) {
          console_(STDERR_FILENO, line);
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

  const std::unique_ptr<RankProgram> program_;  // what the ranks run
  const Options options_;
  const ConsoleSink console_;  // unset: the caller's fds 1 and 2
  const CaughtSignals caught_signals_;
  const std::string backend_name_;
  const std::vector<std::string> backend_env_;
  const backend::Selection selection_;
  const StartMethod method_;
  const std::filesystem::path run_dir_;
  std::unique_ptr<tracking::CallRun> tracking_;  // released once its run is ended
  const Timeout hang_timeout_;                   // nullopt: never judged hung
  CollectiveDiagnosis collectives_;              // what the rings said when the call went wrong
  const std::string tracking_link_;
  bool tracking_unsent_ = false;  // spooled entries are still in the run folder
  UniqueFd cancel_fd_;
  std::unique_ptr<RankStarter> starter_;
  std::unique_ptr<rendezvous::HostStore> store_;
  std::unique_ptr<nodes::NodeLink> link_;  // several nodes: this node's link to the others
  const nodes::NodePlan nodes_;            // this node's place; one node without a link
  const int folded_nodes_;                 // CallPlan::folded_nodes
  const std::string node_host_;            // this node's host name, several nodes
  std::vector<RankFailure> peer_rows_;     // the other nodes' ranks, from their reports
  std::vector<std::string> peer_logs_;     // where the other nodes keep their logs
  std::optional<std::vector<std::string>> gathered_;  // several nodes: every rank's result
  bool node0_reported_ = true;  // false: node 0 sent no report, it shows nothing
  std::vector<RankSlot> slots_;
  Verdict verdict_;  // the monitor's, once the ranks are gone
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

// Step 4: the call's run exists before any rank starts: one run per launch, node 0's,
// which the other nodes' ranks log into.
std::unique_ptr<tracking::CallRun> begin_tracking(const CallPlan& plan, const RankProgram& program,
                                                  const WorkerCall& front, nodes::NodeLink* link) {
  const Options& options = plan.options;
  tracking::CallRunRequest request;
  request.tracking = options.tracking && options.node_rank <= 0;
  request.tracking_uri = options.tracking_uri;
  request.experiment = options.experiment;
  request.gpus = options.gpus;
  request.nnodes = std::max(options.nnodes, 1) * plan.folded_nodes;
  request.timeout = options.timeout;
  request.backend = plan.backend;
  request.gpu_type = plan.selection.gpu_type;
  request.parent_run_id = front.parent_run_id;
  request.source_name = front.source_name;
  request.sim_node = plan.sim_node;
  // The run's name: Options::name, else the function's plain name or the program's, never
  // a signature; the function param keeps it all.
  request.run_name = options.name;
  program.name_run(request);
  std::unique_ptr<tracking::CallRun> tracking;
  try {
    tracking = tracking::CallRun::begin(request);
  } catch (const std::exception& e) {
    if (link) link->post_failure("node 0 cannot track the launch: " + std::string(e.what()));
    throw;
  }
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
  return tracking;
}

std::shared_ptr<detail::Call> start(std::unique_ptr<RankProgram> program, const Options& given,
                                    const WorkerCall& front = {}) {
  // A folded world (NOTE [A folded world] in sim/fold.h) is one node's launch, node 0's
  // ranks standing for every node's.
  const int folded_nodes = nodes::folds_nodes(contract::with_environment(given)) ? given.nnodes : 1;
  Options one = given;
  if (folded_nodes > 1) one.nnodes = 1;
  // This node's place (NOTE [Several nodes]); the options carry it from here on.
  const nodes::NodePlan nodes = nodes::plan_nodes(one);
  Options options = resolve_options(one, nodes);
  // Over several nodes every node reaches node 0's store before anything else, so that
  // a node that cannot serve the launch stops all of them before any rank starts.
  std::unique_ptr<nodes::NodeLink> link;
  if (nodes.several())
    link = std::make_unique<nodes::NodeLink>(nodes, options.gpus, options.rdzv_timeout);
  CallPlan plan;
  try {
    plan = plan_call(std::move(options), *program, folded_nodes);
  } catch (const Error& e) {
    if (link) link->agree(e.what());  // a node whose own checks fail tells the others
    throw;
  }
  if (link) link->agree("");  // every node can serve the launch, or this throws
  std::unique_ptr<tracking::CallRun> tracking = begin_tracking(plan, *program, front, link.get());
  try {
    const std::filesystem::path run_dir = make_run_dir(plan.options);
    if (tracking) tracking->hold_in_flight(run_dir);  // ended KILLED should this process die
    try {
      program->stage(contract::RunFolder{run_dir}, plan.options.max_payload_bytes);
    } catch (const std::system_error& e) {  // a full or read-only runs folder, say
      throw Error("cannot stage the call in its run folder: " + std::string(e.what()) +
                  "; free space there, or put run folders elsewhere (" +
                  contract::spell("runs_dir") + ", SGPU_RUNS_DIR)");
    }
    auto call = std::make_shared<CallImpl>(std::move(plan), std::move(program), front, run_dir,
                                           std::move(tracking), std::move(link));
    call->start();
    return call;
  } catch (...) {
    if (tracking) tracking->end(tracking::RunStatus::kFailed, {});
    throw;
  }
}

}  // namespace

std::shared_ptr<detail::Call> start_call(const Options& options, serialize::CallRecord record) {
  return start(function_ranks(std::move(record)), options);
}

std::shared_ptr<detail::Call> start_program(const Options& options,
                                            std::vector<std::string> command) {
  if (command.empty()) throw ConfigError("no program to run");
  check_runnable(command.front());
  return start(program_ranks(std::move(command)), options);
}

std::shared_ptr<detail::Call> start_worker_call(const Options& options, WorkerCall call) {
  if (call.command.empty() || call.command.front().find('/') == std::string::npos) {
    throw ConfigError("a worker call needs the path of the program every rank runs");
  }
  check_runnable(call.command.front());
  std::string payload = std::move(call.payload);
  return start(worker_ranks(call, std::move(payload)), options, call);
}

}  // namespace sgpu::launcher
