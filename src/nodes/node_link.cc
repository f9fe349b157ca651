#include "nodes/node_link.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "contract/front_end.h"
#include "contract/host_name.h"
#include "sgpu/errors.h"

namespace sgpu::nodes {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kBeatEvery = std::chrono::milliseconds(250);
constexpr auto kFailureCheckEvery = std::chrono::milliseconds(100);
constexpr auto kSilenceCheckEvery = std::chrono::milliseconds(500);
constexpr auto kRound = std::chrono::milliseconds(50);
// How long node 0 keeps its store for nodes that have not read every report yet.
constexpr auto kReadLimit = std::chrono::seconds(5);

std::string seconds(std::chrono::milliseconds ms) {
  std::ostringstream out;
  out << static_cast<double>(ms.count()) / 1000 << " s";
  return out.str();
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// This process's launches over several nodes so far, by launch id (an endpoint's, when
// none is given) and by the node it was in each: a program that calls a distributed
// function twice makes the same calls on every node, so the counts agree, and a process
// that is several nodes at once (every simulated node of a call, NOTE [Every node on one
// machine]) counts each node's own.
long long next_launch(const std::string& id, int node_rank) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, int>, long long> launches;
  std::lock_guard lock(mutex);
  return ++launches[{id, node_rank}];
}

// A launch's words as sgpu/launch holds them: id, nodes, GPUs per node, sequence.
struct Launch {
  std::string id, nodes, gpus;
  long long sequence = 0;
  static Launch parse(const std::string& text) {
    Launch launch;
    std::istringstream in(text);
    in >> launch.id >> launch.nodes >> launch.gpus >> launch.sequence;
    return launch;
  }
  bool same_but_sequence(const Launch& other) const {
    return id == other.id && nodes == other.nodes && gpus == other.gpus;
  }
  std::string describe() const {
    return "launch \"" + id + "\" of " + nodes + " nodes with " + gpus + " GPUs each";
  }
};

}  // namespace

NodeLink::NodeLink(NodePlan plan, int gpus_per_node, std::chrono::milliseconds join_timeout)
    : plan_(std::move(plan)),
      spell_(plan_.front_end),
      join_timeout_(join_timeout),
      host_name_(contract::host_name()) {
  const long long sequence = next_launch(plan_.id, plan_.node_rank);
  const std::string launch = plan_.id + " " + std::to_string(plan_.nnodes) + " " +
                             std::to_string(gpus_per_node) + " " + std::to_string(sequence);
  if (plan_.node_rank == 0) {
    host(launch);
  } else {
    join(launch);
  }
  if (store_->add(key(plan_.node_rank, "claim"), 1) > 1) {
    throw ConfigError("another node has joined the launch as node " +
                      std::to_string(plan_.node_rank) + " already: give each node its own " +
                      spell_("node_rank") + " (0 to " + std::to_string(plan_.nnodes - 1) + ")");
  }
  heard_.assign(static_cast<std::size_t>(plan_.nnodes), Heard{"", Clock::now()});
}

void NodeLink::host(const std::string& launch) {
  try {
    host_ = std::make_unique<rendezvous::HostStore>(plan_.host, plan_.port);
    store_ = std::make_unique<rendezvous::StoreClient>(plan_.host, plan_.port, join_timeout_);
  } catch (const std::runtime_error& e) {
    throw Error(std::string("node 0 cannot host the launch's store: ") + e.what() +
                "; name this node's own address in " + spell_("rdzv_endpoint") +
                ", with a port no other program holds");
  }
  store_->set("sgpu/launch", launch);
}

void NodeLink::join(const std::string& launch) {
  const std::string endpoint = this->endpoint();
  const auto deadline = Clock::now() + join_timeout_;
  const Launch wanted = Launch::parse(launch);
  std::optional<std::string> hosted;
  // Node 0's store for this process's previous launch may still be up, for the nodes
  // that have not read its reports yet: this node waits for the next one.
  while (true) {
    try {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      store_ = std::make_unique<rendezvous::StoreClient>(plan_.host, plan_.port,
                                                         std::max(left, kRound * 2));
      while (!(hosted = store_->get("sgpu/launch")) && Clock::now() < deadline) {
        std::this_thread::sleep_for(kRound);
      }
    } catch (const std::runtime_error& e) {
      if (Clock::now() < deadline) {  // the previous launch's store went as this node looked
        std::this_thread::sleep_for(kRound);
        continue;
      }
      throw Error("node " + std::to_string(plan_.node_rank) + " cannot reach node 0's store at " +
                  endpoint + " within " + seconds(join_timeout_) + ": " + e.what() +
                  "; start node 0 with the same " + spell_("rdzv_endpoint") +
                  ", check that this node can reach that address and port, or raise " +
                  spell_("rdzv_timeout"));
    }
    if (!hosted) break;
    const Launch found = Launch::parse(*hosted);
    if (!found.same_but_sequence(wanted) || found.sequence >= wanted.sequence ||
        Clock::now() >= deadline) {
      break;
    }
    store_.reset();
    std::this_thread::sleep_for(kRound);
  }
  if (!hosted) {
    throw Error("the store at " + endpoint + " answers but hosts no sgpu launch: is " +
                spell_("rdzv_endpoint") + " another program's port?");
  }
  if (*hosted != launch) {
    const Launch found = Launch::parse(*hosted);
    const std::string what =
        found.same_but_sequence(wanted)
            ? "node 0 at " + endpoint + " hosts its launch number " +
                  std::to_string(found.sequence) + " of this program, and node " +
                  std::to_string(plan_.node_rank) + " asks for its number " +
                  std::to_string(wanted.sequence) +
                  ": every node's program must launch the same distributed calls, in the "
                  "same order"
            : "node 0 at " + endpoint + " hosts " + found.describe() + ", and node " +
                  std::to_string(plan_.node_rank) + " asks for " + wanted.describe() +
                  ": give every node the same " + spell_("nnodes") + ", " + spell_("gpus") +
                  " and " + spell_("rdzv_id");
    // The others stop at once too, rather than wait for this node to join.
    if (!store_->get(key(plan_.node_rank, "ready"))) agree(what);
    throw ConfigError(what);
  }
}

NodeLink::~NodeLink() {
  if (!host_ || broken_) return;
  // The others may still be reading the reports: the store stays until they have, or
  // have gone quiet, or kReadLimit has passed.
  const auto deadline = Clock::now() + kReadLimit;
  try {
    for (int node = 1; node < plan_.nnodes; ++node) {
      while (!store_->get(key(node, "read")) && !silent(node) && Clock::now() < deadline) {
        std::this_thread::sleep_for(kRound);
      }
    }
  } catch (const std::exception&) {
  }
}

std::string NodeLink::endpoint() const { return plan_.host + ":" + std::to_string(plan_.port); }

std::string NodeLink::key(int node, const char* what) const {
  return "sgpu/node/" + std::to_string(node) + "/" + what;
}

void NodeLink::agree(const std::string& failure) {
  store_->set(key(plan_.node_rank, "ready"),
              failure.empty() ? "ok\n" + host_name_ : "error\n" + host_name_ + "\n" + failure);
  if (!failure.empty()) return;  // the caller throws its own error
  beat();
  const auto deadline = Clock::now() + join_timeout_;
  std::vector<int> missing;
  do {
    missing.clear();
    for (int node = 0; node < plan_.nnodes; ++node) {
      const auto ready = store_->get(key(node, "ready"));
      if (!ready) {
        missing.push_back(node);
        continue;
      }
      const std::vector<std::string> parts = lines(*ready);
      if (!parts.empty() && parts[0] == "error" && node != plan_.node_rank) {
        std::string why;
        for (std::size_t i = 2; i < parts.size(); ++i) why += (i > 2 ? "\n" : "") + parts[i];
        throw AcceleratorMismatchError("node " + std::to_string(node) + " (" +
                                       (parts.size() > 1 ? parts[1] : "?") +
                                       ") cannot serve the launch: " + why);
      }
    }
    if (missing.empty()) return;
    std::this_thread::sleep_for(kRound);
  } while (Clock::now() < deadline);
  std::string list;
  for (int node : missing) list += (list.empty() ? "" : ", ") + std::to_string(node);
  throw Error("node(s) " + list + " of " + std::to_string(plan_.nnodes) +
              " did not join the launch at " + endpoint() + " within " + seconds(join_timeout_) +
              ": start sgpu on every node with the same " + spell_("rdzv_endpoint") +
              ", or raise " + spell_("rdzv_timeout"));
}

void NodeLink::share_run(const serialize::SharedRun& run) {
  store_->set("sgpu/run", serialize::shared_run_json(run));
}

serialize::SharedRun NodeLink::node0_run() {
  const auto deadline = Clock::now() + join_timeout_;
  while (Clock::now() < deadline) {
    if (Clock::now() >= next_beat_) beat();
    if (auto run = store_->get("sgpu/run")) {
      try {
        return serialize::parse_shared_run(*run);
      } catch (const std::invalid_argument& e) {
        throw Error("node 0 at " + endpoint() + " shared no run of a launch (" + e.what() +
                    "); is another program using its store?");
      }
    }
    if (auto failure = store_->get("sgpu/failure")) {
      throw Error("the launch failed before its ranks started: " +
                  failure->substr(failure->find('\n') + 1));
    }
    std::this_thread::sleep_for(kRound);
  }
  throw Error("node 0 at " + endpoint() + " did not start its ranks within " +
              seconds(join_timeout_) + " of every node joining; raise " + spell_("rdzv_timeout"));
}

void NodeLink::beat() {
  next_beat_ = Clock::now() + kBeatEvery;
  store_->set(key(plan_.node_rank, "beat"), std::to_string(++beats_));
}

bool NodeLink::silent(int node) {
  if (node == plan_.node_rank) return false;
  Heard& heard = heard_[static_cast<std::size_t>(node)];
  const std::string now = store_->get(key(node, "beat")).value_or("");
  if (now != heard.beat) {
    heard.beat = now;
    heard.when = Clock::now();
    return false;
  }
  return Clock::now() - heard.when > kSilentLimit;
}

std::optional<std::string> NodeLink::poll() {
  if (broken_) return std::nullopt;
  const auto now = Clock::now();
  try {
    if (now >= next_beat_) beat();
    if (now >= next_failure_check_) {
      next_failure_check_ = now + kFailureCheckEvery;
      if (const auto failure = store_->get("sgpu/failure")) {
        const auto newline = failure->find('\n');
        if (failure->substr(0, newline) != std::to_string(plan_.node_rank)) {
          return failure->substr(newline == std::string::npos ? 0 : newline + 1);
        }
      }
    }
    if (now >= next_check_) {
      next_check_ = now + kSilenceCheckEvery;
      for (int node = 0; node < plan_.nnodes; ++node) {
        if (silent(node) && !store_->get(key(node, "done"))) {
          return "node " + std::to_string(node) + " has not been heard from for " +
                 std::to_string(kSilentLimit.count()) +
                 " s: its sgpu is gone (killed, or its host went down)";
        }
      }
    }
  } catch (const std::exception&) {
    broken_ = true;
    return "node 0's store at " + endpoint() +
           " stopped answering: node 0's sgpu is gone (killed, or its host went down)";
  }
  return std::nullopt;
}

void NodeLink::post_failure(const std::string& what) {
  if (broken_ || failure_posted_) return;
  failure_posted_ = true;
  try {
    store_->set_if_absent("sgpu/failure", std::to_string(plan_.node_rank) + "\n" + what);
  } catch (const std::exception&) {
    broken_ = true;
  }
}

std::vector<NodeLink::Told> NodeLink::exchange(const serialize::NodeReport& mine,
                                               const std::optional<std::string>& results,
                                               const std::function<bool()>& stop) {
  std::vector<std::optional<Told>> reports(static_cast<std::size_t>(plan_.nnodes));
  reports[static_cast<std::size_t>(plan_.node_rank)] = Told{mine, results};
  if (!broken_) {
    try {
      if (results) store_->set(key(plan_.node_rank, "results"), *results);
      store_->set(key(plan_.node_rank, "done"), serialize::node_report_json(mine));
      std::vector<bool> settled(reports.size(), false);
      settled[static_cast<std::size_t>(plan_.node_rank)] = true;
      auto next_silence_check = Clock::now();
      while (true) {
        if (Clock::now() >= next_beat_) beat();
        const bool check_silence = Clock::now() >= next_silence_check;
        if (check_silence) next_silence_check = Clock::now() + kSilenceCheckEvery;
        bool all = true;
        for (int node = 0; node < plan_.nnodes; ++node) {
          const auto i = static_cast<std::size_t>(node);
          if (settled[i]) continue;
          if (const auto done = store_->get(key(node, "done"))) {
            try {
              reports[i] =
                  Told{serialize::parse_node_report(*done), store_->get(key(node, "results"))};
            } catch (const std::invalid_argument&) {
            }
            settled[i] = true;
          } else if (check_silence && silent(node)) {
            settled[i] = true;
          } else {
            all = false;
          }
        }
        if (all || stop()) break;
        std::this_thread::sleep_for(kRound);
      }
      store_->set(key(plan_.node_rank, "read"), "1");
    } catch (const std::exception&) {
      broken_ = true;
    }
  }
  std::vector<Told> out;
  for (auto& report : reports) {
    if (report) out.push_back(std::move(*report));
  }
  return out;
}

}  // namespace sgpu::nodes
