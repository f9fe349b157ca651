// A folded world (NOTE [A folded world] in fold.h): its plan, and its groups.
#include "sim/fold.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "collectives/interposer.h"
#include "sgpu/errors.h"
#include "sim/shm/reduce.h"

namespace sgpu::sim {

Fold Fold::plan(int world, int period, bool second_of_a_place) {
  if (period < 1 || world < 1 || period > world || world % period != 0) {
    throw ConfigError("a world of " + std::to_string(world) +
                      " ranks cannot fold into replicas of " + std::to_string(period) +
                      ": the replica's size must be at least 1 and divide the world's");
  }
  Fold fold{world, period, {}};
  for (int r = 0; r < period; ++r) fold.running.push_back(r);
  if (second_of_a_place && world > period) fold.running.push_back(world - 1);
  return fold;
}

bool Fold::runs(int rank) const { return std::binary_search(running.begin(), running.end(), rank); }

std::vector<int> Fold::running_of(const std::vector<int>& members) const {
  std::vector<int> out;
  for (int m : members) {
    if (runs(m)) out.push_back(m);
  }
  return out;
}

int Fold::stand_in(int rank, const std::vector<int>& members) const {
  if (runs(rank)) return rank;
  for (int m : members) {
    if (m % period == rank % period && runs(m)) return m;
  }
  return -1;
}

namespace {

int position(const std::vector<int>& ranks, int rank) {
  return static_cast<int>(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin());
}

class FoldedGroup final : public c10d::Backend {
 public:
  FoldedGroup(c10::intrusive_ptr<c10d::Backend> transport, const Fold& fold,
              std::vector<int> members, int rank)
      : Backend(position(members, rank), static_cast<int>(members.size())),
        transport_(std::move(transport)),
        members_(std::move(members)),
        running_(fold.running_of(members_)) {
    for (int m : members_) {
      const int s = fold.stand_in(m, members_);
      source_.push_back(s < 0 ? -1 : position(running_, s));
    }
    TORCH_CHECK(transport_->getSize() == static_cast<int>(running_.size()),
                "a folded group's transport connects ", transport_->getSize(),
                " ranks, where the group has ", running_.size(), " running members");
  }

  const std::string getBackendName() const override { return transport_->getBackendName(); }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    one(inputs, "all_gather");
    const std::vector<at::Tensor> got = exchange(inputs[0]);
    for (int i = 0; i < getSize(); ++i) outputs.at(0).at(i).copy_(of(i, got));
    return collectives::completed_work(c10::IValue(outputs[0]));
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    const std::vector<at::Tensor> got = exchange(input);
    at::Tensor rows = output.view({getSize(), -1});
    for (int i = 0; i < getSize(); ++i) rows[i].copy_(of(i, got).reshape({-1}));
    return collectives::completed_work(c10::IValue(output));
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    one(tensors, "all_reduce");
    tensors[0].copy_(every_members_reduced(tensors[0], opts.reduceOp));
    return collectives::completed_work(c10::IValue(tensors));
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    one(tensors, "reduce");
    const at::Tensor result = every_members_reduced(tensors[0], opts.reduceOp);
    if (getRank() == opts.rootRank) tensors[0].copy_(result);
    return collectives::completed_work(c10::IValue(tensors));
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    one(tensors, "broadcast");
    const std::vector<at::Tensor> got = exchange(tensors[0]);
    tensors[0].copy_(of(static_cast<int>(opts.rootRank), got));
    return collectives::completed_work(c10::IValue(tensors));
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    const std::vector<at::Tensor> got = exchange(input);
    std::vector<at::Tensor> each;  // every member's slice for this rank
    for (int i = 0; i < getSize(); ++i) each.push_back(of(i, got).view({getSize(), -1})[getRank()]);
    output.copy_(reduced(each, opts.reduceOp).view_as(output));
    return collectives::completed_work(c10::IValue(output));
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    one(outputs, "reduce_scatter");
    at::Tensor flat = at::cat(flattened(inputs.at(0)));
    _reduce_scatter_base(outputs[0], flat, opts);
    return collectives::completed_work(c10::IValue(outputs));
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    one(inputs, "gather");
    const std::vector<at::Tensor> got = exchange(inputs[0]);
    if (getRank() == opts.rootRank) {
      for (int i = 0; i < getSize(); ++i) outputs.at(0).at(i).copy_(of(i, got));
    }
    return collectives::completed_work(c10::IValue(inputs));
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions&) override {
    if (!output_splits.empty() || !input_splits.empty()) {
      cannot_fold("an all-to-all with uneven splits, which differ from rank to rank");
    }
    const std::vector<at::Tensor> got = exchange(input);
    at::Tensor rows = output.view({getSize(), -1});
    for (int i = 0; i < getSize(); ++i) {
      rows[i].copy_(of(i, got).view({getSize(), -1})[getRank()]);
    }
    return collectives::completed_work(c10::IValue(output));
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return transport_->barrier(c10d::BarrierOptions());
  }

  void monitoredBarrier(const c10d::BarrierOptions&, bool) override {
    transport_->barrier(c10d::BarrierOptions())->wait();
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return transport_->send(tensors, running_peer(dst, "a send to"), tag);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return transport_->recv(tensors, running_peer(src, "a receive from"), tag);
  }

 private:
  [[noreturn]] void cannot_fold(const std::string& what) const {
    C10_THROW_ERROR(DistBackendError,
                    "sgpu: rank " + std::to_string(members_[getRank()]) +
                        " of a folded world (group of " + std::to_string(getSize()) +
                        " ranks) called " + what +
                        ": no running rank can stand for the ranks "
                        "that do not run there. Run this world unfolded, one process a rank");
  }

  static void one(const std::vector<at::Tensor>& tensors, const char* op) {
    TORCH_CHECK(tensors.size() == 1, op, " in a folded world takes one tensor a rank, got ",
                tensors.size());
  }

  static std::vector<at::Tensor> flattened(const std::vector<at::Tensor>& tensors) {
    std::vector<at::Tensor> flat;
    for (const at::Tensor& t : tensors) flat.push_back(t.reshape({-1}));
    return flat;
  }

  // Every running member's copy of `mine`, by its place among the running members.
  std::vector<at::Tensor> exchange(const at::Tensor& mine) {
    std::vector<at::Tensor> in{mine.contiguous()};
    std::vector<std::vector<at::Tensor>> out(1);
    for (std::size_t r = 0; r < running_.size(); ++r) out[0].push_back(at::empty_like(in[0]));
    transport_->allgather(out, in)->wait();
    return out[0];
  }

  // What member `index` contributed: its stand-in's tensor.
  const at::Tensor& of(int index, const std::vector<at::Tensor>& got) const {
    if (source_[index] < 0) {
      cannot_fold("a collective where rank " + std::to_string(members_[index]) +
                  " has no running rank of its place in the group");
    }
    return got[source_[index]];
  }

  // `each` reduced in member order, as the transports fold ranks 0, 1, ... (AVG truncates
  // integers, as theirs do).
  at::Tensor reduced(const std::vector<at::Tensor>& each, const c10d::ReduceOp& op) const {
    const auto kind = op.op_;
    const c10::ScalarType dtype = each[0].scalar_type();
    shm::check_reducible(dtype, kind);
    at::Tensor acc = each[0].contiguous().clone();
    for (std::size_t i = 1; i < each.size(); ++i) {
      const at::Tensor x = each[i].contiguous();
      shm::combine(acc.data_ptr(), x.data_ptr(), static_cast<std::size_t>(acc.numel()), dtype,
                   kind);
    }
    if (kind == c10d::ReduceOp::AVG) {
      if (c10::isIntegralType(dtype, false)) {
        acc.div_(getSize(), "trunc");
      } else {
        acc.div_(getSize());
      }
    }
    return acc;
  }

  // Every member's `t` (its stand-in's), reduced.
  at::Tensor every_members_reduced(const at::Tensor& t, const c10d::ReduceOp& op) {
    const std::vector<at::Tensor> got = exchange(t);
    std::vector<at::Tensor> each;
    for (int i = 0; i < getSize(); ++i) each.push_back(of(i, got));
    return reduced(each, op);
  }

  // The transport's rank for group rank `peer`, which must run.
  int running_peer(int peer, const char* what) const {
    const int global = members_.at(peer);
    const int at = position(running_, global);
    if (at == static_cast<int>(running_.size())) {
      cannot_fold(std::string(what) + " rank " + std::to_string(global) + ", which does not run");
    }
    return at;
  }

  c10::intrusive_ptr<c10d::Backend> transport_;
  std::vector<int> members_;  // global ranks, in group order
  std::vector<int> running_;  // the members that run, in group order: the transport's ranks
  std::vector<int> source_;   // per member: its stand-in's place in running_; -1 for none
};

c10::intrusive_ptr<c10d::Work> FoldedGroup::scatter(std::vector<at::Tensor>& outputs,
                                                    std::vector<std::vector<at::Tensor>>& inputs,
                                                    const c10d::ScatterOptions& opts) {
  one(outputs, "scatter");
  const int root = running_peer(static_cast<int>(opts.rootRank), "a scatter from");
  // The root's list, whole, to every running member; each takes its own part.
  at::Tensor all = at::empty({getSize(), outputs[0].numel()}, outputs[0].options());
  if (getRank() == opts.rootRank) all.copy_(at::stack(flattened(inputs.at(0))));
  std::vector<at::Tensor> buffer{all};
  c10d::BroadcastOptions from;
  from.rootRank = root;
  transport_->broadcast(buffer, from)->wait();
  outputs[0].copy_(all[getRank()].view_as(outputs[0]));
  return collectives::completed_work(c10::IValue(outputs));
}

}  // namespace

c10::intrusive_ptr<c10d::Backend> folded_group(c10::intrusive_ptr<c10d::Backend> transport,
                                               const Fold& fold, std::vector<int> members,
                                               int rank) {
  return c10::make_intrusive<FoldedGroup>(std::move(transport), fold, std::move(members), rank);
}

}  // namespace sgpu::sim
