#include "rank/accounting.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <mutex>
#include <optional>
#include <string>

#include "collectives/recorder.h"
#include "collectives/timeline.h"
#include "model/platform.h"

namespace sgpu::rank {
namespace {

std::string describe_bytes(std::int64_t bytes) {
  char text[32];
  const auto value = static_cast<double>(bytes);
  if (bytes < 1024) {
    std::snprintf(text, sizeof text, "%lld B", static_cast<long long>(bytes));
  } else if (bytes < (std::int64_t{1} << 20)) {
    std::snprintf(text, sizeof text, "%.2f KiB", value / 1024);
  } else if (bytes < (std::int64_t{1} << 30)) {
    std::snprintf(text, sizeof text, "%.2f MiB", value / (1 << 20));
  } else {
    std::snprintf(text, sizeof text, "%.2f GiB", value / (1 << 30));
  }
  return text;
}

// 5630.4 as "5,630".
std::string with_thousands(double value) {
  std::string digits = std::to_string(std::llround(value));
  const std::size_t first = digits[0] == '-' ? 1 : 0;
  for (std::size_t at = digits.size(); at > first + 3; at -= 3) digits.insert(at - 3, ",");
  return digits;
}

double predicted_comm_seconds(const CommStats& comm) {
  double seconds = 0;
  for (const auto& [op, t] : comm.by_op()) seconds += t.predicted_seconds;
  return seconds;
}

// The platform's roofline, by name; std::nullopt for one given by a file's path that is
// gone, or any it cannot read: nothing is known of it beyond what was recorded.
std::optional<model::Roofline> roofline_of(const std::string& platform) {
  try {
    return model::load_platform(platform).compute;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The hardware FLOPs (what ran, recomputation included) over `seconds`, as a fraction of
// the platform's dense bfloat16 peak, the figure MFU is quoted against; 0 where either is
// unknown.
double peak_fraction(const std::optional<model::Roofline>& roofline, double flops, double seconds) {
  if (!roofline || seconds <= 0) return 0;
  const double peak = roofline->peak_for("bfloat16") * 1e12;
  return peak > 0 ? flops / seconds / peak : 0;
}

// How far the estimate can be trusted, from what the platform's kernel model was held to
// (KernelCosts::validated_dtypes): its typical error, or why there is none to give.
std::string assurance(const std::string& platform, const std::optional<model::Roofline>& roofline,
                      double unvalidated_share) {
  if (!roofline) return "";
  const model::KernelCosts& kernels = roofline->kernels;
  if (kernels.validated_dtypes.empty())
    return "; " + platform + "'s compute model is held to no measured run yet: no error to give";
  std::string dtypes;
  for (const std::string& d : kernels.validated_dtypes) dtypes += (dtypes.empty() ? "" : ", ") + d;
  char text[256];
  if (unvalidated_share > 0.1) {
    std::snprintf(text, sizeof text,
                  "; %.0f%% of the compute is in matmul and attention kernels of a dtype the "
                  "model was not held to (it was to %s): no error to give",
                  unvalidated_share * 100, dtypes.c_str());
  } else {
    std::snprintf(text, sizeof text,
                  "; typical error %.0f%% (the mean over %d measured run%s, docs/benchmarks.md)",
                  kernels.typical_error * 100, kernels.validated_runs,
                  kernels.validated_runs == 1 ? "" : "s");
  }
  return text;
}

struct ComputeAccount {
  std::mutex mutex;
  ComputeStats stats;
};

ComputeAccount& compute_account() {
  static ComputeAccount* account = new ComputeAccount;  // lives to the rank's end
  return *account;
}

}  // namespace

void count_compute(const std::string& op, const std::string& dtype, double flops, double bytes,
                   const model::KernelShape& shape) {
  const model::Platform* platform = collectives::rank_platform();
  const bool timed = platform != nullptr && !platform->compute.empty();
  const double kernel =
      timed ? model::kernel_seconds(platform->compute, shape, flops, bytes, dtype) : 0;
  ComputeAccount& account = compute_account();
  std::lock_guard lock(account.mutex);
  const double seconds =
      timed ? collectives::time_kernel(platform->compute.kernels.host_us * 1e-6, kernel) : 0;
  if (timed) account.stats.platform = platform->name;
  if (timed && !model::validated_kernel(platform->compute.kernels, shape, dtype))
    account.stats.unvalidated_seconds += seconds;
  ComputeTotals& t = account.stats.ops[op];
  t.count += 1;
  t.flops += flops;
  t.bytes += bytes;
  t.predicted_seconds += seconds;
}

void mark_step(double tokens, double model_flops) {
  const model::Moment ends = collectives::timeline_ends();
  ComputeAccount& account = compute_account();
  std::lock_guard lock(account.mutex);
  account.stats.steps.push_back({ends.real, ends.alone, tokens, model_flops});
}

std::optional<StepFigures> last_step(const ComputeStats& compute) {
  if (compute.steps.empty()) return std::nullopt;
  const StepMark& last = compute.steps.back();
  const StepMark before =
      compute.steps.size() > 1 ? compute.steps[compute.steps.size() - 2] : StepMark{};
  StepFigures step;
  step.seconds = last.end - before.end;
  step.compute_seconds = last.compute_end - before.compute_end;
  step.exposed_collective_seconds = step.seconds - step.compute_seconds;
  step.tokens = last.tokens;
  step.model_flops = last.model_flops;
  return step;
}

std::string step_summary(const std::vector<ComputeStats>& compute, const std::string& whose) {
  const ComputeStats* slowest = nullptr;
  std::optional<StepFigures> step;
  for (const ComputeStats& rank : compute) {
    const std::optional<StepFigures> last = last_step(rank);
    if (rank.platform.empty() || !last) continue;
    if (!step || last->seconds > step->seconds) {
      slowest = &rank;
      step = last;
    }
  }
  if (!step) return "";
  char text[320];
  std::snprintf(text, sizeof text,
                "sgpu: steps (the slowest of %s): %zu marked; the last %.4g s on %s (compute "
                "%.4g s, exposed collectives %.4g s)",
                whose.c_str(), slowest->steps.size(), step->seconds, slowest->platform.c_str(),
                step->compute_seconds, step->exposed_collective_seconds);
  std::string line = text;
  if (step->tokens > 0 && step->seconds > 0) {
    line += ", " + with_thousands(step->tokens / step->seconds) + " tokens/s per GPU";
  }
  const std::optional<model::Roofline> roofline = roofline_of(slowest->platform);
  if (const double mfu = peak_fraction(roofline, step->model_flops, step->seconds); mfu > 0) {
    std::snprintf(text, sizeof text, ", MFU %.0f%%", mfu * 100);
    line += text;
  }
  const ComputeTotals t = slowest->total();
  const double unvalidated =
      t.predicted_seconds > 0 ? slowest->unvalidated_seconds / t.predicted_seconds : 0;
  return line + assurance(slowest->platform, roofline, unvalidated) + "\n";
}

ComputeStats rank_compute_stats() {
  ComputeAccount& account = compute_account();
  std::lock_guard lock(account.mutex);
  ComputeStats stats = account.stats;
  if (!stats.platform.empty())
    stats.exposed_collective_seconds = collectives::timeline_exposed_seconds();
  return stats;
}

std::string compute_summary(const std::vector<ComputeStats>& compute,
                            const std::vector<CommStats>& comm, const std::string& whose) {
  ComputeTotals most;
  double most_with_comm = 0, most_comm = 0, most_exposed = 0, unvalidated_share = 0;
  std::string platform;
  bool any = false;
  for (std::size_t r = 0; r < compute.size(); ++r) {
    if (compute[r].ops.empty()) continue;
    any = true;
    if (platform.empty()) platform = compute[r].platform;
    const ComputeTotals t = compute[r].total();
    most.count = std::max(most.count, t.count);
    most.flops = std::max(most.flops, t.flops);
    most.bytes = std::max(most.bytes, t.bytes);
    most.predicted_seconds = std::max(most.predicted_seconds, t.predicted_seconds);
    const double collectives = r < comm.size() ? predicted_comm_seconds(comm[r]) : 0;
    most_comm = std::max(most_comm, collectives);
    most_exposed = std::max(most_exposed, compute[r].exposed_collective_seconds);
    if (t.predicted_seconds > 0)
      unvalidated_share =
          std::max(unvalidated_share, compute[r].unvalidated_seconds / t.predicted_seconds);
    most_with_comm =
        std::max(most_with_comm, t.predicted_seconds + compute[r].exposed_collective_seconds);
  }
  if (!any) return "";
  char text[256];
  std::snprintf(text, sizeof text, "sgpu: compute (the most of %s): %lld operators, %.2f TFLOP, %s",
                whose.c_str(), static_cast<long long>(most.count), most.flops / 1e12,
                describe_bytes(static_cast<std::int64_t>(most.bytes)).c_str());
  std::string line = std::string(text) + " of memory traffic";
  if (platform.empty()) return line + " (no platform to time them on)\n";
  std::snprintf(text, sizeof text,
                ", %.3f s on %s; with the collectives' %.3f s (%.3f s of them exposed), %.3f s",
                most.predicted_seconds, platform.c_str(), most_comm, most_exposed, most_with_comm);
  line += text;
  const std::optional<model::Roofline> roofline = roofline_of(platform);
  if (const double fraction = peak_fraction(roofline, most.flops, most_with_comm); fraction > 0) {
    std::snprintf(text, sizeof text,
                  " at %.0f%% of the bfloat16 peak (hardware FLOPs, recomputation included)",
                  fraction * 100);
    line += text;
  }
  return line + assurance(platform, roofline, unvalidated_share) + "\n";
}

std::string collective_difference(int first_rank, int second_rank,
                                  const std::optional<contract::RingSnapshot>& first,
                                  const std::optional<contract::RingSnapshot>& second) {
  if (!first || !second) return "";
  const std::string a = "rank " + std::to_string(first_rank);
  const std::string b = "rank " + std::to_string(second_rank);
  if (first->groups.size() != second->groups.size()) {
    return a + " made " + std::to_string(first->groups.size()) + " process groups and " + b + " " +
           std::to_string(second->groups.size());
  }
  for (std::size_t g = 0; g < first->groups.size() && g < first->totals.size(); ++g) {
    if (first->groups[g].size != second->groups[g].size) {
      return a + "'s group " + first->groups[g].name + " has " +
             std::to_string(first->groups[g].size) + " ranks, " + b + "'s " +
             second->groups[g].name + " " + std::to_string(second->groups[g].size);
    }
    for (std::size_t op = 0; op < contract::kCollectiveOps; ++op) {
      const contract::OpTotals& x = first->totals[g][op];
      const contract::OpTotals& y = second->totals.at(g)[op];
      if (x.count == y.count && x.bytes == y.bytes) continue;
      const std::string name(contract::op_name(static_cast<contract::CollectiveOp>(op)));
      const auto times = [](const contract::OpTotals& t) {
        return std::to_string(t.count) + (t.count == 1 ? " time (" : " times (") +
               std::to_string(t.bytes) + " bytes)";
      };
      return name + ": " + a + " called it " + times(x) + " in its group " + first->groups[g].name +
             ", " + b + " " + times(y) + " in its group " + second->groups[g].name;
    }
  }
  return "";
}

std::string memory_difference(int first_rank, int second_rank, const MemoryStats& first,
                              const MemoryStats& second) {
  std::string differences;
  for (const char* key : {"allocated_bytes.all.peak", "reserved_bytes.all.peak"}) {
    const auto x = first.find(key);
    const auto y = second.find(key);
    if (x == first.end() || y == second.end() || x->second == y->second) continue;
    if (!differences.empty()) differences += "; ";
    differences += std::string(key) + " " + std::to_string(x->second) + " on rank " +
                   std::to_string(first_rank) + ", " + std::to_string(y->second) + " on rank " +
                   std::to_string(second_rank);
  }
  return differences;
}

std::map<std::string, double> compute_metrics(const ComputeStats& compute) {
  if (compute.ops.empty()) return {};
  const ComputeTotals t = compute.total();
  std::map<std::string, double> metrics = {{"sgpu.compute.count", static_cast<double>(t.count)},
                                           {"sgpu.compute.flops", t.flops},
                                           {"sgpu.compute.bytes", t.bytes}};
  if (!compute.platform.empty()) {
    metrics["sgpu.compute.predicted_seconds"] = t.predicted_seconds;
    metrics["sgpu.compute.exposed_collective_seconds"] = compute.exposed_collective_seconds;
    metrics["sgpu.predicted_seconds"] = t.predicted_seconds + compute.exposed_collective_seconds;
    const std::optional<model::Roofline> roofline = roofline_of(compute.platform);
    const double fraction = peak_fraction(roofline, t.flops, metrics["sgpu.predicted_seconds"]);
    if (fraction > 0) metrics["sgpu.compute.bfloat16_peak_fraction"] = fraction;
    if (const std::optional<StepFigures> step = last_step(compute)) {
      metrics["sgpu.step.count"] = static_cast<double>(compute.steps.size());
      metrics["sgpu.step.predicted_seconds"] = step->seconds;
      metrics["sgpu.step.exposed_collective_seconds"] = step->exposed_collective_seconds;
      if (step->tokens > 0 && step->seconds > 0)
        metrics["sgpu.step.tokens_per_second"] = step->tokens / step->seconds;
      if (const double mfu = peak_fraction(roofline, step->model_flops, step->seconds); mfu > 0)
        metrics["sgpu.step.mfu"] = mfu;
    }
  }
  return metrics;
}

CommStats comm_stats_of(const std::optional<contract::RingSnapshot>& ring) {
  CommStats stats;
  if (!ring) return stats;
  stats.platform = ring->platform;
  for (std::size_t g = 0; g < ring->groups.size() && g < ring->totals.size(); ++g) {
    for (std::size_t op = 0; op < contract::kCollectiveOps; ++op) {
      const contract::OpTotals& t = ring->totals[g][op];
      if (t.count == 0) continue;
      CollectiveTotals& out =
          stats.groups[ring->groups[g].name]
                      [std::string(contract::op_name(static_cast<contract::CollectiveOp>(op)))];
      out.count += t.count;
      out.bytes += t.bytes;
      out.seconds += static_cast<double>(t.nanoseconds) / 1e9;
      out.predicted_seconds += static_cast<double>(t.predicted_nanoseconds) / 1e9;
    }
  }
  return stats;
}

std::string memory_summary(const std::vector<MemoryStats>& memory, const std::vector<int>& ranks) {
  struct Run {
    int first = 0, last = 0;
    std::int64_t reserved = 0, allocated = 0;
  };
  std::vector<Run> runs;
  for (std::size_t i = 0; i < memory.size() && i < ranks.size(); ++i) {
    const auto reserved = memory[i].find("reserved_bytes.all.peak");
    const auto allocated = memory[i].find("allocated_bytes.all.peak");
    if (reserved == memory[i].end() || allocated == memory[i].end()) continue;
    if (!runs.empty() && runs.back().last + 1 == ranks[i] &&
        runs.back().reserved == reserved->second && runs.back().allocated == allocated->second) {
      runs.back().last = ranks[i];
    } else {
      runs.push_back({ranks[i], ranks[i], reserved->second, allocated->second});
    }
  }
  if (runs.empty()) return "";
  std::string line = "sgpu: peak memory of each rank's GPU, reserved and allocated:";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const Run& r = runs[i];
    char figures[64];
    std::snprintf(figures, sizeof figures, " %.2f and %.2f GiB",
                  static_cast<double>(r.reserved) / (1 << 30),
                  static_cast<double>(r.allocated) / (1 << 30));
    line +=
        (i ? "; " : " ") +
        (r.first == r.last ? "rank " + std::to_string(r.first)
                           : "ranks " + std::to_string(r.first) + "-" + std::to_string(r.last)) +
        figures;
  }
  return line + "\n";
}

std::string comm_summary(const std::vector<CommStats>& ranks, const std::string& whose) {
  std::map<std::string, CollectiveTotals> most;
  std::map<std::string, bool> differ;
  std::map<std::string, int> seen;
  std::string platform;
  for (const CommStats& rank : ranks) {
    if (platform.empty()) platform = rank.platform;
    for (const auto& [op, t] : rank.by_op()) {
      CollectiveTotals& m = most[op];
      if (seen[op]++ > 0 && (t.count != m.count || t.bytes != m.bytes)) differ[op] = true;
      m.count = std::max(m.count, t.count);
      m.bytes = std::max(m.bytes, t.bytes);
      m.seconds = std::max(m.seconds, t.seconds);
      m.predicted_seconds = std::max(m.predicted_seconds, t.predicted_seconds);
    }
  }
  if (most.empty()) return "";
  std::string line = "sgpu: collectives (the most of " + whose + "):";
  const char* separator = " ";
  for (const auto& [op, t] : most) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.3f s", t.seconds);
    line += separator + op + " " + std::to_string(t.count) + " calls, " + describe_bytes(t.bytes) +
            ", " + seconds;
    if (!platform.empty()) {
      char predicted[64];
      std::snprintf(predicted, sizeof predicted, " (%.6f s on %s)", t.predicted_seconds,
                    platform.c_str());
      line += predicted;
    }
    if (differ.count(op) || seen[op] != static_cast<int>(ranks.size())) {
      line += " (ranks differ)";
    }
    separator = "; ";
  }
  return line + "\n";
}

std::map<std::string, double> comm_metrics(const CommStats& stats) {
  std::map<std::string, double> metrics;
  for (const auto& [op, t] : stats.by_op()) {
    metrics["sgpu.comm." + op + ".count"] = static_cast<double>(t.count);
    metrics["sgpu.comm." + op + ".bytes"] = static_cast<double>(t.bytes);
    metrics["sgpu.comm." + op + ".seconds"] = t.seconds;
    if (!stats.platform.empty())
      metrics["sgpu.comm." + op + ".predicted_seconds"] = t.predicted_seconds;
  }
  return metrics;
}

}  // namespace sgpu::rank
