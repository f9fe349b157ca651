#include "nodes/nodes.h"

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "contract/front_end.h"
#include "contract/rank_env.h"
#include "sgpu/errors.h"

namespace sgpu::nodes {

namespace {

// What one source says; unset fields leave the next source to speak.
struct Said {
  std::optional<int> nnodes;
  std::optional<int> node_rank;
  std::optional<std::string> host;
  std::optional<std::uint16_t> port;
  std::optional<std::string> id;
  std::string engine;
  std::string nnodes_from, node_rank_from;  // for messages: "SLURM_STEP_NUM_NODES=2"
};

// A whole non-negative number no larger than `max`, or nullopt.
std::optional<long long> number(std::string_view text, long long max) {
  if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != text.npos) {
    return std::nullopt;
  }
  const long long value = std::atoll(std::string(text).c_str());
  return value <= max ? std::optional(value) : std::nullopt;
}

int int_var(const EnvLookup& env, const char* name) {
  const auto value = env(name);
  const auto n = number(value.value_or(""), std::numeric_limits<int>::max());
  if (!n) {
    throw ConfigError(std::string(name) + "=" + value.value_or("") +
                      " is not a whole number; sgpu reads it to place this node");
  }
  return static_cast<int>(*n);
}

bool has(const EnvLookup& env, const char* name) {
  const auto value = env(name);
  return value && !value->empty();
}

std::optional<std::uint16_t> port_var(const EnvLookup& env, const char* name) {
  if (!has(env, name)) return std::nullopt;
  const std::string value = *env(name);
  const auto n = number(value, 65535);
  if (!n || *n == 0) {
    throw ConfigError(std::string(name) + "=" + value + " is not a TCP port (1 to 65535)");
  }
  return static_cast<std::uint16_t>(*n);
}

Said from_torchrun(const EnvLookup& env) {
  Said said;
  said.engine = "torchrun (PET_*)";
  said.nnodes = int_var(env, "PET_NNODES");
  said.nnodes_from = "PET_NNODES=" + std::to_string(*said.nnodes);
  if (has(env, "PET_NODE_RANK")) {
    said.node_rank = int_var(env, "PET_NODE_RANK");
    said.node_rank_from = "PET_NODE_RANK=" + std::to_string(*said.node_rank);
  }
  if (has(env, "PET_MASTER_ADDR")) said.host = *env("PET_MASTER_ADDR");
  said.port = port_var(env, "PET_MASTER_PORT");
  if (has(env, "PET_RDZV_ID")) said.id = *env("PET_RDZV_ID");
  return said;
}

Said from_slurm(const EnvLookup& env) {
  Said said;
  said.engine = "Slurm";
  const std::vector<std::string> hosts = expand_hostlist(*env("SLURM_STEP_NODELIST"));
  const char* count_var =
      has(env, "SLURM_STEP_NUM_NODES") ? "SLURM_STEP_NUM_NODES" : "SLURM_NNODES";
  said.nnodes = has(env, count_var) ? int_var(env, count_var) : static_cast<int>(hosts.size());
  said.nnodes_from = std::string(count_var) + "=" + std::to_string(*said.nnodes);
  if (has(env, "SLURM_STEP_NUM_TASKS") && int_var(env, "SLURM_STEP_NUM_TASKS") != *said.nnodes) {
    throw ConfigError("srun started " + *env("SLURM_STEP_NUM_TASKS") + " tasks on " +
                      std::to_string(*said.nnodes) +
                      " nodes; sgpu runs once per node and starts the ranks itself: use srun "
                      "--ntasks-per-node=1");
  }
  // The step's own numbering: this node's place in the step's list (SLURM_NODEID counts
  // the job's nodes, which a step on some of them does not start at 0).
  const auto name = env("SLURMD_NODENAME");
  const auto it = name ? std::find(hosts.begin(), hosts.end(), *name) : hosts.end();
  if (it != hosts.end()) {
    said.node_rank = static_cast<int>(it - hosts.begin());
    said.node_rank_from = "SLURMD_NODENAME=" + *name + " in SLURM_STEP_NODELIST";
  } else if (has(env, "SLURM_NODEID")) {
    said.node_rank = int_var(env, "SLURM_NODEID");
    said.node_rank_from = "SLURM_NODEID=" + std::to_string(*said.node_rank);
  }
  if (!hosts.empty()) said.host = hosts.front();
  said.port = port_var(env, "MASTER_PORT");
  const long long job = has(env, "SLURM_JOB_ID") ? int_var(env, "SLURM_JOB_ID") : 0;
  const long long step = has(env, "SLURM_STEP_ID") ? int_var(env, "SLURM_STEP_ID") : 0;
  // Steps of one job, and jobs side by side, mostly on ports of their own.
  if (!said.port)
    said.port = static_cast<std::uint16_t>(kDefaultRdzvPort + (job * 7 + step) % 4000);
  said.id = "slurm-" + std::to_string(job) + "." + std::to_string(step);
  return said;
}

// mpirun's daemon's first address in Open MPI's "JOBID.VPID;tcp://A,B:PORT" URI.
std::optional<std::string> hnp_address(const std::string& uri) {
  const auto at = uri.find("tcp://");
  if (at == std::string::npos) return std::nullopt;
  const std::string rest = uri.substr(at + 6);
  const auto end = rest.find_first_of(",:;");
  if (end == 0) return std::nullopt;
  return rest.substr(0, end);
}

Said from_mpi(const EnvLookup& env, bool open_mpi) {
  Said said;
  said.engine = open_mpi ? "Open MPI" : "PMI";
  const char* size_var = open_mpi ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE";
  const char* rank_var = open_mpi ? "OMPI_COMM_WORLD_RANK" : "PMI_RANK";
  const char* local_var = open_mpi ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "MPI_LOCALNRANKS";
  said.nnodes = int_var(env, size_var);
  said.nnodes_from = std::string(size_var) + "=" + std::to_string(*said.nnodes);
  said.node_rank = int_var(env, rank_var);
  said.node_rank_from = std::string(rank_var) + "=" + std::to_string(*said.node_rank);
  if (has(env, local_var) && int_var(env, local_var) != 1) {
    throw ConfigError("mpirun started " + *env(local_var) +
                      " processes on this node; sgpu runs once per node and starts the ranks "
                      "itself: use mpirun -npernode 1");
  }
  if (has(env, "MASTER_ADDR")) {
    said.host = *env("MASTER_ADDR");
  } else if (open_mpi && has(env, "OMPI_MCA_orte_hnp_uri")) {
    said.host = hnp_address(*env("OMPI_MCA_orte_hnp_uri"));
  }
  said.port = port_var(env, "MASTER_PORT");
  if (open_mpi && has(env, "OMPI_MCA_ess_base_jobid")) {
    const std::string job = *env("OMPI_MCA_ess_base_jobid");
    said.id = "ompi-" + job;
    // mpirun's daemon's port is its own; jobs side by side mostly get ports of their own.
    if (!said.port) {
      const auto n = number(job, std::numeric_limits<long long>::max() / 2).value_or(0);
      said.port = static_cast<std::uint16_t>(kDefaultRdzvPort + n % 4000);
    }
  } else if (open_mpi && has(env, "OMPI_MCA_orte_hnp_uri")) {
    const std::string uri = *env("OMPI_MCA_orte_hnp_uri");
    said.id = "ompi-" + uri.substr(0, uri.find(';'));
  } else if (has(env, "PMI_JOBID")) {
    said.id = "pmi-" + *env("PMI_JOBID");
  }
  return said;
}

// The engine this process runs under, if any, by its own variables: the one that started
// it first. mpirun inside a Slurm allocation starts its daemons on the other nodes with
// srun, so its processes there also carry that one-node step's SLURM_STEP_*; Open MPI's
// variables describe the launch. (srun's own PMI variables agree with its step, which
// also names node 0's host.)
std::optional<Said> detect(const EnvLookup& env) {
  if (has(env, "PET_NNODES")) return from_torchrun(env);
  if (has(env, "OMPI_COMM_WORLD_SIZE")) return from_mpi(env, true);
  if (has(env, "SLURM_STEP_NODELIST")) return from_slurm(env);
  if (has(env, "PMI_SIZE") && has(env, "PMI_RANK")) return from_mpi(env, false);
  return std::nullopt;
}

}  // namespace

std::optional<std::string> process_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

std::string NodePlan::describe() const {
  if (!several()) return "one node";
  return "node " + std::to_string(node_rank) + " of " + std::to_string(nnodes) + ", node 0 at " +
         host + ":" + std::to_string(port) + (engine.empty() ? "" : " (" + engine + ")");
}

std::vector<std::string> expand_hostlist(std::string_view list) {
  const auto bad = [&](const std::string& why) -> ConfigError {
    return ConfigError("the Slurm host list \"" + std::string(list) + "\" is malformed: " + why);
  };
  // More than any cluster has; a list that says more is not one, and expanding it would
  // take memory without bound.
  constexpr std::size_t kMaxHosts = 65536;
  const auto too_many = [&] { return bad("it names more than 65536 hosts"); };
  std::vector<std::string> hosts;
  std::size_t i = 0;
  while (i < list.size()) {
    // One entry: a prefix, then any number of [ranges] and literal parts, up to a top-level ','.
    std::vector<std::string> expanded{""};
    while (i < list.size() && list[i] != ',') {
      if (list[i] == ']') throw bad("a ']' with no '['");
      if (list[i] != '[') {
        const std::size_t end = list.find_first_of("[,]", i);
        const std::string_view part = list.substr(i, end - i);
        for (std::string& host : expanded) host += part;
        i = end == std::string_view::npos ? list.size() : end;
        continue;
      }
      const std::size_t close = list.find(']', i);
      if (close == std::string_view::npos) throw bad("a '[' with no ']'");
      const std::string_view body = list.substr(i + 1, close - i - 1);
      if (body.empty()) throw bad("an empty '[]'");
      std::vector<std::string> suffixes;
      std::size_t at = 0;
      while (at <= body.size()) {
        const std::size_t comma = std::min(body.find(',', at), body.size());
        const std::string_view range = body.substr(at, comma - at);
        const std::size_t dash = range.find('-');
        const std::string_view first = range.substr(0, dash);
        const std::string_view last = dash == range.npos ? first : range.substr(dash + 1);
        const auto lo = number(first, 1'000'000'000), hi = number(last, 1'000'000'000);
        if (!lo || !hi) throw bad("\"" + std::string(range) + "\" is not a number or a range");
        if (*hi < *lo) throw bad("the range \"" + std::string(range) + "\" runs backwards");
        if (suffixes.size() + static_cast<std::size_t>(*hi - *lo) >= kMaxHosts) throw too_many();
        for (long long n = *lo; n <= *hi; ++n) {
          std::string digits = std::to_string(n);
          if (digits.size() < first.size()) digits.insert(0, first.size() - digits.size(), '0');
          suffixes.push_back(std::move(digits));
        }
        at = comma + 1;
      }
      if (expanded.size() * suffixes.size() > kMaxHosts) throw too_many();  // each <= kMaxHosts
      std::vector<std::string> next;
      next.reserve(expanded.size() * suffixes.size());
      for (const std::string& head : expanded) {
        for (const std::string& suffix : suffixes) next.push_back(head + suffix);
      }
      expanded = std::move(next);
      i = close + 1;
    }
    if (hosts.size() + expanded.size() > kMaxHosts) throw too_many();
    for (std::string& host : expanded) {
      if (host.empty()) throw bad("an empty host name");
      hosts.push_back(std::move(host));
    }
    if (i < list.size()) {
      ++i;  // the ','
      if (i == list.size()) throw bad("it ends with ','");
    }
  }
  return hosts;
}

std::pair<std::string, std::uint16_t> parse_endpoint(std::string_view text, std::uint16_t fallback,
                                                     const std::string& what) {
  const auto bad = [&](const std::string& why) {
    return ConfigError(what + " \"" + std::string(text) + "\" is not HOST[:PORT]: " + why);
  };
  std::string host;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    const std::size_t close = text.find(']');
    if (close == text.npos) throw bad("a '[' with no ']'");
    host = std::string(text.substr(1, close - 1));
    const std::string_view rest = text.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') throw bad("text after ']'");
    if (!rest.empty()) port = rest.substr(1);
    if (!rest.empty() && port.empty()) throw bad("no port after ':'");
  } else {
    const std::size_t colon = text.rfind(':');
    if (colon != text.npos && text.find(':') != colon) {
      throw bad("an IPv6 address goes in brackets, [addr]:port");
    }
    host = std::string(text.substr(0, colon));
    if (colon != text.npos) port = text.substr(colon + 1);
    if (colon != text.npos && port.empty()) throw bad("no port after ':'");
  }
  if (host.empty()) throw bad("no host");
  if (port.empty()) return {host, fallback};
  const auto n = number(port, 65535);
  if (!n || *n == 0) throw bad("the port is not 1 to 65535");
  return {host, static_cast<std::uint16_t>(*n)};
}

bool nodes_may_be_here(const Options& options, const EnvLookup& env) {
  return options.backend == contract::kSimBackend && options.node_rank < 0 &&
         options.rdzv_endpoint.empty() && options.rdzv_id.empty() && !detect(env).has_value();
}

bool folds_nodes(const Options& options, const EnvLookup& env) {
  if (!options.sim.fold) return false;
  if (!nodes_may_be_here(options, env)) {
    throw ConfigError(contract::Spelling(options.front_end)("sim_fold") +
                      " folds the nodes of a simulated world on this machine: it needs the sim "
                      "backend, and no node rank, rendezvous endpoint or id, nor a launcher "
                      "(torchrun, Slurm, MPI) around it that places this node");
  }
  return options.nnodes > 1;
}

NodePlan plan_nodes(const Options& options, const EnvLookup& env) {
  const contract::Spelling spell(options.front_end);
  if (options.nnodes < 0) {
    throw ConfigError(spell("nnodes") + " must be at least 1, got " +
                      std::to_string(options.nnodes));
  }
  if (options.node_rank < -1) {
    throw ConfigError(spell("node_rank") + " must be 0 or more, got " +
                      std::to_string(options.node_rank));
  }
  const std::optional<Said> engine = detect(env);
  NodePlan plan;
  plan.front_end = options.front_end;
  const bool flagged = options.nnodes > 0 || options.node_rank >= 0 ||
                       !options.rdzv_endpoint.empty() || !options.rdzv_id.empty();
  plan.engine = engine ? engine->engine : (flagged ? "flags" : "");
  // The count and this node's place: an explicit one must agree with the engine.
  if (engine && engine->nnodes && options.nnodes > 0 && options.nnodes != *engine->nnodes) {
    throw ConfigError(spell("nnodes", std::to_string(options.nnodes)) + " contradicts " +
                      engine->engine + ", which says " + engine->nnodes_from +
                      "; leave it out, or run outside " + engine->engine);
  }
  if (engine && engine->node_rank && options.node_rank >= 0 &&
      options.node_rank != *engine->node_rank) {
    throw ConfigError(spell("node_rank", std::to_string(options.node_rank)) + " contradicts " +
                      engine->engine + ", which says " + engine->node_rank_from +
                      "; leave it out, or run outside " + engine->engine);
  }
  plan.nnodes = options.nnodes > 0 ? options.nnodes : engine ? engine->nnodes.value_or(1) : 1;
  if (plan.nnodes < 1) {
    throw ConfigError(engine->engine + " says " + engine->nnodes_from + "; a launch needs a node");
  }
  if (options.node_rank >= 0) {
    plan.node_rank = options.node_rank;
  } else if (engine && engine->node_rank) {
    plan.node_rank = *engine->node_rank;
  } else if (plan.nnodes > 1) {
    throw ConfigError("a launch over " + std::to_string(plan.nnodes) +
                      " nodes needs this node's place: give " + spell("node_rank") +
                      " (0 on the node that hosts the store)");
  }
  if (plan.node_rank >= plan.nnodes) {
    throw ConfigError("node rank " + std::to_string(plan.node_rank) + " is not below the " +
                      std::to_string(plan.nnodes) + " nodes of the launch (0 to " +
                      std::to_string(plan.nnodes - 1) + ")" +
                      (options.node_rank >= 0 || !engine ? "" : "; " + engine->node_rank_from));
  }
  if (plan.nnodes == 1) {
    if (!flagged && !engine) plan.engine.clear();
    return plan;
  }
  // Node 0's store.
  if (!options.rdzv_endpoint.empty()) {
    std::tie(plan.host, plan.port) =
        parse_endpoint(options.rdzv_endpoint, kDefaultRdzvPort, spell("rdzv_endpoint"));
  } else {
    if (engine && engine->host) plan.host = *engine->host;
    if (plan.host.empty() && has(env, "MASTER_ADDR")) plan.host = *env("MASTER_ADDR");
    plan.port = engine && engine->port ? *engine->port
                                       : port_var(env, "MASTER_PORT").value_or(kDefaultRdzvPort);
  }
  if (plan.host.empty()) {
    throw ConfigError("a launch over " + std::to_string(plan.nnodes) +
                      " nodes needs node 0's address: give " + spell("rdzv_endpoint") +
                      " HOST:PORT (or MASTER_ADDR)" +
                      (engine ? "; " + engine->engine + " does not say where node 0 is" : ""));
  }
  plan.id = !options.rdzv_id.empty() ? options.rdzv_id
            : engine && engine->id   ? *engine->id
                                     : "sgpu-" + plan.host + "-" + std::to_string(plan.port);
  return plan;
}

}  // namespace sgpu::nodes
