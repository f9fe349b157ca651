#include "launcher/peers.h"

#include <utility>

#include "launcher/failure_table.h"
#include "nodes/reports.h"
#include "rendezvous/store.h"
#include "sgpu/internal/values.h"

namespace sgpu::launcher {
namespace {

class OneNode final : public Peers {
 public:
  const nodes::NodePlan& plan() const override { return plan_; }
  void agree(const std::string& /*problem*/) override {}
  std::unique_ptr<tracking::CallRun> share_run(std::unique_ptr<tracking::CallRun> begun,
                                               bool /*tracking*/) override {
    return begun;
  }
  void begin_failed(const std::string& /*why*/) override {}
  void open() override { store_ = std::make_unique<rendezvous::HostStore>("127.0.0.1"); }
  std::string store_host() const override { return store_->host(); }
  int store_port() const override { return store_->port(); }
  std::string run_id(const std::filesystem::path& run_dir) const override {
    return run_dir.filename().string();
  }
  Clock::duration hear_every() const override { return Clock::duration::max(); }
  std::optional<std::string> failure() override { return std::nullopt; }
  void tell_failure(const std::string& /*what*/) override {}
  void exchange(Verdict& /*verdict*/, bool /*returns*/,
                const std::function<NodeEnd(bool)>& /*mine*/,
                const std::function<bool()>& /*stop*/) override {}
  void close() override { store_.reset(); }  // its port is closed before the call ends
  const std::vector<RankFailure>& rows() const override { return rows_; }
  std::optional<std::vector<std::string>> take_results() override { return std::nullopt; }
  int launch_nodes() const override { return 1; }
  void place(RankFailure& /*row*/) const override {}
  std::string whose_ranks() const override { return "any rank"; }
  std::string failure_text(const std::string& headline, const std::vector<RankFailure>& rows,
                           const std::filesystem::path& run_dir) const override {
    return format_failure(headline, rows, run_dir);
  }

 private:
  const nodes::NodePlan plan_{};
  const std::vector<RankFailure> rows_{};
  std::unique_ptr<rendezvous::HostStore> store_;
};

class LinkedNodes final : public Peers {
 public:
  explicit LinkedNodes(std::unique_ptr<nodes::NodeLink> link)
      : link_(std::move(link)), plan_(link_->plan()), host_(link_->host_name()) {}

  const nodes::NodePlan& plan() const override { return plan_; }
  void agree(const std::string& problem) override { link_->agree(problem); }

  std::unique_ptr<tracking::CallRun> share_run(std::unique_ptr<tracking::CallRun> begun,
                                               bool tracking) override {
    if (plan_.node_rank == 0) {
      const auto shared = begun ? begun->shared() : tracking::CallRun::Shared{};
      link_->share_run({shared.uri, shared.experiment_id, shared.run_id});
      return begun;
    }
    const serialize::SharedRun run = link_->node0_run();
    return tracking::CallRun::join(tracking, {run.uri, run.experiment_id, run.run_id},
                                   plan_.front_end);
  }
  void begin_failed(const std::string& why) override {
    link_->post_failure("node 0 cannot track the launch: " + why);
  }

  void open() override {}  // node 0's store, which the link reached before anything else
  std::string store_host() const override { return plan_.host; }
  int store_port() const override { return plan_.port; }
  std::string run_id(const std::filesystem::path& /*run_dir*/) const override { return plan_.id; }

  Clock::duration hear_every() const override { return std::chrono::milliseconds(100); }
  std::optional<std::string> failure() override { return link_->poll(); }
  void tell_failure(const std::string& what) override {
    link_->post_failure(node_name() + " " + what);
  }

  void exchange(Verdict& verdict, bool returns, const std::function<NodeEnd(bool)>& mine,
                const std::function<bool()>& stop) override {
    returns = returns && verdict.outcome == Outcome::kSucceeded;
    NodeEnd end = mine(returns);
    serialize::NodeReport report;
    report.node_rank = plan_.node_rank;
    report.host = host_;
    report.run_dir = std::move(end.run_dir);
    report.rows = std::move(end.rows);
    const int ranks_here = static_cast<int>(report.rows.size());
    std::optional<std::string> published;
    if (returns && !end.results.empty()) published = serialize::to_bytes(end.results);
    nodes::NodeReports heard =
        nodes::hear_reports(link_->exchange(report, published, stop), plan_, ranks_here, returns,
                            std::move(end.results), verdict.outcome == Outcome::kSucceeded);
    if (!heard.peer_failure.empty()) {  // a success here that another node's end undoes
      verdict.outcome = Outcome::kPeerFailed;
      verdict.reason = std::move(heard.peer_failure);
    }
    rows_ = std::move(heard.rows);
    logs_ = std::move(heard.logs);
    node0_reported_ = heard.node0_reported;
    results_ = std::move(heard.results);
  }
  void close() override { link_.reset(); }  // node 0: the store stays until every node has read

  const std::vector<RankFailure>& rows() const override { return rows_; }
  std::optional<std::vector<std::string>> take_results() override {
    return std::exchange(results_, std::nullopt);
  }
  int launch_nodes() const override { return plan_.nnodes; }
  void place(RankFailure& row) const override {
    row.node_rank = plan_.node_rank;
    row.host = host_;
  }
  std::string whose_ranks() const override { return "any rank of this node"; }
  std::string failure_text(const std::string& headline, const std::vector<RankFailure>& rows,
                           const std::filesystem::path& run_dir) const override {
    return nodes_failure_text(headline, rows, run_dir, plan_, logs_, node0_reported_);
  }

 private:
  std::string node_name() const {
    return "node " + std::to_string(plan_.node_rank) + " (" + host_ + ")";
  }

  std::unique_ptr<nodes::NodeLink> link_;
  const nodes::NodePlan plan_{};
  const std::string host_;         // this node's host name
  std::vector<RankFailure> rows_;  // the other nodes' ranks, from their reports
  std::vector<std::string> logs_;  // where the other nodes keep their logs
  bool node0_reported_ = true;     // false: node 0 sent no report, it shows nothing
  std::optional<std::vector<std::string>> results_;  // every rank's, in global rank order
};

}  // namespace

std::unique_ptr<Peers> one_node() { return std::make_unique<OneNode>(); }

std::unique_ptr<Peers> linked_nodes(std::unique_ptr<nodes::NodeLink> link) {
  return std::make_unique<LinkedNodes>(std::move(link));
}

std::string nodes_failure_text(const std::string& headline, const std::vector<RankFailure>& rows,
                               const std::filesystem::path& run_dir, const nodes::NodePlan& plan,
                               const std::vector<std::string>& peer_logs, bool node0_reported) {
  if (plan.node_rank == 0) {
    std::string text = format_failure(headline, rows, run_dir);
    for (const std::string& line : peer_logs) text += "\n" + line;
    return text;
  }
  std::vector<RankFailure> here;
  for (const RankFailure& row : rows) {
    if (row.node_rank == plan.node_rank || row.root_cause) here.push_back(row);
  }
  return format_failure(
      headline + "\nnode 0 (" + plan.host + ")" +
          (node0_reported ? " shows every rank of the launch" : " is gone; this node's ranks:"),
      here, run_dir);
}

}  // namespace sgpu::launcher
