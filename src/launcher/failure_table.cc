#include "launcher/failure_table.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <sstream>

namespace sgpu::launcher {

namespace {

bool own_failure(const RankFailure& row) {
  return row.kind == RankFailure::Kind::kException || row.kind == RankFailure::Kind::kExitCode ||
         row.kind == RankFailure::Kind::kSignal || row.kind == RankFailure::Kind::kBadResult;
}

// A collective that fails because a peer died ("Connection closed by peer") raises one of
// these in every surviving rank, often before the monitor has even seen the peer's exit.
bool collective_error(const RankFailure& row) {
  return row.kind == RankFailure::Kind::kException &&
         (row.exception_type.rfind("gloo::", 0) == 0 ||
          row.exception_type.rfind("c10::Dist", 0) == 0);
}

}  // namespace

int mark_root_cause(std::vector<RankFailure>& ranks) {
  // The earliest own failure that is not a collective error; failing that, the earliest.
  int root = -1;
  for (int pass = 0; pass < 2 && root < 0; ++pass) {
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      if (!own_failure(ranks[i]) || (pass == 0 && collective_error(ranks[i]))) continue;
      if (root < 0 || ranks[i].time < ranks[static_cast<std::size_t>(root)].time) {
        root = static_cast<int>(i);
      }
    }
  }
  if (root >= 0) ranks[static_cast<std::size_t>(root)].root_cause = true;
  return root;
}

std::string format_time(std::chrono::system_clock::time_point time) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(time.time_since_epoch());
  const std::time_t seconds = static_cast<std::time_t>(ms.count() / 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[80];
  std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                static_cast<int>(ms.count() % 1000));
  return text;
}

std::string format_failure(const std::string& headline, const std::vector<RankFailure>& ranks,
                           const std::filesystem::path& run_dir) {
  std::ostringstream out;
  out << headline << "\n";
  // Over several nodes each row says where it ran.
  const bool nodes = std::any_of(ranks.begin(), ranks.end(),
                                 [](const RankFailure& row) { return !row.host.empty(); });
  for (const RankFailure& row : ranks) {
    if (!row.root_cause) continue;
    out << "root cause: rank " << row.rank << " (";
    if (nodes) out << "node " << row.node_rank << " " << row.host << ", ";
    out << "local rank " << row.local_rank << ", pid " << row.pid;
    if (!row.role.empty()) out << ", " << row.role;
    out << ") " << row.describe() << " at " << format_time(row.time) << "\n";
    if (!row.stderr_tail.empty()) {
      out << "  last lines of its stderr:\n";
      std::istringstream lines(row.stderr_tail);
      for (std::string line; std::getline(lines, line);) out << "    " << line << "\n";
    }
  }
  out << (nodes ? "  rank  node  pid       status\n" : "  rank  pid       status\n");
  for (const RankFailure& row : ranks) {
    char head[48];
    if (nodes) {
      std::snprintf(head, sizeof head, "  %-5d %-5d %-9d ", row.rank, row.node_rank,
                    static_cast<int>(row.pid));
    } else {
      std::snprintf(head, sizeof head, "  %-5d %-9d ", row.rank, static_cast<int>(row.pid));
    }
    out << head << row.describe() << (row.root_cause ? "  <- root cause" : "") << "\n";
  }
  out << "logs: " << run_dir.string();
  return out.str();
}

}  // namespace sgpu::launcher
