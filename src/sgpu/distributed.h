// sgpu::distributed: run one function on every GPU of the node, get every rank's result.
//
//   int train(Config config) { ... return sgpu::global_rank(); }
//   auto job = sgpu::distributed(train, {.gpus = 8, .gpu_type = "H100"});
//   std::vector<int> results = job.distributed(config);   // rank order
//   sgpu::Launch<int> handle = job.launch(config);         // asynchronous
//
// Functions travel by reference (ranks run the same binary), arguments and results by
// value through cereal (see sgpu/internal/values.h for the types). A lambda that captures
// state is rejected at compile time: pass the state as an argument instead.
#pragma once

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "sgpu/errors.h"
#include "sgpu/internal/call.h"
#include "sgpu/internal/values.h"
#include "sgpu/options.h"

namespace sgpu {
namespace detail {

// Hands a staged argument to the function: by reference where it takes a non-const
// lvalue reference, moved otherwise.
template <class Param, class Stored>
decltype(auto) pass(Stored& stored) {
  if constexpr (std::is_lvalue_reference_v<Param> &&
                !std::is_const_v<std::remove_reference_t<Param>>) {
    return (stored);
  } else {
    return std::move(stored);
  }
}

// The typed trampoline a rank calls: decodes the arguments, runs the function, encodes
// the result. Its address travels in the staged call next to the function's.
template <class R, class... A>
std::string entry(void* function, std::string_view signature, std::string_view args) {
  if (signature != typeid(R(A...)).name()) {
    throw std::logic_error("sgpu: staged call's signature does not match its trampoline");
  }
  auto fn = reinterpret_cast<R (*)(A...)>(function);
  auto tuple = serialize::from_bytes<std::tuple<std::decay_t<A>...>>(args);
  return std::apply(
      [&](auto&... stored) -> std::string {
        if constexpr (std::is_void_v<R>) {
          fn(pass<A>(stored)...);
          return std::string();
        } else {
          return serialize::to_bytes(fn(pass<A>(stored)...));
        }
      },
      tuple);
}

}  // namespace detail

// A call in flight. wait() blocks for the results (std::vector<R>, or nothing for void).
template <class R>
class Launch {
 public:
  explicit Launch(std::shared_ptr<detail::Call> call) : call_(std::move(call)) {}

  auto wait() {
    const std::vector<std::string>& bytes = call_->wait();
    if constexpr (std::is_void_v<R>) {
      call_->results_taken();
      return;
    } else {
      std::vector<R> results;
      results.reserve(bytes.size());
      for (std::size_t rank = 0; rank < bytes.size(); ++rank) {
        try {
          results.push_back(serialize::from_bytes<R>(bytes[rank]));
        } catch (const std::exception& e) {
          call_->raise_bad_result(static_cast<int>(rank), e.what());
        }
      }
      call_->results_taken();
      return results;
    }
  }
  bool wait_for(std::chrono::milliseconds limit) { return call_->wait_for(limit); }
  bool done() { return call_->wait_for(std::chrono::milliseconds(0)); }
  void cancel() { call_->cancel(); }
  const std::filesystem::path& run_dir() const { return call_->run_dir(); }
  const std::string& gpu_type() const { return call_->gpu_type(); }
  // Where the call's MLflow run is shown: a web link for a tracking server, the run's
  // folder for the file store; empty when the call is not tracked.
  const std::string& tracking_link() const { return call_->tracking_link(); }
  // Each rank's device memory figures at its end (sgpu/memory.h), in rank order, after
  // the call finished, whether it succeeded or failed; a rank that left none has an empty
  // map. Blocks until the call finished.
  const std::vector<MemoryStats>& memory_stats() { return call_->memory_stats(); }
  // Each rank's collectives per process group and op (sgpu/comm.h), in rank order, after
  // the call finished, whether it succeeded or failed. Blocks until the call finished.
  const std::vector<CommStats>& comm_stats() { return call_->comm_stats(); }
  // Each rank's compute estimate (sgpu/compute.h), in rank order, after the call finished:
  // what its operators would take on the node, in shape-only compute; empty otherwise.
  const std::vector<ComputeStats>& compute_stats() { return call_->compute_stats(); }

 private:
  std::shared_ptr<detail::Call> call_;
};

template <class R, class... A>
class Distributed {
 public:
  using Function = R (*)(A...);

  Distributed(R (*function)(A...), Options options)
      : function_(function), options_(std::move(options)) {}

  // Runs on every rank and blocks until all are done: std::vector<R> in rank order.
  template <class... Args>
  auto distributed(Args&&... args) const {
    return launch(std::forward<Args>(args)...).wait();
  }

  // Starts the ranks and returns at once.
  template <class... Args>
  Launch<R> launch(Args&&... args) const {
    static_assert(sizeof...(Args) == sizeof...(A),
                  "sgpu: .distributed(...) takes exactly the arguments of the function");
    std::tuple<std::decay_t<A>...> staged(std::forward<Args>(args)...);
    serialize::CallRecord record;
    const detail::EntryFn entry = &detail::entry<R, A...>;
    record.entry = detail::locate_code(reinterpret_cast<const void*>(entry));
    record.function = detail::locate_code(reinterpret_cast<const void*>(function_));
    record.signature = typeid(R(A...)).name();
    record.function_name = options_.name.empty()
                               ? detail::code_name(reinterpret_cast<const void*>(function_))
                               : options_.name;
    record.args = serialize::to_bytes(staged);
    return Launch<R>(detail::start_call(options_, std::move(record)));
  }

  const Options& options() const { return options_; }

 private:
  Function function_;
  Options options_;
};

// Wraps a function (or a lambda that captures nothing) with the options of its calls.
template <class F>
auto distributed(F function, Options options = {}) {
  constexpr bool is_function_pointer =
      std::is_pointer_v<F> && std::is_function_v<std::remove_pointer_t<F>>;
  static_assert(is_function_pointer || std::is_empty_v<F>,
                "sgpu::distributed: this callable captures state, but every rank is a "
                "separate process that cannot see it. Pass the state as an argument of "
                ".distributed(...) instead, and capture nothing.");
  if constexpr (is_function_pointer) {
    return Distributed(function, std::move(options));
  } else if constexpr (std::is_empty_v<F>) {
    return Distributed(+function, std::move(options));
  }
}

}  // namespace sgpu
