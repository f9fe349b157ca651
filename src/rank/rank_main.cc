#include "rank/rank_main.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <cxxabi.h>
#include <execinfo.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "backend/backend_table.h"
#include "collectives/recorder.h"
#include "contract/abrupt_end.h"
#include "contract/atomic_file.h"
#include "contract/process_tree.h"
#include "contract/rank_env.h"
#include "contract/run_folder.h"
#include "contract/stack_dump.h"
#include "rank/accounting.h"
#include "rank/operator_timer.h"
#include "rank/program.h"
#include "rank/rank_protocol.h"
#include "serialize/error_record.h"
#include "serialize/memory_record.h"
#include "serialize/record.h"
#include "sgpu/internal/call.h"
#include "sgpu/internal/values.h"
#include "tracking/rank_logger.h"
#include "tracking/run_logger.h"

namespace sgpu::rank {
namespace {

// The parent-death signal: its handler kills the rank's whole group, so that what the
// rank started dies with it (a plain SIGKILL would orphan grandchildren).
const int kParentDeathSignal = SIGRTMAX - 1;

void kill_own_group(int) { ::kill(0, SIGKILL); }

void watch_lifeline(int fd) {
  // Returns only when the write end, held by the caller alone, is closed.
  pollfd p{fd, POLLIN, 0};
  while (true) {
    const int rc = ::poll(&p, 1, -1);
    if (rc < 0 && errno == EINTR) continue;
    char byte;
    if (rc > 0 && ::read(fd, &byte, 1) > 0) continue;
    kill_own_group(0);
  }
}

// With the handler's own line, at least three lines of the tail are left to the rank's own.
constexpr int kCrashFrames = 16;
static_assert(kCrashFrames + 4 <= static_cast<int>(contract::kRankTailLines));

void on_crash(int signal) {
  contract::note_abrupt_end();  // NOTE [Abrupt ends]
  // Async-signal-safe: backtrace_symbols_fd writes without allocating.
  const char* name = ::sigabbrev_np(signal);
  char head[96];
  const int n = std::snprintf(head, sizeof head, "sgpu: rank crashed with SIG%s; backtrace:\n",
                              name != nullptr ? name : "?");
  [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, head, static_cast<std::size_t>(n));
  // The innermost frames only: the call's error shows the last lines of the rank's stderr
  // (contract::kRankTailLines), and what the rank wrote just before it crashed must stay in
  // them. A deep stack (a Python rank's, a test framework's) would push it out.
  void* frames[kCrashFrames];
  const int depth = ::backtrace(frames, kCrashFrames);
  ::backtrace_symbols_fd(frames, depth, STDERR_FILENO);
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

// NOTE [Tracking at a rank's end]
// A rank ends with _exit, so nothing flushes the metrics its function logged unless the
// rank does it: end_rank closes the rank's logger (tracking/rank_logger.h), and a SIGTERM
// (teardown) is caught to do the same before the rank dies of it. The handler only wakes
// a thread; the flush runs there, bounded so the rank still ends within the teardown
// grace (what is not sent by then is spooled for the launcher to send). Both ends also
// kill what the rank started and left behind (kill_orphans).
constexpr auto kFlushOnExitLimit = std::chrono::seconds(10);
constexpr auto kFlushOnTerminateLimit = std::chrono::milliseconds(2500);
int g_terminate_pipe[2] = {-1, -1};

void on_terminate(int signal) {
  const char byte = 1;
  if (g_terminate_pipe[1] < 0 || ::write(g_terminate_pipe[1], &byte, 1) != 1) {
    ::signal(signal, SIG_DFL);
    ::raise(signal);
  }
}

void kill_orphans();

void flush_on_terminate() {
  char byte;
  while (::read(g_terminate_pipe[0], &byte, 1) < 0 && errno == EINTR) {
  }
  if (tracking::rank_logger_started()) tracking::close_rank_logger(kFlushOnTerminateLimit);
  kill_orphans();  // what the rank started goes with it, a daemon in its own session too
  std::cout.flush();
  std::cerr.flush();
  ::signal(SIGTERM, SIG_DFL);
  ::raise(SIGTERM);
}

void install_terminate_flush() {
  if (::pipe2(g_terminate_pipe, O_CLOEXEC) != 0) return;
  std::thread(flush_on_terminate).detach();
  struct sigaction terminate {};
  terminate.sa_handler = on_terminate;
  ::sigaction(SIGTERM, &terminate, nullptr);
}

void install_guards() {
  const contract::RankEnvironment env = contract::read_rank_environment();
  // What the rank's children leave behind (a daemon: double-forked, or in a session of its
  // own) is the rank's child, not init's, so the rank's end takes it along (kill_orphans).
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  struct sigaction death {};
  death.sa_handler = kill_own_group;
  ::sigaction(kParentDeathSignal, &death, nullptr);
  ::prctl(PR_SET_PDEATHSIG, kParentDeathSignal);
  if (env.parent_pid != 0 && ::getppid() != env.parent_pid) kill_own_group(0);

  if (env.lifeline_fd >= 0) std::thread(watch_lifeline, env.lifeline_fd).detach();
  for (int signal : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) {
    struct sigaction crash {};
    crash.sa_handler = on_crash;
    crash.sa_flags = SA_RESETHAND | SA_NODEFER;
    ::sigaction(signal, &crash, nullptr);
  }
  // Hold the first backtrace() call's library load out of the signal handler.
  void* warm[1];
  ::backtrace(warm, 1);
  contract::arm_stack_dump(env.rank_dir);  // NOTE [Stack dumps]
}

bool g_bound = false;  // the rank bound its device

// What a rank (or a program under its supervisor) leaves at its end: its device's figures
// in rank-<N>/memory.json, its compute estimate in compute.json.
struct RankFigures {
  MemoryStats memory;
  ComputeStats compute;
};
RankFigures write_rank_figures(const contract::RankEnvironment& env,
                               const contract::RankFolder& folder) {
  RankFigures figures{backend::find_backend(env.backend).memory_stats(env.device_index),
                      rank_compute_stats()};
  if (!figures.memory.empty()) serialize::write_memory_record(folder.memory(), figures.memory);
  if (!figures.compute.ops.empty())
    serialize::write_compute_record(folder.compute(), figures.compute);
  return figures;
}

// The rank's figures written (write_rank_figures); its peaks, communication totals and
// compute estimate (rank/accounting.h) into the call's run, one point per rank: the
// step is the rank.
void record_rank_figures() {
  if (!g_bound) return;
  // An NCCL entry ends when the poller sees its Work done: the rank's last collectives,
  // synchronised just before it returned, are ended here rather than left to chance.
  collectives::settle_polled_entries(std::chrono::milliseconds(500));
  try {
    const contract::RankEnvironment env = contract::read_rank_environment();
    const contract::RankFolder folder{env.rank_dir};
    const RankFigures figures = write_rank_figures(env, folder);
    const CommStats comm = comm_stats_of(contract::read_collective_ring(folder.collective_ring()));
    std::map<std::string, double> metrics = comm_metrics(comm);
    metrics.merge(compute_metrics(figures.compute));
    for (const char* name : {"allocated_bytes", "reserved_bytes"}) {
      const auto peak = figures.memory.find(std::string(name) + ".all.peak");
      if (peak != figures.memory.end()) {
        metrics["sgpu.memory.peak_" + std::string(name)] = static_cast<double>(peak->second);
      }
    }
    if (metrics.empty()) return;
    if (tracking::RunLogger* logger = tracking::rank_logger())
      logger->log_metrics(metrics, env.rank);
  } catch (const std::exception& e) {
    std::cerr << "sgpu: rank's memory and communication figures not recorded: " << e.what()
              << std::endl;
  }
}

// A rank ends once its record is written: output flushed, then _exit, as Python's
// multiprocessing children end. Static destructors and atexit handlers do not run: in a
// rank forked from the fork server they would copy-on-write much of libtorch's memory
// (measured: 0.4 s per rank) for nothing, and both start methods must end alike.
[[noreturn]] void end_rank(int code) {
  record_rank_figures();
  tracking::close_rank_logger(kFlushOnExitLimit);
  kill_orphans();
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  ::_exit(code);
}

std::string current_exception_type() {
  std::type_info* type = abi::__cxa_current_exception_type();
  if (type == nullptr) return "unknown";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(
      abi::__cxa_demangle(type->name(), nullptr, nullptr, &status), std::free);
  return status == 0 && demangled ? demangled.get() : type->name();
}

[[noreturn]] void fail(std::string type, std::string message) {
  const std::string said = type + ": " + message;
  try {
    write_error({std::move(type), std::move(message), {}, std::nullopt});
  } catch (...) {
  }
  std::cerr << "sgpu: rank " << contract::read_rank_environment().rank << " failed: " << said
            << std::endl;
  end_rank(1);
}

// What a rank (or the program under a supervisor) started and left behind: a child
// subreaper's, so its own children, wherever their session: killed and reaped at its end.
void kill_orphans() {
  for (int round = 0; round < 10; ++round) {
    contract::kill_descendants(::getpid());
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    if (contract::children_of_this_process().empty()) return;
    ::usleep(10'000);
  }
}

}  // namespace

// NOTE [A program's supervisor]
// A program's rank (sgpu run) is this binary as a small supervisor with the program as its
// only child, so that the promise of a function's rank holds for any program: when the
// caller goes (parent-death signal, lifeline), the rank's whole process group dies, and
// the supervisor is a child subreaper, so what the program started and left behind is its
// to kill when the program ends. The supervisor ignores SIGTERM (teardown signals the
// group, so the program gets it) and ends as the program did: its exit code, or killed by
// the same signal. Start and timed faults of the fault plan act on the program from here.
// A program run in shape-only compute must say it ran so (enter_program_shapes), or its
// rank fails with a ConfigError though it exited 0.
void run_program(char** argv) {
  const contract::RankEnvironment env = contract::read_rank_environment();
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  install_guards();  // the parent check, parent-death signal, lifeline, crash reports
  ::fcntl(contract::kRankLifelineFd, F_SETFD, FD_CLOEXEC);
  for (const char* var :
       {contract::kRoleVar, contract::kCallFileVar, contract::kParentVar, contract::kLifelineVar})
    ::unsetenv(var);
  try {  // the start faults act here, before the program starts; timed ones are armed
    backend::find_backend(env.backend).bind_program();
  } catch (const std::exception& e) {
    fail(current_exception_type(), e.what());
  }
  ::setenv(contract::kSupervisorVar, std::to_string(::getpid()).c_str(), 1);
  const pid_t program = ::fork();
  if (program < 0) {
    std::fprintf(stderr, "sgpu: cannot start %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  if (program == 0) {
    for (int signal = 1; signal < NSIG; ++signal) ::signal(signal, SIG_DFL);
    ::execvp(argv[0], argv);
    std::fprintf(stderr, "sgpu: cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::signal(SIGTERM, SIG_IGN);
  int status = 0;
  while (true) {
    int got_status = 0;
    const pid_t got = ::waitpid(-1, &got_status, 0);
    if (got == program) {
      status = got_status;
      break;
    }
    if (got < 0 && errno != EINTR) break;  // cannot happen while the program runs
  }
  kill_orphans();
  if (WIFSIGNALED(status)) {
    ::signal(WTERMSIG(status), SIG_DFL);
    ::raise(WTERMSIG(status));
  }
  const contract::RankFolder folder{env.rank_dir};
  std::error_code absent;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
      contract::env_string(contract::kSimComputeVar) == "shapes" &&
      !std::filesystem::exists(folder.computes_shapes(), absent)) {
    // Spelled neutrally: the supervisor does not know which front end the caller used.
    fail("ConfigError",
         std::string(argv[0]) +
             " ended without running in shape-only compute, which the call asked for, so it "
             "computed values: only a Python program that imports torch runs in shapes (a C++ "
             "program, or one that never imports torch, cannot); run it computing values");
  }
  ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

void enter_program_shapes() {
  const contract::RankFolder folder{contract::read_rank_environment().rank_dir};
  contract::write_file_atomically(folder.computes_shapes(), "");
}

void record_program_figures() {
  try {
    const contract::RankEnvironment env = contract::read_rank_environment();
    write_rank_figures(env, contract::RankFolder{env.rank_dir});
  } catch (const std::exception& e) {
    std::cerr << "sgpu: the program's memory and compute figures not recorded: " << e.what()
              << std::endl;
  }
}

void arm_program_stacks() {
  void* warm[1];
  ::backtrace(warm, 1);  // the unwinder loaded now, not first in a signal handler
  contract::arm_stack_dump(contract::read_rank_environment().rank_dir);
}

void enter_worker_rank() {
  install_guards();
  install_terminate_flush();
  contract::arm_abrupt_end(
      contract::RankFolder{contract::read_rank_environment().rank_dir}.abrupt_end());
}

void end_worker_rank(int code) { end_rank(code); }

void bind_rank_device() {
  const contract::RankEnvironment env = contract::read_rank_environment();
  backend::find_backend(env.backend).bind(env.device_index);
  g_bound = true;
}

void run_rank() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  install_guards();
  install_terminate_flush();
  const contract::RankEnvironment env = contract::read_rank_environment();
  contract::arm_abrupt_end(contract::RankFolder{env.rank_dir}.abrupt_end());
  try {
    const auto record =
        serialize::from_bytes<serialize::CallRecord>(read_call(serialize::RecordKind::kCall));
    auto entry = reinterpret_cast<detail::EntryFn>(resolve_code(record.entry));
    void* function = resolve_code(record.function);
    // libtorch reads OMP_NUM_THREADS when it loads: a rank forked from the fork server
    // would keep the server's thread count (one per core) without this.
    if (const long threads = contract::env_int("OMP_NUM_THREADS", 0); threads > 0) {
      at::set_num_threads(static_cast<int>(threads));
    }
    bind_rank_device();
    // A simulated GPU's work, timed as on the node's (a GPU's own is what it is).
    if (env.backend == contract::kSimBackend) time_operators();
    // A function's ranks are a C++ caller's (start_call).
    write_result(entry(function, record.signature, record.args), record.max_payload_bytes,
                 FrontEnd::kCpp);
  } catch (const serialize::RecordTooLarge& e) {
    fail("sgpu::ResultTooLarge", std::string("result ") + e.what());
  } catch (const c10::Error& e) {  // its message, not libtorch's C++ backtrace
    fail(current_exception_type(), e.what_without_backtrace());
  } catch (const std::exception& e) {
    fail(current_exception_type(), e.what());
  } catch (...) {
    fail(current_exception_type(), "(not derived from std::exception)");
  }
  end_rank(0);
}

}  // namespace sgpu::rank
