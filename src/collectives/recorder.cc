#include "collectives/recorder.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "collectives/interposer.h"
#include "collectives/timeline.h"
#include "contract/option_table.h"
#include "contract/rank_env.h"
#include "contract/run_folder.h"
#include "model/platform.h"

namespace sgpu::collectives {
namespace {

using contract::CollectiveRing;
using contract::EntryState;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

EntryState state_of(c10d::Work& work) {
  return work.exception() ? EntryState::kFailed : EntryState::kCompleted;
}

// A Work whose end the ring learns when the rank waits for it or finds it complete, or
// from its future: `future` (when the Work has one) completes only after the ring has
// the end, so a rank that waits on it cannot exit before the entry is ended.
class RecordedWork final : public ForwardingWork {
 public:
  RecordedWork(c10::intrusive_ptr<c10d::Work> inner, CollectiveRing* ring, std::uint64_t serial,
               c10::intrusive_ptr<c10::ivalue::Future> future)
      : ForwardingWork(std::move(inner), c10d::OpType::UNKNOWN),
        ring_(ring),
        serial_(serial),
        future_(std::move(future)) {}

  bool isCompleted() override {
    const bool done = inner().isCompleted();
    if (done) settle(state_of(inner()));
    return done;
  }
  bool wait(std::chrono::milliseconds timeout) override {
    try {
      const bool done = inner().wait(timeout);
      if (done) settle(EntryState::kCompleted);
      return done;
    } catch (...) {
      settle(EntryState::kFailed);
      throw;
    }
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return future_ ? future_ : inner().getFuture();
  }

 private:
  void settle(EntryState state) {
    if (!settled_.exchange(true)) ring_->end(serial_, state);
  }

  CollectiveRing* ring_;
  std::uint64_t serial_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::atomic<bool> settled_{false};
};

// A collective on the rank's step timeline (NOTE [The step's timeline]): whoever waits
// for its Work, or on its future, waits, on the stream current then, for its predicted end.
class TimedWork final : public ForwardingWork {
 public:
  TimedWork(c10::intrusive_ptr<c10d::Work> inner, model::Moment end)
      : ForwardingWork(std::move(inner), c10d::OpType::UNKNOWN), end_(end) {}

  bool wait(std::chrono::milliseconds timeout) override {
    const bool done = inner().wait(timeout);
    wait_on_current_stream(end_);
    return done;
  }
  // Whoever waits through the future (DDP's reducer, a comm hook's then()) waits there too.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return completes_at(inner().getFuture(), end_);
  }

 private:
  model::Moment end_;
};

// Works whose future completes before they do (NCCL's, when the collective is enqueued on
// the stream): one thread asks each whether it is done (WorkNCCL asks its CUDA events)
// until it is.
class CompletionPoller {
 public:
  static CompletionPoller& instance() {
    static auto* poller = new CompletionPoller;  // lives to the rank's end
    return *poller;
  }
  // Whether a group of this rank has asked for one (without making it).
  static bool created() { return created_.load(); }

  // Ends the entries of the Works that are done; true when none is left.
  bool settle() {
    std::lock_guard lock(mutex_);
    end_completed();
    return watched_.empty();
  }

  void watch(c10::intrusive_ptr<c10d::Work> work, CollectiveRing* ring, std::uint64_t serial) {
    {
      std::lock_guard lock(mutex_);
      watched_.push_back({std::move(work), ring, serial});
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    }
    wake_.notify_one();
  }

 private:
  CompletionPoller() { created_.store(true); }

  struct Watched {
    c10::intrusive_ptr<c10d::Work> work;
    CollectiveRing* ring;
    std::uint64_t serial;
  };

  [[noreturn]] void run() {
    std::unique_lock lock(mutex_);
    while (true) {
      wake_.wait(lock, [this] { return !watched_.empty(); });
      end_completed();
      wake_.wait_for(lock, std::chrono::milliseconds(2));
    }
  }

  void end_completed() {  // with mutex_ held
    for (auto it = watched_.begin(); it != watched_.end();) {
      if (it->work->isCompleted()) {
        it->ring->end(it->serial, state_of(*it->work));
        it = watched_.erase(it);
      } else {
        ++it;
      }
    }
  }

  static inline std::atomic<bool> created_{false};

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Watched> watched_;
  std::thread thread_;
};

}  // namespace

const model::Platform* rank_platform() {
  static const model::Platform* platform = []() -> const model::Platform* {
    const std::string name = contract::setting_text(contract::kPlatformVar);
    if (name.empty()) return nullptr;
    try {
      return new model::Platform(model::load_platform(name));  // lives to the rank's end
    } catch (const std::exception&) {
      return nullptr;
    }
  }();
  return platform;
}

namespace {

class RecordingBackend final : public InterposingBackend {
 public:
  RecordingBackend(c10::intrusive_ptr<c10d::Backend> inner, CollectiveRing* ring,
                   std::uint32_t group, model::Span span, bool poll)
      : InterposingBackend(std::move(inner)),
        ring_(ring),
        group_(group),
        span_(span),
        poll_(poll),
        platform_(rank_platform()) {
    // A group across nodes on a platform that models one node is refused here, where the
    // program forms it, rather than timed as if on NVLink (NOTE [The network between nodes]).
    if (platform_ != nullptr) model::require_network(*platform_, span_);
  }

 protected:
  c10::intrusive_ptr<c10d::Work> around(const OpCall& call, Run run) override {
    const bool transfer = contract::is_point_to_point(call.op);
    contract::CollectiveEntry entry;
    entry.group = group_;
    entry.seq = transfer ? ++transfers_ : ++collectives_;
    entry.op = call.op;
    entry.dtype = call.dtype;
    entry.reduce_op = call.reduce_op;
    entry.peer = call.peer;
    entry.numel_in = call.numel_in;
    entry.numel_out = call.numel_out;
    entry.bytes = call.bytes;
    entry.message_bytes = std::max(call.bytes, call.bytes_out);
    if (platform_ != nullptr) {
      if (const auto c = model::collective_of(contract::op_name(call.op))) {
        entry.predicted_ns = static_cast<std::int64_t>(
            std::llround(model::predict(*platform_, *c, entry.message_bytes, span_).seconds * 1e9));
      }
    }
    entry.entered_ns = now_ns();
    const std::uint64_t serial = ring_->begin(entry);
    if (platform_ == nullptr) return recorded(run, serial, transfer);
    const model::Moment end = time_collective(reinterpret_cast<std::uintptr_t>(this),
                                              static_cast<double>(entry.predicted_ns) / 1e9);
    c10::intrusive_ptr<c10d::Work> work = recorded(run, serial, transfer);
    if (!work) return work;
    return c10::make_intrusive<TimedWork>(std::move(work), end);
  }

 private:
  // The transport's Work for the entry `serial`, whose end the ring learns from it.
  c10::intrusive_ptr<c10d::Work> recorded(Run run, std::uint64_t serial, bool transfer) {
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = run();
    } catch (...) {
      ring_->end(serial, EntryState::kFailed);
      throw;
    }
    if (!work) {
      ring_->end(serial, EntryState::kCompleted);
    } else if (work->isCompleted()) {
      ring_->end(serial, state_of(*work));
    } else if (poll_) {
      CompletionPoller::instance().watch(work, ring_, serial);
    } else {
      // A collective's future completes with it, on the transport's side; waiters on it
      // wake before its callbacks run, so the rank gets a future that follows the one
      // that ends the entry. A transfer's future may wait for it (shared memory's does):
      // not asked.
      c10::intrusive_ptr<c10::ivalue::Future> future;
      if (!transfer) {
        try {
          future = work->getFuture();
        } catch (const c10::Error&) {  // some of Gloo's Works have none
        }
      }
      if (future) {
        CollectiveRing* ring = ring_;
        future->addCallback([ring, serial](c10::ivalue::Future& done) {
          ring->end(serial, done.hasError() ? EntryState::kFailed : EntryState::kCompleted);
        });
        future = future->then([](c10::ivalue::Future& done) { return done.value(); },
                              future->elementType());
      }
      return c10::make_intrusive<RecordedWork>(std::move(work), ring_, serial, std::move(future));
    }
    return work;
  }

  CollectiveRing* ring_;
  std::uint32_t group_;
  model::Span span_;
  bool poll_;
  const model::Platform* platform_;
  // Counted by the thread that calls the group, as c10d's sequence numbers are.
  std::atomic<std::uint64_t> collectives_{0};
  std::atomic<std::uint64_t> transfers_{0};
};

}  // namespace

void settle_polled_entries(std::chrono::milliseconds limit) {
  if (!CompletionPoller::created()) return;  // no group of this rank polls
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!CompletionPoller::instance().settle() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

namespace {

// A ring in `folder` sized as the environment says; nullptr when recording is off.
std::unique_ptr<CollectiveRing> make_ring(const contract::RankFolder& folder, int rank,
                                          int world_size) {
  const long long entries = contract::read_rank_environment().recorder_entries;
  if (entries <= 0) return nullptr;
  const auto capacity = static_cast<std::uint32_t>(std::min<long long>(entries, 1 << 24));
  const model::Platform* platform = rank_platform();
  return CollectiveRing::create(folder.collective_ring(), capacity, rank, world_size,
                                platform ? platform->name : "");
}

}  // namespace

CollectiveRing* rank_ring() {
  static CollectiveRing* ring = []() -> CollectiveRing* {
    const contract::RankEnvironment env = contract::read_rank_environment();
    if (env.rank_dir.empty()) return nullptr;
    // Lives to the rank's end: the caller reads the file, the rank only writes it.
    return make_ring(contract::RankFolder{env.rank_dir}, env.rank, env.world_size).release();
  }();
  return ring;
}

CollectiveRing* world_ring(const contract::RankFolder& folder, int rank, int world_size) {
  try {
    // Lives to the process's end, as a rank's does: `sgpu sim` reads it after that too.
    return make_ring(folder, rank, world_size).release();
  } catch (const std::exception&) {
    return nullptr;  // the world goes unrecorded; it runs as it would
  }
}

c10::intrusive_ptr<c10d::Backend> record_collectives(c10::intrusive_ptr<c10d::Backend> transport,
                                                     CollectiveRing* ring,
                                                     const contract::RingGroup& group,
                                                     Completion completion) {
  if (ring == nullptr) return transport;
  const std::uint32_t index = ring->add_group(group);
  // The launch's nodes are LOCAL_WORLD_SIZE ranks each; a program started without one is on
  // one node.
  const int per_node = contract::env_string(contract::kLocalWorldSizeVar).empty()
                           ? 0
                           : contract::read_rank_environment().local_world_size;
  model::Span span{group.size, 1, group.size};
  if (static_cast<int>(group.members.size()) == group.size)
    span = model::span_of(group.members, per_node);
  return c10::make_intrusive<RecordingBackend>(std::move(transport), ring, index, span,
                                               completion == Completion::kPolled);
}

backend::RecordHook recorder_for(contract::RingGroup group, Completion completion) {
  return [group = std::move(group), completion](c10::intrusive_ptr<c10d::Backend> transport) {
    return record_collectives(std::move(transport), rank_ring(), group, completion);
  };
}

Completion completion_for(const std::string& backend) {
  return backend == contract::kCudaBackend ? Completion::kPolled : Completion::kFuture;
}

}  // namespace sgpu::collectives
