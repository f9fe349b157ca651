#include "launcher/attempt.h"

#include <unistd.h>

#include <algorithm>
#include <thread>

#include "contract/abrupt_end.h"
#include "contract/collective_ring.h"
#include "contract/front_end.h"
#include "contract/node_memory.h"
#include "contract/rank_env.h"
#include "contract/run_folder.h"
#include "launcher/flight_recorder.h"
#include "launcher/hang_diagnosis.h"
#include "launcher/log_stream.h"
#include "launcher/process.h"
#include "launcher/rank_environment.h"
#include "launcher/stacks.h"
#include "rank/accounting.h"
#include "rank/rank_protocol.h"
#include "serialize/memory_record.h"
#include "serialize/record.h"

extern char** environ;

namespace sgpu::launcher {
namespace {

// How long output may still arrive after every rank has exited and its group was killed.
constexpr auto kDrainLimit = std::chrono::seconds(1);

// How long a rank's failure waits for peers that are running but have not entered the
// collective the verdict is about (Attempt::settled_diagnosis).
constexpr auto kLatePeerGrace = std::chrono::seconds(2);

}  // namespace

Attempt::Attempt(const CallSetup& call, Peers& peers, RankStarter& starter,
                 std::vector<std::pair<std::string, std::string>> tracking_env)
    : call_(call), peers_(peers), starter_(starter), tracking_env_(std::move(tracking_env)) {}

Verdict Attempt::run(int cancel_fd, const InterruptScope& interrupts) {
  const Options& options = call_.options;
  Monitor monitor(starter_, slots_, *this, cancel_fd, interrupts);
  try {
    start_ranks();
  } catch (const std::exception& e) {
    monitor.start_failed(e.what());
  }
  Deadlines deadlines;
  if (options.timeout) deadlines.call = Clock::now() + *options.timeout;
  // The hang watchdog looks at the rings this often.
  if (call_.hang_timeout) {
    deadlines.watch_every = std::clamp<Clock::duration>(
        *call_.hang_timeout / 4, std::chrono::milliseconds(50), std::chrono::seconds(1));
  }
  deadlines.peers_every = peers_.hear_every();
  verdict_ = monitor.run(deadlines, TeardownPlan{options.teardown_grace, kDrainLimit});
  return verdict_;
}

// This launch's ranks: its node's, and in a folded world the last rank too, a second of its
// place (NOTE [A folded world] in sim/fold.h).
std::vector<int> Attempt::launched_ranks() const {
  const int gpus = call_.options.gpus;
  std::vector<int> ranks;
  for (int local = 0; local < gpus; ++local)
    ranks.push_back(peers_.plan().node_rank * gpus + local);
  if (call_.folded_nodes > 1) ranks.push_back(world_size() - 1);
  return ranks;
}

void Attempt::start_ranks() {
  const std::vector<int> ranks = launched_ranks();
  slots_.resize(ranks.size());
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    RankSlot& slot = slots_[i];
    const int rank = ranks[i];
    const int local = rank % call_.options.gpus;
    slot.rank = rank;
    slot.local_rank = local;
    slot.device_index = call_.selection.device_indices[static_cast<std::size_t>(local)];
    slot.folder = contract::RunFolder{call_.run_dir}.rank(rank);
    std::filesystem::create_directory(slot.folder.dir);
    Pipe out = make_pipe();
    Pipe err = make_pipe();
    SpawnRequest request = call_.program->spawn();
    request.env = rank_env(slot);
    request.stdout_fd = out.write.get();
    request.stderr_fd = err.write.get();
    slot.pid = starter_.start(request);
    const bool console = shows_on_console(rank);
    if (console && call_.console) {
      const auto to = [this](int stream) {
        return [this, stream](std::string_view line) { call_.console(stream, line); };
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

// The rank's environment (launcher/rank_environment.h).
std::vector<std::string> Attempt::rank_env(const RankSlot& slot) const {
  const Options& options = call_.options;
  RankEnvironmentPlan plan;
  contract::RankEnvironment& rank = plan.rank;
  rank.rank = slot.rank;
  rank.local_rank = slot.local_rank;
  rank.world_size = world_size();
  rank.local_world_size = options.gpus;
  rank.node_rank = slot.rank / options.gpus;
  rank.group_world_size = world_nodes();
  rank.master_addr = peers_.store_host();
  rank.master_port = peers_.store_port();
  rank.role = call_.program->role();
  rank.call_file = contract::RunFolder{call_.run_dir}.call();
  rank.rank_dir = slot.folder.dir;
  rank.device_index = slot.device_index;
  rank.backend = call_.backend;
  rank.parent_pid = ::getpid();
  rank.lifeline_fd = contract::kRankLifelineFd;
  // Collectives give up with the call: its timeout, or c10d's 30 minutes without one.
  rank.group_timeout = options.timeout.value_or(std::chrono::minutes(30));
  rank.recorder_entries = options.recorder_entries;
  plan.run_id = peers_.run_id(call_.run_dir);
  call_.program->add_environment(slot, plan.program);
  // A rank of another node (a folded world's second of a place) has that node's GPUs:
  // their memory is not this node's (NOTE [A node's shared device memory]).
  if (rank.node_rank != peers_.plan().node_rank) {
    plan.program.push_back({contract::kNodeMemoryVar, ""});
  }
  plan.tracking = tracking_env_;
  plan.backend = call_.backend_env;
  return rank_process_environment(plan, environ);
}

bool Attempt::shows_on_console(int rank) const {
  if (!call_.options.console_ranks) return true;
  const auto& ranks = *call_.options.console_ranks;
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

// Every rank's collective ring, and how the ranks that ended did.
std::vector<RankView> Attempt::rank_views() const {
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
bool Attempt::hung() {
  return call_.hang_timeout && in_flight_for(rank_views(), *call_.hang_timeout, wall_now_ns());
}

// What the rings say now, before teardown changes it: kept for the error, and written to the
// run folder's collectives.txt. Stacks are taken on a hang or a timeout, and on a rank's
// failure when peers were left in a collective it names a culprit for.
void Attempt::diagnose(Outcome why) {
  if (call_.options.recorder_entries == 0) return;
  std::vector<RankView> views;
  const Diagnosis d = settled_diagnosis(why, views);
  write_diagnosis(d, views, contract::RunFolder{call_.run_dir});
  collectives_.verdict = d.verdict;
  collectives_.culprits = d.culprits;
  collectives_.table = d.table;
  if (!d.verdict.empty() && (why != Outcome::kRankFailed || !d.culprits.empty())) {
    take_rank_stacks();
  }
}

// The verdict, and in `views` the rings it judged. A rank can fail in a collective before a slower
// peer has entered it (Gloo fails a rank handed another size at once): where the rings name a peer
// that is still running as never having entered, a rank's failure waits up to kLatePeerGrace for
// it, so that the verdict weighs what the peer calls rather than its lateness. A hang or a timeout
// has already waited.
Diagnosis Attempt::settled_diagnosis(Outcome why, std::vector<RankView>& views) const {
  const auto until = Clock::now() + kLatePeerGrace;
  for (;;) {
    views = rank_views();
    Diagnosis d = launcher::diagnose(views, wall_now_ns());
    if (why != Outcome::kRankFailed || Clock::now() >= until) return d;
    const bool late_peer =
        d.kind == Diagnosis::Kind::kMissing &&
        std::any_of(d.culprits.begin(), d.culprits.end(), [&](int rank) {
          return std::any_of(slots_.begin(), slots_.end(), [&](const RankSlot& slot) {
            return slot.rank == rank && slot.pid > 0 && !slot.exit;
          });
        });
    if (!late_peer) return d;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Every live rank's stacks (NOTE [Stack dumps]) into the run folder's stacks.txt, and the
// first live culprit's main thread for the error, where the ranks' kind allows.
void Attempt::take_rank_stacks() {
  std::vector<StackTarget> targets;
  for (const RankSlot& slot : slots_) {
    if (slot.pid <= 0 || slot.exit) continue;
    if (auto target = call_.program->stack_target(slot)) targets.push_back(std::move(*target));
  }
  report_stacks(targets, contract::RunFolder{call_.run_dir}.stacks_report(), collectives_);
}

void Attempt::tell_peers(const Verdict& verdict) { peers_.tell_failure(what_failed(verdict)); }

// What the other nodes are told when this one fails first.
std::string Attempt::what_failed(const Verdict& verdict) const {
  switch (verdict.outcome) {
    case Outcome::kRankFailed:
      for (const RankSlot& slot : slots_) {
        if (!slot.exit || slot.exited_in_teardown || exited_ok(slot)) continue;
        return "rank " + std::to_string(slot.rank) + " " +
               (slot.exit->signal
                    ? "was killed by " + signal_name(*slot.exit->signal)
                    : "exited with code " + std::to_string(slot.exit->exit_code.value_or(0)));
      }
      return "a rank failed";
    case Outcome::kTimedOut:
      return "timed out after " + std::to_string(call_.options.timeout->count()) + " ms";
    case Outcome::kHung:
      return "hung: " + collectives_.verdict;
    case Outcome::kCancelled:
      return verdict.reason;
    case Outcome::kStartFailed:
      return "could not start its ranks: " + verdict.reason;
    default:
      return "failed";
  }
}

CallEnd Attempt::call_end(Outcome outcome, std::string reason) const {
  CallEnd end;
  end.outcome = outcome;
  end.label = call_.program->label();
  end.world_size = world_size();
  end.nnodes = peers_.launch_nodes();
  end.rows = all_rows();
  end.run_dir = call_.run_dir;
  end.collectives = collectives_;
  end.stacks = stacks_text(collectives_);
  end.timeout = call_.options.timeout;
  end.hang_timeout = call_.hang_timeout;
  end.reason = std::move(reason);
  end.front_end = call_.options.front_end;
  end.text = [this](const std::string& headline, const std::vector<RankFailure>& rows) {
    return peers_.failure_text(headline, rows, call_.run_dir);
  };
  return end;
}

// Every rank's row, this node's and the other nodes' (from their reports), in rank order.
std::vector<RankFailure> Attempt::all_rows() const {
  std::vector<RankFailure> rows;
  for (const RankSlot& slot : slots_) rows.push_back(row_for(slot));
  const std::vector<RankFailure>& others = peers_.rows();
  if (!others.empty()) {
    rows.insert(rows.end(), others.begin(), others.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.rank < b.rank; });
  }
  return rows;
}

// The rank's result record's payload, within the call's payload limit; RecordError for a
// result missing, cut short or too large.
std::string Attempt::result_of(const RankSlot& slot) const {
  return serialize::read_record_file(slot.folder.result(), serialize::RecordKind::kResult,
                                     call_.options.max_payload_bytes);
}

NodeEnd Attempt::node_end(bool read_results) const {
  NodeEnd end;
  end.run_dir = call_.run_dir;
  for (const RankSlot& slot : slots_) end.rows.push_back(row_for(slot));
  if (!read_results) return end;
  try {
    for (const RankSlot& slot : slots_) end.results.push_back(result_of(slot));
  } catch (const serialize::RecordError&) {
    end.results.clear();  // read_results() says which rank's result is bad
  }
  return end;
}

std::exception_ptr Attempt::read_results(CallEnd& end, std::vector<std::string>& results) const {
  for (const RankSlot& slot : slots_) {
    try {
      results.push_back(result_of(slot));
    } catch (const serialize::RecordError& e) {
      // Over several nodes the rows are every node's, in global rank order.
      RankFailure& row = *std::find_if(end.rows.begin(), end.rows.end(),
                                       [&](auto& r) { return r.rank == slot.rank; });
      row.kind = RankFailure::Kind::kBadResult;
      row.message = e.what();
      if (dynamic_cast<const serialize::RecordTooLarge*>(&e) != nullptr) {
        row.message += "; " + rank::too_large_advice(call_.options.front_end);
      }
      row.root_cause = true;
      return std::make_exception_ptr(
          DistributedError(end.text(failed_headline(end, 1), end.rows), end.rows, call_.run_dir));
    }
  }
  return nullptr;
}

RankFigures Attempt::figures() const {
  RankFigures figures;
  for (const RankSlot& slot : slots_) {
    figures.memory.push_back(
        serialize::read_memory_record(slot.folder.memory()).value_or(MemoryStats{}));
    figures.comm.push_back(
        rank::comm_stats_of(contract::read_collective_ring(slot.folder.collective_ring())));
    figures.compute.push_back(
        serialize::read_compute_record(slot.folder.compute()).value_or(ComputeStats{}));
  }
  return figures;
}

std::vector<std::string> Attempt::summary_lines(bool held, const RankFigures& figures,
                                                bool always) const {
  const bool shapes = std::any_of(figures.compute.begin(), figures.compute.end(),
                                  [](const ComputeStats& c) { return !c.ops.empty(); });
  const bool on_console = std::any_of(
      slots_.begin(), slots_.end(), [this](const RankSlot& s) { return shows_on_console(s.rank); });
  if (!(always || shapes) || !on_console) return {};
  const std::string whose = peers_.whose_ranks();
  // In shape-only compute the GPUs' memory is a point of the call: each rank's peaks.
  std::vector<std::string> lines;
  for (std::string line :
       {folded_summary(held, figures.memory), rank::comm_summary(figures.comm, whose),
        rank::compute_summary(figures.compute, figures.comm, whose),
        rank::step_summary(figures.compute, whose),
        shapes ? rank::memory_summary(figures.memory, launched_ranks()) : ""}) {
    if (!line.empty()) lines.push_back(std::move(line));
  }
  return lines;
}

RankFailure Attempt::row_for(const RankSlot& slot) const {
  RankFailure row;
  row.rank = slot.rank;
  row.local_rank = slot.local_rank;
  peers_.place(row);
  row.pid = slot.pid;
  row.role = folded_role(slot);
  row.time = slot.exit_time;
  row.stderr_tail = slot.err ? slot.err->tail() : "";
  if (slot.exit) {
    row.exit_code = slot.exit->exit_code;
    row.signal = slot.exit->signal;
  }
  const auto record = call_.program->error_record(slot);
  // When it went down without a record (NOTE [Abrupt ends]).
  const auto abrupt_end = contract::read_abrupt_end(slot.folder.abrupt_end());
  if (abrupt_end && !record) row.time = *abrupt_end;
  // A rank whose own failure was recorded (or noted) before teardown began failed in its own
  // right, even when its exit was seen only after.
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

// What a folded launch stood for (NOTE [A folded world] in sim/fold.h), `held` where its
// second of a place (the last slot, the world's last rank) called the collectives the first
// of that place on node 0 called. Where the second's memory peaks differ from the first's
// (uneven shards: the last rank's share of a parameter is smaller), they are its own, and the
// line says so with both figures. "" for a launch that does not fold.
std::string Attempt::folded_summary(bool held, const std::vector<MemoryStats>& memory) const {
  if (call_.folded_nodes <= 1) return "";
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
         std::to_string(slots_[second].rank) + ", " + did + " (" + fold_setting() + ")\n";
}

// What a rank of a folded world stood for, for its failure's line; "" where the world is not
// folded.
std::string Attempt::folded_role(const RankSlot& slot) const {
  if (call_.folded_nodes <= 1) return "";
  if (slot.rank >= call_.options.gpus) {
    return "the second of local rank " + std::to_string(slot.local_rank) + "'s place, on the " +
           "last of " + std::to_string(world_nodes()) + " simulated nodes (" + fold_setting() + ")";
  }
  return "standing for local rank " + std::to_string(slot.local_rank) + " of every one of " +
         std::to_string(world_nodes()) + " simulated nodes (" + fold_setting() + ")";
}

// A folded world's first of the last place (node 0's) and its second (the world's last
// rank), by slot.
std::pair<std::size_t, std::size_t> Attempt::folded_pair() const {
  return {static_cast<std::size_t>(call_.options.gpus - 1), slots_.size() - 1};
}

std::string Attempt::fold_setting() const {
  return contract::Spelling(call_.options.front_end)("sim_fold");
}

std::exception_ptr Attempt::folding_unheld() const {
  if (call_.folded_nodes <= 1) return nullptr;
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
            "unfolded (without " + fold_setting() + ")"));
}

}  // namespace sgpu::launcher
