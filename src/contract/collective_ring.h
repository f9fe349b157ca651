// NOTE [The collective ring]
// Each rank records the collectives of its process groups in rank-N/collectives.ring
// (RankFolder::collective_ring()), a file the rank maps shared and writes as it goes, so
// the caller can read it while the rank is wedged in a wait, and after it died.
//
// The file is a header, a table of the rank's process groups and a ring of `capacity`
// entries. An entry is written when the rank enters a collective (or a send or recv) and
// its state and end time change when it completes or fails. The writer claims the next
// slot, sets its serial to 0, writes the fields and then publishes the serial (the
// entry's index + 1, counting from the rank's first); a reader keeps an entry only when
// the serial it read before the fields equals the one after, so an entry being
// overwritten is skipped, never read half old and half new. Times are wall-clock
// nanoseconds, comparable across the ranks of one node.
//
// Sequence numbers count per group, from 1: collectives and point-to-point transfers each
// have their own count, as c10d's flight recorder keeps them. The collective number is the
// one a fault plan's collective=K names.
//
// NOTE [Communication accounting]
// Beside the ring, the file keeps totals per group and op that never wrap: how many the
// rank entered, the bytes they moved in nccl-tests' terms (the message size, algbw's
// numerator: the larger of a rank's input and output, so an all-reduce's buffer, an
// all-gather's whole output, a reduce-scatter's whole input), and how many ended and the
// time from entering to ending they took, and the time the collective model predicts for
// them on the node the call pretends to be (NOTE [The collective model]; 0 without one).
// They are counted as entries begin and end, with no lock, so they are whole even for a
// rank that died.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sgpu::contract {

// What a recorded entry did. The names are torch.distributed's.
enum class CollectiveOp : std::uint8_t {
  kBroadcast,
  kAllReduce,
  kAllReduceCoalesced,
  kReduce,
  kAllGather,
  kAllGatherIntoTensor,
  kAllGatherCoalesced,
  kAllGatherIntoTensorCoalesced,
  kReduceScatter,
  kReduceScatterTensor,
  kReduceScatterTensorCoalesced,
  kAllToAll,
  kAllToAllSingle,
  kBarrier,
  kGather,
  kScatter,
  kSend,
  kRecv,
  kRecvAnySource,
};

// "all_reduce", "all_gather_into_tensor", "send", ...
std::string_view op_name(CollectiveOp op);
bool is_point_to_point(CollectiveOp op);

inline constexpr std::size_t kCollectiveOps =
    static_cast<std::size_t>(CollectiveOp::kRecvAnySource) + 1;

enum class EntryState : std::uint8_t { kInFlight, kCompleted, kFailed };
std::string_view state_name(EntryState state);

// One collective (or transfer) as a rank made it.
struct CollectiveEntry {
  std::uint64_t serial = 0;  // the rank's count of entries, from 1
  std::uint32_t group = 0;   // index into RingSnapshot::groups
  std::uint64_t seq = 0;     // the group's count of collectives (or of transfers), from 1
  CollectiveOp op = CollectiveOp::kBarrier;
  EntryState state = EntryState::kInFlight;
  std::string dtype;       // "float32" ..., "" when there are no tensors
  std::string reduce_op;   // "sum" ..., "" for ops without one
  std::int32_t peer = -1;  // the root of broadcast/reduce/gather/scatter, the peer of a
                           // transfer (group ranks); -1 otherwise
  std::int64_t numel_in = 0;
  std::int64_t numel_out = 0;
  std::int64_t bytes = 0;          // what the rank contributes
  std::int64_t message_bytes = 0;  // nccl-tests' message size (NOTE [Communication accounting])
  std::int64_t predicted_ns = 0;   // on the rank's platform (NOTE [The collective model]); 0: none
  std::int64_t entered_ns = 0;     // wall clock
  std::int64_t ended_ns = 0;       // 0 while in flight
};

// A process group of the rank, as the table in the file holds it.
struct RingGroup {
  std::string name;  // "world", or the group's global ranks ("ranks 0,2")
  std::int32_t size = 0;
  std::int32_t rank = 0;     // the rank's place in the group
  std::vector<int> members;  // global ranks by group rank, when known
};

// One op's totals in one group (NOTE [Communication accounting]).
struct OpTotals {
  std::int64_t count = 0;  // entered
  std::int64_t bytes = 0;  // message sizes, summed
  std::int64_t ended = 0;
  std::int64_t nanoseconds = 0;            // entering to ending, of those that ended
  std::int64_t predicted_nanoseconds = 0;  // the model's, for every one entered
};

struct RingSnapshot {
  std::int32_t rank = 0;
  std::int32_t world_size = 0;
  std::int32_t pid = 0;
  std::uint32_t capacity = 0;
  std::string platform;       // what predicted_ns is predicted on; "" for nothing
  std::uint64_t written = 0;  // entries ever written; more than capacity: the oldest are gone
  std::vector<RingGroup> groups;
  std::vector<CollectiveEntry> entries;  // oldest first
  // Per group (as `groups`), per op (indexed by CollectiveOp).
  std::vector<std::array<OpTotals, kCollectiveOps>> totals;
};

// The writer, in the rank. Every method is thread-safe; begin() and end() take no lock.
class CollectiveRing {
 public:
  // Creates (or truncates) `file` with room for `capacity` entries; `platform` names what
  // the entries' predicted times are predicted on. Throws std::runtime_error naming the
  // file when it cannot.
  static std::unique_ptr<CollectiveRing> create(const std::filesystem::path& file,
                                                std::uint32_t capacity, int rank, int world_size,
                                                std::string_view platform = {});
  ~CollectiveRing();
  CollectiveRing(const CollectiveRing&) = delete;
  CollectiveRing& operator=(const CollectiveRing&) = delete;

  // Adds a group to the table; returns its index (kMaxGroups - 1 is shared by the groups
  // beyond the table's size).
  std::uint32_t add_group(const RingGroup& group);
  // Records an entry in flight (its serial and state are the ring's); returns its serial.
  std::uint64_t begin(const CollectiveEntry& entry);
  // The entry's end, unless it has ended already or the ring has overwritten it since.
  void end(std::uint64_t serial, EntryState state);

  static constexpr std::uint32_t kMaxGroups = 64;
  static constexpr std::uint32_t kMaxMembers = 64;
  struct Layout;      // the file's (collective_ring.cc)
  struct TotalsSlot;  // one op's totals in one group, in the file

 private:
  CollectiveRing(void* base, std::size_t size);
  TotalsSlot& totals_of(std::uint32_t group, CollectiveOp op);
  Layout* layout_;
  std::size_t size_;
  std::mutex groups_mutex_;
};

// What `file` holds; nullopt when it does not exist or is not a ring (a rank that never
// made a process group has none).
std::optional<RingSnapshot> read_collective_ring(const std::filesystem::path& file);

}  // namespace sgpu::contract
