// sgpu._native: the C++ core as the Python package sees it (python/sgpu/).
//
// The caller's side starts a worker call (launcher::start_worker_call): every rank runs
// `python -m sgpu._worker`, which reads the pickled function from the staged call and
// writes its result or exception record through the rank-side functions below. Errors
// the C++ core raises reach Python as sgpu.errors' classes, built by
// sgpu.errors._from_native. Built with torch's own pybind11, so that c10d objects (the
// store torch hands a backend's creator, the process group returned to it) cross
// between this module and torch's.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "backend/backend_table.h"
#include "backend/gpu_type.h"
#include "backend/served_cuda.h"
#include "contract/front_end.h"
#include "contract/host_memory.h"
#include "contract/node_memory.h"
#include "contract/option_table.h"
#include "contract/rank_env.h"
#include "contract/run_folder.h"
#include "contract/stack_dump.h"
#include "launcher/call_plan.h"
#include "launcher/fork_server.h"
#include "launcher/launcher.h"
#include "model/kernels.h"
#include "nodes/nodes.h"
#include "rank/accounting.h"
#include "rank/rank_group.h"
#include "rank/rank_main.h"
#include "rank/rank_protocol.h"
#include "rendezvous/peer_names.h"
#include "serialize/error_record.h"
#include "serialize/record.h"
#include "sgpu/comm.h"
#include "sgpu/errors.h"
#include "sgpu/memory.h"
#include "sgpu/options.h"
#include "sgpu/tracking.h"

namespace py = pybind11;

namespace sgpu::python {
namespace {

// A keyword's value as its row of the option table takes it (NOTE [The option table]).
contract::OptionValue option_value(const contract::OptionRow& row, const py::handle& value) {
  if (value.is_none()) return std::monostate{};
  switch (row.type) {
    case contract::OptionType::kInt:
      return py::cast<long long>(value);
    case contract::OptionType::kString:
      return py::cast<std::string>(value);
    case contract::OptionType::kBool:
      return py::cast<bool>(value);
    case contract::OptionType::kSeconds:
    case contract::OptionType::kTimeout:
    case contract::OptionType::kFraction:
      return py::cast<double>(value);
    case contract::OptionType::kRanks:
      return py::cast<std::vector<int>>(value);
  }
  return std::monostate{};
}

// Options whose errors name settings as Python writes them: the decorator's keywords (NOTE
// [Front ends]).
Options python_options() {
  Options options;
  options.front_end = FrontEnd::kPython;
  return options;
}

// The decorator's keywords (already type-checked by sgpu._decorator against the same
// table) as sgpu::Options. ConfigError for NaN seconds and a start method there is none of.
Options options_from(const py::dict& given) {
  Options options = python_options();
  for (const auto& [key, value] : given) {
    const std::string name = py::cast<std::string>(key);
    const contract::OptionRow* row = contract::find_option(name);
    if (row == nullptr) throw ConfigError("unknown option " + name);
    row->set(options, option_value(*row, value));
  }
  return options;
}

// The option table as the decorator checks its keywords: (name, type, what it must be).
py::list option_table() {
  static const char* const kTypes[] = {"int", "str", "bool", "seconds", "timeout", "ranks"};
  static_assert(std::size(kTypes) == static_cast<std::size_t>(contract::OptionType::kRanks) + 1);
  py::list rows;
  for (const contract::OptionRow& row : contract::option_table()) {
    rows.append(py::make_tuple(std::string(row.name), kTypes[static_cast<int>(row.type)],
                               std::string(row.must_be)));
  }
  return rows;
}

// "exit_code" for RankFailure::Kind::kExitCode: to_string's words, joined as Python's.
std::string kind_name(RankFailure::Kind kind) {
  std::string name = to_string(kind);
  std::replace(name.begin(), name.end(), ' ', '_');
  return name;
}

py::dict row_of(const RankFailure& row) {
  py::dict d;
  d["rank"] = row.rank;
  d["local_rank"] = row.local_rank;
  d["pid"] = static_cast<long>(row.pid);
  d["kind"] = kind_name(row.kind);
  d["exit_code"] = row.exit_code ? py::object(py::int_(*row.exit_code)) : py::object(py::none());
  d["signal"] = row.signal ? py::object(py::int_(*row.signal)) : py::object(py::none());
  d["exception_type"] = row.exception_type;
  d["message"] = row.message;
  d["stderr_tail"] = row.stderr_tail;
  d["time"] = std::chrono::duration<double>(row.time.time_since_epoch()).count();
  d["root_cause"] = row.root_cause;
  d["description"] = row.describe();
  return d;
}

// Raises sgpu.errors' class for the C++ error being handled.
void raise_as_python(const char* kind, const std::string& message, py::list rows = py::list(),
                     const std::string& run_dir = {}, py::object collectives = py::none()) {
  py::object errors = py::module_::import("sgpu.errors");
  py::object error = errors.attr("_from_native")(kind, message, rows, run_dir, collectives);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
}

void translate(std::exception_ptr pending) {
  try {
    std::rethrow_exception(pending);
  } catch (const DistributedError& e) {
    py::list rows;
    for (const RankFailure& row : e.ranks()) rows.append(row_of(row));
    const char* kind = dynamic_cast<const TimeoutError*>(&e) != nullptr     ? "timeout"
                       : dynamic_cast<const HangError*>(&e) != nullptr      ? "hang"
                       : dynamic_cast<const CancelledError*>(&e) != nullptr ? "cancelled"
                                                                            : "distributed";
    py::dict collectives;
    collectives["verdict"] = e.collectives().verdict;
    collectives["culprits"] = e.collectives().culprits;
    collectives["table"] = e.collectives().table;
    collectives["culprit_stack"] = e.collectives().culprit_stack;
    collectives["stacks"] = e.collectives().stacks.string();
    raise_as_python(kind, e.what(), rows, e.run_dir().string(), collectives);
  } catch (const ConfigError& e) {
    raise_as_python("config", e.what());
  } catch (const AcceleratorMismatchError& e) {
    raise_as_python("mismatch", e.what());
  } catch (const TrackingError& e) {
    raise_as_python("tracking", e.what());
  } catch (const serialize::RecordTooLarge& e) {
    raise_as_python("too_large", e.what());
  } catch (const serialize::RecordError& e) {
    raise_as_python("record", e.what());
  } catch (const Error& e) {
    raise_as_python("error", e.what());
  }
}

bool is_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// A rank's result record, held for Python without a copy: a buffer pickle.loads reads.
struct ResultBytes {
  explicit ResultBytes(std::string data) : bytes(std::move(data)) {}
  std::string bytes;
};

// A rank's compute estimate (sgpu/compute.h): {"platform", "count", "flops", "bytes",
// "predicted_seconds", "exposed_collective_seconds", "unvalidated_seconds", "ops": {op:
// {"count", "flops", "bytes", "predicted_seconds"}}, "steps": [{"end", "compute_end",
// "tokens", "model_flops"}]}.
py::dict compute_dict(const sgpu::ComputeStats& stats) {
  auto totals = [](const sgpu::ComputeTotals& t, py::dict d) {
    d["count"] = t.count;
    d["flops"] = t.flops;
    d["bytes"] = t.bytes;
    d["predicted_seconds"] = t.predicted_seconds;
    return d;
  };
  py::dict ops;
  for (const auto& [op, t] : stats.ops) ops[py::str(op)] = totals(t, py::dict());
  py::dict out = totals(stats.total(), py::dict());
  out["platform"] = stats.platform;
  out["exposed_collective_seconds"] = stats.exposed_collective_seconds;
  out["unvalidated_seconds"] = stats.unvalidated_seconds;
  out["ops"] = ops;
  py::list steps;
  for (const sgpu::StepMark& step : stats.steps) {
    py::dict mark;
    mark["end"] = step.end;
    mark["compute_end"] = step.compute_end;
    mark["tokens"] = step.tokens;
    mark["model_flops"] = step.model_flops;
    steps.append(mark);
  }
  out["steps"] = steps;
  return out;
}

// A call in flight, as sgpu.Handle holds it.
class PyCall {
 public:
  explicit PyCall(std::shared_ptr<detail::Call> call) : call_(std::move(call)) {}

  // True when the call ended within `seconds`; the GIL is free meanwhile.
  bool wait_for(double seconds) {
    py::gil_scoped_release release;
    return call_->wait_for(duration_of_seconds(std::max(seconds, 0.0)));
  }
  // Each rank's result record, in rank order, as buffers that hold them (no copy); raises
  // the call's error. The call keeps none of them: a record goes when its buffer does.
  std::vector<std::shared_ptr<ResultBytes>> results() {
    std::vector<std::string> taken;
    {
      py::gil_scoped_release release;
      taken = call_->take_results();
    }
    std::vector<std::shared_ptr<ResultBytes>> out;
    out.reserve(taken.size());
    for (std::string& result : taken)
      out.push_back(std::make_shared<ResultBytes>(std::move(result)));
    return out;
  }
  // Each rank's device memory figures at its end; waits for the call without raising.
  std::vector<sgpu::MemoryStats> memory_stats() {
    py::gil_scoped_release release;
    return call_->memory_stats();
  }
  // Each rank's collectives: {group: {op: {"count", "bytes", "seconds", "predicted_seconds",
  // "platform"}}}; waits as above.
  py::list comm_stats() {
    const std::vector<sgpu::CommStats>* ranks = nullptr;
    {
      py::gil_scoped_release release;
      ranks = &call_->comm_stats();
    }
    py::list out;
    for (const sgpu::CommStats& rank : *ranks) {
      py::dict groups;
      for (const auto& [group, ops] : rank.groups) {
        py::dict by_op;
        for (const auto& [op, t] : ops) {
          py::dict totals;
          totals["count"] = t.count;
          totals["bytes"] = t.bytes;
          totals["seconds"] = t.seconds;
          totals["predicted_seconds"] = t.predicted_seconds;
          totals["platform"] = rank.platform;
          by_op[py::str(op)] = totals;
        }
        groups[py::str(group)] = by_op;
      }
      out.append(groups);
    }
    return out;
  }
  // Each rank's compute estimate (compute_dict); waits as above.
  py::list compute_stats() {
    const std::vector<sgpu::ComputeStats>* ranks = nullptr;
    {
      py::gil_scoped_release release;
      ranks = &call_->compute_stats();
    }
    py::list out;
    for (const sgpu::ComputeStats& rank : *ranks) out.append(compute_dict(rank));
    return out;
  }
  void cancel() { call_->cancel(); }
  std::string run_dir() const { return call_->run_dir().string(); }
  std::string gpu_type() const { return call_->gpu_type(); }
  std::string tracking_link() const { return call_->tracking_link(); }
  void results_taken() { call_->results_taken(); }
  void raise_bad_result(int rank, const std::string& why) { call_->raise_bad_result(rank, why); }

  // The monitor thread may need the GIL for the console sink: its end is never waited
  // for with the GIL held.
  ~PyCall() {
    if (PyGILState_Check()) {
      py::gil_scoped_release release;
      call_.reset();
    }
  }

 private:
  std::shared_ptr<detail::Call> call_;
};

std::shared_ptr<PyCall> start(const py::dict& options, std::vector<std::string> command,
                              const py::bytes& payload, std::string function_name,
                              std::optional<py::function> console, std::string parent_run_id,
                              std::vector<std::string> fork_server, std::string source_name,
                              std::vector<std::string> server_imports) {
  launcher::WorkerCall call;
  call.command = std::move(command);
  call.payload = payload;
  call.function_name = std::move(function_name);
  // KeyboardInterrupt reaches sgpu.Handle, which cancels; SIGTERM tears the ranks down and
  // ends the run before the interpreter ends as it would have.
  call.caught_signals = launcher::CaughtSignals::kTerminateOnly;
  call.parent_run_id = std::move(parent_run_id);
  call.source_name = std::move(source_name);
  call.server_imports = std::move(server_imports);
  if (!fork_server.empty()) {  // the program's path, then its whole argv
    call.fork_server.push_back(fork_server.front());
    call.fork_server.insert(call.fork_server.end(), fork_server.begin(), fork_server.end());
  }
  if (console) {
    // Shared so that the sink, copied into the monitor thread, drops its reference to the
    // Python callable only while holding the GIL.
    auto target =
        std::shared_ptr<py::function>(new py::function(std::move(*console)), [](py::function* f) {
          py::gil_scoped_acquire gil;
          delete f;
        });
    call.console = [target](int stream, std::string_view line) {
      if (is_finalizing()) return;
      py::gil_scoped_acquire gil;
      try {
        // A rank's output is bytes: what is not UTF-8 shows as U+FFFD, as Python's own
        // streams' "replace" shows it, where a strict decode would lose the whole line.
        PyObject* text =
            PyUnicode_DecodeUTF8(line.data(), static_cast<Py_ssize_t>(line.size()), "replace");
        if (text == nullptr) throw py::error_already_set();
        (*target)(stream, py::reinterpret_steal<py::str>(text));
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("sgpu: writing a rank's output");
      }
    };
  }
  const Options parsed = options_from(options);
  std::shared_ptr<detail::Call> started;
  {
    py::gil_scoped_release release;
    started = launcher::start_worker_call(parsed, std::move(call));
  }
  return std::make_shared<PyCall>(std::move(started));
}

// The simulated nodes a distributed function's call with the decorator's `given` options
// spans on this machine, and each one's GPUs, when there are several (NOTE [Every node on
// one machine]): `nnodes` given, with `gpus` each node's as in sgpu::Options; or, with
// neither `nnodes`, an engine nor CUDA_VISIBLE_DEVICES, `gpus` over the simulated node's
// GPUs, in whole nodes of that size. std::nullopt: the call is one node, or its nodes are
// elsewhere.
std::optional<std::pair<int, int>> nodes_here(const py::dict& given) {
  const Options options = contract::with_environment(options_from(given));
  if (!nodes::nodes_may_be_here(options)) return std::nullopt;
  if (options.nnodes > 1) return std::make_pair(options.nnodes, options.gpus);
  // A node whose GPUs CUDA_VISIBLE_DEVICES narrows is this one: more GPUs than it leaves
  // are a mismatch, as on a GPU node.
  if (options.nnodes == 1 || std::getenv("CUDA_VISIBLE_DEVICES") != nullptr) return std::nullopt;
  const backend::Inventory node = backend::find_backend(options.backend).inventory(options);
  const int each = static_cast<int>(node.gpus.size());
  if (each == 0 || options.gpus <= each) return std::nullopt;
  if (options.gpus % each != 0) {
    const contract::Spelling spell(options.front_end);
    throw AcceleratorMismatchError(
        std::to_string(options.gpus) + " GPUs requested on simulated nodes of " + node.summary() +
        ", which that many do not fill: pass " + spell("gpus", std::to_string(each)) +
        " or fewer for one node, a multiple of " + std::to_string(each) + " for whole nodes, or " +
        spell("nnodes") + " with the GPUs each node runs as " + spell("gpus"));
  }
  return std::make_pair(options.gpus / each, each);
}

// The Python fork server (python -m sgpu._fork_server): serves until its caller is gone;
// returns only in each forked rank, with the rank's environment.
std::vector<std::string> serve_forks() {
  launcher::ForkHooks hooks;
  hooks.before_fork = [] { PyOS_BeforeFork(); };
  hooks.after_fork_parent = [] { PyOS_AfterFork_Parent(); };
  hooks.after_fork_child = [] { PyOS_AfterFork_Child(); };
  hooks.prepare = [](const std::vector<std::string>& modules) {
    py::module_::import("sgpu._fork_server").attr("prepare")(modules);
  };
  hooks.threads_hint = "a module the server imported started them";
  hooks.exec_hint = "Pass start_method=\"exec\", or set SGPU_START_METHOD=exec";
  return launcher::serve_forks(hooks);
}

// The rank's side.

py::bytes read_call() { return py::bytes(rank::read_call(serialize::RecordKind::kWorkerCall)); }

void bind_device() { rank::bind_rank_device(); }

void write_result(const py::bytes& result, std::size_t limit) {
  rank::write_result(std::string_view(result), limit, FrontEnd::kPython);
}

void write_error(std::string type, std::string message, std::vector<std::string> traceback,
                 std::optional<py::bytes> exception) {
  rank::write_error({std::move(type), std::move(message), std::move(traceback),
                     exception ? std::optional<std::string>(*exception) : std::nullopt});
}

py::object read_exception(const std::string& rank_dir, std::size_t limit) {
  const contract::RankFolder folder{rank_dir};
  std::error_code ec;
  if (!std::filesystem::exists(folder.exception(), ec)) return py::none();
  return py::bytes(
      serialize::read_record_file(folder.exception(), serialize::RecordKind::kException, limit));
}

py::object read_error(const std::string& rank_dir) {
  const auto record = serialize::read_error_record(contract::RankFolder{rank_dir}.error());
  if (!record) return py::none();
  py::dict d;
  d["type"] = record->type;
  d["message"] = record->message;
  d["rank"] = record->rank;
  d["traceback"] = record->backtrace;
  return d;
}

// Set by sgpu/_sim_cuda.py (join_node) in a process on a simulated node that sgpu did not
// start: it started with SGPU_BACKEND=sim, or called sgpu.simulate().
bool g_on_node = false;

// The backend this process's cuda devices are served by: its rank's, or "sim" for a process
// on a simulated node.
std::string process_backend() {
  std::string backend = contract::read_rank_environment().backend;
  if (backend.empty() && g_on_node) backend = contract::kSimBackend;
  return backend;
}

// One operator of a shape-only rank (sgpu/_shapes.py) into its compute estimate: `kind`
// "matmul" (with its batch and its m x n output of inner size k), "attention" or "other"
// (NOTE [The kernel model]).
void count_compute(const std::string& op, const std::string& dtype, double flops, double bytes,
                   const std::string& kind, double batch, double m, double n, double k) {
  const std::optional<sgpu::model::KernelKind> parsed = sgpu::model::parse_kernel_kind(kind);
  if (!parsed) throw py::value_error("not a kind of kernel: " + kind);
  sgpu::rank::count_compute(op, dtype, flops, bytes, {*parsed, batch, m, n, k});
}

// torch.distributed's creator for the "sgpu" backend: the process group the backend of
// the call makes for C++ ranks too (Gloo with the fault plan on sim, NCCL on cuda), over
// the store torch rendezvoused with.
// `global_ranks`: the group's members by group rank; empty for the default group.
// `as_nccl`: the group is torch's "nccl" one, which the simulated backend serves.
c10::intrusive_ptr<c10d::Backend> make_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                     int rank, int size, double timeout_seconds,
                                                     const std::vector<int>& global_ranks,
                                                     bool as_nccl) {
  const std::string backend = process_backend();
  if (backend.empty()) {
    // A RuntimeError, as torch's own backends raise. Outside a launch and off a simulated
    // node there is no backend to make the group with.
    throw std::runtime_error(
        "the \"sgpu\" process-group backend is for ranks that sgpu started and processes on a "
        "simulated node (neither SGPU_RANK_BACKEND nor SGPU_BACKEND=sim in this process's "
        "environment); outside one, use \"gloo\" or \"nccl\", or run under `sgpu sim`");
  }
  rank::RankGroupRequest request;
  request.store = store;
  request.rank = rank;
  request.size = size;
  request.timeout = duration_of_seconds(timeout_seconds);
  request.members = global_ranks;
  request.as_nccl = as_nccl;
  request.backend = backend;
  py::gil_scoped_release release;
  return rank::make_rank_group(std::move(request));
}

// CUDA on sim (NOTE [CUDA on sim] in sim/cuda/sim_cuda.h): what sgpu._sim_cuda asks of the
// rank's backend, of torch's device guard for CUDA (which serve_cuda() installed on sim),
// and of sim's memory for the served devices.

const backend::Backend& rank_backend() { return backend::find_backend(process_backend()); }

// The torch device of this process's rank, as its backend says it (Backend::device):
// "cuda:N" on real GPUs and where sim serves them, "cpu" elsewhere.
std::string rank_device() {
  return rank_backend().device(contract::read_rank_environment().device_index);
}

// Serves the node's GPUs as torch's cuda devices where the backend does (sim); False where it
// does not (cuda, or SGPU_SIM_CUDA=off). A function's rank starts on the GPU its launcher
// bound it to, as the cuda backend binds it; every other process on the node (a program
// `sgpu run` started, what it starts, a process under `sgpu sim`) starts on cuda:0, as a
// process on a GPU node does until it calls set_device.
bool serve_cuda() {
  const contract::RankEnvironment env = contract::read_rank_environment();
  const std::string backend = process_backend();
  if (backend.empty()) return false;
  return backend::find_backend(backend).serve_cuda(
      env.role == contract::kWorkerRole ? env.device_index : 0);
}

// Every GPU of the rank's node, as torch.cuda.get_device_properties() describes it.
py::list cuda_devices() {
  py::list out;
  for (const Gpu& gpu :
       rank_backend().inventory(contract::with_environment(python_options())).gpus) {
    const backend::GpuModel* model = backend::find_gpu_model(gpu.type);
    py::dict d;
    d["index"] = gpu.index;
    d["type"] = gpu.type;
    d["name"] = model != nullptr ? std::string(model->device_name) : gpu.name;
    d["total_memory"] = gpu.memory_bytes;
    d["major"] = gpu.capability_major;
    d["minor"] = gpu.capability_minor;
    d["multi_processor_count"] = gpu.multi_processor_count;
    d["l2_cache_size"] = model != nullptr ? model->l2_cache_bytes : 0;
    out.append(d);
  }
  return out;
}

const c10::impl::DeviceGuardImplInterface& cuda_guard() {
  return *c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
}

c10::Device cuda_device(int index) {
  return {c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index)};
}

// A stream as torch._C._cuda_getCurrentStream() gives it: (id, device index, device type).
py::tuple stream_tuple(const c10::Stream& stream) {
  return py::make_tuple(stream.id(), static_cast<int>(stream.device_index()),
                        static_cast<int>(stream.device_type()));
}

int resolve_device(int index) { return index < 0 ? cuda_guard().getDevice().index() : index; }

py::tuple cuda_generators(int count) {
  py::tuple out(count);
  for (int i = 0; i < count; ++i) {
    out[i] = py::reinterpret_steal<py::object>(
        THPGenerator_Wrap(at::globalContext().defaultGenerator(cuda_device(i))));
  }
  return out;
}

// Sim's refusals (backend::ServedCuda::set_refusal) as Python sees them:
// sgpu.errors.NotSimulatedError, a NotImplementedError, where torch would turn a C++ exception into
// a plain one. torch's bindings restore the Python error a python_error carries, the autograd
// engine's threads included.
[[noreturn]] void refuse_in_python(const std::string& message) {
  py::gil_scoped_acquire gil;
  const py::object error = py::module_::import("sgpu.errors").attr("NotSimulatedError");
  PyErr_SetString(error.ptr(), message.c_str());
  python_error raised;
  raised.persist();
  throw raised;
}

// The backend that serves torch's cuda devices (backend/served_cuda.h): the rank's, a process
// on the node's; else the first of the table that serves any. Found once: a process that
// serves cuda keeps its backend, and a fake storage asks for each tensor.
const backend::ServedCuda& served_cuda() {
  static std::atomic<const backend::ServedCuda*> found{nullptr};
  if (const backend::ServedCuda* known = found.load()) return *known;
  const backend::ServedCuda* served = nullptr;
  if (const std::string backend = process_backend(); !backend.empty()) {
    served = backend::find_backend(backend).served_cuda();
  }
  for (const backend::BackendEntry& entry : backend::backend_table()) {
    if (served != nullptr) break;
    served = backend::find_backend(entry.name).served_cuda();
  }
  if (served == nullptr) throw ConfigError("this sgpu has no backend that serves cuda devices");
  found.store(served);
  return *served;
}

void bind_cuda_on_sim(py::module_& m) {
  for (const backend::BackendEntry& entry : backend::backend_table()) {
    if (const auto* served = backend::find_backend(entry.name).served_cuda()) {
      served->set_refusal(&refuse_in_python);
    }
  }
  m.def("serve_cuda", &serve_cuda);
  // The node's memory ledger serve_cuda() opened or made (NOTE [A node's shared device
  // memory]), for os.environ, which the C environment's changes do not reach.
  m.def("node_memory_name", []() -> std::optional<std::string> {
    const char* name = std::getenv(contract::kNodeMemoryVar);
    return name != nullptr ? std::optional<std::string>(name) : std::nullopt;
  });
  m.def("join_node", [] { g_on_node = true; });
  m.def("count_in_forked_child", [] { served_cuda().count_in_forked_child(); });
  m.def("check_node_spec", [](const std::string& spec) { served_cuda().check_node(spec); });
  m.def("node_spec", [] { return served_cuda().node(); });
  m.def("cover_cuda_operators_ahead", [] { served_cuda().cover_operators_ahead(); });
  m.def("cuda_devices", &cuda_devices);
  m.def("cuda_current_device", [] { return static_cast<int>(cuda_guard().getDevice().index()); });
  m.def("cuda_set_device", [](int index) { cuda_guard().setDevice(cuda_device(index)); });
  m.def("cuda_exchange_device", [](int index) {
    if (index < 0) return -1;
    return static_cast<int>(cuda_guard().exchangeDevice(cuda_device(index)).index());
  });
  m.def("cuda_current_stream", [](int index) {
    return stream_tuple(cuda_guard().getStream(cuda_device(resolve_device(index))));
  });
  m.def("cuda_default_stream", [](int index) {
    return stream_tuple(cuda_guard().getDefaultStream(cuda_device(resolve_device(index))));
  });
  m.def("cuda_set_stream", [](std::int64_t id, int index, int type) {
    cuda_guard().exchangeStream(c10::Stream::unpack3(id, static_cast<c10::DeviceIndex>(index),
                                                     static_cast<c10::DeviceType>(type)));
  });
  m.def("cuda_generators", &cuda_generators);
  m.def("cuda_memory_stats",
        [](int index) { return rank_backend().memory_stats(resolve_device(index)); });
  m.def("cuda_reset_peak_memory_stats",
        [](int index) { rank_backend().reset_peak_memory_stats(resolve_device(index)); });
  m.def("cuda_reset_accumulated_memory_stats",
        [](int index) { served_cuda().reset_accumulated_memory_stats(resolve_device(index)); });
  m.def("cuda_empty_cache", [](int index) { served_cuda().empty_cache(resolve_device(index)); });
  // What the device may still reserve, every process on the node counted (None when its
  // memory is not counted).
  m.def("cuda_free_memory", [](int index) -> std::optional<std::uint64_t> {
    return served_cuda().free_memory(resolve_device(index));
  });
  // Shape-only compute (sgpu/_shapes.py): a fake tensor's storage of `bytes` on served
  // device `index`, counted by the device's memory model until the returned object goes.
  m.def("count_fake_storage", [](int index, std::size_t bytes) {
    auto* held = new c10::DataPtr(served_cuda().count_without_data(resolve_device(index), bytes));
    return py::capsule(held, [](void* data) { delete static_cast<c10::DataPtr*>(data); });
  });
  m.def("cuda_set_memory_fraction", [](double fraction, int index) {
    served_cuda().set_memory_fraction(resolve_device(index), fraction);
  });
  m.def("cuda_storage_device", [](py::handle storage) {
    return served_cuda().device_of(THPStorage_Unpack(storage.ptr()));
  });
}

// The caller's side: a call started, waited on, its results and its ranks' records read.
void bind_caller_side(py::module_& m) {
  py::class_<ResultBytes, std::shared_ptr<ResultBytes>>(m, "ResultBytes", py::buffer_protocol())
      .def_buffer([](ResultBytes& r) {
        return py::buffer_info(r.bytes.data(), 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {r.bytes.size()}, {1}, /*readonly=*/true);
      });
  py::class_<PyCall, std::shared_ptr<PyCall>>(m, "Call")
      .def("wait_for", &PyCall::wait_for, py::arg("seconds"))
      .def("results", &PyCall::results)
      .def("cancel", &PyCall::cancel)
      .def("memory_stats", &PyCall::memory_stats)
      .def("comm_stats", &PyCall::comm_stats)
      .def("compute_stats", &PyCall::compute_stats)
      .def("results_taken", &PyCall::results_taken)
      .def("raise_bad_result", &PyCall::raise_bad_result)
      .def_property_readonly("run_dir", &PyCall::run_dir)
      .def_property_readonly("gpu_type", &PyCall::gpu_type)
      .def_property_readonly("tracking_link", &PyCall::tracking_link);
  m.def("start", &start, py::arg("options"), py::arg("command"), py::arg("payload"),
        py::arg("function_name"), py::arg("console") = py::none(),
        py::arg("parent_run_id") = std::string(),
        py::arg("fork_server") = std::vector<std::string>(), py::arg("source_name") = std::string(),
        py::arg("server_imports") = std::vector<std::string>());
  m.def("option_table", &option_table);
  // A true-or-false option's variable as its row reads it (contract::environment_flag):
  // `unset` where unset; ConfigError naming the variable for a word that is neither on nor off.
  m.def("environment_flag", [](const std::string& name, bool unset) {
    if (contract::find_option(name) == nullptr) throw ConfigError("unknown option " + name);
    return contract::environment_flag(name, unset, FrontEnd::kPython);
  });
  // A text setting's variable (NOTE [Settings]): "" where unset.
  m.def("setting_text", [](const std::string& env) { return contract::setting_text(env); });
  // A rank folder's stack files (NOTE [Stack dumps]): its stacks/ folder, the Python
  // tracebacks' file in it, and the file a program's pid is announced in.
  m.def("stack_files", [](const std::string& rank_dir) {
    return py::make_tuple(contract::stacks_dir(rank_dir).string(),
                          contract::python_stacks_file(rank_dir).string(),
                          contract::program_pid_file(rank_dir).string());
  });
  m.def("nodes_here", &nodes_here);
  // Whether the call folds its simulated nodes into one launch (NOTE [A folded world]):
  // sim_fold, the environment's override applied.
  m.def("sim_fold", [](const py::dict& given) {
    return contract::with_environment(options_from(given)).sim.fold;
  });
  m.def("backend_of", [](const py::dict& given) {  // as the environment's overrides leave it
    return contract::with_environment(options_from(given)).backend;
  });
  m.attr("DEFAULT_MAX_PAYLOAD_BYTES") = Options{}.max_payload_bytes;
  m.def("check_options",
        [](const py::dict& given) { launcher::check_option_values(options_from(given)); });
  m.def("serve_forks", &serve_forks);
  m.def("fork_server_pid", [](const std::vector<std::string>& command) {
    return static_cast<long>(sgpu::launcher::fork_server_pid(command));
  });
  m.def("read_exception", &read_exception, py::arg("rank_dir"), py::arg("limit"));
  m.def("read_error", &read_error, py::arg("rank_dir"));
}

// A rank's side: entering and ending the rank, its call, result and error, its device and
// memory, its process group.
void bind_rank_side(py::module_& m) {
  m.def("enter_rank", [] { sgpu::rank::enter_worker_rank(); });
  m.def("rank_device", &rank_device);
  m.def("python_stack_signal", &sgpu::contract::python_stack_signal);
  m.def("arm_program_stacks", &sgpu::rank::arm_program_stacks);
  m.def("node_world_rank_dir", [] { return sgpu::rank::node_world_rank_dir().string(); });
  m.def("enter_program_shapes", &sgpu::rank::enter_program_shapes);
  m.def("record_program_figures", [] {
    py::gil_scoped_release release;
    sgpu::rank::record_program_figures();
  });
  m.def("end_rank", [](int code) {
    py::gil_scoped_release release;
    sgpu::rank::end_worker_rank(code);
  });
  m.def("read_call", &read_call);
  m.def("memory_stats", [] { return sgpu::memory_stats(); });
  m.def("count_compute", &count_compute, py::arg("op"), py::arg("dtype"), py::arg("flops"),
        py::arg("bytes"), py::arg("kind") = "other", py::arg("batch") = 1.0, py::arg("m") = 0.0,
        py::arg("n") = 0.0, py::arg("k") = 0.0);
  m.def("compute_stats", [] { return compute_dict(sgpu::rank::rank_compute_stats()); });
  m.def("mark_step", &sgpu::rank::mark_step, py::arg("tokens") = 0.0, py::arg("model_flops") = 0.0);
  m.def("reset_peak_memory_stats", [] { sgpu::reset_peak_memory_stats(); });
  m.def("enter_host_memory", [] { ++sgpu::contract::host_memory_depth(); });
  m.def("exit_host_memory", [] { --sgpu::contract::host_memory_depth(); });
  m.def("bind_device", &bind_device);
  bind_cuda_on_sim(m);
  m.def("write_result", &write_result, py::arg("result"), py::arg("limit"));
  m.def("write_error", &write_error, py::arg("type"), py::arg("message"), py::arg("traceback"),
        py::arg("exception") = py::none());
  m.def("make_process_group", &make_process_group, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout_seconds"), py::arg("global_ranks") = std::vector<int>(),
        py::arg("as_nccl") = false);
}

// Tracking from inside a rank: into the call's run.
void bind_tracking(py::module_& m) {
  m.def(
      "log_metric",
      [](const std::string& key, double value, std::int64_t step) {
        sgpu::log_metric(key, value, step);
      },
      py::arg("key"), py::arg("value"), py::arg("step") = 0);
  m.def("log_param",
        [](const std::string& key, const std::string& value) { sgpu::log_param(key, value); });
  m.def("set_tag",
        [](const std::string& key, const std::string& value) { sgpu::set_tag(key, value); });
  m.def("flush_tracking", [] {
    py::gil_scoped_release release;
    return sgpu::flush_tracking();
  });
}

}  // namespace
}  // namespace sgpu::python

PYBIND11_MODULE(_native, m) {
  using namespace sgpu::python;
  m.doc() = "sgpu's C++ core (launcher, rank side, process groups); use the sgpu package";
  py::register_exception_translator(translate);
  // torch's own store clients in this process too (env:// in a rank, a user's TCPStore).
  sgpu::rendezvous::name_mapped_peers_as_ipv4();  // NOTE [Store peers' names]
  m.def("name_mapped_peers_as_ipv4", &sgpu::rendezvous::name_mapped_peers_as_ipv4);
  bind_caller_side(m);
  bind_rank_side(m);
  bind_tracking(m);
}
