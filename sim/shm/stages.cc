// The segment protocol (NOTE [The shared-memory transport] in shm_backend.cc): a stage's
// rounds, and in an op's first stage the descriptors every rank compares, so that a
// mismatch fails every rank alike.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>

#include "sim/shm/group.h"
#include "sim/shm/reduce.h"
#include "sim/shm/shm_backend.h"

namespace sgpu::sim::shm {

std::string describe(const Descriptor& d) {
  std::ostringstream out;
  out << op_name(static_cast<CollectiveOp>(d.op)) << " #" << d.seq;
  if (static_cast<CollectiveOp>(d.op) == CollectiveOp::kBarrier) return out.str();
  if (static_cast<CollectiveOp>(d.op) != CollectiveOp::kAllToAll) {
    out << " of " << d.count << ' ' << c10::toString(static_cast<c10::ScalarType>(d.dtype));
  }
  if (d.reduce >= 0) out << " (" << reduce_op_name(static_cast<Op>(d.reduce)) << ')';
  if (d.root >= 0) out << " from root " << d.root;
  return out.str();
}

bool same_op(const Descriptor& a, const Descriptor& b) {
  return a.seq == b.seq && a.op == b.op && a.dtype == b.dtype && a.count == b.count &&
         a.root == b.root && a.reduce == b.reduce;
}

Descriptor ShmBackend::descriptor(CollectiveOp kind, const at::Tensor& t, std::size_t count,
                                  int root, int reduce) const {
  Descriptor d;
  d.seq = seq_;
  d.op = static_cast<std::uint32_t>(kind);
  d.dtype = static_cast<std::int32_t>(t.scalar_type());
  d.count = count;
  d.root = root;
  d.reduce = reduce;
  return d;
}

void ShmBackend::sync(const Descriptor& d, int buffer, bool first) {
  if (first) segment_->state(rank_).descriptor[buffer] = d;
  meet(d);
  if (first) compare(buffer);
}

void ShmBackend::meet(const Descriptor& d) {
  ++round_;
  segment_->arrive(
      round_, deadline_, [&] { return what(d); }, [&] { progress(); });
}

std::string ShmBackend::what(const Descriptor& d) const {
  std::ostringstream out;
  out << describe(d) << " (rank " << rank_ << " of " << size_ << ", timeout " << timeout_.count()
      << " ms)";
  return out.str();
}

void ShmBackend::compare(int buffer) const {
  const Descriptor& first = segment_->state(0).descriptor[buffer];
  bool same = true;
  for (int r = 1; r < size_ && same; ++r) {
    same = same_op(first, segment_->state(r).descriptor[buffer]);
  }
  if (same) return;
  // Group the ranks by what they called.
  std::vector<std::pair<Descriptor, std::vector<int>>> groups;
  for (int r = 0; r < size_; ++r) {
    const Descriptor& d = segment_->state(r).descriptor[buffer];
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return same_op(g.first, d); });
    if (it == groups.end()) {
      groups.push_back({d, {r}});
    } else {
      it->second.push_back(r);
    }
  }
  std::vector<std::pair<std::string, std::vector<int>>> called;
  for (const auto& [d, ranks] : groups) called.emplace_back(describe(d), ranks);
  C10_THROW_ERROR(DistBackendError, collective_mismatch(called));
}

std::string collective_mismatch(
    const std::vector<std::pair<std::string, std::vector<int>>>& called) {
  std::string text = "collective mismatch: the ranks of the group called different collectives: ";
  for (std::size_t c = 0; c < called.size(); ++c) {
    const std::vector<int>& ranks = called[c].second;
    text += (c == 0 ? "" : "; ") + std::string(ranks.size() == 1 ? "rank " : "ranks ");
    for (std::size_t i = 0; i < ranks.size(); ++i)
      text += (i == 0 ? "" : ",") + std::to_string(ranks[i]);
    text += " " + called[c].first;
  }
  return text;
}

}  // namespace sgpu::sim::shm
