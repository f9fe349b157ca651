// NOTE [The nodes' keys]
// The sgpu of each node of a launch over several nodes (NOTE [Several nodes]) talks to the
// others through node 0's store, the one the ranks meet at, under keys of its own:
//   sgpu/launch          node 0: "<id> <nodes> <gpus per node> <sequence>", the sequence
//                        counting the process's launches of that id as that node (a program
//                        that calls a distributed function twice); a node that finds the
//                        previous one's store still up waits for the next, and one that
//                        asks for another launch is refused
//   sgpu/node/K/claim    counted up by node K; a second claim is a second node K
//   sgpu/node/K/ready    after node K's accelerator check: "ok\n<host>" or "error\n<host>\n<why>";
//                        no node starts a rank before every node is ok
//   sgpu/run             node 0, once its run exists, before its ranks start: the run the
//                        other nodes' ranks log into, "<uri>\n<experiment id>\n<run id>";
//                        "" when node 0 does not track the launch
//   sgpu/node/K/beat     a count node K raises every 250 ms until it has read every report;
//                        one that stands still for kSilentLimit means node K is gone
//   sgpu/failure         set once, by the first node to fail: "<K>\n<what>"; every node
//                        polls it every 100 ms and tears its ranks down when it appears
//   sgpu/node/K/results  a distributed function's: node K's ranks' results, in rank order
//                        (cereal's vector of byte strings), set before its report when they
//                        all succeeded
//   sgpu/node/K/done     node K's report (serialize/node_report.h) once its ranks are gone
//   sgpu/node/K/read     node K has every report; node 0 keeps the store until all have
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "contract/front_end.h"
#include "nodes/nodes.h"
#include "rendezvous/store.h"
#include "serialize/node_report.h"

namespace sgpu::nodes {

// For a process that reports a lost node itself (the sgpu command): c10's own warnings
// off, unless TORCH_CPP_LOG_LEVEL asks for them (rendezvous::quiet_c10_warnings()).
inline void quiet_store_warnings() { rendezvous::quiet_c10_warnings(); }

// How long a node's beat may stand still before the others take it for gone.
inline constexpr std::chrono::seconds kSilentLimit{3};

class NodeLink {
 public:
  // Node 0 hosts the store on the plan's host and port; the others join it, trying until
  // `join_timeout` has passed. Throws ConfigError for a node that does not belong to the
  // launch it reaches, Error when node 0's store cannot be reached or hosted.
  NodeLink(NodePlan plan, int gpus_per_node, std::chrono::milliseconds join_timeout);
  ~NodeLink();
  NodeLink(const NodeLink&) = delete;
  NodeLink& operator=(const NodeLink&) = delete;

  const NodePlan& plan() const { return plan_; }
  const std::string& host_name() const { return host_name_; }  // this node's

  // Publishes this node's accelerator check (`failure` empty: it passed) and waits for
  // every node's; with a failure it returns at once, for the caller to throw its own. Throws
  // AcceleratorMismatchError naming the first node that cannot serve the launch, Error when a node
  // has not reported within the join timeout.
  void agree(const std::string& failure);

  // Node 0: the launch's run, for the others (an empty run_id: untracked).
  void share_run(const serialize::SharedRun& run);
  // The other nodes: node 0's run, waiting for it within the join timeout. Throws Error
  // when node 0's store goes away first, node 0 says nothing in that time, or what it said
  // is no run.
  serialize::SharedRun node0_run();

  // While this node's ranks run (call it at least every 100 ms): beats, and says what
  // ends the launch from elsewhere: another node's failure, or a node gone silent.
  std::optional<std::string> poll();

  // This node failed first (its rank, its timeout, its interrupt): every other node is
  // told. Says nothing when another node was first.
  void post_failure(const std::string& what);

  // What a node told the others once its ranks were gone.
  struct Told {
    serialize::NodeReport report;
    std::optional<std::string> results;  // its ranks' results, when it published them
  };

  // This node's report (and its ranks' results, when given), then every node's in node
  // order, waiting while the others still beat; a node that goes silent is left out.
  // `stop` is asked between rounds: true ends the wait (an interrupt) with what was
  // gathered.
  std::vector<Told> exchange(const serialize::NodeReport& mine,
                             const std::optional<std::string>& results,
                             const std::function<bool()>& stop);

 private:
  // Node 0: hosts the launch's store and names `launch` ("id nnodes gpus sequence") there.
  void host(const std::string& launch);
  // The other nodes: reach node 0's store, waiting out its previous launch's, and check
  // that it hosts `launch`.
  void join(const std::string& launch);
  std::string endpoint() const;  // node 0's store, "host:port"
  std::string key(int node, const char* what) const;
  bool silent(int node);  // its beat has stood still past kSilentLimit
  void beat();

  NodePlan plan_;
  contract::Spelling spell_;  // the settings as the launch's caller names them
  std::chrono::milliseconds join_timeout_;
  std::string host_name_;
  std::unique_ptr<rendezvous::HostStore> host_;  // node 0 only
  std::unique_ptr<rendezvous::StoreClient> store_;
  bool broken_ = false;  // the store is gone
  bool failure_posted_ = false;
  long long beats_ = 0;
  std::chrono::steady_clock::time_point next_beat_, next_check_, next_failure_check_;
  struct Heard {
    std::string beat;
    std::chrono::steady_clock::time_point when;
  };
  std::vector<Heard> heard_;  // per node: its last beat and when it changed
};

}  // namespace sgpu::nodes
