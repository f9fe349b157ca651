// The other nodes of a launch as a call sees them (NOTE [Several nodes] in nodes/nodes.h):
// none for a launch on one node (one_node()), and for several the link to them (linked_nodes(),
// over nodes::NodeLink). Every choice a call makes between one node and several is made here:
// where its ranks meet, how often it hears from the others and what it tells them when it
// fails first, whose MLflow run it is, the reports the nodes exchange once their ranks are
// gone, and how its error shows the ranks of every node.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/monitor.h"
#include "nodes/node_link.h"
#include "nodes/nodes.h"
#include "serialize/node_report.h"
#include "sgpu/errors.h"
#include "tracking/call_run.h"

namespace sgpu::launcher {

// What this node's ranks left, for the other nodes: where their logs are, their rows, and,
// when they return results and succeeded, those results (empty where one could not be read).
struct NodeEnd {
  std::filesystem::path run_dir;
  std::vector<RankFailure> rows;
  std::vector<std::string> results;
};

class Peers {
 public:
  virtual ~Peers() = default;

  // This node's place: node 0 of one alone.
  virtual const nodes::NodePlan& plan() const = 0;

  // Before any rank starts: every node's own checks (`problem` empty: this node can serve
  // the launch; else it is this node's error, which its caller throws). Throws when another
  // node cannot serve it.
  virtual void agree(const std::string& problem) = 0;
  // The launch's run: node 0's own (`begun`, CallRun::begin's), shared with the others, who
  // join it (`tracking`: Options::tracking). `begin_failed` tells the others why node 0 has none.
  virtual std::unique_ptr<tracking::CallRun> share_run(std::unique_ptr<tracking::CallRun> begun,
                                                       bool tracking) = 0;
  virtual void begin_failed(const std::string& why) = 0;

  // Where the ranks meet: a store this node hosts for one node (open() makes it), node 0's for
  // several; and the id the ranks' run shares.
  virtual void open() = 0;
  virtual std::string store_host() const = 0;
  virtual int store_port() const = 0;
  virtual std::string run_id(const std::filesystem::path& run_dir) const = 0;

  // While the ranks run: how often the monitor hears from the others (Deadlines::peers_every;
  // max: never), another node's failure if one came, and this node's own when it failed first
  // (`what` names the rank or the reason; the others learn which node).
  virtual Clock::duration hear_every() const = 0;
  virtual std::optional<std::string> failure() = 0;
  virtual void tell_failure(const std::string& what) = 0;

  // Once this node's ranks are gone: its report to the others and theirs to it. A success
  // here becomes kPeerFailed when another node failed or went away. `returns`: the ranks
  // return results; `mine(read_results)` says what this node's ranks left. `stop` ends a
  // wait for the others early (a cancel). Then the meeting place closes.
  virtual void exchange(Verdict& verdict, bool returns,
                        const std::function<NodeEnd(bool read_results)>& mine,
                        const std::function<bool()>& stop) = 0;
  virtual void close() = 0;

  // What the exchange heard: the other nodes' rows, and every rank's results in global rank
  // order when the launch succeeded with every node's arrived (taken once).
  virtual const std::vector<RankFailure>& rows() const = 0;
  virtual std::optional<std::vector<std::string>> take_results() = 0;

  // The launch's nodes as the error counts them; a row of this node says where it ran; whose
  // figures the summary lines give.
  virtual int launch_nodes() const = 0;
  virtual void place(RankFailure& row) const = 0;
  virtual std::string whose_ranks() const = 0;
  // The error's text: node 0 shows every rank and where the other nodes' logs are; the others
  // show their own and say where the rest is.
  virtual std::string failure_text(const std::string& headline,
                                   const std::vector<RankFailure>& rows,
                                   const std::filesystem::path& run_dir) const = 0;
};

// A launch on one node: no one to hear from or tell, a store of its own on 127.0.0.1.
std::unique_ptr<Peers> one_node();
// A launch over several nodes, through this node's link to them.
std::unique_ptr<Peers> linked_nodes(std::unique_ptr<nodes::NodeLink> link);

// The error's text over several nodes (Peers::failure_text), with `peer_logs` where the
// other nodes keep their logs and `node0_reported` false where node 0 sent no report.
std::string nodes_failure_text(const std::string& headline, const std::vector<RankFailure>& rows,
                               const std::filesystem::path& run_dir, const nodes::NodePlan& plan,
                               const std::vector<std::string>& peer_logs, bool node0_reported);

}  // namespace sgpu::launcher
