// Send and recv of the shared-memory transport (NOTE [The shared-memory transport] in
// shm_backend.cc): a ring per ordered pair of ranks, moved on by whichever wait the rank is
// in, its own or a collective's round.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>

#include "sim/shm/group.h"

namespace sgpu::sim::shm {
namespace {

class P2PWork final : public c10d::Work {
 public:
  P2PWork(c10::intrusive_ptr<ShmBackend> group, std::shared_ptr<P2P> op, int rank,
          c10d::OpType type);
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override { return op_->peer; }
  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override { return {op_->tensor}; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  c10::intrusive_ptr<ShmBackend> group_;
  std::shared_ptr<P2P> op_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace

c10::intrusive_ptr<c10d::Work> ShmBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                                int tag) {
  return point_to_point(tensors, dst, tag, /*send=*/true);
}

c10::intrusive_ptr<c10d::Work> ShmBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                                int tag) {
  return point_to_point(tensors, src, tag, /*send=*/false);
}

c10::intrusive_ptr<c10d::Work> ShmBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                         int tag) {
  return point_to_point(tensors, kAnySource, tag, /*send=*/false);
}

bool ShmBackend::p2p_done(const P2P& op) {
  std::lock_guard lock(mutex_);
  progress();
  return op.done;
}

bool ShmBackend::p2p_wait(const std::shared_ptr<P2P>& op, std::chrono::milliseconds timeout) {
  std::lock_guard lock(mutex_);
  progress();
  if (op->done) return true;
  const std::chrono::milliseconds limit =
      timeout == std::chrono::milliseconds(0) ? timeout_ : std::min(timeout, timeout_);
  const auto what = [&] {
    std::ostringstream out;
    out << (op->send ? "send to rank " : "recv from rank ") << op->peer << " (tag " << op->tag
        << ", " << op->bytes << " bytes; " << op->moved << " moved) after " << limit.count()
        << " ms";
    return out.str();
  };
  try {
    segment_->wait_until([&] { return op->done; }, Clock::now() + limit, op->peer, what,
                         [&] { progress(); });
  } catch (const std::exception& e) {
    // The rings may now be mid-message: nothing more goes through this group.
    if (broken_.empty()) broken_ = e.what();
    fail_p2p(std::current_exception());
  }
  return true;
}

void ShmBackend::fail_p2p(std::exception_ptr error) {
  const auto fail = [&](std::deque<std::shared_ptr<P2P>>& queue) {
    for (const auto& op : queue) {
      op->error = error;
      op->done = true;
    }
    queue.clear();
  };
  for (auto* queues : {&sends_, &recvs_}) {
    for (auto& queue : *queues) fail(queue);
  }
  fail(any_recvs_);
}

void ShmBackend::progress() {
  for (int peer = 0; peer < size_; ++peer) {
    while (!sends_[peer].empty() && push(*sends_[peer].front())) sends_[peer].pop_front();
    while (!recvs_[peer].empty() && pull(*recvs_[peer].front())) recvs_[peer].pop_front();
  }
  while (!any_recvs_.empty()) {
    const int from = sender_with(any_recvs_.front()->tag);
    if (from < 0) break;
    any_recvs_.front()->peer = from;
    recvs_[from].push_back(std::move(any_recvs_.front()));
    any_recvs_.pop_front();
    while (!recvs_[from].empty() && pull(*recvs_[from].front())) recvs_[from].pop_front();
  }
}

int ShmBackend::sender_with(std::uint64_t tag) const {
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_ || !recvs_[peer].empty()) continue;
    const ChannelHeader& ch = segment_->channel(peer, rank_);
    const std::uint64_t head = ch.head.load(std::memory_order_acquire);
    const std::uint64_t tail = ch.tail.load(std::memory_order_relaxed);
    if (head - tail < kMessageHeader) continue;
    std::uint64_t header[2];
    ring_read(segment_->ring(peer, rank_), tail, reinterpret_cast<std::byte*>(header),
              kMessageHeader);
    if (header[0] == tag) return peer;
  }
  return -1;
}

void ShmBackend::ring_write(std::byte* ring, std::uint64_t at, const std::byte* src,
                            std::size_t n) const {
  const std::size_t cap = segment_->channel_bytes();
  const std::size_t pos = at % cap;
  const std::size_t first = std::min(n, cap - pos);
  copy_bytes(ring + pos, src, first);
  copy_bytes(ring, src + first, n - first);
}

void ShmBackend::ring_read(const std::byte* ring, std::uint64_t at, std::byte* dst,
                           std::size_t n) const {
  const std::size_t cap = segment_->channel_bytes();
  const std::size_t pos = at % cap;
  const std::size_t first = std::min(n, cap - pos);
  copy_bytes(dst, ring + pos, first);
  copy_bytes(dst + first, ring, n - first);
}

bool ShmBackend::push(P2P& op) {
  ChannelHeader& ch = segment_->channel(rank_, op.peer);
  std::byte* ring = segment_->ring(rank_, op.peer);
  std::uint64_t head = ch.head.load(std::memory_order_relaxed);
  const std::uint64_t tail = ch.tail.load(std::memory_order_acquire);
  std::size_t space = segment_->channel_bytes() - static_cast<std::size_t>(head - tail);
  const std::uint64_t before = head;
  if (!op.header) {
    if (space < kMessageHeader) return false;
    const std::uint64_t header[2] = {op.tag, op.bytes};
    ring_write(ring, head, reinterpret_cast<const std::byte*>(header), kMessageHeader);
    head += kMessageHeader;
    space -= kMessageHeader;
    op.header = true;
  }
  const std::size_t n = std::min(space, op.bytes - op.moved);
  ring_write(ring, head, op.data + op.moved, n);
  head += n;
  op.moved += n;
  if (head != before) {
    ch.head.store(head, std::memory_order_release);
    segment_->ring_doorbell(op.peer);
  }
  op.done = op.moved == op.bytes;
  return op.done;
}

bool ShmBackend::pull(P2P& op) {
  ChannelHeader& ch = segment_->channel(op.peer, rank_);
  const std::byte* ring = segment_->ring(op.peer, rank_);
  const std::uint64_t head = ch.head.load(std::memory_order_acquire);
  std::uint64_t tail = ch.tail.load(std::memory_order_relaxed);
  std::size_t ready = static_cast<std::size_t>(head - tail);
  const std::uint64_t before = tail;
  if (!op.header) {
    if (ready < kMessageHeader) return false;
    std::uint64_t header[2];
    ring_read(ring, tail, reinterpret_cast<std::byte*>(header), kMessageHeader);
    if (header[0] != op.tag || header[1] != op.bytes) {
      std::ostringstream out;
      out << "recv from rank " << op.peer << " expected tag " << op.tag << " of " << op.bytes
          << " bytes; the next message rank " << op.peer << " sent has tag " << header[0] << " and "
          << header[1] << " bytes (sends and recvs between two ranks must match "
          << "in order)";
      broken_ = out.str();
      try {
        C10_THROW_ERROR(DistBackendError, out.str());
      } catch (...) {
        op.error = std::current_exception();
      }
      op.done = true;
      return true;
    }
    tail += kMessageHeader;
    ready -= kMessageHeader;
    op.header = true;
  }
  const std::size_t n = std::min(ready, op.bytes - op.moved);
  ring_read(ring, tail, op.data + op.moved, n);
  tail += n;
  op.moved += n;
  if (tail != before) {
    ch.tail.store(tail, std::memory_order_release);
    segment_->ring_doorbell(op.peer);
  }
  op.done = op.moved == op.bytes;
  return op.done;
}

c10::intrusive_ptr<c10d::Work> ShmBackend::point_to_point(std::vector<at::Tensor>& tensors,
                                                          int peer, int tag, bool send) {
  const char* what = send ? "send" : "recv";
  TORCH_CHECK(tensors.size() == 1, what, " takes one tensor, not ", tensors.size());
  TORCH_CHECK((peer >= 0 && peer < size_ && peer != rank_) || (!send && peer == kAnySource), what,
              ": rank ", peer, " is not another rank of the group (size ", size_, ")");
  TORCH_CHECK(tag >= 0, what, ": a negative tag");
  auto op = std::make_shared<P2P>();
  op->send = send;
  op->peer = peer;
  op->tag = static_cast<std::uint64_t>(tag);
  Dense t(tensors[0], what);
  TORCH_CHECK(send || t.work.is_same(t.original), "recv needs a contiguous tensor to receive into");
  op->tensor = t.work;
  op->data = t.data();
  op->bytes = t.bytes();
  {
    std::lock_guard lock(mutex_);
    TORCH_CHECK(broken_.empty(), "this process group failed earlier and cannot be used: ", broken_);
    if (peer == kAnySource) {
      any_recvs_.push_back(op);
    } else {
      (send ? sends_ : recvs_)[peer].push_back(op);
    }
    progress();
  }
  return c10::make_intrusive<P2PWork>(
      c10::intrusive_ptr<ShmBackend>::unsafe_reclaim_from_nonowning(this), op, rank_,
      send ? c10d::OpType::SEND : c10d::OpType::RECV);
}

P2PWork::P2PWork(c10::intrusive_ptr<ShmBackend> group, std::shared_ptr<P2P> op, int rank,
                 c10d::OpType type)
    : c10d::Work(rank, type), group_(std::move(group)), op_(std::move(op)) {}

bool P2PWork::isCompleted() { return group_->p2p_done(*op_); }
bool P2PWork::isSuccess() const { return op_->done && !op_->error; }
std::exception_ptr P2PWork::exception() const { return op_->error; }

bool P2PWork::wait(std::chrono::milliseconds timeout) {
  group_->p2p_wait(op_, timeout);
  if (op_->error) std::rethrow_exception(op_->error);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> P2PWork::getFuture() {
  if (!future_) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(tensor_list_type());
    wait(std::chrono::milliseconds(0));
    future_->markCompleted(c10::IValue(std::vector<at::Tensor>{op_->tensor}));
  }
  return future_;
}

}  // namespace sgpu::sim::shm
