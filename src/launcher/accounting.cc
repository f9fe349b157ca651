#include "launcher/accounting.h"

#include <algorithm>
#include <cstdio>

namespace sgpu::launcher {
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

}  // namespace

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

}  // namespace sgpu::launcher
