#include "sim/shm/segment.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

namespace sgpu::sim::shm {
namespace {

constexpr std::uint64_t kMagic = 0x5347505553484d31ULL;  // "SGPUSHM1"
constexpr std::size_t kControlBytes = 256;
constexpr std::size_t kPage = 4096;
// How long a sleeping rank waits before it looks at its peers and its deadline.
constexpr auto kSlice = std::chrono::milliseconds(50);

struct Control {
  std::uint64_t magic;
  std::uint64_t token;
  std::uint32_t world;
  std::uint64_t slot_bytes;
  std::uint64_t channel_bytes;
  alignas(64) std::atomic<std::uint32_t> count;  // ranks arrived at the current round
  alignas(64) std::atomic<std::uint32_t> round;  // the last round every rank arrived at
};
static_assert(sizeof(Control) <= kControlBytes);

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

struct Offsets {
  std::size_t states, lengths, channels, channel_stride, data, total;
  Offsets(int world, SegmentSizes sizes) {
    const auto w = static_cast<std::size_t>(world);
    states = kControlBytes;
    lengths = states + w * sizeof(RankState);
    channels = round_up(lengths + 2 * w * 2 * w * sizeof(std::uint64_t), 64);
    channel_stride = sizeof(ChannelHeader) + sizes.channel_bytes;
    data = round_up(channels + w * w * channel_stride, kPage);
    total = data + 2 * w * sizes.slot_bytes;
  }
};

Control& control(std::byte* base) { return *reinterpret_cast<Control*>(base); }

[[noreturn]] void throw_errno(const std::string& what) {
  C10_THROW_ERROR(DistBackendError, what + ": " + std::strerror(errno));
}

// The wrapping comparison of round numbers: has `have` reached `want`?
bool reached(std::uint32_t have, std::uint32_t want) {
  return static_cast<std::int32_t>(have - want) >= 0;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
  }
  return out;
}

int cpus_available() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

Segment::Segment(int rank, int world, SegmentSizes sizes)
    : rank_(rank), world_(world), sizes_(sizes), pidfds_(world, -1) {
  // Spinning helps only when every rank has a core of its own; oversubscribed, a spinning
  // rank takes the core from the one it waits for. A few yields help either way, and are
  // few enough (then it sleeps) that waiting ranks do not burn the cores.
  spins_ = world <= cpus_available() ? 2000 : 0;
}

std::unique_ptr<Segment> Segment::join(c10d::Store& store, const std::string& key, int rank,
                                       int world, SegmentSizes sizes,
                                       std::chrono::milliseconds timeout) {
  TORCH_CHECK(world >= 1 && rank >= 0 && rank < world, "bad rank ", rank, " of ", world);
  sizes.slot_bytes = round_up(std::max<std::size_t>(sizes.slot_bytes, 64), 64);
  sizes.channel_bytes = round_up(std::max<std::size_t>(sizes.channel_bytes, 64), 64);
  std::unique_ptr<Segment> segment(new Segment(rank, world, sizes));
  const Offsets offsets(world, sizes);
  // A group made again under the same name (init_process_group after
  // destroy_process_group) meets in the same store: each making of it is a generation of
  // its own, which every member counts to alike (they all join each one once), so no rank
  // opens a segment an earlier generation left named there.
  const std::int64_t joined = store.add(key + "/joined", 1);
  const std::string generation_key = key + "/" + std::to_string((joined - 1) / world);
  const int fd = rank == 0 ? segment->create(store, generation_key, offsets.total)
                           : segment->attach(store, generation_key, offsets.total);
  segment->state(rank).pid = static_cast<std::int32_t>(::getpid());
  // Every rank has it open before rank 0 lets go of the descriptor the others open.
  store.set(generation_key + "/attached/" + std::to_string(rank), std::vector<uint8_t>{1});
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(generation_key + "/attached/" + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  const std::int32_t self = static_cast<std::int32_t>(::getpid());
  for (int r = 0; r < world; ++r) {
    const std::int32_t pid = segment->state(r).pid;
    if (r == rank || pid == self) continue;  // ranks that are threads of one process (tests)
    segment->pidfds_[r] = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  }
  return segment;
}

int Segment::create(c10d::Store& store, const std::string& name, std::size_t total) {
  const int fd = static_cast<int>(::syscall(SYS_memfd_create, "sgpu-sim-group", MFD_CLOEXEC));
  if (fd < 0) throw_errno("sgpu: cannot create the shared-memory segment (memfd_create)");
  if (::fchmod(fd, 0600) != 0 || ::ftruncate(fd, static_cast<off_t>(total)) != 0) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    throw_errno("sgpu: cannot size the shared-memory segment to " + std::to_string(total) +
                " bytes");
  }
  bytes_ = total;
  map(fd, /*create=*/true);
  std::random_device random;
  const std::uint64_t token = (std::uint64_t{random()} << 32) ^ random();
  Control& c = control(base_);
  c.token = token;
  c.world = static_cast<std::uint32_t>(world_);
  c.slot_bytes = sizes_.slot_bytes;
  c.channel_bytes = sizes_.channel_bytes;
  std::atomic_thread_fence(std::memory_order_release);
  c.magic = kMagic;
  std::ostringstream where;
  where << "/proc/" << ::getpid() << "/fd/" << fd << ' ' << token;
  const std::string text = where.str();
  store.set(name, std::vector<uint8_t>(text.begin(), text.end()));
  return fd;
}

int Segment::attach(c10d::Store& store, const std::string& name, std::size_t total) {
  const std::vector<uint8_t> bytes = store.get(name);
  std::istringstream where(std::string(bytes.begin(), bytes.end()));
  std::string path;
  std::uint64_t token = 0;
  where >> path >> token;
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    throw_errno("sgpu: rank " + std::to_string(rank_) +
                " cannot open rank 0's shared-memory segment " + path);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != total) {
    ::close(fd);
    C10_THROW_ERROR(DistBackendError,
                    "sgpu: rank " + std::to_string(rank_) + " found rank 0's segment " + path +
                        " of another size than its own sizes give (" + std::to_string(total) +
                        " bytes): do all ranks see the same SGPU_SIM_SHM_SLOT_BYTES?");
  }
  bytes_ = total;
  map(fd, /*create=*/false);
  const Control& c = control(base_);
  if (c.magic != kMagic || c.token != token || c.world != static_cast<std::uint32_t>(world_)) {
    ::close(fd);
    C10_THROW_ERROR(DistBackendError, "sgpu: rank " + std::to_string(rank_) + " opened " + path +
                                          ", which is not this group's segment");
  }
  return fd;
}

void Segment::map(int fd, bool create) {
  void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    throw_errno("sgpu: cannot map the shared-memory segment (" + std::to_string(bytes_) +
                " bytes)");
  }
  base_ = static_cast<std::byte*>(p);
  if (create) {
    new (base_) Control{};
    for (int r = 0; r < world_; ++r) new (&state(r)) RankState{};
    for (int s = 0; s < world_; ++s) {
      for (int d = 0; d < world_; ++d) new (&channel(s, d)) ChannelHeader{};
    }
  }
}

Segment::~Segment() {
  for (int fd : pidfds_) {
    if (fd >= 0) ::close(fd);
  }
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

RankState& Segment::state(int rank) const {
  return reinterpret_cast<RankState*>(base_ + kControlBytes)[rank];
}

std::byte* Segment::slot(int buffer, int rank) const {
  const Offsets offsets(world_, sizes_);
  return base_ + offsets.data +
         (static_cast<std::size_t>(buffer) * world_ + rank) * sizes_.slot_bytes;
}

std::uint64_t* Segment::lengths(int buffer, int rank) const {
  const Offsets offsets(world_, sizes_);
  return reinterpret_cast<std::uint64_t*>(base_ + offsets.lengths) +
         (static_cast<std::size_t>(buffer) * world_ + rank) * 2 * world_;
}

ChannelHeader& Segment::channel(int src, int dst) const {
  const Offsets offsets(world_, sizes_);
  return *reinterpret_cast<ChannelHeader*>(base_ + offsets.channels +
                                           (static_cast<std::size_t>(src) * world_ + dst) *
                                               offsets.channel_stride);
}

std::byte* Segment::ring(int src, int dst) const {
  return reinterpret_cast<std::byte*>(&channel(src, dst)) + sizeof(ChannelHeader);
}

void Segment::ring_doorbell(int rank) const {
  RankState& s = state(rank);
  s.doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (s.sleeping.load(std::memory_order_seq_cst) != 0) {
    ::syscall(SYS_futex, &s.doorbell, FUTEX_WAKE, 1, nullptr, nullptr, 0);
  }
}

std::vector<int> Segment::gone() const {
  std::vector<pollfd> fds;
  std::vector<int> ranks;
  for (int r = 0; r < world_; ++r) {
    if (pidfds_[r] < 0) continue;
    fds.push_back({pidfds_[r], POLLIN, 0});
    ranks.push_back(r);
  }
  std::vector<int> out;
  if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) return out;
  for (std::size_t i = 0; i < fds.size(); ++i) {
    if ((fds[i].revents & (POLLIN | POLLHUP)) != 0) out.push_back(ranks[i]);
  }
  return out;
}

bool Segment::spin(const std::function<bool()>& done) const {
  for (int i = 0; i < spins_; ++i) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    if (done()) return true;
  }
  for (int i = 0; i < yields_; ++i) {
    ::sched_yield();
    if (done()) return true;
  }
  return false;
}

void Segment::sleep_once(Clock::time_point deadline, const std::function<bool()>& done) const {
  RankState& me = state(rank_);
  me.sleeping.store(1, std::memory_order_seq_cst);
  const std::uint32_t bell = me.doorbell.load(std::memory_order_seq_cst);
  if (!done()) {
    const auto left = std::max(Clock::duration::zero(),
                               std::min<Clock::duration>(kSlice, deadline - Clock::now()));
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    ::syscall(SYS_futex, &me.doorbell, FUTEX_WAIT, bell, &ts, nullptr, 0);
  }
  me.sleeping.store(0, std::memory_order_relaxed);
}

void Segment::wait(const std::function<bool()>& done, Clock::time_point deadline,
                   const std::function<std::vector<int>()>& awaited,
                   const std::function<std::string()>& what,
                   const std::function<void()>& progress) {
  if (done() || spin(done)) return;
  // Progress runs after the doorbell is read, so a ring in between is not lost.
  const auto ready = [&] {
    if (progress) progress();
    return done();
  };
  while (true) {
    sleep_once(deadline, ready);
    if (ready()) return;
    // Only the exit of a rank still awaited ends the wait; one that arrived and then
    // exited is noticed at the next round.
    const std::vector<int> waiting_for = awaited();
    for (int r : gone()) {
      if (std::find(waiting_for.begin(), waiting_for.end(), r) != waiting_for.end()) {
        fail_wait(r, what, awaited);
      }
    }
    if (Clock::now() >= deadline) fail_wait(-1, what, awaited);
  }
}

void Segment::wait_until(const std::function<bool()>& done, Clock::time_point deadline, int peer,
                         const std::function<std::string()>& what,
                         const std::function<void()>& progress) {
  const auto awaited = [&] {
    std::vector<int> ranks;
    for (int r = 0; r < world_; ++r) {
      if (r != rank_ && (peer < 0 || r == peer)) ranks.push_back(r);
    }
    return ranks;
  };
  wait(done, deadline, awaited, what, progress);
}

void Segment::arrive(std::uint32_t round, Clock::time_point deadline,
                     const std::function<std::string()>& what,
                     const std::function<void()>& progress) {
  Control& c = control(base_);
  state(rank_).arrived.store(round, std::memory_order_relaxed);
  if (c.count.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<std::uint32_t>(world_)) {
    c.count.store(0, std::memory_order_relaxed);
    c.round.store(round, std::memory_order_seq_cst);
    for (int r = 0; r < world_; ++r) {
      if (r != rank_) ring_doorbell(r);
    }
    return;
  }
  const auto missing = [&] {
    std::vector<int> out;
    for (int r = 0; r < world_; ++r) {
      if (!reached(state(r).arrived.load(std::memory_order_relaxed), round)) out.push_back(r);
    }
    return out;
  };
  wait([&] { return reached(c.round.load(std::memory_order_acquire), round); }, deadline, missing,
       what, progress);
}

void Segment::fail_wait(int peer, const std::function<std::string()>& what,
                        const std::function<std::vector<int>()>& missing) const {
  const std::vector<int> exited = gone();
  std::ostringstream message;
  if (peer >= 0 && std::find(exited.begin(), exited.end(), peer) != exited.end()) {
    message << "rank " << peer << " (pid " << state(peer).pid << ") exited while rank " << rank_
            << " waited for it in " << what();
  } else {
    std::vector<int> absent = missing();
    absent.erase(std::remove(absent.begin(), absent.end(), -1), absent.end());
    message << "rank " << rank_ << " timed out in " << what();
    if (!absent.empty()) {
      message << ": " << (absent.size() == 1 ? "rank " : "ranks ") << rank_list(absent)
              << (absent.size() == 1 ? " has" : " have") << " not arrived";
    }
  }
  C10_THROW_ERROR(DistBackendError, message.str());
}

}  // namespace sgpu::sim::shm
