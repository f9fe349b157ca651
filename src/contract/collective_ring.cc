#include "contract/collective_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

namespace sgpu::contract {
namespace {

constexpr char kMagic[8] = {'S', 'G', 'P', 'U', 'R', 'I', 'N', 'G'};
constexpr std::uint32_t kVersion = 3;

struct GroupSlot {
  std::int32_t size;
  std::int32_t rank;
  std::int32_t member_count;
  std::int32_t members[CollectiveRing::kMaxMembers];
  char name[52];
};

struct EntrySlot {
  std::atomic<std::uint64_t> serial;  // 0 while written
  std::atomic<std::uint8_t> state;
  std::uint8_t op;
  std::int16_t unused;
  std::uint32_t group;
  std::uint64_t seq;
  std::int32_t peer;
  char dtype[16];
  char reduce_op[12];
  std::int64_t numel_in;
  std::int64_t numel_out;
  std::int64_t bytes;
  std::int64_t message_bytes;
  std::int64_t predicted_ns;
  std::int64_t entered_ns;
  std::atomic<std::int64_t> ended_ns;
};

static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

void copy_name(char* to, std::size_t size, std::string_view from) {
  const std::size_t n = std::min(from.size(), size - 1);
  std::memcpy(to, from.data(), n);
  to[n] = '\0';
}

std::string name_of(const char* from, std::size_t size) {
  return std::string(from, ::strnlen(from, size));
}

}  // namespace

struct CollectiveRing::TotalsSlot {
  std::atomic<std::int64_t> count;
  std::atomic<std::int64_t> bytes;
  std::atomic<std::int64_t> ended;
  std::atomic<std::int64_t> nanoseconds;
  std::atomic<std::int64_t> predicted_nanoseconds;
};
static_assert(std::atomic<std::int64_t>::is_always_lock_free);

struct CollectiveRing::Layout {
  char magic[8];
  std::uint32_t version;
  std::uint32_t capacity;
  std::uint32_t entry_bytes;
  std::int32_t rank;
  std::int32_t world_size;
  std::int32_t pid;
  char platform[64];                // the collective model's platform, "" for none
  std::atomic<std::uint64_t> next;  // entries claimed
  std::atomic<std::uint32_t> group_count;
  GroupSlot groups[kMaxGroups];
  TotalsSlot totals[kMaxGroups][kCollectiveOps];
  EntrySlot entries[1];  // capacity of them
};

namespace {

std::size_t file_size(std::uint32_t capacity) {
  return offsetof(CollectiveRing::Layout, entries) + sizeof(EntrySlot) * capacity;
}

}  // namespace

std::string_view op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kBroadcast:
      return "broadcast";
    case CollectiveOp::kAllReduce:
      return "all_reduce";
    case CollectiveOp::kAllReduceCoalesced:
      return "all_reduce_coalesced";
    case CollectiveOp::kReduce:
      return "reduce";
    case CollectiveOp::kAllGather:
      return "all_gather";
    case CollectiveOp::kAllGatherIntoTensor:
      return "all_gather_into_tensor";
    case CollectiveOp::kAllGatherCoalesced:
      return "all_gather_coalesced";
    case CollectiveOp::kAllGatherIntoTensorCoalesced:
      return "all_gather_into_tensor_coalesced";
    case CollectiveOp::kReduceScatter:
      return "reduce_scatter";
    case CollectiveOp::kReduceScatterTensor:
      return "reduce_scatter_tensor";
    case CollectiveOp::kReduceScatterTensorCoalesced:
      return "reduce_scatter_tensor_coalesced";
    case CollectiveOp::kAllToAll:
      return "all_to_all";
    case CollectiveOp::kAllToAllSingle:
      return "all_to_all_single";
    case CollectiveOp::kBarrier:
      return "barrier";
    case CollectiveOp::kGather:
      return "gather";
    case CollectiveOp::kScatter:
      return "scatter";
    case CollectiveOp::kSend:
      return "send";
    case CollectiveOp::kRecv:
      return "recv";
    case CollectiveOp::kRecvAnySource:
      return "recv_any_source";
  }
  return "unknown";
}

bool is_point_to_point(CollectiveOp op) {
  return op == CollectiveOp::kSend || op == CollectiveOp::kRecv ||
         op == CollectiveOp::kRecvAnySource;
}

std::string_view state_name(EntryState state) {
  switch (state) {
    case EntryState::kInFlight:
      return "in flight";
    case EntryState::kCompleted:
      return "completed";
    case EntryState::kFailed:
      return "failed";
  }
  return "unknown";
}

CollectiveRing::CollectiveRing(void* base, std::size_t size)
    : layout_(static_cast<Layout*>(base)), size_(size) {}

CollectiveRing::~CollectiveRing() { ::munmap(layout_, size_); }

std::unique_ptr<CollectiveRing> CollectiveRing::create(const std::filesystem::path& file,
                                                       std::uint32_t capacity, int rank,
                                                       int world_size, std::string_view platform) {
  if (capacity == 0) throw std::runtime_error("a collective ring needs room for one entry");
  const auto fail = [&](const char* what) {
    return std::runtime_error(std::string("cannot ") + what + " the collective ring " +
                              file.string() + ": " + std::strerror(errno));
  };
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw fail("create");
  const std::size_t size = file_size(capacity);
  // Allocated, not only sized: a page of a sparse file that a full filesystem cannot back
  // is a SIGBUS for whoever touches it first, the caller reading the ring included.
  if (const int error = ::posix_fallocate(fd, 0, static_cast<off_t>(size)); error != 0) {
    ::close(fd);
    errno = error;
    throw fail("allocate");
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) throw fail("map");
  // The file is all zeros: every serial is 0 (empty), and the counters start at 0.
  auto* layout = static_cast<Layout*>(base);
  layout->version = kVersion;
  layout->capacity = capacity;
  layout->entry_bytes = sizeof(EntrySlot);
  layout->rank = rank;
  layout->world_size = world_size;
  layout->pid = static_cast<std::int32_t>(::getpid());
  copy_name(layout->platform, sizeof layout->platform, platform);
  std::atomic_thread_fence(std::memory_order_release);
  std::memcpy(layout->magic, kMagic, sizeof kMagic);  // last: a reader sees a whole header
  return std::unique_ptr<CollectiveRing>(new CollectiveRing(base, size));
}

std::uint32_t CollectiveRing::add_group(const RingGroup& group) {
  static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
  // Groups are few and made rarely: written under a lock, then published by the count.
  std::lock_guard lock(groups_mutex_);
  const std::uint32_t index =
      std::min(layout_->group_count.load(std::memory_order_relaxed), kMaxGroups - 1);
  GroupSlot& slot = layout_->groups[index];
  slot.rank = group.rank;
  slot.member_count =
      static_cast<std::int32_t>(std::min<std::size_t>(group.members.size(), kMaxMembers));
  for (std::int32_t i = 0; i < slot.member_count; ++i) slot.members[i] = group.members[i];
  copy_name(slot.name, sizeof slot.name, group.name);
  slot.size = group.size;
  if (index < kMaxGroups - 1) {
    layout_->group_count.store(index + 1, std::memory_order_release);
  } else {
    copy_name(slot.name, sizeof slot.name, "(more groups than the ring's table holds)");
    layout_->group_count.store(kMaxGroups, std::memory_order_release);
  }
  return index;
}

std::uint64_t CollectiveRing::begin(const CollectiveEntry& entry) {
  const std::uint64_t index = layout_->next.fetch_add(1, std::memory_order_relaxed);
  EntrySlot& slot = layout_->entries[index % layout_->capacity];
  slot.serial.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  slot.state.store(static_cast<std::uint8_t>(EntryState::kInFlight), std::memory_order_relaxed);
  slot.op = static_cast<std::uint8_t>(entry.op);
  slot.group = entry.group;
  slot.seq = entry.seq;
  slot.peer = entry.peer;
  copy_name(slot.dtype, sizeof slot.dtype, entry.dtype);
  copy_name(slot.reduce_op, sizeof slot.reduce_op, entry.reduce_op);
  slot.numel_in = entry.numel_in;
  slot.numel_out = entry.numel_out;
  slot.bytes = entry.bytes;
  slot.message_bytes = entry.message_bytes;
  slot.predicted_ns = entry.predicted_ns;
  slot.entered_ns = entry.entered_ns;
  slot.ended_ns.store(0, std::memory_order_relaxed);
  slot.serial.store(index + 1, std::memory_order_release);
  TotalsSlot& totals = totals_of(entry.group, entry.op);
  totals.count.fetch_add(1, std::memory_order_relaxed);
  totals.bytes.fetch_add(entry.message_bytes, std::memory_order_relaxed);
  totals.predicted_nanoseconds.fetch_add(entry.predicted_ns, std::memory_order_relaxed);
  return index + 1;
}

void CollectiveRing::end(std::uint64_t serial, EntryState state) {
  EntrySlot& slot = layout_->entries[(serial - 1) % layout_->capacity];
  if (slot.serial.load(std::memory_order_acquire) != serial) return;
  // The first end counts (a Work's future and its wait may both report it).
  if (slot.state.load(std::memory_order_acquire) !=
      static_cast<std::uint8_t>(EntryState::kInFlight)) {
    return;
  }
  const std::int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
  slot.ended_ns.store(now, std::memory_order_relaxed);
  slot.state.store(static_cast<std::uint8_t>(state), std::memory_order_release);
  TotalsSlot& totals = totals_of(slot.group, static_cast<CollectiveOp>(slot.op));
  totals.ended.fetch_add(1, std::memory_order_relaxed);
  totals.nanoseconds.fetch_add(std::max<std::int64_t>(now - slot.entered_ns, 0),
                               std::memory_order_relaxed);
}

CollectiveRing::TotalsSlot& CollectiveRing::totals_of(std::uint32_t group, CollectiveOp op) {
  const auto o = std::min<std::size_t>(static_cast<std::size_t>(op), kCollectiveOps - 1);
  return layout_->totals[std::min(group, kMaxGroups - 1)][o];
}

std::optional<RingSnapshot> read_collective_ring(const std::filesystem::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  if (::fstat(fd, &st) != 0 ||
      static_cast<std::size_t>(st.st_size) < offsetof(CollectiveRing::Layout, entries)) {
    ::close(fd);
    return std::nullopt;
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) return std::nullopt;
  const auto* layout = static_cast<const CollectiveRing::Layout*>(base);
  std::optional<RingSnapshot> snapshot;
  if (std::memcmp(layout->magic, kMagic, sizeof kMagic) == 0 && layout->version == kVersion &&
      layout->entry_bytes == sizeof(EntrySlot) && layout->capacity > 0 &&
      file_size(layout->capacity) <= size) {
    std::atomic_thread_fence(std::memory_order_acquire);
    RingSnapshot& s = snapshot.emplace();
    s.rank = layout->rank;
    s.world_size = layout->world_size;
    s.pid = layout->pid;
    s.platform = name_of(layout->platform, sizeof layout->platform);
    s.capacity = layout->capacity;
    const std::uint32_t groups =
        std::min(layout->group_count.load(std::memory_order_acquire), CollectiveRing::kMaxGroups);
    for (std::uint32_t i = 0; i < groups; ++i) {
      const GroupSlot& slot = layout->groups[i];
      RingGroup group;
      group.name = name_of(slot.name, sizeof slot.name);
      group.size = slot.size;
      group.rank = slot.rank;
      const std::int32_t count =
          std::clamp<std::int32_t>(slot.member_count, 0, CollectiveRing::kMaxMembers);
      group.members.assign(slot.members, slot.members + count);
      s.groups.push_back(std::move(group));
      auto& totals = s.totals.emplace_back();
      for (std::size_t op = 0; op < kCollectiveOps; ++op) {
        const CollectiveRing::TotalsSlot& t = layout->totals[i][op];
        totals[op].count = t.count.load(std::memory_order_relaxed);
        totals[op].bytes = t.bytes.load(std::memory_order_relaxed);
        totals[op].ended = t.ended.load(std::memory_order_relaxed);
        totals[op].nanoseconds = t.nanoseconds.load(std::memory_order_relaxed);
        totals[op].predicted_nanoseconds = t.predicted_nanoseconds.load(std::memory_order_relaxed);
      }
    }
    s.written = layout->next.load(std::memory_order_acquire);
    const std::uint64_t first = s.written > s.capacity ? s.written - s.capacity : 0;
    for (std::uint64_t index = first; index < s.written; ++index) {
      const EntrySlot& slot = layout->entries[index % s.capacity];
      const std::uint64_t before = slot.serial.load(std::memory_order_acquire);
      if (before != index + 1) continue;  // being written, or already overwritten
      CollectiveEntry e;
      e.serial = before;
      e.state = static_cast<EntryState>(
          std::min<std::uint8_t>(slot.state.load(std::memory_order_acquire), 2));
      e.ended_ns = slot.ended_ns.load(std::memory_order_relaxed);
      e.op = static_cast<CollectiveOp>(
          std::min<std::uint8_t>(slot.op, static_cast<std::uint8_t>(CollectiveOp::kRecvAnySource)));
      e.group = slot.group;
      e.seq = slot.seq;
      e.peer = slot.peer;
      e.dtype = name_of(slot.dtype, sizeof slot.dtype);
      e.reduce_op = name_of(slot.reduce_op, sizeof slot.reduce_op);
      e.numel_in = slot.numel_in;
      e.numel_out = slot.numel_out;
      e.bytes = slot.bytes;
      e.message_bytes = slot.message_bytes;
      e.predicted_ns = slot.predicted_ns;
      e.entered_ns = slot.entered_ns;
      std::atomic_thread_fence(std::memory_order_acquire);
      if (slot.serial.load(std::memory_order_relaxed) != before) continue;
      s.entries.push_back(std::move(e));
    }
  }
  ::munmap(base, size);
  return snapshot;
}

}  // namespace sgpu::contract
