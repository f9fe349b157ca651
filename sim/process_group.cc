// The simulated process groups on CPU tensors: the shared-memory transport (sim/shm) or
// Gloo, with the fault plan's collective faults in between.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "backend/process_group_factory.h"
#include "collectives/interposer.h"
#include "collectives/routes.h"
#include "contract/front_end.h"
#include "contract/option_table.h"
#include "contract/rank_env.h"
#include "sgpu/errors.h"
#include "sim/cuda/sim_cuda.h"
#include "sim/faults.h"
#include "sim/fold.h"
#include "sim/node_spec.h"
#include "sim/shm/shm_backend.h"
#include "sim/sim_backend.h"

namespace sgpu::sim {
namespace {

// This rank's faults, read from the plan once: by bind() before the function runs, or by
// the first process group of a rank that was not bound here (a program's rank, whose
// supervisor bound it: NOTE [A program's supervisor]). A process on the node that sgpu did
// not start reads them anew for each world it forms, for its rank there.
struct RankFaults {
  std::vector<Fault> faults;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  std::atomic<int> collectives{0};
};

// `plan_world`: the ranks the plan may name (a world on the node may have fewer than the
// plan names: the others' faults act in no process of it).
RankFaults* read_faults(int rank, int plan_world) {
  auto* state = new RankFaults;  // outlives any exit path, and any world it was read for
  const std::string plan = contract::environment_text("sim_faults", contract::kRankSide);
  if (plan.empty()) return state;
  for (const Fault& fault : parse_faults(plan, plan_world)) {
    if (fault.rank == rank) state->faults.push_back(fault);
  }
  return state;
}

std::atomic<RankFaults*> g_node_world_faults{nullptr};

RankFaults& rank_faults() {
  if (RankFaults* node_world = g_node_world_faults.load()) return *node_world;
  static RankFaults* faults = [] {
    const contract::RankEnvironment env = contract::read_rank_environment();
    return read_faults(env.rank, env.world_size);
  }();
  return *faults;
}

// Start faults act now; timed ones are armed to act from now.
void act_start_faults(const RankFaults& state) {
  for (const Fault& fault : state.faults) {
    if (fault.point == Fault::Point::kStart && fault.action != Fault::Action::kSlow) act(fault);
    if (fault.point == Fault::Point::kAfter && fault.action != Fault::Action::kSlow) {
      std::thread([fault] {
        std::this_thread::sleep_for(fault.after);
        act(fault);
      }).detach();
    }
  }
}

// A process on the node forms a world: its faults are the plan's for its rank there, and
// its start is now.
void join_world_faults(int rank) {
  RankFaults* state = read_faults(rank, std::numeric_limits<int>::max());
  g_node_world_faults.store(state);
  act_start_faults(*state);
}

// The transport of a rank that computes shapes only: an operation on fake tensors moves
// nothing (they hold no data), while what stands above it (the recorder, the fault plan)
// sees it as any other; one on real tensors (the bookkeeping a rank keeps real:
// sgpu/_shapes.py) runs on the transport.
//
// The ranks still meet at each collective on fake tensors: each says what it calls (the
// op, the dtype, the counts where every rank's must be the same, the reduce op, the root)
// through the transport, so a rank that called another collective fails every rank alike,
// naming the ranks that differ as the shared-memory transport's own check does, and a
// rank that never comes leaves the others waiting at it, where the hang watchdog names it.
// A transfer (send, recv) completes at once.
//
// In a folded world (NOTE [A folded world]) the ranks that meet are the group's running
// members, through `meeting`, the transport beneath the folded group; `ranks` gives each
// one's group rank, for the mismatch's words.
class MovingNoBytes final : public collectives::InterposingBackend {
 public:
  explicit MovingNoBytes(c10::intrusive_ptr<c10d::Backend> inner)
      : InterposingBackend(inner), meeting_(std::move(inner)) {
    for (int r = 0; r < meeting_->getSize(); ++r) ranks_.push_back(r);
  }
  MovingNoBytes(c10::intrusive_ptr<c10d::Backend> inner, c10::intrusive_ptr<c10d::Backend> meeting,
                std::vector<int> ranks)
      : InterposingBackend(std::move(inner)),
        meeting_(std::move(meeting)),
        ranks_(std::move(ranks)) {}

  // Its future holds the tensors, as a transport's does: DDP's reducer reads them there.
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    held_ = c10::IValue(tensors);
    c10::intrusive_ptr<c10d::Work> work = InterposingBackend::allreduce(tensors, opts);
    held_ = c10::IValue();
    return work;
  }

 protected:
  c10::intrusive_ptr<c10d::Work> around(const collectives::OpCall& call, Run run) override {
    if (call.data) return run();
    if (!contract::is_point_to_point(call.op)) agree(call);
    return collectives::completed_work(std::exchange(held_, c10::IValue()));
  }

 private:
  static constexpr std::int64_t kSignatureBytes = 160;

  // What every rank of the group must call alike: "all_reduce of 1024 float32, sum".
  static std::string signature(const collectives::OpCall& call) {
    using contract::CollectiveOp;
    std::string s(contract::op_name(call.op));
    switch (call.op) {  // ops whose every rank moves the same counts
      case CollectiveOp::kAllReduce:
      case CollectiveOp::kBroadcast:
      case CollectiveOp::kReduce:
      case CollectiveOp::kAllGather:
      case CollectiveOp::kAllGatherIntoTensor:
      case CollectiveOp::kReduceScatter:
      case CollectiveOp::kReduceScatterTensor:
        s += " of " + std::to_string(std::max(call.numel_in, call.numel_out));
        break;
      default:
        break;
    }
    if (!call.dtype.empty()) s += (s.find(" of ") == std::string::npos ? " of " : " ") + call.dtype;
    if (!call.reduce_op.empty()) s += ", " + call.reduce_op;
    if (call.peer >= 0) s += ", root " + std::to_string(call.peer);
    return s;
  }

  void agree(const collectives::OpCall& call) {
    std::string mine = signature(call);
    mine.resize(kSignatureBytes, '\0');
    std::vector<at::Tensor> inputs{
        at::from_blob(mine.data(), {kSignatureBytes}, at::kByte).clone()};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < meeting_->getSize(); ++r)
      outputs[0].push_back(at::empty({kSignatureBytes}, at::kByte));
    meeting_->allgather(outputs, inputs)->wait();
    std::vector<std::pair<std::string, std::vector<int>>> called;  // by what they called
    for (int r = 0; r < meeting_->getSize(); ++r) {
      const auto* bytes = static_cast<const char*>(outputs[0][r].data_ptr());
      std::string theirs(bytes, strnlen(bytes, kSignatureBytes));
      auto it = std::find_if(called.begin(), called.end(),
                             [&](const auto& c) { return c.first == theirs; });
      const int rank = ranks_[static_cast<std::size_t>(r)];
      if (it == called.end()) {
        called.push_back({theirs, {rank}});
      } else {
        it->second.push_back(rank);
      }
    }
    if (called.size() == 1) return;
    C10_THROW_ERROR(DistBackendError,
                    shm::collective_mismatch(called) + " (shape-only compute, rank " +
                        std::to_string(getRank()) + " of " + std::to_string(getSize()) + ")");
  }

  c10::intrusive_ptr<c10d::Backend> meeting_;
  std::vector<int> ranks_;  // by the meeting's rank, the group rank

  // The tensors an all-reduce's future holds, from allreduce() to around() on this thread.
  static inline thread_local c10::IValue held_;
};

// Counts collectives and applies the faults planned for them, then runs the real one.
// Point-to-point transfers are not collectives: they pass without counting.
class FaultInjectingBackend final : public collectives::InterposingBackend {
 public:
  using InterposingBackend::InterposingBackend;

 protected:
  c10::intrusive_ptr<c10d::Work> around(const collectives::OpCall& call, Run run) override {
    if (!contract::is_point_to_point(call.op)) before();
    return run();
  }

 private:
  void before() {
    RankFaults& state = rank_faults();
    const int count = ++state.collectives;
    const auto elapsed = std::chrono::steady_clock::now() - state.started;
    for (const Fault& fault : state.faults) {
      const bool due = fault.point == Fault::Point::kStart ||
                       (fault.point == Fault::Point::kCollective &&
                        (fault.action == Fault::Action::kSlow ? count >= fault.collective
                                                              : count == fault.collective)) ||
                       (fault.point == Fault::Point::kAfter && elapsed >= fault.after);
      // Only slow faults act at every collective; the rest acted at start or act once.
      if (due &&
          (fault.action == Fault::Action::kSlow || fault.point == Fault::Point::kCollective)) {
        act(fault);
      }
    }
  }
};

// The launch's ranks, on every node.
int world_of(const Options& options) { return options.gpus * std::max(options.nnodes, 1); }

// A folded world (NOTE [A folded world]): the launcher gives the backend the whole world's
// nodes, whose ranks node 0's launch runs as its own.
bool folded(const Options& options) { return options.sim.fold && options.nnodes > 1; }

// Whether `rank` runs on this node: one of its ranks, or in a folded world one of those the
// fold runs (node 0's, and the world's last rank, a second of its place).
bool runs_here(const Options& options, int rank) {
  if (folded(options)) return Fold::plan(world_of(options), options.gpus).runs(rank);
  const int first = std::max(options.node_rank, 0) * options.gpus;
  return rank >= first && rank < first + options.gpus;
}

// The plan's faults, every one on a rank that runs where the world is folded: a fault on a
// rank that only stands in the world would never act. ConfigError otherwise.
std::vector<Fault> faults_of(const Options& options) {
  std::vector<Fault> faults = parse_faults(options.sim.faults, world_of(options));
  if (!folded(options)) return faults;
  for (const Fault& fault : faults) {
    if (runs_here(options, fault.rank)) continue;
    throw ConfigError("the fault plan names rank " + std::to_string(fault.rank) +
                      ", which does not run in this folded world: node 0's ranks 0 to " +
                      std::to_string(options.gpus - 1) + " stand for every node's, and rank " +
                      std::to_string(world_of(options) - 1) + " runs as a second of its place (" +
                      contract::Spelling(options.front_end)("sim_fold") +
                      "); plan the fault on one of those, or run the world unfolded");
  }
  return faults;
}

}  // namespace

std::vector<std::string> SimBackend::rank_environment(const Options& options) const {
  counts_memory();  // ConfigError before anything starts
  const std::string spec = node_spec_of(options);
  const std::string platform = platform_of_spec(spec);  // parses the spec
  std::vector<std::string> variables{
      "SGPU_SIM=" + spec, std::string(cuda::kSimCudaVar) + "=" + (options.sim.cuda ? "on" : "off"),
      std::string(kTransportVar) + "=" + transport_name(chosen_transport(options)),
      std::string(contract::kPlatformVar) + "=" + platform,
      std::string(contract::kSimComputeVar) + "=" +
          (computes_shapes(options) ? "shapes" : "values")};
  if (options.sim.fold) {
    if (!computes_shapes(options)) {
      const contract::Spelling spell(options.front_end);
      throw ConfigError(spell("sim_fold") +
                        " runs node 0's ranks for every node's, which holds where tensors carry "
                        "shapes only: give it with " +
                        spell("sim_compute", "shapes"));
    }
    variables.push_back(std::string(contract::find_option("sim_fold")->env) + "=on");
  }
  const std::string& plan = options.sim.faults;  // SGPU_SIM_FAULTS stands in for it
  if (plan.empty()) return variables;
  faults_of(options);  // ConfigError before anything starts
  variables.push_back(std::string(kFaultsVar) + "=" + plan);
  return variables;
}

std::vector<std::string> SimBackend::ending_faults(const Options& options) const {
  const std::string& plan = options.sim.faults;  // SGPU_SIM_FAULTS stands in for it
  if (plan.empty()) return {};
  std::vector<std::string> ending;
  // Over several nodes, each node answers for its own ranks' faults.
  for (const Fault& fault : faults_of(options)) {
    if (fault.action == Fault::Action::kSlow) continue;
    if (!runs_here(options, fault.rank)) continue;
    const std::string rank = "rank " + std::to_string(fault.rank);
    std::string why;
    switch (fault.point) {
      case Fault::Point::kCollective:
        why = rank + " ran fewer than " + std::to_string(fault.collective) +
              " collectives through sgpu's process group (a Python rank's go through it with "
              "dist.init_process_group(\"sgpu\"))";
        break;
      case Fault::Point::kAfter:
        why = rank + " ended within " + std::to_string(fault.after.count()) + " ms";
        break;
      case Fault::Point::kStart:
        why = rank + " never bound its device";
        break;
    }
    ending.push_back(describe(fault) + ": " + why);
  }
  return ending;
}

void SimBackend::bind_program() const { act_start_faults(rank_faults()); }

namespace {

class SimGroups final : public backend::ProcessGroupFactory {
 public:
  c10::intrusive_ptr<c10d::Backend> make(
      const backend::ProcessGroupRequest& request) const override;
};

// The group of `request` in a folded world (NOTE [A folded world]): its members that run, and
// this rank's place among them, where the rank's world is folded; nullopt where it is not
// (SGPU_SIM_FOLD off, or a world of one node, which has nothing to fold).
struct FoldedPlace {
  Fold fold;
  std::vector<int> members;  // the group's global ranks
  int rank = 0;              // this rank's global rank
  cuda::Meeting running;     // this rank among the group's running members
  std::vector<int> ranks;    // the running members' group ranks
};

std::optional<FoldedPlace> folded_place(const backend::ProcessGroupRequest& request) {
  if (!contract::environment_flag("sim_fold", false, contract::kRankSide)) return std::nullopt;
  const contract::RankEnvironment env = contract::read_rank_environment();
  if (env.local_world_size <= 0 || env.world_size <= env.local_world_size) return std::nullopt;
  FoldedPlace place{Fold::plan(env.world_size, env.local_world_size), request.members, 0, {}, {}};
  std::vector<int>& members = place.members;
  if (members.empty()) {
    for (int r = 0; r < env.world_size; ++r) members.push_back(r);
  }
  place.rank = members.at(static_cast<std::size_t>(request.rank));
  for (int m : place.fold.running_of(members)) {
    if (m == place.rank) place.running.rank = static_cast<int>(place.ranks.size());
    place.ranks.push_back(
        static_cast<int>(std::find(members.begin(), members.end(), m) - members.begin()));
  }
  place.running.size = static_cast<int>(place.ranks.size());
  return place;
}

c10::intrusive_ptr<c10d::Backend> SimGroups::make(
    const backend::ProcessGroupRequest& request) const {
  if (request.node_world_rank >= 0) join_world_faults(request.node_world_rank);
  const std::optional<FoldedPlace> folded = folded_place(request);
  // The transport connects the group's ranks, or in a folded world its running members.
  const cuda::Meeting meeting =
      folded ? folded->running : cuda::Meeting{request.rank, request.world_size};
  c10::intrusive_ptr<c10d::Backend> group;
  if (rank_transport() == Transport::kShm) {
    group = shm::make_shm_backend(request.store, meeting.rank, meeting.size, request.timeout,
                                  shm::sizes_from_environment());
  } else {
    group = collectives::gloo_group(request.store, meeting.rank, meeting.size, request.timeout);
  }
  if (folded) {
    c10::intrusive_ptr<c10d::Backend> transport = group;
    group = folded_group(std::move(group), folded->fold, folded->members, folded->rank);
    // Shapes only (sim_fold's rule): the running members agree on each collective.
    group =
        c10::make_intrusive<MovingNoBytes>(std::move(group), std::move(transport), folded->ranks);
  } else if (rank_computes_shapes()) {
    group = c10::make_intrusive<MovingNoBytes>(std::move(group));
  }
  if (cuda::served()) {  // Gloo takes CPU tensors only; shared memory the cuda ones as they are
    group = cuda::for_cuda_tensors(std::move(group), request.store,
                                   rank_transport() == Transport::kGloo, request.as_nccl, meeting);
  }
  if (request.record) group = request.record(std::move(group));
  if (rank_faults().faults.empty()) return group;
  return c10::make_intrusive<FaultInjectingBackend>(std::move(group));
}

}  // namespace

Transport chosen_transport(const Options& options) {
  const std::string& name = options.sim.transport;
  // A folded world's nodes are one node's ranks.
  const bool several_nodes = options.nnodes > 1 && !folded(options);
  // Shared memory does not reach other nodes; Gloo's TCP does.
  if (name.empty()) return several_nodes ? Transport::kGloo : Transport::kShm;
  const std::string given = contract::Spelling(options.front_end)("sim_transport", name);
  if (name == "shm" && several_nodes) {
    throw ConfigError(given + " cannot connect ranks on " + std::to_string(options.nnodes) +
                      " nodes: shared memory stays on one node; use \"gloo\" (or leave the "
                      "transport unset)");
  }
  if (name == "shm") return Transport::kShm;
  if (name == "gloo") return Transport::kGloo;
  throw ConfigError(given +
                    " is not a transport of the simulated backend: use \"shm\" (shared memory, "
                    "the default) or \"gloo\" (Gloo over loopback TCP)");
}

bool computes_shapes(const Options& options) {
  const std::string& name = options.sim.compute;
  const std::string given = contract::Spelling(options.front_end)("sim_compute", name);
  if (name.empty() || name == "values") return false;
  if (name == "shapes") return true;
  throw ConfigError(given +
                    " is not what simulated ranks compute: use \"values\" (the default: tensors "
                    "hold data) or \"shapes\" (a Python rank's tensors carry shapes and no data)");
}

bool rank_computes_shapes() {
  return contract::environment_text("sim_compute", contract::kRankSide) == "shapes";
}

const char* transport_name(Transport transport) {
  return transport == Transport::kShm ? "shm" : "gloo";
}

Transport rank_transport() {
  return contract::environment_text("sim_transport", contract::kRankSide) == "gloo"
             ? Transport::kGloo
             : Transport::kShm;
}

const backend::ProcessGroupFactory& SimBackend::process_groups() const {
  static const SimGroups groups;
  return groups;
}

}  // namespace sgpu::sim
