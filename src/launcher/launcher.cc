// A call from its plan to its handle (docs/architecture.md, "The life of one call"): the
// plan (call_plan.h), the other nodes (peers.h), the call's run, its run folder and what is
// staged there; then, on the call's own thread, one try of its ranks (attempt.h), the other
// nodes' reports, the run's end, and the results gathered or the error made (call_end.h).
#include "launcher/launcher.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

#include "backend/backend_table.h"
#include "contract/front_end.h"
#include "contract/option_table.h"
#include "contract/run_folder.h"
#include "launcher/attempt.h"
#include "launcher/call_end.h"
#include "launcher/call_plan.h"
#include "launcher/interrupt.h"
#include "launcher/peers.h"
#include "launcher/process.h"
#include "launcher/rank_program.h"
#include "nodes/node_link.h"
#include "nodes/nodes.h"
#include "sgpu/errors.h"
#include "sgpu/internal/call.h"
#include "tracking/call_run.h"

namespace sgpu::launcher {

namespace {

class CallImpl final : public detail::Call {
 public:
  CallImpl(CallSetup setup, std::unique_ptr<tracking::CallRun> tracking,
           std::unique_ptr<Peers> peers)
      : setup_(std::move(setup)),
        tracking_(std::move(tracking)),
        tracking_link_(tracking_ ? tracking_->link() : std::string()),
        cancel_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
        peers_(std::move(peers)) {}

  ~CallImpl() override {
    if (thread_.joinable()) {
      cancel();  // a call nobody waits for any more must not keep running
      thread_.join();
    }
  }

  void start() {
    starter_ = setup_.program->starter(
        setup_.method, backend::find_backend(setup_.backend).serves_cuda(setup_.options));
    peers_->open();
    attempt_ = std::make_unique<Attempt>(
        setup_, *peers_, *starter_,
        tracking_ ? tracking_->rank_environment() : tracking::untracked_rank_environment());
    thread_ = std::thread([this] { run(); });
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

  const std::vector<MemoryStats>& memory_stats() override { return finished().memory; }
  const std::vector<CommStats>& comm_stats() override { return finished().comm; }
  const std::vector<ComputeStats>& compute_stats() override { return finished().compute; }

  bool wait_for(std::chrono::milliseconds limit) override {
    std::unique_lock lock(mutex_);
    return finished_cv_.wait_for(lock, limit, [this] { return finished_; });
  }

  void cancel() override {
    const std::uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(cancel_fd_.get(), &one, sizeof one);
  }

  const std::filesystem::path& run_dir() const override { return setup_.run_dir; }
  const std::string& gpu_type() const override { return setup_.selection.gpu_type; }
  const std::string& tracking_link() const override { return tracking_link_; }

  [[noreturn]] void raise_bad_result(int rank, const std::string& why) override {
    CallEnd end = attempt_->call_end(Outcome::kRankFailed, "");
    RankFailure& row = end.rows.at(static_cast<std::size_t>(rank));  // every rank, in rank order
    row.kind = RankFailure::Kind::kBadResult;
    row.message = "cannot decode its result as the function's return type: " + why;
    row.root_cause = true;
    throw DistributedError(end.text(failed_headline(end, 1), end.rows), end.rows, setup_.run_dir);
  }

  void results_taken() override {
    // Only now is the call a success: the folder goes unless asked to stay.
    if (setup_.options.keep_run_dir || tracking_unsent_) return;
    std::error_code ec;
    std::filesystem::remove_all(setup_.run_dir, ec);
  }

 private:
  // The figures, once the call has finished.
  const RankFigures& finished() {
    std::unique_lock lock(mutex_);
    finished_cv_.wait(lock, [this] { return finished_; });
    return figures_;
  }

  // On the call's own thread: the ranks' one try, the other nodes' reports, the run's end.
  // The caller's signals are caught until the call has finished: a caught one is raised
  // again only once the run has ended (its status KILLED) and the handle has its error.
  void run() {
    const InterruptScope interrupts(setup_.caught_signals);
    Verdict verdict = attempt_->run(cancel_fd_.get(), interrupts);
    // A node that joined node 0's run sends its ranks' spools there before node 0, which
    // waits for every node's report, can end it.
    if (tracking_ && tracking_->joined()) end_tracking(verdict.outcome);
    const auto stop = [this] {
      pollfd fd{cancel_fd_.get(), POLLIN, 0};
      return InterruptScope::pending_signal() != 0 || ::poll(&fd, 1, 0) > 0;
    };
    peers_->exchange(
        verdict, setup_.program->returns_results(),
        [this](bool read_results) { return attempt_->node_end(read_results); }, stop);
    peers_->close();  // its port is closed before anyone sees the call end
    end_tracking(verdict.outcome);
    finish(verdict);
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
    const bool kept_for_tracking_only =
        outcome == Outcome::kSucceeded && !setup_.options.keep_run_dir;
    tracking_unsent_ = !tracking_->end(status, setup_.run_dir, kept_for_tracking_only);
    tracking_.reset();  // its store's connection: a finished call a handle keeps holds none
  }

  void finish(const Verdict& verdict) {
    const Outcome outcome = verdict.outcome;
    std::vector<std::string> results;
    CallEnd end = attempt_->call_end(outcome, verdict.reason);
    // A fault that ends its rank, planned but never acted, cannot end in success.
    if (outcome == Outcome::kSucceeded) {
      end.unacted = backend::find_backend(setup_.backend)
                        .ending_faults(world_options(setup_.options, setup_.folded_nodes));
    }
    std::exception_ptr error = error_of(end);  // none: a success, whose results are read
    if (!error && !setup_.program->returns_results()) {
      results.assign(attempt_->ranks(), std::string());
    } else if (!error) {
      std::optional<std::vector<std::string>> gathered = peers_->take_results();
      if (gathered) {
        results = std::move(*gathered);  // every node's, from the exchange
      } else {
        error = attempt_->read_results(end, results);
      }
    }
    RankFigures figures = attempt_->figures();
    const std::exception_ptr unheld = attempt_->folding_unheld();
    if (!error) error = unheld;
    for (const std::string& line :
         attempt_->summary_lines(!unheld, figures, setup_.program->always_prints_figures())) {
      if (setup_.console) {
        setup_.console(STDERR_FILENO, line);
      } else {
        std::cerr << line << std::flush;
      }
    }
    {
      std::lock_guard lock(mutex_);
      results_ = std::move(results);
      figures_ = std::move(figures);
      error_ = error;
      finished_ = true;
    }
    finished_cv_.notify_all();
  }

  const CallSetup setup_;
  std::unique_ptr<tracking::CallRun> tracking_;  // released once its run is ended
  const std::string tracking_link_;
  bool tracking_unsent_ = false;  // spooled entries are still in the run folder
  UniqueFd cancel_fd_;
  std::unique_ptr<Peers> peers_;
  std::unique_ptr<RankStarter> starter_;
  std::unique_ptr<Attempt> attempt_;
  std::thread thread_;

  std::mutex mutex_;
  std::condition_variable finished_cv_;
  bool finished_ = false;
  std::vector<std::string> results_;
  RankFigures figures_;
  std::exception_ptr error_;
};

// Step 4: the call's run exists before any rank starts: one run per launch, node 0's,
// which the other nodes' ranks log into.
std::unique_ptr<tracking::CallRun> begin_tracking(const CallPlan& plan, const RankProgram& program,
                                                  const WorkerCall& front, Peers& peers) {
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
  request.front_end = options.front_end;
  // The run's name: Options::name, else the function's plain name or the program's, never
  // a signature; the function param keeps it all.
  request.run_name = options.name;
  program.name_run(request);
  std::unique_ptr<tracking::CallRun> tracking;
  try {
    tracking = tracking::CallRun::begin(request);
  } catch (const std::exception& e) {
    peers.begin_failed(e.what());
    throw;
  }
  return peers.share_run(std::move(tracking), options.tracking);
}

// What the call gives each try of its ranks (attempt.h): its plan, its ranks' program, its
// front end's console and signals, and its run folder.
CallSetup setup_of(CallPlan plan, std::unique_ptr<RankProgram> program, const WorkerCall& front,
                   std::filesystem::path run_dir) {
  CallSetup setup;
  setup.program = std::move(program);
  setup.options = std::move(plan.options);
  setup.console = front.console;
  setup.caught_signals = front.caught_signals;
  setup.backend = std::move(plan.backend);
  setup.backend_env = std::move(plan.backend_env);
  setup.selection = std::move(plan.selection);
  setup.method = plan.method;
  setup.run_dir = std::move(run_dir);
  setup.hang_timeout = plan.hang_timeout;
  setup.folded_nodes = plan.folded_nodes;
  return setup;
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
  std::unique_ptr<Peers> peers = nodes.several() ? linked_nodes(std::make_unique<nodes::NodeLink>(
                                                       nodes, options.gpus, options.rdzv_timeout))
                                                 : one_node();
  CallPlan plan;
  try {
    plan = plan_call(std::move(options), *program, folded_nodes);
  } catch (const Error& e) {
    peers->agree(e.what());  // a node whose own checks fail tells the others
    throw;
  }
  peers->agree("");  // every node can serve the launch, or this throws
  std::unique_ptr<tracking::CallRun> tracking = begin_tracking(plan, *program, front, *peers);
  try {
    const std::filesystem::path run_dir = make_run_dir(plan.options);
    if (tracking) tracking->hold_in_flight(run_dir);  // ended KILLED should this process die
    try {
      program->stage(contract::RunFolder{run_dir}, plan.options.max_payload_bytes);
    } catch (const std::system_error& e) {  // a full or read-only runs folder, say
      throw Error("cannot stage the call in its run folder: " + std::string(e.what()) +
                  "; free space there, or put run folders elsewhere (" +
                  contract::Spelling(plan.options.front_end)("runs_dir") + ", SGPU_RUNS_DIR)");
    }
    auto call =
        std::make_shared<CallImpl>(setup_of(std::move(plan), std::move(program), front, run_dir),
                                   std::move(tracking), std::move(peers));
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
