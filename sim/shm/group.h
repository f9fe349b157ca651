// The shared-memory transport's group (NOTE [The shared-memory transport] in
// shm_backend.cc), for the files that make it up: the c10d backend and its collectives
// (shm_backend.cc), the segment protocol each collective's stages follow (stages.cc), the
// families the collectives are made of (families.cc), and send and recv
// (point_to_point.cc). Private to sim/shm.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "contract/collective_ring.h"
#include "sim/cuda/sim_cuda.h"
#include "sim/shm/segment.h"

namespace sgpu::sim::shm {

using Op = c10d::ReduceOp::RedOpType;

using contract::CollectiveOp;
using contract::op_name;

// "all_reduce #3 of 16 Float (SUM)": a collective as its descriptor says, for errors.
std::string describe(const Descriptor& d);
// Whether two ranks' descriptors are of the same collective.
bool same_op(const Descriptor& a, const Descriptor& b);

// A CPU tensor the transport can address as bytes: the tensor itself when dense and
// contiguous, else a contiguous copy that finish() writes back.
struct Dense {
  at::Tensor original;
  at::Tensor work;
  explicit Dense(const at::Tensor& t, std::string_view what) : original(t) {
    // A cuda tensor's memory is host memory where cuda is served (NOTE [CUDA on sim]).
    TORCH_CHECK(t.device().is_cpu() || (t.is_cuda() && cuda::served()),
                "sgpu's simulated process group takes CPU tensors; ", what, " got one on ",
                t.device(), " (sgpu::device() is \"cpu\" in a C++ rank on sim)");
    TORCH_CHECK(t.layout() == c10::kStrided, "sgpu's simulated process group takes dense tensors; ",
                what, " got a ", t.layout(), " one");
    work = t.is_contiguous() ? t : t.contiguous();
  }
  std::byte* data() const { return static_cast<std::byte*>(work.data_ptr()); }
  std::size_t bytes() const { return work.nbytes(); }
  void finish() {
    if (!work.is_same(original)) original.copy_(work);
  }
};

// memcpy for pieces that may be empty, whose pointers may then be null (an empty tensor's).
inline void copy_bytes(void* dst, const void* src, std::size_t n) {
  if (n > 0) std::memcpy(dst, src, n);
}

// c10d's type of a Work's result: a list of tensors.
const c10::TypePtr& tensor_list_type();

constexpr std::size_t kMessageHeader = 16;  // tag, bytes
constexpr int kAnySource = -1;              // a receive's peer until a sender matches it

// A send or a receive in flight.
struct P2P {
  bool send = true;
  int peer = 0;
  std::uint64_t tag = 0;
  at::Tensor tensor;  // kept alive while in flight
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  std::size_t moved = 0;
  bool header = false;
  bool done = false;
  std::exception_ptr error;
};

class ShmBackend final : public c10d::Backend {
 public:
  ShmBackend(c10::intrusive_ptr<c10d::Store> store, int rank, int world,
             std::chrono::milliseconds timeout, SegmentSizes sizes);

  const std::string getBackendName() const override { return "sgpu_shm"; }
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_; }

  // c10d's collectives (shm_backend.cc).
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions&) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions&) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool /*wait_all_ranks*/) override;

  // Send and recv (point_to_point.cc).
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  // From whichever rank first sends a message of this tag; the Work's sourceRank() says who.
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  // The p2p side, for P2PWork.
  bool p2p_done(const P2P& op);
  bool p2p_wait(const std::shared_ptr<P2P>& op, std::chrono::milliseconds timeout);

 private:
  struct Piece {
    std::byte* data;
    std::size_t bytes;
  };

  // A collective: `body` under the group's lock and deadline, its Work done when made
  // (shm_backend.cc).
  template <class Body>
  c10::intrusive_ptr<c10d::Work> run(c10d::OpType type, std::vector<at::Tensor> outputs,
                                     Body&& body);
  void check_root(int64_t root) const;

  // The segment protocol (stages.cc).
  Descriptor descriptor(CollectiveOp kind, const at::Tensor& t, std::size_t count, int root,
                        int reduce) const;
  int begin_stage() { return static_cast<int>(stage_++ & 1U); }
  // One round. In an op's first stage the descriptors go with it and are compared.
  void sync(const Descriptor& d, int buffer, bool first);
  // The next round, with every rank.
  void meet(const Descriptor& d);
  std::string what(const Descriptor& d) const;
  void compare(int buffer) const;

  // The collectives' families (families.cc).
  // AVG: the sum divided by the world size (integers truncated).
  void average(at::Tensor& t) const;
  // All-reduce (root -1) and reduce into t, in place.
  void reduce_into(CollectiveOp kind, Dense& t, Op op, int root);
  // All-gather and gather: every rank's input into outputs[r] (root -1: on every rank).
  void gather_into(CollectiveOp kind, const at::Tensor& input,
                   const std::vector<at::Tensor>& outputs, int root);
  // Reduce-scatter (root -1: output = fold over ranks of their inputs[rank]) and scatter
  // (reduce -1: output = the root's inputs[rank]).
  void scatter_from(CollectiveOp kind, const std::vector<at::Tensor>& inputs,
                    const at::Tensor& output, int reduce, int root);
  // The pieces of an all-to-all tensor along dim 0: equal when splits is empty.
  std::vector<Piece> split_rows(const Dense& t, const std::vector<int64_t>& splits,
                                const char* which) const;
  void exchange(const std::vector<Piece>& sends, const std::vector<Piece>& receives,
                c10::ScalarType dtype);
  // Every rank checks every pair, so all fail alike.
  void check_lengths(int buffer, const Descriptor& d) const;

  // Send and recv's rings (point_to_point.cc).
  c10::intrusive_ptr<c10d::Work> point_to_point(std::vector<at::Tensor>& tensors, int peer, int tag,
                                                bool send);
  // Ends every send and recv in flight with `error`.
  void fail_p2p(std::exception_ptr error);
  // Moves every send and recv in flight as far as the rings allow. A receive from any
  // source takes the first sender whose next message has its tag, among those no receive
  // named already waits on (messages between two ranks are taken in order).
  void progress();
  // A rank whose next message to this one, whole header there, has `tag`; -1 for none.
  int sender_with(std::uint64_t tag) const;
  void ring_write(std::byte* ring, std::uint64_t at, const std::byte* src, std::size_t n) const;
  void ring_read(const std::byte* ring, std::uint64_t at, std::byte* dst, std::size_t n) const;
  // True when op is complete.
  bool push(P2P& op);
  bool pull(P2P& op);

  // Fold in place when all ranks' stage data together is at most this; above it, fold by
  // portions (a second round, but each rank reads only 1/N of the others' data).
  static constexpr std::size_t kFoldWhole = 32 * 1024;

  std::unique_ptr<Segment> segment_;
  std::chrono::milliseconds timeout_;
  std::recursive_mutex mutex_;
  std::uint64_t seq_ = 0;
  std::uint32_t stage_ = 0;
  std::uint32_t round_ = 0;
  Clock::time_point deadline_;
  std::string broken_;
  std::vector<std::deque<std::shared_ptr<P2P>>> sends_;
  std::vector<std::deque<std::shared_ptr<P2P>>> recvs_;
  std::deque<std::shared_ptr<P2P>> any_recvs_;  // receives from any source, not yet matched
};

}  // namespace sgpu::sim::shm
