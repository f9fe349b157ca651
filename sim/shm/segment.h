// The shared-memory segment of one simulated process group (NOTE [The shared-memory
// transport] in shm_backend.cc): a memfd that the group's rank 0 creates (mode 0600) and
// the other ranks open through /proc/<pid>/fd/<fd>, so it has no name anywhere and is
// gone when the last rank that maps it is, however the call ends.
//
// Layout: a control block (the barrier's arrival count and round), one state block per
// rank (doorbell, what it last arrived at, its pid, the descriptors of its last two
// rounds), the all-to-all length tables, one ring per ordered pair of ranks for send and
// recv, and two buffers of one slot per rank for the collectives' data.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace sgpu::sim::shm {

// What a rank says it is doing in a round; compared across ranks in an op's first round.
struct Descriptor {
  std::uint64_t seq = 0;    // the group's collective number, from 1
  std::uint32_t op = 0;     // contract::CollectiveOp
  std::int32_t dtype = -1;  // c10::ScalarType
  std::uint64_t count = 0;  // elements per rank (the op says which)
  std::int32_t root = -1;
  std::int32_t reduce = -1;  // c10d::ReduceOp::RedOpType
  std::uint64_t extra = 0;   // all-to-all: the longest piece this rank sends, in bytes
};

struct alignas(64) RankState {
  std::atomic<std::uint32_t> doorbell{0};  // the futex word this rank sleeps on
  std::atomic<std::uint32_t> sleeping{0};
  std::atomic<std::uint32_t> arrived{0};  // the last round this rank arrived at
  std::atomic<std::uint64_t> seq{0};      // the collective it is in or last was in
  std::int32_t pid = 0;
  Descriptor descriptor[2];
};

// One direction of send/recv between two ranks: a ring the sender writes at head and
// the receiver reads at tail (both count bytes since the group began).
struct alignas(64) ChannelHeader {
  std::atomic<std::uint64_t> head{0};
  alignas(64) std::atomic<std::uint64_t> tail{0};
};

using Clock = std::chrono::steady_clock;

struct SegmentSizes {
  std::size_t slot_bytes = std::size_t{1} << 20;     // per rank and buffer
  std::size_t channel_bytes = std::size_t{1} << 18;  // per ordered pair
};

class Segment {
 public:
  // Rank 0 creates the segment and publishes it under `key` in the group's store; the
  // others open it; every rank returns once all have (or throws c10::DistBackendError
  // after `timeout`).
  static std::unique_ptr<Segment> join(c10d::Store& store, const std::string& key, int rank,
                                       int world, SegmentSizes sizes,
                                       std::chrono::milliseconds timeout);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  std::size_t slot_bytes() const { return sizes_.slot_bytes; }
  std::size_t channel_bytes() const { return sizes_.channel_bytes; }

  RankState& state(int rank) const;
  std::byte* slot(int buffer, int rank) const;
  // 2 x world entries: the bytes this rank sends to each rank, then those it expects
  std::uint64_t* lengths(int buffer, int rank) const;
  ChannelHeader& channel(int src, int dst) const;
  std::byte* ring(int src, int dst) const;

  // Round `round` of the group's rounds (every rank counts the same): returns once every
  // rank has arrived at it. `progress` runs whenever the wait wakes (send/recv in flight
  // move on while a rank waits in a collective). Throws c10::DistBackendError when a peer
  // exits first, naming it, or at `deadline`, naming the ranks that never arrived.
  void arrive(std::uint32_t round, Clock::time_point deadline,
              const std::function<std::string()>& what, const std::function<void()>& progress);

  // Waits until `done()`, waking on this rank's doorbell; `peer` is the rank whose exit
  // ends the wait (-1: any). Throws as arrive() does.
  void wait_until(const std::function<bool()>& done, Clock::time_point deadline, int peer,
                  const std::function<std::string()>& what, const std::function<void()>& progress);

  // Wakes `rank` if it sleeps, after this rank changed what it may wait for.
  void ring_doorbell(int rank) const;

  // The ranks whose process has exited (never this one).
  std::vector<int> gone() const;

 private:
  Segment(int rank, int world, SegmentSizes sizes);
  void map(int fd, bool create);
  // Rank 0: makes the segment of `total` bytes (a memfd), sets its control block and names
  // it at `name` in the store. Returns the descriptor the other ranks open.
  int create(c10d::Store& store, const std::string& name, std::size_t total);
  // The other ranks: open what rank 0 named at `name` and check it is this group's.
  int attach(c10d::Store& store, const std::string& name, std::size_t total);
  [[noreturn]] void fail_wait(int peer, const std::function<std::string()>& what,
                              const std::function<std::vector<int>()>& missing) const;
  bool spin(const std::function<bool()>& done) const;
  // The wait of arrive() and wait_until(): ends when done(), fails when a rank in
  // awaited() exits or at the deadline.
  void wait(const std::function<bool()>& done, Clock::time_point deadline,
            const std::function<std::vector<int>()>& awaited,
            const std::function<std::string()>& what, const std::function<void()>& progress);
  void sleep_once(Clock::time_point deadline, const std::function<bool()>& done) const;

  int rank_;
  int world_;
  SegmentSizes sizes_;
  std::size_t bytes_ = 0;
  std::byte* base_ = nullptr;
  std::vector<int> pidfds_;  // -1 for this rank
  int spins_ = 0;
  int yields_ = 64;
};

}  // namespace sgpu::sim::shm
