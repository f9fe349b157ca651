// NOTE [A node's shared device memory]
// Every process on one simulated node shares each GPU's capacity, as the processes on a GPU
// node share its memory. A process takes the segments its caching allocator reserves from the
// GPU's capacity in the node's ledger, and what is free on a GPU is what no process holds
// (torch.cuda.mem_get_info(), the out-of-memory error's figures); a process's own
// memory_allocated() and memory_reserved() stay its own.
// The ledger is a memfd made by `sgpu sim`, or by the first process on the node to serve cuda
// when none was made, and named in SGPU_NODE_MEMORY as /proc/<pid>/fd/<fd>, which every
// process it starts inherits and opens. It holds, per GPU (by its index on the node, before
// CUDA_VISIBLE_DEVICES renumbers), the bytes every process holds, and a slot per process: its
// pid and its bytes per GPU. A slot whose process is gone is given back when a process reads
// what is free or finds no room, so a process killed while holding memory does not hold it
// for ever. The ledger lives while a process has it open; a process started after its maker
// ended, with no other holder to open it through, makes its own.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace sgpu::contract {

inline constexpr const char* kNodeMemoryVar = "SGPU_NODE_MEMORY";
inline constexpr int kNodeMemoryGpus = 64;
inline constexpr int kNodeMemoryProcesses = 256;

class NodeMemory {
 public:
  // The ledger SGPU_NODE_MEMORY names, else (with `make`) a new one, then named in this
  // process's environment for what it starts; nullptr when there is none (or it cannot be
  // opened or made). One per process, kept to its end.
  static NodeMemory* of_process(bool make);

  // Makes a ledger and names it in this process's environment; false when it cannot.
  static bool make_for_process();

  // Takes `bytes` of GPU `gpu` for this process when every process's holdings and `bytes` fit
  // in `capacity`; false (nothing taken) when they do not.
  bool take(int gpu, std::uint64_t bytes, std::uint64_t capacity);
  // Gives back `bytes` of GPU `gpu` that this process took.
  void give(int gpu, std::uint64_t bytes);
  // What every live process holds of GPU `gpu`.
  std::uint64_t held(int gpu);
  // The other live processes that hold some of GPU `gpu`: (pid, bytes).
  std::vector<std::pair<long, std::uint64_t>> others(int gpu);

  struct Layout;

 private:
  explicit NodeMemory(Layout* layout) : layout_(layout) {}
  int own_slot();
  bool give_back_the_gone();

  Layout* layout_;
  int slot_ = -1;
  long slot_pid_ = 0;
};

}  // namespace sgpu::contract
