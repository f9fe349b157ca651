#include "contract/node_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <mutex>

namespace sgpu::contract {

struct NodeMemory::Layout {
  static constexpr std::uint32_t kMagic = 0x53475055;  // "SGPU"
  std::atomic<std::uint32_t> magic;
  std::atomic<std::uint64_t> held[kNodeMemoryGpus];
  struct Slot {
    std::atomic<long> pid;  // 0: free; -1: being given back
    std::atomic<std::uint64_t> bytes[kNodeMemoryGpus];
  } slots[kNodeMemoryProcesses];
};

namespace {

static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic<long>::is_always_lock_free);

NodeMemory::Layout* map_ledger(int fd) {
  void* at = ::mmap(nullptr, sizeof(NodeMemory::Layout), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return at == MAP_FAILED ? nullptr : static_cast<NodeMemory::Layout*>(at);
}

NodeMemory::Layout* open_named() {
  const char* name = std::getenv(kNodeMemoryVar);
  if (name == nullptr || *name == '\0') return nullptr;
  const int fd = ::open(name, O_RDWR | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  NodeMemory::Layout* layout = nullptr;
  if (::fstat(fd, &st) == 0 && st.st_size == static_cast<off_t>(sizeof(NodeMemory::Layout))) {
    layout = map_ledger(fd);
  }
  ::close(fd);
  if (layout != nullptr && layout->magic.load() != NodeMemory::Layout::kMagic) {
    ::munmap(layout, sizeof(NodeMemory::Layout));
    return nullptr;
  }
  return layout;
}

// A new ledger, its fd left open (not close-on-exec: a process this one becomes, as `sgpu sim`
// becomes its command, keeps it) and named in this process's environment.
NodeMemory::Layout* make_named() {
  const int fd = ::memfd_create("sgpu-node-memory", 0);
  if (fd < 0) return nullptr;
  NodeMemory::Layout* layout = nullptr;
  if (::ftruncate(fd, sizeof(NodeMemory::Layout)) == 0) layout = map_ledger(fd);
  if (layout == nullptr) {
    ::close(fd);
    return nullptr;
  }
  layout->magic.store(NodeMemory::Layout::kMagic);
  const std::string name = "/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(fd);
  ::setenv(kNodeMemoryVar, name.c_str(), 1);
  return layout;
}

bool gone(long pid) { return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

std::mutex g_mutex;
NodeMemory* g_process = nullptr;

}  // namespace

NodeMemory* NodeMemory::of_process(bool make) {
  std::lock_guard lock(g_mutex);
  if (g_process != nullptr) return g_process;
  Layout* layout = open_named();
  if (layout == nullptr && make) layout = make_named();
  if (layout != nullptr) g_process = new NodeMemory(layout);  // kept to the process's end
  return g_process;
}

bool NodeMemory::make_for_process() { return make_named() != nullptr; }

int NodeMemory::own_slot() {
  const long pid = ::getpid();
  if (slot_ >= 0 && slot_pid_ == pid) return slot_;
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < kNodeMemoryProcesses; ++i) {
      long expected = 0;
      if (layout_->slots[i].pid.compare_exchange_strong(expected, pid)) {
        slot_ = i;
        slot_pid_ = pid;
        return slot_;
      }
    }
    if (!give_back_the_gone()) break;
  }
  return -1;
}

bool NodeMemory::give_back_the_gone() {
  bool any = false;
  for (Layout::Slot& slot : layout_->slots) {
    long pid = slot.pid.load();
    if (!gone(pid) || !slot.pid.compare_exchange_strong(pid, -1)) continue;
    for (int gpu = 0; gpu < kNodeMemoryGpus; ++gpu) {
      layout_->held[gpu].fetch_sub(slot.bytes[gpu].exchange(0));
    }
    slot.pid.store(0);
    any = true;
  }
  return any;
}

bool NodeMemory::take(int gpu, std::uint64_t bytes, std::uint64_t capacity) {
  if (gpu < 0 || gpu >= kNodeMemoryGpus) return true;  // beyond the ledger: not shared
  const int slot = own_slot();
  if (slot < 0) return true;  // every slot taken by a live process: this one is not shared
  for (int round = 0; round < 2; ++round) {
    std::uint64_t now = layout_->held[gpu].load();
    while (now <= capacity && bytes <= capacity - now) {
      if (layout_->held[gpu].compare_exchange_weak(now, now + bytes)) {
        layout_->slots[slot].bytes[gpu].fetch_add(bytes);
        return true;
      }
    }
    if (!give_back_the_gone()) break;
  }
  return false;
}

void NodeMemory::give(int gpu, std::uint64_t bytes) {
  if (gpu < 0 || gpu >= kNodeMemoryGpus || slot_ < 0 || slot_pid_ != ::getpid()) return;
  layout_->slots[slot_].bytes[gpu].fetch_sub(bytes);
  layout_->held[gpu].fetch_sub(bytes);
}

std::uint64_t NodeMemory::held(int gpu) {
  if (gpu < 0 || gpu >= kNodeMemoryGpus) return 0;
  give_back_the_gone();
  return layout_->held[gpu].load();
}

std::vector<std::pair<long, std::uint64_t>> NodeMemory::others(int gpu) {
  std::vector<std::pair<long, std::uint64_t>> out;
  if (gpu < 0 || gpu >= kNodeMemoryGpus) return out;
  const long self = ::getpid();
  for (const Layout::Slot& slot : layout_->slots) {
    const long pid = slot.pid.load();
    const std::uint64_t bytes = slot.bytes[gpu].load();
    if (pid > 0 && pid != self && bytes > 0 && !gone(pid)) out.emplace_back(pid, bytes);
  }
  return out;
}

}  // namespace sgpu::contract
